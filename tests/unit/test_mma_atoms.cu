// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Every tiled WGMMA in the tile tables must use one full-width atom per
// warpgroup: CuTe's GMMA selectors silently fall back to narrow m64n16 atoms
// for N = 80, 144, 176, 48, ... unless CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is
// defined (the build sets it; src/config/tile_size.h refuses to compile without
// it). Without it tile_n 144 / 176 ran at ~500 instead of ~700 TFLOP/s
// (docs/performance.md).
#include <gtest/gtest.h>

#include "bwd/kernel_traits.h"
#include "fwd/kernel_traits.h"
#include "head_dims.h"

namespace {

template <class TiledMma>
int atom_n() {
  return int(cute::size<1>(typename TiledMma::AtomShape_MNK{}));
}

template <int D, int DV, bool kMasked, bool kLocal>
void check_fwd() {
  using T = flash3::FwdTraits<cutlass::bfloat16_t, D, DV, flash3::DefaultFwdConfig<D, DV, kMasked, kLocal>,
                              flash3::MaskNone>;
  SCOPED_TRACE(testing::Message() << "forward d=" << D << " dv=" << DV << " masked=" << kMasked << " local=" << kLocal);
  EXPECT_EQ(atom_n<typename T::TiledMmaQK>(), T::kBlockN);
  EXPECT_EQ(atom_n<typename T::TiledMmaPV>(), DV);
}

template <int D, int DV>
void check_bwd() {
  using T = flash3::BwdTraits<cutlass::bfloat16_t, D, DV, flash3::DefaultBwdConfig<D, DV, false>, flash3::MaskNone>;
  SCOPED_TRACE(testing::Message() << "backward d=" << D << " dv=" << DV);
  EXPECT_EQ(atom_n<typename T::TiledMmaS>(), T::kSdPAtomN);
  EXPECT_EQ(atom_n<typename T::TiledMmadP>(), T::kSdPAtomN);
  EXPECT_EQ(atom_n<typename T::TiledMmadV>(), T::kSplitHdim ? DV / T::kNumMmaWG : DV);
  EXPECT_EQ(atom_n<typename T::TiledMmadK>(), T::kSplitHdim ? D / T::kNumMmaWG : D);
  EXPECT_EQ(atom_n<typename T::TiledMmadQ>(), T::kdQSwapAB ? T::kBlockM : T::kdQCols);  // d = 96: 48-column halves
}

TEST(MmaAtoms, ForwardTilesUseFullWidthAtoms) {
  check_fwd<64, 64, false, false>();
  check_fwd<64, 64, true, false>();
  check_fwd<64, 64, true, true>();
  check_fwd<96, 96, false, false>();
  check_fwd<128, 128, false, false>();
  check_fwd<128, 128, true, false>();
  check_fwd<192, 192, false, false>();
  check_fwd<192, 128, true, false>();
  check_fwd<256, 256, false, false>();
  check_fwd<256, 256, true, true>();
}

// The extended widths themselves (d = 192's 112 keys is in the table; 176 and
// 80 are the widths measured against d = 128's and d = 256's tiles).
template <int kTileN>
struct WideTile {
  static constexpr flash3::FwdTileConfig value = {128, kTileN, 2, 2, true, false, true, 24, 240};
};

TEST(MmaAtoms, ExtendedForwardTileWidthsUseFullWidthAtoms) {
  using T176 = flash3::FwdTraits<cutlass::bfloat16_t, 128, 128, WideTile<176>, flash3::MaskNone>;
  using T112 = flash3::FwdTraits<cutlass::bfloat16_t, 192, 192, WideTile<112>, flash3::MaskNone>;
  using T80 = flash3::FwdTraits<cutlass::bfloat16_t, 256, 256, WideTile<80>, flash3::MaskCausal>;
  EXPECT_EQ(atom_n<typename T176::TiledMmaQK>(), 176);
  EXPECT_EQ(atom_n<typename T112::TiledMmaQK>(), 112);
  EXPECT_EQ(atom_n<typename T80::TiledMmaQK>(), 80);
  EXPECT_EQ(atom_n<typename T80::TiledMmaPV>(), 256);
}

TEST(MmaAtoms, BackwardTilesUseFullWidthAtoms) {
  flash3_test::for_each_head_dim_pair([](auto d, auto dv) { check_bwd<d(), dv()>(); });
}

}  // namespace
