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
#include "launch/split_heuristic.h"
#include "launch/split_kv.h"

namespace flash3 {

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_fwd(const FwdParams& params, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_bwd(const BwdParams& params, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV>
Status run_fwd_packed(const FwdParams& params, cudaStream_t stream);

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

// PackGQA pays a gather/scatter of Q and O by the consumer threads and a
// division per row for the mask and the stores; it wins where the unpacked
// tiles are mostly padding (few query rows per head: decode, chunked prefill)
// or where K/V are read once per head instead of once per group. The rule:
// pack when the unpacked tiles' fill (real rows / tile rows) is below 0.9 of
// the packed tiles' fill. Varlen always packs: the host does not know the
// lengths, and short sequences are the common case there.
bool fwd_pack_gqa(const FwdParams& p) {
  if (p.heads_kv <= 0 || p.heads_q <= p.heads_kv || p.pack_gqa == 0) return false;
  if (score_mod_kind(p) != ScoreModKind::kIdentity) return false;
  if (!fwd_pack_kernel_built(p.dtype, p.head_dim, p.head_dim_v)) return false;
  const int g = p.heads_q / p.heads_kv;
  const int tile_m = fwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local, p.is_local).tile_m;
  // Packed row indices (seqlen_q x g, rounded up to a tile) are int32 in the kernel.
  if (int64_t(p.seqlen_q) * g + tile_m >= int64_t(INT32_MAX)) return false;
  if (p.pack_gqa == 1 || p.varlen) return true;
  auto fill = [tile_m](int64_t rows) { return double(rows) / double((rows + tile_m - 1) / tile_m * tile_m); };
  return p.seqlen_q > 0 && fill(p.seqlen_q) < 0.9 * fill(int64_t(p.seqlen_q) * g);
}

// Split-KV (seed ch. 10) runs in the packed kernels (a pack factor of 1 where
// PackGQA is off), so it needs their unit and the identity score modifier;
// elsewhere the unsplit kernel runs (same results). The request is clamped
// to the KV blocks of the longest tile (more splits would be empty) and to
// the grid's head dimension (heads x splits in gridDim.y); 0 asks the
// heuristic (split_heuristic.h), which splits only where the unsplit tiles
// leave SMs idle.
int fwd_num_splits(const FwdParams& p) {
  if (p.num_splits == 1 || p.heads_kv <= 0 || p.heads_q <= 0) return 1;
  if (score_mod_kind(p) != ScoreModKind::kIdentity) return 1;
  if (!fwd_pack_kernel_built(p.dtype, p.head_dim, p.head_dim_v)) return 1;
  const FwdTileConfig cfg = fwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local, p.is_local);
  const int seqlen_k = p.varlen ? p.max_seqlen_k : p.seqlen_k;
  const int n_blocks = (seqlen_k + cfg.tile_n - 1) / cfg.tile_n;
  const int pack = fwd_pack_gqa(p) ? p.heads_q / p.heads_kv : 1;
  const int tile_heads = p.heads_q / pack;
  int splits = p.num_splits;
  if (splits == 0) {
    const int seqlen_q = p.varlen ? p.max_seqlen_q : p.seqlen_q;
    const int64_t m_blocks = (int64_t(seqlen_q) * pack + cfg.tile_m - 1) / cfg.tile_m;
    int num_sms = 0;
    if (!current_sm_count(&num_sms).ok()) return 1;
    splits = fwd_num_splits_heuristic(m_blocks * tile_heads * p.batch, n_blocks, num_sms, kMaxSplits);
  }
  splits = fwd_num_splits_clamp(splits, n_blocks);
  return std::max(1, std::min(splits, kMaxGridYZ / tile_heads));
}

// The packed kernels run for PackGQA and for every split launch.
static bool fwd_runs_packed(const FwdParams& p) { return fwd_pack_gqa(p) || fwd_num_splits(p) > 1; }

size_t forward_workspace_bytes(const FwdParams& p) {
  const int splits = fwd_num_splits(p);
  const int64_t pack = fwd_pack_gqa(p) ? p.heads_q / p.heads_kv : 1;
  size_t base = 0;
  if (!p.varlen) {
    // (FP8 has no dynamic persistent kernel: fwd_tile_config.)
    const bool dynamic_causal = p.is_causal && !p.is_local && p.dtype != DType::kFloat8E4M3 &&
                                fwd_has_short_causal(p.head_dim, p.head_dim_v) &&
                                fwd_short_causal(p.head_dim, p.seqlen_k) && !fwd_runs_packed(p);
    base = dynamic_causal ? kFwdTileCounterBytes : 0;
  } else {
    // The varlen launch's tile shape (run_fwd_varlen_mask / run_fwd_packed).
    const int tile_m = fwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local, p.is_local).tile_m;
    base = varlen_scratch_bytes(p.batch, varlen_tiles_bound(int64_t(p.seqlen_q) * pack, p.batch, tile_m));
  }
  if (splits <= 1) return base;
  // The partials after it (fwd_launch.cuh's set_split_partials).
  const int64_t rows = int64_t(p.varlen ? 1 : p.batch) * p.seqlen_q;
  return fwd_split_layout(base, splits, rows, p.heads_q, p.head_dim_v).bytes;
}

static Status not_built(const char* pass, const FwdParams& p) {
  return Status::NotSupported(std::string(pass) + " kernel for dtype " + dtype_name(p.dtype) + ", head_dim " +
                              std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
                              ", score modifier " + score_mod_feature(score_mod_kind(p)) +
                              " is not built in this library");
}

Status launch_forward(const FwdParams& params, cudaStream_t stream) {
  // The packed unit takes the decisions resolved (each made once per call):
  // pack_gqa 1 (P = g) or 0 (P = 1), num_splits >= 1. Paged caches are
  // gathered only there (FwdTraits::kPagedKV), packed or not.
  FwdParams resolved = params;
  resolved.pack_gqa = fwd_pack_gqa(params) ? 1 : 0;
  resolved.num_splits = fwd_num_splits(params);
  if (params.kv_cache) {
    // KV caches: K/V gathered (paged always); sequences with several query
    // tiles take their tiles from the prep kernel's map.
#if FLASH3_SERVING_WIP
    resolved.kv_direct = params.page_table != nullptr || params.kv_direct;
    const int tile_m = fwd_tile_config(params.head_dim, params.head_dim_v, params.is_causal || params.is_local,
                                       params.is_local).tile_m;
    const int64_t pack = resolved.pack_gqa == 1 ? params.heads_q / params.heads_kv : 1;
    // Split launches of variable-length queries too: the combine then reads
    // the prep kernel's sequence info (on the direct path it would combine
    // every row of q, rows no sequence covers included).
    const bool varlen_split = params.cu_seqlens_q != nullptr && resolved.num_splits > 1;
    resolved.kv_tile_map = resolved.kv_direct && (int64_t(params.max_seqlen_q) * pack > tile_m || varlen_split);
#else
    resolved.kv_direct = params.page_table != nullptr;
    resolved.kv_tile_map = false;
#endif
  }
  if (resolved.pack_gqa == 1 || resolved.num_splits > 1 || resolved.kv_direct) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)                                                     \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV) { \
    return run_fwd_packed<T, D, DV>(resolved, stream);                                      \
  }
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
    if (resolved.kv_direct) return not_built("paged-KV (packgqa) forward", params);
  }
  const ScoreModKind mod = score_mod_kind(params);
#define FLASH3_FWD(E, T, D, DV, SM)                                                                            \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV && mod == SM::kKind) { \
    return run_fwd<T, D, DV, SM>(params, stream);                                                              \
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
