// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Argument validation (see validate.h for the order of the checks) and
// make_fwd_params(). Every message names the argument, the value seen and what
// was expected.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "api/overlap.h"
#include "combine/combine.h"
#include "common/cuda_check.h"
#include "launch/dispatch.h"

namespace flash3 {

namespace {

constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int kMaxHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;
// Block ranges and masks add row, column, offset and window values in int32
// inside the kernels (windows are normalised below seqlen first).
constexpr int64_t kMaxSeqlenSum = std::numeric_limits<int32_t>::max() - 1024;
// Variable length: sequences (tiles of every sequence are counted in int32).
constexpr int64_t kMaxNumSequences = int64_t(1) << 30;
// TMA descriptors: byte strides below 2^40.
constexpr int64_t kMaxTmaStrideBytes = int64_t(1) << 40;

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

// The role of a tensor decides its layout, dim names and stride rules.
enum class Role { kQ, kK, kV, kO, kLse };

struct Arg {
  const char* name;
  const TensorView* t;
  Role role;
  bool written;
};

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

// Outputs must not share memory with any other tensor of the call (inputs the
// kernels read while they write, or other outputs). A: Arg or CombineArg.
template <class A>
Status check_no_alias(const A& out, std::initializer_list<const A*> others) {
  for (const A* o : others) {
    if (o->t->data == nullptr) continue;
    if (views_overlap(*out.t, *o->t))
      return Status::Invalid(std::string(out.name) + " (data " + fmt_ptr(out.t->data) + ", shape " + shape_str(*out.t) +
                             ") overlaps " + o->name + " (data " + fmt_ptr(o->t->data) + ", shape " + shape_str(*o->t) +
                             "); expected " + out.name + " to have memory of its own (it is written while " + o->name +
                             (o->written ? " is written too)" : " is read)"));
  }
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

// The varlen arrays of opts, which the kernels read while they write the
// outputs: none may lie inside an output. (Arrays the host never reads: only
// their extents, from num_sequences, are known.)
struct VarlenArrays {
  TensorView cu_q, cu_k, used_q, used_k;
  explicit VarlenArrays(const AttentionOptions& o) {
    const int64_t n = std::max(o.num_sequences, 0);
    cu_q = int_array_view(o.cu_seqlens_q, n + 1);
    cu_k = int_array_view(o.cu_seqlens_k, n + 1);
    used_q = int_array_view(o.seqused_q, n);
    used_k = int_array_view(o.seqused_k, n);
  }
};
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
constexpr float kMinKernelFloat = std::numeric_limits<float>::min();  // 2^-126
constexpr float kMaxKernelFloat = std::numeric_limits<float>::max() / 2.f;  // * log2(e) stays finite
constexpr const char* kKernelFloatWhy =
    " (fp32's normal range: the kernels flush subnormal floats to 0, and the softmax multiplies the value by "
    "log2(e))";
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
Status check_qdtype(const Arg& q, bool fp8_ok = false, const char* where = "") {
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
Status check_dim_eq(const Arg& a, int ia, const Arg& ref, int ir, bool varlen, const std::string& extra = "") {
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

}  // namespace

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
// Structure.
// ---------------------------------------------------------------------------
Status check_forward_structure(const ForwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_options(args.opts));
  const bool varlen = is_varlen(args.opts);
  const Arg q{"q", &args.q, Role::kQ, false};
  const Arg k{"k", &args.k, Role::kK, false};
  const Arg v{"v", &args.v, Role::kV, false};
  const Arg o{"out", &args.out, Role::kO, true};
  const Arg l{"lse", &args.lse, Role::kLse, true};
  // A view with a shape but no data is an error (check_present), not "absent".
  const bool has_lse = args.lse.defined();

  for (const Arg* a : {&q, &k, &v, &o}) FLASH3_RETURN_IF_ERROR(check_present(*a, varlen));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_present(l, varlen));

  FLASH3_RETURN_IF_ERROR(check_qdtype(q, true));
  for (const Arg* a : {&k, &v}) FLASH3_RETURN_IF_ERROR(check_same_dtype(*a, q));
  if (args.q.dtype != DType::kFloat8E4M3) FLASH3_RETURN_IF_ERROR(check_same_dtype(o, q));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_fp32(l));

