// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// KV-cache attention (flash3::fwd_kvcache / flash3::fwd_kvcache_out and their autograd kernels) and
// the forward's launch plan (flash3::forward_plan, which flash3.get_scheduler_metadata returns);
// common.h describes the extension.
#include "common.h"

#include <c10/cuda/CUDAGuard.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

namespace flash3_torch {

namespace {


// Whether the (batch, seqlen) rows of a 4-d tensor are one stride apart, as flash3::KVCacheArgs
// wants q / k_cache / v_cache / out: batch stride == seqlen * row stride, or one of the two
// dimensions has a single entry (its stride is never used).
bool rows_one_stride_apart(const Tensor& t) {
  return t.size(0) <= 1 || t.size(1) <= 1 || t.stride(0) == t.size(1) * t.stride(1);
}

constexpr const char* kPerSequence = "one entry per sequence";

// The layout of one fwd_kvcache call: fixed-length q (batch, seqlen_q, heads, d) or variable-length
// q (total_q, heads, d) with cu_seqlens_q; new rows (batch, seqlen_new, ...) or (total_new, ...)
// with cu_seqlens_k_new; a contiguous or a paged cache.
struct KVCacheLayout {
  bool varlen_q = false, varlen_new = false, paged = false;
  int64_t b = 0, sq = 0, hq = 0, d = 0, dv = 0, hkv = 0;
  int64_t capacity = 0;
  const char* capacity_what = "";
};

// An optional per-sequence int32 array (cache_seqlens, cache_batch_idx, cache_leftpad, rotary_seqlens):
// CUDA on q's device, int32, 1-d, contiguous, one entry per sequence. Its values stay on the device.
void check_per_sequence(const std::optional<Tensor>& t, const char* name, const Tensor& q, const KVCacheLayout& L) {
  if (!has(t)) return;
  check_int32_vector(*t, name, q, kPerSequence);
  if (!(t->numel() == L.b)) value_error("flash3: ", name, " has ", t->numel(), " entries (shape ", shape_str(*t), "); expected ", L.b, L.varlen_q ? " (one per sequence: cu_seqlens_q.numel() - 1)" : " (one per sequence: q.shape[0], batch)");
}

// New rows k / v: both or neither, CUDA on q's device, q's dtype, (batch, seqlen_new, num_heads_kv,
// head_dim[_v]), or (total_new, num_heads_kv, head_dim[_v]) with cu_seqlens_k_new, with the cache's
// heads and head dims, unit stride in the last dimension.
void check_kvcache_new_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
                            const Tensor& v, const KVCacheLayout& L) {
  check_cuda_on_device_of({{k, "k"}, {v, "v"}}, q, "q");
  check_same_dtype(k, "k", q);
  check_same_dtype(v, "v", q);
  if (L.varlen_new) {
    check_3d(k, "k", "(total_new, num_heads_kv, head_dim)");
    check_3d(v, "v", "(total_new, num_heads_kv, head_dim_v)");
  } else {
    check_4d(k, "k", "(batch, seqlen_new, num_heads_kv, head_dim)");
    check_4d(v, "v", "(batch, seqlen_new, num_heads_kv, head_dim_v)");
  }
  check_last_dim_contiguous(k, "k", "head_dim");
  check_last_dim_contiguous(v, "v", "head_dim_v");
  const int64_t H = k.dim() - 2;  // heads
  if (!L.varlen_new) {
    if (!(k.size(0) == L.b)) value_error("flash3: k.shape[0] (batch) is ", k.size(0), "; expected ", L.b, " to match q.shape[0] (q ", shape_str(q), ", k ", shape_str(k), ")");
    if (!(v.size(0) == L.b)) value_error("flash3: v.shape[0] (batch) is ", v.size(0), "; expected ", L.b, " to match q.shape[0] (q ", shape_str(q), ", v ", shape_str(v), ")");
  }
  if (!(v.size(H - 1) == k.size(H - 1))) value_error("flash3: v.shape[", H - 1, "] (", L.varlen_new ? "total_new" : "seqlen_new", ") is ", v.size(H - 1), "; expected ", k.size(H - 1), " to match k (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(k.size(H) == L.hkv)) value_error("flash3: k.shape[", H, "] (num_heads_kv) is ", k.size(H), "; expected ", L.hkv, " to match k_cache.shape[2] (k ", shape_str(k), ", k_cache ", shape_str(k_cache), ")");
  if (!(v.size(H) == L.hkv)) value_error("flash3: v.shape[", H, "] (num_heads_kv) is ", v.size(H), "; expected ", L.hkv, " to match k_cache.shape[2] (v ", shape_str(v), ", k_cache ", shape_str(k_cache), ")");
  if (!(k.size(H + 1) == L.d)) value_error("flash3: k.shape[", H + 1, "] (head_dim) is ", k.size(H + 1), "; expected ", L.d, " to match k_cache.shape[3] (k ", shape_str(k), ", k_cache ", shape_str(k_cache), ")");
  if (!(v.size(H + 1) == L.dv)) value_error("flash3: v.shape[", H + 1, "] (head_dim_v) is ", v.size(H + 1), "; expected ", L.dv, " to match v_cache.shape[3] (v ", shape_str(v), ", v_cache ", shape_str(v_cache), ")");
  if (!L.varlen_new && !(k.size(1) <= L.capacity)) value_error("flash3: k.shape[1] (seqlen_new) is ", k.size(1), "; expected at most ", L.capacity_what, " = ", L.capacity, ": the cache is too small for the new rows");
}

// Rotary tables: CUDA on q's device, q's dtype, (seqlen_ro, rotary_dim / 2) each, unit stride in
// the last dimension, rotary_dim <= head_dim, seqlen_ro >= the capacity (seqlen_cache, or
// max_num_pages_per_seq * page_size with a page table).
void check_rotary_tables(const Tensor& q, const KVCacheLayout& L, const Tensor& cos, const Tensor& sin) {
  check_cuda_on_device_of({{cos, "rotary_cos"}, {sin, "rotary_sin"}}, q, "q");
  check_same_dtype(cos, "rotary_cos", q);
  check_same_dtype(sin, "rotary_sin", q);
  if (!(cos.dim() == 2)) value_error("flash3: rotary_cos has ", cos.dim(), " dimensions (shape ", shape_str(cos), "); expected a 2-d tensor (seqlen_ro, rotary_dim / 2)");
  if (!(sin.sizes() == cos.sizes())) value_error("flash3: rotary_sin has shape ", shape_str(sin), "; expected ", shape_str(cos), " to match rotary_cos (seqlen_ro, rotary_dim / 2)");
  if (!(cos.size(1) >= 1 && 2 * cos.size(1) <= L.d)) value_error("flash3: rotary_cos.shape[1] (rotary_dim / 2) is ", cos.size(1), "; expected 1 to ", L.d / 2, " (rotary_dim = 2 * rotary_cos.shape[1] must be in [2, head_dim], head_dim = ", L.d, ")");
  if (!(cos.size(0) >= L.capacity)) value_error("flash3: rotary_cos.shape[0] (seqlen_ro) is ", cos.size(0), "; expected at least ", L.capacity_what, " = ", L.capacity, " (one row per cache position)");
  check_last_dim_contiguous(cos, "rotary_cos", "rotary_dim / 2");
  check_last_dim_contiguous(sin, "rotary_sin", "rotary_dim / 2");
}

constexpr const char* kPageTableLayout = "(batch, max_num_pages_per_seq)";

// A paged cache's page_table (FlashAttention-3's): CUDA on q's device, int32, 2-d with one row per
// sequence (or, with cache_batch_idx, one row per cache entry: any number of rows >= 1, sequence b
// reading row cache_batch_idx[b]) of >= 1 entries, each row contiguous (stride(1) == 1) and the rows
// not overlapping (stride(0) >= shape[1]); k_cache's page_size >= 1. Its values (page indices) stay
// on the device: indices outside [0, num_pages) are the caller's contract. The flash3::KVCacheArgs
// fields come from data_ptr, stride(0), shape[0] and shape[1].
void check_page_table(const Tensor& t, const Tensor& q, const Tensor& k_cache,
                      const std::optional<Tensor>& cache_batch_idx, const KVCacheLayout& L) {
  if (!(t.is_cuda())) value_error("flash3: page_table must be a CUDA tensor on q's device (", q.device().str(), "), but page_table is on device '", t.device().str(), "' (move it with page_table.to(q.device))");
  check_same_device(t, "page_table", q, "q");
  if (!(t.scalar_type() == at::kInt)) type_error("flash3: page_table.dtype is ", dtype_str(t.scalar_type()), "; expected torch.int32 (the page indices of each sequence; use page_table.to(torch.int32))");
  if (!(t.dim() == 2)) value_error("flash3: page_table has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 2-d tensor ", kPageTableLayout, " of int32 page indices");
  if (has(cache_batch_idx)) {
    if (!(t.size(0) >= 1 && t.size(0) <= INT32_MAX)) value_error("flash3: page_table.shape[0] is ", t.size(0), " (page_table ", shape_str(t), "); expected at least 1 row (one per cache entry that cache_batch_idx picks)");
  } else if (!(t.size(0) == L.b)) {
    value_error("flash3: page_table.shape[0] is ", t.size(0), " (page_table ", shape_str(t), "); expected ", L.b, " (one row per sequence; with cache_batch_idx, one per cache entry)");
  }
  if (!(t.size(1) >= 1 && t.size(1) <= INT32_MAX)) value_error("flash3: page_table.shape[1] (max_num_pages_per_seq) is ", t.size(1), "; expected a value in [1, 2147483647]");
  if (!(t.size(1) == 1 || t.stride(1) == 1)) value_error("flash3: page_table.stride(1) is ", t.stride(1), "; expected 1: each sequence's page indices must be contiguous (use page_table.contiguous())");
  if (!(t.size(0) <= 1 || t.stride(0) >= t.size(1))) value_error("flash3: page_table.stride(0) is ", t.stride(0), "; expected at least page_table.shape[1] (max_num_pages_per_seq) = ", t.size(1), ": the rows of page_table must not overlap (use page_table.contiguous())");
  if (!(k_cache.size(1) >= 1)) value_error("flash3: k_cache.shape[1] (page_size) is ", k_cache.size(1), "; expected >= 1 with page_table (k_cache is a (num_pages, page_size, num_heads_kv, head_dim) page pool)");
}

// softcap > 0 with a page table: the paged kernels have no softcap (the library says so too, but
// only after out / lse are allocated). float as AttentionOptions::softcap holds it.
void check_page_table_softcap(const std::optional<Tensor>& page_table, double softcap) {
  if (has(page_table) && static_cast<float>(softcap) != 0.f) not_implemented_error("flash3: page_table (paged KV cache) with softcap ", softcap, " is not supported yet; pass softcap=0.0, or a contiguous cache");
}

// q, k_cache and v_cache: CUDA tensors of one device, fp16 / bf16, one dtype, their ranks (q's by
// varlen_q) and unit stride in the last dimension.
void check_q_and_caches(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, bool varlen_q) {
  check_cuda(q, "q");
  check_cuda_on_device_of({{k_cache, "k_cache"}, {v_cache, "v_cache"}}, q, "q");
  check_dtype_q(q);
  check_same_dtype(k_cache, "k_cache", q);
  check_same_dtype(v_cache, "v_cache", q);
  if (varlen_q) check_3d(q, "q", "(total_q, num_heads_q, head_dim)");
  else check_4d(q, "q", "(batch, seqlen_q, num_heads_q, head_dim)");
  check_4d(k_cache, "k_cache", "(batch_cache, seqlen_cache, num_heads_kv, head_dim)");
  check_4d(v_cache, "v_cache", "(batch_cache, seqlen_cache, num_heads_kv, head_dim_v)");
  check_last_dim_contiguous(q, "q", "head_dim");
  check_last_dim_contiguous(k_cache, "k_cache", "head_dim");
  check_last_dim_contiguous(v_cache, "v_cache", "head_dim_v");
}

// L's batch (number of sequences) and seqlen_q: q's first two dimensions, or with cu_seqlens_q
// (checked here) its num_sequences and max_seqlen_q.
void set_batch(KVCacheLayout* L, const Tensor& q, const std::optional<Tensor>& cu_seqlens_q,
               std::optional<int64_t> max_seqlen_q) {
  if (L->varlen_q) {
    check_int32_vector(*cu_seqlens_q, "cu_seqlens_q", q, kCuSeqlensQ);
    check_cu_seqlens_q_not_empty(*cu_seqlens_q);
    check_num_sequences_fit_int32(*cu_seqlens_q);
    if (!max_seqlen_q.has_value()) value_error("flash3: max_seqlen_q is None with cu_seqlens_q; expected the longest query sequence (an int >= 0)");
    check_max_seqlen(*max_seqlen_q, "max_seqlen_q", "query");
    L->b = cu_seqlens_q->numel() - 1;
    L->sq = *max_seqlen_q;
  } else {
    L->b = q.size(0);
    L->sq = q.size(1);
  }
}

// k_cache and v_cache agree with each other and with q (heads, head dims), and a forward kernel
// exists for the head dims.
void check_cache_shapes(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const KVCacheLayout& L) {
  if (!(v_cache.size(0) == k_cache.size(0))) value_error("flash3: v_cache.shape[0] (batch_cache) is ", v_cache.size(0), "; expected ", k_cache.size(0), " to match k_cache.shape[0] (k_cache ", shape_str(k_cache), ", v_cache ", shape_str(v_cache), ")");
  if (!(v_cache.size(1) == k_cache.size(1))) value_error("flash3: v_cache.shape[1] (seqlen_cache) is ", v_cache.size(1), "; expected ", k_cache.size(1), " to match k_cache.shape[1] (k_cache ", shape_str(k_cache), ", v_cache ", shape_str(v_cache), ")");
  if (!(v_cache.size(2) == k_cache.size(2))) value_error("flash3: v_cache.shape[2] (num_heads_kv) is ", v_cache.size(2), "; expected ", k_cache.size(2), " to match k_cache.shape[2] (k_cache ", shape_str(k_cache), ", v_cache ", shape_str(v_cache), ")");
  if (!(k_cache.size(3) == L.d)) value_error("flash3: k_cache.shape[3] (head_dim) is ", k_cache.size(3), "; expected ", L.d, " to match q's head_dim (q ", shape_str(q), ", k_cache ", shape_str(k_cache), ")");
  if (!(L.hkv >= 1 && L.hq % L.hkv == 0)) value_error("flash3: q's num_heads_q is ", L.hq, ", which is not a multiple of k_cache.shape[2] (num_heads_kv) ", L.hkv, "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  check_head_dim(q, v_cache, "v_cache");
}

// The cache's capacity per sequence (L.paged, L.capacity), its batch and its row strides.
void check_cache_layout(KVCacheLayout* Lp, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const std::optional<Tensor>& page_table, const std::optional<Tensor>& cache_batch_idx) {
  KVCacheLayout& L = *Lp;
  // A page table: k_cache / v_cache are page pools (num_pages, page_size, ...), whose num_pages
  // has nothing to do with the batch; a sequence holds max_num_pages_per_seq * page_size rows.
  L.paged = has(page_table);
  if (L.paged) check_page_table(*page_table, q, k_cache, cache_batch_idx, L);
  L.capacity = L.paged ? page_table->size(1) * k_cache.size(1) : k_cache.size(1);
  L.capacity_what = L.paged ? "page_table.shape[1] * k_cache.shape[1] (max_num_pages_per_seq * page_size)"
                            : "k_cache.shape[1] (seqlen_cache)";
  if (!(L.paged || has(cache_batch_idx) || k_cache.size(0) >= L.b)) value_error("flash3: k_cache.shape[0] (batch_cache) is ", k_cache.size(0), ", less than the batch (", L.b, " sequences); expected batch_cache >= batch without cache_batch_idx (sequence b uses cache entry b)");
  // The caches are written in place, so they cannot be copied into the layout the kernels want.
  // (A page pool likewise: its pages are page_size rows apart.)
  for (const NamedTensor& c : {NamedTensor{k_cache, "k_cache"}, NamedTensor{v_cache, "v_cache"}})
    if (!(rows_one_stride_apart(c.t))) {
      if (L.paged) value_error("flash3: ", c.name, ".stride(0) (num_pages) is ", c.t.stride(0), "; expected ", c.t.size(1) * c.t.stride(1), " = ", c.name, ".shape[1] * ", c.name, ".stride(1) (page_size * row stride): the rows of all pages must be one stride apart (e.g. a contiguous page pool, or one sliced along the heads)");
      value_error("flash3: ", c.name, ".stride(0) (batch_cache) is ", c.t.stride(0), "; expected ", c.t.size(1) * c.t.stride(1), " = ", c.name, ".shape[1] * ", c.name, ".stride(1) (seqlen_cache * row stride): the rows of all cache entries must be one stride apart (e.g. a contiguous cache, or one sliced along the heads, not along seqlen_cache)");
    }
}

// Every tensor check of fwd_kvcache, in the order a user would want to hear about them; returns
// the call's layout. The library validates again (strides, alignment, overlaps) before launching
// anything.
KVCacheLayout check_kvcache_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const std::optional<Tensor>& k, const std::optional<Tensor>& v,
                                   const std::optional<Tensor>& rotary_cos, const std::optional<Tensor>& rotary_sin,
                                   const std::optional<Tensor>& cache_seqlens,
                                   const std::optional<Tensor>& cache_batch_idx,
                                   const std::optional<Tensor>& cache_leftpad, const std::optional<Tensor>& page_table,
                                   const std::optional<Tensor>& rotary_seqlens,
                                   const std::optional<Tensor>& cu_seqlens_q,
                                   const std::optional<Tensor>& cu_seqlens_k_new, std::optional<int64_t> max_seqlen_q) {
  KVCacheLayout L;
  L.varlen_q = has(cu_seqlens_q);
  L.varlen_new = has(cu_seqlens_k_new);
  check_q_and_caches(q, k_cache, v_cache, L.varlen_q);
  const int64_t H = q.dim() - 2;
  L.hq = q.size(H);
  L.d = q.size(H + 1);
  L.dv = v_cache.size(3);
  L.hkv = k_cache.size(2);
  set_batch(&L, q, cu_seqlens_q, max_seqlen_q);
  check_cache_shapes(q, k_cache, v_cache, L);
  check_cache_layout(&L, q, k_cache, v_cache, page_table, cache_batch_idx);
  if (has(k) != has(v)) value_error("flash3: k and v (the new rows) must be given together, but ", has(k) ? "v" : "k", " is None");
  if (L.varlen_new && !has(k)) value_error("flash3: cu_seqlens_k_new is given but k / v are None; expected the new rows it describes");
  if (has(k)) {
    check_kvcache_new_rows(q, k_cache, v_cache, *k, *v, L);
    if (!has(cache_seqlens)) value_error("flash3: k / v (new rows) need cache_seqlens: the new rows of sequence b are written at rows [cache_seqlens[b], cache_seqlens[b] + seqlen_new) of its cache entry (pass cache_seqlens: an int or a (batch,) torch.int32 tensor)");
  }
  if (L.varlen_new) {
    check_int32_vector(*cu_seqlens_k_new, "cu_seqlens_k_new", q, "num_sequences + 1 prefix sums of the new rows");
    if (!(cu_seqlens_k_new->numel() == L.b + 1)) value_error("flash3: cu_seqlens_k_new has ", cu_seqlens_k_new->numel(), " entries; expected ", L.b + 1, " (num_sequences + 1 prefix sums over k's rows)");
  }
  if (has(rotary_cos) != has(rotary_sin)) value_error("flash3: rotary_cos and rotary_sin must be given together, but ", has(rotary_cos) ? "rotary_sin" : "rotary_cos", " is None");
  if (has(rotary_cos)) {
    if (!has(k)) value_error("flash3: rotary_cos / rotary_sin need k and v: the rotary embedding is applied to the new keys (and to q) as they are appended; pass k and v, or no rotary tables");
    check_rotary_tables(q, L, *rotary_cos, *rotary_sin);
  }
  check_per_sequence(cache_seqlens, "cache_seqlens", q, L);
  check_per_sequence(cache_batch_idx, "cache_batch_idx", q, L);
  check_per_sequence(cache_leftpad, "cache_leftpad", q, L);
  check_per_sequence(rotary_seqlens, "rotary_seqlens", q, L);
  return L;
}

// out= of fwd_kvcache: q's device and dtype, (batch, seqlen_q, num_heads_q, head_dim_v) or
// (total_q, num_heads_q, head_dim_v), unit stride in the last dimension; the library checks the
// rest (strides, alignment, that it shares memory with nothing the call reads or writes).
void check_out_arg(const Tensor& out, const Tensor& q, int64_t dv) {
  check_cuda(out, "out");
  check_same_device(out, "out", q, "q");
  if (!(out.scalar_type() == q.scalar_type())) type_error("flash3: out.dtype is ", dtype_str(out.scalar_type()), "; expected ", dtype_str(q.scalar_type()), " to match q.dtype");
  std::vector<int64_t> want = q.sizes().vec();
  want.back() = dv;
  if (!(out.sizes() == at::IntArrayRef(want))) value_error("flash3: out has shape ", shape_str(out), "; expected ", c10::IntArrayRef(want), " (q's shape with head_dim_v)");
  check_last_dim_contiguous(out, "out", "head_dim_v");
}

const int* int32_ptr(const std::optional<Tensor>& t) { return has(t) ? t->data_ptr<int32_t>() : nullptr; }

// KV-cache forward: appends k / v (rotary applied) to k_cache / v_cache in place, then attention
// of q over each sequence's cache rows. out (batch, seqlen_q, num_heads_q, head_dim_v) or, with
// cu_seqlens_q, (total_q, num_heads_q, head_dim_v): the caller's out= or a new contiguous tensor;
// softmax_lse (batch, num_heads_q, seqlen_q) fp32, a permuted view of a contiguous
// (num_heads_q, batch, seqlen_q) buffer (KVCacheArgs::lse's layout: batch stride seqlen_q, row
// stride 1), or (num_heads_q, total_q). Workspace (per-sequence maps, split partials, rotated q)
// from the caching allocator.
std::tuple<Tensor, Tensor> fwd_kvcache_impl(
    const Tensor& q_in, const Tensor& k_cache, const Tensor& v_cache, const std::optional<Tensor>& k,
    const std::optional<Tensor>& v, const std::optional<Tensor>& rotary_cos, const std::optional<Tensor>& rotary_sin,
    const std::optional<Tensor>& cache_seqlens, const std::optional<Tensor>& cache_batch_idx,
    const std::optional<Tensor>& cache_leftpad, const std::optional<Tensor>& page_table,
    const std::optional<Tensor>& rotary_seqlens, std::optional<double> softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, bool rotary_interleaved, int64_t num_splits,
    int64_t pack_gqa, const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k_new,
    std::optional<int64_t> max_seqlen_q, const std::optional<Tensor>& out_arg) {
  const KVCacheLayout L =
      check_kvcache_inputs(q_in, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, page_table, rotary_seqlens, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_page_table_softcap(page_table, softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
  if (has(out_arg)) check_out_arg(*out_arg, q_in, L.dv);
  const c10::cuda::CUDAGuard guard(q_in.device());
  // q is only read: a fixed-length q whose (batch, seqlen_q) rows are not one stride apart (e.g. a
  // slice along seqlen) is copied into that layout.
  const Tensor q = L.varlen_q || rows_one_stride_apart(q_in) ? q_in : q_in.contiguous();
  Tensor out, lse;
  if (L.varlen_q) {
    out = has(out_arg) ? *out_arg : at::empty({q.size(0), L.hq, L.dv}, q.options());
    lse = at::empty({L.hq, q.size(0)}, q.options().dtype(at::kFloat));
  } else {
    out = has(out_arg) ? *out_arg : at::empty({L.b, L.sq, L.hq, L.dv}, q.options());
    lse = at::empty({L.hq, L.b, L.sq}, q.options().dtype(at::kFloat)).permute({1, 0, 2});
  }

  flash3::KVCacheArgs args;
  args.q = view(q);
  args.k_cache = view(k_cache);
  args.v_cache = view(v_cache);
  if (has(k)) {
    args.k_new = view(*k);
    args.v_new = view(*v);
    args.cu_seqlens_k_new = int32_ptr(cu_seqlens_k_new);
  }
  if (has(rotary_cos)) {
    args.rotary_cos = view(*rotary_cos);
    args.rotary_sin = view(*rotary_sin);
  }
  args.rotary_interleaved = rotary_interleaved;
  args.cache_seqlens = int32_ptr(cache_seqlens);
  args.cache_batch_idx = int32_ptr(cache_batch_idx);
  args.cache_leftpad = int32_ptr(cache_leftpad);
  if (has(page_table)) {  // checked: int32, 2-d, unit stride(1)
    // batch 0: nothing to compute, and the empty table has no data pointer (a null one would
    // read as "no page table" and get the contiguous cache's checks).
    if (L.b == 0) return {out, lse};
    args.page_table = page_table->data_ptr<int32_t>();
    args.page_table_batch_stride = page_table->stride(0);
    args.page_table_max_pages = static_cast<int>(page_table->size(1));  // in [1, INT32_MAX]: checked
    args.page_table_rows = static_cast<int>(page_table->size(0));        // likewise
  }
  // rotary_seqlens only matters with rotary tables; without them it is ignored, as in FlashAttention-3.
  args.rotary_seqlens = has(rotary_cos) ? int32_ptr(rotary_seqlens) : nullptr;
  args.out = view(out);
  args.lse = lse.numel() == 0 ? flash3::TensorView{} : view(lse);  // nothing to store: "not stored"
  args.opts = make_opts(softmax_scale, causal, window_left, window_right, softcap, /*deterministic=*/false);
  set_launch_opts(&args.opts, pack_gqa, num_splits);
  if (L.varlen_q) {
    args.opts.cu_seqlens_q = cu_seqlens_q->data_ptr<int32_t>();
    args.opts.num_sequences = static_cast<int>(L.b);   // <= INT32_MAX: checked
    args.opts.max_seqlen_q = static_cast<int>(L.sq);   // likewise
  }
  // Sized from the shapes and options only (never from values on the device): CUDA-graph safe.
  const Workspace ws = caching_workspace(flash3::kvcache_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  throw_if_error(flash3::forward_kvcache(args, current_stream(q)), "kvcache forward");
  return {out, lse};
}

// An int argument of forward_plan as the library's int (ValueError outside [lo, INT32_MAX]).
int plan_int(int64_t v, const char* name, int64_t lo, const char* what) {
  if (!(v >= lo && v <= INT32_MAX)) value_error("flash3: forward_plan: ", name, " is ", v, "; expected a value in [", lo, ", 2147483647] (", what, ")");
  return static_cast<int>(v);
}

}  // namespace

// The two operators over fwd_kvcache_impl: fwd_kvcache returns a new out, fwd_kvcache_out writes
// the caller's out (out=) and returns softmax_lse.
std::tuple<Tensor, Tensor> fwd_kvcache_cuda(FLASH3_KVCACHE_PARAMS) {
  return fwd_kvcache_impl(FLASH3_KVCACHE_ARGS, std::nullopt);
}

Tensor fwd_kvcache_out_cuda(FLASH3_KVCACHE_PARAMS, const Tensor& out) {
  return std::get<1>(fwd_kvcache_impl(FLASH3_KVCACHE_ARGS, out));
}

// The forward's launch plan on the current device (flash3::forward_plan): [num_splits, pack_gqa].
// No tensor arguments: a CompositeImplicitAutograd (catch-all) kernel, so it also runs under
// torch.compile's fake tensors (it never touches a tensor).
std::vector<int64_t> forward_plan_op(at::ScalarType dtype, int64_t batch, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                     int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t head_dim_v,
                                     bool causal, int64_t window_left, int64_t window_right, double softcap,
                                     int64_t num_splits, int64_t pack_gqa) {
  if (!(dtype == at::kHalf || dtype == at::kBFloat16)) type_error("flash3: forward_plan: dtype is ", dtype_str(dtype), "; expected torch.float16 or torch.bfloat16");
  const int b = plan_int(batch, "batch", 1, "the number of sequences");
  const int sq = plan_int(max_seqlen_q, "max_seqlen_q", 1, "the longest query sequence");
  const int sk = plan_int(max_seqlen_k, "max_seqlen_k", 1, "the longest key sequence, new rows included");
  const int hq = plan_int(heads_q, "heads_q", 1, "query heads");
  const int hkv = plan_int(heads_kv, "heads_kv", 1, "key/value heads");
  const int d = plan_int(head_dim, "head_dim", 1, "q / k head dim");
  const int dv = plan_int(head_dim_v, "head_dim_v", 1, "v head dim");
  check_softcap(softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
  flash3::AttentionOptions opts = make_opts(std::nullopt, causal, window_left, window_right, softcap, false);
  set_launch_opts(&opts, pack_gqa, num_splits);
  flash3::ForwardPlan plan;
  throw_if_error(flash3::forward_plan(to_f3(dtype), b, sq, sk, hq, hkv, d, dv, opts, &plan), "forward_plan");
  return {plan.num_splits, plan.pack_gqa};
}

// CPU "kernels": only reached when every tensor argument is on the CPU.
std::tuple<Tensor, Tensor> fwd_kvcache_cpu(FLASH3_KVCACHE_PARAMS) {
  check_kvcache_inputs(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                       cache_leftpad, page_table, rotary_seqlens, cu_seqlens_q, cu_seqlens_k_new,
                       max_seqlen_q);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");  // [[noreturn]]: nothing to return
}

Tensor fwd_kvcache_out_cpu(FLASH3_KVCACHE_PARAMS, const Tensor&) {
  return std::get<1>(fwd_kvcache_cpu(FLASH3_KVCACHE_ARGS));
}

// ---------------------------------------------------------------------------
// Autograd.
// ---------------------------------------------------------------------------
namespace {

// fwd_kvcache: forward only (FlashAttention-3's flash_attn_with_kvcache has no backward either).
// This Autograd kernel runs the op below autograd, so its outputs never require grad (gradients do
// not flow to q, the caches or k / v), and spares each call the dispatcher's boxed autograd
// fallback. The caches are written in place when k / v are given: their version counters are
// bumped, as an in-place torch op would (so autograd notices if they were saved for some other
// backward); inference tensors have no version counter and are left alone.
// The caches (appending) and out= are written in place: their version counters are bumped, as an
// in-place torch op would; inference tensors have none and are left alone.
void bump_written(const std::optional<Tensor>& k, const Tensor& k_cache, const Tensor& v_cache, const Tensor* out) {
  std::vector<const Tensor*> written;
  if (has(k)) written = {&k_cache, &v_cache};
  if (out != nullptr) written.push_back(out);
  for (const Tensor* c : written)
    if (!c->is_inference()) torch::autograd::impl::bump_version(*c);
}

}  // namespace

std::tuple<Tensor, Tensor> fwd_kvcache_autograd(FLASH3_KVCACHE_PARAMS) {
  using Opt = const std::optional<Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::fwd_kvcache", "")
                       .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, Opt, Opt, Opt,
                                                         Opt, Opt, Opt, Opt, Opt, Opt, std::optional<double>, bool,
                                                         int64_t, int64_t, double, bool, int64_t, int64_t, Opt, Opt,
                                                         std::optional<int64_t>)>();
  std::tuple<Tensor, Tensor> r;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    r = op.call(FLASH3_KVCACHE_ARGS);
  }
  bump_written(k, k_cache, v_cache, nullptr);
  return r;
}

Tensor fwd_kvcache_out_autograd(FLASH3_KVCACHE_PARAMS, const Tensor& out) {
  using Opt = const std::optional<Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::fwd_kvcache_out", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, Opt, Opt, Opt, Opt, Opt, Opt, Opt,
                                     Opt, Opt, std::optional<double>, bool, int64_t, int64_t, double, bool, int64_t,
                                     int64_t, Opt, Opt, std::optional<int64_t>, const Tensor&)>();
  Tensor lse;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    lse = op.call(FLASH3_KVCACHE_ARGS, out);
  }
  bump_written(k, k_cache, v_cache, &out);
  return lse;
}

}  // namespace flash3_torch
