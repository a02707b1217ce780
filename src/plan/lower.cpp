// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Lowering: validated arguments -> the kernels' params (plan/lower.h). The
// size-1-dimension stride rule, the mask normalisation and the KV-cache
// call's views as a varlen problem live here, once.
#include "plan/lower.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace flash3 {

namespace {
constexpr float kLog2e = 1.4426950408889634f;
bool is_varlen(const AttentionOptions& o) { return o.cu_seqlens_q != nullptr; }
}  // namespace

namespace {
// The stride of dimension i as the kernels get it. A dimension of size 1 may
// carry any stride (validation ignores it); it is replaced by one past the
// view's span, rounded up to 16 bytes, so that TMA descriptors see a valid
// stride (a multiple of 16 bytes below 2^40) and pointer arithmetic a harmless one.
int64_t lowered_stride(const TensorView& t, int i) {
  if (t.shape[i] > 1) return t.stride[i];
  int64_t span = 1;
  for (int j = 0; j < t.ndim; ++j)
    if (t.shape[j] > 1) span = std::max(span, t.shape[j] * t.stride[j]);
  const int64_t unit = std::max(1, 16 / std::max(1, dtype_size(t.dtype)));
  return (span + unit - 1) / unit * unit;
}

// (batch, row, head) strides of an attention tensor; varlen tensors are
// (total, head, dim) and have no batch stride.
void lower_strides(const TensorView& t, bool varlen, int64_t* b, int64_t* r, int64_t* h) {
  const int R = varlen ? 0 : 1;
  *b = varlen ? 0 : lowered_stride(t, 0);
  *r = lowered_stride(t, R);
  *h = lowered_stride(t, R + 1);
}
}  // namespace

