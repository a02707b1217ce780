// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Host-side backward scratch layout (src/bwd/workspace.h): every array starts
// 256-byte aligned, arrays do not overlap, and the sizes follow the padded
// row count the kernels index with.
#include <gtest/gtest.h>

#include "bwd/workspace.h"
#include "config/tile_size.h"

namespace {

TEST(BwdWorkspace, AlignedDisjointAndPadded) {
  const int cases[][4] = {{1, 1, 1, 64}, {2, 8, 128, 64}, {3, 5, 1000, 128}, {1, 16, 4097, 256}, {4, 3, 17, 96}};
  for (auto& c : cases) {
    const int b = c[0], h = c[1], sq = c[2], d = c[3];
    const int tile_m = flash3::bwd_tile_config(d, d, false).tile_m;
    const flash3::BwdWorkspaceLayout w = flash3::bwd_workspace_layout(b, h, sq, d, tile_m);
    SCOPED_TRACE(testing::Message() << "b=" << b << " h=" << h << " sq=" << sq << " d=" << d);
    EXPECT_EQ(w.num_m_blocks, (sq + tile_m - 1) / tile_m);
    EXPECT_EQ(w.seqlen_q_pad, w.num_m_blocks * tile_m);
    EXPECT_GE(w.seqlen_q_pad, sq);
    const size_t rows = size_t(b) * h * w.seqlen_q_pad;
    for (size_t off : {w.lse_offset, w.dpsum_offset, w.dq_accum_offset, w.sem_offset}) EXPECT_EQ(off % 256, 0u);
    EXPECT_GE(w.dpsum_offset, w.lse_offset + rows * 4);
    EXPECT_GE(w.dq_accum_offset, w.dpsum_offset + rows * 4);
    EXPECT_GE(w.sem_offset, w.dq_accum_offset + rows * size_t(d) * 4);
    EXPECT_GE(w.bytes, w.sem_offset + size_t(b) * h * w.num_m_blocks * 4);
    EXPECT_EQ(w.bytes % 256, 0u);
  }
}

// With a split plan (BwdSplitPlan) the partial slots and counters follow,
// aligned and disjoint; without one they take no space.
TEST(BwdWorkspace, SplitSlotsAfterTheCounters) {
  const flash3::BwdSplitPlan plan = flash3::bwd_split_plan(2048, 132, 52, 1);
  ASSERT_GT(plan.pieces, 1);
  const size_t slot = 128 * (128 + 128);
  const flash3::BwdWorkspaceLayout w = flash3::bwd_workspace_layout(4, 16, 4096, 128, 80, plan, slot);
  const flash3::BwdWorkspaceLayout plain = flash3::bwd_workspace_layout(4, 16, 4096, 128, 80);
  EXPECT_EQ(w.split_partials_offset % 256, 0u);
  EXPECT_EQ(w.split_count_offset % 256, 0u);
  EXPECT_EQ(w.split_partials_offset, plain.bytes);
  EXPECT_GE(w.split_count_offset, w.split_partials_offset + size_t(plan.slots()) * slot * 4);
  EXPECT_GE(w.bytes, w.split_count_offset + size_t(plan.tiles) * 4);
  EXPECT_EQ(plain.split_count_offset, plain.bytes);
}

TEST(BwdWorkspace, EmptyQueriesNeedNoScratch) {
  const flash3::BwdWorkspaceLayout w = flash3::bwd_workspace_layout(2, 4, 0, 128, 64);
  EXPECT_EQ(w.num_m_blocks, 0);
  EXPECT_EQ(w.bytes, 0u);
}

}  // namespace
