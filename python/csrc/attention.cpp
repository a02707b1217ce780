// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Fixed-length attention (flash3::fwd / flash3::bwd and fwd's autograd), the FP8 forward
// (flash3::fwd_fp8) and its quantization (flash3::quantize_fp8); common.h describes the extension.
#include "common.h"

#include <c10/cuda/CUDAGuard.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>

namespace flash3_torch {

namespace {

// All the tensor checks of the forward, in the order a user would want to hear about them.
void check_forward_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool fp8 = false) {
  check_qkv_tensors(q, k, v, /*varlen=*/false, fp8);
  if (!(k.size(0) == q.size(0))) value_error("flash3: k.shape[0] (batch) is ", k.size(0), "; expected ", q.size(0), " to match q.shape[0] (q ", shape_str(q), ", k ", shape_str(k), ")");
  if (!(v.size(0) == q.size(0))) value_error("flash3: v.shape[0] (batch) is ", v.size(0), "; expected ", q.size(0), " to match q.shape[0] (q ", shape_str(q), ", v ", shape_str(v), ")");
  if (!(v.size(1) == k.size(1))) value_error("flash3: v.shape[1] (seqlen_k) is ", v.size(1), "; expected ", k.size(1), " to match k.shape[1] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(v.size(2) == k.size(2))) value_error("flash3: v.shape[2] (num_heads_kv) is ", v.size(2), "; expected ", k.size(2), " to match k.shape[2] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(k.size(3) == q.size(3))) value_error("flash3: k.shape[3] (head_dim) is ", k.size(3), "; expected ", q.size(3), " to match q.shape[3] (q ", shape_str(q), ", k ", shape_str(k), ")");
  if (!(k.size(2) >= 1 && q.size(2) % k.size(2) == 0)) value_error("flash3: q.shape[2] (num_heads_q) is ", q.size(2), ", which is not a multiple of k.shape[2] (num_heads_kv) ", k.size(2), "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  check_head_dim(q, v);
}

// ---------------------------------------------------------------------------
// CUDA kernels.
// ---------------------------------------------------------------------------
// One fixed-length forward call: out (out_dtype) and lse allocated, scratch
// from the caching allocator, then flash3::forward on the current stream.
// descales: q / k / v's FP8 descales (undefined tensors: none).
std::tuple<Tensor, Tensor> run_fixed_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const flash3::AttentionOptions& opts, at::ScalarType out_dtype,
                                             std::array<std::optional<Tensor>, 3> descales, const char* what) {
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t b = q.size(0), sq = q.size(1), hq = q.size(2), dv = v.size(3);
  Tensor out = at::empty({b, sq, hq, dv}, q.options().dtype(out_dtype));
  Tensor lse = at::empty({b, hq, sq}, q.options().dtype(at::kFloat));

  flash3::ForwardArgs args = forward_args(q, k, v, out, lse);
  if (descales[0]) args.q_descale = view(*descales[0]);
  if (descales[1]) args.k_descale = view(*descales[1]);
  if (descales[2]) args.v_descale = view(*descales[2]);
  args.opts = opts;
  launch_forward(args, q, what);
  return {out, lse};
}

// FP8 forward (FlashAttention-3's flash_attn_func with float8_e4m3fn q / k / v):
// out bf16, descales fp32 or None (1), each (batch, num_heads_kv) or block
// scales (batch, heads, ceil(seqlen / 128)) with q's heads / seqlen for
// q_descale and k's for k_descale / v_descale. Forward only.
void check_fp8_descale(const std::optional<Tensor>& d, const char* name, const Tensor& q, int64_t b, int64_t hkv,
                       int64_t heads, int64_t seqlen) {
  if (!d) return;
  check_cuda(*d, name);
  check_same_device(*d, name, q, "q");
  if (!(d->scalar_type() == at::kFloat)) type_error("flash3: ", name, ".dtype is ", dtype_str(d->scalar_type()), "; expected torch.float32");
  const int64_t blocks = (seqlen + flash3::kFp8ScaleBlock - 1) / flash3::kFp8ScaleBlock;
  const bool per_head = d->dim() == 2 && d->size(0) == b && d->size(1) == hkv;
  const bool per_block = d->dim() == 3 && d->size(0) == b && d->size(1) == heads && d->size(2) == blocks;
  if (!(per_head || per_block)) value_error("flash3: ", name, " has shape ", shape_str(*d), "; expected (batch, num_heads_kv) = (", b, ", ", hkv, ") or block scales (batch, num_heads, ceil(seqlen / ", flash3::kFp8ScaleBlock, ")) = (", b, ", ", heads, ", ", blocks, ")");
}

}  // namespace