  FLASH3_RETURN_IF_ERROR(check_head_dims(q, k, v, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_softcap_ratio(args.opts, args.q.shape[args.q.ndim - 1]));
  FLASH3_RETURN_IF_ERROR(check_fp8_forward(args, varlen));
  FLASH3_RETURN_IF_ERROR(check_geometry(q, k, v, o, varlen));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_lse_shape(l, q, varlen));

  for (const Arg* a : {&q, &k, &v, &o}) FLASH3_RETURN_IF_ERROR(check_layout(*a, varlen));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_layout(l, varlen));
  FLASH3_RETURN_IF_ERROR(check_limits(q, k, args.opts, varlen));
  const Arg qd{"q_descale", &args.q_descale, Role::kLse, false};
  const Arg kd{"k_descale", &args.k_descale, Role::kLse, false};
  const Arg vd{"v_descale", &args.v_descale, Role::kLse, false};
  FLASH3_RETURN_IF_ERROR(check_no_alias(o, {&q, &k, &v, &qd, &kd, &vd}));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_no_alias(l, {&q, &k, &v, &o, &qd, &kd, &vd}));
  const VarlenArrays va(args.opts);
  if (has_lse) return check_varlen_arrays_not_written(va, {&o, &l});
  return check_varlen_arrays_not_written(va, {&o});
}

Status check_backward_structure(const BackwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_options(args.opts));
  const bool varlen = is_varlen(args.opts);
  const Arg q{"q", &args.q, Role::kQ, false};
  const Arg k{"k", &args.k, Role::kK, false};
  const Arg v{"v", &args.v, Role::kV, false};
  const Arg o{"out", &args.out, Role::kO, false};
  const Arg dout{"dout", &args.dout, Role::kO, false};
  const Arg lse{"lse", &args.lse, Role::kLse, false};
  const Arg dlse{"dlse", &args.dlse, Role::kLse, false};
  const Arg dq{"dq", &args.dq, Role::kQ, true};
  const Arg dk{"dk", &args.dk, Role::kK, true};
  const Arg dv{"dv", &args.dv, Role::kV, true};
  const bool has_dlse = args.dlse.defined();

  for (const Arg* a : {&q, &k, &v, &o, &dout, &lse, &dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_present(*a, varlen));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_present(dlse, varlen));

  FLASH3_RETURN_IF_ERROR(check_qdtype(q, false, "the backward"));
  for (const Arg* a : {&k, &v, &o, &dout, &dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_same_dtype(*a, q));
  FLASH3_RETURN_IF_ERROR(check_fp32(lse));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_fp32(dlse));

  FLASH3_RETURN_IF_ERROR(check_head_dims(q, k, v, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_softcap_ratio(args.opts, args.q.shape[args.q.ndim - 1]));
  FLASH3_RETURN_IF_ERROR(check_geometry(q, k, v, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dout, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dq, q, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dk, k, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dv, v, varlen));
  FLASH3_RETURN_IF_ERROR(check_lse_shape(lse, q, varlen));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_lse_shape(dlse, q, varlen));

  for (const Arg* a : {&q, &k, &v, &o, &dout, &lse, &dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_layout(*a, varlen));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_layout(dlse, varlen));
  FLASH3_RETURN_IF_ERROR(check_limits(q, k, args.opts, varlen));
  for (const Arg* g : {&dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_no_alias(*g, {&q, &k, &v, &o, &dout, &lse, &dlse}));
  FLASH3_RETURN_IF_ERROR(check_no_alias(dq, {&dk, &dv}));
  FLASH3_RETURN_IF_ERROR(check_no_alias(dk, {&dv}));
  return check_varlen_arrays_not_written(VarlenArrays(args.opts), {&dq, &dk, &dv});
}

