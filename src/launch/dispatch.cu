// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The one host file that turns runtime options into compile-time variants.
// (dtype, head_dim, head_dim_v, score modifier) come from the manifest's
// kernel_table.inc; the mask variant (none / causal / local), varlen and the
// tile variant are chosen inside run_fwd / run_bwd.
#include "launch/dispatch.h"

#include <algorithm>
#include <cstdint>

#include <cutlass/numeric_types.h>

#include "bwd/workspace.h"
#include "common/cuda_check.h"
#include "common/seqlen.h"
#include "config/tile_size.h"
#include "fusion/score_mod.h"

namespace flash3 {

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_fwd(const FwdPlan& plan, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_bwd(const BwdParams& params, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV>
Status run_fwd_packed(const FwdPlan& plan, cudaStream_t stream);

// One kernel_table.inc row per (pass, dtype, head_dim, head_dim_v, score
// modifier) unit; SM is the policy type (fusion/score_mod.h).
bool fwd_kernel_built(DType dtype, int head_dim, int head_dim_v, ScoreModKind mod) {
#define FLASH3_FWD(E, T, D, DV, SM) \
  if (dtype == DType::E && head_dim == D && head_dim_v == DV && mod == SM::kKind) return true;
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return false;
}

bool bwd_kernel_built(DType dtype, int head_dim, int head_dim_v, ScoreModKind mod) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM) \
  if (dtype == DType::E && head_dim == D && head_dim_v == DV && mod == SM::kKind) return true;
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return false;
}

bool fwd_pack_kernel_built(DType dtype, int head_dim, int head_dim_v) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV) \
  if (dtype == DType::E && head_dim == D && head_dim_v == DV) return true;
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return false;
}

static Status not_built(const char* pass, const FwdParams& p) {
  return Status::NotSupported(std::string(pass) + " kernel for dtype " + dtype_name(p.dtype) + ", head_dim " +
                              std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
                              ", score modifier " + score_mod_feature(score_mod_kind(p)) +
                              " is not built in this library");
}

// The plan (plan/fwd_plan.h) decided which unit runs: the packed one for
// PackGQA, split launches and gathered K/V; the unit of the score modifier
// otherwise.
Status launch_forward(const FwdPlan& plan, cudaStream_t stream) {
  const FwdParams& params = plan.params;
  if (plan.packed_unit) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)                                                     \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV) { \
    return run_fwd_packed<T, D, DV>(plan, stream);                                          \
  }
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
    return not_built(params.kv_direct ? "paged-KV (packgqa) forward" : "packgqa forward", params);
  }
  const ScoreModKind mod = score_mod_kind(params);
#define FLASH3_FWD(E, T, D, DV, SM)                                                                            \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV && mod == SM::kKind) { \
    return run_fwd<T, D, DV, SM>(plan, stream);                                                                \
  }
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return not_built("forward", params);
}

Status launch_backward(const BwdParams& params, cudaStream_t stream) {
  const ScoreModKind mod = score_mod_kind(params);
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)                                                                            \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV && mod == SM::kKind) { \
    return run_bwd<T, D, DV, SM>(params, stream);                                                              \
  }
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return not_built("backward", params);
}

BwdWorkspaceLayout bwd_workspace_for(const BwdParams& p, int tile_m, int tile_n, BwdSplitPlan* split) {
  *split = BwdSplitPlan{};
  const int m_blocks = (p.seqlen_q + tile_m - 1) / tile_m;
  const int tiles = (p.seqlen_k + tile_n - 1) / tile_n * p.heads_kv * p.batch;
  split->first = tiles;
  int num_sms = 0;
  if (!(p.is_causal || p.is_local) && p.heads_kv > 0 && current_sm_count(&num_sms).ok()) {
    *split = bwd_split_plan(tiles, num_sms, m_blocks, p.heads_q / p.heads_kv);
  }
  return bwd_workspace_layout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, tile_m, *split,
                              size_t(tile_n) * (p.head_dim + p.head_dim_v));
}

BwdVarlenWorkspace bwd_varlen_workspace(const BwdParams& p, int tile_m, int tile_n) {
  BwdVarlenWorkspace v;
  const int64_t q_bound = varlen_tiles_bound(p.seqlen_q, p.batch, tile_m);
  const int64_t kv_bound = varlen_tiles_bound(p.seqlen_k, p.batch, tile_n);
  v.kv_tiles_bound = int(kv_bound);
  v.layout = bwd_workspace_layout(1, p.heads_q, int(q_bound * tile_m), p.head_dim, tile_m);
  v.scratch_offset = v.layout.bytes;  // 256-byte aligned
  v.bytes = v.scratch_offset + align256(varlen_scratch_bytes(p.batch, q_bound, kv_bound));
  return v;
}

BwdParams bwd_varlen_as_one_batch(const BwdParams& p) {
  BwdParams w = p;
  w.batch = 1;
  w.seqlen_q = p.seqlen_q > 0 ? p.seqlen_q : 1;
  w.seqlen_k = p.seqlen_k > 0 ? p.seqlen_k : 1;
  w.q_batch_stride = p.q_row_stride;
  w.k_batch_stride = p.k_row_stride;
  w.v_batch_stride = p.v_row_stride;
  w.o_batch_stride = p.o_row_stride;
  w.do_batch_stride = p.do_row_stride;
  return w;
}

static BwdTileConfig bwd_config_of(const BwdParams& p) {
  return bwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local,
                         bwd_short_tile(p.head_dim, bwd_tile_seqlen_q(p)));
}

size_t backward_workspace_bytes(const BwdParams& p) {
  const BwdTileConfig cfg = bwd_config_of(p);
  if (p.varlen) return bwd_varlen_workspace(p, cfg.tile_m, cfg.tile_n).bytes;
  BwdSplitPlan split;
  return bwd_workspace_for(p, cfg.tile_m, cfg.tile_n, &split).bytes;
}

size_t backward_workspace_bytes_bound(const BwdParams& p) {
  // The mask is not known to callers that size scratch from q alone: the
  // larger of the masked and the unmasked tile configs, the latter with the
  // most any split plan can use (tiles % SMs < SMs blocks, 3 waves of pieces).
  size_t bytes = 0;
  for (bool masked : {false, true}) {
    const BwdTileConfig cfg =
        bwd_tile_config(p.head_dim, p.head_dim_v, masked, bwd_short_tile(p.head_dim, p.seqlen_q));
    BwdSplitPlan worst;
    int num_sms = 0;
    if (!masked && current_sm_count(&num_sms).ok()) {
      worst.tiles = num_sms;
      worst.pieces = kBwdSplitMaxWaves;
    }
    bytes = std::max(bytes, bwd_workspace_layout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, cfg.tile_m, worst,
                                                 size_t(cfg.tile_n) * (p.head_dim + p.head_dim_v))
                                .bytes);
  }
  return bytes;
}

}  // namespace flash3
