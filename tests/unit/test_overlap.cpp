// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests of the overlap tests behind output validation (src/api/overlap.h):
// every answer is checked against brute-force enumeration of the bytes each
// view touches.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>

#include "api/overlap.h"

namespace {

using flash3::DType;
using flash3::TensorView;

TensorView view(uintptr_t addr, DType dt, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) {
  TensorView t;
  t.data = reinterpret_cast<void*>(addr);
  t.dtype = dt;
  t.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  i = 0;
  for (int64_t s : stride) t.stride[i++] = s;
  return t;
}

// Every byte address the view's elements cover (small views only).
std::multiset<uintptr_t> bytes_of(const TensorView& t) {
  std::multiset<uintptr_t> out;
  const int es = flash3::dtype_size(t.dtype);
  int64_t idx[4] = {0, 0, 0, 0};
  const int64_t n = t.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t rem = e, off = 0;
    for (int d = t.ndim - 1; d >= 0; --d) {
      idx[d] = rem % t.shape[d];
      rem /= t.shape[d];
      off += idx[d] * t.stride[d];
    }
    for (int b = 0; b < es; ++b) out.insert(reinterpret_cast<uintptr_t>(t.data) + uintptr_t(off * es + b));
  }
  return out;
}

bool brute_self(const TensorView& t) {
  const auto b = bytes_of(t);
  return std::set<uintptr_t>(b.begin(), b.end()).size() != b.size();
}

bool brute_pair(const TensorView& a, const TensorView& b) {
  const auto x = bytes_of(a), y = bytes_of(b);
  for (uintptr_t v : std::set<uintptr_t>(x.begin(), x.end()))
    if (y.count(v)) return true;
  return false;
}

TEST(Overlap, PackedGradientsAreDisjoint) {
  // dq, dk, dv of one (b, s, 3, h, d) buffer, bf16.
  const int64_t b = 2, s = 5, h = 3, d = 8;
  const uintptr_t base = 1 << 20;
  const TensorView dq = view(base, DType::kBFloat16, {b, s, h, d}, {s * 3 * h * d, 3 * h * d, d, 1});
  const TensorView dk = view(base + h * d * 2, DType::kBFloat16, {b, s, h, d}, {s * 3 * h * d, 3 * h * d, d, 1});
  EXPECT_FALSE(flash3::views_overlap(dq, dk));
  EXPECT_FALSE(flash3::self_overlaps(dq));
  EXPECT_TRUE(flash3::views_overlap(dq, dq));
  const TensorView shifted = view(base + 2 * 2, DType::kBFloat16, {b, s, h, d}, {s * 3 * h * d, 3 * h * d, d, 1});
  EXPECT_TRUE(flash3::views_overlap(dq, shifted));
}

TEST(Overlap, SizeOneDimensionsAndEmptyViews) {
  const TensorView a = view(4096, DType::kFloat32, {1, 4, 8}, {-77, 8, 1});  // size-1 stride ignored
  EXPECT_FALSE(flash3::self_overlaps(a));
  TensorView empty = a;
  empty.shape[1] = 0;
  EXPECT_FALSE(flash3::views_overlap(a, empty));
}

TEST(Overlap, MatchesBruteForceOnRandomViews) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int checked = 0;
  for (int it = 0; it < 3000; ++it) {
    const int nd = pick(1, 3);
    TensorView a;
    a.dtype = pick(0, 1) ? DType::kBFloat16 : DType::kFloat32;
    a.ndim = nd;
    for (int d = 0; d < nd; ++d) {
      a.shape[d] = pick(1, 4);
      a.stride[d] = pick(0, 12);
    }
    a.data = reinterpret_cast<void*>(uintptr_t(1 << 16) + uintptr_t(pick(0, 40)) * 2);
    TensorView b = a;
    b.data = reinterpret_cast<void*>(uintptr_t(1 << 16) + uintptr_t(pick(0, 40)) * 2);
    for (int d = 0; d < nd; ++d) b.shape[d] = pick(1, 4);
    if (pick(0, 3) == 0) b.stride[pick(0, nd - 1)] = pick(0, 12);
    if (pick(0, 5) == 0) b.dtype = a.dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    const bool self = brute_self(a);
    // Never a false "disjoint"; a non-nested layout may be reported as overlapping.
    if (self) EXPECT_TRUE(flash3::self_overlaps(a));
    const bool pair = brute_pair(a, b);
    if (pair) EXPECT_TRUE(flash3::views_overlap(a, b));
    // Same element size and strides: exact.
    bool same = a.dtype == b.dtype;
    for (int d = 0; d < nd; ++d)
      if (a.shape[d] > 1 && b.shape[d] > 1 && a.stride[d] != b.stride[d]) same = false;
    const uintptr_t delta = reinterpret_cast<uintptr_t>(b.data) - reinterpret_cast<uintptr_t>(a.data);
    if (same && delta % uintptr_t(flash3::dtype_size(a.dtype)) == 0) {
      EXPECT_EQ(flash3::views_overlap(a, b), pair);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
