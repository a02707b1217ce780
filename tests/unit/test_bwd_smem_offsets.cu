// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// BwdTraits::ds_byte_offset (the 32-bit offsets the consumers' stmatrix stores
// use) must equal the byte address CuTe's swizzled smem tensor computes for
// sdS(query, key, stage), for every head-dim variant's dS / P layout. The
// epilogue's staged dK / dV tiles (BwdEpilogue::staged_offset) must fill the
// K / V buffers one-to-one, and a warp's fragment store must not conflict.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "bwd/epilogue.h"
#include "bwd/kernel_traits.h"
#include "head_dims.h"

namespace {

template <class T>
void expect_offsets_match() {
  using L = typename T::SmemLayoutdS;
  // 1024-byte aligned like SharedStorage::smem_ds (the swizzle acts on address bits).
  std::vector<char> buf(cute::cosize_v<L> * 2 + 1024);
  auto* base = reinterpret_cast<cutlass::bfloat16_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 1023) & ~uintptr_t(1023));
  auto s = cute::make_tensor(cute::make_smem_ptr(base), L{});
  int mismatches = 0;
  for (int st = 0; st < int(cute::size<2>(L{})); ++st)
    for (int q = 0; q < int(cute::size<0>(L{})); ++q)
      for (int k = 0; k < int(cute::size<1>(L{})); ++k) {
        const long want = reinterpret_cast<char*>(cute::raw_pointer_cast(&s(q, k, st))) - reinterpret_cast<char*>(base);
        mismatches += long(T::ds_byte_offset(q, k, st)) != want;
      }
  EXPECT_EQ(mismatches, 0) << "d=" << T::kHeadDim << " dv=" << T::kHeadDimV << " tile_m=" << T::kBlockM;
}

// The keys-split consumers step their stmatrix addresses through the
// unswizzled offset (BwdTraits::kdSQueryBlockStep): check that it is additive
// for every thread's queries (q < 16), key, stage and 16-query step, and that
// swizzling it gives the tensor's address.
template <class T>
void expect_query_block_step() {
  if constexpr (T::kdSQueryBlockStep) {
    int mismatches = 0;
    for (int st = 0; st < T::kStagesdS; ++st)
      for (int q = 0; q < 16; ++q)
        for (int k = 0; k < T::kBlockN; ++k)
          for (int i = 0; i < T::kBlockM / 16; ++i) {
            const uint32_t stepped = T::ds_linear_bytes(q, k, st) + T::ds_linear_bytes(16 * i, 0, 0);
            mismatches += T::ds_linear_bytes(q + 16 * i, k, st) != stepped;
            mismatches += T::ds_byte_offset(q + 16 * i, k, st) != T::ds_swizzle(stepped);
          }
    EXPECT_EQ(mismatches, 0) << "d=" << T::kHeadDim << " tile_m=" << T::kBlockM;
  }
}

// staged_offset maps every 16-byte chunk of a (kBlockN x kCols) tile to its own
// 16-byte slot inside the buffer, and the 8 rows x 1 chunk that one warp's
// fragment store writes (rows 8j .. 8j + 7, one column pair per lane) hit 8
// distinct bank groups (at most 2 per group where the swizzle is row % 4).
template <class T, int kCols>
void expect_staged_tile(std::size_t buffer_bytes) {
  using Epi = flash3::BwdEpilogue<T>;
  constexpr int kChunk = 16 / int(sizeof(typename T::Element)), kChunks = kCols / kChunk;
  std::vector<int> hits(buffer_bytes / 16, 0);
  int bad = 0;
  for (int row = 0; row < T::kBlockN; ++row)
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t off = Epi::template staged_offset<kCols>(row, c * kChunk);
      bad += off % 16 != 0 || off + 16 > buffer_bytes;
      if (off % 16 == 0 && off + 16 <= buffer_bytes) ++hits[off / 16];
      // Elements inside a chunk stay contiguous.
      bad += Epi::template staged_offset<kCols>(row, c * kChunk + kChunk - 1) != off + 16 - sizeof(typename T::Element);
    }
  for (int h : hits) bad += h > 1;
  int worst = 0;
  for (int r0 = 0; r0 < T::kBlockN; r0 += 8)
    for (int c = 0; c < kChunks; ++c) {
      int group[8] = {};
      for (int r = r0; r < r0 + 8; ++r) ++group[(Epi::template staged_offset<kCols>(r, c * kChunk) / 16) % 8];
      for (int g : group) worst = g > worst ? g : worst;
    }
  EXPECT_EQ(bad, 0) << "d=" << T::kHeadDim << " cols=" << kCols;
  EXPECT_LE(worst, kChunks % 8 == 0 ? 1 : 2) << "d=" << T::kHeadDim << " cols=" << kCols;
}

template <class T>
void expect_staged_epilogue() {
  using SS = typename T::SharedStorage;
  expect_staged_tile<T, T::kHeadDim>(sizeof(SS::smem_k));
  expect_staged_tile<T, T::kHeadDimV>(sizeof(SS::smem_v));
}

template <int D, int DV, int kTileM>
struct TileMConfig {
  static constexpr flash3::BwdTileConfig value = [] {
    flash3::BwdTileConfig c = flash3::bwd_tile_config(D, DV, false);
    c.tile_m = kTileM;
    return c;
  }();
};

template <int D, int kTileM>
using TileMTraits = flash3::BwdTraits<cutlass::bfloat16_t, D, D, TileMConfig<D, D, kTileM>, flash3::MaskNone>;

// Runs Check::template run<Traits>() for every built head-dim pair's default
// tile and for the other query tiles d = 64 and d = 128 can take (64 and 128
// rows; the d = 128 short tile is 64).
template <class Check>
void for_each_bwd_tile() {
  flash3_test::for_each_head_dim_pair([](auto d, auto dv) {
    Check::template run<
        flash3::BwdTraits<cutlass::bfloat16_t, d(), dv(), flash3::DefaultBwdConfig<d(), dv(), false>, flash3::MaskNone>>();
  });
  Check::template run<TileMTraits<64, 64>>();
  Check::template run<TileMTraits<64, 128>>();
  Check::template run<TileMTraits<128, 64>>();
  Check::template run<TileMTraits<128, 80>>();
}

struct QueryBlockStep {
  template <class T>
  static void run() { expect_query_block_step<T>(); }
};
struct OffsetsMatch {
  template <class T>
  static void run() { expect_offsets_match<T>(); }
};

TEST(BwdSmemOffsets, QueryBlockStep) { for_each_bwd_tile<QueryBlockStep>(); }

TEST(BwdSmemOffsets, MatchSwizzledTensorAddresses) { for_each_bwd_tile<OffsetsMatch>(); }

struct StagedEpilogue {
  template <class T>
  static void run() { expect_staged_epilogue<T>(); }
};
TEST(BwdSmemOffsets, StagedEpilogueOneToOneAndConflictFree) { for_each_bwd_tile<StagedEpilogue>(); }

}  // namespace
