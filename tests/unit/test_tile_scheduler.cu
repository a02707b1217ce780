// Host checks of the forward tile schedulers' index maths.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>
#include <tuple>

#include "bwd/kernel.h"
#include "scheduler/tile_scheduler.h"

namespace {

// Persistent CTAs c = 0..G-1 take tiles c, c + G, ...: every (m_block, head,
// batch) exactly once, whatever the grid size, and a wave (consecutive linear
// indices) walks m_block fastest within one head.
TEST(PersistentTileScheduler, EveryTileExactlyOnce) {
  using S = flash3::PersistentTileScheduler;
  for (auto [m, h, b] : {std::tuple{64, 16, 2}, std::tuple{1, 1, 1}, std::tuple{3, 5, 7}, std::tuple{128, 8, 1}}) {
    const int sms = 132;
    const int grid = int(S::grid(m, h, b, sms).x);
    EXPECT_EQ(grid, std::min(m * h * b, sms));
    std::set<std::tuple<int, int, int>> seen;
    for (int c = 0; c < grid; ++c) {
      for (int linear = c; linear < S::num_tiles(m, h, b); linear += grid) {
        const flash3::TileCoord t = S::tile_at(linear, m, h, b, 0);
        ASSERT_GE(t.m_block, 0);
        ASSERT_LT(t.m_block, m);
        ASSERT_LT(t.head, h);
        ASSERT_LT(t.batch, b);
        EXPECT_TRUE(seen.insert({t.m_block, t.head, t.batch}).second) << "tile visited twice";
      }
    }
    EXPECT_EQ(int(seen.size()), m * h * b);
    if (m > 1) {
      EXPECT_EQ(S::tile_at(1, m, h, b, 0).m_block, 1);
      EXPECT_EQ(S::tile_at(1, m, h, b, 0).head, 0);
    }
  }
}

// Backward longest-first order in head groups (BwdScheduler::lpt_order): every
// (n_block, head) once; within a head, n_blocks come in ascending launch order
// (deterministic mode's ordered dQ accumulation relies on it); group g is
// launched before group g + 1; group 0 / >= heads is the old global order.
TEST(BwdLptOrder, GroupsAscendingEveryBlockOnce) {
  for (auto [n, hb, group] : {std::tuple{16, 128, 8}, std::tuple{32, 64, 4}, std::tuple{5, 7, 3}, std::tuple{16, 128, 0},
                              std::tuple{3, 4, 9}, std::tuple{1, 5, 2}}) {
    std::set<std::pair<int, int>> seen;
    std::vector<int> last(hb, -1);
    for (int lin = 0; lin < n * hb; ++lin) {
      const flash3::BwdTile t = flash3::BwdScheduler::lpt_order(lin, n, /*heads_kv=*/hb, hb, group);
      const int nb = t.n_block, h = t.head_kv;
      ASSERT_EQ(t.batch, 0);
      ASSERT_GE(nb, 0);
      ASSERT_LT(nb, n);
      ASSERT_GE(h, 0);
      ASSERT_LT(h, hb);
      EXPECT_TRUE(seen.insert({nb, h}).second) << "block launched twice";
      EXPECT_EQ(nb, last[h] + 1) << "a head's n_blocks must come in ascending order";
      last[h] = nb;
      if (group > 0 && group < hb) {
        EXPECT_EQ(h / group, lin / (group * n)) << "group g's blocks are launched before group g + 1's";
      } else {
        EXPECT_EQ(h, lin % hb);
      }
    }
    EXPECT_EQ(int(seen.size()), n * hb);
  }
}

// The dynamic causal schedule: CTA c starts on tile c, later tiles are handed
// out in counter order. Simulated with the greedy rule (the CTA that is free
// first takes the next tile; cost = m_block + 1, as under a causal mask):
// every tile exactly once for each tile order, the first tiles handed out are
// the longest (m_block max), and the busiest CTA ends within one longest tile
// of the average load (Graham's list-scheduling bound, any order).
TEST(DynamicLptTileScheduler, EveryTileOnceLongestFirstBalanced) {
  using S = flash3::DynamicLptTileScheduler;
  static_assert(S::kDynamic && !flash3::PersistentTileScheduler::kDynamic, "scheduler kinds");
  for (auto [m, h, b] : {std::tuple{64, 16, 2}, std::tuple{3, 5, 7}, std::tuple{32, 16, 1}, std::tuple{1, 1, 1}}) {
    for (int order : {-1, 0, 1, 3, 4}) {
      SCOPED_TRACE(testing::Message() << "m=" << m << " h=" << h << " b=" << b << " order=" << order);
      const int n = S::num_tiles(m, h, b);
      const int grid = int(S::grid(m, h, b, 132).x);
      std::set<std::tuple<int, int, int>> seen;
      std::vector<long> load(grid, 0);
      long total = 0;
      for (int linear = 0; linear < n; ++linear) {
        const flash3::TileCoord t = S::tile_at(linear, m, h, b, order);
        ASSERT_TRUE(t.m_block >= 0 && t.m_block < m && t.head >= 0 && t.head < h && t.batch >= 0 && t.batch < b);
        EXPECT_TRUE(seen.insert({t.m_block, t.head, t.batch}).second) << "tile visited twice";
        if (order >= 0 && linear < h * b && (order == 0 || order >= h * b)) EXPECT_EQ(t.m_block, m - 1);
        // Tiles 0..grid-1 start the CTAs; each later one goes to the least-loaded CTA.
        const int cta = linear < grid ? linear : int(std::min_element(load.begin(), load.end()) - load.begin());
        load[cta] += t.m_block + 1;
        total += t.m_block + 1;
      }
      EXPECT_EQ(int(seen.size()), n);
      EXPECT_LE(*std::max_element(load.begin(), load.end()), total / grid + m);
    }
  }
}

}  // namespace
