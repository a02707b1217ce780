// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// C ABI over the C++ API (flash3_c.h). No exception crosses this boundary; the
// message of the last failure on the calling thread is kept in a thread_local
// string (successful calls leave it unchanged).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "flash3/flash3_c.h"

static_assert(static_cast<int>(flash3::StatusCode::kOk) == FLASH3_OK, "status mismatch");
static_assert(static_cast<int>(flash3::StatusCode::kInvalidArgument) == FLASH3_INVALID_ARGUMENT, "status mismatch");
static_assert(static_cast<int>(flash3::StatusCode::kNotSupported) == FLASH3_NOT_SUPPORTED, "status mismatch");
static_assert(static_cast<int>(flash3::StatusCode::kCudaError) == FLASH3_CUDA_ERROR, "status mismatch");
static_assert(static_cast<int>(flash3::StatusCode::kInternal) == FLASH3_INTERNAL, "status mismatch");
static_assert(static_cast<int>(flash3::DType::kFloat16) == FLASH3_FP16, "dtype mismatch");
static_assert(static_cast<int>(flash3::DType::kBFloat16) == FLASH3_BF16, "dtype mismatch");
static_assert(static_cast<int>(flash3::DType::kFloat32) == FLASH3_FP32, "dtype mismatch");
static_assert(static_cast<int>(flash3::DType::kFloat8E4M3) == FLASH3_FP8_E4M3, "dtype mismatch");

namespace {

thread_local std::string g_last_error;

void set_last_error(const char* where, const std::string& msg) noexcept {
  try {
    g_last_error = std::string(where) + ": " + msg;
  } catch (...) {
    // Out of memory while recording the message: keep whatever was there.
  }
}

flash3_status report(const char* where, const flash3::Status& s) noexcept {
  if (s.ok()) return FLASH3_OK;
  set_last_error(where, s.message);
  switch (s.code) {
    case flash3::StatusCode::kInvalidArgument: return FLASH3_INVALID_ARGUMENT;
    case flash3::StatusCode::kNotSupported: return FLASH3_NOT_SUPPORTED;
    case flash3::StatusCode::kCudaError: return FLASH3_CUDA_ERROR;
    default: return FLASH3_INTERNAL;
  }
}

flash3_status report_exception(const char* where) noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    set_last_error(where, "out of host memory");
  } catch (const std::exception& e) {
    set_last_error(where, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    set_last_error(where, "unexpected exception");
  }
  return FLASH3_INTERNAL;
}

bool valid_dtype(int32_t d) { return d >= FLASH3_FP16 && d <= FLASH3_FP8_E4M3; }

// NULL -> an undefined view (missing / not stored; validation reports it where required).
flash3::Status to_view(const flash3_tensor* t, const char* name, flash3::TensorView* out) {
  *out = flash3::TensorView{};
  if (t == nullptr) return flash3::Status::Ok();
  if (!valid_dtype(t->dtype))
    return flash3::Status::Invalid(std::string(name) + ".dtype is " + std::to_string(t->dtype) +
                                   "; expected FLASH3_FP16 (0), FLASH3_BF16 (1), FLASH3_FP32 (2) or FLASH3_FP8_E4M3 (3)");
  if (t->ndim < 0 || t->ndim > 4)
    return flash3::Status::Invalid(std::string(name) + ".ndim is " + std::to_string(t->ndim) + "; expected 0 to 4");
  out->data = t->data;
  out->dtype = static_cast<flash3::DType>(t->dtype);
  out->ndim = t->ndim;
  // flash3_tensor has 4 dims, TensorView kMaxTensorDims: the rest stay 0.
  for (int i = 0; i < flash3::kMaxTensorDims; ++i) {
    out->shape[i] = i < t->ndim ? t->shape[i] : 0;
    out->stride[i] = i < t->ndim ? t->stride[i] : 0;
  }
  return flash3::Status::Ok();
}