bool forward_is_empty(const ForwardArgs& args) {
  // (max_seqlen_q 0: every sequence has no query rows, by the caller's contract.)
  if (is_varlen(args.opts))
    return args.opts.num_sequences == 0 || args.q.shape[0] == 0 || args.opts.max_seqlen_q == 0;
  return args.q.shape[0] == 0 || args.q.shape[1] == 0;
}

bool backward_is_empty(const BackwardArgs& args) {
  // Without query rows dK = dV = 0 must still be written (varlen too).
  if (is_varlen(args.opts)) return args.opts.num_sequences == 0 || (args.q.shape[0] == 0 && args.k.shape[0] == 0);
  // Without query rows dK = dV = 0 must still be written (and without keys
  // dQ = 0): only a problem with neither has nothing to compute.
  return args.q.shape[0] == 0 || (args.q.shape[1] == 0 && args.k.shape[1] == 0);
}

// ---------------------------------------------------------------------------
// Kernel availability.
// ---------------------------------------------------------------------------
std::string built_kernels_list(bool forward_pass) {
  std::string out;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (int d = 8; d <= kMaxHeadDim; d += 8)
      for (int dv = 8; dv <= kMaxHeadDim; dv += 8) {
        const bool built = forward_pass ? fwd_kernel_built(dt, d, dv) : bwd_kernel_built(dt, d, dv);
        if (built) out += (out.empty() ? "" : ", ") + std::string(dtype_name(dt)) + " " + std::to_string(d) + "x" + std::to_string(dv);
      }
  return out.empty() ? "none" : out;
}

Status check_kernel_built(bool forward_pass, DType dtype, int head_dim, int head_dim_v, float softcap) {
  const bool built = forward_pass ? fwd_kernel_built(dtype, head_dim, head_dim_v) : bwd_kernel_built(dtype, head_dim, head_dim_v);
  if (built && softcap > 0.f) {
    // The feature's own units (FLASH3_FEATURES), present or not for every built kernel.
    const bool capped = forward_pass ? fwd_kernel_built(dtype, head_dim, head_dim_v, ScoreModKind::kSoftcap)
                                     : bwd_kernel_built(dtype, head_dim, head_dim_v, ScoreModKind::kSoftcap);
    if (capped) return Status::Ok();
    return Status::NotSupported("opts.softcap: " + std::string(forward_pass ? "forward" : "backward") +
                                " softcap kernels are not built in this library (FLASH3_FEATURES has no softcap)");
  }
  if (built) return Status::Ok();
  return Status::NotSupported(std::string(forward_pass ? "forward" : "backward") + " kernel for dtype " + dtype_str(dtype) +
                              ", head_dim " + std::to_string(head_dim) + ", head_dim_v " + std::to_string(head_dim_v) +
                              " is not built in this library (built " + (forward_pass ? "forward" : "backward") +
                              " kernels, dtype d x dv: " + built_kernels_list(forward_pass) +
                              "; see FLASH3_DTYPES / FLASH3_HDIMS / FLASH3_PASSES)");
}

