// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// How many pieces the forward splits each query tile's KV range into
// (split-KV / Flash-Decoding, AttentionOptions::num_splits): the heuristic
// behind num_splits = 0 and the clamp applied to every request. Host code
// only; the launcher and forward_workspace_size() both come here, so the
// split count they see is the same.
//
// A split of s pieces runs tiles * s CTAs, each over ceil(n_blocks / s) KV
// blocks, then a combine kernel merges the s fp32 partials of every row.
// Splitting pays when the unsplit grid leaves most SMs idle (decode: one
// query tile per KV head and batch element against 132 SMs), and costs the
// partials' round trip through global memory plus the combine launch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flash3 {

// The most pieces a KV range is split into (opts.num_splits above it is
// rejected); also bounds the forward workspace's partials and the combine
// kernel's per-row loop.
constexpr int kMaxSplits = 256;

// An unsplit grid of at least this fraction of a wave already keeps the
// machine busy: splitting would add the partials' traffic and the combine
// launch to gain at most the last 20% of one wave.
constexpr double kFwdSplitFullMachine = 0.8;
// KV ranges of at most this many blocks are not split: each CTA fills its
// K / V pipeline (prologue) and drains it into the epilogue once, so a piece
// of one or two blocks spends most of its time there instead of in the
// mainloop that the split is meant to spread over more SMs.
constexpr int kFwdSplitMinBlocks = 4;
// Among the counts within this fraction of the best wave efficiency the
// smallest wins: every extra piece costs its partials (writes, then the
// combine's reads) and shortens each piece towards its fixed costs, so the
// last few percent of efficiency are not worth many more pieces.
constexpr double kFwdSplitEfficiencyFraction = 0.85;

// KV blocks per piece when n_blocks are split s ways (the last piece may be
// shorter; pieces past the range are empty).
constexpr int fwd_blocks_per_split(int n_blocks, int splits) {
  return splits <= 1 ? n_blocks : (n_blocks + splits - 1) / splits;
}

// The fraction of the SM slots of its waves that a grid of `ctas` equal CTAs
// uses: ctas / num_sms waves over the whole waves they occupy. The last wave
// of a grid is the idle time splitting tries to fill.
inline double fwd_wave_efficiency(int64_t ctas, int num_sms) {
  if (ctas <= 0 || num_sms <= 0) return 0.0;
  const double waves = double(ctas) / double(num_sms);
  return waves / std::ceil(waves);
}

// The split count for num_splits = 0 (the heuristic).
//   tiles:      (query tile, tile head, batch) CTAs of the unsplit grid
//   n_blocks:   KV blocks of the longest tile (varlen: of max_seqlen_k)
//   num_sms:    SMs of the device
//   max_splits: the caller's cap (<= kMaxSplits)
// Returns 1 (no split) when the unsplit grid fills most of the machine or the
// KV range is short; otherwise the smallest count whose wave efficiency is
// within kFwdSplitEfficiencyFraction of the best count in
// [1, min(max_splits, num_sms, n_blocks)]. More pieces than SMs cannot shorten
// a wave further, and more than n_blocks would be empty.
inline int fwd_num_splits_heuristic(int64_t tiles, int n_blocks, int num_sms, int max_splits) {
  if (tiles <= 0 || num_sms <= 0 || n_blocks <= kFwdSplitMinBlocks) return 1;
  if (double(tiles) >= kFwdSplitFullMachine * num_sms) return 1;
  const int cap = std::min({max_splits, num_sms, n_blocks, kMaxSplits});
  if (cap <= 1) return 1;
  // tiles < 0.8 * num_sms and cap <= kMaxSplits: tiles * s stays far from overflow.
  // The bar comes from every count in range, the skipped ones below included:
  // they still show how full this grid's waves can get, and a higher bar only
  // asks more of the counts that can be picked.
  double best = 0.0;
  for (int s = 1; s <= cap; ++s) best = std::max(best, fwd_wave_efficiency(tiles * s, num_sms));
  int fallback = 1;
  double fallback_eff = 0.0;
  for (int s = 1; s <= cap; ++s) {
    // A count with as many blocks per piece as s - 1 runs only the same
    // non-empty pieces (the rest are empty CTAs that still take a slot and
    // write nothing useful): its higher efficiency is not real work, and
    // s - 1 was already considered.
    if (s > 1 && fwd_blocks_per_split(n_blocks, s) == fwd_blocks_per_split(n_blocks, s - 1)) continue;
    const double eff = fwd_wave_efficiency(tiles * s, num_sms);
    if (eff >= kFwdSplitEfficiencyFraction * best) return s;
    if (eff > fallback_eff) fallback = s, fallback_eff = eff;
  }
  // Only where the best count is one of those skipped counts and no kept
  // count comes near it: the most efficient kept count.
  return fallback;
}

// A requested split count as the launch runs it: at least 1, at most one
// piece per KV block (pieces past the range would be empty CTAs writing
// partials the combine then reads for nothing) and at most kMaxSplits.
inline int fwd_num_splits_clamp(int requested, int n_blocks) {
  return std::max(1, std::min({requested, n_blocks, kMaxSplits}));
}

}  // namespace flash3