// flash3_combine's partials: a per-split view t (ndim dims, NULL: missing)
// plus the split dimension in front, (num_splits, t...) with the given stride.
// Errors name the C arguments.
flash3::Status split_view(const flash3_tensor* t, const char* name, int ndim, int32_t num_splits, int64_t split_stride,
                          flash3::TensorView* out) {
  *out = flash3::TensorView{};
  if (t == nullptr)
    return flash3::Status::Invalid(std::string(name) + " is NULL; expected a " + std::to_string(ndim) +
                                   "-d fp32 tensor (the view of split 0)");
  flash3::TensorView v;
  flash3::Status s = to_view(t, name, &v);
  if (!s.ok()) return s;
  if (v.ndim != ndim)
    return flash3::Status::Invalid(std::string(name) + ".ndim is " + std::to_string(v.ndim) + "; expected " +
                                   std::to_string(ndim) + " (the view of split 0; the split dimension is " +
                                   "num_splits / " + name + "_split_stride)");
  if (num_splits < 1 || num_splits > 256)
    return flash3::Status::Invalid("num_splits is " + std::to_string(num_splits) + "; expected 1 to 256");
  if (num_splits > 1 && split_stride < 0)
    return flash3::Status::Invalid(std::string(name) + "_split_stride is " + std::to_string(split_stride) +
                                   "; expected >= 0 (negative strides are not supported)");
  *out = v;
  out->ndim = ndim + 1;
  out->shape[0] = num_splits;
  out->stride[0] = split_stride;
  for (int i = 0; i < ndim; ++i) {
    out->shape[i + 1] = v.shape[i];
    out->stride[i + 1] = v.stride[i];
  }
  return flash3::Status::Ok();
}

// The bytes of flash3_options up to and including `field`: a caller's struct
// has the field iff its struct_size is at least this.
#define FLASH3_OPTIONS_END(field) (offsetof(flash3_options, field) + sizeof(flash3_options::field))

// sizeof() of the layout ending at pack_gqa: its end rounded up to the
// struct's alignment (the pointers'), i.e. with the trailing padding that
// num_splits now occupies.
constexpr size_t kPackGqaLayoutSize =
    (FLASH3_OPTIONS_END(pack_gqa) + alignof(flash3_options) - 1) / alignof(flash3_options) * alignof(flash3_options);
static_assert(kPackGqaLayoutSize < sizeof(flash3_options),
              "reserved0 must keep this header's size apart from the pack_gqa layout's");
static_assert(FLASH3_OPTIONS_END(num_splits) <= kPackGqaLayoutSize,
              "num_splits sits in the pack_gqa layout's padding: read it only from this header's size");

// struct_size values this library accepts: this header's size and those of
// the layouts before num_splits (ending at pack_gqa, padding included) and
// before pack_gqa (ending at seqused_k), whose callers keep working; the
// fields a smaller struct lacks are skipped below (has()) and keep their
// defaults. The first layout (ending at max_seqlen_k) was replaced before
// any release and stays rejected.
bool accepted_options_size(uint32_t size) {
  return size == sizeof(flash3_options) || size == kPackGqaLayoutSize || size == FLASH3_OPTIONS_END(seqused_k);
}