// ---------------------------------------------------------------------------
// Device.
// ---------------------------------------------------------------------------
bool device_check_skipped() {
  const char* e = std::getenv("FLASH3_SKIP_DEVICE_CHECK");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

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

namespace {
// Each (name, pointer) in order (null: absent), then the current device.
Status check_device_pointers(std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  for (const auto& p : ptrs) FLASH3_RETURN_IF_ERROR(check_device_pointer(p.first, p.second));
  return check_current_device();
}
}  // namespace

Status check_forward_device(const ForwardArgs& args) {
  return check_device_pointers({{"q.data", args.q.data},
                                {"k.data", args.k.data},
                                {"v.data", args.v.data},
                                {"out.data", args.out.data},
                                {"lse.data", args.lse.data},
                                {"q_descale.data", args.q_descale.data},
                                {"k_descale.data", args.k_descale.data},
                                {"v_descale.data", args.v_descale.data},
                                {"opts.cu_seqlens_q", args.opts.cu_seqlens_q},
                                {"opts.cu_seqlens_k", args.opts.cu_seqlens_k},
                                {"opts.seqused_q", args.opts.seqused_q},
                                {"opts.seqused_k", args.opts.seqused_k}});
}

Status check_backward_device(const BackwardArgs& args) {
  return check_device_pointers(
      {{"q.data", args.q.data},        {"k.data", args.k.data},       {"v.data", args.v.data},
       {"out.data", args.out.data},    {"dout.data", args.dout.data}, {"lse.data", args.lse.data},
       {"dlse.data", args.dlse.data},  {"dq.data", args.dq.data},     {"dk.data", args.dk.data},
       {"dv.data", args.dv.data},      {"workspace", args.workspace}, {"opts.cu_seqlens_q", args.opts.cu_seqlens_q},
       {"opts.cu_seqlens_k", args.opts.cu_seqlens_k}, {"opts.seqused_q", args.opts.seqused_q},
       {"opts.seqused_k", args.opts.seqused_k}});
}

// ---------------------------------------------------------------------------
// Public validation entry points.
// ---------------------------------------------------------------------------
Status validate_forward(const ForwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_forward_structure(args));
  if (forward_is_empty(args)) return Status::Ok();
  const int last = args.q.ndim - 1;
  FLASH3_RETURN_IF_ERROR(check_kernel_built(true, args.q.dtype, static_cast<int>(args.q.shape[last]),
                                            static_cast<int>(args.v.shape[last]), args.opts.softcap));
  if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_forward_device(args));
  return Status::Ok();
}

Status validate_backward(const BackwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_backward_structure(args));
  if (backward_is_empty(args)) return Status::Ok();
  const int last = args.q.ndim - 1;
  FLASH3_RETURN_IF_ERROR(check_kernel_built(false, args.q.dtype, static_cast<int>(args.q.shape[last]),
                                            static_cast<int>(args.v.shape[last]), args.opts.softcap));
  if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_backward_device(args));
  return Status::Ok();
}

int64_t batch_per_launch(int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv) {
  constexpr int64_t kMinTile = 64;  // the smallest tile_m / tile_n of any kernel
  // Half of INT32_MAX: the backward's split plan adds up to a few waves of CTAs.
  constexpr int64_t kMaxTiles = std::numeric_limits<int32_t>::max() / 2;
  const int64_t per_batch = std::max<int64_t>({(seqlen_q + kMinTile - 1) / kMinTile * heads_q,
                                               (seqlen_k + kMinTile - 1) / kMinTile * heads_kv, int64_t(1)});
  return std::min<int64_t>(kMaxGridYZ, kMaxTiles / per_batch);
}

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

