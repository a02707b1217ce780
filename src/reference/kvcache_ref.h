// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU reference of the KV-cache append + rotary (kvcache/append_kv.h). Not a
// float64 model: it evaluates the kernel's fp32 rotary formula,
//   x0' = fma(x0, cos, -(x1 * sin)),  x1' = fma(x0, sin, x1 * cos),
// each product rounded to fp32 on its own, then rounds to the element type,
// so the appended cache and the rotated q compare bit-exact with the kernel.
// Values are doubles holding numbers representable in the element type t.
//
// Layouts are dense: rows of d (head_dim) or dv (head_dim_v) elements,
//   k_new (batch, seqlen_new, heads_kv, d), v_new (..., dv),
//   k_cache (cache_batches, cache_rows, heads_kv, d), v_cache (..., dv),
//   q / q_out (batch, seqlen_q, heads_q, d), tables (seqlen_ro, rotary_dim / 2).
#pragma once
#include "reference/reference.h"

namespace flash3::ref {

// Rotates n_rows rows of d elements: row r by table row positions[r] (cos 1,
// sin 0 outside [0, seqlen_ro)); pairs (2j, 2j + 1) when interleaved, else (j,
// j + rotary_dim / 2); dims >= rotary_dim copied. x and out may be the same.
// round_out = false keeps the rotated values in fp32 (the FP8 quantizer's
// rotary) instead of rounding them to t.
void rotary_rows(LowPrecision t, const double* x, double* out, int n_rows, int d, int rotary_dim, bool interleaved,
                 const double* cos_tab, const double* sin_tab, int seqlen_ro, const int* positions,
                 bool round_out = true);

struct AppendKVShape {
  int batch = 0, seqlen_new = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  int cache_batches = 0, cache_rows = 0;
  int rotary_dim = 0;  // 0: keys copied unrotated
  bool interleaved = true;
  int seqlen_ro = 0;
};

// Position of the first new row of sequence b: rotary_seqlens[b] if given,
// else max(cache_seqlens[b], 0) (0 when both are null).
int rotary_base(const int* cache_seqlens, const int* rotary_seqlens, int b);

// Writes new row i of sequence b (keys rotated to rotary_base(b) + i) into row
// max(cache_seqlens[b], 0) + i of entry clamp(cache_batch_idx[b] or b, 0,
// cache_batches - 1); rows at or past cache_rows are dropped. Other cache rows
// are left as they are. cache_batch_idx / rotary_seqlens may be null.
void append_kv(LowPrecision t, const AppendKVShape& s, const double* k_new, const double* v_new,
               const int* cache_seqlens, const int* cache_batch_idx, const int* rotary_seqlens,
               const double* cos_tab, const double* sin_tab, double* k_cache, double* v_cache);

// q_out = q rotated, query i of sequence b at rotary_base(b) + i when
// positions_advance, else at rotary_base(b).
void rotary_q(LowPrecision t, const AppendKVShape& s, int seqlen_q, int heads_q, const double* q,
              const int* cache_seqlens, const int* rotary_seqlens, bool positions_advance, const double* cos_tab,
              const double* sin_tab, double* q_out);

}  // namespace flash3::ref