// NULL -> the defaults. struct_size says which fields the caller's header had.
flash3::Status to_options(const flash3_options* o, flash3::AttentionOptions* r) {
  *r = flash3::AttentionOptions{};
  if (o == nullptr) return flash3::Status::Ok();
  if (!accepted_options_size(o->struct_size))
    return flash3::Status::Invalid("opts->struct_size is " + std::to_string(o->struct_size) + "; expected " +
                                   std::to_string(sizeof(flash3_options)) +
                                   " (sizeof(flash3_options)): initialise the options with flash3_default_options()");
  const auto has = [o](size_t end) { return o->struct_size >= end; };
  // The first layout (up to max_seqlen_k): every accepted size has it.
  r->softmax_scale = o->softmax_scale;
  r->causal = o->causal != 0;
  r->window_left = o->window_left;
  r->window_right = o->window_right;
  r->softcap = o->softcap;
  r->deterministic = o->deterministic != 0;
  r->cu_seqlens_q = o->cu_seqlens_q;
  r->cu_seqlens_k = o->cu_seqlens_k;
  r->max_seqlen_q = o->max_seqlen_q;
  r->max_seqlen_k = o->max_seqlen_k;
  // Appended later: read only from a struct that has them (an older,
  // smaller one keeps the defaults: fixed length, pack_gqa -1).
  if (has(FLASH3_OPTIONS_END(num_sequences))) r->num_sequences = o->num_sequences;
  if (has(FLASH3_OPTIONS_END(seqused_q))) r->seqused_q = o->seqused_q;
  if (has(FLASH3_OPTIONS_END(seqused_k))) r->seqused_k = o->seqused_k;
  if (has(FLASH3_OPTIONS_END(pack_gqa))) r->pack_gqa = o->pack_gqa;
  // Not has(END(num_splits)): the pack_gqa layout's size covers num_splits's
  // bytes (its padding); only this header's size has the field.
  if (has(FLASH3_OPTIONS_END(reserved0))) r->num_splits = o->num_splits;
  return flash3::Status::Ok();
}

#define FLASH3_C_TRY(where, expr)                 \
  do {                                            \
    ::flash3::Status _st = (expr);                \
    if (!_st.ok()) return report(where, _st);     \
  } while (0)

flash3::Status forward_args(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                            const flash3_tensor* out, const flash3_tensor* lse, const flash3_options* opts,
                            flash3::ForwardArgs* a) {
  const struct {
    const flash3_tensor* t;
    const char* name;
    flash3::TensorView* view;
  } items[] = {{q, "q", &a->q}, {k, "k", &a->k}, {v, "v", &a->v}, {out, "out", &a->out}, {lse, "lse", &a->lse}};
  for (const auto& it : items) {
    flash3::Status s = to_view(it.t, it.name, it.view);
    if (!s.ok()) return s;
  }
  return to_options(opts, &a->opts);
}

