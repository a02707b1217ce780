// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Tests of the float64 CPU attention reference (src/reference/reference.h):
// forward against an independent naive formula, backward against central finite
// differences, varlen / GQA equivalences, rounding, the low-precision baseline and
// the tolerance rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "reference/reference.h"

namespace {

using flash3::ref::LowPrecision;
using flash3::ref::Options;
using flash3::ref::Problem;
namespace ref = flash3::ref;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> randn(size_t n, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> x(n);
  for (auto& e : x) {
    do e = dist(gen);
    while (e == 0.0);
  }
  return x;
}

Problem fixed(int b, int sq, int sk, int hq, int hkv, int d, int dv) {
  Problem p;
  p.batch = b;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.head_dim_v = dv;
  return p;
}

Options opts(bool causal = false, int wl = -1, int wr = -1, double softcap = 0.0,
             double scale = std::numeric_limits<double>::quiet_NaN()) {
  Options o;
  o.causal = causal;
  o.window_left = wl;
  o.window_right = wr;
  o.softcap = softcap;
  o.softmax_scale = scale;
  return o;
}

struct Data {
  std::vector<double> q, k, v;
};
Data make_data(const Problem& p, uint64_t seed) {
  return {randn(p.q_elems(), seed), randn(p.k_elems(), seed + 1), randn(p.v_elems(), seed + 2)};
}

// ---------------------------------------------------------------------------
// Naive fixed-length attention: whole score matrix, mask by explicit loops,
// explicit softmax. Independent of the library's indexing helpers.
// ---------------------------------------------------------------------------
bool naive_visible(const Options& o, int i, int j, int sq, int sk) {
  // Offset of key j from the key aligned with query i (bottom-right alignment).
  const long off = long(j) - (long(i) + long(sk) - long(sq));
  bool ok = true;
  if (o.causal && off > 0) ok = false;
  if (!o.causal && o.window_right >= 0 && off > o.window_right) ok = false;
  if (o.window_left >= 0 && -off > o.window_left) ok = false;
  return ok;
}

struct NaiveOut {
  std::vector<double> out, lse;  // same layouts as the reference (fixed length)
  std::vector<double> dq, dk, dv;
};

NaiveOut naive(const Problem& p, const Options& o, const Data& x, const std::vector<double>* dout = nullptr,
               const std::vector<double>* dlse = nullptr) {
  const int B = p.batch, SQ = p.seqlen_q, SK = p.seqlen_k, HQ = p.heads_q, HK = p.heads_kv, D = p.head_dim,
            DV = p.head_dim_v;
  const double scale = std::isnan(o.softmax_scale) ? 1.0 / std::sqrt(double(D)) : o.softmax_scale;
  auto Q = [&](int b, int i, int h, int c) { return x.q[((size_t(b) * SQ + i) * HQ + h) * D + c]; };
  auto K = [&](int b, int j, int h, int c) { return x.k[((size_t(b) * SK + j) * HK + h) * D + c]; };
  auto V = [&](int b, int j, int h, int c) { return x.v[((size_t(b) * SK + j) * HK + h) * DV + c]; };
  auto oidx = [&](int b, int i, int h, int c) { return ((size_t(b) * SQ + i) * HQ + h) * DV + c; };
  NaiveOut r;
  r.out.assign(size_t(B) * SQ * HQ * DV, 0.0);
  r.lse.assign(size_t(B) * HQ * SQ, 0.0);
  r.dq.assign(x.q.size(), 0.0);
  r.dk.assign(x.k.size(), 0.0);
  r.dv.assign(x.v.size(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HQ; ++h) {
      const int kh = h / (HQ / HK);
      std::vector<std::vector<double>> S(SQ, std::vector<double>(SK)), Th(SQ, std::vector<double>(SK)),
          P(SQ, std::vector<double>(SK, 0.0));
      std::vector<std::vector<bool>> M(SQ, std::vector<bool>(SK));
      for (int i = 0; i < SQ; ++i)
        for (int j = 0; j < SK; ++j) {
          double s = 0;
          for (int c = 0; c < D; ++c) s += Q(b, i, h, c) * K(b, j, kh, c);
          s *= scale;
          if (o.softcap > 0) {
            Th[i][j] = std::tanh(s / o.softcap);
            s = o.softcap * Th[i][j];
          }
          S[i][j] = s;
          M[i][j] = naive_visible(o, i, j, SQ, SK);
        }
      std::vector<bool> empty(SQ, true);
      for (int i = 0; i < SQ; ++i) {
        double sum = 0;
        for (int j = 0; j < SK; ++j)
          if (M[i][j]) {
            sum += std::exp(S[i][j]);  // scores are small: no max subtraction needed
            empty[i] = false;
          }
        r.lse[(size_t(b) * HQ + h) * SQ + i] = empty[i] ? -kInf : std::log(sum);
        for (int j = 0; j < SK; ++j) P[i][j] = M[i][j] ? std::exp(S[i][j]) / sum : 0.0;
        for (int c = 0; c < DV; ++c) {
          double a = 0;
          for (int j = 0; j < SK; ++j) a += P[i][j] * V(b, j, kh, c);
          r.out[oidx(b, i, h, c)] = a;
        }
      }
      if (!dout) continue;
      // Matrix-form backward.
      for (int i = 0; i < SQ; ++i) {
        if (empty[i]) continue;
        std::vector<double> dP(SK);
        double Di = 0;
        for (int j = 0; j < SK; ++j) {
          double a = 0;
          for (int c = 0; c < DV; ++c) a += (*dout)[oidx(b, i, h, c)] * V(b, j, kh, c);
          dP[j] = a;
          Di += P[i][j] * a;
        }
        const double gl = dlse ? (*dlse)[(size_t(b) * HQ + h) * SQ + i] : 0.0;
        for (int j = 0; j < SK; ++j) {
          if (!M[i][j]) continue;
          double dS = P[i][j] * (dP[j] - Di) + gl * P[i][j];
          if (o.softcap > 0) dS *= 1 - Th[i][j] * Th[i][j];
          for (int c = 0; c < D; ++c) {
            r.dq[((size_t(b) * SQ + i) * HQ + h) * D + c] += scale * dS * K(b, j, kh, c);
            r.dk[((size_t(b) * SK + j) * HK + kh) * D + c] += scale * dS * Q(b, i, h, c);
          }
          for (int c = 0; c < DV; ++c)
            r.dv[((size_t(b) * SK + j) * HK + kh) * DV + c] += P[i][j] * (*dout)[oidx(b, i, h, c)];
        }
      }
    }
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return kInf;
      continue;
    }
    const double d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = d;  // also propagates NaN
  }
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

struct RefOut {
  std::vector<double> out, lse;
};
RefOut run_fwd(const Problem& p, const Options& o, const Data& x) {
  RefOut r{std::vector<double>(p.o_elems(), 123.0), std::vector<double>(p.lse_elems(), 123.0)};
  ref::forward(p, o, x.q.data(), x.k.data(), x.v.data(), r.out.data(), r.lse.data());
  return r;
}

// Forward vs naive: O and LSE within 1e-12 and identical masked (-inf) positions.
void expect_forward_matches_naive(const Problem& p, const Options& o, uint64_t seed) {
  const Data x = make_data(p, seed);
  const RefOut r = run_fwd(p, o, x);
  const NaiveOut n = naive(p, o, x);
  EXPECT_LT(max_abs_diff(r.out, n.out), 1e-12);
  EXPECT_LT(max_abs_diff(r.lse, n.lse), 1e-12);
  EXPECT_GT(max_abs(r.out), 1e-2);  // non-trivial output
}

// ---------------------------------------------------------------------------
// Finite differences of L = sum(O * W) + sum_{finite lse}(LSE * w).
// ---------------------------------------------------------------------------
void expect_grads_match_fd(const Problem& p, const Options& o, bool use_dlse, uint64_t seed) {
  Data x = make_data(p, seed);
  const std::vector<double> W = randn(p.o_elems(), seed + 10);
  const std::vector<double> w = randn(p.lse_elems(), seed + 11);
  std::vector<double> out(p.o_elems()), lse(p.lse_elems());
  auto loss = [&](const Data& in) {
    ref::forward(p, o, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
    double L = 0;
    for (size_t i = 0; i < out.size(); ++i) L += out[i] * W[i];
    if (use_dlse)
      for (size_t i = 0; i < lse.size(); ++i)
        if (std::isfinite(lse[i])) L += lse[i] * w[i];
    return L;
  };
  std::vector<double> dq(p.q_elems(), 7.0), dk(p.k_elems(), 7.0), dv(p.v_elems(), 7.0);
  ref::backward(p, o, x.q.data(), x.k.data(), x.v.data(), W.data(), use_dlse ? w.data() : nullptr, dq.data(),
                dk.data(), dv.data());
  const double h = 1e-5;
  auto check = [&](std::vector<double>& t, const std::vector<double>& g, const char* name) {
    double worst = 0, gmax = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const double saved = t[i];
      t[i] = saved + h;
      const double lp = loss(x);
      t[i] = saved - h;
      const double lm = loss(x);
      t[i] = saved;
      const double fd = (lp - lm) / (2 * h);
      worst = std::max(worst, std::fabs(fd - g[i]));
      gmax = std::max(gmax, std::fabs(g[i]));
    }
    EXPECT_LT(worst, 1e-6 * (1 + gmax)) << name;
    EXPECT_GT(gmax, 1e-3) << name << " gradient is trivially zero";
  };
  check(x.q, dq, "dq");
  check(x.k, dk, "dk");
  check(x.v, dv, "dv");
}

// ---------------------------------------------------------------------------
// Masks.
// ---------------------------------------------------------------------------
std::set<int> visible_set(const Options& o, int i, int sq, int sk) {
  std::set<int> s;
  for (int j = -2; j < sk + 2; ++j)
    if (ref::visible(o, i, j, sq, sk)) s.insert(j);
  return s;
}

TEST(ReferenceMask, CausalBottomRightVisibleSets) {
  const Options c = opts(true);
  // sq > sk: diagonal at j = i - 2; rows 0 and 1 see nothing.
  EXPECT_EQ(visible_set(c, 0, 5, 3), (std::set<int>{}));
  EXPECT_EQ(visible_set(c, 1, 5, 3), (std::set<int>{}));
  EXPECT_EQ(visible_set(c, 2, 5, 3), (std::set<int>{0}));
  EXPECT_EQ(visible_set(c, 3, 5, 3), (std::set<int>{0, 1}));
  EXPECT_EQ(visible_set(c, 4, 5, 3), (std::set<int>{0, 1, 2}));
  // sq < sk: diagonal at j = i + 3.
  EXPECT_EQ(visible_set(c, 0, 2, 5), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(visible_set(c, 1, 2, 5), (std::set<int>{0, 1, 2, 3, 4}));
  // sq == sk: lower triangle.
  EXPECT_EQ(visible_set(c, 0, 3, 3), (std::set<int>{0}));
  EXPECT_EQ(visible_set(c, 2, 3, 3), (std::set<int>{0, 1, 2}));
}

TEST(ReferenceMask, WindowVisibleSets) {
  EXPECT_EQ(visible_set(opts(false, 1, 1), 0, 4, 4), (std::set<int>{0, 1}));
  EXPECT_EQ(visible_set(opts(false, 1, 1), 2, 4, 4), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(visible_set(opts(false, 0, 0), 1, 3, 6), (std::set<int>{4}));
  EXPECT_EQ(visible_set(opts(false, 2, -1), 0, 3, 6), (std::set<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(visible_set(opts(false, -1, 1), 0, 3, 6), (std::set<int>{0, 1, 2, 3, 4}));
  // causal + window_left: window_right forced to 0.
  EXPECT_EQ(visible_set(opts(true, 2, -1), 3, 4, 4), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(visible_set(opts(true, 2, 5), 3, 4, 4), (std::set<int>{1, 2, 3}));
  // Window entirely outside the keys: fully masked row.
  EXPECT_EQ(visible_set(opts(false, 1, 0), 1, 6, 3), (std::set<int>{}));
  EXPECT_EQ(visible_set(opts(false, 1, 0), 3, 6, 3), (std::set<int>{0}));
}

TEST(ReferenceMask, HugeWindowsCutNothing) {
  const int big = std::numeric_limits<int>::max();
  for (int i : {0, 5, 2047})
    for (int j : {0, 7, 511}) {
      EXPECT_TRUE(ref::visible(opts(false, -1, big), i, j, 2048, 512));
      EXPECT_TRUE(ref::visible(opts(false, big, -1), i, j, 2048, 512));
      // (big, 0) is the causal mask.
      EXPECT_EQ(ref::visible(opts(false, big, 0), i, j, 2048, 512), ref::visible(opts(true), i, j, 2048, 512));
    }
}

// ---------------------------------------------------------------------------
// Forward vs naive.
// ---------------------------------------------------------------------------
TEST(ReferenceForward, Plain) { expect_forward_matches_naive(fixed(1, 9, 11, 2, 2, 16, 16), opts(), 100); }

TEST(ReferenceForward, CausalSqEqualSk) {
  expect_forward_matches_naive(fixed(1, 12, 12, 2, 2, 8, 8), opts(true), 110);
}

TEST(ReferenceForward, CausalSqLessSk) { expect_forward_matches_naive(fixed(1, 5, 13, 2, 2, 8, 8), opts(true), 120); }

TEST(ReferenceForward, CausalSqGreaterSkHasMaskedRows) {
  const Problem p = fixed(1, 10, 4, 2, 2, 8, 8);
  const Options o = opts(true);
  expect_forward_matches_naive(p, o, 130);
  const Data x = make_data(p, 130);
  const RefOut r = run_fwd(p, o, x);
  // Rows 0..5 see nothing (diagonal at j = i - 6), row 6 sees exactly key 0.
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 10; ++i) {
      const double l = r.lse[ref::lse_index(p, 0, h, i)];
      if (i < 6) {
        EXPECT_EQ(l, -kInf) << i;
        for (int c = 0; c < 8; ++c) EXPECT_EQ(r.out[(size_t(i) * 2 + h) * 8 + c], 0.0);
      } else {
        EXPECT_TRUE(std::isfinite(l)) << i;
      }
    }
    // Row 6: single visible key -> O = V[0], LSE = score(0).
    for (int c = 0; c < 8; ++c) EXPECT_NEAR(r.out[(size_t(6) * 2 + h) * 8 + c], x.v[size_t(h) * 8 + c], 1e-14);
    double s = 0;
    for (int c = 0; c < 8; ++c) s += x.q[(size_t(6) * 2 + h) * 8 + c] * x.k[size_t(h) * 8 + c];
    EXPECT_NEAR(r.lse[ref::lse_index(p, 0, h, 6)], s / std::sqrt(8.0), 1e-13);
  }
}

TEST(ReferenceForward, WindowVariants) {
  struct W {
    bool causal;
    int wl, wr, sq, sk;
  };
  const W cases[] = {{false, 2, 1, 9, 9},  {false, 0, 0, 7, 7},  {false, 3, -1, 6, 11}, {false, -1, 2, 11, 6},
                     {true, 2, -1, 8, 8},  {false, 1, 3, 5, 12}, {false, 4, 0, 12, 5},  {true, 0, -1, 6, 9}};
  uint64_t seed = 140;
  for (const W& c : cases) {
    SCOPED_TRACE(testing::Message() << "causal=" << c.causal << " wl=" << c.wl << " wr=" << c.wr << " sq=" << c.sq
                                    << " sk=" << c.sk);
    expect_forward_matches_naive(fixed(1, c.sq, c.sk, 2, 1, 8, 8), opts(c.causal, c.wl, c.wr), seed++);
  }
}

TEST(ReferenceForward, Softcap) {
  // Large scale so that the cap is active (scores well beyond the cap).
  const Problem p = fixed(1, 8, 10, 2, 2, 16, 16);
  expect_forward_matches_naive(p, opts(false, -1, -1, 2.0, 1.0), 150);
  expect_forward_matches_naive(p, opts(true, -1, -1, 5.0), 151);
  // The cap changes the result.
  const Data x = make_data(p, 150);
  EXPECT_GT(max_abs_diff(run_fwd(p, opts(false, -1, -1, 2.0, 1.0), x).out, run_fwd(p, opts(false, -1, -1, 0.0, 1.0), x).out),
            1e-2);
}

TEST(ReferenceForward, Gqa4to1) { expect_forward_matches_naive(fixed(1, 7, 9, 8, 2, 8, 8), opts(true), 160); }

TEST(ReferenceForward, Mqa) { expect_forward_matches_naive(fixed(1, 7, 9, 4, 1, 8, 8), opts(), 170); }

TEST(ReferenceForward, BatchGreaterThanOne) {
  expect_forward_matches_naive(fixed(3, 6, 8, 2, 2, 8, 8), opts(), 180);
  expect_forward_matches_naive(fixed(3, 8, 6, 4, 2, 8, 8), opts(true, 3, -1), 181);
}

TEST(ReferenceForward, HeadDimVDiffersFromHeadDim) {
  expect_forward_matches_naive(fixed(2, 6, 7, 2, 1, 12, 5), opts(true), 190);
  expect_forward_matches_naive(fixed(1, 6, 7, 2, 2, 4, 20), opts(), 191);
}

TEST(ReferenceForward, ExplicitSoftmaxScale) {
  const Problem p = fixed(1, 6, 7, 2, 2, 8, 8);
  expect_forward_matches_naive(p, opts(false, -1, -1, 0.0, 0.9), 200);
  // Default scale is 1/sqrt(d): the explicit value reproduces it exactly.
  const Data x = make_data(p, 200);
  EXPECT_EQ(max_abs_diff(run_fwd(p, opts(), x).out, run_fwd(p, opts(false, -1, -1, 0.0, 1.0 / std::sqrt(8.0)), x).out),
            0.0);
}

// Exercises the multi-threaded path (work above the serial threshold).
TEST(ReferenceForward, LargerShapeThreaded) {
  expect_forward_matches_naive(fixed(2, 96, 160, 4, 2, 32, 32), opts(true, 40, -1, 4.0), 210);
}

// ---------------------------------------------------------------------------
// LSE and edge cases.
// ---------------------------------------------------------------------------
TEST(ReferenceLse, EqualsLogSumExpOfScores) {
  const Problem p = fixed(2, 5, 6, 3, 3, 8, 8);
  const Data x = make_data(p, 300);
  const RefOut r = run_fwd(p, opts(), x);
  const double scale = 1.0 / std::sqrt(8.0);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 3; ++h)
      for (int i = 0; i < 5; ++i) {
        double sum = 0;
        for (int j = 0; j < 6; ++j) {
          double s = 0;
          for (int c = 0; c < 8; ++c)
            s += x.q[((size_t(b) * 5 + i) * 3 + h) * 8 + c] * x.k[((size_t(b) * 6 + j) * 3 + h) * 8 + c];
          sum += std::exp(s * scale);
        }
        // Layout (b, h, sq).
        EXPECT_NEAR(r.lse[(size_t(b) * 3 + h) * 5 + i], std::log(sum), 1e-13);
      }
}

TEST(ReferenceLse, FullyMaskedRowsByWindow) {
  // sq=6, sk=3, window (1, 0): rows 0..2 see nothing, row 3 sees {0}.
  const Problem p = fixed(1, 6, 3, 1, 1, 4, 4);
  const Options o = opts(false, 1, 0);
  const Data x = make_data(p, 310);
  const RefOut r = run_fwd(p, o, x);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.lse[i], -kInf);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(r.out[size_t(i) * 4 + c], 0.0);
  }
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isfinite(r.lse[i]));
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(r.out[3 * 4 + c], x.v[c], 1e-14);
  // No gradient flows from masked rows.
  std::vector<double> dout = randn(p.o_elems(), 311), dlse = randn(p.lse_elems(), 312);
  std::vector<double> dq(p.q_elems(), 9.0), dk(p.k_elems()), dv(p.v_elems());
  ref::backward(p, o, x.q.data(), x.k.data(), x.v.data(), dout.data(), dlse.data(), dq.data(), dk.data(), dv.data());
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(dq[size_t(i) * 4 + c], 0.0);
}

