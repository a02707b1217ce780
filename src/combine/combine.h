// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Split-KV combine (seed ch. 10): merges the fp32 partial outputs and LSEs of
// num_splits KV splits into the final output, row by row:
//   lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s.
// Splits whose lse_s is -inf (no visible key in that split) weigh 0; a row
// with every split at -inf gets out = 0 and lse = -inf, as the unsplit
// forward writes for a fully masked row.
//
// Host-safe: included by the C++ (non-nvcc) API sources, so it does not pull
// in common/seqlen.h (CuTe headers need nvcc's include paths); SeqlenInfo is
// only pointed to here.
#pragma once
#include <cstdint>

#include "flash3/flash3.h"

namespace flash3 {

struct SeqlenInfo;  // common/seqlen.h

// Up to this many splits per row (FlashAttention-3's limit too).
constexpr int kMaxCombineSplits = 256;

// Strides in elements; the head-dim stride is 1 for out_partial and out.
struct CombineParams {
  const float* out_partial = nullptr;  // (num_splits, batch, seqlen, heads, head_dim)
  const float* lse_partial = nullptr;  // (num_splits, batch, seqlen, heads), natural log
  void* out = nullptr;                 // (batch, seqlen, heads, head_dim), out_dtype
  DType out_dtype = DType::kBFloat16;  // kBFloat16, kFloat16 or kFloat32
  float* lse = nullptr;                // optional: (batch, seqlen, heads) fp32
  int num_splits = 0, batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  int64_t op_split_stride = 0, op_batch_stride = 0, op_row_stride = 0, op_head_stride = 0;
  int64_t lp_split_stride = 0, lp_batch_stride = 0, lp_row_stride = 0, lp_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_row_stride = 0, lse_head_stride = 0;
  // Varlen (optional): batch is 1 and the seqlen rows are the packed rows of
  // num_seqs sequences; row r belongs to the last sequence b with
  // seqs[b].offset_q <= r and is combined only when r < offset_q + seqlen_q
  // (rows past seqused are left untouched, in out and lse).
  const SeqlenInfo* seqs = nullptr;
  int num_seqs = 0;
};

// Launches the combine on `stream` (nothing for an empty problem). The caller
// has validated the params; num_splits in [1, kMaxCombineSplits], head_dim in
// [1, 256] and a multiple of 4, out_partial 16-byte aligned with row/head/split
// strides multiples of 4.
Status launch_combine(const CombineParams& p, cudaStream_t stream);

}  // namespace flash3