// ---------------------------------------------------------------------------
// Lowering.
// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// Combine (split-KV): structure, device, lowering.
// ---------------------------------------------------------------------------
namespace {

// A combine tensor: its dims are a window [first, first + ndim) of
// (num_splits, batch, seqlen, heads, head_dim).
struct CombineArg {
  const char* name;
  const TensorView* t;
  int first, ndim;
  bool written;
};

const char* const kCombineDimNames[] = {"num_splits", "batch", "seqlen", "heads", "head_dim"};

std::string combine_layout(const CombineArg& a) {
  std::string s = "(";
  for (int i = 0; i < a.ndim; ++i) s += (i ? ", " : "") + std::string(kCombineDimNames[a.first + i]);
  return s + ")";
}

std::string combine_dim_label(const CombineArg& a, int i) { return dim_label(a.name, kCombineDimNames + a.first, i); }

// Presence, ndim, sizes (each dim in [0, INT32_MAX]: the kernel holds them in int), null data.
Status check_combine_present(const CombineArg& a) {
  const TensorView& t = *a.t;
  if (!t.defined())
    return Status::Invalid(std::string(a.name) + " is missing (data is null and ndim is 0); expected a " +
                           std::to_string(a.ndim) + "-d tensor " + combine_layout(a));
  if (t.ndim != a.ndim)
    return Status::Invalid(std::string(a.name) + ".ndim is " + std::to_string(t.ndim) + "; expected " +
                           std::to_string(a.ndim) + ": " + combine_layout(a));
  for (int i = 0; i < a.ndim; ++i) {
    if (t.shape[i] < 0)
      return Status::Invalid(combine_dim_label(a, i) + " is " + std::to_string(t.shape[i]) + "; expected >= 0");
    if (t.shape[i] > kMaxDim)
      return Status::Invalid(combine_dim_label(a, i) + " is " + std::to_string(t.shape[i]) +
                             "; expected <= 2147483647 (INT32_MAX: the combine kernel indexes it in int32)");
  }
  if (t.data == nullptr && t.numel() > 0)
    return Status::Invalid(std::string(a.name) + ".data is null; expected a device pointer (" + a.name +
                           " has shape " + shape_str(t) + ")");
  return Status::Ok();
}

// a's dims match out_partial's over a's window.
Status check_combine_shape(const CombineArg& a, const CombineArg& op) {
  for (int i = 0; i < a.ndim; ++i) {
    const int64_t want = op.t->shape[a.first + i];
    if (a.t->shape[i] != want)
      return Status::Invalid(combine_dim_label(a, i) + " is " + std::to_string(a.t->shape[i]) + "; expected " +
                             std::to_string(want) + " to match " + op.name + ".shape[" + std::to_string(a.first + i) +
                             "] (" + a.name + " must be " + combine_layout(a) + ", " + op.name + " is " +
                             shape_str(*op.t) + ")");
  }
  return Status::Ok();
}

// Strides and alignment. unit_last: head_dim must be contiguous; vec_mult:
// the other strides must be multiples of it and the data aligned to
// vec_mult elements (out_partial's float4 reads); otherwise the data is
// aligned to its element size.
Status check_combine_layout(const CombineArg& a, bool unit_last, int vec_mult) {
  const TensorView& t = *a.t;
  const char* const* dims = kCombineDimNames + a.first;
  const int last = t.ndim - 1;
  const int esize = dtype_size(t.dtype);
  FLASH3_RETURN_IF_ERROR(check_strides_nonnegative(a.name, t, dims));
  // dims[last] is head_dim.
  if (unit_last) FLASH3_RETURN_IF_ERROR(check_last_contiguous(a.name, t, dims));
  if (vec_mult > 1) {
    for (int i = 0; i < last; ++i)
      if (t.shape[i] > 1 && t.stride[i] % vec_mult != 0)
        return Status::Invalid(stride_label(a.name, dims, i) + " is " + std::to_string(t.stride[i]) +
                               "; expected a multiple of " + std::to_string(vec_mult) + " elements (" +
                               std::to_string(vec_mult * esize) + " bytes: the combine kernel reads " +
                               std::to_string(vec_mult * esize) + "-byte vectors)");
  }
  FLASH3_RETURN_IF_ERROR(check_aligned(a.name, t, uintptr_t(std::max(1, vec_mult) * esize), ""));
  if (a.written) FLASH3_RETURN_IF_ERROR(check_written_layout(a.name, t, dims));
  return check_span_fits(a.name, t);
}

}  // namespace

bool combine_is_empty(const CombineArgs& args) {
  const TensorView& op = args.out_partial;
  return op.shape[1] == 0 || op.shape[2] == 0 || op.shape[3] == 0;
}