TEST(ReferenceLse, SeqlenKZero) {
  const Problem p = fixed(2, 4, 0, 2, 1, 8, 8);
  const Data x = make_data(p, 320);
  EXPECT_TRUE(x.k.empty());
  for (bool causal : {false, true}) {
    const RefOut r = run_fwd(p, opts(causal), x);
    for (double o : r.out) EXPECT_EQ(o, 0.0);
    for (double l : r.lse) EXPECT_EQ(l, -kInf);
    std::vector<double> dout = randn(p.o_elems(), 321), dq(p.q_elems(), 5.0);
    ref::backward(p, opts(causal), x.q.data(), x.k.data(), x.v.data(), dout.data(), nullptr, dq.data(), nullptr,
                  nullptr);
    for (double g : dq) EXPECT_EQ(g, 0.0);
  }
}

TEST(ReferenceLse, SeqlenQZero) {
  const Problem p = fixed(2, 0, 5, 2, 2, 8, 8);
  const Data x = make_data(p, 330);
  EXPECT_EQ(p.o_elems(), 0u);
  std::vector<double> out(1, 42.0), lse(1, 42.0);
  ref::forward(p, opts(true), x.q.data(), x.k.data(), x.v.data(), out.data(), lse.data());
  EXPECT_EQ(out[0], 42.0);  // nothing written
  std::vector<double> dk(p.k_elems(), 3.0), dv(p.v_elems(), 3.0), dq(1);
  ref::backward(p, opts(true), x.q.data(), x.k.data(), x.v.data(), nullptr, nullptr, dq.data(), dk.data(), dv.data());
  for (double g : dk) EXPECT_EQ(g, 0.0);
  for (double g : dv) EXPECT_EQ(g, 0.0);
}

