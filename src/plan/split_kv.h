// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Split-KV scratch (seed ch. 10): where a split launch's fp32 partials live in
// the forward workspace, after the launch's other scratch (the varlen maps).
// The launcher (fwd_launch.cuh) and forward_workspace_bytes (dispatch.cu) both
// come here, so they agree.
#pragma once
#include <cstddef>
#include <cstdint>

namespace flash3 {

struct FwdSplitLayout {
  size_t lse_offset = 0;  // lse_partial: (split, batch, heads_q, seqlen_q) fp32
  size_t o_offset = 0;    // o_partial: (split, batch, seqlen_q, heads_q, d_v) fp32
  size_t bytes = 0;       // the whole workspace, base scratch included
};

// rows: batch x seqlen_q (fixed length) or total_q (varlen). Each array starts
// 256-byte aligned (the kernels' float2 stores need 8).
inline FwdSplitLayout fwd_split_layout(size_t base_bytes, int num_splits, int64_t rows, int heads_q, int head_dim_v) {
  auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t row_heads = size_t(num_splits) * size_t(rows) * size_t(heads_q);
  FwdSplitLayout l;
  l.lse_offset = align(base_bytes);
  l.o_offset = align(l.lse_offset + row_heads * sizeof(float));
  l.bytes = l.o_offset + row_heads * size_t(head_dim_v) * sizeof(float);
  return l;
}

}  // namespace flash3
