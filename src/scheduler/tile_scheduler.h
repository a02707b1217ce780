// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Tile schedulers: map a CTA to (m_block, head, batch).
//  * SingleTileScheduler: m_block fastest, so the CTAs of one wave share a
//    head's K/V in L2 (uniform-cost tiles: no masking).
//  * LptTileScheduler: causal/local tiles have unequal cost; the longest tiles
//    (largest m_block under a bottom-right causal mask) get the lowest linear
//    block ids, and the hardware launches CTAs in that order, so the greedy
//    "longest processing time first" schedule falls out of the launch order.
//  * PersistentTileScheduler: unmasked problems, one CTA per SM looping over
//    tiles, so the next tile's loads overlap this tile's epilogue.
//  * DynamicLptTileScheduler: causal problems, one CTA per SM taking the next
//    tile of the longest-first order from a global counter when it needs one
//    (a static round-robin over that order measured 5-13% slower than
//    one-tile CTAs: unequal tiles need the greedy, dynamic assignment).
//  * VarlenTileScheduler: variable-length batches, one tile per CTA from the
//    tile map the varlen prep kernel wrote (fwd/varlen_prep.h).
// Split-KV launches fold the split into the head coordinate (split_work_tile).
// The backward's scheduler (KV blocks, BwdTile) is in bwd_tile_scheduler.h.
#pragma once
#include <cutlass/cutlass.h>

#include "common/seqlen.h"