// ---------------------------------------------------------------------------
// Backward vs finite differences.
// ---------------------------------------------------------------------------
TEST(ReferenceBackward, PlainFiniteDifferences) {
  expect_grads_match_fd(fixed(1, 5, 6, 2, 2, 4, 4), opts(), false, 400);
}

TEST(ReferenceBackward, CausalSqNotEqualSkFiniteDifferences) {
  expect_grads_match_fd(fixed(1, 4, 7, 2, 2, 4, 4), opts(true), false, 410);
  expect_grads_match_fd(fixed(1, 7, 4, 2, 2, 4, 4), opts(true), false, 411);  // rows 0..2 masked
}

TEST(ReferenceBackward, WindowFiniteDifferences) {
  expect_grads_match_fd(fixed(1, 6, 6, 1, 1, 4, 4), opts(false, 1, 2), false, 420);
  expect_grads_match_fd(fixed(1, 5, 8, 1, 1, 4, 3), opts(true, 2, -1), false, 421);
}

TEST(ReferenceBackward, SoftcapFiniteDifferences) {
  expect_grads_match_fd(fixed(1, 5, 6, 2, 2, 4, 4), opts(false, -1, -1, 1.5, 1.0), false, 430);
}

TEST(ReferenceBackward, GqaFiniteDifferences) {
  expect_grads_match_fd(fixed(1, 4, 5, 4, 1, 4, 4), opts(), false, 440);
  expect_grads_match_fd(fixed(2, 4, 5, 4, 2, 3, 5), opts(true), false, 441);
}

