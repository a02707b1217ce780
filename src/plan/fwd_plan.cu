// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The forward's decisions (fwd_plan.h): PackGQA, the split count, the KV-cache
// loading mode, the scheduler's tile counter and the workspace layout.
#include "plan/fwd_plan.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/seqlen.h"
#include "launch/dispatch.h"
#include "plan/lower.h"
#include "plan/split_heuristic.h"

namespace flash3 {

namespace {
FwdTileConfig one_tile_config(const FwdParams& p) {
  return fwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local, p.is_local);
}
}  // namespace

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
  const int tile_m = one_tile_config(p).tile_m;
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
int fwd_num_splits(const FwdParams& p, const int* num_sms) {
  if (p.num_splits == 1 || p.heads_kv <= 0 || p.heads_q <= 0) return 1;
  if (score_mod_kind(p) != ScoreModKind::kIdentity) return 1;
  if (!fwd_pack_kernel_built(p.dtype, p.head_dim, p.head_dim_v)) return 1;
  const FwdTileConfig cfg = one_tile_config(p);
  const int seqlen_k = p.varlen ? p.max_seqlen_k : p.seqlen_k;
  const int n_blocks = (seqlen_k + cfg.tile_n - 1) / cfg.tile_n;
  const int pack = fwd_pack_gqa(p) ? p.heads_q / p.heads_kv : 1;
  const int tile_heads = p.heads_q / pack;
  int splits = p.num_splits;
  if (splits == 0) {
    const int seqlen_q = p.varlen ? p.max_seqlen_q : p.seqlen_q;
    const int64_t m_blocks = (int64_t(seqlen_q) * pack + cfg.tile_m - 1) / cfg.tile_m;
    int sms = 0;
    if (num_sms != nullptr) sms = *num_sms;
    else if (!current_sm_count(&sms).ok()) return 1;
    splits = fwd_num_splits_heuristic(m_blocks * tile_heads * p.batch, n_blocks, sms, kMaxSplits);
  }
  splits = fwd_num_splits_clamp(splits, n_blocks);
  return std::max(1, std::min(splits, kMaxGridYZ / tile_heads));
}

namespace {
// KV caches: K/V gathered by the producer warps (paged always); a gathering
// launch whose sequences have several query tiles takes them from the prep
// kernel's tile map, the others take the grid as the tile map (no prep kernel).
void plan_kv_loading(const FwdPlan& plan, FwdParams* p) {
#if FLASH3_SERVING_WIP
  p->kv_direct = p->page_table != nullptr || p->kv_direct;
  // Split launches of variable-length queries too: the combine then reads the
  // prep kernel's sequence info (on the direct path it would combine every
  // row of q, rows no sequence covers included).
  const bool varlen_split = p->cu_seqlens_q != nullptr && p->num_splits > 1;
  p->kv_tile_map = p->kv_direct && (int64_t(p->max_seqlen_q) * plan.pack > plan.tile.tile_m || varlen_split);
#else
  (void)plan;
  p->kv_direct = p->page_table != nullptr;
  p->kv_tile_map = false;
#endif
}

FwdWorkspaceLayout plan_workspace(const FwdPlan& plan) {
  const FwdParams& p = plan.params;
  FwdWorkspaceLayout w;
  if (!p.varlen) {
    w.tile_counter_bytes = plan.dynamic_causal ? kFwdTileCounterBytes : 0;
  } else if (!(p.kv_direct && !p.kv_tile_map)) {
    // The prep kernel's maps over the packed (or unpacked) query-tile bound;
    // gathering launches without a tile map run no prep kernel.
    w.varlen_tiles = varlen_tiles_bound(int64_t(p.seqlen_q) * plan.pack, p.batch, plan.tile.tile_m);
    w.varlen_bytes = varlen_scratch_bytes(p.batch, w.varlen_tiles);
  }
  const size_t base = w.tile_counter_bytes + w.varlen_bytes;  // at most one is set
  w.bytes = base;
  if (p.num_splits > 1) {
    const int64_t rows = int64_t(p.varlen ? 1 : p.batch) * p.seqlen_q;
    w.split = fwd_split_layout(base, p.num_splits, rows, p.heads_q, p.head_dim_v);
    w.bytes = w.split.bytes;
  }
  return w;
}
}  // namespace

FwdPlan plan_forward(const FwdParams& problem, const int* num_sms) {
  FwdPlan plan;
  plan.params = problem;
  FwdParams& p = plan.params;
  const bool pack = fwd_pack_gqa(problem);
  p.num_splits = fwd_num_splits(problem, num_sms);
  p.pack_gqa = pack ? 1 : 0;
  plan.pack = pack ? p.heads_q / p.heads_kv : 1;
  plan.tile = one_tile_config(p);
  if (p.kv_cache) plan_kv_loading(plan, &p);
  plan.packed_unit = pack || p.num_splits > 1 || p.kv_direct;
  // The persistent causal kernel (run_fwd_16bit's short-causal branch; FP8 has
  // none: fwd_tile_config).
  plan.dynamic_causal = !p.varlen && !plan.packed_unit && p.is_causal && !p.is_local &&
                        p.dtype != DType::kFloat8E4M3 && fwd_has_short_causal(p.head_dim, p.head_dim_v) &&
                        fwd_short_causal(p.head_dim, p.seqlen_k);
  plan.workspace = plan_workspace(plan);
  return plan;
}

bool forward_shape_problem(const ForwardArgs& args, int64_t batch, FwdParams* problem) {
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  const bool varlen = args.opts.cu_seqlens_q != nullptr;
  const int nd = varlen ? 3 : 4;
  if (q.ndim != nd || k.ndim != nd || v.ndim != nd) return false;
  for (const TensorView* t : {&q, &k, &v})
    for (int i = 0; i < nd; ++i)
      if (t->shape[i] < 0 || t->shape[i] > INT32_MAX) return false;
  const int r = varlen ? 0 : 1;  // the row dimension of fixed-length tensors follows the batch
  if (q.shape[r + 1] <= 0 || k.shape[r + 1] <= 0 || q.shape[r + 1] % k.shape[r + 1] != 0) return false;
  FwdParams& p = *problem;
  p = FwdParams{};
  p.varlen = varlen;
  p.dtype = q.dtype;
  p.batch = varlen ? args.opts.num_sequences : static_cast<int>(batch);
  p.seqlen_q = static_cast<int>(q.shape[r]);
  p.seqlen_k = static_cast<int>(k.shape[r]);
  p.heads_q = static_cast<int>(q.shape[r + 1]);
  p.heads_kv = static_cast<int>(k.shape[r + 1]);
  p.head_dim = static_cast<int>(q.shape[r + 2]);
  p.head_dim_v = static_cast<int>(v.shape[r + 2]);
  p.softcap = args.opts.softcap;
  p.pack_gqa = args.opts.pack_gqa;
  p.num_splits = args.opts.num_splits;
  if (varlen) {
    if (p.batch <= 0) return false;
    p.max_seqlen_q = std::max(args.opts.max_seqlen_q, 1);  // as make_fwd_params plans 0
    p.max_seqlen_k = std::max(args.opts.max_seqlen_k, 1);
    apply_mask_options(args.opts, p.max_seqlen_q, p.max_seqlen_k, &p);
  } else {
    apply_mask_options(args.opts, p.seqlen_q, p.seqlen_k, &p);
  }
  return true;
}

}  // namespace flash3
