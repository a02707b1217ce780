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
//   split_partials (split tiles, pieces, slot) fp32  dK / dV partials of split KV blocks (BwdSplitPlan)
//   split_count    (split tiles) int32  pieces done per split KV block
#pragma once
#include <cstddef>
#include <cstdint>

#include "config/tile_size.h"

namespace flash3 {

// The unmasked backward's last wave. Its KV blocks all cost the same, so a
// launch of T blocks on S SMs runs floor(T / S) full waves and then T mod S
// blocks while the other SMs idle: the paper shapes have 2048 blocks on 132
// SMs (15.5 waves: the last one half empty) or, at d = 64, 4096 (31.03
// waves: 4 blocks hold up a whole wave). So the last T mod S blocks run as
// `pieces` CTAs each, every piece over an equal share of the query blocks;
// each piece writes its fp32 dK / dV partial to its own slot and the piece
// that finishes last sums the slots in piece order (bitwise reproducible) and
// writes dK / dV. The number of pieces minimises a cost model in query-block
// iterations: the tail's waves times (a piece's iterations plus a CTA's fixed
// cost) plus the last piece's reads of the other slots plus the fp32 staging
// that a split launch's whole blocks pay (its own kernel instantiation).
struct BwdSplitPlan {
  int first = 0;   // KV blocks [0, first) in launch order run whole
  int tiles = 0;   // blocks [first, first + tiles) run as `pieces` CTAs each
  int pieces = 1;
  int ctas() const { return first + tiles * pieces; }
  int slots() const { return tiles * pieces; }
};

// tiles: KV blocks in the launch; m_blocks: query blocks per KV block and
// query head, the most pieces a block can have; heads_per_kv: query heads per
// KV head (a KV block walks its query blocks once per query head). At most
// kBwdSplitMaxWaves waves of pieces, which bounds the partials' scratch memory.
constexpr int kBwdSplitMaxWaves = 3;

inline BwdSplitPlan bwd_split_plan(int tiles, int num_sms, int m_blocks, int heads_per_kv) {
  BwdSplitPlan plan;
  plan.first = tiles;
  const double fixed = kBwdSplitFixedIters, slot = kBwdSplitSlotIters;
  if (tiles <= 0 || num_sms <= 0 || m_blocks < 2 || heads_per_kv < 1) return plan;
  const int rem = tiles % num_sms;
  if (rem == 0) return plan;
  // A split launch's whole blocks pay the fp32 staging too.
  const double staging = kBwdSplitStagingIters * (tiles / num_sms);
  double best = double(heads_per_kv) * m_blocks + fixed;
  for (int k = 2; k <= m_blocks && rem * k <= kBwdSplitMaxWaves * num_sms; ++k) {
    const int waves = (rem * k + num_sms - 1) / num_sms;
    const double cost =
        waves * (double(heads_per_kv) * ((m_blocks + k - 1) / k) + fixed) + (k - 1) * slot + staging;
    if (cost < best) {
      best = cost;
      plan.pieces = k;
    }
  }
  if (plan.pieces > 1) {
    plan.first = tiles - rem;
    plan.tiles = rem;
  }
  return plan;
}

// The query blocks [m_min, m_max) of piece `piece` of `pieces`: equal shares,
// the longer ones last.
inline constexpr int bwd_piece_begin(int m_min, int m_max, int piece, int pieces) {
  return m_min + (m_max - m_min) * piece / pieces;  // pieces <= m_max - m_min: no overflow
}

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
