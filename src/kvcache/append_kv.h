// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// KV-cache append with rotary (flash_attn_with_kvcache's k / v / rotary_*):
// one kernel, launched before the attention kernels on the same stream, that
//   * writes the new key / value rows of each sequence into its cache entry,
//     the keys rotated (rotary_dim > 0), and
//   * writes a rotated copy of q (q_out) when rotary is on.
// Rotary per pair (x0, x1) at position pos, in fp32:
//   x0' = fma(x0, cos, -(x1 * sin)),  x1' = fma(x0, sin, x1 * cos)
// rounded to the element type (round to nearest even); interleaved pairs are
// dims (2j, 2j + 1), otherwise (j, j + rotary_dim / 2); dims >= rotary_dim
// copied unchanged. cos / sin are row `pos` of the (seqlen_ro, rotary_dim / 2)
// tables; a position outside [0, seqlen_ro) rotates by the identity (cos 1,
// sin 0). The same formula in the CPU reference (reference/reference.h)
// makes the appended cache bit-exact against it.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/build_options.h"
#include "flash3/flash3.h"

namespace flash3 {

struct AppendKVParams {
  DType dtype = DType::kBFloat16;  // of every tensor here (fp16 / bf16)
  int batch = 0;                   // sequences (q's batch)
  int seqlen_new = 0;              // new rows per sequence (0: no append)
  int heads_kv = 0, head_dim = 0, head_dim_v = 0;

  // New rows: (batch, seqlen_new, heads_kv, head_dim[_v]); strides in elements, unit in the last dim.
  // Variable length (cu_seqlens_new, batch + 1 int32 prefix sums on the device): (total_new, heads_kv,
  // head_dim[_v]), sequence b's rows [cu_seqlens_new[b], cu_seqlens_new[b + 1]) clamped into
  // [0, total_new] (seqlen_new and the batch strides unused).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;
#if FLASH3_SERVING_WIP
  const int* cu_seqlens_new = nullptr;
  int total_new = 0;
#endif

  // The caches: (cache_batches, cache_rows, heads_kv, head_dim[_v]).
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t kc_batch_stride = 0, kc_row_stride = 0, kc_head_stride = 0;
  int64_t vc_batch_stride = 0, vc_row_stride = 0, vc_head_stride = 0;
  int cache_batches = 0, cache_rows = 0;

  // Device int32 arrays of `batch` entries. New row i of sequence b goes to
  // row cache_seqlens[b] + i of entry cache_batch_idx[b] (b when null); the
  // entry index is clamped into [0, cache_batches), negative cache_seqlens
  // count as 0, and rows at or past cache_rows are not written.
  const int* cache_seqlens = nullptr;    // required when seqlen_new > 0
  const int* cache_batch_idx = nullptr;  // optional

  // Paged caches (page_table not null): the caches are page pools,
  // cache_batches the page table's rows, cache_rows the capacity of an entry,
  // and row r of entry e lives in page page_table[e * page_table_batch_stride
  // + r / page_size] at row r % page_size (rows kc_row_stride apart, pages
  // page_size rows apart).
  const int* page_table = nullptr;
  int64_t page_table_batch_stride = 0;
  int page_size = 0;

  // Rotary (rotary_dim 0: off). Tables (seqlen_ro, rotary_dim / 2) in dtype,
  // unit stride in the last dim. Position of new row i: pos_b + i with pos_b
  // = rotary_seqlens[b] if given, else cache_seqlens[b] (0 when null).
  int rotary_dim = 0;
  bool rotary_interleaved = true;
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t cos_row_stride = 0, sin_row_stride = 0;
  int seqlen_ro = 0;
  const int* rotary_seqlens = nullptr;

  // Rotated q (only with rotary_dim > 0): q (batch, seqlen_q, heads_q,
  // head_dim) -> q_out, same shape. Query i of sequence b at position pos_b +
  // i when q_positions_advance (causal / local), else pos_b. Variable-length
  // queries (cu_seqlens_q, as cu_seqlens_new): q / q_out (total_q, heads_q,
  // head_dim); rows no sequence covers are not written.
  const void* q = nullptr;
  void* q_out = nullptr;
  int seqlen_q = 0, heads_q = 0;
#if FLASH3_SERVING_WIP
  const int* cu_seqlens_q = nullptr;
  int total_q = 0;
#endif
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t qo_batch_stride = 0, qo_row_stride = 0, qo_head_stride = 0;
  bool q_positions_advance = false;
};

// Launches nothing when there is nothing to write (seqlen_new == 0 and no
// rotated q). Params are validated by the caller (KVCacheArgs validation).
Status launch_append_kv(const AppendKVParams& p, cudaStream_t stream);

}  // namespace flash3
