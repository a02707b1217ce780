// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Validation of combine() (split-KV): structure, emptiness, device.
#include <algorithm>
#include <cstdint>
#include <string>

#include "api/checks.h"
#include "api/validate.h"
#include "common/cuda_check.h"
#include "combine/combine.h"

namespace flash3 {

using namespace checks;

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

}  // namespace flash3
