// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Validation of forward() / backward() (see validate.h for the order of the
// checks): the structure of the call, kernel availability, the device.
#include "api/validate.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "api/checks.h"
#include "common/cuda_check.h"
#include "launch/dispatch.h"

namespace flash3 {

using namespace checks;

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

}  // namespace flash3