TEST(ReferenceBackward, VarlenFiniteDifferences) {
  Problem p = fixed(3, 0, 0, 2, 1, 4, 4);
  p.cu_seqlens_q = {0, 3, 3, 8};  // middle sequence has no queries
  p.cu_seqlens_k = {0, 5, 7, 10};
  expect_grads_match_fd(p, opts(true), true, 450);
}

TEST(ReferenceBackward, DlseFiniteDifferences) {
  expect_grads_match_fd(fixed(1, 5, 6, 2, 2, 4, 4), opts(), true, 460);
  expect_grads_match_fd(fixed(1, 7, 4, 2, 1, 4, 4), opts(true, -1, -1, 2.0), true, 461);  // masked rows + softcap
}

TEST(ReferenceBackward, MatchesNaiveMatrixFormThreaded) {
  const Problem p = fixed(2, 80, 112, 4, 2, 24, 16);
  const Options o = opts(true, 50, -1, 3.0);
  const Data x = make_data(p, 470);
  const std::vector<double> dout = randn(p.o_elems(), 471), dlse = randn(p.lse_elems(), 472);
  const NaiveOut n = naive(p, o, x, &dout, &dlse);
  std::vector<double> dq(p.q_elems()), dk(p.k_elems()), dv(p.v_elems());
  ref::backward(p, o, x.q.data(), x.k.data(), x.v.data(), dout.data(), dlse.data(), dq.data(), dk.data(), dv.data());
  EXPECT_LT(max_abs_diff(dq, n.dq), 1e-11);
  EXPECT_LT(max_abs_diff(dk, n.dk), 1e-11);
  EXPECT_LT(max_abs_diff(dv, n.dv), 1e-11);
  EXPECT_GT(max_abs(dq), 1e-2);
}

