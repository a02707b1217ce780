// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The argument checks every entry point shares (api/checks.h): dims, strides,
// alignment, spans, overlap, scalar options, the per-tensor attention checks,
// and the device checks. Every message names the argument, the value seen and
// what was expected.
#include "api/checks.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "api/validate.h"
#include "common/cuda_check.h"
#include "launch/dispatch.h"

namespace flash3 {
namespace checks {

std::string dtype_str(DType t) {
  const char* n = dtype_name(t);
  if (std::strcmp(n, "unknown") == 0) return "unknown (" + std::to_string(static_cast<int>(t)) + ")";
  return n;
}

// Messages are formatted with snprintf, never with iostreams: a process may hold
// another copy of libstdc++'s stream code (a torch extension built by another
// compiler), and the stream templates libflash3 imports can bind to that copy,
// whose facet layout differs: formatting a pointer into an error message then
// crashed the process (SIGSEGV in the torch binding's kvcache and alignment
// errors).
std::string fmt_float(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(x));  // as ostream formats a float
  return buf;
}

std::string fmt_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}


bool is_lse(Role r) { return r == Role::kLse; }

int expected_ndim(Role r, bool varlen) {
  if (is_lse(r)) return varlen ? 2 : 3;
  return varlen ? 3 : 4;
}

const char* const* dim_names(Role r, bool varlen) {
  static const char* const q4[] = {"batch", "seqlen_q", "num_heads_q", "head_dim"};
  static const char* const k4[] = {"batch", "seqlen_k", "num_heads_kv", "head_dim"};
  static const char* const v4[] = {"batch", "seqlen_k", "num_heads_kv", "head_dim_v"};
  static const char* const o4[] = {"batch", "seqlen_q", "num_heads_q", "head_dim_v"};
  static const char* const l3[] = {"batch", "num_heads_q", "seqlen_q", "?"};
  static const char* const q3[] = {"total_q", "num_heads_q", "head_dim", "?"};
  static const char* const k3[] = {"total_k", "num_heads_kv", "head_dim", "?"};
  static const char* const v3[] = {"total_k", "num_heads_kv", "head_dim_v", "?"};
  static const char* const o3[] = {"total_q", "num_heads_q", "head_dim_v", "?"};
  static const char* const l2[] = {"num_heads_q", "total_q", "?", "?"};
  switch (r) {
    case Role::kQ: return varlen ? q3 : q4;
    case Role::kK: return varlen ? k3 : k4;
    case Role::kV: return varlen ? v3 : v4;
    case Role::kO: return varlen ? o3 : o4;
    case Role::kLse: return varlen ? l2 : l3;
  }
  return q4;
}

std::string layout(Role r, bool varlen) {
  const char* const* n = dim_names(r, varlen);
  std::string s = "(";
  for (int i = 0; i < expected_ndim(r, varlen); ++i) s += (i ? ", " : "") + std::string(n[i]);
  return s + ")";
}

// Dimension i of the tensor `name`, whose dims are named dims[0], dims[1], ...
std::string dim_label(const char* name, const char* const* dims, int i) {
  return std::string(name) + ".shape[" + std::to_string(i) + "] (" + dims[i] + ")";
}

std::string stride_label(const char* name, const char* const* dims, int i) {
  return std::string(name) + ".stride[" + std::to_string(i) + "] (" + dims[i] + ")";
}

std::string dim_label(const Arg& a, bool varlen, int i) { return dim_label(a.name, dim_names(a.role, varlen), i); }

std::string stride_label(const Arg& a, bool varlen, int i) { return stride_label(a.name, dim_names(a.role, varlen), i); }


std::string stride_str(const TensorView& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim && i < kMaxTensorDims; ++i) s += (i ? ", " : "") + std::to_string(t.stride[i]);
  return s + ")";
}

// ---------------------------------------------------------------------------
// Layout checks shared by the attention and the combine tensors: `name` is the
// argument, `dims` the names of its dimensions (for the messages). The stride
// of a dimension of size 1 is never used: any value is accepted there.
// ---------------------------------------------------------------------------
Status check_strides_nonnegative(const char* name, const TensorView& t, const char* const* dims) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1 && t.stride[i] < 0)
      return Status::Invalid(stride_label(name, dims, i) + " is " + std::to_string(t.stride[i]) +
                             "; expected >= 0 (negative strides are not supported)");
  return Status::Ok();
}

