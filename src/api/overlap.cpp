// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Overlap tests of strided views (see overlap.h). Strides are >= 0 here:
// validation rejects negative strides before it asks.
#include "api/overlap.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace flash3 {

namespace {

using i128 = __int128;

struct Range {
  i128 lo = 0, hi = 0;  // bytes [lo, hi)
};

Range byte_range(const TensorView& t) {
  const int es = dtype_size(t.dtype);
  i128 last = 0;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1) last += i128(t.shape[i] - 1) * t.stride[i];
  Range r;
  r.lo = i128(reinterpret_cast<uintptr_t>(t.data));
  r.hi = r.lo + (last + 1) * es;
  return r;
}

bool empty(const TensorView& t) { return t.data == nullptr || t.numel() == 0; }

// One dimension of the index-difference search: d in [lo, hi], step `stride`.
struct Term {
  int64_t stride, lo, hi;
};

// Whether sum(d_i * stride_i) == target has a solution with d_i in [lo_i, hi_i]
// (terms sorted by stride, descending). `budget` caps the nodes visited; an
// exhausted budget answers "yes" (the caller then reports an overlap).
bool solvable(const std::vector<Term>& terms, size_t i, i128 target, const std::vector<i128>& min_rest,
              const std::vector<i128>& max_rest, int* budget) {
  if (--*budget < 0) return true;
  if (i == terms.size()) return target == 0;
  const Term& t = terms[i];
  // target - d * stride must lie in [min_rest[i + 1], max_rest[i + 1]].
  const i128 s = t.stride;
  const i128 a = target - max_rest[i + 1], b = target - min_rest[i + 1];  // d * s in [a, b]
  auto ceil_div = [](i128 x, i128 y) { return x >= 0 ? (x + y - 1) / y : -((-x) / y); };
  auto floor_div = [](i128 x, i128 y) { return x >= 0 ? x / y : -((-x + y - 1) / y); };
  const i128 d_lo = std::max<i128>(t.lo, ceil_div(a, s));
  const i128 d_hi = std::min<i128>(t.hi, floor_div(b, s));
  for (i128 d = d_lo; d <= d_hi; ++d)
    if (solvable(terms, i + 1, target - d * s, min_rest, max_rest, budget)) return true;
  return false;
}

}  // namespace

bool self_overlaps(const TensorView& t) {
  if (empty(t)) return false;
  struct Dim {
    int64_t n, stride;
  };
  std::vector<Dim> dims;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1) dims.push_back({t.shape[i], t.stride[i]});
  std::sort(dims.begin(), dims.end(), [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  i128 span = 0;  // in elements: the largest offset reachable with the smaller dims
  for (const Dim& d : dims) {
    if (i128(d.stride) <= span) return true;
    span += i128(d.n - 1) * d.stride;
  }
  return false;
}

bool views_overlap(const TensorView& a, const TensorView& b) {
  if (empty(a) || empty(b)) return false;
  const Range ra = byte_range(a), rb = byte_range(b);
  if (ra.hi <= rb.lo || rb.hi <= ra.lo) return false;
  const int es = dtype_size(a.dtype);
  if (es != dtype_size(b.dtype) || a.ndim != b.ndim) return true;
  const i128 delta = rb.lo - ra.lo;  // element of a at offset delta + (offset in b)
  if (delta % es != 0) return true;
  std::vector<Term> terms;
  for (int i = 0; i < a.ndim; ++i) {
    const int64_t na = a.shape[i], nb = b.shape[i];
    if (na <= 1 && nb <= 1) continue;
    if (na > 1 && nb > 1 && a.stride[i] != b.stride[i]) return true;
    const int64_t stride = na > 1 ? a.stride[i] : b.stride[i];
    if (stride == 0) continue;
    // a's index minus b's index.
    terms.push_back({stride, -(std::max<int64_t>(nb, 1) - 1), std::max<int64_t>(na, 1) - 1});
  }
  std::sort(terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.stride > y.stride; });
  std::vector<i128> min_rest(terms.size() + 1, 0), max_rest(terms.size() + 1, 0);
  for (size_t i = terms.size(); i-- > 0;) {
    min_rest[i] = min_rest[i + 1] + i128(terms[i].lo) * terms[i].stride;
    max_rest[i] = max_rest[i + 1] + i128(terms[i].hi) * terms[i].stride;
  }
  int budget = 1 << 16;
  return solvable(terms, 0, delta / es, min_rest, max_rest, &budget);
}

}  // namespace flash3