// ---------------------------------------------------------------------------
// Varlen == per-sequence fixed length.
// ---------------------------------------------------------------------------
struct VarlenCase {
  Problem p;
  Options o;
};
VarlenCase varlen_case() {
  Problem p = fixed(4, 0, 0, 4, 2, 8, 6);
  p.cu_seqlens_q = {0, 5, 5, 14, 16};  // lengths 5, 0, 9, 2
  p.cu_seqlens_k = {0, 7, 10, 14, 14};  // lengths 7, 3, 4, 0
  return {p, opts(true, 3, -1)};
}

Problem sub_problem(const Problem& p, int b) {
  return fixed(1, p.seqlen_q_of(b), p.seqlen_k_of(b), p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v);
}

TEST(ReferenceVarlen, ForwardEqualsPerSequence) {
  const auto [p, o] = varlen_case();
  EXPECT_EQ(p.total_q(), 16);
  EXPECT_EQ(p.total_k(), 14);
  const Data x = make_data(p, 500);
  const RefOut r = run_fwd(p, o, x);
  const int H = p.heads_q;
  for (int b = 0; b < p.batch; ++b) {
    const Problem s = sub_problem(p, b);
    const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    Data xs;
    xs.q.assign(x.q.begin() + size_t(q0) * H * 8, x.q.begin() + size_t(q0 + s.seqlen_q) * H * 8);
    xs.k.assign(x.k.begin() + size_t(k0) * 2 * 8, x.k.begin() + size_t(k0 + s.seqlen_k) * 2 * 8);
    xs.v.assign(x.v.begin() + size_t(k0) * 2 * 6, x.v.begin() + size_t(k0 + s.seqlen_k) * 2 * 6);
    const RefOut rs = run_fwd(s, o, xs);
    for (size_t e = 0; e < rs.out.size(); ++e) EXPECT_EQ(r.out[size_t(q0) * H * 6 + e], rs.out[e]) << b;
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < s.seqlen_q; ++i)  // varlen lse layout (h, total_q)
        EXPECT_EQ(r.lse[size_t(h) * p.total_q() + q0 + i], rs.lse[size_t(h) * s.seqlen_q + i]) << b;
  }
  // Sequence 3 has no keys: all its rows are masked.
  for (int h = 0; h < H; ++h) EXPECT_EQ(r.lse[ref::lse_index(p, 3, h, 1)], -kInf);
}

TEST(ReferenceVarlen, BackwardEqualsPerSequence) {
  const auto [p, o] = varlen_case();
  const Data x = make_data(p, 510);
  const std::vector<double> dout = randn(p.o_elems(), 511), dlse = randn(p.lse_elems(), 512);
  std::vector<double> dq(p.q_elems()), dk(p.k_elems()), dv(p.v_elems());
  ref::backward(p, o, x.q.data(), x.k.data(), x.v.data(), dout.data(), dlse.data(), dq.data(), dk.data(), dv.data());
  const int H = p.heads_q;
  for (int b = 0; b < p.batch; ++b) {
    const Problem s = sub_problem(p, b);
    const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    Data xs;
    xs.q.assign(x.q.begin() + size_t(q0) * H * 8, x.q.begin() + size_t(q0 + s.seqlen_q) * H * 8);
    xs.k.assign(x.k.begin() + size_t(k0) * 2 * 8, x.k.begin() + size_t(k0 + s.seqlen_k) * 2 * 8);
    xs.v.assign(x.v.begin() + size_t(k0) * 2 * 6, x.v.begin() + size_t(k0 + s.seqlen_k) * 2 * 6);
    std::vector<double> dos(dout.begin() + size_t(q0) * H * 6, dout.begin() + size_t(q0 + s.seqlen_q) * H * 6);
    std::vector<double> dls(s.lse_elems());
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < s.seqlen_q; ++i) dls[size_t(h) * s.seqlen_q + i] = dlse[size_t(h) * p.total_q() + q0 + i];
    std::vector<double> dqs(s.q_elems() + 1), dks(s.k_elems() + 1), dvs(s.v_elems() + 1);
    ref::backward(s, o, xs.q.data(), xs.k.data(), xs.v.data(), dos.data(), dls.data(), dqs.data(), dks.data(),
                  dvs.data());
    for (size_t e = 0; e < s.q_elems(); ++e) EXPECT_EQ(dq[size_t(q0) * H * 8 + e], dqs[e]) << b;
    for (size_t e = 0; e < s.k_elems(); ++e) EXPECT_EQ(dk[size_t(k0) * 2 * 8 + e], dks[e]) << b;
    for (size_t e = 0; e < s.v_elems(); ++e) EXPECT_EQ(dv[size_t(k0) * 2 * 6 + e], dvs[e]) << b;
  }
  // Sequence 1 has keys but no queries: zero dK/dV there.
  for (size_t e = size_t(7) * 2 * 8; e < size_t(10) * 2 * 8; ++e) EXPECT_EQ(dk[e], 0.0);
  EXPECT_GT(max_abs(dk), 1e-2);
}

