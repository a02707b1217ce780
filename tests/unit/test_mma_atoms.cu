// Every tiled WGMMA in the tile tables must use one full-width atom per
// warpgroup: CuTe's GMMA selectors silently fall back to narrow m64n16 atoms
// for N = 80, 144, 176, 48, ... unless CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is
// defined (it is not in this build), which is what made tile_n 144 / 176 run
// at ~500 instead of ~700 TFLOP/s (docs/performance.md, tile-width ablation).
#include <gtest/gtest.h>

#include "bwd/kernel_traits.h"
#include "fwd/kernel_traits.h"

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
  if (T::kdQCols % 32 == 0) {
    EXPECT_EQ(atom_n<typename T::TiledMmadQ>(), T::kdQCols);
  } else {
    // Known: d = 96 splits dQ into 48-column halves, which run on n16 atoms
    // until the extended shapes are enabled (and measured).
    EXPECT_EQ(atom_n<typename T::TiledMmadQ>(), 16);
  }
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

TEST(MmaAtoms, BackwardTilesUseFullWidthAtoms) {
  check_bwd<64, 64>();
  check_bwd<96, 96>();
  check_bwd<128, 128>();
  check_bwd<192, 192>();
  check_bwd<192, 128>();
  check_bwd<256, 256>();
}

}  // namespace
