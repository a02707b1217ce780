// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Backward scratch memory (seed 7.3), one allocation carved into six arrays.
// Rows are padded to whole query blocks so every per-block access (1-D bulk
// copies of the statistics, the dQ reduce-add) is in bounds and aligned.
//   lse_log2 (b, hq, sq_pad) fp32   LSE * log2(e); +inf on padded / fully masked rows
//   dpsum    (b, hq, sq_pad) fp32   D = rowsum(dO * O) - dLSE
//   dq_accum (b, hq, m_blocks, tile_m * d) fp32, per-block fragment order
//   dq_sem   (b, hq, m_blocks) int32  deterministic-mode ordering counters
//   split_partials (split tiles, pieces, slot) fp32  dK / dV partials of split KV blocks (BwdSplitPlan,
//                  scheduler/bwd_split.h)
//   split_count    (split tiles) int32  pieces done per split KV block
#pragma once
#include <cstddef>
#include <cstdint>

#include "config/tile_size.h"
#include "scheduler/bwd_split.h"

namespace flash3 {

struct BwdWorkspaceLayout {
  int num_m_blocks = 0, seqlen_q_pad = 0;
  size_t lse_offset = 0, dpsum_offset = 0, dq_accum_offset = 0, sem_offset = 0;
  size_t split_partials_offset = 0, split_count_offset = 0, bytes = 0;
};

inline size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// split / slot_floats: the launch's BwdSplitPlan and the floats of one dK + dV
// partial (tile_n * (d + dv)).
inline BwdWorkspaceLayout bwd_workspace_layout(int batch, int heads_q, int seqlen_q, int head_dim, int tile_m,
                                               const BwdSplitPlan& split = {}, size_t slot_floats = 0) {
  BwdWorkspaceLayout w;
  w.num_m_blocks = (seqlen_q + tile_m - 1) / tile_m;
  w.seqlen_q_pad = w.num_m_blocks * tile_m;
  const size_t rows = size_t(batch) * heads_q * w.seqlen_q_pad;
  w.lse_offset = 0;
  w.dpsum_offset = align256(rows * 4);
  w.dq_accum_offset = w.dpsum_offset + align256(rows * 4);
  w.sem_offset = w.dq_accum_offset + align256(rows * size_t(head_dim) * 4);
  w.split_partials_offset = w.sem_offset + align256(size_t(batch) * heads_q * w.num_m_blocks * 4);
  w.split_count_offset = w.split_partials_offset + align256(size_t(split.slots()) * slot_floats * 4);
  w.bytes = w.split_count_offset + align256(size_t(split.tiles) * 4);
  return w;
}

// Query rows of padding in front of the first real row. Causal and local
// masks are aligned bottom-right, so every KV block's query range runs to the
// last query block and only blocks near the top reach the first one: putting
// the partial block first (the padded grid's row r is query r - shift) means
// most KV blocks never visit it. d = 128 (80-row blocks) at 4096 queries: the
// last block held 16 real rows and every KV block paid a whole iteration for
// it; front-padded, a causal 4k backward runs 858 instead of 883 iterations
// per head (measured +0.9 / +1.0% at 4k / 8k causal). Unmasked
// launches visit every block from every KV block either way and keep shift 0.
inline int bwd_row_shift(const BwdWorkspaceLayout& w, int seqlen_q, bool causal_or_local) {
  return causal_or_local ? w.seqlen_q_pad - seqlen_q : 0;
}

}  // namespace flash3