// ---------------------------------------------------------------------------
// GQA == MHA with repeated K/V heads.
// ---------------------------------------------------------------------------
TEST(ReferenceGqa, EqualsMhaWithRepeatedKvForwardAndBackward) {
  const int B = 2, SQ = 6, SK = 9, HQ = 6, HK = 2, D = 8, DV = 4, G = HQ / HK;
  const Problem pg = fixed(B, SQ, SK, HQ, HK, D, DV), pm = fixed(B, SQ, SK, HQ, HQ, D, DV);
  const Options o = opts(true, 4, -1, 3.0);
  const Data xg = make_data(pg, 600);
  Data xm{xg.q, std::vector<double>(pm.k_elems()), std::vector<double>(pm.v_elems())};
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < SK; ++j)
      for (int h = 0; h < HQ; ++h) {
        for (int c = 0; c < D; ++c)
          xm.k[((size_t(b) * SK + j) * HQ + h) * D + c] = xg.k[((size_t(b) * SK + j) * HK + h / G) * D + c];
        for (int c = 0; c < DV; ++c)
          xm.v[((size_t(b) * SK + j) * HQ + h) * DV + c] = xg.v[((size_t(b) * SK + j) * HK + h / G) * DV + c];
      }
  const RefOut rg = run_fwd(pg, o, xg), rm = run_fwd(pm, o, xm);
  EXPECT_LT(max_abs_diff(rg.out, rm.out), 1e-14);
  EXPECT_LT(max_abs_diff(rg.lse, rm.lse), 1e-14);

  const std::vector<double> dout = randn(pg.o_elems(), 601), dlse = randn(pg.lse_elems(), 602);
  std::vector<double> dqg(pg.q_elems()), dkg(pg.k_elems()), dvg(pg.v_elems());
  std::vector<double> dqm(pm.q_elems()), dkm(pm.k_elems()), dvm(pm.v_elems());
  ref::backward(pg, o, xg.q.data(), xg.k.data(), xg.v.data(), dout.data(), dlse.data(), dqg.data(), dkg.data(),
                dvg.data());
  ref::backward(pm, o, xm.q.data(), xm.k.data(), xm.v.data(), dout.data(), dlse.data(), dqm.data(), dkm.data(),
                dvm.data());
  EXPECT_LT(max_abs_diff(dqg, dqm), 1e-13);
  std::vector<double> dks(pg.k_elems(), 0.0), dvs(pg.v_elems(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < SK; ++j)
      for (int h = 0; h < HQ; ++h) {
        for (int c = 0; c < D; ++c)
          dks[((size_t(b) * SK + j) * HK + h / G) * D + c] += dkm[((size_t(b) * SK + j) * HQ + h) * D + c];
        for (int c = 0; c < DV; ++c)
          dvs[((size_t(b) * SK + j) * HK + h / G) * DV + c] += dvm[((size_t(b) * SK + j) * HQ + h) * DV + c];
      }
  EXPECT_LT(max_abs_diff(dkg, dks), 1e-13);
  EXPECT_LT(max_abs_diff(dvg, dvs), 1e-13);
  EXPECT_GT(max_abs(dkg), 1e-2);
}

// ---------------------------------------------------------------------------
// Rounding.
// ---------------------------------------------------------------------------
TEST(ReferenceRound, Bf16KnownValues) {
  EXPECT_EQ(ref::round_bf16(1.0), 1.0);
  EXPECT_EQ(ref::round_bf16(-2.5), -2.5);
  EXPECT_EQ(ref::round_bf16(1.0 + std::ldexp(1, -8)), 1.0);  // tie -> even (down)
  EXPECT_EQ(ref::round_bf16(1.0 + 3 * std::ldexp(1, -8)), 1.0 + std::ldexp(1, -6));  // tie -> even (up)
  EXPECT_EQ(ref::round_bf16(1.0 + std::ldexp(1, -8) + std::ldexp(1, -30)), 1.0 + std::ldexp(1, -7));
  EXPECT_EQ(ref::round_bf16(0.1), 0.10009765625);
  const double bmax = std::ldexp(2.0 - std::ldexp(1, -7), 127);  // 3.3895e38
  EXPECT_EQ(ref::round_bf16(bmax), bmax);
  EXPECT_EQ(ref::round_bf16(3.4e38), kInf);
  EXPECT_EQ(ref::round_bf16(-1e39), -kInf);
  EXPECT_EQ(ref::round_bf16(std::ldexp(1.0, -133)), std::ldexp(1.0, -133));  // smallest subnormal
  EXPECT_EQ(ref::round_bf16(std::ldexp(1.0, -134)), 0.0);                     // tie -> 0
  EXPECT_EQ(ref::round_bf16(std::ldexp(1.5, -134)), std::ldexp(1.0, -133));
  EXPECT_EQ(ref::round_bf16(kInf), kInf);
  EXPECT_TRUE(std::isnan(ref::round_bf16(std::nan(""))));
  EXPECT_EQ(ref::round_to(LowPrecision::kBFloat16, 0.1), 0.10009765625);
}

