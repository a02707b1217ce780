// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The backward's tile scheduler: which KV block (of which KV head and batch)
// a CTA owns, in the launch order that balances causal trapezoids and keeps a
// wave's Q / dO in L2. One KV block per CTA (the grid is the schedule).
#pragma once
#include <cutlass/cutlass.h>

#include "common/block_info.h"
#include "config/tile_size.h"
#include "scheduler/bwd_split.h"
#include "scheduler/tile_scheduler.h"

namespace flash3 {

// One unit of the backward: KV block n_block of (KV head, batch), or one piece
// of it when the last wave's blocks are split (BwdSplitPlan).
struct BwdTile {
  int n_block, head_kv, batch;
  int piece = 0, pieces = 1;  // BwdSplitPlan: this CTA's share of the KV block's query blocks
  int split = -1;             // index among the split KV blocks (partial slots, counter); -1: whole
  int q_tile_start = 0;       // varlen: the sequence's first query block in the per-block scratch
};

// Causal/local KV blocks have unequal trapezoids: block 0 sees the most query
// blocks, so blocks are launched in ascending n_block order (longest first),
// across groups of `group` (KV head, batch) pairs at a time (0: all of them).
// A group's Q, dO and fp32 dQ accumulator are sized to stay in L2 together:
// with every head in flight at once, d = 128 2k causal moved 3.6 GB of DRAM in
// its main kernel (the dQ reduce-adds missing L2) and ran at 72% of DRAM
// bandwidth (ncu). Unmasked blocks keep n_block fastest so that
// the CTAs of one wave share a head's Q / dO in L2. Every order puts each KV
// block of a head after the lower n_blocks of the same head, which the
// deterministic mode's ordered dQ accumulation needs to be deadlock-free.
//
// The last group's longest blocks would start only when the groups before it
// are nearly done, and run alone at the end: with groups one wave wide (d = 128
// 4k causal: 3 heads x 32 blocks), the busiest SM ran 7.6% longer than the
// average (ncu sm__cycles_active max / avg; a greedy simulation of the order
// gives the same 7.6%, unit test BwdLptOrder.TailGroupEvensTheLastWave). So
// the last `tail` (KV head, batch) pairs go as one longest-first group: their
// long blocks start early enough to end with everyone else's short ones, at
// the price of more heads in L2 for the last few waves only.
struct BwdScheduler {
  // The forward's grouped longest-first order (LptTileScheduler::from_linear;
  // group 0: one group) with ascending n_block: the forward's longest tiles
  // are its last query blocks, the backward's its first KV blocks. Pairs
  // [cut, hb_total) form the tail group, cut = whole groups below hb_total - tail.
  CUTLASS_HOST_DEVICE static BwdTile lpt_order(int lin, int n_blocks, int heads_kv, int hb_total, int group,
                                               int tail = 0) {
    if (group > 0 && tail > 0) {
      int cut = hb_total - tail;
      cut = cut > 0 ? cut - cut % group : 0;
      if (lin >= cut * n_blocks) {
        const int r = lin - cut * n_blocks, width = hb_total - cut;
        const int hb = cut + r % width;
        return {r / width, hb % heads_kv, hb / heads_kv};
      }
      hb_total = cut;
    }
    const WorkTile t = LptTileScheduler::from_linear(lin, n_blocks, heads_kv, hb_total, group);
    return {n_blocks - 1 - t.m_block, t.head, t.batch};
  }
  // The tail group's size: enough (KV head, batch) pairs for kBwdTailWaves
  // waves of CTAs. In the greedy simulation the busiest SM ends within about
  // 1% of the average from 3 waves on for every causal headline shape.
  static int tail_heads(int hb_total, int n_blocks, int group, int num_sms) {
    if (group <= 0 || n_blocks <= 0) return 0;
    const int tail = (kBwdTailWaves * num_sms + n_blocks - 1) / n_blocks;
    return tail < hb_total ? tail : hb_total;
  }
  // Unmasked launches: n_block fastest, then KV head, then batch; the blocks
  // from split.first on run as split.pieces consecutive CTAs each (BwdSplitPlan).
  CUTLASS_HOST_DEVICE static BwdTile unmasked_order(int lin, int n_blocks, int heads_kv, int split_first,
                                                    int pieces) {
    const int split = lin >= split_first ? (lin - split_first) / pieces : -1;
    const int t = split >= 0 ? split_first + split : lin;
    BwdTile tile{t % n_blocks, (t / n_blocks) % heads_kv, t / (n_blocks * heads_kv)};
    if (split >= 0) {
      tile.piece = (lin - split_first) % pieces;
      tile.pieces = pieces;
      tile.split = split;
    }
    return tile;
  }
  static dim3 grid(bool lpt, int num_n_blocks, int heads_kv, int batch, const BwdSplitPlan& split) {
    return lpt ? dim3(heads_kv * batch, num_n_blocks, 1) : dim3(split.ctas(), 1, 1);
  }
  template <class Params>
  CUTLASS_DEVICE static BwdTile tile(bool lpt, Params const& p) {
    if (lpt) {
      return lpt_order(int(blockIdx.y * gridDim.x + blockIdx.x), int(gridDim.y), p.heads_kv, int(gridDim.x),
                       p.tile_group, p.tail_heads);
    }
    return unmasked_order(int(blockIdx.x), p.num_n_blocks, p.heads_kv, p.split_first, p.split_pieces);
  }
  // A piece's share of its KV block's query blocks.
  CUTLASS_HOST_DEVICE static MBlockRange piece_range(MBlockRange r, BwdTile t) {
    if (t.pieces <= 1 || r.empty()) return r;
    return {bwd_piece_begin(r.m_min, r.m_max, t.piece, t.pieces), bwd_piece_begin(r.m_min, r.m_max, t.piece + 1, t.pieces)};
  }
};

}  // namespace flash3