std::tuple<Tensor, Tensor> fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                    int64_t window_right, double softcap, bool deterministic, int64_t pack_gqa,
                                    int64_t num_splits) {
  check_forward_inputs(q, k, v);
  check_forward_scalars(softmax_scale, softcap, pack_gqa, num_splits);
  flash3::AttentionOptions opts =
      make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic);
  set_launch_opts(&opts, pack_gqa, num_splits);
  return run_fixed_forward(q, k, v, opts, q.scalar_type(), {}, "forward");
}

std::tuple<Tensor, Tensor> fwd_fp8_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const std::optional<Tensor>& q_descale, const std::optional<Tensor>& k_descale,
                                        const std::optional<Tensor>& v_descale, std::optional<double> softmax_scale,
                                        bool causal, int64_t window_left, int64_t window_right) {
  check_forward_inputs(q, k, v, /*fp8=*/true);
  check_softmax_scale(softmax_scale);
  const int64_t b = q.size(0), hkv = k.size(2);
  check_fp8_descale(q_descale, "q_descale", q, b, hkv, q.size(2), q.size(1));
  check_fp8_descale(k_descale, "k_descale", q, b, hkv, hkv, k.size(1));
  check_fp8_descale(v_descale, "v_descale", q, b, hkv, hkv, k.size(1));
  return run_fixed_forward(q, k, v, make_opts(softmax_scale, causal, window_left, window_right, 0.0, false),
                           at::kBFloat16, {q_descale, k_descale, v_descale}, "fp8 forward");
}

// FP8 quantization for fwd_fp8 (flash3::quantize_fp8): x (batch, seqlen, heads, head_dim) fp16 /
// bf16 -> (e4m3 tensor of x's shape, fp32 descales: (batch, heads / heads_per_scale), or with
// block_scales (batch, heads, ceil(seqlen / 128))).
std::tuple<Tensor, Tensor> quantize_fp8_cuda(const Tensor& x, int64_t heads_per_scale, bool block_scales,
                                             bool hadamard, int64_t hadamard_seed,
                                             const std::optional<Tensor>& rotary_cos,
                                             const std::optional<Tensor>& rotary_sin, bool rotary_interleaved) {
  check_cuda(x, "x");
  if (!(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16)) type_error("flash3: x.dtype is ", dtype_str(x.scalar_type()), "; expected torch.float16 or torch.bfloat16");
  check_4d(x, "x", "(batch, seqlen, num_heads, head_dim)");
  check_last_dim_contiguous(x, "x", "head_dim");
  if (!(heads_per_scale >= 1 && x.size(2) % heads_per_scale == 0)) value_error("flash3: heads_per_scale is ", heads_per_scale, "; expected a divisor of x.shape[2] (num_heads) ", x.size(2));
  const c10::cuda::CUDAGuard guard(x.device());
  Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  if (block_scales && heads_per_scale != 1) value_error("flash3: heads_per_scale is ", heads_per_scale, " with block_scales=True; expected 1 (block scales are per head)");
  Tensor descale =
      block_scales
          ? at::empty({x.size(0), x.size(2), (x.size(1) + flash3::kFp8ScaleBlock - 1) / flash3::kFp8ScaleBlock},
                      x.options().dtype(at::kFloat))
          : at::empty({x.size(0), x.size(2) / heads_per_scale}, x.options().dtype(at::kFloat));
  flash3::QuantizeFp8Args a;
  a.x = view(x);
  a.out = view(out);
  a.descale = view(descale);
  a.heads_per_scale = static_cast<int>(heads_per_scale);
  a.block_scales = block_scales;
  a.hadamard = hadamard;
  a.hadamard_seed = static_cast<uint64_t>(hadamard_seed);
  for (const auto& [t, name] : {std::pair<const std::optional<Tensor>*, const char*>{&rotary_cos, "rotary_cos"},
                                {&rotary_sin, "rotary_sin"}}) {
    if (!*t) continue;
    check_cuda(**t, name);
    check_same_device(**t, name, x, "x");
  }
  if (rotary_cos) a.rotary_cos = view(*rotary_cos);
  if (rotary_sin) a.rotary_sin = view(*rotary_sin);
  a.rotary_interleaved = rotary_interleaved;
  throw_if_error(flash3::quantize_fp8(a, current_stream(x)), "quantize_fp8");
  return {out, descale};
}