Status check_last_contiguous(const char* name, const TensorView& t, const char* const* dims) {
  const int last = t.ndim - 1;
  if (t.shape[last] > 1 && t.stride[last] != 1)
    return Status::Invalid(stride_label(name, dims, last) + " is " + std::to_string(t.stride[last]) + "; expected 1 (" +
                           dims[last] + " must be contiguous)");
  return Status::Ok();
}

// why: appended to the message (the rule behind the alignment, or "").
Status check_aligned(const char* name, const TensorView& t, uintptr_t align, const char* why) {
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0)
    return Status::Invalid(std::string(name) + ".data (" + fmt_ptr(t.data) + ") is not " + std::to_string(align) +
                           "-byte aligned; expected a " + std::to_string(align) + "-byte aligned pointer" + why);
  return Status::Ok();
}

// A written tensor: every element has its own memory.
Status check_written_layout(const char* name, const TensorView& t, const char* const* dims) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.stride[i] == 0 && t.shape[i] > 1)
      return Status::Invalid(stride_label(name, dims, i) + " is 0 while " + dim_label(name, dims, i) + " is " +
                             std::to_string(t.shape[i]) + "; expected a non-zero stride (" + name +
                             " is written and its elements must not overlap)");
  if (self_overlaps(t))
    return Status::Invalid(std::string(name) + " has shape " + shape_str(t) + " and strides " + stride_str(t) +
                           ", whose elements overlap; expected a layout where every element has its own memory (" +
                           name + " is written)");
  return Status::Ok();
}

// The byte offset of the last element fits in int64 (the kernels' pointer arithmetic).
Status check_span_fits(const char* name, const TensorView& t) {
  if (t.numel() == 0) return Status::Ok();
  const int esize = dtype_size(t.dtype);
  int64_t off = 0, term = 0;
  bool overflow = false;
  for (int i = 0; i < t.ndim && !overflow; ++i) {
    if (t.shape[i] <= 1) continue;
    overflow = __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &term) || __builtin_add_overflow(off, term, &off) ||
               __builtin_mul_overflow(off, int64_t(esize), &term);
  }
  if (overflow)
    return Status::Invalid(std::string(name) + ": the byte offset of its last element, sum((shape[i]-1)*stride[i]) * " +
                           std::to_string(esize) + ", does not fit in int64; expected a tensor that fits in memory");
  return Status::Ok();
}


// A device int32 array of n entries (cu_seqlens, seqused, cache_seqlens, a
// page table's rows) as a view the overlap checks take (4-byte elements).
TensorView int_array_view(const int* p, int64_t n) {
  TensorView t;
  t.data = const_cast<int*>(p);
  t.dtype = DType::kFloat32;
  t.ndim = 1;
  t.shape[0] = p != nullptr ? n : 0;
  t.stride[0] = 1;
  return t;
}

