// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// FP8 forward (FwdTraits::kFp8) host-side layout checks:
//  * the PV GEMM's e4m3 A operand built from the QK^T accumulator without
//    exchanging values between lanes (FwdMainloop's to_p): k-slot s of a
//    16-key chunk must hold, in every thread, the accumulator entry of the
//    same row and of key slot_key order, as CuTe's own A / C layouts say;
//  * the V transpose's work items cover every (column, slot) of a stage once;
//  * full-width WGMMA atoms for the FP8 tiles.
#include <gtest/gtest.h>

#include <set>

#include "fwd/kernel_traits.h"
#include "fwd/mainloop.h"

namespace {
using namespace cute;

template <int D, int DV, bool kMasked, bool kLocal>
struct Fp8 {
  using Cfg = flash3::DefaultFwdConfig<D, DV, kMasked, kLocal, false, true>;
  using T = flash3::FwdTraits<cutlass::float_e4m3_t, D, DV, Cfg, flash3::MaskNone, false, flash3::ScoreModIdentity,
                              false, cutlass::bfloat16_t>;
  using M = flash3::FwdMainloop<T>;
};

// The key (column of S) that k-slot `slot` of P carries: chunk base + 2q + {0, 1, 8, 9}[t].
int key_of_slot(int slot) {
  const int chunk = slot / 16, q = (slot % 16) / 4, t = slot % 4;
  static const int kOffset[4] = {0, 1, 8, 9};
  return 16 * chunk + 2 * q + kOffset[t];
}

template <class F>
void check_p_registers() {
  using T = typename F::T;
  constexpr int kM = T::kBlockM, kN = T::kBlockN;
  SCOPED_TRACE(testing::Message() << "d=" << T::kHeadDim << " tile " << kM << "x" << kN);
  EXPECT_EQ(int(size<1>(typename T::TiledMmaPV::AtomShape_MNK{})), T::kHeadDimV);
  EXPECT_EQ(int(size<1>(typename T::TiledMmaQK::AtomShape_MNK{})), kN);
  typename T::TiledMmaQK mma_qk;
  typename T::TiledMmaPV mma_pv;
  Tensor cS = make_identity_tensor(Shape<Int<kM>, Int<kN>>{});
  Tensor cP = make_identity_tensor(Shape<Int<kM>, Int<kN>>{});  // (rows, k-slots)
  int checked = 0;
  for (int t = 0; t < T::kNumMmaThreads; ++t) {
    Tensor tScS = mma_qk.get_thread_slice(t).partition_C(cS);
    Tensor tPcP = mma_pv.get_thread_slice(t).partition_A(cP);
    ASSERT_EQ(int(size(tScS)), kN / 2);
    ASSERT_EQ(int(size(tPcP)), kN / 2);
    // FwdMainloop::mma's to_p: A value tt + 4 v1 + 8 v2 + 16 kb <- accumulator
    // entry 2 v1 + 4 (4 kb + 2 v2) + (tt & 1) + 4 (tt >> 1).
    for (int kb = 0; kb < kN / 32; ++kb)
      for (int v2 = 0; v2 < 2; ++v2)
        for (int v1 = 0; v1 < 2; ++v1)
          for (int tt = 0; tt < 4; ++tt) {
            const int a = tt + 4 * v1 + 8 * v2 + 16 * kb;
            const int j = 2 * v1 + 4 * (4 * kb + 2 * v2) + (tt & 1) + 4 * (tt >> 1);
            const auto pa = tPcP(a);
            const auto sj = tScS(j);
            ASSERT_EQ(int(get<0>(pa)), int(get<0>(sj))) << "thread " << t << " value " << a;
            ASSERT_EQ(key_of_slot(int(get<1>(pa))), int(get<1>(sj))) << "thread " << t << " value " << a;
            EXPECT_EQ(F::M::slot_key(tt), key_of_slot(tt));
            ++checked;
          }
  }
  EXPECT_EQ(checked, T::kNumMmaThreads * kN / 2);
}

template <class F>
void check_transpose_cover() {
  using T = typename F::T;
  using M = typename F::M;
  std::set<std::pair<int, int>> seen;  // (16-key chunk, 32-column pair)
  for (int unit = 0; unit < M::kTransposeUnits; ++unit) {
    const auto u = M::transpose_unit(unit);
    ASSERT_GE(u.chunk, 0);
    ASSERT_LT(16 * u.chunk + 15, T::kBlockN);
    ASSERT_GE(u.pair, 0);
    ASSERT_LT(32 * u.pair + 31, T::kHeadDimV);
    EXPECT_TRUE(seen.insert({u.chunk, u.pair}).second);
  }
  EXPECT_EQ(int(seen.size()) * 16 * 32, T::kHeadDimV * T::kBlockN);
}

TEST(Fp8Layout, PRegistersFollowTheSlotOrder) {
  check_p_registers<Fp8<64, 64, false, false>>();
  check_p_registers<Fp8<64, 64, true, true>>();
  check_p_registers<Fp8<96, 96, false, false>>();
  check_p_registers<Fp8<128, 128, false, false>>();
  check_p_registers<Fp8<192, 192, false, false>>();
  check_p_registers<Fp8<192, 192, true, true>>();
  check_p_registers<Fp8<256, 256, false, false>>();
}

TEST(Fp8Layout, TransposeCoversEveryBlockOnce) {
  check_transpose_cover<Fp8<64, 64, false, false>>();
  check_transpose_cover<Fp8<96, 96, false, false>>();
  check_transpose_cover<Fp8<128, 128, false, false>>();
  check_transpose_cover<Fp8<192, 192, false, false>>();
  check_transpose_cover<Fp8<192, 192, true, true>>();
  check_transpose_cover<Fp8<256, 256, false, false>>();
}

TEST(Fp8Layout, TileTable) {
  for (int d : {64, 96, 128, 192, 256})
    for (int mask = 0; mask < 3; ++mask) {
      const flash3::FwdTileConfig c = flash3::fwd_tile_config(d, d, mask > 0, mask == 2, false, true);
      SCOPED_TRACE(testing::Message() << "d=" << d << " mask=" << mask);
      EXPECT_EQ(c.tile_n % 32, 0);
      EXPECT_EQ(c.rescale_slack, 0);
      EXPECT_EQ(c.persistent, d <= 128 && mask == 0);
      EXPECT_LE(flash3::fwd_smem_bytes(c, d, d, 1), 227 * 1024);
      EXPECT_LE(c.producer_regs * 128 + c.consumer_regs * 128 * c.num_mma_wg, 65536);
    }
}

}  // namespace