std::tuple<Tensor, Tensor> fwd_fp8_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const std::optional<Tensor>&, const std::optional<Tensor>&,
                                       const std::optional<Tensor>&, std::optional<double>, bool, int64_t, int64_t) {
  check_forward_inputs(q, k, v, /*fp8=*/true);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");  // [[noreturn]]: nothing to return
}

std::tuple<Tensor, Tensor, Tensor> bwd_cuda(const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse_in,
                                            std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                            int64_t window_right, double softcap, bool deterministic) {
  check_forward_inputs(q, k, v);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_backward_device_dtype(dout_in, q, out, lse);
  const auto ref_out = std::vector<int64_t>{q.size(0), q.size(1), q.size(2), v.size(3)};
  if (!(out.sizes() == at::IntArrayRef(ref_out))) value_error("flash3: out has shape ", shape_str(out), "; expected ", c10::IntArrayRef(ref_out), " (batch, seqlen_q, num_heads_q, head_dim_v)");
  check_dout_shape(dout_in, out);
  check_backward_kernel(q, v);
  check_dlse(dlse_in, lse, q);
  const c10::cuda::CUDAGuard guard(q.device());
  return run_backward(q, k, v, backward_inputs(dout_in, out, lse, dlse_in),
                      make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic),
                      /*zero_grads=*/false, "backward");
}

// CPU "kernels": only reached when every tensor argument is on the CPU.
std::tuple<Tensor, Tensor> fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double>, bool,
                                   int64_t, int64_t, double, bool, int64_t, int64_t) {
  check_forward_inputs(q, k, v);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");  // [[noreturn]]: nothing to return
}

std::tuple<Tensor, Tensor, Tensor> bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                           std::optional<double>, bool, int64_t, int64_t, double, bool) {
  check_forward_inputs(q, k, v);
  check_cuda(dout, "dout");
  runtime_error("flash3: unreachable");  // [[noreturn]]: nothing to return
}

// ---------------------------------------------------------------------------
// Autograd.
// ---------------------------------------------------------------------------
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<Tensor, Tensor> call_fwd_below_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   std::optional<double> softmax_scale, bool causal,
                                                   int64_t window_left, int64_t window_right, double softcap,
                                                   bool deterministic, int64_t pack_gqa, int64_t num_splits) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::fwd", "")
                       .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                         std::optional<double>, bool, int64_t, int64_t, double, bool,
                                                         int64_t, int64_t)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic, pack_gqa,
                 num_splits);
}

std::tuple<Tensor, Tensor, Tensor> call_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse,
                                            std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                            int64_t window_right, double softcap, bool deterministic) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::bwd", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, std::optional<double>, bool, int64_t, int64_t, double, bool)>();
  return op.call(dout, q, k, v, out, lse, dlse, softmax_scale, causal, window_left, window_right, softcap,
                 deterministic);
}