Status check_varlen_arrays_not_written(const VarlenArrays& va, std::initializer_list<const Arg*> written) {
  const Arg cu_q{"opts.cu_seqlens_q", &va.cu_q, Role::kLse, false};
  const Arg cu_k{"opts.cu_seqlens_k", &va.cu_k, Role::kLse, false};
  const Arg used_q{"opts.seqused_q", &va.used_q, Role::kLse, false};
  const Arg used_k{"opts.seqused_k", &va.used_k, Role::kLse, false};
  for (const Arg* w : written) FLASH3_RETURN_IF_ERROR(check_no_alias(*w, {&cu_q, &cu_k, &used_q, &used_k}));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Options.
// ---------------------------------------------------------------------------
// Scales that enter the kernels' fp32 arithmetic: the kernels build with
// -use_fast_math, which flushes subnormal floats to 0 (a masked score would
// then become -inf * 0 = NaN), and the softmax multiplies a scale by log2(e)
// (which must stay finite). 0 is exact and allowed where it means something.
bool kernel_float_ok(float x) { return x == 0.f || (x >= kMinKernelFloat && x <= kMaxKernelFloat); }

// With softcap, the scores are multiplied by softmax_scale / softcap first:
// that ratio must be a normal float too (a softcap of 1e38 with the default
// scale would flush it to 0 and make every weight equal).
Status check_softcap_ratio(const AttentionOptions& o, int64_t head_dim) {
  if (!(o.softcap > 0.f)) return Status::Ok();
  const float scale = std::isnan(o.softmax_scale) ? 1.f / std::sqrt(static_cast<float>(head_dim)) : o.softmax_scale;
  const float ratio = scale / o.softcap;
  if (scale == 0.f || ratio >= kMinKernelFloat) return Status::Ok();
  return Status::Invalid("opts.softcap is " + fmt_float(o.softcap) + " with softmax_scale " + fmt_float(scale) +
                         ": softmax_scale / softcap = " + fmt_float(ratio) + " is below fp32's normal range (" +
                         fmt_float(kMinKernelFloat) + "), which the kernels flush to 0; expected a softcap at most " +
                         fmt_float(scale / kMinKernelFloat));
}

Status check_options(const AttentionOptions& o) {
  if ((o.cu_seqlens_q == nullptr) != (o.cu_seqlens_k == nullptr)) {
    const bool has_q = o.cu_seqlens_q != nullptr;
    return Status::Invalid(std::string("opts.cu_seqlens_") + (has_q ? "k" : "q") + " is null but opts.cu_seqlens_" +
                           (has_q ? "q" : "k") + " is set; expected both or neither (variable-length needs both)");
  }
  if (o.num_sequences < 0)
    return Status::Invalid("opts.num_sequences is " + std::to_string(o.num_sequences) + "; expected >= 0");
  if (o.cu_seqlens_q == nullptr) {
    // seqused_* only refine the sequences of cu_seqlens_*.
    if (o.seqused_q != nullptr)
      return Status::Invalid("opts.seqused_q is set (" + fmt_ptr(o.seqused_q) +
                             ") but opts.cu_seqlens_q is null; opts.seqused_q needs opts.cu_seqlens_q (variable length)");
    if (o.seqused_k != nullptr)
      return Status::Invalid("opts.seqused_k is set (" + fmt_ptr(o.seqused_k) +
                             ") but opts.cu_seqlens_k is null; opts.seqused_k needs opts.cu_seqlens_k (variable length)");
  }
  if (o.cu_seqlens_q != nullptr) {
    if (o.num_sequences > kMaxNumSequences)
      return Status::Invalid("opts.num_sequences is " + std::to_string(o.num_sequences) + "; expected <= " +
                             std::to_string(kMaxNumSequences) + " (2^30: the kernels index tiles in int32)");
    // 0 is FlashAttention-3's empty batch (every sequence empty); the values
    // only normalise the window, the lengths come from the device arrays.
    if (o.max_seqlen_q < 0)
      return Status::Invalid("opts.max_seqlen_q is " + std::to_string(o.max_seqlen_q) +
                             "; expected >= 0 when opts.cu_seqlens_q is set");
    if (o.max_seqlen_k < 0)
      return Status::Invalid("opts.max_seqlen_k is " + std::to_string(o.max_seqlen_k) +
                             "; expected >= 0 when opts.cu_seqlens_k is set");
    if (reinterpret_cast<uintptr_t>(o.cu_seqlens_q) % alignof(int32_t) != 0)
      return Status::Invalid("opts.cu_seqlens_q (" + fmt_ptr(o.cu_seqlens_q) + ") is not 4-byte aligned; expected an int32 array");
    if (reinterpret_cast<uintptr_t>(o.cu_seqlens_k) % alignof(int32_t) != 0)
      return Status::Invalid("opts.cu_seqlens_k (" + fmt_ptr(o.cu_seqlens_k) + ") is not 4-byte aligned; expected an int32 array");
    if (reinterpret_cast<uintptr_t>(o.seqused_q) % alignof(int32_t) != 0)
      return Status::Invalid("opts.seqused_q (" + fmt_ptr(o.seqused_q) + ") is not 4-byte aligned; expected an int32 array");
    if (reinterpret_cast<uintptr_t>(o.seqused_k) % alignof(int32_t) != 0)
      return Status::Invalid("opts.seqused_k (" + fmt_ptr(o.seqused_k) + ") is not 4-byte aligned; expected an int32 array");
  }
  // Any window value is valid (negative: unbounded; causal overrides the right side).
  if (!std::isnan(o.softmax_scale) && !(std::isfinite(o.softmax_scale) && o.softmax_scale >= 0.f))
    return Status::Invalid("opts.softmax_scale is " + fmt_float(o.softmax_scale) +
                           "; expected NaN (the default, 1/sqrt(head_dim)) or a finite value >= 0 (a negative scale "
                           "is not supported: the online softmax tracks the row maximum of the unscaled scores)");
  if (!std::isnan(o.softmax_scale) && !kernel_float_ok(o.softmax_scale))
    return Status::Invalid("opts.softmax_scale is " + fmt_float(o.softmax_scale) + "; expected 0 or a value in [" +
                           fmt_float(kMinKernelFloat) + ", " + fmt_float(kMaxKernelFloat) + "]" + kKernelFloatWhy);
  if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap))
    return Status::Invalid("opts.softcap is " + fmt_float(o.softcap) + "; expected a finite value >= 0 (0 disables)");
  if (!kernel_float_ok(o.softcap))
    return Status::Invalid("opts.softcap is " + fmt_float(o.softcap) + "; expected 0 (off) or a value in [" +
                           fmt_float(kMinKernelFloat) + ", " + fmt_float(kMaxKernelFloat) + "]" + kKernelFloatWhy);
  // Checked for the backward too (shared options), which otherwise ignores it.
  if (o.pack_gqa < -1 || o.pack_gqa > 1)
    return Status::Invalid("opts.pack_gqa is " + std::to_string(o.pack_gqa) +
                           "; expected -1 (heuristic), 0 (off) or 1 (on)");
  if (o.num_splits < 0 || o.num_splits > kMaxCombineSplits)
    return Status::Invalid("opts.num_splits is " + std::to_string(o.num_splits) +
                           "; expected 0 (heuristic), 1 (no split) or n in [2, " + std::to_string(kMaxCombineSplits) +
                           "] (at most n KV splits)");
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Per-tensor checks.
// ---------------------------------------------------------------------------

