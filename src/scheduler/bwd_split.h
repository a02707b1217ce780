// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The backward's last-wave split (BwdSplitPlan): which KV blocks run as
// several CTAs, each over a share of the query blocks. Read by the block
// order (bwd_tile_scheduler.h), the scratch layout (bwd/workspace.h) and the
// launcher.
#pragma once
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

}  // namespace flash3