class FlashAttnFunction : public torch::autograd::Function<FlashAttnFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               std::optional<double> softmax_scale, bool causal, int64_t window_left,
                               int64_t window_right, double softcap, bool deterministic, int64_t pack_gqa,
                               int64_t num_splits) {
    auto [out, lse] = call_fwd_below_autograd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
                                              deterministic, pack_gqa, num_splits);
    ctx->save_for_backward({q, k, v, out, lse});
    save_options(ctx->saved_data, softmax_scale, causal, window_left, window_right, softcap, deterministic);
    // Gradients of unused outputs arrive undefined: an unused softmax_lse costs nothing in
    // backward (no dlse term), an unused out gets a zero dout.
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    Tensor dout = grads[0];
    const Tensor& dlse = grads[1];
    if (!dout.defined()) dout = at::zeros_like(out);
    const std::optional<double> scale = saved_softmax_scale(ctx->saved_data);
    std::optional<Tensor> dlse_opt;
    if (dlse.defined()) dlse_opt = dlse;
    auto [dq, dk, dv] = call_bwd(dout, q, k, v, out, lse, dlse_opt, scale, ctx->saved_data["causal"].toBool(),
                                 ctx->saved_data["wl"].toInt(), ctx->saved_data["wr"].toInt(),
                                 ctx->saved_data["softcap"].toDouble(), ctx->saved_data["deterministic"].toBool());
    // No pack_gqa / num_splits for the backward: forward-only options.
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

std::tuple<Tensor, Tensor> fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                        std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                        int64_t window_right, double softcap, bool deterministic, int64_t pack_gqa,
                                        int64_t num_splits) {
  const bool needs_grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!needs_grad)  // inference: no autograd node at all
    return call_fwd_below_autograd(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                                   pack_gqa, num_splits);
  auto r = FlashAttnFunction::apply(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                                    pack_gqa, num_splits);
  return {r[0], r[1]};
}

// ---------------------------------------------------------------------------
// The Python module's overhead benchmark.
// ---------------------------------------------------------------------------
// The overhead benchmark's "direct C++ call": `iters` calls of flash3::forward on the
// current stream with preallocated out/lse, each building its ForwardArgs from scratch as a
// C++ caller would. Returns the host wall time per call in microseconds (no synchronisation
// inside: call torch.cuda.synchronize() afterwards).
double bench_direct_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, bool causal,
                            int64_t iters) {
  check_forward_inputs(q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = current_stream(q);
  void *qp = q.data_ptr(), *kp = k.data_ptr(), *vp = v.data_ptr(), *op = out.data_ptr(), *lp = lse.data_ptr();
  const auto dt = to_f3(q.scalar_type());
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    flash3::ForwardArgs a;
    a.q = flash3::TensorView::make4d(qp, dt, q.size(0), q.size(1), q.size(2), q.size(3), q.stride(0), q.stride(1),
                                     q.stride(2), q.stride(3));
    a.k = flash3::TensorView::make4d(kp, dt, k.size(0), k.size(1), k.size(2), k.size(3), k.stride(0), k.stride(1),
                                     k.stride(2), k.stride(3));
    a.v = flash3::TensorView::make4d(vp, dt, v.size(0), v.size(1), v.size(2), v.size(3), v.stride(0), v.stride(1),
                                     v.stride(2), v.stride(3));
    a.out = flash3::TensorView::make4d(op, dt, out.size(0), out.size(1), out.size(2), out.size(3), out.stride(0),
                                       out.stride(1), out.stride(2), out.stride(3));
    a.lse = flash3::TensorView::make3d(lp, flash3::DType::kFloat32, lse.size(0), lse.size(1), lse.size(2),
                                       lse.stride(0), lse.stride(1), lse.stride(2));
    a.opts.causal = causal;
    const flash3::Status s = flash3::forward(a, stream);
    if (!s.ok()) throw_if_error(s, "forward");
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(iters > 0 ? iters : 1);
}

}  // namespace flash3_torch
