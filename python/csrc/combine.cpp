// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Split-KV combine (flash3::combine, FlashAttention-3's fwd_combine); common.h describes the
// extension.
#include "common.h"

#include <c10/cuda/CUDAGuard.h>

namespace flash3_torch {

namespace {

// The shared checks of combine's CUDA and CPU kernels and its fake implementation (which
// raises the same messages): devices, dtypes, ranks and shapes.
void check_combine_inputs(const Tensor& out_partial, const Tensor& lse_partial, const Tensor& out,
                          const Tensor& softmax_lse) {
  check_cuda(out_partial, "out_partial");
  check_cuda_on_device_of({{lse_partial, "lse_partial"}, {out, "out"}, {softmax_lse, "softmax_lse"}}, out_partial,
                          "out_partial");
  if (!(out_partial.scalar_type() == at::kFloat)) type_error("flash3: out_partial.dtype is ", dtype_str(out_partial.scalar_type()), "; expected torch.float32 (the split-KV partials are fp32)");
  if (!(lse_partial.scalar_type() == at::kFloat)) type_error("flash3: lse_partial.dtype is ", dtype_str(lse_partial.scalar_type()), "; expected torch.float32");
  const auto odt = out.scalar_type();
  if (!(odt == at::kFloat || odt == at::kHalf || odt == at::kBFloat16)) type_error("flash3: out.dtype is ", dtype_str(odt), "; expected torch.float32, torch.float16 or torch.bfloat16");
  if (!(softmax_lse.scalar_type() == at::kFloat)) type_error("flash3: softmax_lse.dtype is ", dtype_str(softmax_lse.scalar_type()), "; expected torch.float32");
  if (!(out_partial.dim() == 5)) value_error("flash3: out_partial has ", out_partial.dim(), " dimensions (shape ", shape_str(out_partial), "); expected a 5-d tensor (num_splits, batch, seqlen, num_heads, head_dim)");
  const int64_t ns = out_partial.size(0), b = out_partial.size(1), sq = out_partial.size(2), h = out_partial.size(3),
                d = out_partial.size(4);
  if (!(ns >= 1 && ns <= 256)) value_error("flash3: out_partial.shape[0] (num_splits) is ", ns, "; expected 1 to 256");
  if (!(d >= 1 && d <= flash3::kMaxCombineHeadDim)) value_error("flash3: out_partial.shape[4] (head_dim) is ", d, "; expected 1 to ", flash3::kMaxCombineHeadDim);
  const auto want_lp = std::vector<int64_t>{ns, b, sq, h};
  if (!(lse_partial.sizes() == at::IntArrayRef(want_lp))) value_error("flash3: lse_partial has shape ", shape_str(lse_partial), "; expected ", c10::IntArrayRef(want_lp), " (num_splits, batch, seqlen, num_heads) to match out_partial ", shape_str(out_partial));
  const auto want_o = std::vector<int64_t>{b, sq, h, d};
  if (!(out.sizes() == at::IntArrayRef(want_o))) value_error("flash3: out has shape ", shape_str(out), "; expected ", c10::IntArrayRef(want_o), " (batch, seqlen, num_heads, head_dim) to match out_partial ", shape_str(out_partial));
  const auto want_l = std::vector<int64_t>{b, sq, h};
  if (!(softmax_lse.sizes() == at::IntArrayRef(want_l))) value_error("flash3: softmax_lse has shape ", shape_str(softmax_lse), "; expected ", c10::IntArrayRef(want_l), " (batch, seqlen, num_heads) to match out_partial ", shape_str(out_partial));
}

// Whether the library's combine reads t (out_partial) as is: unit head_dim stride, head_dim a
// multiple of 4, the other strides multiples of 4 elements, 16-byte aligned data.
bool combine_readable(const Tensor& t) {
  if (t.size(-1) % 4 != 0 || (t.size(-1) > 1 && t.stride(-1) != 1)) return false;
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    if (t.size(i) > 1 && t.stride(i) % 4 != 0) return false;
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

// flash3::combine into `out` and `softmax_lse` (written in place; FlashAttention-3's
// fwd_combine semantics). What the library does not take as is gets a temporary: out_partial
// with a head_dim that is not a multiple of 4 is zero-padded (as FlashAttention-3 does), one
// with other strides is copied; out is written through a temporary when its head_dim is padded
// or not contiguous. Every check here precedes the first allocation; the library's own (strides,
// outputs overlapping the inputs or each other) raise ValueError before anything is launched.
void combine_cuda(const Tensor& out_partial, const Tensor& lse_partial, const Tensor& out, const Tensor& softmax_lse) {
  check_combine_inputs(out_partial, lse_partial, out, softmax_lse);
  const c10::cuda::CUDAGuard guard(out_partial.device());
  if (out.numel() == 0 && softmax_lse.numel() == 0) return;
  const int64_t d = out_partial.size(4), d4 = (d + 3) / 4 * 4;
  Tensor op = out_partial;
  if (!combine_readable(op)) {
    if (d4 != d) {
      auto sizes = op.sizes().vec();
      sizes[4] = d4;
      Tensor padded = at::zeros(sizes, op.options());
      padded.narrow(4, 0, d).copy_(op);
      op = padded;
    } else {
      op = op.contiguous();
    }
  }
  const bool direct_out = d4 == d && (d == 1 || out.stride(-1) == 1);
  Tensor o = direct_out ? out : at::empty({out.size(0), out.size(1), out.size(2), d4}, out.options());
  flash3::CombineArgs args;
  args.out_partial = view(op);
  args.lse_partial = view(lse_partial);
  args.out = view(o);
  args.lse = view(softmax_lse);
  throw_if_error(flash3::combine(args, current_stream(out_partial)), "combine");
  if (!direct_out) out.copy_(o.narrow(3, 0, d));
}

void combine_cpu(const Tensor& out_partial, const Tensor& lse_partial, const Tensor& out, const Tensor& softmax_lse) {
  check_combine_inputs(out_partial, lse_partial, out, softmax_lse);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");
}

}  // namespace flash3_torch