// Presence, ndim, sizes, null data.
Status check_present(const Arg& a, bool varlen) {
  const TensorView& t = *a.t;
  const int nd = expected_ndim(a.role, varlen);
  if (!t.defined())
    return Status::Invalid(std::string(a.name) + " is missing (data is null and ndim is 0); expected a " +
                           std::to_string(nd) + "-d tensor " + layout(a.role, varlen));
  if (t.ndim != nd) {
    std::string hint = varlen ? " because opts.cu_seqlens_q is set" : " (" + std::to_string(is_lse(a.role) ? 2 : 3) +
                                                                          " when opts.cu_seqlens_q is set)";
    return Status::Invalid(std::string(a.name) + ".ndim is " + std::to_string(t.ndim) + "; expected " +
                           std::to_string(nd) + ": " + layout(a.role, varlen) + hint);
  }
  for (int i = 0; i < nd; ++i) {
    if (t.shape[i] < 0)
      return Status::Invalid(dim_label(a, varlen, i) + " is " + std::to_string(t.shape[i]) + "; expected >= 0");
    if (t.shape[i] > kMaxDim)
      return Status::Invalid(dim_label(a, varlen, i) + " is " + std::to_string(t.shape[i]) +
                             "; expected <= 2147483647 (INT32_MAX)");
  }
  if (t.data == nullptr && t.numel() > 0)
    return Status::Invalid(std::string(a.name) + ".data is null; expected a device pointer (" + a.name + " has shape " +
                           shape_str(t) + ")");
  return Status::Ok();
}

// fp8_ok: the forward, which has e4m3 kernels; elsewhere FP8 is not supported
// (FlashAttention-3 has no FP8 backward or KV-cache path either).
Status check_qdtype(const Arg& q, bool fp8_ok, const char* where) {
  const DType dt = q.t->dtype;
  if (dt == DType::kFloat16 || dt == DType::kBFloat16) return Status::Ok();
  if (dt == DType::kFloat8E4M3) {
    if (fp8_ok) return Status::Ok();
    return Status::NotSupported(std::string("fp8: ") + q.name + ".dtype is fp8_e4m3; " + where +
                                " has fp16 and bf16 kernels only (FP8 is forward-only)");
  }
  return Status::Invalid(std::string(q.name) + ".dtype is " + dtype_str(dt) +
                         (fp8_ok ? "; expected fp16, bf16 or fp8_e4m3" : "; expected fp16 or bf16"));
}

