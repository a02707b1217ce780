// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Tests of the FP8 CPU reference (src/reference/fp8_ref.h): e4m3 rounding
// against the format's 254 finite codes, the Hadamard rotation's
// orthogonality, the quantizer's descales and error bound, the plain FP8
// forward, and the seed 6.4 accuracy experiment at a small scale (block
// scales plus the Hadamard rotation against one scale per tensor, with
// outliers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/fp8_ref.h"

namespace {

namespace ref = flash3::ref;

bool is_nan_code(int bits) { return (bits & 0x7f) == 0x7f; }

std::vector<double> randn(size_t n, uint64_t seed, double outlier_rate = 0.0, double outlier_std = 0.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) {
    e = dist(gen);
    if (outlier_rate > 0 && u(gen) < outlier_rate) e += outlier_std * dist(gen);
  }
  return x;
}

double rmse(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / double(a.size()));
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  int finite = 0;
  for (int bits = 0; bits < 256; ++bits) {
    const double v = ref::e4m3_value(uint8_t(bits));
    if (is_nan_code(bits)) {
      EXPECT_TRUE(std::isnan(v)) << bits;
      continue;
    }
    ++finite;
    EXPECT_EQ(ref::round_e4m3(v), v) << bits;
    EXPECT_EQ(int(ref::e4m3_bits(v)), bits) << bits << " = " << v;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(ref::e4m3_value(0x7e), 448.0);
  EXPECT_EQ(ref::e4m3_value(0x01), std::ldexp(1.0, -9));  // smallest subnormal
  EXPECT_EQ(ref::e4m3_value(0x08), std::ldexp(1.0, -6));  // smallest normal
}

