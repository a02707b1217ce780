// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Validation of forward_kvcache(): structure (with the attention's views
// through the generic checks), emptiness, kernel availability, device.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "api/checks.h"
#include "api/validate.h"
#include "common/cuda_check.h"
#include "launch/dispatch.h"
#include "plan/lower.h"

namespace flash3 {

using namespace checks;

// ---------------------------------------------------------------------------
// KV cache (forward_kvcache): structure, device, lowering. The attention runs
// as the varlen forward without cu_seqlens (common/varlen.h's KV-cache
// layout): q / out as (b * sq, hq, d) rows, the caches as (b_cache * s_cache,
// hkv, d) rows, lse as (hq, b * sq). kvcache_attention_args() builds those
// views and the generic checks then run on them, so the kernels' limits are
// checked in one place.
// ---------------------------------------------------------------------------
namespace {

const char* const kQDims[] = {"batch", "seqlen_q", "num_heads_q", "head_dim"};
const char* const kCacheDims[] = {"batch_cache", "seqlen_cache", "num_heads_kv", "head_dim"};
const char* const kCacheVDims[] = {"batch_cache", "seqlen_cache", "num_heads_kv", "head_dim_v"};
const char* const kNewDims[] = {"batch", "seqlen_new", "num_heads_kv", "head_dim"};
const char* const kNewVDims[] = {"batch", "seqlen_new", "num_heads_kv", "head_dim_v"};
const char* const kLseDims[] = {"batch", "num_heads_q", "seqlen_q"};
const char* const kRotaryDims[] = {"seqlen_ro", "rotary_dim / 2"};


Status check_rows_merge(const char* name, const TensorView& t, const char* const* dims) {
  if (merged_row_stride(t, 0, 1) >= 0) return Status::Ok();
  return Status::Invalid(stride_label(name, dims, 0) + " is " + std::to_string(t.stride[0]) + "; expected " +
                         std::to_string(t.shape[1] * t.stride[1]) + " = " + dim_label(name, dims, 1) + " x " +
                         stride_label(name, dims, 1) + " (forward_kvcache reads the " + dims[0] + " x " + dims[1] +
                         " rows as one dimension)");
}

Status check_ndim(const char* name, const TensorView& t, int nd, const char* const* dims) {
  std::string layout_s = "(";
  for (int i = 0; i < nd; ++i) layout_s += (i ? ", " : "") + std::string(dims[i]);
  layout_s += ")";
  if (!t.defined())
    return Status::Invalid(std::string(name) + " is missing (data is null and ndim is 0); expected a " +
                           std::to_string(nd) + "-d tensor " + layout_s);
  if (t.ndim != nd)
    return Status::Invalid(std::string(name) + ".ndim is " + std::to_string(t.ndim) + "; expected " +
                           std::to_string(nd) + ": " + layout_s);
  for (int i = 0; i < nd; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > kMaxDim)
      return Status::Invalid(dim_label(name, dims, i) + " is " + std::to_string(t.shape[i]) +
                             "; expected in [0, 2147483647]");
  }
  if (t.data == nullptr && t.numel() > 0)
    return Status::Invalid(std::string(name) + ".data is null; expected a device pointer (" + name + " has shape " +
                           shape_str(t) + ")");
  return Status::Ok();
}

Status check_dim_is(const char* name, const TensorView& t, const char* const* dims, int i, int64_t want,
                    const std::string& why) {
  if (t.shape[i] == want) return Status::Ok();
  return Status::Invalid(dim_label(name, dims, i) + " is " + std::to_string(t.shape[i]) + "; expected " +
                         std::to_string(want) + " " + why);
}

Status check_int_array(const char* name, const int* ptr) {
  if (reinterpret_cast<uintptr_t>(ptr) % alignof(int32_t) != 0)
    return Status::Invalid(std::string(name) + " (" + fmt_ptr(ptr) + ") is not 4-byte aligned; expected an int32 array");
  return Status::Ok();
}


std::string capacity_label(const KVCacheArgs& a) {
  if (a.page_table == nullptr) return std::to_string(a.k_cache.shape[1]) + " = k_cache.shape[1] (seqlen_cache)";
  return std::to_string(kvcache_capacity(a)) + " = page_table_max_pages (" + std::to_string(a.page_table_max_pages) +
         ") x k_cache.shape[1] (page_size, " + std::to_string(a.k_cache.shape[1]) + ")";
}

// The call's layout: variable-length queries or not, the sequences, and the
// views of q / out / k_new / v_new / lse by the dims the messages name.
const char* const kQ3Dims[] = {"total_q", "num_heads_q", "head_dim"};
const char* const kNew3Dims[] = {"total_new", "num_heads_kv", "head_dim"};
const char* const kNew3VDims[] = {"total_new", "num_heads_kv", "head_dim_v"};
const char* const kLse2Dims[] = {"num_heads_q", "total_q"};


// Paged caches: the table's shape and what the paged kernels do not combine with.
Status check_page_table(const KVCacheArgs& a, const KVCacheShape& s) {
  if (a.page_table == nullptr) {
    if (a.page_table_rows != 0)
      return Status::Invalid("page_table_rows is " + std::to_string(a.page_table_rows) +
                             " but page_table is null; expected 0 without a page table");
    return Status::Ok();
  }
  if (a.opts.softcap != 0.f)
    return Status::NotSupported("page_table with softcap " + fmt_float(a.opts.softcap) +
                                "; the paged kernels (the packgqa units) have no softcap yet");
  if (a.page_table_max_pages < 1)
    return Status::Invalid("page_table_max_pages is " + std::to_string(a.page_table_max_pages) +
                           "; expected >= 1 (page_table.shape[1])");
  if (a.page_table_rows < 0)
    return Status::Invalid("page_table_rows is " + std::to_string(a.page_table_rows) +
                           "; expected >= 1 (page_table.shape[0], the cache entries), or 0 for one row per sequence");
  // With cache_batch_idx the table's rows are the cache entries it picks from:
  // their number is what bounds (clamps) the index, so it must be given.
  if (a.page_table_rows == 0 && a.cache_batch_idx != nullptr)
    return Status::Invalid("page_table_rows is 0 with cache_batch_idx; expected page_table.shape[0] (the cache "
                           "entries cache_batch_idx picks page-table rows from)");
  if (a.page_table_rows > 0 && a.cache_batch_idx == nullptr && a.page_table_rows < s.b)
    return Status::Invalid("page_table_rows is " + std::to_string(a.page_table_rows) + " with " + std::to_string(s.b) +
                           " sequences and no cache_batch_idx; expected at least one row per sequence (sequence b "
                           "uses row b)");
  if (page_table_rows(a, s) > 1 && a.page_table_batch_stride < a.page_table_max_pages)
    return Status::Invalid("page_table_batch_stride is " + std::to_string(a.page_table_batch_stride) +
                           "; expected >= page_table_max_pages (" + std::to_string(a.page_table_max_pages) +
                           "): row e of page_table starts e x page_table_batch_stride elements in");
  if (a.k_cache.shape[1] < 1)
    return Status::Invalid("k_cache.shape[1] (page_size) is 0; expected >= 1 with page_table");
  if (kvcache_capacity(a) > std::numeric_limits<int32_t>::max())
    return Status::Invalid("page_table_max_pages (" + std::to_string(a.page_table_max_pages) + ") x page_size (" +
                           std::to_string(a.k_cache.shape[1]) + ") is " + std::to_string(kvcache_capacity(a)) +
                           " rows; expected <= 2147483647 (int32 row positions)");
  // The gathering kernels address pool rows in int32.
  if (a.k_cache.shape[0] * a.k_cache.shape[1] > std::numeric_limits<int32_t>::max())
    return Status::Invalid("k_cache holds " + std::to_string(a.k_cache.shape[0]) + " pages x " +
                           std::to_string(a.k_cache.shape[1]) + " rows; expected fewer than 2^31 rows in the pool");
  return check_int_array("page_table", a.page_table);
}


// The options forward_kvcache takes: the scalar ones as every entry point,
// and for variable-length queries cu_seqlens_q / max_seqlen_q /
// num_sequences (the keys are the cache's).
Status check_kvcache_options(const AttentionOptions& o) {
  if (o.cu_seqlens_k != nullptr)
    return Status::Invalid("opts.cu_seqlens_k is set; expected null: forward_kvcache's keys are each sequence's cache "
                           "rows (cache_seqlens), and variable-length new rows come with cu_seqlens_k_new");
  if (o.seqused_q != nullptr || o.seqused_k != nullptr)
    return Status::Invalid("opts.seqused_q / opts.seqused_k are set; forward_kvcache takes the cache fill from "
                           "cache_seqlens and the query lengths from opts.cu_seqlens_q");
  AttentionOptions scalar = o;  // the shared checks, without the varlen pair rule
  scalar.cu_seqlens_q = nullptr;
  scalar.max_seqlen_q = scalar.max_seqlen_k = 0;
  FLASH3_RETURN_IF_ERROR(check_options(scalar));
  if (o.cu_seqlens_q == nullptr) {
    if (o.num_sequences != 0 || o.max_seqlen_q != 0)
      return Status::Invalid("opts.num_sequences / opts.max_seqlen_q are " + std::to_string(o.num_sequences) + " / " +
                             std::to_string(o.max_seqlen_q) + " but opts.cu_seqlens_q is null; expected 0 (q is "
                             "(batch, seqlen_q, num_heads_q, head_dim))");
    return Status::Ok();
  }
  if (o.num_sequences < 0 || o.num_sequences > kMaxNumSequences)
    return Status::Invalid("opts.num_sequences is " + std::to_string(o.num_sequences) + "; expected in [0, " +
                           std::to_string(kMaxNumSequences) + "] (cu_seqlens_q has num_sequences + 1 entries)");
  if (o.max_seqlen_q < 0)
    return Status::Invalid("opts.max_seqlen_q is " + std::to_string(o.max_seqlen_q) +
                           "; expected >= 0 (the longest query sequence; 0: every sequence empty)");
  return check_int_array("opts.cu_seqlens_q", o.cu_seqlens_q);
}

// q, the caches and out: ranks, dtypes, head dims, heads, shapes, layouts.
Status check_kvcache_tensors(const KVCacheArgs& a, const KVCacheShape& s) {
  const char* const* qdims = s.varlen_q ? kQ3Dims : kQDims;
  const Arg q{"q", &a.q, Role::kQ, false};
  const Arg kc{"k_cache", &a.k_cache, Role::kK, false};
  const Arg vc{"v_cache", &a.v_cache, Role::kV, false};
  const Arg out{"out", &a.out, Role::kO, true};
  FLASH3_RETURN_IF_ERROR(check_ndim("q", a.q, s.qd, qdims));
  FLASH3_RETURN_IF_ERROR(check_ndim("k_cache", a.k_cache, 4, kCacheDims));
  FLASH3_RETURN_IF_ERROR(check_ndim("v_cache", a.v_cache, 4, kCacheVDims));
  FLASH3_RETURN_IF_ERROR(check_ndim("out", a.out, s.qd, qdims));
  FLASH3_RETURN_IF_ERROR(check_qdtype(q, false, "forward_kvcache"));
  for (const Arg* t : {&kc, &vc, &out}) FLASH3_RETURN_IF_ERROR(check_same_dtype(*t, q));
  const int64_t bc = a.k_cache.shape[0], sc = a.k_cache.shape[1];
  // Head dims: k_cache's matches q's, both in range (out's is checked with its shape).
  FLASH3_RETURN_IF_ERROR(check_dim_is("k_cache", a.k_cache, kCacheDims, 3, s.d, "to match q's head_dim"));
  FLASH3_RETURN_IF_ERROR(check_head_dim_range(q, s.varlen_q));
  FLASH3_RETURN_IF_ERROR(check_head_dim_range(vc, false));
  FLASH3_RETURN_IF_ERROR(check_softcap_ratio(a.opts, s.d));
  FLASH3_RETURN_IF_ERROR(check_dim_is("v_cache", a.v_cache, kCacheVDims, 0, bc, "to match k_cache"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("v_cache", a.v_cache, kCacheVDims, 1, sc, "to match k_cache"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("v_cache", a.v_cache, kCacheVDims, 2, s.hkv, "to match k_cache"));
  if (s.hq < 1 || s.hkv < 1 || s.hq % s.hkv != 0)
    return Status::Invalid(dim_label("q", qdims, s.qd - 2) + " (num_heads_q) is " + std::to_string(s.hq) +
                           " and k_cache.shape[2] (num_heads_kv) " + std::to_string(s.hkv) +
                           "; expected both >= 1 and num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  FLASH3_RETURN_IF_ERROR(check_page_table(a, s));
  if (a.page_table == nullptr && a.cache_batch_idx == nullptr && bc < s.b)
    return Status::Invalid("k_cache.shape[0] (batch_cache) is " + std::to_string(bc) + " and there are " +
                           std::to_string(s.b) + " sequences; expected batch_cache >= the number of sequences when "
                           "cache_batch_idx is null (sequence b reads cache entry b)");
  const std::string out_why = "to match q's rows and heads and v_cache's head_dim_v";
  for (int i = 0; i < s.qd - 1; ++i)
    FLASH3_RETURN_IF_ERROR(check_dim_is("out", a.out, qdims, i, a.q.shape[i], out_why));
  FLASH3_RETURN_IF_ERROR(check_dim_is("out", a.out, qdims, s.qd - 1, s.dv, out_why));
  for (const Arg* t : {&q, &out}) FLASH3_RETURN_IF_ERROR(check_layout(*t, s.varlen_q));
  for (const Arg* t : {&kc, &vc}) FLASH3_RETURN_IF_ERROR(check_layout(*t, false));
  if (!s.varlen_q) {
    FLASH3_RETURN_IF_ERROR(check_rows_merge("q", a.q, kQDims));
    FLASH3_RETURN_IF_ERROR(check_rows_merge("out", a.out, kQDims));
  }
  FLASH3_RETURN_IF_ERROR(check_rows_merge("k_cache", a.k_cache, kCacheDims));
  FLASH3_RETURN_IF_ERROR(check_rows_merge("v_cache", a.v_cache, kCacheVDims));
  // The gathering kernels step rows in int32 byte offsets.
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"k_cache", &a.k_cache},
                                {"v_cache", &a.v_cache}}) {
    const int64_t row_bytes = rows_view(*t).stride[0] * dtype_size(t->dtype);
    if (row_bytes > std::numeric_limits<int32_t>::max())
      return Status::Invalid(std::string(name) + "'s rows are " + std::to_string(row_bytes) +
                             " bytes apart; expected below 2^31 bytes");
  }
  return Status::Ok();
}

// The new rows k_new / v_new (fixed or variable length) and what they write.
Status check_kvcache_new_rows(const KVCacheArgs& a, const KVCacheShape& s) {
  const bool has_k = a.k_new.defined(), has_v = a.v_new.defined();
  if (has_k != has_v)
    return Status::Invalid(std::string(has_k ? "k_new is set but v_new is not" : "v_new is set but k_new is not") +
                           "; expected both or neither");
  if (!has_k) {
    if (s.varlen_new)
      return Status::Invalid("cu_seqlens_k_new is set but k_new / v_new are not; expected the new rows it describes");
    return Status::Ok();
  }
  const Arg q{"q", &a.q, Role::kQ, false};
  const Arg kn{"k_new", &a.k_new, Role::kK, false};
  const Arg vn{"v_new", &a.v_new, Role::kV, false};
  const int nd = s.varlen_new ? 3 : 4;
  const char* const* kdims = s.varlen_new ? kNew3Dims : kNewDims;
  const char* const* vdims = s.varlen_new ? kNew3VDims : kNewVDims;
  FLASH3_RETURN_IF_ERROR(check_ndim("k_new", a.k_new, nd, kdims));
  FLASH3_RETURN_IF_ERROR(check_ndim("v_new", a.v_new, nd, vdims));
  FLASH3_RETURN_IF_ERROR(check_same_dtype(kn, q));
  FLASH3_RETURN_IF_ERROR(check_same_dtype(vn, q));
  const int H = nd - 2;
  if (!s.varlen_new) {
    FLASH3_RETURN_IF_ERROR(check_dim_is("k_new", a.k_new, kdims, 0, s.b, "to match the number of sequences"));
    FLASH3_RETURN_IF_ERROR(check_dim_is("v_new", a.v_new, vdims, 0, s.b, "to match the number of sequences"));
  }
  FLASH3_RETURN_IF_ERROR(check_dim_is("v_new", a.v_new, vdims, H - 1, a.k_new.shape[H - 1],
                                      std::string("to match k_new.shape[") + std::to_string(H - 1) + "]"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("k_new", a.k_new, kdims, H, s.hkv, "to match k_cache.shape[2] (num_heads_kv)"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("v_new", a.v_new, vdims, H, s.hkv, "to match k_cache.shape[2] (num_heads_kv)"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("k_new", a.k_new, kdims, H + 1, s.d, "to match q's head_dim"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("v_new", a.v_new, vdims, H + 1, s.dv, "to match v_cache.shape[3] (head_dim_v)"));
  FLASH3_RETURN_IF_ERROR(check_layout(kn, s.varlen_new));
  FLASH3_RETURN_IF_ERROR(check_layout(vn, s.varlen_new));
  const int64_t sn = s.varlen_new ? 0 : a.k_new.shape[1];
  if (sn > kvcache_capacity(a))
    return Status::Invalid("k_new.shape[1] (seqlen_new) is " + std::to_string(sn) + "; expected <= " +
                           capacity_label(a) + ": the cache is too small for the new rows");
  if (a.cache_seqlens == nullptr)
    return Status::Invalid("k_new is set but cache_seqlens is null; expected cache_seqlens (where the new rows go)");
  if (s.varlen_new) FLASH3_RETURN_IF_ERROR(check_int_array("cu_seqlens_k_new", a.cu_seqlens_k_new));
  // The caches are written: they must not share memory with what is read.
  FLASH3_RETURN_IF_ERROR(check_written_layout("k_cache", a.k_cache, kCacheDims));
  FLASH3_RETURN_IF_ERROR(check_written_layout("v_cache", a.v_cache, kCacheVDims));
  const Arg kcw{"k_cache", &a.k_cache, Role::kK, true};
  const Arg vcw{"v_cache", &a.v_cache, Role::kV, true};
  FLASH3_RETURN_IF_ERROR(check_no_alias(kcw, {&q, &kn, &vn, &vcw}));
  FLASH3_RETURN_IF_ERROR(check_no_alias(vcw, {&q, &kn, &vn}));
  return Status::Ok();
}

// The rotary tables (they need new rows) and rotary_seqlens.
Status check_kvcache_rotary(const KVCacheArgs& a, const KVCacheShape& s) {
  const bool has_cos = a.rotary_cos.defined(), has_sin = a.rotary_sin.defined();
  if (has_cos != has_sin)
    return Status::Invalid(std::string(has_cos ? "rotary_cos is set but rotary_sin is not" :
                                                 "rotary_sin is set but rotary_cos is not") +
                           "; expected both or neither");
  if (a.rotary_seqlens != nullptr && !has_cos)
    return Status::Invalid("rotary_seqlens is set but rotary_cos / rotary_sin are not; expected the rotary tables");
  if (!has_cos) return Status::Ok();
  if (!a.k_new.defined())
    return Status::Invalid("rotary_cos / rotary_sin are set but k_new is not; expected k_new and v_new (rotary "
                           "applies to the appended keys and to q)");
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"rotary_cos", &a.rotary_cos},
                                std::pair<const char*, const TensorView*>{"rotary_sin", &a.rotary_sin}}) {
    FLASH3_RETURN_IF_ERROR(check_ndim(name, *t, 2, kRotaryDims));
    if (t->dtype != a.q.dtype)
      return Status::Invalid(std::string(name) + ".dtype is " + dtype_str(t->dtype) + "; expected " +
                             dtype_str(a.q.dtype) + " to match q.dtype");
    FLASH3_RETURN_IF_ERROR(check_strides_nonnegative(name, *t, kRotaryDims));
    FLASH3_RETURN_IF_ERROR(check_last_contiguous(name, *t, kRotaryDims));
    FLASH3_RETURN_IF_ERROR(check_aligned(name, *t, dtype_size(t->dtype), ""));
    FLASH3_RETURN_IF_ERROR(check_span_fits(name, *t));
  }
  const int64_t half = a.rotary_cos.shape[1];
  if (half < 1 || 2 * half > s.d)
    return Status::Invalid("rotary_cos.shape[1] (rotary_dim / 2) is " + std::to_string(half) + "; expected in [1, " +
                           std::to_string(s.d / 2) + "] (rotary_dim <= head_dim " + std::to_string(s.d) + ")");
  FLASH3_RETURN_IF_ERROR(check_dim_is("rotary_sin", a.rotary_sin, kRotaryDims, 0, a.rotary_cos.shape[0],
                                      "to match rotary_cos"));
  FLASH3_RETURN_IF_ERROR(check_dim_is("rotary_sin", a.rotary_sin, kRotaryDims, 1, half, "to match rotary_cos"));
  if (a.rotary_cos.shape[0] < kvcache_capacity(a))
    return Status::Invalid("rotary_cos.shape[0] (seqlen_ro) is " + std::to_string(a.rotary_cos.shape[0]) +
                           "; expected >= " + capacity_label(a) + ": a position in the cache needs its row of "
                           "the tables");
  return Status::Ok();
}

// lse: (b, hq, sq) with batch stride sq and row stride 1 (the kernels'
// (hq, b * sq)), or for varlen queries (hq, total_q) with row stride 1.
Status check_kvcache_lse(const KVCacheArgs& a, const KVCacheShape& s) {
  if (!a.lse.defined()) return Status::Ok();
  const Arg l{"lse", &a.lse, Role::kLse, true};
  if (s.varlen_q) {
    FLASH3_RETURN_IF_ERROR(check_ndim("lse", a.lse, 2, kLse2Dims));
    FLASH3_RETURN_IF_ERROR(check_fp32(l));
    FLASH3_RETURN_IF_ERROR(check_dim_is("lse", a.lse, kLse2Dims, 0, s.hq, "to match q's num_heads_q"));
    FLASH3_RETURN_IF_ERROR(check_dim_is("lse", a.lse, kLse2Dims, 1, s.total_q, "to match q.shape[0] (total_q)"));
    FLASH3_RETURN_IF_ERROR(check_strides_nonnegative("lse", a.lse, kLse2Dims));
    FLASH3_RETURN_IF_ERROR(check_aligned("lse", a.lse, 4, ""));
    FLASH3_RETURN_IF_ERROR(check_span_fits("lse", a.lse));
    if (s.total_q > 1 && a.lse.stride[1] != 1)
      return Status::Invalid("lse.stride[1] (total_q) is " + std::to_string(a.lse.stride[1]) + "; expected 1");
    return Status::Ok();
  }
  FLASH3_RETURN_IF_ERROR(check_ndim("lse", a.lse, 3, kLseDims));
  FLASH3_RETURN_IF_ERROR(check_fp32(l));
  const int64_t want[3] = {s.b, s.hq, s.sq};
  for (int i = 0; i < 3; ++i)
    FLASH3_RETURN_IF_ERROR(check_dim_is("lse", a.lse, kLseDims, i, want[i], "to match (q's batch, num_heads_q, seqlen_q)"));
  FLASH3_RETURN_IF_ERROR(check_strides_nonnegative("lse", a.lse, kLseDims));
  FLASH3_RETURN_IF_ERROR(check_aligned("lse", a.lse, 4, ""));
  FLASH3_RETURN_IF_ERROR(check_span_fits("lse", a.lse));
  // The kernels write lse as (hq, b * sq): batch and seqlen_q rows one element apart.
  TensorView rows = a.lse;
  rows.stride[1] = rows.stride[2];
  rows.shape[1] = rows.shape[2];
  if (s.b * s.sq > 1 && merged_row_stride(rows, 0, 1) != 1)
    return Status::Invalid("lse has strides " + stride_str(a.lse) + "; expected lse.stride[2] (seqlen_q) == 1 and "
                           "lse.stride[0] (batch) == seqlen_q (" + std::to_string(s.sq) + "): forward_kvcache writes "
                           "lse as (num_heads_q, batch * seqlen_q), e.g. a (batch, heads, seqlen_q) view of an "
                           "(heads, batch, seqlen_q) buffer");
  return Status::Ok();
}

// What the kernels read while they write out, lse and (appending) the
// caches: the int32 arrays, the page table and the rotary tables.
Status check_kvcache_reads_not_written(const KVCacheArgs& a, const KVCacheShape& s) {
  const TensorView seqlens = int_array_view(a.cache_seqlens, s.b);
  const TensorView batch_idx = int_array_view(a.cache_batch_idx, s.b);
  const TensorView leftpad = int_array_view(a.cache_leftpad, s.b);
  const TensorView rot_seqlens = int_array_view(a.rotary_seqlens, s.b);
  const TensorView cu_q = int_array_view(a.opts.cu_seqlens_q, s.b + 1);
  const TensorView cu_new = int_array_view(a.cu_seqlens_k_new, s.b + 1);
  TensorView pages = int_array_view(a.page_table, 0);
  if (a.page_table != nullptr) {  // (rows, max_pages), rows page_table_batch_stride apart
    pages.ndim = 2;
    pages.shape[0] = page_table_rows(a, s);
    pages.stride[0] = pages.shape[0] > 1 ? a.page_table_batch_stride : 0;
    pages.shape[1] = a.page_table_max_pages;
    pages.stride[1] = 1;
    if (!check_span_fits("page_table", pages).ok())
      return Status::Invalid("page_table_batch_stride is " + std::to_string(a.page_table_batch_stride) + " with " +
                             std::to_string(pages.shape[0]) + " rows: the table's last entry lies past 2^63 bytes; "
                             "expected a stride that fits in memory");
  }
  const Arg reads[] = {{"cache_seqlens", &seqlens, Role::kLse, false},  {"cache_batch_idx", &batch_idx, Role::kLse, false},
                       {"cache_leftpad", &leftpad, Role::kLse, false},  {"rotary_seqlens", &rot_seqlens, Role::kLse, false},
                       {"opts.cu_seqlens_q", &cu_q, Role::kLse, false}, {"cu_seqlens_k_new", &cu_new, Role::kLse, false},
                       {"page_table", &pages, Role::kLse, false},       {"rotary_cos", &a.rotary_cos, Role::kLse, false},
                       {"rotary_sin", &a.rotary_sin, Role::kLse, false}};
  const Arg out{"out", &a.out, Role::kO, true};
  const Arg lse{"lse", &a.lse, Role::kLse, true};
  const Arg kc{"k_cache", &a.k_cache, Role::kK, true};
  const Arg vc{"v_cache", &a.v_cache, Role::kV, true};
  const bool appends = a.k_new.defined();
  for (const Arg* w : {&out, &lse, &kc, &vc}) {
    if ((w == &kc || w == &vc) && !appends) continue;
    if (w == &lse && !a.lse.defined()) continue;
    for (const Arg& r : reads) FLASH3_RETURN_IF_ERROR(check_no_alias(*w, {&r}));
  }
  return Status::Ok();
}

}  // namespace

namespace {
// The calls that need the serving work not yet run on a GPU (CMake option
// FLASH3_SERVING_WIP, off by default): kNotSupported naming it.
Status check_kvcache_built(const KVCacheArgs& a, const KVCacheShape& s) {
  if (FLASH3_SERVING_WIP) return Status::Ok();
  const char* why = " (built without FLASH3_SERVING_WIP: that path has not run on a GPU yet)";
  if (s.varlen_q) return Status::NotSupported(std::string("variable-length queries with a KV cache (opts.cu_seqlens_q)") + why);
  if (s.varlen_new) return Status::NotSupported(std::string("variable-length new rows (cu_seqlens_k_new)") + why);
  if (a.page_table != nullptr && a.cache_batch_idx != nullptr)
    return Status::NotSupported(std::string("page_table together with cache_batch_idx") + why);
  if (a.page_table != nullptr && a.cache_leftpad != nullptr)
    return Status::NotSupported(std::string("page_table together with cache_leftpad") + why);
  if (a.page_table != nullptr && a.page_table_rows != 0 && a.page_table_rows != s.b)
    return Status::NotSupported("page_table_rows " + std::to_string(a.page_table_rows) + " other than the " +
                                std::to_string(s.b) + " sequences" + why);
  return Status::Ok();
}
}  // namespace

Status check_kvcache_structure(const KVCacheArgs& a) {
  FLASH3_RETURN_IF_ERROR(check_kvcache_options(a.opts));
  const KVCacheShape s = kvcache_shape(a);
  FLASH3_RETURN_IF_ERROR(check_kvcache_tensors(a, s));
  FLASH3_RETURN_IF_ERROR(check_kvcache_new_rows(a, s));
  FLASH3_RETURN_IF_ERROR(check_kvcache_rotary(a, s));
  FLASH3_RETURN_IF_ERROR(check_kvcache_lse(a, s));
  for (const auto& [name, ptr] : {std::pair<const char*, const int*>{"cache_seqlens", a.cache_seqlens},
                                  {"cache_batch_idx", a.cache_batch_idx},
                                  {"cache_leftpad", a.cache_leftpad},
                                  {"rotary_seqlens", a.rotary_seqlens}})
    FLASH3_RETURN_IF_ERROR(check_int_array(name, ptr));
  // The attention's views, through the generic checks (sizes, spans, int32
  // row limits, outputs not aliasing inputs).
  const ForwardArgs f = kvcache_attention_args(a);
  const Arg fq{"q", &f.q, Role::kQ, false};
  const Arg fk{"k_cache", &f.k, Role::kK, false};
  const Arg fv{"v_cache", &f.v, Role::kV, false};
  const Arg fo{"out", &f.out, Role::kO, true};
  const Arg fl{"lse", &f.lse, Role::kLse, true};
  for (const Arg* t : {&fq, &fk, &fv, &fo}) FLASH3_RETURN_IF_ERROR(check_layout(*t, true));
  FLASH3_RETURN_IF_ERROR(check_limits(fq, fk, f.opts, true));
  const Arg kn{"k_new", &a.k_new, Role::kK, false};
  const Arg vn{"v_new", &a.v_new, Role::kV, false};
  const bool has_k = a.k_new.defined();
  const Arg* kn_p = has_k ? &kn : &fq;
  const Arg* vn_p = has_k ? &vn : &fq;
  FLASH3_RETURN_IF_ERROR(check_no_alias(fo, {&fq, &fk, &fv, kn_p, vn_p}));
  if (a.lse.defined()) {
    FLASH3_RETURN_IF_ERROR(check_written_layout("lse", f.lse, dim_names(Role::kLse, true)));
    FLASH3_RETURN_IF_ERROR(check_no_alias(fl, {&fq, &fk, &fv, &fo, kn_p, vn_p}));
  }
  FLASH3_RETURN_IF_ERROR(check_kvcache_reads_not_written(a, s));
  return check_kvcache_built(a, s);
}

// Nothing to compute: no sequence, or no query row (fixed: seqlen_q 0 with
// nothing to append; varlen: total_q 0 or max_seqlen_q 0, every sequence
// empty by contract) and nothing to append.
bool kvcache_is_empty(const KVCacheArgs& a) {
  const KVCacheShape s = kvcache_shape(a);
  if (s.b == 0) return true;
  const bool no_queries = s.total_q == 0 || s.sq == 0;
  const bool no_new_rows = !a.k_new.defined() || a.k_new.numel() == 0;
  return no_queries && no_new_rows;
}

Status check_attention_options(const AttentionOptions& opts) { return check_options(opts); }

Status check_kvcache_device(const KVCacheArgs& a) {
  return check_device_pointers({{"q.data", a.q.data},
                                {"k_cache.data", a.k_cache.data},
                                {"v_cache.data", a.v_cache.data},
                                {"k_new.data", a.k_new.data},
                                {"v_new.data", a.v_new.data},
                                {"rotary_cos.data", a.rotary_cos.data},
                                {"rotary_sin.data", a.rotary_sin.data},
                                {"out.data", a.out.data},
                                {"lse.data", a.lse.data},
                                {"cache_seqlens", a.cache_seqlens},
                                {"cache_batch_idx", a.cache_batch_idx},
                                {"cache_leftpad", a.cache_leftpad},
                                {"rotary_seqlens", a.rotary_seqlens},
                                {"page_table", a.page_table},
                                {"opts.cu_seqlens_q", a.opts.cu_seqlens_q},
                                {"cu_seqlens_k_new", a.cu_seqlens_k_new},
                                {"workspace", a.workspace}});
}

Status validate_kvcache(const KVCacheArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_kvcache_structure(args));
  if (kvcache_is_empty(args)) return Status::Ok();
  const KVCacheShape s = kvcache_shape(args);  // (q is 3-d with cu_seqlens_q)
  const int d = static_cast<int>(s.d), dv = static_cast<int>(s.dv);
  FLASH3_RETURN_IF_ERROR(check_kernel_built(true, args.q.dtype, d, dv, args.opts.softcap));
  if (args.page_table != nullptr && !fwd_pack_kernel_built(args.q.dtype, d, dv))
    return Status::NotSupported(std::string("page_table: paged caches run in the forward's packgqa unit, which is not "
                                            "built for dtype ") + dtype_name(args.q.dtype) + ", head_dim " +
                                std::to_string(d) + " (build with FLASH3_FEATURES containing packgqa)");
  if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_kvcache_device(args));
  return Status::Ok();
}

}  // namespace flash3