TEST(ReferenceRound, Fp16KnownValues) {
  EXPECT_EQ(ref::round_fp16(1.0), 1.0);
  EXPECT_EQ(ref::round_fp16(0.1), 0.0999755859375);
  EXPECT_EQ(ref::round_fp16(1.0 / 3.0), 0.333251953125);
  EXPECT_EQ(ref::round_fp16(1.0 + std::ldexp(1, -11)), 1.0);  // tie -> even
  EXPECT_EQ(ref::round_fp16(1.0 + 3 * std::ldexp(1, -11)), 1.0 + std::ldexp(1, -9));
  EXPECT_EQ(ref::round_fp16(65504.0), 65504.0);
  EXPECT_EQ(ref::round_fp16(65519.0), 65504.0);
  EXPECT_EQ(ref::round_fp16(65520.0), kInf);  // tie rounds to 65536 -> overflow
  EXPECT_EQ(ref::round_fp16(1e5), kInf);
  EXPECT_EQ(ref::round_fp16(-70000.0), -kInf);
  EXPECT_EQ(ref::round_fp16(std::ldexp(1.0, -24)), std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(ref::round_fp16(std::ldexp(1.0, -25)), 0.0);                   // tie -> 0
  EXPECT_EQ(ref::round_fp16(std::ldexp(0.75, -24)), std::ldexp(1.0, -24));
  EXPECT_EQ(ref::round_fp16(std::ldexp(1.5, -24)), std::ldexp(2.0, -24));  // tie -> even
  // Subnormal spacing 2^-24 below 2^-14: 1.3e-5 -> nearest multiple of 2^-24.
  EXPECT_EQ(ref::round_fp16(1.3e-5), std::ldexp(218.0, -24));
  EXPECT_EQ(ref::round_to(LowPrecision::kFloat16, 65504.0), 65504.0);
}

// ---------------------------------------------------------------------------
// Low-precision baseline.
// ---------------------------------------------------------------------------
TEST(ReferenceLowp, ErrorIsPositiveAndAboutDtypeEpsilon) {
  const Problem p = fixed(1, 64, 64, 2, 2, 64, 64);
  Data x = make_data(p, 700);
  for (auto* t : {&x.q, &x.k, &x.v})
    for (auto& e : *t) e = ref::round_bf16(e);  // bf16-representable inputs
  const RefOut r = run_fwd(p, opts(), x);
  double err[2], lerr[2];
  int idx = 0;
  for (LowPrecision t : {LowPrecision::kBFloat16, LowPrecision::kFloat16}) {
    std::vector<double> out(p.o_elems()), lse(p.lse_elems());
    ref::forward_lowp(t, p, opts(), x.q.data(), x.k.data(), x.v.data(), out.data(), lse.data());
    for (double o : out) EXPECT_EQ(ref::round_to(t, o), o);  // output representable in t
    err[idx] = max_abs_diff(out, r.out) / max_abs(r.out);
    lerr[idx] = max_abs_diff(lse, r.lse);
    ++idx;
  }
  EXPECT_GT(err[0], 0.0);
  EXPECT_LT(err[0], 2e-2);
  EXPECT_GT(err[1], 0.0);
  EXPECT_LT(err[1], err[0]);
  EXPECT_LT(err[1], 4e-3);
  EXPECT_GT(lerr[0], 0.0);
  EXPECT_LT(lerr[0], 5e-2);
  EXPECT_LT(lerr[1], lerr[0]);
}

TEST(ReferenceLowp, MasksAndSoftcapLikeReference) {
  const Problem p = fixed(2, 24, 12, 4, 2, 32, 16);
  const Options o = opts(true, 5, -1, 4.0);
  const Data x = make_data(p, 710);
  const RefOut r = run_fwd(p, o, x);
  std::vector<double> out(p.o_elems()), lse(p.lse_elems());
  ref::forward_lowp(LowPrecision::kBFloat16, p, o, x.q.data(), x.k.data(), x.v.data(), out.data(), lse.data());
  // Same masked rows (-inf LSE, zero O), small error elsewhere.
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_EQ(std::isinf(lse[i]), std::isinf(r.lse[i])) << i;
  EXPECT_LT(max_abs_diff(out, r.out), 3e-2);
  EXPECT_LT(max_abs_diff(lse, r.lse), 5e-2);
  const auto c = ref::check_close(r.out.data(), r.out.data(), out.data(), out.size(), 1e-5);
  EXPECT_TRUE(c.ok);
  EXPECT_GT(c.base_err, 0.0);
}

// Equal scores over 3 keys: P = 1/3, which bf16 rounds to 171/512. With
// V = (2, 2, 127/64) the rounded P pushes O across a bf16 rounding boundary:
// exact O = 1.99479 -> 1.9921875, while sum(round(P) * V) = 1.99869 -> 2.0.
TEST(ReferenceLowp, RoundsProbabilitiesBeforePV) {
  const Problem p = fixed(1, 1, 3, 1, 1, 2, 2);
  Data x;
  x.q = {1.0, 0.75};
  x.k = {0.5, -1.25, 0.5, -1.25, 0.5, -1.25};
  x.v = {2.0, -1.5, 2.0, -1.5, 1.984375, -1.5};
  const RefOut r = run_fwd(p, opts(), x);
  EXPECT_NEAR(r.out[0], (4.0 + 1.984375) / 3.0, 1e-15);
  std::vector<double> out(2), lse(1);
  ref::forward_lowp(LowPrecision::kBFloat16, p, opts(), x.q.data(), x.k.data(), x.v.data(), out.data(), lse.data());
  EXPECT_EQ(out[0], 2.0);
  EXPECT_EQ(out[1], -1.5);
  EXPECT_EQ(ref::round_bf16(r.out[0]), 1.9921875);  // what rounding only O would give
  // S = round_bf16((0.5 - 0.9375) / sqrt(2)) = round_bf16(-0.309359...) = -0.30859375;
  // LSE = S + log(3) in float.
  EXPECT_NEAR(lse[0], -0.30859375 + std::log(3.0), 1e-6);
  EXPECT_NEAR(r.lse[0], -0.4375 / std::sqrt(2.0) + std::log(3.0), 1e-14);
}

// ---------------------------------------------------------------------------
// Tolerance rule.
// ---------------------------------------------------------------------------
TEST(ReferenceCheckClose, PassesIdentical) {
  const std::vector<double> ref_ = randn(100, 800);
  std::vector<double> lowp = ref_;
  lowp[3] += 1e-3;
  const auto c = ref::check_close(ref_.data(), ref_.data(), lowp.data(), ref_.size(), 1e-6);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.err, 0.0);
  EXPECT_NEAR(c.base_err, 1e-3, 1e-12);
  EXPECT_NEAR(c.bound, 2e-3 + 1e-6, 1e-12);
  EXPECT_EQ(c.nan_count, 0);
}

