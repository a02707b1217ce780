// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The backward's decisions (bwd_plan.h).
#include "plan/bwd_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/seqlen.h"

namespace flash3 {

namespace {
// The query length that picks the tile config: seqlen_q, or for varlen the
// longest sequence (max_seqlen_q).
int tile_seqlen_q(const BwdParams& p) { return p.varlen ? p.max_seqlen_q : p.seqlen_q; }

// Fixed length: the scratch layout for the plan's tile, including the
// unmasked launch's split plan on num_sms SMs.
void plan_fixed_workspace(BwdPlan* plan, const int* num_sms) {
  const BwdParams& p = plan->params;
  const int tile_m = plan->tile.tile_m, tile_n = plan->tile.tile_n;
  const int m_blocks = (p.seqlen_q + tile_m - 1) / tile_m;
  const int tiles = (p.seqlen_k + tile_n - 1) / tile_n * p.heads_kv * p.batch;
  plan->split = BwdSplitPlan{};
  plan->split.first = tiles;
  int sms = 0;
  const bool masked = p.is_causal || p.is_local;
  if (!masked && p.heads_kv > 0) {
    if (num_sms != nullptr) sms = *num_sms;
    else if (!current_sm_count(&sms).ok()) sms = 0;
    if (sms > 0) plan->split = bwd_split_plan(tiles, sms, m_blocks, p.heads_q / p.heads_kv);
  }
  plan->layout = bwd_workspace_layout(p.batch, p.heads_q, p.seqlen_q, p.head_dim, tile_m, plan->split,
                                      size_t(tile_n) * (p.head_dim + p.head_dim_v));
  plan->row_shift = bwd_row_shift(plan->layout, p.seqlen_q, masked);
  plan->workspace_bytes = plan->layout.bytes;
}

// Varlen: the per-query-block arrays as one batch element of the query-tile
// bound's blocks (total_q / tile_m + sequences), then the prep kernel's scratch.
void plan_varlen_workspace(BwdPlan* plan) {
  const BwdParams& p = plan->params;
  const int tile_m = plan->tile.tile_m, tile_n = plan->tile.tile_n;
  const int64_t q_bound = varlen_tiles_bound(p.seqlen_q, p.batch, tile_m);
  const int64_t kv_bound = varlen_tiles_bound(p.seqlen_k, p.batch, tile_n);
  plan->kv_tiles_bound = int(kv_bound);
  plan->layout = bwd_workspace_layout(1, p.heads_q, int(q_bound * tile_m), p.head_dim, tile_m);
  plan->varlen_scratch_offset = plan->layout.bytes;  // 256-byte aligned
  plan->workspace_bytes = plan->varlen_scratch_offset + align256(varlen_scratch_bytes(p.batch, q_bound, kv_bound));
}
}  // namespace

BwdPlan plan_backward(const BwdParams& problem, const int* num_sms) {
  BwdPlan plan;
  plan.params = problem;
  const BwdParams& p = plan.params;
  plan.short_tile = bwd_short_tile(p.head_dim, tile_seqlen_q(p));
  plan.tile = bwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local, plan.short_tile);
  if (p.varlen) plan_varlen_workspace(&plan);
  else plan_fixed_workspace(&plan, num_sms);
  return plan;
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
