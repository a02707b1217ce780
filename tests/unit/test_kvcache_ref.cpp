// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Tests of the KV-cache append + rotary CPU reference (src/reference/kvcache_ref.h),
// the reference the GPU test compares the kernel with bit for bit: the
// identity and quarter-turn rotations on both pairings, the identity outside
// the tables, a general angle against the float64 formula, and the append's
// row / entry mapping (clamps, rows dropped past the cache's end).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/kvcache_ref.h"

namespace {

using flash3::ref::LowPrecision;
namespace ref = flash3::ref;

// n values drawn from N(0, 1), rounded to t, never zero (a rotation by the
// identity may turn -0 into +0).
std::vector<double> randn_t(LowPrecision t, size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) {
    do e = ref::round_to(t, dist(gen));
    while (e == 0.0);
  }
  return x;
}

// Tables of seqlen_ro rows, each row cos / sin of one angle per pair.
struct Tables {
  std::vector<double> cos, sin;
};
Tables constant_tables(int seqlen_ro, int rotary_dim, double c, double s) {
  const size_t n = size_t(seqlen_ro) * (rotary_dim / 2);
  return {std::vector<double>(n, c), std::vector<double>(n, s)};
}

TEST(KVCacheRef, IdentityAtCos1Sin0AndOutsideTheTables) {
  for (LowPrecision t : {LowPrecision::kBFloat16, LowPrecision::kFloat16})
    for (bool interleaved : {true, false}) {
      const int d = 64, rd = 32, seqlen_ro = 4;
      Tables tab = constant_tables(seqlen_ro, rd, 0.5, 0.5);
      for (int j = 0; j < rd / 2; ++j) tab.cos[j] = 1.0, tab.sin[j] = 0.0;  // row 0: identity
      // Rows at position 0 (table identity), -1 and seqlen_ro (outside: cos 1, sin 0).
      const std::vector<int> pos = {0, -1, seqlen_ro, 1 << 30};
      const std::vector<double> x = randn_t(t, pos.size() * d, 1);
      std::vector<double> out(x.size());
      ref::rotary_rows(t, x.data(), out.data(), int(pos.size()), d, rd, interleaved, tab.cos.data(),
                       tab.sin.data(), seqlen_ro, pos.data());
      EXPECT_EQ(out, x) << "interleaved " << interleaved;
    }
}

// cos 0, sin 1: (x0, x1) -> (-x1, x0), on the pairs the layout names; dims
// past rotary_dim unchanged.
TEST(KVCacheRef, QuarterTurnPicksThePairs) {
  const LowPrecision t = LowPrecision::kBFloat16;
  const int d = 16, rd = 8, seqlen_ro = 3;
  const Tables tab = constant_tables(seqlen_ro, rd, 0.0, 1.0);
  const std::vector<double> x = randn_t(t, d, 2);
  const int pos = 2;
  for (bool interleaved : {true, false}) {
    std::vector<double> out(d);
    ref::rotary_rows(t, x.data(), out.data(), 1, d, rd, interleaved, tab.cos.data(), tab.sin.data(), seqlen_ro,
                     &pos);
    std::vector<double> want = x;
    for (int j = 0; j < rd / 2; ++j) {
      const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + rd / 2;
      want[i0] = -x[i1];
      want[i1] = x[i0];
    }
    EXPECT_EQ(out, want) << "interleaved " << interleaved;
  }
}

// A general angle per (position, pair): within one unit in the last place of
// the element type of the float64 rotation (the fp32 evaluation rounds twice).
TEST(KVCacheRef, GeneralAngleWithinOneUlp) {
  for (LowPrecision t : {LowPrecision::kBFloat16, LowPrecision::kFloat16})
    for (bool interleaved : {true, false}) {
      const int d = 32, rd = 24, seqlen_ro = 7, half = rd / 2;
      Tables tab{std::vector<double>(size_t(seqlen_ro) * half), std::vector<double>(size_t(seqlen_ro) * half)};
      for (int p = 0; p < seqlen_ro; ++p)
        for (int j = 0; j < half; ++j) {
          const double a = p * std::pow(10000.0, -2.0 * j / rd);
          tab.cos[p * half + j] = ref::round_to(t, std::cos(a));
          tab.sin[p * half + j] = ref::round_to(t, std::sin(a));
        }
      std::vector<int> pos(seqlen_ro);
      for (int p = 0; p < seqlen_ro; ++p) pos[p] = p;
      const std::vector<double> x = randn_t(t, size_t(seqlen_ro) * d, 3);
      std::vector<double> out(x.size());
      ref::rotary_rows(t, x.data(), out.data(), seqlen_ro, d, rd, interleaved, tab.cos.data(), tab.sin.data(),
                       seqlen_ro, pos.data());
      const int prec = t == LowPrecision::kBFloat16 ? 8 : 11;
      for (int p = 0; p < seqlen_ro; ++p)
        for (int j = 0; j < half; ++j) {
          const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
          const double c = tab.cos[p * half + j], s = tab.sin[p * half + j];
          const double x0 = x[p * d + i0], x1 = x[p * d + i1];
          const double want[2] = {x0 * c - x1 * s, x0 * s + x1 * c};
          const double got[2] = {out[p * d + i0], out[p * d + i1]};
          for (int k = 0; k < 2; ++k) {
            int e;
            std::frexp(want[k], &e);
            const double ulp = std::ldexp(1.0, std::max(e - prec, -24));
            EXPECT_LE(std::fabs(got[k] - want[k]), ulp) << "pos " << p << " pair " << j << " interleaved " << interleaved;
          }
        }
    }
}