// FP8 forwards: out bf16, fixed length, descales (b, hkv) fp32. 16-bit
// forwards take no descales.
Status check_fp8_forward(const ForwardArgs& args, bool varlen) {
  const std::pair<const char*, const TensorView*> descales[] = {
      {"q_descale", &args.q_descale}, {"k_descale", &args.k_descale}, {"v_descale", &args.v_descale}};
  if (args.q.dtype != DType::kFloat8E4M3) {
    for (const auto& [name, t] : descales)
      if (t->defined())
        return Status::Invalid(std::string(name) + " is given but q.dtype is " + dtype_str(args.q.dtype) +
                               "; descales apply to fp8_e4m3 inputs only");
    return Status::Ok();
  }
  if (args.out.dtype != DType::kBFloat16)
    return Status::Invalid("out.dtype is " + dtype_str(args.out.dtype) +
                           "; expected bf16 (fp8_e4m3 inputs write a bf16 output)");
  if (varlen)
    return Status::NotSupported("fp8 with variable-length batches (opts.cu_seqlens_q is set; fp8 runs fixed length)");
  if (args.opts.softcap != 0.f)
    return Status::NotSupported("fp8 with opts.softcap " + fmt_float(args.opts.softcap) +
                                " (the e4m3 kernels have no score modifier; pass 0)");
  const int64_t b = args.q.shape[0], hkv = args.k.shape[2], hq = args.q.shape[2];
  const int64_t blocks_q = (args.q.shape[1] + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int64_t blocks_k = (args.k.shape[1] + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  for (const auto& [name, t] : descales) {
    if (!t->defined()) continue;
    if (t->dtype != DType::kFloat32)
      return Status::Invalid(std::string(name) + ".dtype is " + dtype_str(t->dtype) + "; expected fp32");
    const bool is_q = t == &args.q_descale;
    const int64_t heads = is_q ? hq : hkv, blocks = is_q ? blocks_q : blocks_k;
    const bool per_head = t->ndim == 2 && t->shape[0] == b && t->shape[1] == hkv;
    const bool per_block = t->ndim == 3 && t->shape[0] == b && t->shape[1] == heads && t->shape[2] == blocks;
    if (!per_head && !per_block)
      return Status::Invalid(std::string(name) + " has shape " + shape_str(*t) + "; expected (batch, heads_kv) = (" +
                             std::to_string(b) + ", " + std::to_string(hkv) + ") or block scales (batch, " +
                             (is_q ? "heads_q, ceil(seqlen_q" : "heads_kv, ceil(seqlen_k") + " / " +
                             std::to_string(kFp8ScaleBlock) + ")) = (" + std::to_string(b) + ", " +
                             std::to_string(heads) + ", " + std::to_string(blocks) + ")");
    for (int i = 0; i < t->ndim; ++i)
      if (t->stride[i] < 0)
        return Status::Invalid(std::string(name) + " has stride[" + std::to_string(i) + "] = " +
                               std::to_string(t->stride[i]) + "; expected non-negative strides");
    if (t->data == nullptr && t->numel() > 0)
      return Status::Invalid(std::string(name) + ".data is null; expected a device pointer (shape " + shape_str(*t) +
                             ")");
    if (reinterpret_cast<uintptr_t>(t->data) % 4 != 0)
      return Status::Invalid(std::string(name) + ".data " + fmt_ptr(t->data) + " is not 4-byte aligned; expected fp32 alignment");
    FLASH3_RETURN_IF_ERROR(check_span_fits(name, *t));
  }
  return Status::Ok();
}

Status check_same_dtype(const Arg& a, const Arg& ref) {
  if (a.t->dtype == ref.t->dtype) return Status::Ok();
  return Status::Invalid(std::string(a.name) + ".dtype is " + dtype_str(a.t->dtype) + "; expected " +
                         dtype_str(ref.t->dtype) + " to match " + ref.name + ".dtype");
}

Status check_fp32(const Arg& a) {
  if (a.t->dtype == DType::kFloat32) return Status::Ok();
  return Status::Invalid(std::string(a.name) + ".dtype is " + dtype_str(a.t->dtype) + "; expected fp32");
}

// a.shape[ia] == ref.shape[ir].
Status check_dim_eq(const Arg& a, int ia, const Arg& ref, int ir, bool varlen, const std::string& extra) {
  if (a.t->shape[ia] == ref.t->shape[ir]) return Status::Ok();
  return Status::Invalid(dim_label(a, varlen, ia) + " is " + std::to_string(a.t->shape[ia]) + "; expected " +
                         std::to_string(ref.t->shape[ir]) + " to match " + ref.name + extra);
}

Status check_head_dim_range(const Arg& a, bool varlen) {
  const int last = a.t->ndim - 1;
  const int64_t d = a.t->shape[last];
  if (d >= 8 && d <= kMaxHeadDim && d % 8 == 0) return Status::Ok();
  return Status::Invalid("unsupported head dim: " + dim_label(a, varlen, last) + " is " + std::to_string(d) +
                         "; expected a multiple of 8 in [8, " + std::to_string(kMaxHeadDim) + "]");
}

// Head dims: k matches q, out matches v, both in range.
Status check_head_dims(const Arg& q, const Arg& k, const Arg& v, const Arg& o, bool varlen) {
  const int D = q.t->ndim - 1;
  FLASH3_RETURN_IF_ERROR(check_dim_eq(k, D, q, D, varlen));
  FLASH3_RETURN_IF_ERROR(check_dim_eq(o, D, v, D, varlen));
  FLASH3_RETURN_IF_ERROR(check_head_dim_range(q, varlen));
  FLASH3_RETURN_IF_ERROR(check_head_dim_range(v, varlen));
  return Status::Ok();
}

// Batch, seqlens, heads across q/k/v/out (head dims already checked).
Status check_geometry(const Arg& q, const Arg& k, const Arg& v, const Arg& o, bool varlen) {
  const int R = varlen ? 0 : 1;  // row (seqlen / total) dim
  const int H = R + 1;           // heads dim
  if (!varlen) {
    FLASH3_RETURN_IF_ERROR(check_dim_eq(k, 0, q, 0, varlen));
    FLASH3_RETURN_IF_ERROR(check_dim_eq(v, 0, q, 0, varlen));
  }
  FLASH3_RETURN_IF_ERROR(check_dim_eq(v, R, k, R, varlen));
  if (q.t->shape[H] < 1)
    return Status::Invalid(dim_label(q, varlen, H) + " is " + std::to_string(q.t->shape[H]) + "; expected >= 1");
  if (k.t->shape[H] < 1)
    return Status::Invalid(dim_label(k, varlen, H) + " is " + std::to_string(k.t->shape[H]) + "; expected >= 1");
  FLASH3_RETURN_IF_ERROR(check_dim_eq(v, H, k, H, varlen));
  if (q.t->shape[H] % k.t->shape[H] != 0)
    return Status::Invalid(dim_label(q, varlen, H) + " is " + std::to_string(q.t->shape[H]) +
                           ", which is not a multiple of " + dim_label(k, varlen, H) + " " +
                           std::to_string(k.t->shape[H]) + "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  // out == (b, sq, hq, dv)
  std::string expect = " (" + std::string(o.name) + " must be " + layout(o.role, varlen) + " = (";
  for (int i = 0; i < o.t->ndim; ++i)
    expect += (i ? ", " : "") + std::to_string(i == o.t->ndim - 1 ? v.t->shape[i] : q.t->shape[i]);
  expect += "))";
  for (int i = 0; i < o.t->ndim - 1; ++i) FLASH3_RETURN_IF_ERROR(check_dim_eq(o, i, q, i, varlen, expect));
  return Status::Ok();
}

// a has exactly ref's shape (dq like q, dout like out, ...).
Status check_like(const Arg& a, const Arg& ref, bool varlen) {
  for (int i = 0; i < ref.t->ndim; ++i) FLASH3_RETURN_IF_ERROR(check_dim_eq(a, i, ref, i, varlen));
  return Status::Ok();
}

// lse: (b, hq, sq), varlen (hq, total_q).
Status check_lse_shape(const Arg& l, const Arg& q, bool varlen) {
  const int64_t want[3] = {varlen ? q.t->shape[1] : q.t->shape[0], varlen ? q.t->shape[0] : q.t->shape[2],
                           varlen ? 0 : q.t->shape[1]};
  const std::string full = " (" + std::string(l.name) + " must be " + layout(l.role, varlen) + ")";
  for (int i = 0; i < l.t->ndim; ++i) {
    if (l.t->shape[i] != want[i])
      return Status::Invalid(dim_label(l, varlen, i) + " is " + std::to_string(l.t->shape[i]) + "; expected " +
                             std::to_string(want[i]) + " to match " + q.name + full);
  }
  return Status::Ok();
}

// Strides and alignment (TMA's rules for the attention tensors).
Status check_layout(const Arg& a, bool varlen) {
  const TensorView& t = *a.t;
  const char* const* dims = dim_names(a.role, varlen);
  const int last = t.ndim - 1;
  FLASH3_RETURN_IF_ERROR(check_strides_nonnegative(a.name, t, dims));
  FLASH3_RETURN_IF_ERROR(check_last_contiguous(a.name, t, dims));
  const int esize = dtype_size(t.dtype);
  if (!is_lse(a.role) && esize > 0 && esize < 16) {
    const int64_t mult = 16 / esize;  // 8 elements for 16-bit types
    for (int i = 0; i < last; ++i) {
      if (t.shape[i] <= 1) continue;
      if (t.stride[i] % mult != 0)
        return Status::Invalid(stride_label(a, varlen, i) + " is " + std::to_string(t.stride[i]) + "; expected a multiple of " +
                               std::to_string(mult) + " elements (16 bytes, TMA requirement)");
      if (t.stride[i] >= kMaxTmaStrideBytes / esize)
        return Status::Invalid(stride_label(a, varlen, i) + " is " + std::to_string(t.stride[i]) + "; expected below " +
                               std::to_string(kMaxTmaStrideBytes / esize) + " elements (2^40 bytes, TMA requirement)");
    }
  }
  if (a.written) FLASH3_RETURN_IF_ERROR(check_written_layout(a.name, t, dims));
  FLASH3_RETURN_IF_ERROR(check_aligned(a.name, t, is_lse(a.role) ? 4 : 16, is_lse(a.role) ? "" : " (TMA requirement)"));
  return check_span_fits(a.name, t);
}

// Sizes the kernels' int32 index arithmetic and grids rely on.
Status check_limits(const Arg& q, const Arg& k, const AttentionOptions& opts, bool varlen) {
  const int R = varlen ? 0 : 1, H = R + 1;
  const int64_t sq = q.t->shape[R], sk = k.t->shape[R];
  if (sq + sk > kMaxSeqlenSum)
    return Status::Invalid(dim_label(q, varlen, R) + " + " + dim_label(k, varlen, R) + " is " + std::to_string(sq + sk) +
                           "; expected <= " + std::to_string(kMaxSeqlenSum) + " (the kernels index rows in int32)");
  if (varlen) {
    // Rows are addressed as cu_seqlens offset + row within the sequence + window
    // (normalised below max_seqlen), all in int32.
    const int64_t max_len = std::max<int64_t>(opts.max_seqlen_q, opts.max_seqlen_k);
    if (sq + sk + max_len > kMaxSeqlenSum)
      return Status::Invalid(dim_label(q, varlen, R) + " + " + dim_label(k, varlen, R) +
                             " + max(opts.max_seqlen_q, opts.max_seqlen_k) is " + std::to_string(sq) + " + " +
                             std::to_string(sk) + " + " + std::to_string(max_len) + " = " +
                             std::to_string(sq + sk + max_len) + "; expected <= " + std::to_string(kMaxSeqlenSum) +
                             " (the kernels index rows in int32)");
    // The tile maps and the backward's per-block scratch are sized by an
    // upper bound of the tile count, in rows: total + 256 rows per sequence.
    const int64_t bound_rows = std::max(sq, sk) + int64_t(opts.num_sequences) * 256;
    if (bound_rows > kMaxSeqlenSum)
      return Status::Invalid("max(" + dim_label(q, varlen, R) + ", " + dim_label(k, varlen, R) +
                             ") + 256 * opts.num_sequences is " + std::to_string(bound_rows) + "; expected <= " +
                             std::to_string(kMaxSeqlenSum) + " (tile maps are sized in int32 rows)");
  }
  if (q.t->shape[H] > kMaxGridYZ)
    return Status::Invalid(dim_label(q, varlen, H) + " is " + std::to_string(q.t->shape[H]) + "; expected <= " +
                           std::to_string(kMaxGridYZ) + " (the grid's y dimension)");
  if (!varlen && batch_per_launch(sq, sk, q.t->shape[H], k.t->shape[H]) < 1)
    return Status::Invalid("one batch element has more than 2^30 tiles (" + dim_label(q, varlen, R) + " " +
                           std::to_string(sq) + ", " + dim_label(k, varlen, R) + " " + std::to_string(sk) +
                           ", heads " + std::to_string(q.t->shape[H]) +
                           "); expected fewer: the kernels count tiles in int32");
  return Status::Ok();
}


bool is_varlen(const AttentionOptions& o) { return o.cu_seqlens_q != nullptr; }

}  // namespace checks

using namespace checks;


Status check_written_tensor(const char* name, const TensorView& t) {
  static const char* const kDims[kMaxTensorDims] = {"0", "1", "2", "3", "4"};
  return check_written_layout(name, t, kDims);
}

Status check_tensor_span(const char* name, const TensorView& t) { return check_span_fits(name, t); }

// "(2, 8, 3)" (at most kMaxTensorDims entries, whatever ndim claims).
std::string shape_str(const TensorView& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim && i < kMaxTensorDims; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + ")";
}

// ---------------------------------------------------------------------------
// Device.
// ---------------------------------------------------------------------------
namespace {
// Unit tests run the whole validation on host pointers (nothing launched).
std::atomic<bool> g_device_checks{true};
}  // namespace
bool device_check_skipped() { return !g_device_checks.load(std::memory_order_relaxed); }
void set_device_checks_for_testing(bool on) { g_device_checks.store(on, std::memory_order_relaxed); }

namespace {
Status current_device(int* dev) { return cuda_call(cudaGetDevice(dev), "cudaGetDevice"); }

// The device a stream was created on.
Status stream_device(cudaStream_t stream, int* dev) {
#if CUDART_VERSION >= 12080
  return cuda_call(cudaStreamGetDevice(stream, dev), "cudaStreamGetDevice(stream)");
#else
  CUcontext ctx = nullptr;
  CUdevice d = 0;
  if (cuStreamGetCtx(reinterpret_cast<CUstream>(stream), &ctx) != CUDA_SUCCESS || cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
    return Status::Cuda("cuStreamGetCtx(stream) failed: not a valid stream?");
  const CUresult r = cuCtxGetDevice(&d);
  cuCtxPopCurrent(nullptr);
  if (r != CUDA_SUCCESS) return Status::Cuda("cuCtxGetDevice failed for the stream's context");
  *dev = int(d);
  return Status::Ok();
#endif
}
}  // namespace

Status check_device_pointer(const char* name, const void* ptr) {
  if (ptr == nullptr) return Status::Ok();
  int dev = 0;
  FLASH3_RETURN_IF_ERROR(current_device(&dev));
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  const std::string expected = "; expected device memory on device " + std::to_string(dev);
  if (e == cudaErrorInvalidValue) {  // pre-CUDA-11 drivers: not a CUDA allocation
    (void)cudaGetLastError();
    return Status::Invalid(std::string(name) + " is a host pointer" + expected);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, ("cudaPointerGetAttributes(" + std::string(name) + ")").c_str());
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device != dev)
        return Status::Invalid(std::string(name) + " is device memory on device " + std::to_string(attr.device) + expected +
                               " (the current device)");
      return Status::Ok();
    case cudaMemoryTypeManaged:
      return Status::Ok();
    case cudaMemoryTypeHost:
      return Status::Invalid(std::string(name) + " is a host pointer (page-locked host memory)" + expected);
    default:
      return Status::Invalid(std::string(name) + " is a host pointer" + expected);
  }
}

Status check_current_device() {
  int dev = 0;
  FLASH3_RETURN_IF_ERROR(current_device(&dev));
  int major = 0, minor = 0;
  FLASH3_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FLASH3_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major == 9 && minor == 0) return Status::Ok();
  cudaDeviceProp prop{};
  std::string name = "a GPU";
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) name = prop.name;
  else (void)cudaGetLastError();
  return Status::NotSupported("device " + std::to_string(dev) + " is " + name + " (sm_" + std::to_string(major) +
                              std::to_string(minor) + "); flash3 needs a Hopper GPU (sm_90)");
}

namespace checks {
// Each (name, pointer) in order (null: absent), then the current device.
Status check_device_pointers(std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  for (const auto& p : ptrs) FLASH3_RETURN_IF_ERROR(check_device_pointer(p.first, p.second));
  return check_current_device();
}
}  // namespace checks

Status check_stream_device(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return Status::Ok();
  // cudaStreamGetDevice is not permitted on a stream that is being captured
  // into a CUDA graph (it invalidates the capture): such a stream is left to
  // the capture, whose launches fail on a stream of another device.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASH3_RETURN_IF_ERROR(cuda_call(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing(stream)"));
  if (capture != cudaStreamCaptureStatusNone) return Status::Ok();
  int dev = 0;
  FLASH3_RETURN_IF_ERROR(current_device(&dev));
  int stream_dev = 0;
  FLASH3_RETURN_IF_ERROR(stream_device(stream, &stream_dev));
  if (stream_dev == dev) return Status::Ok();
  return Status::Invalid("stream belongs to device " + std::to_string(stream_dev) + "; expected a stream of device " +
                         std::to_string(dev) + " (the current device, where the tensors are)");
}

}  // namespace flash3