Status check_combine_structure(const CombineArgs& args) {
  const CombineArg op{"out_partial", &args.out_partial, 0, 5, false};
  const CombineArg lp{"lse_partial", &args.lse_partial, 0, 4, false};
  const CombineArg o{"out", &args.out, 1, 4, true};
  const CombineArg l{"lse", &args.lse, 1, 3, true};
  // A view with a shape but no data is an error (check_combine_present), not "absent".
  const bool has_lse = args.lse.defined();

  for (const CombineArg* a : {&op, &lp, &o}) FLASH3_RETURN_IF_ERROR(check_combine_present(*a));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_combine_present(l));

  for (const CombineArg* a : {&op, &lp}) {
    if (a->t->dtype != DType::kFloat32)
      return Status::Invalid(std::string(a->name) + ".dtype is " + dtype_str(a->t->dtype) +
                             "; expected fp32 (the split-KV partials are fp32)");
  }
  const DType odt = args.out.dtype;
  if (odt != DType::kBFloat16 && odt != DType::kFloat16 && odt != DType::kFloat32)
    return Status::Invalid("out.dtype is " + dtype_str(odt) + "; expected bf16, fp16 or fp32");
  if (has_lse && args.lse.dtype != DType::kFloat32)
    return Status::Invalid("lse.dtype is " + dtype_str(args.lse.dtype) + "; expected fp32");

  const int64_t splits = args.out_partial.shape[0], head_dim = args.out_partial.shape[4];
  if (splits < 1 || splits > kMaxCombineSplits)
    return Status::Invalid(combine_dim_label(op, 0) + " is " + std::to_string(splits) + "; expected 1 to " +
                           std::to_string(kMaxCombineSplits));
  if (head_dim < 1 || head_dim > kMaxCombineHeadDim || head_dim % 4 != 0)
    return Status::Invalid("unsupported head dim: " + combine_dim_label(op, 4) + " is " + std::to_string(head_dim) +
                           "; expected a multiple of 4 in [4, " + std::to_string(kMaxCombineHeadDim) +
                           "] (the combine kernel reads float4s)");
  FLASH3_RETURN_IF_ERROR(check_combine_shape(lp, op));
  FLASH3_RETURN_IF_ERROR(check_combine_shape(o, op));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_combine_shape(l, op));

  FLASH3_RETURN_IF_ERROR(check_combine_layout(op, /*unit_last=*/true, /*vec_mult=*/4));
  FLASH3_RETURN_IF_ERROR(check_combine_layout(lp, false, 1));
  FLASH3_RETURN_IF_ERROR(check_combine_layout(o, true, 1));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_combine_layout(l, false, 1));

  FLASH3_RETURN_IF_ERROR(check_no_alias(o, {&op, &lp}));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_no_alias(l, {&op, &lp, &o}));
  return Status::Ok();
}

namespace {
// The stride of a combine tensor's dimension i for the kernel: 0 for a
// dimension of size 1 (its index is always 0; validation accepts any stride
// there, which must not break the kernel's alignment).
int64_t combine_stride(const TensorView& t, int i) { return t.shape[i] > 1 ? t.stride[i] : 0; }

}  // namespace

Status check_combine_device(const CombineArgs& args) {
  return check_device_pointers({{"out_partial.data", args.out_partial.data},
                                {"lse_partial.data", args.lse_partial.data},
                                {"out.data", args.out.data},
                                {"lse.data", args.lse.data}});
}

Status validate_combine(const CombineArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_combine_structure(args));
  if (combine_is_empty(args)) return Status::Ok();
  if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_combine_device(args));
  return Status::Ok();
}

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

// The stride between consecutive rows of dims (d0, d1) read as one dimension
// of shape[d0] * shape[d1] rows, or -1 when they are not one stride apart.
int64_t merged_row_stride(const TensorView& t, int d0, int d1) {
  if (t.shape[d0] <= 1) return t.stride[d1];
  if (t.shape[d1] <= 1) return t.stride[d0];
  return t.stride[d0] == t.shape[d1] * t.stride[d1] ? t.stride[d1] : -1;
}

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

struct KVCacheShape {
  bool varlen_q = false, varlen_new = false;
  int64_t b = 0;        // sequences
  int64_t sq = 0;       // queries per sequence (varlen: opts.max_seqlen_q)
  int64_t total_q = 0;  // q's rows
  int64_t hq = 0, d = 0, dv = 0, hkv = 0;
  int qd = 4;           // q's / out's ndim
};

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

bool kvcache_has_queries(const KVCacheArgs& a) {
  const KVCacheShape s = kvcache_shape(a);
  return s.b > 0 && s.total_q > 0 && s.sq > 0;
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