TEST(E4M3, MidpointsTieToEvenAndLargeValuesSaturate) {
  for (int bits = 0; bits < 0x7e; ++bits) {  // positive finite codes with a finite successor
    const double lo = ref::e4m3_value(uint8_t(bits)), hi = ref::e4m3_value(uint8_t(bits + 1));
    const double mid = 0.5 * (lo + hi);
    const double even = (bits % 2 == 0) ? lo : hi;  // the code's low bit is the mantissa's
    EXPECT_EQ(ref::round_e4m3(mid), even) << bits;
    EXPECT_EQ(ref::round_e4m3(-mid), -even) << bits;
    EXPECT_EQ(ref::round_e4m3(std::nextafter(mid, 0.0)), lo) << bits;
    EXPECT_EQ(ref::round_e4m3(std::nextafter(mid, 1e9)), hi) << bits;
  }
  EXPECT_EQ(ref::round_e4m3(460.0), 448.0);
  EXPECT_EQ(ref::round_e4m3(1e30), 448.0);
  EXPECT_EQ(ref::round_e4m3(-1e30), -448.0);
  EXPECT_TRUE(std::isnan(ref::round_e4m3(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_EQ(int(ref::e4m3_bits(std::numeric_limits<double>::quiet_NaN())), 0x7f);
  EXPECT_EQ(ref::round_e4m3(std::ldexp(1.0, -11)), 0.0);
}

TEST(Hadamard, RotationIsOrthogonalAndKeepsScores) {
  for (int d : {2, 64, 128, 256}) {
    const int n = 6;
    const auto q = randn(size_t(n) * d, 1 + d), k = randn(size_t(n) * d, 2 + d);
    const auto signs = ref::hadamard_signs(d, 42);
    std::vector<double> qr(q.size()), kr(k.size());
    ref::hadamard_rows(q.data(), qr.data(), n, d, signs);
    ref::hadamard_rows(k.data(), kr.data(), n, d, signs);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        double s = 0, sr = 0;
        for (int c = 0; c < d; ++c) {
          s += q[size_t(i * d + c)] * k[size_t(j * d + c)];
          sr += qr[size_t(i * d + c)] * kr[size_t(j * d + c)];
        }
        EXPECT_NEAR(sr, s, 1e-11 * d) << "d=" << d << " i=" << i << " j=" << j;
      }
    }
    // Rotating with other signs changes the rows but not their norms.
    const auto other = ref::hadamard_signs(d, 43);
    std::vector<double> q2(q.size());
    ref::hadamard_rows(q.data(), q2.data(), n, d, other);
    double n0 = 0, n2 = 0;
    for (int c = 0; c < d; ++c) {
      n0 += q[size_t(c)] * q[size_t(c)];
      n2 += q2[size_t(c)] * q2[size_t(c)];
    }
    EXPECT_NEAR(n2, n0, 1e-11 * d);
  }
  // d = 2 by hand: (1, 0) H / sqrt 2 = (1, 1) / sqrt 2, then D.
  const double x[2] = {1.0, 0.0};
  double y[2];
  ref::hadamard_rows(x, y, 1, 2, {1, -1});
  EXPECT_DOUBLE_EQ(y[0], std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(y[1], -std::sqrt(0.5));
  // Rows are independent and the rotation may work in place.
  std::vector<double> z = {3.0, 4.0, 1.0, -1.0};
  ref::hadamard_rows(z.data(), z.data(), 2, 2, {1, 1});
  EXPECT_DOUBLE_EQ(z[0], 7.0 * std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(z[1], -1.0 * std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(z[2], 0.0);
  EXPECT_DOUBLE_EQ(z[3], 2.0 * std::sqrt(0.5));
}

TEST(Hadamard, SignsAreSeededAndRejectsOtherSizes) {
  const auto a = ref::hadamard_signs(128, 7), b = ref::hadamard_signs(128, 7), c = ref::hadamard_signs(128, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int minus = 0;
  for (int8_t s : a) {
    EXPECT_TRUE(s == 1 || s == -1);
    minus += s < 0;
  }
  EXPECT_GT(minus, 32);  // a fair coin: 64 +- 8 expected
  EXPECT_LT(minus, 96);
  double x[96] = {}, y[96];
  EXPECT_THROW(ref::hadamard_rows(x, y, 1, 96, ref::hadamard_signs(96, 1)), std::invalid_argument);
  EXPECT_THROW(ref::hadamard_rows(x, y, 1, 64, ref::hadamard_signs(32, 1)), std::invalid_argument);
}

TEST(Fp8Quantize, DescalesCoverTheirElementsAndBoundTheError) {
  const int batch = 2, seqlen = 70, heads = 4, d = 32;
  auto x = randn(size_t(batch) * seqlen * heads * d, 5, 1e-2, 10.0);
  x[3] = 0.0;
  struct Case {
    ref::Fp8Scaling s;
    int heads_per_scale, block_rows;
    size_t scales;
  };
  const Case cases[] = {{ref::Fp8Scaling::kPerTensor, 1, 0, 1},
                        {ref::Fp8Scaling::kPerHead, 2, 0, size_t(batch) * 2},
                        {ref::Fp8Scaling::kPerBlock, 1, 32, size_t(batch) * heads * 3}};
  for (const Case& c : cases) {
    const ref::Fp8Tensor t = ref::quantize_e4m3(x.data(), batch, seqlen, heads, d, c.s, c.heads_per_scale, c.block_rows);
    ASSERT_EQ(t.descale.size(), c.scales);
    std::vector<double> amax(c.scales, 0.0);
    for (int b = 0; b < batch; ++b)
      for (int r = 0; r < seqlen; ++r)
        for (int h = 0; h < heads; ++h)
          for (int e = 0; e < d; ++e) {
            const size_t i = size_t(((b * seqlen + r) * heads + h) * d + e);
            const int64_t s = t.scale_index(b, r, h);
            ASSERT_GE(s, 0);
            ASSERT_LT(size_t(s), c.scales);
            amax[size_t(s)] = std::max(amax[size_t(s)], std::fabs(x[i]));
            const double scaled = x[i] / t.descale[size_t(s)];
            EXPECT_EQ(t.x8[i], ref::round_e4m3(scaled));
            EXPECT_LE(std::fabs(scaled), ref::kE4M3Max * (1 + 1e-15));
            // Half a step of e4m3: 2^-4 relative for normals, 2^-10 absolute below 2^-6.
            EXPECT_LE(std::fabs(t.x8[i] - scaled), std::max(std::fabs(scaled) / 16.0, std::ldexp(1.0, -10)));
            EXPECT_DOUBLE_EQ(t.value(b, r, h, e), t.x8[i] * t.descale[size_t(s)]);
          }
    for (size_t s = 0; s < c.scales; ++s) EXPECT_DOUBLE_EQ(t.descale[s] * ref::kE4M3Max, amax[s]);
  }
  EXPECT_THROW(ref::quantize_e4m3(x.data(), batch, seqlen, heads, d, ref::Fp8Scaling::kPerHead, 3),
               std::invalid_argument);
  EXPECT_THROW(ref::quantize_e4m3(x.data(), batch, seqlen, heads, d, ref::Fp8Scaling::kPerBlock, 1, 0),
               std::invalid_argument);
  const std::vector<double> zeros(size_t(d), 0.0);
  const ref::Fp8Tensor z = ref::quantize_e4m3(zeros.data(), 1, 1, 1, d, ref::Fp8Scaling::kPerTensor);
  EXPECT_EQ(z.descale[0], 1.0);
}

// The plain FP8 forward against the float64 reference on the dequantized
// inputs: close, masked rows empty, GQA heads reading their KV head.
TEST(Fp8Plain, MatchesTheReferenceOnDequantizedInputs) {
  ref::Problem p;
  p.batch = 2;
  p.seqlen_q = 40;
  p.seqlen_k = 24;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 64;
  ref::Options o;
  o.causal = true;  // seqlen_q > seqlen_k: the first 16 query rows see no key
  const auto q = randn(p.q_elems(), 11), k = randn(p.k_elems(), 12), v = randn(p.v_elems(), 13);
  const auto q8 = ref::quantize_e4m3(q.data(), p.batch, p.seqlen_q, p.heads_q, p.head_dim, ref::Fp8Scaling::kPerHead,
                                     p.heads_q / p.heads_kv);
  const auto k8 = ref::quantize_e4m3(k.data(), p.batch, p.seqlen_k, p.heads_kv, p.head_dim,
                                     ref::Fp8Scaling::kPerBlock, 1, 16);
  const auto v8 = ref::quantize_e4m3(v.data(), p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v,
                                     ref::Fp8Scaling::kPerBlock, 1, 16);
  std::vector<double> out(p.o_elems(), -7.0), lse(p.lse_elems(), -7.0), ro(p.o_elems()), rl(p.lse_elems());
  ref::forward_fp8_plain(p, o, q8, k8, v8, out.data(), lse.data());
  const auto qd = q8.dequantized(), kd = k8.dequantized(), vd = v8.dequantized();
  ref::forward(p, o, qd.data(), kd.data(), vd.data(), ro.data(), rl.data());
  double err = 0, lse_err = 0;
  int empty = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i]));
    err = std::max(err, std::fabs(out[i] - ro[i]));
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(rl[i])) {
      EXPECT_EQ(lse[i], rl[i]);
      ++empty;
    } else {
      lse_err = std::max(lse_err, std::fabs(lse[i] - rl[i]));
    }
  }
  EXPECT_EQ(empty, p.batch * p.heads_q * (p.seqlen_q - p.seqlen_k));
  // P rounded to e4m3 (relative step 2^-3) dominates: O is a convex mix of
  // values of size ~1 with weights off by <= 6.25% each.
  EXPECT_LT(err, 0.15);
  EXPECT_GT(err, 1e-4);  // the rounding of P is really there
  EXPECT_LT(lse_err, 1e-4);  // the LSE uses the fp32 P
}