// Row mapping: sequence b's new rows go to rows max(cache_seqlens[b], 0) + i
// of entry clamp(cache_batch_idx[b]); rows past the cache's end are dropped;
// everything else keeps its value. Keys rotated (quarter turn), values copied.
TEST(KVCacheRef, AppendMapsRowsAndEntries) {
  const LowPrecision t = LowPrecision::kFloat16;
  ref::AppendKVShape s;
  s.batch = 4;
  s.seqlen_new = 3;
  s.heads_kv = 2;
  s.head_dim = 8;
  s.head_dim_v = 16;
  s.cache_batches = 5;
  s.cache_rows = 6;
  s.rotary_dim = 8;
  s.interleaved = false;
  s.seqlen_ro = 100;
  const Tables tab = constant_tables(s.seqlen_ro, s.rotary_dim, 0.0, 1.0);
  const std::vector<int> cache_seqlens = {0, 4, -7, 9};
  const std::vector<int> cache_batch_idx = {3, -2, 17, 1};  // entries 3, 0 (clamped), 4 (clamped), 1
  const std::vector<double> kn = randn_t(t, size_t(s.batch) * s.seqlen_new * s.heads_kv * s.head_dim, 4);
  const std::vector<double> vn = randn_t(t, size_t(s.batch) * s.seqlen_new * s.heads_kv * s.head_dim_v, 5);
  const size_t kc_n = size_t(s.cache_batches) * s.cache_rows * s.heads_kv * s.head_dim;
  const size_t vc_n = size_t(s.cache_batches) * s.cache_rows * s.heads_kv * s.head_dim_v;
  std::vector<double> kc(kc_n, 42.0), vc(vc_n, 42.0);
  ref::append_kv(t, s, kn.data(), vn.data(), cache_seqlens.data(), cache_batch_idx.data(), nullptr,
                 tab.cos.data(), tab.sin.data(), kc.data(), vc.data());

  std::vector<double> want_k(kc_n, 42.0), want_v(vc_n, 42.0);
  const int entries[4] = {3, 0, 4, 1};
  const int first[4] = {0, 4, 0, 9};  // sequence 1 keeps 2 of its rows, sequence 3 none
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.seqlen_new; ++i) {
      if (first[b] + i >= s.cache_rows) continue;
      for (int h = 0; h < s.heads_kv; ++h) {
        const size_t src = (size_t(b) * s.seqlen_new + i) * s.heads_kv + h;
        const size_t dst = (size_t(entries[b]) * s.cache_rows + first[b] + i) * s.heads_kv + h;
        const int hd = s.head_dim / 2;
        for (int j = 0; j < hd; ++j) {
          want_k[dst * s.head_dim + j] = -kn[src * s.head_dim + j + hd];
          want_k[dst * s.head_dim + j + hd] = kn[src * s.head_dim + j];
        }
        for (int k = 0; k < s.head_dim_v; ++k) want_v[dst * s.head_dim_v + k] = vn[src * s.head_dim_v + k];
      }
    }
  EXPECT_EQ(kc, want_k);
  EXPECT_EQ(vc, want_v);
}

// Queries: at rotary_base(b) + i when the positions advance, else all at
// rotary_base(b); rotary_seqlens overrides cache_seqlens. Tables: identity
// everywhere except a quarter turn at position 5, so only queries there move.
TEST(KVCacheRef, QueryPositions) {
  const LowPrecision t = LowPrecision::kBFloat16;
  ref::AppendKVShape s;
  s.batch = 2;
  s.heads_kv = 1;
  s.head_dim = 8;
  s.rotary_dim = 8;
  s.interleaved = true;
  s.seqlen_ro = 10;
  const int seqlen_q = 3, heads_q = 2;
  Tables tab = constant_tables(s.seqlen_ro, s.rotary_dim, 1.0, 0.0);
  for (int j = 0; j < s.rotary_dim / 2; ++j) tab.cos[5 * 4 + j] = 0.0, tab.sin[5 * 4 + j] = 1.0;
  const std::vector<int> cache_seqlens = {3, 5}, rotary_seqlens = {5, 0};
  const std::vector<double> q = randn_t(t, size_t(s.batch) * seqlen_q * heads_q * s.head_dim, 6);
  auto moved = [&](const std::vector<double>& out, int b, int i) {
    const size_t o = (size_t(b) * seqlen_q + i) * heads_q * s.head_dim;
    return out[o] != q[o];
  };
  std::vector<double> out(q.size());
  // cache_seqlens: sequence 0 at 3, 4, 5 (advancing), sequence 1 at 5, 6, 7.
  ref::rotary_q(t, s, seqlen_q, heads_q, q.data(), cache_seqlens.data(), nullptr, true, tab.cos.data(),
                tab.sin.data(), out.data());
  EXPECT_FALSE(moved(out, 0, 0));
  EXPECT_TRUE(moved(out, 0, 2));
  EXPECT_TRUE(moved(out, 1, 0));
  EXPECT_FALSE(moved(out, 1, 1));
  // Not advancing, rotary_seqlens: sequence 0 all at 5, sequence 1 all at 0.
  ref::rotary_q(t, s, seqlen_q, heads_q, q.data(), cache_seqlens.data(), rotary_seqlens.data(), false,
                tab.cos.data(), tab.sin.data(), out.data());
  for (int i = 0; i < seqlen_q; ++i) {
    EXPECT_TRUE(moved(out, 0, i));
    EXPECT_FALSE(moved(out, 1, i));
  }
}

}  // namespace
