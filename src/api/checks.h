// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The checks every entry point's validation shares (checks.cpp), written
// once: validate.cpp (forward / backward), validate_kvcache.cpp,
// validate_combine.cpp and quantize.cpp use them. Internal to the library.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "api/overlap.h"
#include "api/validate.h"
#include "flash3/flash3.h"

namespace flash3 {
namespace checks {

constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int kMaxHeadDim = 256;
// Block ranges and masks add row, column, offset and window values in int32
// inside the kernels (windows are normalised below seqlen first).
constexpr int64_t kMaxSeqlenSum = std::numeric_limits<int32_t>::max() - 1024;
// Variable length: sequences (tiles of every sequence are counted in int32).
constexpr int64_t kMaxNumSequences = int64_t(1) << 30;
// TMA descriptors: byte strides below 2^40.
constexpr int64_t kMaxTmaStrideBytes = int64_t(1) << 40;

// Scales that enter the kernels' fp32 arithmetic: the kernels build with
// -use_fast_math, which flushes subnormal floats to 0 (a masked score would
// then become -inf * 0 = NaN), and the softmax multiplies a scale by log2(e)
// (which must stay finite). 0 is exact and allowed where it means something.
constexpr float kMinKernelFloat = std::numeric_limits<float>::min();  // 2^-126
constexpr float kMaxKernelFloat = std::numeric_limits<float>::max() / 2.f;  // * log2(e) stays finite
constexpr const char* kKernelFloatWhy =
    " (fp32's normal range: the kernels flush subnormal floats to 0, and the softmax multiplies the value by "
    "log2(e))";
bool kernel_float_ok(float x);

// Message pieces. Formatted with snprintf, never with iostreams (checks.cpp says why).
std::string dtype_str(DType t);
std::string fmt_float(float x);
std::string fmt_ptr(const void* p);
std::string stride_str(const TensorView& t);

// The role of a tensor decides its layout, dim names and stride rules.
enum class Role { kQ, kK, kV, kO, kLse };

struct Arg {
  const char* name;
  const TensorView* t;
  Role role;
  bool written;
};

bool is_lse(Role r);
int expected_ndim(Role r, bool varlen);
const char* const* dim_names(Role r, bool varlen);
std::string layout(Role r, bool varlen);
// Dimension / stride i of the tensor `name`, whose dims are named dims[0], dims[1], ...
std::string dim_label(const char* name, const char* const* dims, int i);
std::string stride_label(const char* name, const char* const* dims, int i);
std::string dim_label(const Arg& a, bool varlen, int i);
std::string stride_label(const Arg& a, bool varlen, int i);

// Layout rules shared by every tensor argument.
Status check_strides_nonnegative(const char* name, const TensorView& t, const char* const* dims);
Status check_last_contiguous(const char* name, const TensorView& t, const char* const* dims);
Status check_aligned(const char* name, const TensorView& t, uintptr_t align, const char* why);
// A written tensor: every element has its own memory.
Status check_written_layout(const char* name, const TensorView& t, const char* const* dims);
// The byte offset of the last element fits in int64 (the kernels' pointer arithmetic).
Status check_span_fits(const char* name, const TensorView& t);

// Outputs must not share memory with any other tensor of the call (inputs the
// kernels read while they write, or other outputs). A: Arg or a tensor kind
// of the same shape (name, t, written).
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
TensorView int_array_view(const int* p, int64_t n);

// The varlen arrays of opts, which the kernels read while they write the
// outputs: none may lie inside an output. (Arrays the host never reads: only
// their extents, from num_sequences, are known.)
struct VarlenArrays {
  TensorView cu_q, cu_k, used_q, used_k;
  explicit VarlenArrays(const AttentionOptions& o) {
    const int64_t n = o.num_sequences > 0 ? o.num_sequences : 0;
    cu_q = int_array_view(o.cu_seqlens_q, n + 1);
    cu_k = int_array_view(o.cu_seqlens_k, n + 1);
    used_q = int_array_view(o.seqused_q, n);
    used_k = int_array_view(o.seqused_k, n);
  }
};
Status check_varlen_arrays_not_written(const VarlenArrays& va, std::initializer_list<const Arg*> written);

// Options (every entry point's scalar and varlen rules).
Status check_softcap_ratio(const AttentionOptions& o, int64_t head_dim);
Status check_options(const AttentionOptions& o);

// Per-tensor checks of the attention tensors.
Status check_present(const Arg& a, bool varlen);
Status check_qdtype(const Arg& q, bool fp8_ok = false, const char* where = "");
Status check_fp8_forward(const ForwardArgs& args, bool varlen);
Status check_same_dtype(const Arg& a, const Arg& ref);
Status check_fp32(const Arg& a);
Status check_dim_eq(const Arg& a, int ia, const Arg& ref, int ir, bool varlen, const std::string& extra = "");
Status check_head_dim_range(const Arg& a, bool varlen);
// Head dims: k matches q, out matches v, both in range.
Status check_head_dims(const Arg& q, const Arg& k, const Arg& v, const Arg& o, bool varlen);
// Batch, seqlens, heads across q/k/v/out (head dims already checked).
Status check_geometry(const Arg& q, const Arg& k, const Arg& v, const Arg& o, bool varlen);
Status check_like(const Arg& a, const Arg& ref, bool varlen);
Status check_lse_shape(const Arg& l, const Arg& q, bool varlen);
// Strides and alignment (TMA's rules for the attention tensors).
Status check_layout(const Arg& a, bool varlen);
// Sizes the kernels' int32 index arithmetic and grids rely on.
Status check_limits(const Arg& q, const Arg& k, const AttentionOptions& opts, bool varlen);
bool is_varlen(const AttentionOptions& o);

// Each (name, pointer) in order (null: absent), then the current device.
Status check_device_pointers(std::initializer_list<std::pair<const char*, const void*>> ptrs);

}  // namespace checks

// Unit tests only: with false, validation skips the device checks (pointer
// kinds, sm_90, the stream's device), so it runs on host pointers without a
// GPU; nothing may be launched then. Process-wide; true by default.
void set_device_checks_for_testing(bool on);

}  // namespace flash3
