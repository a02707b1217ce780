// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Variable-length attention (flash3::varlen_fwd / flash3::varlen_bwd and varlen_fwd's autograd);
// common.h describes the extension. Only the host-side facts are checked here: the contents of
// cu_seqlens_* / seqused_* live on the device and are never read by the host (no sync).
#include "common.h"

#include <c10/cuda/CUDAGuard.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

namespace flash3_torch {

namespace {

void check_seqused(const std::optional<Tensor>& t, const char* name, const Tensor& q, const char* what,
                   int64_t num_sequences) {
  if (!has(t)) return;  // None: every row of a sequence is real
  check_int32_vector(*t, name, q, what);
  if (!(t->numel() == num_sequences)) value_error("flash3: ", name, " has ", t->numel(), " entries; expected ", num_sequences, " (num_sequences = cu_seqlens_q.numel() - 1)");
}

constexpr const char* kCuSeqlensK = "num_sequences + 1 prefix sums of the key lengths";

void check_varlen_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                         const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                         const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  check_qkv_tensors(q, k, v, /*varlen=*/true);
  if (!(v.size(0) == k.size(0))) value_error("flash3: v.shape[0] (total_k) is ", v.size(0), "; expected ", k.size(0), " to match k.shape[0] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(v.size(1) == k.size(1))) value_error("flash3: v.shape[1] (num_heads_kv) is ", v.size(1), "; expected ", k.size(1), " to match k.shape[1] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(k.size(2) == q.size(2))) value_error("flash3: k.shape[2] (head_dim) is ", k.size(2), "; expected ", q.size(2), " to match q.shape[2] (q ", shape_str(q), ", k ", shape_str(k), ")");
  if (!(k.size(1) >= 1 && q.size(1) % k.size(1) == 0)) value_error("flash3: q.shape[1] (num_heads_q) is ", q.size(1), ", which is not a multiple of k.shape[1] (num_heads_kv) ", k.size(1), "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  check_head_dim(q, v);
  check_int32_vector(cu_seqlens_q, "cu_seqlens_q", q, kCuSeqlensQ);
  check_int32_vector(cu_seqlens_k, "cu_seqlens_k", q, kCuSeqlensK);
  check_cu_seqlens_q_not_empty(cu_seqlens_q);
  if (!(cu_seqlens_k.numel() == cu_seqlens_q.numel())) value_error("flash3: cu_seqlens_k has ", cu_seqlens_k.numel(), " entries; expected ", cu_seqlens_q.numel(), " to match cu_seqlens_q (both hold num_sequences + 1 prefix sums)");
  check_num_sequences_fit_int32(cu_seqlens_q);
  const int64_t num_sequences = cu_seqlens_q.numel() - 1;
  check_seqused(seqused_q, "seqused_q", q, "num_sequences counts of the real query tokens", num_sequences);
  check_seqused(seqused_k, "seqused_k", q, "num_sequences counts of the real key tokens", num_sequences);
  check_max_seqlen(max_seqlen_q, "max_seqlen_q", "query");
  check_max_seqlen(max_seqlen_k, "max_seqlen_k", "key");
}

// "(a, b, c)": an expected shape, printed as shape_str prints a tensor's.
std::string dims_str(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  size_t i = 0;
  for (const int64_t d : dims) s += (i++ ? ", " : "") + std::to_string(d);
  return s + (dims.size() == 1 ? ",)" : ")");
}

// The checks of varlen_bwd after varlen_fwd's (check_varlen_inputs): dout / out / softmax_lse as
// varlen_fwd returns them, a backward kernel for the head dims, and dlse (any float dtype, shaped
// like softmax_lse; converted to fp32 by backward_inputs). The fixed-length bwd's checks, in the
// same order, with the varlen shapes spelled out (the fixed-length bwd leaves softmax_lse's shape
// to the library).
void check_varlen_backward_tensors(const Tensor& dout, const Tensor& q, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const std::optional<Tensor>& dlse) {
  check_backward_device_dtype(dout, q, out, lse);
  const int64_t total_q = q.size(0), hq = q.size(1), dv = v.size(2);
  if (!(out.dim() == 3 && out.size(0) == total_q && out.size(1) == hq && out.size(2) == dv)) value_error("flash3: out has shape ", shape_str(out), "; expected ", dims_str({total_q, hq, dv}), " (total_q, num_heads_q, head_dim_v) from q ", shape_str(q), " and v ", shape_str(v));
  check_dout_shape(dout, out);
  if (!(lse.dim() == 2 && lse.size(0) == hq && lse.size(1) == total_q)) value_error("flash3: softmax_lse has shape ", shape_str(lse), "; expected ", dims_str({hq, total_q}), " (num_heads_q, total_q) from q ", shape_str(q));
  check_backward_kernel(q, v);
  check_dlse(dlse, lse, q);
}

// The variable-length fields of flash3::AttentionOptions (arguments checked by check_varlen_inputs).
void set_varlen_opts(flash3::AttentionOptions* o, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                     const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k,
                     int64_t max_seqlen_q, int64_t max_seqlen_k) {
  o->cu_seqlens_q = cu_seqlens_q.data_ptr<int32_t>();
  o->cu_seqlens_k = cu_seqlens_k.data_ptr<int32_t>();
  o->num_sequences = static_cast<int>(cu_seqlens_q.numel() - 1);
  o->max_seqlen_q = static_cast<int>(max_seqlen_q);  // in [1, INT32_MAX]: checked
  o->max_seqlen_k = static_cast<int>(max_seqlen_k);
  if (has(seqused_q)) o->seqused_q = seqused_q->data_ptr<int32_t>();
  if (has(seqused_k)) o->seqused_k = seqused_k->data_ptr<int32_t>();
}

}  // namespace

// Variable-length forward.
std::tuple<Tensor, Tensor> varlen_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                           const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                                           const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                           int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                                           int64_t window_left, int64_t window_right, double softcap,
                                           bool deterministic, int64_t pack_gqa, int64_t num_splits) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  check_forward_scalars(softmax_scale, softcap, pack_gqa, num_splits);
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t total_q = q.size(0), hq = q.size(1), dv = v.size(2);
  // Rows that no sequence covers (beyond seqused, beyond cu_seqlens_q[-1]) are not written and
  // keep whatever the allocator hands out, as in FlashAttention-3.
  Tensor out = at::empty({total_q, hq, dv}, q.options());
  Tensor lse = at::empty({hq, total_q}, q.options().dtype(at::kFloat));

  flash3::ForwardArgs args = forward_args(q, k, v, out, lse);
  args.opts = make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic);
  set_varlen_opts(&args.opts, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  set_launch_opts(&args.opts, pack_gqa, num_splits);
  launch_forward(args, q, "varlen forward");
  return {out, lse};
}