// Seed 6.4's experiment at a small scale: Q, K, V ~ N(0, 1) plus N(0, 100)
// outliers at rate 1e-3, O's RMSE against float64 attention on the original
// inputs. Measured here: per tensor 7.8e-3, block scales 7.3e-3, block +
// Hadamard 4.5e-3, bf16 6.6e-4 (at 64 x 8192 keys: 1.17e-2, 1.42e-2, 9.2e-3,
// 2.2e-3). Block scales alone barely help (e4m3 keeps 3 mantissa bits at any
// scale); the rotation, which spreads each outlier over all d coordinates,
// does: 1.3-1.8x, less than the paper's 2.6x (2.4e-2 -> 9.1e-3), whose
// per-tensor baseline is twice this one's error. The margins below keep the
// ordering, not the exact figures.
TEST(Fp8Accuracy, BlockScalesAndHadamardBeatOneScalePerTensor) {
  ref::Problem p;
  p.batch = 1;
  p.seqlen_q = 128;
  p.seqlen_k = 2048;
  p.heads_q = p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 128;
  const ref::Options o;
  const auto q = randn(p.q_elems(), 21, 1e-3, 10.0), k = randn(p.k_elems(), 22, 1e-3, 10.0),
             v = randn(p.v_elems(), 23, 1e-3, 10.0);
  std::vector<double> exact(p.o_elems()), lse(p.lse_elems()), out(p.o_elems());
  ref::forward(p, o, q.data(), k.data(), v.data(), exact.data(), lse.data());

  auto fp8_rmse = [&](ref::Fp8Scaling s, bool rotate) {
    std::vector<double> qr = q, kr = k;
    if (rotate) {
      const auto signs = ref::hadamard_signs(p.head_dim, 1234);
      ref::hadamard_rows(q.data(), qr.data(), int64_t(p.q_elems() / size_t(p.head_dim)), p.head_dim, signs);
      ref::hadamard_rows(k.data(), kr.data(), int64_t(p.k_elems() / size_t(p.head_dim)), p.head_dim, signs);
    }
    const int bm = s == ref::Fp8Scaling::kPerBlock ? 128 : 0, bn = s == ref::Fp8Scaling::kPerBlock ? 224 : 0;
    const auto q8 = ref::quantize_e4m3(qr.data(), p.batch, p.seqlen_q, p.heads_q, p.head_dim, s, 1, bm);
    const auto k8 = ref::quantize_e4m3(kr.data(), p.batch, p.seqlen_k, p.heads_kv, p.head_dim, s, 1, bn);
    const auto v8 = ref::quantize_e4m3(v.data(), p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v, s, 1, bn);
    ref::forward_fp8_plain(p, o, q8, k8, v8, out.data(), nullptr);
    return rmse(out, exact);
  };
  const double per_tensor = fp8_rmse(ref::Fp8Scaling::kPerTensor, false);
  const double block = fp8_rmse(ref::Fp8Scaling::kPerBlock, false);
  const double block_hadamard = fp8_rmse(ref::Fp8Scaling::kPerBlock, true);
  std::vector<double> qb(q.size()), kb(k.size()), vb(v.size());
  for (size_t i = 0; i < q.size(); ++i) qb[i] = ref::round_bf16(q[i]);
  for (size_t i = 0; i < k.size(); ++i) kb[i] = ref::round_bf16(k[i]);
  for (size_t i = 0; i < v.size(); ++i) vb[i] = ref::round_bf16(v[i]);
  ref::forward_lowp(ref::LowPrecision::kBFloat16, p, o, qb.data(), kb.data(), vb.data(), out.data(), nullptr);
  const double bf16 = rmse(out, exact);
  RecordProperty("rmse_fp8_per_tensor", std::to_string(per_tensor));
  RecordProperty("rmse_fp8_block", std::to_string(block));
  RecordProperty("rmse_fp8_block_hadamard", std::to_string(block_hadamard));
  RecordProperty("rmse_bf16", std::to_string(bf16));
  std::printf("RMSE of O: fp8 per tensor %.3g, fp8 block %.3g, fp8 block + Hadamard %.3g, bf16 %.3g\n", per_tensor,
              block, block_hadamard, bf16);
  EXPECT_LE(block_hadamard * 1.4, per_tensor);
  EXPECT_LE(block_hadamard * 1.4, block);
  EXPECT_LT(bf16 * 4, block_hadamard);
}

}  // namespace
