// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Host-side split-KV logic (src/plan/split_heuristic.h): the heuristic
// behind AttentionOptions::num_splits = 0 and the clamp of requested counts.
// The wave efficiency and the blocks per piece are recomputed here from their
// definitions (integer arithmetic), not taken from the header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "plan/split_heuristic.h"

namespace {

using flash3::fwd_num_splits_clamp;
using flash3::fwd_num_splits_heuristic;
using flash3::kMaxSplits;

// Used SM slots of the waves a grid of `ctas` CTAs occupies on `sms` SMs.
double efficiency(int64_t ctas, int sms) {
  const int64_t waves = (ctas + sms - 1) / sms;
  return double(ctas) / double(waves * sms);
}
int per_piece(int n_blocks, int s) { return (n_blocks + s - 1) / s; }
// A count that runs as many non-empty pieces as it says (s - 1 does not give
// the same blocks per piece).
bool kept(int n_blocks, int s) { return s == 1 || per_piece(n_blocks, s) != per_piece(n_blocks, s - 1); }

std::string where(int64_t tiles, int n_blocks, int sms, int cap) {
  return "tiles=" + std::to_string(tiles) + " n_blocks=" + std::to_string(n_blocks) + " sms=" + std::to_string(sms) +
         " max_splits=" + std::to_string(cap);
}

TEST(SplitHeuristic, FullMachineDoesNotSplit) {
  // 0.8 x 132 = 105.6: from 106 tiles on the grid is full enough.
  for (int64_t tiles : std::initializer_list<int64_t>{106, 120, 131, 132, 133, 264, 1000, int64_t(1) << 40})
    for (int n_blocks : {5, 64, 256, 4096})
      EXPECT_EQ(fwd_num_splits_heuristic(tiles, n_blocks, 132, kMaxSplits), 1) << where(tiles, n_blocks, 132, 256);
  // Just below the threshold, long KV: splits.
  EXPECT_GT(fwd_num_splits_heuristic(105, 256, 132, kMaxSplits), 1);
  EXPECT_GT(fwd_num_splits_heuristic(62, 256, 78, kMaxSplits), 1);  // 0.8 x 78 = 62.4
  EXPECT_EQ(fwd_num_splits_heuristic(63, 256, 78, kMaxSplits), 1);
}

// Decode: batch 1, 8 KV heads (GQA packed: one query tile per KV head),
// 32k keys at tile_n = 128 (256 blocks), 132 SMs. 8 tiles fill 6% of the
// machine. The best count is 33 (264 CTAs, exactly 2 waves), so the bar is
// 0.85: 14 pieces give 112 / 132 = 0.848, 15 give 120 / 132 = 0.909.
TEST(SplitHeuristic, DecodeFillsTheMachine) {
  const int s = fwd_num_splits_heuristic(8, 256, 132, kMaxSplits);
  EXPECT_GE(efficiency(8 * int64_t(s), 132), 0.85) << "splits=" << s;
  EXPECT_EQ(s, 15);
  // A cap of 8: the best in range is 8 pieces (64 CTAs, 0.485), 7 give
  // 56 / 132 = 0.424 >= 0.85 x 0.485, 6 give 0.364.
  EXPECT_EQ(fwd_num_splits_heuristic(8, 256, 132, 8), 7);
  // MHA decode, 32 heads: 32 tiles; 4 pieces give 128 / 132 = 0.97.
  const int s_mha = fwd_num_splits_heuristic(32, 256, 132, kMaxSplits);
  EXPECT_EQ(s_mha, 4);
  EXPECT_GE(efficiency(32 * int64_t(s_mha), 132), 0.85);
}

TEST(SplitHeuristic, ShortKvDoesNotSplit) {
  for (int n_blocks = -1; n_blocks <= 4; ++n_blocks)
    for (int64_t tiles : {1, 2, 8, 50})
      EXPECT_EQ(fwd_num_splits_heuristic(tiles, n_blocks, 132, kMaxSplits), 1) << where(tiles, n_blocks, 132, 256);
  // Five blocks are enough to split one tile.
  EXPECT_GT(fwd_num_splits_heuristic(1, 5, 132, kMaxSplits), 1);
}

TEST(SplitHeuristic, DegenerateInputs) {
  EXPECT_EQ(fwd_num_splits_heuristic(0, 256, 132, kMaxSplits), 1) << "no tiles";
  EXPECT_EQ(fwd_num_splits_heuristic(-5, 256, 132, kMaxSplits), 1) << "negative tiles";
  EXPECT_EQ(fwd_num_splits_heuristic(8, 256, 0, kMaxSplits), 1) << "SM count unknown";
  EXPECT_EQ(fwd_num_splits_heuristic(8, 256, -1, kMaxSplits), 1) << "SM count unknown";
  for (int cap : {-3, 0, 1}) EXPECT_EQ(fwd_num_splits_heuristic(8, 256, 132, cap), 1) << "max_splits=" << cap;
  // A cap above kMaxSplits still yields at most kMaxSplits.
  EXPECT_LE(fwd_num_splits_heuristic(1, 100000, 100000, 1 << 20), kMaxSplits);
}

// Over a sweep of machines, caps, KV lengths and unsplit grids: the result is
// a valid count, one that runs as many pieces as it says, the smallest within
// 0.85 of the best efficiency (or, where no kept count gets there, the most
// efficient kept one), never less efficient than not splitting, and never
// slower than not splitting in a model where a piece costs its blocks and the
// grid costs its waves.
TEST(SplitHeuristic, SweepProperties) {
  int64_t checked = 0, split = 0;
  for (int sms : {1, 16, 78, 114, 132, 144})
    for (int cap : {1, 2, 3, 5, 17, 64, 256})
      for (int n_blocks = 0; n_blocks <= 2048; n_blocks += n_blocks < 160 ? 1 : 37)
        for (int64_t tiles = 1; tiles <= 2 * sms; tiles += 1 + tiles / 16) {
          const int s = fwd_num_splits_heuristic(tiles, n_blocks, sms, cap);
          SCOPED_TRACE(where(tiles, n_blocks, sms, cap) + " -> " + std::to_string(s));
          ++checked;
          const int hi = std::max(1, std::min({cap, sms, n_blocks, kMaxSplits}));
          ASSERT_GE(s, 1);
          ASSERT_LE(s, hi) << "more pieces than the cap, the SMs or the KV blocks";
          if (s == 1) {
            // Not splitting must be one of the two rules or the efficiency rule.
            if (double(tiles) >= 0.8 * sms || n_blocks <= 4 || hi == 1) continue;
          } else {
            ++split;
            ASSERT_LT(double(tiles), 0.8 * sms) << "split a grid that fills the machine";
            ASSERT_GT(n_blocks, 4) << "split a short KV range";
            ASSERT_TRUE(kept(n_blocks, s)) << "a count with the blocks per piece of s - 1 (empty pieces)";
          }
          double best = 0, best_kept = 0;
          for (int x = 1; x <= hi; ++x) {
            best = std::max(best, efficiency(tiles * x, sms));
            if (kept(n_blocks, x)) best_kept = std::max(best_kept, efficiency(tiles * x, sms));
          }
          const double eff = efficiency(tiles * s, sms), bar = 0.85 * best;
          ASSERT_GE(eff + 1e-12, efficiency(tiles, sms)) << "less efficient than not splitting";
          if (best_kept + 1e-12 >= bar) {
            ASSERT_GE(eff + 1e-12, bar) << "efficiency " << eff << " below 0.85 of the best " << best;
            for (int x = 1; x < s; ++x) {
              if (kept(n_blocks, x)) ASSERT_LT(efficiency(tiles * x, sms), bar + 1e-12) << "smaller count " << x;
            }
          } else {
            ASSERT_GE(eff + 1e-12, best_kept) << "no kept count reaches the bar: the most efficient one";
          }
          const int64_t unsplit_time = (tiles + sms - 1) / sms * int64_t(n_blocks);
          const int64_t split_time = (tiles * s + sms - 1) / sms * int64_t(per_piece(n_blocks, s));
          ASSERT_LE(split_time, unsplit_time) << "slower than not splitting (waves x blocks per piece)";
        }
  RecordProperty("checked", std::to_string(checked));
  EXPECT_GT(split, checked / 4) << "the sweep hardly splits: the heuristic is off";
}

// max_splits only limits the range: every cap gives at most cap pieces, and a
// cap at or above min(num_sms, n_blocks) (the range's other bounds) gives the
// uncapped choice.
TEST(SplitHeuristic, CapOnlyBinds) {
  for (int64_t tiles : {1, 3, 8, 16, 40})
    for (int n_blocks : {8, 33, 256, 1024}) {
      const int free_choice = fwd_num_splits_heuristic(tiles, n_blocks, 132, kMaxSplits);
      for (int cap = 1; cap <= 140; ++cap) {
        const int s = fwd_num_splits_heuristic(tiles, n_blocks, 132, cap);
        EXPECT_LE(s, cap) << where(tiles, n_blocks, 132, cap);
        // A cap that admits the free choice and every count up to the best
        // one gives the free choice (the best count in range is the same).
        if (cap >= std::min(132, n_blocks)) {
          EXPECT_EQ(s, free_choice) << where(tiles, n_blocks, 132, cap);
        }
      }
    }
}

TEST(SplitHeuristic, Clamp) {
  EXPECT_EQ(kMaxSplits, 256);
  EXPECT_EQ(fwd_num_splits_clamp(1, 100), 1);
  EXPECT_EQ(fwd_num_splits_clamp(3, 100), 3);
  EXPECT_EQ(fwd_num_splits_clamp(17, 100), 17);
  EXPECT_EQ(fwd_num_splits_clamp(17, 8), 8) << "more pieces than KV blocks would be empty";
  EXPECT_EQ(fwd_num_splits_clamp(17, 17), 17);
  EXPECT_EQ(fwd_num_splits_clamp(256, 1000), 256);
  EXPECT_EQ(fwd_num_splits_clamp(300, 1000), 256) << "at most kMaxSplits";
  EXPECT_EQ(fwd_num_splits_clamp(1 << 30, 1 << 30), 256);
  EXPECT_EQ(fwd_num_splits_clamp(5, 1), 1);
  EXPECT_EQ(fwd_num_splits_clamp(5, 0), 1) << "no keys: one (empty) piece";
  EXPECT_EQ(fwd_num_splits_clamp(5, -1), 1);
  EXPECT_EQ(fwd_num_splits_clamp(0, 100), 1);
  EXPECT_EQ(fwd_num_splits_clamp(-7, 100), 1);
}

}  // namespace