// flash3_forward and flash3_forward_with_workspace (workspace NULL: allocated
// by flash3::forward); errors are reported as `where`'s.
flash3_status forward_impl(const char* where, const flash3_tensor* q, const flash3_tensor* k,
                           const flash3_tensor* v, const flash3_tensor* out, const flash3_tensor* lse,
                           const flash3_options* opts, void* workspace, size_t workspace_bytes,
                           void* stream) noexcept {
  try {
    flash3::ForwardArgs a;
    FLASH3_C_TRY(where, forward_args(q, k, v, out, lse, opts, &a));
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    return report(where, flash3::forward(a, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return report_exception(where);
  }
}

// sizeof() of the flash3_kvcache_args layout before the paged-KV fields (the
// struct ending at rotary_seqlens). That layout holds only uint32_t / int32_t
// and pointers, so its alignment is a pointer's and its size (rotary_seqlens's
// end, a pointer's end) has no trailing padding; page_table, a pointer too,
// starts right there. So offsetof(page_table) is exactly that layout's sizeof
// (112 on LP64, 60 on ILP32), whatever the alignment of the int64_t appended
// after it, and is smaller than this header's sizeof: the two accepted
// struct_size values never coincide.
constexpr size_t kPrePagedKVCacheArgsSize = offsetof(flash3_kvcache_args, page_table);
static_assert(kPrePagedKVCacheArgsSize == offsetof(flash3_kvcache_args, rotary_seqlens) + sizeof(const int32_t*),
              "page_table must follow rotary_seqlens with no padding between them");
static_assert(kPrePagedKVCacheArgsSize % alignof(const int32_t*) == 0,
              "the pre-paged layout ends at a pointer boundary (no trailing padding)");
static_assert(kPrePagedKVCacheArgsSize < sizeof(flash3_kvcache_args),
              "the pre-paged layout's size must differ from this header's");
// sizeof() of the layout ending at page_table_max_pages (before
// page_table_rows, which sits in that layout's trailing padding, and
// cu_seqlens_k_new): cu_seqlens_k_new is a pointer, so it starts at the
// first pointer boundary after page_table_rows, which is that layout's end.
constexpr size_t kPagedKVCacheArgsSize = offsetof(flash3_kvcache_args, cu_seqlens_k_new);
static_assert(kPagedKVCacheArgsSize % alignof(const int32_t*) == 0 &&
                  kPagedKVCacheArgsSize == (offsetof(flash3_kvcache_args, page_table_max_pages) + sizeof(int32_t) +
                                            alignof(int64_t) - 1) / alignof(int64_t) * alignof(int64_t),
              "the paged layout's sizeof ends where cu_seqlens_k_new starts");
static_assert(kPagedKVCacheArgsSize < sizeof(flash3_kvcache_args), "three distinct layout sizes");

// flash3_kvcache_args -> KVCacheArgs (NULL tensors: absent). struct_size is
// this header's sizeof or the pre-paged layout's, whose callers get no
// page_table (contiguous caches).
flash3::Status kvcache_args(const flash3_kvcache_args* c, const flash3_options* opts, flash3::KVCacheArgs* a) {
  if (c == nullptr) return flash3::Status::Invalid("args is NULL; expected a flash3_kvcache_args");
  const bool has_varlen = c->struct_size == sizeof(flash3_kvcache_args);
  const bool has_paged = has_varlen || c->struct_size == kPagedKVCacheArgsSize;
  if (!has_paged && c->struct_size != kPrePagedKVCacheArgsSize)
    return flash3::Status::Invalid("args->struct_size is " + std::to_string(c->struct_size) + "; expected " +
                                   std::to_string(sizeof(flash3_kvcache_args)) + " (sizeof(flash3_kvcache_args)), " +
                                   std::to_string(kPagedKVCacheArgsSize) + " (the layout before page_table_rows) or " +
                                   std::to_string(kPrePagedKVCacheArgsSize) +
                                   " (the layout before page_table): initialise with flash3_default_kvcache_args()");
  const struct {
    const flash3_tensor* t;
    const char* name;
    flash3::TensorView* view;
  } items[] = {{c->q, "q", &a->q},
               {c->k_cache, "k_cache", &a->k_cache},
               {c->v_cache, "v_cache", &a->v_cache},
               {c->k_new, "k_new", &a->k_new},
               {c->v_new, "v_new", &a->v_new},
               {c->rotary_cos, "rotary_cos", &a->rotary_cos},
               {c->rotary_sin, "rotary_sin", &a->rotary_sin},
               {c->out, "out", &a->out},
               {c->lse, "lse", &a->lse}};
  for (const auto& it : items) {
    flash3::Status s = to_view(it.t, it.name, it.view);
    if (!s.ok()) return s;
  }
  a->rotary_interleaved = c->rotary_interleaved != 0;
  a->cache_seqlens = c->cache_seqlens;
  a->cache_batch_idx = c->cache_batch_idx;
  a->cache_leftpad = c->cache_leftpad;
  a->rotary_seqlens = c->rotary_seqlens;
  // Only a struct of this header's size has the paged fields; the older one
  // ends before them (its bytes there are not the caller's) and keeps
  // KVCacheArgs' defaults: no page table.
  if (has_paged) {
    a->page_table = c->page_table;
    a->page_table_batch_stride = c->page_table_batch_stride;
    a->page_table_max_pages = c->page_table_max_pages;
  }
  if (has_varlen) {
    a->page_table_rows = c->page_table_rows;
    a->cu_seqlens_k_new = c->cu_seqlens_k_new;
  }
  return to_options(opts, &a->opts);
}

}  // namespace

extern "C" {

flash3_options flash3_default_options(void) {
  flash3_options o;
  o.struct_size = sizeof(flash3_options);
  o.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  o.causal = 0;
  o.window_left = -1;
  o.window_right = -1;
  o.softcap = 0.f;
  o.deterministic = 0;
  o.cu_seqlens_q = nullptr;
  o.cu_seqlens_k = nullptr;
  o.max_seqlen_q = 0;
  o.max_seqlen_k = 0;
  o.num_sequences = 0;
  o.seqused_q = nullptr;
  o.seqused_k = nullptr;
  o.pack_gqa = -1;
  o.num_splits = 1;
  o.reserved0 = 0;
  return o;
}

flash3_status flash3_forward(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                             const flash3_tensor* out, const flash3_tensor* lse, const flash3_options* opts,
                             void* stream) {
  return forward_impl("flash3_forward", q, k, v, out, lse, opts, nullptr, 0, stream);
}

flash3_status flash3_forward_with_workspace(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                            const flash3_tensor* out, const flash3_tensor* lse,
                                            const flash3_options* opts, void* workspace, size_t workspace_bytes,
                                            void* stream) {
  return forward_impl("flash3_forward_with_workspace", q, k, v, out, lse, opts, workspace, workspace_bytes, stream);
}

flash3_status flash3_forward_fp8(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                 const flash3_tensor* out, const flash3_tensor* lse, const flash3_tensor* q_descale,
                                 const flash3_tensor* k_descale, const flash3_tensor* v_descale,
                                 const flash3_options* opts, void* workspace, size_t workspace_bytes, void* stream) {
  constexpr const char* kWhere = "flash3_forward_fp8";
  try {
    flash3::ForwardArgs a;
    FLASH3_C_TRY(kWhere, forward_args(q, k, v, out, lse, opts, &a));
    FLASH3_C_TRY(kWhere, to_view(q_descale, "q_descale", &a.q_descale));
    FLASH3_C_TRY(kWhere, to_view(k_descale, "k_descale", &a.k_descale));
    FLASH3_C_TRY(kWhere, to_view(v_descale, "v_descale", &a.v_descale));
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    return report(kWhere, flash3::forward(a, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return report_exception(kWhere);
  }
}

namespace {

flash3_status quantize_fp8_c(const char* where, const flash3_tensor* x, const flash3_tensor* out,
                             const flash3_tensor* descale, int heads_per_scale, int block_scales, int hadamard,
                             uint64_t hadamard_seed, const flash3_tensor* rotary_cos, const flash3_tensor* rotary_sin,
                             int rotary_interleaved, void* stream) {
  try {
    flash3::QuantizeFp8Args a;
    FLASH3_C_TRY(where, to_view(x, "x", &a.x));
    FLASH3_C_TRY(where, to_view(out, "out", &a.out));
    FLASH3_C_TRY(where, to_view(descale, "descale", &a.descale));
    FLASH3_C_TRY(where, to_view(rotary_cos, "rotary_cos", &a.rotary_cos));
    FLASH3_C_TRY(where, to_view(rotary_sin, "rotary_sin", &a.rotary_sin));
    a.heads_per_scale = heads_per_scale;
    a.block_scales = block_scales != 0;
    a.hadamard = hadamard != 0;
    a.hadamard_seed = hadamard_seed;
    a.rotary_interleaved = rotary_interleaved != 0;
    return report(where, flash3::quantize_fp8(a, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return report_exception(where);
  }
}

}  // namespace

flash3_status flash3_quantize_fp8(const flash3_tensor* x, const flash3_tensor* out, const flash3_tensor* descale,
                                  int heads_per_scale, int block_scales, int hadamard, uint64_t hadamard_seed,
                                  void* stream) {
  return quantize_fp8_c("flash3_quantize_fp8", x, out, descale, heads_per_scale, block_scales, hadamard, hadamard_seed,
                        nullptr, nullptr, 1, stream);
}

flash3_status flash3_quantize_fp8_rotary(const flash3_tensor* x, const flash3_tensor* out,
                                         const flash3_tensor* descale, int heads_per_scale, int block_scales,
                                         int hadamard, uint64_t hadamard_seed, const flash3_tensor* rotary_cos,
                                         const flash3_tensor* rotary_sin, int rotary_interleaved, void* stream) {
  return quantize_fp8_c("flash3_quantize_fp8_rotary", x, out, descale, heads_per_scale, block_scales, hadamard,
                        hadamard_seed, rotary_cos, rotary_sin, rotary_interleaved, stream);
}

size_t flash3_forward_workspace_size(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                     const flash3_options* opts) {
  try {
    flash3::ForwardArgs a;
    if (!to_view(q, "q", &a.q).ok() || !to_view(k, "k", &a.k).ok() || !to_view(v, "v", &a.v).ok()) return 0;
    if (!to_options(opts, &a.opts).ok()) return 0;
    return flash3::forward_workspace_size(a);
  } catch (...) {
    (void)report_exception("flash3_forward_workspace_size");
    return 0;
  }
}

flash3_status flash3_backward(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                              const flash3_tensor* out, const flash3_tensor* dout, const flash3_tensor* lse,
                              const flash3_tensor* dlse, const flash3_tensor* dq, const flash3_tensor* dk,
                              const flash3_tensor* dv, const flash3_options* opts, void* workspace,
                              size_t workspace_bytes, void* stream) {
  static const char* kWhere = "flash3_backward";
  try {
    flash3::BackwardArgs a;
    FLASH3_C_TRY(kWhere, to_view(q, "q", &a.q));
    FLASH3_C_TRY(kWhere, to_view(k, "k", &a.k));
    FLASH3_C_TRY(kWhere, to_view(v, "v", &a.v));
    FLASH3_C_TRY(kWhere, to_view(out, "out", &a.out));
    FLASH3_C_TRY(kWhere, to_view(dout, "dout", &a.dout));
    FLASH3_C_TRY(kWhere, to_view(lse, "lse", &a.lse));
    FLASH3_C_TRY(kWhere, to_view(dlse, "dlse", &a.dlse));
    FLASH3_C_TRY(kWhere, to_view(dq, "dq", &a.dq));
    FLASH3_C_TRY(kWhere, to_view(dk, "dk", &a.dk));
    FLASH3_C_TRY(kWhere, to_view(dv, "dv", &a.dv));
    FLASH3_C_TRY(kWhere, to_options(opts, &a.opts));
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    return report(kWhere, flash3::backward(a, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return report_exception(kWhere);
  }
}

size_t flash3_backward_workspace_size(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                      const flash3_options* opts) {
  try {
    flash3::BackwardArgs a;
    if (!to_view(q, "q", &a.q).ok() || !to_view(k, "k", &a.k).ok() || !to_view(v, "v", &a.v).ok()) return 0;
    if (!to_options(opts, &a.opts).ok()) return 0;
    return flash3::backward_workspace_size(a);
  } catch (...) {
    (void)report_exception("flash3_backward_workspace_size");
    return 0;
  }
}

flash3_status flash3_combine(const flash3_tensor* out_partial, int64_t out_partial_split_stride,
                             const flash3_tensor* lse_partial, int64_t lse_partial_split_stride, int32_t num_splits,
                             const flash3_tensor* out, const flash3_tensor* lse, void* stream) {
  static const char* kWhere = "flash3_combine";
  try {
    flash3::CombineArgs a;
    FLASH3_C_TRY(kWhere, split_view(out_partial, "out_partial", 4, num_splits, out_partial_split_stride, &a.out_partial));
    FLASH3_C_TRY(kWhere, split_view(lse_partial, "lse_partial", 3, num_splits, lse_partial_split_stride, &a.lse_partial));
    FLASH3_C_TRY(kWhere, to_view(out, "out", &a.out));
    FLASH3_C_TRY(kWhere, to_view(lse, "lse", &a.lse));
    return report(kWhere, flash3::combine(a, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return report_exception(kWhere);
  }
}

flash3_kvcache_args flash3_default_kvcache_args(void) {
  flash3_kvcache_args a;
  std::memset(&a, 0, sizeof(a));  // every pointer NULL (page_table too), page_table_* 0
  a.struct_size = sizeof(flash3_kvcache_args);
  a.rotary_interleaved = 1;
  return a;
}

flash3_status flash3_forward_kvcache(const flash3_kvcache_args* args, const flash3_options* opts, void* workspace,
                                     size_t workspace_bytes, void* stream) {
  static const char* kWhere = "flash3_forward_kvcache";
  try {
    flash3::KVCacheArgs a;
    FLASH3_C_TRY(kWhere, kvcache_args(args, opts, &a));
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    return report(kWhere, flash3::forward_kvcache(a, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return report_exception(kWhere);
  }
}

size_t flash3_kvcache_workspace_size(const flash3_kvcache_args* args, const flash3_options* opts) {
  try {
    flash3::KVCacheArgs a;
    if (!kvcache_args(args, opts, &a).ok()) return 0;
    return flash3::kvcache_workspace_size(a);
  } catch (...) {
    return 0;
  }
}

flash3_status flash3_forward_plan(int32_t dtype, int32_t batch, int32_t seqlen_q, int32_t seqlen_k, int32_t heads_q,
                                  int32_t heads_kv, int32_t head_dim, int32_t head_dim_v, const flash3_options* opts,
                                  int32_t* num_splits, int32_t* pack_gqa) {
  static const char* kWhere = "flash3_forward_plan";
  try {
    if (num_splits == nullptr || pack_gqa == nullptr)
      return report(kWhere, flash3::Status::Invalid("num_splits / pack_gqa is NULL; expected pointers to int32"));
    flash3::AttentionOptions o;
    FLASH3_C_TRY(kWhere, to_options(opts, &o));
    flash3::ForwardPlan plan;
    FLASH3_C_TRY(kWhere, flash3::forward_plan(static_cast<flash3::DType>(dtype), batch, seqlen_q, seqlen_k, heads_q,
                                              heads_kv, head_dim, head_dim_v, o, &plan));
    *num_splits = plan.num_splits;
    *pack_gqa = plan.pack_gqa;
    return FLASH3_OK;
  } catch (...) {
    return report_exception(kWhere);
  }
}

flash3_status flash3_validate_forward(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                      const flash3_tensor* out, const flash3_tensor* lse, const flash3_options* opts) {
  static const char* kWhere = "flash3_validate_forward";
  try {
    flash3::ForwardArgs a;
    FLASH3_C_TRY(kWhere, forward_args(q, k, v, out, lse, opts, &a));
    return report(kWhere, flash3::validate_forward(a));
  } catch (...) {
    return report_exception(kWhere);
  }
}

int flash3_forward_is_built(int32_t dtype, int32_t head_dim, int32_t head_dim_v) {
  try {
    return valid_dtype(dtype) && flash3::forward_is_built(static_cast<flash3::DType>(dtype), head_dim, head_dim_v);
  } catch (...) {
    return 0;
  }
}

int flash3_backward_is_built(int32_t dtype, int32_t head_dim, int32_t head_dim_v) {
  try {
    return valid_dtype(dtype) && flash3::backward_is_built(static_cast<flash3::DType>(dtype), head_dim, head_dim_v);
  } catch (...) {
    return 0;
  }
}

// On 0, flash3_last_error() says why.
int flash3_device_is_supported(void) {
  try {
    std::string why;
    if (flash3::device_is_supported(&why)) return 1;
    set_last_error("flash3_device_is_supported", why);
    return 0;
  } catch (...) {
    (void)report_exception("flash3_device_is_supported");
    return 0;
  }
}

const char* flash3_last_error(void) { return g_last_error.c_str(); }

const char* flash3_version(void) { return flash3::version(); }

int flash3_version_number(void) { return FLASH3_VERSION_NUMBER; }

}  // extern "C"
