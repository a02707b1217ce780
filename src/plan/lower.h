// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Lowering: the public arguments of a call that validation accepted, as the
// problem the plan (fwd_plan.h, kvcache_plan.h) and the launchers read.
// Strides of size-1 dimensions are replaced by harmless ones, the mask is
// normalised, softmax_scale defaulted; nothing here checks (validation did).
#pragma once
#include <cstdint>

#include "combine/combine.h"
#include "common/params.h"
#include "flash3/flash3.h"
#include "kvcache/append_kv.h"

namespace flash3 {

// Lowers validated args (workspace left null; the launch sets it).
FwdParams make_fwd_params(const ForwardArgs& args);
BwdParams make_bwd_params(const BackwardArgs& args);
// The mask of `opts` for a problem of seqlen_q x seqlen_k, normalised by
// FlashAttention-3's rules (flash3.h): negative sides unbounded, sides that
// cut nothing (left >= seqlen_k - 1, right >= seqlen_q - 1) unbounded, causal
// sets right = 0. Afterwards window_left < seqlen_k and window_right <
// seqlen_q, so the kernels' int32 mask arithmetic cannot overflow (seqlen_q +
// seqlen_k is bounded by validation). Sets is_causal, is_local and the window.
void apply_mask_options(const AttentionOptions& opts, int seqlen_q, int seqlen_k, FwdParams* p);
// A varlen problem as one fixed-length batch element holding every row: the
// launch's tensor maps span the whole tensors (batch stride = row stride,
// batch extent 1); the prep kernel derives each sequence's maps from them.
inline FwdParams varlen_as_one_batch(const FwdParams& p) {
  FwdParams w = p;
  w.batch = 1;
  w.seqlen_q = p.seqlen_q > 0 ? p.seqlen_q : 1;
  w.seqlen_k = p.seqlen_k > 0 ? p.seqlen_k : 1;
  w.q_batch_stride = p.q_row_stride;
  w.k_batch_stride = p.k_row_stride;
  w.v_batch_stride = p.v_row_stride;
  w.o_batch_stride = p.o_row_stride;
  return w;
}
// Combine (split-KV), fixed length: seqs null.
CombineParams make_combine_params(const CombineArgs& args);

// KV cache. The attention runs as the varlen forward without cu_seqlens
// (common/varlen.h's KV-cache layout): q / out as (b * sq, hq, d) rows, the
// caches as (b_cache * s_cache, hkv, d) rows, lse as (hq, b * sq).
struct KVCacheShape {
  bool varlen_q = false, varlen_new = false;
  int64_t b = 0;        // sequences
  int64_t sq = 0;       // queries per sequence (varlen: opts.max_seqlen_q)
  int64_t total_q = 0;  // q's rows
  int64_t hq = 0, d = 0, dv = 0, hkv = 0;
  int qd = 4;           // q's / out's ndim
};
KVCacheShape kvcache_shape(const KVCacheArgs& a);
// Rows a sequence's cache can hold: s_cache, or for a paged cache
// page_table_max_pages x page_size (int64: validation bounds it by int32).
int64_t kvcache_capacity(const KVCacheArgs& a);
// Rows of the page table (cache entries): page_table_rows, or one per sequence.
int64_t page_table_rows(const KVCacheArgs& a, const KVCacheShape& s);
// The stride between consecutive rows of dims (d0, d1) read as one dimension
// of shape[d0] * shape[d1] rows, or -1 when they are not one stride apart.
int64_t merged_row_stride(const TensorView& t, int d0, int d1);
// The 3-d view of a 4-d attention tensor whose (d0, d1) rows merge.
TensorView rows_view(const TensorView& t);
// The attention of a KV-cache call as varlen ForwardArgs (validation runs the
// generic checks on them; lowering lowers them).
ForwardArgs kvcache_attention_args(const KVCacheArgs& a);
// Whether a structurally valid call has query rows to attend (it may only append).
bool kvcache_has_queries(const KVCacheArgs& args);
// The attention's params (a varlen problem with FwdParams::kv_cache set;
// workspace unset) and the append kernel's (q_out unset: the plan places the
// rotated q in the workspace).
FwdParams make_kvcache_fwd_params(const KVCacheArgs& args);
AppendKVParams make_append_params(const KVCacheArgs& args);

}  // namespace flash3
