// Host checks of the forward tile schedulers' index maths.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

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
        const flash3::TileCoord t = S::tile_at(linear, m, h);
        ASSERT_GE(t.m_block, 0);
        ASSERT_LT(t.m_block, m);
        ASSERT_LT(t.head, h);
        ASSERT_LT(t.batch, b);
        EXPECT_TRUE(seen.insert({t.m_block, t.head, t.batch}).second) << "tile visited twice";
      }
    }
    EXPECT_EQ(int(seen.size()), m * h * b);
    if (m > 1) {
      EXPECT_EQ(S::tile_at(1, m, h).m_block, 1);
      EXPECT_EQ(S::tile_at(1, m, h).head, 0);
    }
  }
}

}  // namespace
