// OnlineSoftmax::exp2_fma (the FMA-pipe exp2 of the FLASH3_D64_EXP2_EMU
// ablation): relative error within 1.1e-4 of exp2 on the whole range the
// softmax feeds it (x <= 0), and exactly 0 for masked scores (-inf) and for
// x = -127, so fully masked rows still sum to 0.
#include <gtest/gtest.h>

#include <cmath>

#include "fusion/softmax.h"

namespace {

TEST(SoftmaxExp2, FmaPipeExp2Accuracy) {
  using S = flash3::OnlineSoftmax<2>;
  double worst = 0.0;
  for (int i = 0; i <= 1260000; ++i) {
    const float x = -126.f * float(i) / 1260000.f;
    const double want = std::exp2(double(x));
    const double got = S::exp2_fma(x);
    worst = std::fmax(worst, std::fabs(got / want - 1.0));
  }
  EXPECT_LT(worst, 1.1e-4);
  EXPECT_GT(worst, 1e-6);  // it is an approximation: a test that compared exp2f with itself would pass at 0
  EXPECT_EQ(S::exp2_fma(-INFINITY), 0.f);
  EXPECT_EQ(S::exp2_fma(-127.f), 0.f);
  EXPECT_EQ(S::exp2_fma(-1000.f), 0.f);
  EXPECT_EQ(S::exp2_fma(0.f), 1.f);
  EXPECT_EQ(S::exp2_fma(-3.f), 0.125f);
}

}  // namespace