TEST(ReferenceCheckClose, FailsAboveBoundPassesBelow) {
  const std::vector<double> ref_ = randn(50, 810);
  std::vector<double> lowp = ref_, ours = ref_;
  lowp[10] -= 1e-2;  // base_err = 1e-2, bound = 2e-2 + eps
  ours[20] += 1.9e-2;
  auto c = ref::check_close(ours.data(), ref_.data(), lowp.data(), ours.size(), 1e-4);
  EXPECT_TRUE(c.ok);
  ours[20] = ref_[20] + 2.2e-2;
  c = ref::check_close(ours.data(), ref_.data(), lowp.data(), ours.size(), 1e-4);
  EXPECT_FALSE(c.ok);
  EXPECT_NEAR(c.err, 2.2e-2, 1e-12);
  // eps alone governs when the baseline is exact.
  c = ref::check_close(ours.data(), ref_.data(), ref_.data(), ours.size(), 1e-4);
  EXPECT_FALSE(c.ok);
  c = ref::check_close(ours.data(), ref_.data(), ref_.data(), ours.size(), 3e-2);
  EXPECT_TRUE(c.ok);
}

TEST(ReferenceCheckClose, FailsOnNan) {
  const std::vector<double> ref_ = randn(30, 820);
  std::vector<double> ours = ref_, lowp = ref_;
  for (auto& l : lowp) l += 0.5;
  ours[4] = std::nan("");
  ours[7] = -std::nan("");
  const auto c = ref::check_close(ours.data(), ref_.data(), lowp.data(), ours.size(), 1.0);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.nan_count, 2);
  EXPECT_EQ(c.err, 0.0);
}

TEST(ReferenceCheckClose, HandlesInfinities) {
  const std::vector<double> ref_ = {1.0, -kInf, 2.0, -kInf};
  std::vector<double> lowp = {1.01, -kInf, 2.0, -kInf};
  std::vector<double> ours = {1.0, -kInf, 2.0, -kInf};
  auto c = ref::check_close(ours.data(), ref_.data(), lowp.data(), 4, 1e-6);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.err, 0.0);
  EXPECT_NEAR(c.base_err, 0.01, 1e-12);  // equal infs in lowp skipped
  ours[1] = -1e30;  // finite where ref is -inf
  c = ref::check_close(ours.data(), ref_.data(), lowp.data(), 4, 1e-6);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.err, kInf);
  ours[1] = kInf;  // wrong-signed inf
  c = ref::check_close(ours.data(), ref_.data(), lowp.data(), 4, 1e-6);
  EXPECT_FALSE(c.ok);
  ours[1] = -kInf;
  ours[2] = -kInf;  // inf where ref is finite
  c = ref::check_close(ours.data(), ref_.data(), lowp.data(), 4, 1e-6);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.err, kInf);
}

TEST(ReferenceCheckClose, BaselineInfinitiesAndNans) {
  const std::vector<double> ref_ = {1.0, -kInf, 2.0};
  const std::vector<double> ours = {1.0 + 1e-3, -kInf, 2.0};
  // A NaN in the baseline is ignored (it is not ours); the bound is then eps only.
  std::vector<double> lowp = {std::nan(""), -kInf, 2.0};
  auto c = ref::check_close(ours.data(), ref_.data(), lowp.data(), 3, 1e-6);
  EXPECT_EQ(c.base_err, 0.0);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.nan_count, 0);
  // A baseline that misses an infinity of ref has an infinite error.
  lowp = {1.0, 0.5, 2.0};
  c = ref::check_close(ours.data(), ref_.data(), lowp.data(), 3, 1e-6);
  EXPECT_EQ(c.base_err, kInf);
  // Null baseline: bound is eps.
  c = ref::check_close(ours.data(), ref_.data(), nullptr, 3, 2e-3);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.bound, 2e-3);
}

TEST(ReferenceForward, ZeroScaleAveragesTheVisibleValues) {
  const Problem p = fixed(1, 5, 7, 1, 1, 8, 4);
  const Data x = make_data(p, 300);
  const RefOut r = run_fwd(p, opts(true, -1, -1, 0.0, 0.0), x);
  for (int i = 0; i < 5; ++i) {
    const int n = i + 7 - 5 + 1;  // keys 0 .. i + sk - sq
    for (int c = 0; c < 4; ++c) {
      double mean = 0;
      for (int j = 0; j < n; ++j) mean += x.v[size_t(j) * 4 + c] / n;
      EXPECT_NEAR(r.out[size_t(i) * 4 + c], mean, 1e-12);
    }
    EXPECT_NEAR(r.lse[size_t(i)], std::log(double(n)), 1e-12);
  }
}

}  // namespace