// Variable-length backward: bwd_cuda with the varlen layouts and options. dq / dk / dv are
// zero-filled: the kernels write only the rows of real tokens (within seqused, within
// cu_seqlens[-1]), and FlashAttention-3 returns 0 in the others.
std::tuple<Tensor, Tensor, Tensor> varlen_bwd_cuda(
    const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
    const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    bool deterministic, const std::optional<Tensor>& dlse_in) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_varlen_backward_tensors(dout_in, q, v, out, lse, dlse_in);
  const c10::cuda::CUDAGuard guard(q.device());
  const BackwardInputs in = backward_inputs(dout_in, out, lse, dlse_in);
  flash3::AttentionOptions opts =
      make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic);
  set_varlen_opts(&opts, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  // Rows no sequence uses get no gradient from the kernels: zeros, as in FlashAttention-3.
  return run_backward(q, k, v, in, opts, /*zero_grads=*/true, "varlen backward");
}

std::tuple<Tensor, Tensor> varlen_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                          const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                                          const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                          int64_t max_seqlen_k, std::optional<double>, bool, int64_t, int64_t, double,
                                          bool, int64_t, int64_t) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  runtime_error("flash3: unreachable");  // [[noreturn]]: nothing to return
}

std::tuple<Tensor, Tensor, Tensor> varlen_bwd_cpu(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&, const Tensor&,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
    const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double>, bool,
    int64_t, int64_t, double, bool, const std::optional<Tensor>&) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  check_cuda(dout, "dout");
  runtime_error("flash3: unreachable");  // [[noreturn]]: nothing to return
}