namespace {
// varlen: q / k / v / out are (rows, heads, dim) and lse (heads, rows), with
// or without cu_seqlens (the KV-cache layout lowers to them without).
FwdParams lower_forward(const ForwardArgs& args, bool varlen) {
  FwdParams p;
  const TensorView &q = args.q, &k = args.k, &v = args.v, &o = args.out;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = o.data;
  p.lse = static_cast<float*>(args.lse.data);
  p.dtype = q.dtype;

  const int R = varlen ? 0 : 1, H = R + 1, D = R + 2;
  // Varlen: batch is the number of sequences and seqlen_q / seqlen_k the total
  // rows of q / k (row 0 dimension); the per-sequence lengths live in device
  // arrays, the host only knows their maxima (used for the mask below).
  p.batch = varlen ? args.opts.num_sequences : static_cast<int>(q.shape[0]);
  p.seqlen_q = static_cast<int>(q.shape[R]);
  p.seqlen_k = static_cast<int>(k.shape[R]);
  if (varlen) {
    p.varlen = true;
    p.cu_seqlens_q = args.opts.cu_seqlens_q;
    p.cu_seqlens_k = args.opts.cu_seqlens_k;
    p.seqused_q = args.opts.seqused_q;
    p.seqused_k = args.opts.seqused_k;
    // 0 (every sequence of that side empty) is planned as 1: the grid keeps
    // one tile per sequence, which finds its sequence empty and writes what
    // an empty sequence gets (no query rows: nothing; no keys: O = 0, LSE -inf).
    p.max_seqlen_q = std::max(args.opts.max_seqlen_q, 1);
    p.max_seqlen_k = std::max(args.opts.max_seqlen_k, 1);
  }
  p.heads_q = static_cast<int>(q.shape[H]);
  p.heads_kv = static_cast<int>(k.shape[H]);
  p.head_dim = static_cast<int>(q.shape[D]);
  p.head_dim_v = static_cast<int>(v.shape[D]);

  auto strides = [&](const TensorView& t, int64_t* b, int64_t* r, int64_t* h) { lower_strides(t, varlen, b, r, h); };
  strides(q, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  strides(k, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  strides(v, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  strides(o, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  if (p.lse != nullptr) {
    // (b, hq, sq) or varlen (hq, total_q)
    p.lse_batch_stride = varlen ? 0 : lowered_stride(args.lse, 0);
    p.lse_head_stride = varlen ? lowered_stride(args.lse, 0) : lowered_stride(args.lse, 1);
  }

  const float scale = args.opts.softmax_scale;
  p.softmax_scale = std::isnan(scale) ? 1.f / std::sqrt(static_cast<float>(p.head_dim)) : scale;
  // Masked scores are -inf and -inf * 0 is NaN: a scale of 0 enters the
  // exponent as the smallest normal float instead (every finite score times it
  // is 0 to fp32 precision, so P is uniform as with 0), while O, the LSE and
  // the gradients use the exact 0.
  p.softmax_scale_log2 = p.softmax_scale > 0.f ? p.softmax_scale * kLog2e : std::numeric_limits<float>::min();
  p.softcap = args.opts.softcap;
  p.pack_gqa = args.opts.pack_gqa;  // launch_forward decides (fwd_pack_gqa)
  p.num_splits = args.opts.num_splits;  // launch_forward decides (fwd_num_splits)

  // Varlen: the window is normalised with the longest sequence (a side that
  // cuts nothing in it cuts nothing in any sequence).
  if (varlen) apply_mask_options(args.opts, p.max_seqlen_q, p.max_seqlen_k, &p);
  else apply_mask_options(args.opts, p.seqlen_q, p.seqlen_k, &p);
  return p;
}
}  // namespace

FwdParams make_fwd_params(const ForwardArgs& args) {
  FwdParams p = lower_forward(args, is_varlen(args.opts));
  // FP8 descales, (b, hkv) or blocks (b, h, blocks); a size-1 dimension's
  // stride is never used.
  auto descale = [](const TensorView& t, const float** ptr, int64_t* b, int64_t* h, int64_t* blk) {
    if (t.data == nullptr) return;
    *ptr = static_cast<const float*>(t.data);
    *b = t.shape[0] > 1 ? t.stride[0] : 0;
    *h = t.shape[1] > 1 ? t.stride[1] : 0;
    *blk = t.ndim == 3 && t.shape[2] > 1 ? t.stride[2] : 0;
  };
  descale(args.q_descale, &p.q_descale, &p.q_descale_batch_stride, &p.q_descale_head_stride, &p.q_descale_block_stride);
  if (args.q_descale.ndim == 3) {  // per query head
    p.q_descale_qhead_stride = p.q_descale_head_stride;
    p.q_descale_head_stride = 0;
  }
  descale(args.k_descale, &p.k_descale, &p.k_descale_batch_stride, &p.k_descale_head_stride, &p.k_descale_block_stride);
  descale(args.v_descale, &p.v_descale, &p.v_descale_batch_stride, &p.v_descale_head_stride, &p.v_descale_block_stride);
  return p;
}

void apply_mask_options(const AttentionOptions& opts, int seqlen_q, int seqlen_k, FwdParams* p) {
  int wl = opts.window_left < 0 ? -1 : opts.window_left;
  int wr = opts.window_right < 0 ? -1 : opts.window_right;
  if (wl >= seqlen_k - 1) wl = -1;
  if (wr >= seqlen_q - 1) wr = -1;
  if (opts.causal) wr = 0;
  p->is_causal = wl < 0 && wr == 0;
  p->is_local = !p->is_causal && (wl >= 0 || wr >= 0);
  p->window_left = p->is_local ? wl : -1;
  p->window_right = (p->is_local || p->is_causal) ? wr : -1;
}

BwdParams make_bwd_params(const BackwardArgs& args) {
  ForwardArgs f;
  f.q = args.q;
  f.k = args.k;
  f.v = args.v;
  f.out = args.out;
  f.lse = args.lse;
  f.opts = args.opts;
  BwdParams p;
  static_cast<FwdParams&>(p) = make_fwd_params(f);
  const bool varlen = is_varlen(args.opts);
  p.dout = args.dout.data;
  p.lse_in = static_cast<const float*>(args.lse.data);
  p.dlse = static_cast<const float*>(args.dlse.data);
  p.dq = args.dq.data;
  p.dk = args.dk.data;
  p.dv = args.dv.data;
  auto strides = [&](const TensorView& t, int64_t* b, int64_t* r, int64_t* h) { lower_strides(t, varlen, b, r, h); };
  strides(args.dout, &p.do_batch_stride, &p.do_row_stride, &p.do_head_stride);
  strides(args.dq, &p.dq_batch_stride, &p.dq_row_stride, &p.dq_head_stride);
  strides(args.dk, &p.dk_batch_stride, &p.dk_row_stride, &p.dk_head_stride);
  strides(args.dv, &p.dv_batch_stride, &p.dv_row_stride, &p.dv_head_stride);
  if (p.dlse != nullptr) {
    p.dlse_batch_stride = varlen ? 0 : lowered_stride(args.dlse, 0);
    p.dlse_head_stride = varlen ? lowered_stride(args.dlse, 0) : lowered_stride(args.dlse, 1);
  }
  p.deterministic = args.opts.deterministic;
  return p;
}

namespace {
// The stride of a combine tensor's dimension i for the kernel: 0 for a
// dimension of size 1 (its index is always 0; validation accepts any stride
// there, which must not break the kernel's alignment).
int64_t combine_stride(const TensorView& t, int i) { return t.shape[i] > 1 ? t.stride[i] : 0; }

}  // namespace

CombineParams make_combine_params(const CombineArgs& args) {
  const TensorView &op = args.out_partial, &lp = args.lse_partial, &o = args.out, &l = args.lse;
  CombineParams p;
  p.out_partial = static_cast<const float*>(op.data);
  p.lse_partial = static_cast<const float*>(lp.data);
  p.out = o.data;
  p.out_dtype = o.dtype;
  p.lse = static_cast<float*>(l.data);
  p.num_splits = static_cast<int>(op.shape[0]);
  p.batch = static_cast<int>(op.shape[1]);
  p.seqlen = static_cast<int>(op.shape[2]);
  p.heads = static_cast<int>(op.shape[3]);
  p.head_dim = static_cast<int>(op.shape[4]);
  p.op_split_stride = combine_stride(op, 0);
  p.op_batch_stride = combine_stride(op, 1);
  p.op_row_stride = combine_stride(op, 2);
  p.op_head_stride = combine_stride(op, 3);
  p.lp_split_stride = combine_stride(lp, 0);
  p.lp_batch_stride = combine_stride(lp, 1);
  p.lp_row_stride = combine_stride(lp, 2);
  p.lp_head_stride = combine_stride(lp, 3);
  p.o_batch_stride = combine_stride(o, 0);
  p.o_row_stride = combine_stride(o, 1);
  p.o_head_stride = combine_stride(o, 2);
  if (p.lse != nullptr) {
    p.lse_batch_stride = combine_stride(l, 0);
    p.lse_row_stride = combine_stride(l, 1);
    p.lse_head_stride = combine_stride(l, 2);
  }
  return p;
}

// The stride between consecutive rows of dims (d0, d1) read as one dimension
// of shape[d0] * shape[d1] rows, or -1 when they are not one stride apart.
int64_t merged_row_stride(const TensorView& t, int d0, int d1) {
  if (t.shape[d0] <= 1) return t.stride[d1];
  if (t.shape[d1] <= 1) return t.stride[d0];
  return t.stride[d0] == t.shape[d1] * t.stride[d1] ? t.stride[d1] : -1;
}

// The 3-d view of a 4-d attention tensor whose (d0, d1) rows merge.
TensorView rows_view(const TensorView& t) {
  TensorView r = t;
  r.ndim = 3;
  r.shape[0] = t.shape[0] * t.shape[1];
  r.stride[0] = r.shape[0] > 1 ? merged_row_stride(t, 0, 1) : t.stride[1];
  for (int i = 1; i < 3; ++i) {
    r.shape[i] = t.shape[i + 1];
    r.stride[i] = t.stride[i + 1];
  }
  r.shape[3] = r.stride[3] = 0;
  return r;
}

// Rows a sequence's cache can hold: s_cache, or for a paged cache
// page_table_max_pages x page_size (int64: checked against int32 below).
int64_t kvcache_capacity(const KVCacheArgs& a) {
  if (a.page_table == nullptr) return a.k_cache.shape[1];
  return int64_t(std::max(a.page_table_max_pages, 0)) * a.k_cache.shape[1];
}


KVCacheShape kvcache_shape(const KVCacheArgs& a) {
  KVCacheShape s;
  s.varlen_q = a.opts.cu_seqlens_q != nullptr;
  s.varlen_new = a.cu_seqlens_k_new != nullptr;
  s.qd = s.varlen_q ? 3 : 4;
  const int H = s.qd - 2;
  s.b = s.varlen_q ? a.opts.num_sequences : a.q.shape[0];
  s.sq = s.varlen_q ? a.opts.max_seqlen_q : a.q.shape[1];
  s.total_q = s.varlen_q ? a.q.shape[0] : a.q.shape[0] * a.q.shape[1];
  s.hq = a.q.shape[H];
  s.d = a.q.shape[H + 1];
  s.dv = a.v_cache.shape[3];
  s.hkv = a.k_cache.shape[2];
  return s;
}

// Rows of the page table (cache entries): page_table_rows, or one per sequence.
int64_t page_table_rows(const KVCacheArgs& a, const KVCacheShape& s) {
  return a.page_table_rows > 0 ? a.page_table_rows : s.b;
}

// The attention of a structurally valid call as varlen ForwardArgs (the
// sequences come from FwdParams' kv_cache fields; opts.cu_seqlens_q stays as
// given: null for (b, sq, ...) queries).
ForwardArgs kvcache_attention_args(const KVCacheArgs& a) {
  const KVCacheShape s = kvcache_shape(a);
  ForwardArgs f;
  f.q = s.varlen_q ? a.q : rows_view(a.q);
  f.k = rows_view(a.k_cache);
  f.v = rows_view(a.v_cache);
  f.out = s.varlen_q ? a.out : rows_view(a.out);
  if (a.lse.defined()) {
    if (s.varlen_q) {
      f.lse = a.lse;  // (hq, total_q)
    } else {
      TensorView l = a.lse;  // (b, hq, sq) -> (hq, b * sq), rows one stride (1) apart
      f.lse = l;
      f.lse.ndim = 2;
      f.lse.shape[0] = l.shape[1];
      f.lse.stride[0] = l.stride[1];
      f.lse.shape[1] = l.shape[0] * l.shape[2];
      f.lse.stride[1] = 1;
      f.lse.shape[2] = f.lse.stride[2] = 0;
    }
  }
  f.opts = a.opts;
  f.opts.num_sequences = static_cast<int>(s.b);
  f.opts.max_seqlen_q = static_cast<int>(std::max<int64_t>(s.sq, 1));
  f.opts.max_seqlen_k = static_cast<int>(std::max<int64_t>(kvcache_capacity(a), 1));
  f.workspace = a.workspace;
  f.workspace_bytes = a.workspace_bytes;
  return f;
}

bool kvcache_has_queries(const KVCacheArgs& a) {
  const KVCacheShape s = kvcache_shape(a);
  return s.b > 0 && s.total_q > 0 && s.sq > 0;
}

FwdParams make_kvcache_fwd_params(const KVCacheArgs& args) {
  const KVCacheShape s = kvcache_shape(args);
  FwdParams p = lower_forward(kvcache_attention_args(args), true);
  p.kv_cache = true;
  p.seqused_k = args.cache_seqlens;
  p.kv_batch_idx = args.cache_batch_idx;
  p.leftpad_k = args.cache_leftpad;
  p.kv_rows_per_batch = static_cast<int>(kvcache_capacity(args));
  // Contiguous caches keep the prep kernel's tensor maps (TMA) until the gather
  // is measured against them (docs/performance.md, "Paged caches").
  p.kv_direct = false;
  p.kv_entries = static_cast<int>(args.page_table != nullptr ? page_table_rows(args, s) : args.k_cache.shape[0]);
  p.seqlen_k_new = args.k_new.defined() && !s.varlen_new ? static_cast<int>(args.k_new.shape[1]) : 0;
  p.cu_seqlens_k_new = args.k_new.defined() ? args.cu_seqlens_k_new : nullptr;
  p.total_k_new = p.cu_seqlens_k_new != nullptr ? static_cast<int>(args.k_new.shape[0]) : 0;
  if (args.page_table != nullptr) {
    p.page_table = args.page_table;
    p.page_table_batch_stride = args.page_table_batch_stride;
    p.page_size = static_cast<int>(args.k_cache.shape[1]);
  }
  return p;
}

AppendKVParams make_append_params(const KVCacheArgs& a) {
  const KVCacheShape s = kvcache_shape(a);
  AppendKVParams p;
  p.dtype = a.q.dtype;
  p.batch = static_cast<int>(s.b);
  p.heads_kv = static_cast<int>(s.hkv);
  p.head_dim = static_cast<int>(s.d);
  p.head_dim_v = static_cast<int>(s.dv);
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  lower_strides(a.k_cache, false, &p.kc_batch_stride, &p.kc_row_stride, &p.kc_head_stride);
  lower_strides(a.v_cache, false, &p.vc_batch_stride, &p.vc_row_stride, &p.vc_head_stride);
  p.cache_batches = static_cast<int>(a.page_table != nullptr ? page_table_rows(a, s) : a.k_cache.shape[0]);
  p.cache_rows = static_cast<int>(kvcache_capacity(a));
  if (a.page_table != nullptr) {
    p.page_table = a.page_table;
    p.page_table_batch_stride = a.page_table_batch_stride;
    p.page_size = static_cast<int>(a.k_cache.shape[1]);
    // Pool rows one stride apart (the (num_pages, page_size) rows merge; with
    // page_size 1 that stride is the page stride, not the size-1 dimension's).
    p.kc_row_stride = rows_view(a.k_cache).stride[0];
    p.vc_row_stride = rows_view(a.v_cache).stride[0];
    p.kc_batch_stride = p.vc_batch_stride = 0;
  }
  p.cache_seqlens = a.cache_seqlens;
  p.cache_batch_idx = a.cache_batch_idx;
  if (a.k_new.defined()) {
    p.k_new = a.k_new.data;
    p.v_new = a.v_new.data;
    // varlen_new: (total_new, hkv, d), every sequence's rows in one dimension.
    lower_strides(a.k_new, s.varlen_new, &p.kn_batch_stride, &p.kn_row_stride, &p.kn_head_stride);
    lower_strides(a.v_new, s.varlen_new, &p.vn_batch_stride, &p.vn_row_stride, &p.vn_head_stride);
    if (s.varlen_new) {
#if FLASH3_SERVING_WIP
      p.cu_seqlens_new = a.cu_seqlens_k_new;
      p.total_new = static_cast<int>(a.k_new.shape[0]);
#endif
    } else {
      p.seqlen_new = static_cast<int>(a.k_new.shape[1]);
    }
  }
  if (a.rotary_cos.defined()) {
    p.rotary_dim = static_cast<int>(2 * a.rotary_cos.shape[1]);
    p.rotary_interleaved = a.rotary_interleaved;
    p.rotary_cos = a.rotary_cos.data;
    p.rotary_sin = a.rotary_sin.data;
    p.cos_row_stride = a.rotary_cos.shape[0] > 1 ? a.rotary_cos.stride[0] : 0;
    p.sin_row_stride = a.rotary_sin.shape[0] > 1 ? a.rotary_sin.stride[0] : 0;
    p.seqlen_ro = static_cast<int>(a.rotary_cos.shape[0]);
    p.rotary_seqlens = a.rotary_seqlens;
    p.q = a.q.data;
    p.heads_q = static_cast<int>(s.hq);
    lower_strides(a.q, s.varlen_q, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);  // varlen: (total_q, hq, d)
    if (s.varlen_q) {
#if FLASH3_SERVING_WIP
      p.cu_seqlens_q = a.opts.cu_seqlens_q;
      p.total_q = static_cast<int>(s.total_q);
#endif
    } else {
      p.seqlen_q = static_cast<int>(s.sq);
    }
    // q_out: the caller's buffer, contiguous rows (b * sq or total_q, hq, d); set by forward_kvcache.
    p.qo_head_stride = p.head_dim;
    p.qo_row_stride = int64_t(p.heads_q) * p.head_dim;
    p.qo_batch_stride = int64_t(p.seqlen_q) * p.qo_row_stride;
    FwdParams m;
    apply_mask_options(a.opts, static_cast<int>(std::max<int64_t>(s.sq, 1)), std::max(p.cache_rows, 1), &m);
    p.q_positions_advance = m.is_causal || m.is_local;
  }
  return p;
}

}  // namespace flash3
