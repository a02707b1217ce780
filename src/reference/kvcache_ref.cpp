// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU reference of the KV-cache append + rotary (see kvcache_ref.h).
#include "reference/kvcache_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace flash3::ref {

namespace {

// a * b rounded to fp32 on its own. The volatile store forbids the compiler to
// contract the product into the fma that consumes it (GCC's default
// -ffp-contract=fast does so wherever the target has FMA, e.g. -march=native),
// which would skip this rounding and differ from the kernel's mul.rn.
float mul_rn(float a, float b) {
  volatile float p = a * b;
  return p;
}

// The header's formula: x0' = fma(x0, c, -(x1 * s)), x1' = fma(x0, s, x1 * c).
float rotate_x0(float x0, float x1, float c, float s) { return std::fma(x0, c, -mul_rn(x1, s)); }
float rotate_x1(float x0, float x1, float c, float s) { return std::fma(x0, s, mul_rn(x1, c)); }

}  // namespace

void rotary_rows(LowPrecision t, const double* x, double* out, int n_rows, int d, int rotary_dim, bool interleaved,
                 const double* cos_tab, const double* sin_tab, int seqlen_ro, const int* positions,
                 bool round_out) {
  const int half = rotary_dim / 2;
  std::vector<double> row(size_t(std::max(d, 0)));
  for (int r = 0; r < n_rows; ++r) {
    const double* xr = x + int64_t(r) * d;
    std::copy(xr, xr + d, row.begin());  // x and out may alias
    double* o = out + int64_t(r) * d;
    const int pos = positions[r];
    const bool in_table = pos >= 0 && pos < seqlen_ro;
    for (int j = 0; j < half; ++j) {
      const float c = in_table ? float(cos_tab[int64_t(pos) * half + j]) : 1.f;
      const float s = in_table ? float(sin_tab[int64_t(pos) * half + j]) : 0.f;
      const int i0 = interleaved ? 2 * j : j;
      const int i1 = interleaved ? 2 * j + 1 : j + half;
      const float x0 = float(row[i0]), x1 = float(row[i1]);
      const double y0 = double(rotate_x0(x0, x1, c, s)), y1 = double(rotate_x1(x0, x1, c, s));
      o[i0] = round_out ? round_to(t, y0) : y0;
      o[i1] = round_out ? round_to(t, y1) : y1;
    }
    for (int k = rotary_dim; k < d; ++k) o[k] = row[k];
  }
}

int rotary_base(const int* cache_seqlens, const int* rotary_seqlens, int b) {
  if (rotary_seqlens != nullptr) return rotary_seqlens[b];
  return cache_seqlens != nullptr ? std::max(cache_seqlens[b], 0) : 0;
}

void append_kv(LowPrecision t, const AppendKVShape& s, const double* k_new, const double* v_new,
               const int* cache_seqlens, const int* cache_batch_idx, const int* rotary_seqlens,
               const double* cos_tab, const double* sin_tab, double* k_cache, double* v_cache) {
  const int d = s.head_dim, dv = s.head_dim_v;
  std::vector<double> krow(size_t(std::max(d, 0)));
  for (int b = 0; b < s.batch; ++b) {
    const int entry = std::clamp(cache_batch_idx != nullptr ? cache_batch_idx[b] : b, 0, s.cache_batches - 1);
    const int64_t first = std::max(cache_seqlens[b], 0);
    for (int i = 0; i < s.seqlen_new; ++i) {
      const int64_t row = first + i;
      if (row >= s.cache_rows) break;
      const int pos = int(std::clamp<int64_t>(int64_t(rotary_base(cache_seqlens, rotary_seqlens, b)) + i,
                                              INT32_MIN, INT32_MAX));
      for (int h = 0; h < s.heads_kv; ++h) {
        const int64_t src = (int64_t(b) * s.seqlen_new + i) * s.heads_kv + h;
        const int64_t dst = (int64_t(entry) * s.cache_rows + row) * s.heads_kv + h;
        rotary_rows(t, k_new + src * d, krow.data(), 1, d, s.rotary_dim, s.interleaved, cos_tab, sin_tab,
                    s.seqlen_ro, &pos);
        std::copy(krow.begin(), krow.end(), k_cache + dst * d);
        std::copy(v_new + src * dv, v_new + (src + 1) * dv, v_cache + dst * dv);
      }
    }
  }
}

void rotary_q(LowPrecision t, const AppendKVShape& s, int seqlen_q, int heads_q, const double* q,
              const int* cache_seqlens, const int* rotary_seqlens, bool positions_advance, const double* cos_tab,
              const double* sin_tab, double* q_out) {
  const int64_t rows = int64_t(s.batch) * seqlen_q * heads_q;
  std::vector<int> positions(size_t(std::max<int64_t>(rows, 0)));
  for (int64_t r = 0; r < rows; ++r) {
    const int i = int((r / heads_q) % seqlen_q), b = int(r / heads_q / seqlen_q);
    const int64_t pos = int64_t(rotary_base(cache_seqlens, rotary_seqlens, b)) + (positions_advance ? i : 0);
    positions[size_t(r)] = int(std::clamp<int64_t>(pos, INT32_MIN, INT32_MAX));
  }
  rotary_rows(t, q, q_out, int(rows), s.head_dim, s.rotary_dim, s.interleaved, cos_tab, sin_tab, s.seqlen_ro,
              positions.data());
}

}  // namespace flash3::ref