namespace flash3 {

// One unit of work: query tile m_block of (head, batch), and for split-KV
// launches the split of its KV range (0 otherwise).
struct WorkTile {
  int m_block, head, batch;
  int split = 0;
};

// Split-KV launches (FwdTraits::kSplit) span heads x num_splits in the
// schedulers' head coordinate, splits of one head adjacent (they share the
// tile's Q): scheduler head h is (head h / num_splits, split h % num_splits).
CUTLASS_HOST_DEVICE WorkTile split_work_tile(WorkTile t, int num_splits) {
  if (num_splits > 1) {
    t.split = t.head % num_splits;
    t.head /= num_splits;
  }
  return t;
}

struct SingleTileScheduler {
  static constexpr bool kDynamic = false;
  static dim3 grid(int num_m_blocks, int heads, int batch, int /*order*/) {
    return dim3(num_m_blocks, heads, batch);
  }
  CUTLASS_DEVICE static WorkTile tile(int /*num_m_blocks*/, int /*heads*/, int /*order*/) {
    return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  }
};

// order (runtime, from the host heuristic in fwd_launch.cuh):
//   < 0 : plain m_block-fastest order (shortest causal tiles first)
//   = 0 : global longest-first: every head's last m_block, then the next ...
//   = G : grouped longest-first: heads (x batches) in groups of G whose K/V fit
//         in L2 together; within a group tiles go longest first. The first
//         wave then reads few heads' K/V (L2 reuse, which the global order
//         loses at short seqlens) while the tail is still short tiles.
struct LptTileScheduler {
  static constexpr bool kDynamic = false;
  static dim3 grid(int num_m_blocks, int heads, int batch, int order) {
    if (order < 0) return dim3(num_m_blocks, heads, batch);
    return dim3(heads * batch, num_m_blocks, 1);
  }
  // (Written out from the block indices, not through from_linear: the d = 64
  // causal kernel is spill-bound at 160 registers, and that detour was part of
  // what made it compile differently, 3-5% slower at 4k-16k; src/fwd/kernel.h.)
  CUTLASS_DEVICE static WorkTile tile(int num_m_blocks, int heads, int order) {
    if (order < 0) return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
    const int hb_total = int(gridDim.x);
    int hb, rank;  // rank 0 = longest tile
    if (order == 0) {
      hb = int(blockIdx.x);
      rank = int(blockIdx.y);
    } else {
      const int lin = int(blockIdx.y) * hb_total + int(blockIdx.x);
      const int group = lin / (order * num_m_blocks);
      const int r = lin - group * order * num_m_blocks;
      const int gsize = min(order, hb_total - group * order);
      hb = group * order + r % gsize;
      rank = r / gsize;
    }
    return {num_m_blocks - 1 - rank, hb % heads, hb / heads};
  }
  // The same order by launch rank lin (0 = first) for order >= 0, for the
  // persistent causal scheduler; hb_total = heads x batch.
  CUTLASS_HOST_DEVICE static WorkTile from_linear(int lin, int num_m_blocks, int heads, int hb_total, int order) {
    int hb = lin % hb_total, rank = lin / hb_total;  // order 0
    if (order > 0) {
      const int group = lin / (order * num_m_blocks);
      const int r = lin - group * order * num_m_blocks;
      const int rest = hb_total - group * order;
      const int gsize = order < rest ? order : rest;
      hb = group * order + r % gsize;
      rank = r / gsize;
    }
    return {num_m_blocks - 1 - rank, hb % heads, hb / heads};
  }
};

// Persistent (unmasked problems): one CTA per SM, CTA c runs tiles c, c + G,
// c + 2G, ... (G = grid size) in m_block-fastest order, so a wave of CTAs
// still shares a head's K/V in L2. Tiles cost the same, so the static
// round-robin needs no work counter.
struct PersistentTileScheduler {
  static constexpr bool kDynamic = false;
  static dim3 grid(int num_m_blocks, int heads, int batch, int num_sms) {
    const long tiles = long(num_m_blocks) * heads * batch;
    return dim3(unsigned(tiles < num_sms ? tiles : num_sms), 1, 1);
  }
  CUTLASS_HOST_DEVICE static int num_tiles(int num_m_blocks, int heads, int batch) { return num_m_blocks * heads * batch; }
  CUTLASS_HOST_DEVICE static WorkTile tile_at(int linear, int num_m_blocks, int heads, int /*batch*/,
                                               int /*order*/) {
    const int hb = linear / num_m_blocks;
    return {linear - hb * num_m_blocks, hb % heads, hb / heads};
  }
};

// Persistent causal CTAs: CTA c starts on tile c of LptTileScheduler's
// longest-first order; each later tile is the next unclaimed one,
// G + atomicAdd(counter, 1) (G = grid size, counter zeroed before the launch).
// A CTA that finishes early takes the next tile, as the hardware does for
// one-tile CTAs, so the greedy longest-first balance is kept while the next
// tile's loads still overlap this tile's epilogue. Each CTA's last fetch
// returns a value >= num_tiles, so one launch adds exactly num_tiles to the
// counter.
struct DynamicLptTileScheduler : PersistentTileScheduler {
  static constexpr bool kDynamic = true;
  CUTLASS_HOST_DEVICE static WorkTile tile_at(int linear, int num_m_blocks, int heads, int batch, int order) {
    if (order < 0) return PersistentTileScheduler::tile_at(linear, num_m_blocks, heads, batch, order);
    return LptTileScheduler::from_linear(linear, num_m_blocks, heads, heads * batch, order);
  }
};

// Varlen: gridDim.x indexes the tile map (an upper bound of the tile count:
// entries past the last tile have m_block < 0 and their CTAs exit at once),
// gridDim.y the query heads, so the CTAs of a wave share a head's K / V.
// KV-cache launches without a tile map (every sequence has the same query
// rows): blockIdx.x = batch x num_m_blocks, each sequence's tiles together
// (longest_first: its last query tile, the longest under a causal mask,
// first), blockIdx.y the head (x splits). The varlen kernels take it at run
// time (Params::kv_direct), not as their Scheduler.
struct KVCacheTileScheduler {
  static dim3 grid(int num_m_blocks, int batch, int heads) {
    return dim3(unsigned(int64_t(num_m_blocks) * batch), unsigned(heads), 1);
  }
  CUTLASS_DEVICE static WorkTile tile(int num_m_blocks, bool longest_first) {
    const int b = int(blockIdx.x) / num_m_blocks, m = int(blockIdx.x) % num_m_blocks;
    return {longest_first ? num_m_blocks - 1 - m : m, int(blockIdx.y), b};
  }
};

struct VarlenTileScheduler {
  static constexpr bool kDynamic = false;
  static dim3 grid(int tiles_bound, int heads) { return dim3(unsigned(tiles_bound), unsigned(heads), 1); }
  CUTLASS_DEVICE static WorkTile tile(VarlenScratch const& s) {
    const VarlenTile t = s.tiles[blockIdx.x];
    return {t.m_block, int(blockIdx.y), t.batch};
  }
};

}  // namespace flash3
