// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Host-side kernel logic: the KV block ranges and mask segments the forward
// kernel iterates (src/common/block_info.h), and the tile-size table.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include <random>

#include "bwd/workspace.h"
#include "common/block_info.h"
#include "config/tile_size.h"
#include "launch/dispatch.h"
#include "head_dims.h"

namespace {

using flash3::MaskSpec;
using flash3::NBlockRange;

bool visible(const MaskSpec& m, int i, int j) {
  if (j < 0 || j >= m.seqlen_k) return false;
  const int off = m.seqlen_k - m.seqlen_q;
  if (m.window_right >= 0 && j > i + off + m.window_right) return false;
  if (m.window_left >= 0 && j < i + off - m.window_left) return false;
  return true;
}

// One tile's check, for SCOPED_TRACE.
std::string tile_trace(const MaskSpec& m, const NBlockRange& r, int m_block, int tile_m, int tile_n, int g) {
  return (testing::Message() << "g=" << g << " sq=" << m.seqlen_q << " sk=" << m.seqlen_k << " wl=" << m.window_left
                             << " wr=" << m.window_right << " m_block=" << m_block << " tile " << tile_m << "x"
                             << tile_n << " -> [" << r.n_min << "," << r.n_max << ") right>=" << r.n_min_right_masked
                             << " left<" << r.n_max_left_masked)
      .GetString();
}

// Checks, by brute force over the tile's real rows, the invariants the kernel
// relies on for the KV block range r of one m_block. Row p of the tiled
// problem is query row p / g: g = 1 unpacked; under PackGQA the tiles hold
// g * seqlen_q packed rows, packed row p being query row p / g of head p % g.
void check_blocks(const MaskSpec& m, const NBlockRange& r, int m_block, int tile_m, int tile_n, int g) {
  const int num_n = (m.seqlen_k + tile_n - 1) / tile_n;
  ASSERT_GE(r.n_min, 0);
  ASSERT_LE(r.n_max, num_n);
  for (int n = 0; n < num_n; ++n) {
    bool any_visible = false, all_visible = true;
    for (int p = m_block * tile_m; p < std::min((m_block + 1) * tile_m, m.seqlen_q * g); ++p) {
      for (int j = n * tile_n; j < (n + 1) * tile_n; ++j) {
        const bool v = visible(m, p / g, j);
        any_visible |= v;
        all_visible &= v;
      }
    }
    const bool in_range = !r.empty() && n >= r.n_min && n < r.n_max;
    // Every visible pair of a real row is inside the visited range.
    if (any_visible) EXPECT_TRUE(in_range) << "block " << n << " has visible pairs but is skipped";
    // Blocks the kernel runs without any mask (not the first, seqlen-masked one;
    // not in a right/left masked segment) must be fully visible.
    const bool unmasked = in_range && n != r.n_max - 1 && n < r.n_min_right_masked && n >= r.n_max_left_masked;
    if (unmasked) EXPECT_TRUE(all_visible) << "block " << n << " runs unmasked but has masked pairs";
  }
}

// Checks every invariant the kernel relies on for one m_block.
void check_tile(const MaskSpec& m, int m_block, int tile_m, int tile_n) {
  const NBlockRange r = flash3::fwd_n_block_range(m, m_block, tile_m, tile_n);
  SCOPED_TRACE(tile_trace(m, r, m_block, tile_m, tile_n, 1));
  check_blocks(m, r, m_block, tile_m, tile_n, 1);
  EXPECT_LE(r.n_min_right_masked, std::max(r.n_max, r.n_min));
  EXPECT_GE(r.n_min_right_masked, r.n_min);
}

void sweep(int wl, int wr, int tile_m, int tile_n, unsigned seed) {
  std::mt19937 rng(seed);
  for (int t = 0; t < 60; ++t) {
    MaskSpec m;
    m.seqlen_q = 1 + rng() % 700;
    m.seqlen_k = rng() % 700;
    m.window_left = wl;
    m.window_right = wr;
    const int num_m = (m.seqlen_q + tile_m - 1) / tile_m;
    for (int mb = 0; mb < num_m; ++mb) check_tile(m, mb, tile_m, tile_n);
  }
}

TEST(BlockRange, NoMaskVisitsEveryBlock) {
  MaskSpec m{1000, 1000, -1, -1};
  const NBlockRange r = flash3::fwd_n_block_range(m, 3, 128, 176);
  EXPECT_EQ(r.n_min, 0);
  EXPECT_EQ(r.n_max, 6);  // ceil(1000 / 176)
  sweep(-1, -1, 128, 176, 1);
}

TEST(BlockRange, CausalEqualLengthsStopsAtDiagonal) {
  MaskSpec m{1024, 1024, -1, 0};
  const NBlockRange r = flash3::fwd_n_block_range(m, 2, 128, 128);
  EXPECT_EQ(r.n_min, 0);
  EXPECT_EQ(r.n_max, 3);
  EXPECT_EQ(r.n_min_right_masked, 2);  // only the diagonal block needs the mask
  sweep(-1, 0, 128, 128, 2);
}

TEST(BlockRange, CausalBottomRightWhenSeqlensDiffer) {
  // sq > sk: the first rows see nothing (their tile is empty).
  MaskSpec m{1023, 113, -1, 0};
  EXPECT_TRUE(flash3::fwd_n_block_range(m, 0, 128, 128).empty());
  EXPECT_FALSE(flash3::fwd_n_block_range(m, 7, 128, 128).empty());
  sweep(-1, 0, 128, 176, 3);
  sweep(-1, 0, 192, 128, 4);
}

TEST(BlockRange, SlidingWindowBothSides) {
  MaskSpec m{4096, 4096, 256, 256};
  const NBlockRange r = flash3::fwd_n_block_range(m, 10, 128, 128);
  EXPECT_EQ(r.n_min, 8);   // row 1280 - 256 = 1024 -> block 8
  EXPECT_EQ(r.n_max, 13);  // last row 1407 + 256 = 1663 lies in block 12
  sweep(256, 256, 128, 128, 5);
  sweep(128, 0, 128, 80, 6);
  sweep(0, 0, 192, 128, 7);
  sweep(5, -1, 128, 112, 8);
}

TEST(BlockRange, EmptyKeysGiveEmptyRange) {
  MaskSpec m{17, 0, -1, -1};
  EXPECT_TRUE(flash3::fwd_n_block_range(m, 0, 128, 128).empty());
}

TEST(BlockRange, FloorAndCeilDivOnNegatives) {
  EXPECT_EQ(flash3::floor_div(-1, 128), -1);
  EXPECT_EQ(flash3::floor_div(-128, 128), -1);
  EXPECT_EQ(flash3::floor_div(-129, 128), -2);
  EXPECT_EQ(flash3::ceil_div_int(-1, 128), 0);
  EXPECT_EQ(flash3::ceil_div_int(129, 128), 2);
}

// PackGQA: the range of fwd_n_block_range_packed must hold every visible pair
// of the tile's real packed rows, and the blocks it runs unmasked must be fully
// visible to all of them (check_blocks with the packed rows' query rows).
TEST(BlockRange, PackedRowsCoverTheirQueryRows) {
  std::mt19937 rng(7);
  const int windows[][2] = {{-1, -1}, {-1, 0}, {128, 0}, {37, 5}, {0, 0}, {300, -1}};
  for (const auto& w : windows) {
    for (int t = 0; t < 40; ++t) {
      MaskSpec m;
      m.seqlen_q = 1 + rng() % 300;
      m.seqlen_k = rng() % 700;
      m.window_left = w[0];
      m.window_right = w[1];
      const int g = 2 + rng() % 15;  // 2..16, powers of two or not
      const int num_m = (m.seqlen_q * g + 127) / 128;
      for (int mb = 0; mb < num_m; ++mb) {
        const NBlockRange r = flash3::fwd_n_block_range_packed(m, mb, 128, 128, g);
        SCOPED_TRACE(tile_trace(m, r, mb, 128, 128, g));
        check_blocks(m, r, mb, 128, 128, g);
      }
    }
  }
  // g = 1 is the unpacked range.
  MaskSpec m{500, 700, 64, 0};
  for (int mb = 0; mb < 4; ++mb) {
    const NBlockRange a = flash3::fwd_n_block_range_packed(m, mb, 128, 112, 1);
    const NBlockRange b = flash3::fwd_n_block_range(m, mb, 128, 112);
    EXPECT_EQ(a.n_min, b.n_min);
    EXPECT_EQ(a.n_max, b.n_max);
    EXPECT_EQ(a.n_min_right_masked, b.n_min_right_masked);
    EXPECT_EQ(a.n_max_left_masked, b.n_max_left_masked);
  }
}

// Split-KV: the splits of a tile's range partition it in order (disjoint, no
// block lost, sizes differ by at most the remainder), and every block a split
// runs without a mask (not its first block, outside its clamped mask segments)
// is fully visible to the tile's real rows, checked by brute force.
TEST(BlockRange, SplitsPartitionTheRangeAndKeepMasks) {
  std::mt19937 rng(11);
  const int windows[][2] = {{-1, -1}, {-1, 0}, {128, 0}, {37, 5}, {0, 0}, {300, -1}};
  for (const auto& w : windows) {
    for (int t = 0; t < 30; ++t) {
      MaskSpec m;
      m.seqlen_q = 1 + rng() % 300;
      m.seqlen_k = rng() % 900;
      m.window_left = w[0];
      m.window_right = w[1];
      const int g = 1 + rng() % 8;
      const int tile_m = 128, tile_n = 64 + 16 * int(rng() % 5);
      const int num_m = (m.seqlen_q * g + tile_m - 1) / tile_m;
      for (int mb = 0; mb < num_m; ++mb) {
        const NBlockRange full = flash3::fwd_n_block_range_packed(m, mb, tile_m, tile_n, g);
        for (int splits : {1, 2, 3, 5, 17}) {
          SCOPED_TRACE(tile_trace(m, full, mb, tile_m, tile_n, g) + " splits=" + std::to_string(splits));
          int next = full.n_min;  // the first block the next non-empty split must start at
          for (int s = 0; s < splits; ++s) {
            const NBlockRange r = flash3::split_n_block_range(full, s, splits);
            if (r.empty()) continue;
            EXPECT_EQ(r.n_min, next) << "split " << s;
            next = r.n_max;
            EXPECT_LE(r.n_max - r.n_min, (full.n_max - full.n_min + splits - 1) / splits);
            EXPECT_GE(r.n_min_right_masked, r.n_min);
            EXPECT_LE(r.n_min_right_masked, r.n_max);
            EXPECT_GE(r.n_max_left_masked, r.n_min);
            EXPECT_LE(r.n_max_left_masked, r.n_max);
            for (int n = r.n_min; n < r.n_max; ++n) {
              const bool unmasked = n != r.n_max - 1 && n < r.n_min_right_masked && n >= r.n_max_left_masked;
              if (!unmasked) continue;
              for (int p = mb * tile_m; p < std::min((mb + 1) * tile_m, m.seqlen_q * g); ++p)
                for (int j = n * tile_n; j < (n + 1) * tile_n; ++j)
                  ASSERT_TRUE(visible(m, p / g, j)) << "split " << s << " block " << n << " unmasked, row " << p
                                                    << " col " << j << " masked";
            }
          }
          EXPECT_EQ(next, full.empty() ? full.n_min : full.n_max) << "blocks lost at the end";
        }
      }
    }
  }
}

// The PackGQA decision (dispatch.cu): explicit requests, the tile-fill rule,
// and the problems that never pack.
TEST(PackGqa, DecisionFollowsRequestAndTileFill) {
  flash3::FwdParams p;
  p.dtype = flash3::DType::kBFloat16;
  p.head_dim = p.head_dim_v = 128;
  p.batch = 2;
  p.heads_q = 32;
  p.heads_kv = 8;  // g = 4
  p.seqlen_k = 1000;
  p.seqlen_q = 1;
  if (!flash3::fwd_pack_kernel_built(p.dtype, 128, 128)) {
    p.pack_gqa = 1;
    EXPECT_FALSE(flash3::fwd_pack_gqa(p)) << "no packed unit: the unpacked kernel runs";
    GTEST_SKIP() << "not built: the packgqa unit of bf16 128x128 (FLASH3_FEATURES)";
  }
  const int tile_m = flash3::fwd_tile_config(128, 128, false).tile_m;
  ASSERT_EQ(tile_m, 128);
  EXPECT_TRUE(flash3::fwd_pack_gqa(p)) << "decode: 1 of 128 rows unpacked, 4 packed";
  p.seqlen_q = 4096;
  EXPECT_FALSE(flash3::fwd_pack_gqa(p)) << "full tiles either way";
  p.seqlen_q = 200;  // fill 200/256 = 0.78 < 0.9 x 800/896
  EXPECT_TRUE(flash3::fwd_pack_gqa(p));
  p.seqlen_q = 120;  // fill 120/128 = 480/512: equal
  EXPECT_FALSE(flash3::fwd_pack_gqa(p));
  p.pack_gqa = 1;
  EXPECT_TRUE(flash3::fwd_pack_gqa(p));
  p.seqlen_q = 1;
  p.pack_gqa = 0;
  EXPECT_FALSE(flash3::fwd_pack_gqa(p));
  p.pack_gqa = -1;
  p.varlen = true;
  p.seqlen_q = 100000;  // varlen: the total; always packed
  EXPECT_TRUE(flash3::fwd_pack_gqa(p));
  p.varlen = false;
  p.seqlen_q = 1;
  p.softcap = 30.f;  // no packed softcap units
  EXPECT_FALSE(flash3::fwd_pack_gqa(p));
  p.softcap = 0.f;
  p.heads_kv = 32;  // MHA
  p.pack_gqa = 1;
  EXPECT_FALSE(flash3::fwd_pack_gqa(p));
  p.heads_kv = 2;  // g = 16: 2^27 x 16 packed rows do not fit int32
  p.seqlen_q = 1 << 27;
  EXPECT_FALSE(flash3::fwd_pack_gqa(p));
  p.dtype = flash3::DType::kFloat16;
  p.seqlen_q = 1;
  EXPECT_EQ(flash3::fwd_pack_gqa(p), flash3::fwd_pack_kernel_built(flash3::DType::kFloat16, 128, 128));
}

TEST(TileConfig, EveryHeadDimFitsSharedMemoryAndRegisters) {
  for (auto& d : flash3_test::kHeadDimPairs) {
    for (int mask : {0, 1, 2}) {  // none, causal, local
      const flash3::FwdTileConfig c = flash3::fwd_tile_config(d[0], d[1], mask > 0, mask == 2);
      SCOPED_TRACE(testing::Message() << "d=" << d[0] << " dv=" << d[1] << " mask=" << mask);
      EXPECT_EQ(c.tile_m, 64 * c.num_mma_wg);
      EXPECT_EQ(c.tile_n % 16, 0);
      EXPECT_LE(flash3::fwd_smem_bytes(c, d[0], d[1], 2), 227 * 1024);
      EXPECT_LE(c.producer_regs * 128 + c.consumer_regs * 128 * c.num_mma_wg, 65536);
      EXPECT_EQ(c.consumer_regs % 8, 0);  // setmaxnreg takes multiples of 8
    }
  }
}

// The short-causal variant (persistent, dynamic tile claims) differs from the
// default causal tile only in `persistent`; it exists exactly for d <= 128, and
// the launcher takes it for seqlen_k up to the threshold only.
TEST(TileConfig, ShortCausalVariantIsTheCausalTilePersistent) {
  for (auto& d : flash3_test::kHeadDimPairs) {
    SCOPED_TRACE(testing::Message() << "d=" << d[0] << " dv=" << d[1]);
    const flash3::FwdTileConfig a = flash3::fwd_tile_config(d[0], d[1], true, false, false);
    const flash3::FwdTileConfig b = flash3::fwd_tile_config(d[0], d[1], true, false, true);
    EXPECT_FALSE(a.persistent);
    EXPECT_EQ(flash3::fwd_has_short_causal(d[0], d[1]), d[0] <= 128);
    EXPECT_EQ(b.persistent, flash3::fwd_has_short_causal(d[0], d[1]));
    EXPECT_EQ(std::make_tuple(a.tile_m, a.tile_n, a.num_stages, a.num_mma_wg, a.pingpong, a.producer_regs, a.consumer_regs),
              std::make_tuple(b.tile_m, b.tile_n, b.num_stages, b.num_mma_wg, b.pingpong, b.producer_regs, b.consumer_regs));
    EXPECT_LE(flash3::fwd_smem_bytes(b, d[0], d[1], 2), 227 * 1024);
    // The local (window) kernel never takes it.
    EXPECT_FALSE(flash3::fwd_tile_config(d[0], d[1], true, true, true).persistent);
  }
  for (int d : {64, 96, 128}) {
    EXPECT_TRUE(flash3::fwd_short_causal(d, flash3::kFwdPersistentCausalMaxSeqlen));
    EXPECT_EQ(flash3::fwd_short_causal(d, flash3::kFwdPersistentCausalMaxSeqlen + 1), d <= 64);
    EXPECT_EQ(flash3::fwd_short_causal(d, 1 << 20), d <= 64);
  }
}

// Backward: KV block n visits query block m exactly when the forward's query
// block m visits KV block n (the deterministic dQ order relies on this), every
// visible pair is covered, and tiles the kernel runs without a mask are fully
// visible (query rows past seqlen_q excepted: their LSE is +inf).
// shift: the causal / local launches' front padding (bwd_row_shift): the kernel
// sees seqlen_q + shift padded rows and padded row r is query r - shift; rows
// outside [0, seqlen_q) are neutralised like the tail rows.
// Returns the number of (KV block, query block) iterations.
long check_bwd(const MaskSpec& m, int tile_m, int tile_n, int shift = 0) {
  MaskSpec mk = m;
  mk.seqlen_q += shift;
  const int num_m = (mk.seqlen_q + tile_m - 1) / tile_m;
  const int num_n = (m.seqlen_k + tile_n - 1) / tile_n;
  long iterations = 0;
  for (int n = 0; n < num_n; ++n) {
    const flash3::MBlockRange r = flash3::bwd_m_block_range(mk, n, tile_m, tile_n);
    SCOPED_TRACE(testing::Message() << "sq=" << m.seqlen_q << " sk=" << m.seqlen_k << " wl=" << m.window_left
                                    << " wr=" << m.window_right << " shift=" << shift << " n_block=" << n << " -> ["
                                    << r.m_min << "," << r.m_max << ")");
    EXPECT_GE(r.m_min, 0);
    EXPECT_LE(r.m_max, num_m);
    if (!r.empty()) iterations += r.m_max - r.m_min;
    for (int mb = 0; mb < num_m; ++mb) {
      const NBlockRange f = flash3::fwd_n_block_range(mk, mb, tile_m, tile_n);
      const bool fwd_visits = !f.empty() && n >= f.n_min && n < f.n_max;
      const bool bwd_visits = !r.empty() && mb >= r.m_min && mb < r.m_max;
      EXPECT_EQ(fwd_visits, bwd_visits) << "m_block " << mb;
      bool any_visible = false, all_visible = true;
      for (int i = std::max(mb * tile_m - shift, 0); i < std::min((mb + 1) * tile_m - shift, m.seqlen_q); ++i)
        for (int j = n * tile_n; j < (n + 1) * tile_n; ++j) {
          const bool v = visible(m, i, j);
          any_visible |= v;
          all_visible &= v;
        }
      if (any_visible) EXPECT_TRUE(bwd_visits) << "m_block " << mb << " has visible pairs but is skipped";
      if (bwd_visits && !flash3::bwd_tile_needs_mask(mk, mb, n, tile_m, tile_n))
        EXPECT_TRUE(all_visible) << "m_block " << mb << " runs unmasked but has masked pairs";
    }
  }
  return iterations;
}

TEST(BwdBlockRange, MatchesForwardAndCoversVisiblePairs) {
  const int windows[][2] = {{-1, -1}, {-1, 0}, {128, 0}, {256, 256}, {0, 0}, {5, -1}, {-1, 37}};
  std::mt19937 rng(11);
  for (auto& w : windows) {
    for (int t = 0; t < 40; ++t) {
      MaskSpec m;
      m.seqlen_q = rng() % 600;
      m.seqlen_k = 1 + rng() % 600;
      m.window_left = w[0];
      m.window_right = w[1];
      check_bwd(m, 64, 128);
    }
  }
  MaskSpec causal{1024, 1024, -1, 0};
  EXPECT_EQ(flash3::bwd_m_block_range(causal, 3, 64, 128).m_min, 6);  // keys 384.. seen from row 384
  EXPECT_EQ(flash3::bwd_m_block_range(causal, 3, 64, 128).m_max, 16);
}

// Causal / local launches pad the query grid at the front (bwd_row_shift):
// every visible pair is still covered, and with bottom-right masks the partial
// block is visited by the top KV blocks only.
TEST(BwdBlockRange, FrontPaddedGridCoversVisiblePairs) {
  const int windows[][2] = {{-1, 0}, {128, 0}, {256, 256}, {0, 0}, {-1, 37}, {5, -1}};
  std::mt19937 rng(12);
  for (auto& w : windows) {
    for (int t = 0; t < 30; ++t) {
      MaskSpec m;
      m.seqlen_q = 1 + rng() % 600;
      m.seqlen_k = 1 + rng() % 600;
      m.window_left = w[0];
      m.window_right = w[1];
      const flash3::BwdWorkspaceLayout ws = flash3::bwd_workspace_layout(1, 1, m.seqlen_q, 128, 80);
      const int shift = flash3::bwd_row_shift(ws, m.seqlen_q, true);
      EXPECT_EQ(shift, (80 - m.seqlen_q % 80) % 80);
      EXPECT_EQ((m.seqlen_q + shift) / 80, ws.num_m_blocks) << "the padded grid has the same blocks";
      check_bwd(m, 80, 128, shift);
    }
  }
  // d = 128 causal at 4096 queries (80-row blocks): every KV block ran the last
  // block (16 real rows); now each skips 64 padded rows at the top of its
  // range instead, 25 of 883 iterations (2.8%) fewer.
  const MaskSpec causal{4096, 4096, -1, 0};
  const flash3::BwdWorkspaceLayout ws = flash3::bwd_workspace_layout(1, 1, 4096, 128, 80);
  EXPECT_EQ(flash3::bwd_row_shift(ws, 4096, false), 0);
  const int shift = flash3::bwd_row_shift(ws, 4096, true);
  EXPECT_EQ(shift, 64);
  const long back = check_bwd(causal, 80, 128, 0), front = check_bwd(causal, 80, 128, shift);
  EXPECT_EQ(back, 883);
  EXPECT_EQ(front, 858);
}

// d = 128 keeps 64-row query tiles below flash3::kBwdD128ShortSeqlen queries
// (plan_backward decides it with bwd_short_tile, and the kernels take the plan's).
TEST(TileConfig, BackwardShortSequenceTile) {
  EXPECT_FALSE(flash3::bwd_has_short_tile(64));
  EXPECT_FALSE(flash3::bwd_has_short_tile(96));
  EXPECT_FALSE(flash3::bwd_has_short_tile(256));
  if (flash3::bwd_has_short_tile(128)) {
    EXPECT_TRUE(flash3::bwd_short_tile(128, 1));
    EXPECT_TRUE(flash3::bwd_short_tile(128, flash3::kBwdD128ShortSeqlen - 1));
    EXPECT_FALSE(flash3::bwd_short_tile(128, flash3::kBwdD128ShortSeqlen));
    for (bool causal : {false, true}) {
      EXPECT_EQ(flash3::bwd_tile_config(128, 128, causal, true).tile_m, 64);
      EXPECT_LE(flash3::bwd_smem_bytes(flash3::bwd_tile_config(128, 128, causal, true), 128, 128, 2), 227 * 1024);
    }
  }
  EXPECT_FALSE(flash3::bwd_short_tile(64, 512));
}

TEST(TileConfig, BackwardFitsSharedMemoryAndRegisters) {
  for (auto& d : flash3_test::kHeadDimPairs) {
    const flash3::BwdTileConfig c = flash3::bwd_tile_config(d[0], d[1], false);
    SCOPED_TRACE(testing::Message() << "d=" << d[0] << " dv=" << d[1]);
    EXPECT_EQ(c.tile_n, c.split_hdim ? 64 : 64 * c.num_mma_wg);
    if (c.split_hdim) {
      EXPECT_EQ(d[0] % (16 * c.num_mma_wg), 0);
      EXPECT_EQ(d[1] % (16 * c.num_mma_wg), 0);
    }
    EXPECT_EQ(c.tile_m % 16, 0);
    EXPECT_LE(flash3::bwd_smem_bytes(c, d[0], d[1], 2), 227 * 1024);
    EXPECT_LE(c.producer_regs * 128 + c.consumer_regs * 128 * c.num_mma_wg, 65536);
  }
}

}  // namespace