// ---------------------------------------------------------------------------
// Autograd.
// ---------------------------------------------------------------------------
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// varlen_fwd: the scheme of fwd's (attention.cpp); the backward calls flash3::varlen_bwd with the
// saved cu_seqlens / seqused tensors (so a CUDA graph replays with the lengths they hold at replay
// time).
std::tuple<Tensor, Tensor> call_varlen_fwd_below_autograd(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
    const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    double softcap, bool deterministic, int64_t pack_gqa, int64_t num_splits) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::varlen_fwd", "")
                       .typed<std::tuple<Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, const std::optional<Tensor>&, int64_t, int64_t,
                           std::optional<double>, bool, int64_t, int64_t, double, bool, int64_t, int64_t)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                 causal, window_left, window_right, softcap, deterministic, pack_gqa, num_splits);
}

std::tuple<Tensor, Tensor, Tensor> call_varlen_bwd(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
    const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    bool deterministic, const std::optional<Tensor>& dlse) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::varlen_bwd", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const std::optional<Tensor>&, const std::optional<Tensor>&,
                           int64_t, int64_t, std::optional<double>, bool, int64_t, int64_t, double, bool,
                           const std::optional<Tensor>&)>();
  return op.call(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                 max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic, dlse);
}

class VarlenFlashAttnFunction : public torch::autograd::Function<VarlenFlashAttnFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                               const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double> softmax_scale,
                               bool causal, int64_t window_left, int64_t window_right, double softcap,
                               bool deterministic, int64_t pack_gqa, int64_t num_splits) {
    auto [out, lse] = call_varlen_fwd_below_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                                                     max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                                                     window_right, softcap, deterministic, pack_gqa, num_splits);
    // seqused_* may be None: saved as undefined tensors.
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q.value_or(Tensor()),
                            seqused_k.value_or(Tensor())});
    ctx->saved_data["max_seqlen_q"] = max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = max_seqlen_k;
    save_options(ctx->saved_data, softmax_scale, causal, window_left, window_right, softcap, deterministic);
    ctx->set_materialize_grads(false);  // as FlashAttnFunction (attention.cpp): unused outputs cost nothing
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Tensor &cu_seqlens_q = saved[5], &cu_seqlens_k = saved[6];
    std::optional<Tensor> seqused_q, seqused_k, dlse;
    if (saved[7].defined()) seqused_q = saved[7];
    if (saved[8].defined()) seqused_k = saved[8];
    Tensor dout = grads[0];
    if (!dout.defined()) dout = at::zeros_like(out);
    if (grads[1].defined()) dlse = grads[1];
    const std::optional<double> scale = saved_softmax_scale(ctx->saved_data);
    auto [dq, dk, dv] = call_varlen_bwd(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
        ctx->saved_data["max_seqlen_q"].toInt(), ctx->saved_data["max_seqlen_k"].toInt(), scale,
        ctx->saved_data["causal"].toBool(), ctx->saved_data["wl"].toInt(), ctx->saved_data["wr"].toInt(),
        ctx->saved_data["softcap"].toDouble(), ctx->saved_data["deterministic"].toBool(), dlse);
    // No gradient for cu_seqlens_*, seqused_* and the non-tensor arguments (pack_gqa and
    // num_splits included: forward-only options).
    variable_list grad_inputs(17);
    grad_inputs[0] = dq;
    grad_inputs[1] = dk;
    grad_inputs[2] = dv;
    return grad_inputs;
  }
};

}  // namespace

std::tuple<Tensor, Tensor> varlen_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                               const std::optional<Tensor>& seqused_q,
                                               const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                               int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               bool deterministic, int64_t pack_gqa, int64_t num_splits) {
  const bool needs_grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!needs_grad)
    return call_varlen_fwd_below_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                          max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                                          deterministic, pack_gqa, num_splits);
  auto r = VarlenFlashAttnFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                          max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                                          deterministic, pack_gqa, num_splits);
  return {r[0], r[1]};
}

}  // namespace flash3_torch
