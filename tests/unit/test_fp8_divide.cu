// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The FP8 quantizer's per-value arithmetic (quant/fp8_divide.h, host copy of
// the device code): the reciprocal-and-correction quotient equals IEEE
// division bit for bit wherever the quotient is a normal float, and gives the
// same e4m3 byte everywhere (normal, subnormal and huge descales, subnormal
// and signed-zero inputs); descale_of is amax / 448 correctly rounded; the
// amax's bits order as the floats and skip NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "quant/fp8_divide.h"
#include "reference/fp8_ref.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Checks y / descale against IEEE division; returns whether the quotients
// differed (allowed only below 2^-126, with the same e4m3 byte).
bool check(float y, float descale) {
  const float want = y / descale;
  const float got = flash3::divider(descale)(y);
  const bool same = std::memcmp(&want, &got, sizeof want) == 0 || (std::isnan(want) && std::isnan(got));
  if (!same) {
    EXPECT_LT(std::fabs(want), std::ldexp(1.f, -126)) << y << " / " << descale << ": got " << got << ", want " << want;
    EXPECT_EQ(flash3::ref::e4m3_bits(got), flash3::ref::e4m3_bits(want)) << y << " / " << descale;
  }
  return !same;
}

TEST(Fp8Divide, MatchesIeeeDivision) {
  std::mt19937_64 rng(1);
  int64_t differed = 0;
  for (int it = 0; it < 2000000; ++it) {
    // descale: any positive finite float (normal and subnormal exponents alike)
    const float descale = from_bits(uint32_t(rng() % 0x7f7fffffu) + 1u);
    // y: |y| <= 448 descale (what quantization divides), random mantissa and exponent
    const float lim = std::fmin(448.f * descale, std::numeric_limits<float>::max());
    const float frac = std::ldexp(float(rng() % (1u << 24)) / float(1u << 24), -int(rng() % 40));
    float y = lim * frac;
    if (rng() & 1) y = -y;
    differed += check(y, descale);
  }
  EXPECT_LT(differed, 20000);  // (quotients below 2^-126 only)
}

TEST(Fp8Divide, EdgeValues) {
  const float tiny = std::numeric_limits<float>::denorm_min(), fmin = std::numeric_limits<float>::min();
  const float fmax = std::numeric_limits<float>::max(), inf = std::numeric_limits<float>::infinity();
  for (float d : {tiny, 3 * tiny, fmin / 3, fmin, 1.f, 1.f + 0x1p-23f, 2.f - 0x1p-23f, 448.f, 1e30f, 0x1p127f, fmax})
    for (float y : {0.f, -0.f, tiny, -tiny, fmin, 1.f, -3.5f, 448.f, fmax, -fmax})
      if (std::fabs(y) <= 448.f * d || std::isinf(448.f * d)) check(y, d);
  // descale inf (an inf in the group): finite / inf = 0 with y's sign, inf / inf = NaN.
  EXPECT_EQ(std::signbit(flash3::divider(inf)(-2.f)), true);
  EXPECT_EQ(flash3::divider(inf)(2.f), 0.f);
  EXPECT_TRUE(std::isnan(flash3::divider(inf)(inf)));
  EXPECT_TRUE(std::isnan(flash3::divider(1.f)(std::nanf(""))));
  // -0 keeps its sign (e4m3 0x80).
  EXPECT_TRUE(std::signbit(flash3::divider(0.37f)(-0.f)));
}

TEST(Fp8Divide, DescaleAndAmaxBits) {
  std::mt19937_64 rng(2);
  for (int it = 0; it < 100000; ++it) {
    const float amax = from_bits(uint32_t(rng() % 0x7f800000u));  // every finite non-negative float
    const float want = amax > 0 ? amax / 448.f : 1.f;
    EXPECT_EQ(flash3::descale_of(flash3::amax_bits(amax)), want) << amax;
  }
  EXPECT_EQ(flash3::descale_of(0), 1.f);
  EXPECT_EQ(flash3::amax_bits(std::nanf("")), 0u);
  EXPECT_EQ(flash3::amax_bits(std::numeric_limits<float>::infinity()), 0x7f800000u);
  // Bits order as the floats (subnormals included).
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_LT(flash3::amax_bits(tiny), flash3::amax_bits(2 * tiny));
  EXPECT_LT(flash3::amax_bits(std::numeric_limits<float>::min() / 2), flash3::amax_bits(1e-30f));
}

}  // namespace
