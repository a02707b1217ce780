// Argument validation (see validate.h for the order of the checks) and
// make_fwd_params(). Every message names the argument, the value seen and what
// was expected.
#include "api/validate.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "launch/dispatch.h"

namespace flash3 {

namespace {

constexpr int64_t kMaxOffset = std::numeric_limits<int32_t>::max();
constexpr int kMaxHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;

std::string dtype_str(DType t) {
  const char* n = dtype_name(t);
  if (std::strcmp(n, "unknown") == 0) return "unknown (" + std::to_string(static_cast<int>(t)) + ")";
  return n;
}

std::string fmt_float(float x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::string fmt_ptr(const void* p) {
  std::ostringstream os;
  os << "0x" << std::hex << reinterpret_cast<uintptr_t>(p);
  return os.str();
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

std::string dim_label(const Arg& a, bool varlen, int i) {
  return std::string(a.name) + ".shape[" + std::to_string(i) + "] (" + dim_names(a.role, varlen)[i] + ")";
}

std::string stride_label(const Arg& a, bool varlen, int i) {
  return std::string(a.name) + ".stride[" + std::to_string(i) + "] (" + dim_names(a.role, varlen)[i] + ")";
}

std::string shape_str(const TensorView& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim && i < 4; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + ")";
}

// ---------------------------------------------------------------------------
// Options.
// ---------------------------------------------------------------------------
Status check_options(const AttentionOptions& o) {
  if ((o.cu_seqlens_q == nullptr) != (o.cu_seqlens_k == nullptr)) {
    const bool has_q = o.cu_seqlens_q != nullptr;
    return Status::Invalid(std::string("opts.cu_seqlens_") + (has_q ? "k" : "q") + " is null but opts.cu_seqlens_" +
                           (has_q ? "q" : "k") + " is set; expected both or neither (variable-length needs both)");
  }
  if (o.cu_seqlens_q != nullptr) {
    if (o.max_seqlen_q <= 0)
      return Status::Invalid("opts.max_seqlen_q is " + std::to_string(o.max_seqlen_q) +
                             "; expected > 0 when opts.cu_seqlens_q is set");
    if (o.max_seqlen_k <= 0)
      return Status::Invalid("opts.max_seqlen_k is " + std::to_string(o.max_seqlen_k) +
                             "; expected > 0 when opts.cu_seqlens_k is set");
    if (reinterpret_cast<uintptr_t>(o.cu_seqlens_q) % alignof(int32_t) != 0)
      return Status::Invalid("opts.cu_seqlens_q (" + fmt_ptr(o.cu_seqlens_q) + ") is not 4-byte aligned; expected an int32 array");
    if (reinterpret_cast<uintptr_t>(o.cu_seqlens_k) % alignof(int32_t) != 0)
      return Status::Invalid("opts.cu_seqlens_k (" + fmt_ptr(o.cu_seqlens_k) + ") is not 4-byte aligned; expected an int32 array");
  }
  if (o.softmax_scale > 0.f && !std::isfinite(o.softmax_scale))
    return Status::Invalid("opts.softmax_scale is " + fmt_float(o.softmax_scale) +
                           "; expected a finite value > 0 (or <= 0 / NaN for the default 1/sqrt(head_dim))");
  if (o.window_left < -1)
    return Status::Invalid("opts.window_left is " + std::to_string(o.window_left) + "; expected >= -1 (-1 means unbounded)");
  if (o.window_right < -1)
    return Status::Invalid("opts.window_right is " + std::to_string(o.window_right) +
                           "; expected >= -1 (-1 means unbounded)");
  if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap))
    return Status::Invalid("opts.softcap is " + fmt_float(o.softcap) + "; expected a finite value >= 0 (0 disables)");
  if (o.causal && o.window_right > 0)
    return Status::Invalid("opts.window_right is " + std::to_string(o.window_right) +
                           " with opts.causal set; expected 0 or -1: causal implies window_right == 0 "
                           "(use window_left/window_right without causal for another window)");
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
    if (t.shape[i] > kMaxOffset)
      return Status::Invalid(dim_label(a, varlen, i) + " is " + std::to_string(t.shape[i]) +
                             "; expected <= 2147483647 (INT32_MAX)");
  }
  if (t.data == nullptr && t.numel() > 0)
    return Status::Invalid(std::string(a.name) + ".data is null; expected a device pointer (" + a.name + " has shape " +
                           shape_str(t) + ")");
  return Status::Ok();
}

Status check_qdtype(const Arg& q) {
  const DType dt = q.t->dtype;
  if (dt == DType::kFloat16 || dt == DType::kBFloat16) return Status::Ok();
  if (dt == DType::kFloat8E4M3)
    return Status::NotSupported(std::string("fp8: ") + q.name + ".dtype is fp8_e4m3; flash3 has fp16 and bf16 kernels only");
  return Status::Invalid(std::string(q.name) + ".dtype is " + dtype_str(dt) + "; expected fp16 or bf16");
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

// Strides, alignment and the 32-bit offset limit.
Status check_layout(const Arg& a, bool varlen) {
  const TensorView& t = *a.t;
  const int last = t.ndim - 1;
  for (int i = 0; i < t.ndim; ++i)
    if (t.stride[i] < 0)
      return Status::Invalid(stride_label(a, varlen, i) + " is " + std::to_string(t.stride[i]) +
                             "; expected >= 0 (negative strides are not supported)");
  if (t.stride[last] != 1)
    return Status::Invalid(stride_label(a, varlen, last) + " is " + std::to_string(t.stride[last]) + "; expected 1 (" +
                           dim_names(a.role, varlen)[last] + " must be contiguous)");
  const int esize = dtype_size(t.dtype);
  if (!is_lse(a.role) && esize > 0 && esize < 16) {
    const int64_t mult = 16 / esize;  // 8 elements for 16-bit types
    for (int i = 0; i < last; ++i)
      if (t.stride[i] % mult != 0)
        return Status::Invalid(stride_label(a, varlen, i) + " is " + std::to_string(t.stride[i]) + "; expected a multiple of " +
                               std::to_string(mult) + " elements (16 bytes, TMA requirement)");
  }
  if (a.written) {
    for (int i = 0; i < t.ndim; ++i)
      if (t.stride[i] == 0 && t.shape[i] > 1)
        return Status::Invalid(stride_label(a, varlen, i) + " is 0 while " + dim_label(a, varlen, i) + " is " +
                               std::to_string(t.shape[i]) + "; expected a non-zero stride (" + a.name +
                               " is written and its elements must not overlap)");
  }
  const uintptr_t align = is_lse(a.role) ? 4 : 16;
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0)
    return Status::Invalid(std::string(a.name) + ".data (" + fmt_ptr(t.data) + ") is not " + std::to_string(align) +
                           "-byte aligned; expected a " + std::to_string(align) + "-byte aligned pointer" +
                           (is_lse(a.role) ? "" : " (TMA requirement)"));
  if (t.numel() > 0) {
    int64_t off = 0;
    bool overflow = false;
    for (int i = 0; i < t.ndim && !overflow; ++i) {
      int64_t term = 0;
      overflow = __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &term) || __builtin_add_overflow(off, term, &off);
    }
    if (overflow || off > kMaxOffset)
      return Status::Invalid(std::string(a.name) + ": largest element offset sum((shape[i]-1)*stride[i]) is " +
                             (overflow ? std::string("beyond int64") : std::to_string(off)) +
                             "; expected <= 2147483647 (INT32_MAX): flash3 indexes with 32-bit element offsets");
  }
  return Status::Ok();
}

bool is_varlen(const AttentionOptions& o) { return o.cu_seqlens_q != nullptr; }

}  // namespace

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
  const bool has_lse = args.lse.data != nullptr;

  for (const Arg* a : {&q, &k, &v, &o}) FLASH3_RETURN_IF_ERROR(check_present(*a, varlen));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_present(l, varlen));

  FLASH3_RETURN_IF_ERROR(check_qdtype(q));
  for (const Arg* a : {&k, &v, &o}) FLASH3_RETURN_IF_ERROR(check_same_dtype(*a, q));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_fp32(l));

  FLASH3_RETURN_IF_ERROR(check_head_dims(q, k, v, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_geometry(q, k, v, o, varlen));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_lse_shape(l, q, varlen));

  for (const Arg* a : {&q, &k, &v, &o}) FLASH3_RETURN_IF_ERROR(check_layout(*a, varlen));
  if (has_lse) FLASH3_RETURN_IF_ERROR(check_layout(l, varlen));
  return Status::Ok();
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
  const bool has_dlse = args.dlse.data != nullptr;

  for (const Arg* a : {&q, &k, &v, &o, &dout, &lse, &dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_present(*a, varlen));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_present(dlse, varlen));

  FLASH3_RETURN_IF_ERROR(check_qdtype(q));
  for (const Arg* a : {&k, &v, &o, &dout, &dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_same_dtype(*a, q));
  FLASH3_RETURN_IF_ERROR(check_fp32(lse));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_fp32(dlse));

  FLASH3_RETURN_IF_ERROR(check_head_dims(q, k, v, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_geometry(q, k, v, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dout, o, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dq, q, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dk, k, varlen));
  FLASH3_RETURN_IF_ERROR(check_like(dv, v, varlen));
  FLASH3_RETURN_IF_ERROR(check_lse_shape(lse, q, varlen));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_lse_shape(dlse, q, varlen));

  for (const Arg* a : {&q, &k, &v, &o, &dout, &lse, &dq, &dk, &dv}) FLASH3_RETURN_IF_ERROR(check_layout(*a, varlen));
  if (has_dlse) FLASH3_RETURN_IF_ERROR(check_layout(dlse, varlen));
  return Status::Ok();
}

bool forward_is_empty(const ForwardArgs& args) {
  if (is_varlen(args.opts)) return args.q.shape[0] == 0;
  return args.q.shape[0] == 0 || args.q.shape[1] == 0;
}

bool backward_is_empty(const BackwardArgs& args) {
  if (is_varlen(args.opts)) return args.q.shape[0] == 0;
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

Status check_kernel_built(bool forward_pass, DType dtype, int head_dim, int head_dim_v) {
  const bool built = forward_pass ? fwd_kernel_built(dtype, head_dim, head_dim_v) : bwd_kernel_built(dtype, head_dim, head_dim_v);
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
Status current_device(int* dev) {
  cudaError_t e = cudaGetDevice(dev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the error for the caller's next check
    return cuda_status(e, "cudaGetDevice");
  }
  return Status::Ok();
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

Status check_forward_device(const ForwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_device_pointer("q.data", args.q.data));
  FLASH3_RETURN_IF_ERROR(check_device_pointer("k.data", args.k.data));
  FLASH3_RETURN_IF_ERROR(check_device_pointer("v.data", args.v.data));
  FLASH3_RETURN_IF_ERROR(check_device_pointer("out.data", args.out.data));
  FLASH3_RETURN_IF_ERROR(check_device_pointer("lse.data", args.lse.data));
  FLASH3_RETURN_IF_ERROR(check_device_pointer("opts.cu_seqlens_q", args.opts.cu_seqlens_q));
  FLASH3_RETURN_IF_ERROR(check_device_pointer("opts.cu_seqlens_k", args.opts.cu_seqlens_k));
  return check_current_device();
}

Status check_backward_device(const BackwardArgs& args) {
  const std::pair<const char*, const void*> ptrs[] = {
      {"q.data", args.q.data},        {"k.data", args.k.data},       {"v.data", args.v.data},
      {"out.data", args.out.data},    {"dout.data", args.dout.data}, {"lse.data", args.lse.data},
      {"dlse.data", args.dlse.data},  {"dq.data", args.dq.data},     {"dk.data", args.dk.data},
      {"dv.data", args.dv.data},      {"workspace", args.workspace}, {"opts.cu_seqlens_q", args.opts.cu_seqlens_q},
      {"opts.cu_seqlens_k", args.opts.cu_seqlens_k}};
  for (const auto& p : ptrs) FLASH3_RETURN_IF_ERROR(check_device_pointer(p.first, p.second));
  return check_current_device();
}

// ---------------------------------------------------------------------------
// Public validation entry points.
// ---------------------------------------------------------------------------
Status validate_forward(const ForwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_forward_structure(args));
  if (forward_is_empty(args)) return Status::Ok();
  const int last = args.q.ndim - 1;
  FLASH3_RETURN_IF_ERROR(check_kernel_built(true, args.q.dtype, static_cast<int>(args.q.shape[last]),
                                            static_cast<int>(args.v.shape[last])));
  if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_forward_device(args));
  return Status::Ok();
}

Status validate_backward(const BackwardArgs& args) {
  FLASH3_RETURN_IF_ERROR(check_backward_structure(args));
  if (backward_is_empty(args)) return Status::Ok();
  const int last = args.q.ndim - 1;
  FLASH3_RETURN_IF_ERROR(check_kernel_built(false, args.q.dtype, static_cast<int>(args.q.shape[last]),
                                            static_cast<int>(args.v.shape[last])));
  if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_backward_device(args));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Lowering.
// ---------------------------------------------------------------------------
FwdParams make_fwd_params(const ForwardArgs& args) {
  FwdParams p;
  const bool varlen = is_varlen(args.opts);
  const TensorView &q = args.q, &k = args.k, &v = args.v, &o = args.out;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = o.data;
  p.lse = static_cast<float*>(args.lse.data);
  p.dtype = q.dtype;

  const int R = varlen ? 0 : 1, H = R + 1, D = R + 2;
  // Varlen: the batch size and per-sequence lengths live in device arrays; the
  // host only knows the maxima.
  p.batch = varlen ? 0 : static_cast<int>(q.shape[0]);
  p.seqlen_q = varlen ? args.opts.max_seqlen_q : static_cast<int>(q.shape[R]);
  p.seqlen_k = varlen ? args.opts.max_seqlen_k : static_cast<int>(k.shape[R]);
  p.heads_q = static_cast<int>(q.shape[H]);
  p.heads_kv = static_cast<int>(k.shape[H]);
  p.head_dim = static_cast<int>(q.shape[D]);
  p.head_dim_v = static_cast<int>(v.shape[D]);

  p.q_batch_stride = varlen ? 0 : q.stride[0];
  p.q_row_stride = q.stride[R];
  p.q_head_stride = q.stride[H];
  p.k_batch_stride = varlen ? 0 : k.stride[0];
  p.k_row_stride = k.stride[R];
  p.k_head_stride = k.stride[H];
  p.v_batch_stride = varlen ? 0 : v.stride[0];
  p.v_row_stride = v.stride[R];
  p.v_head_stride = v.stride[H];
  p.o_batch_stride = varlen ? 0 : o.stride[0];
  p.o_row_stride = o.stride[R];
  p.o_head_stride = o.stride[H];
  if (p.lse != nullptr) {
    // (b, hq, sq) or varlen (hq, total_q)
    p.lse_batch_stride = varlen ? 0 : args.lse.stride[0];
    p.lse_head_stride = varlen ? args.lse.stride[0] : args.lse.stride[1];
  }

  const float scale = args.opts.softmax_scale;
  p.softmax_scale = (scale > 0.f) ? scale : 1.f / std::sqrt(static_cast<float>(p.head_dim));  // NaN -> default
  p.softmax_scale_log2 = p.softmax_scale * kLog2e;
  p.softcap = args.opts.softcap;

  apply_mask_options(args.opts, &p);
  return p;
}

// Masks: causal == window (-1, 0). Normalised as FlashAttention does: causal
// forces window_right = 0; (-1, 0) is the causal kernel, any other bounded
// window is local; (-1, -1) is no mask.
void apply_mask_options(const AttentionOptions& opts, FwdParams* p) {
  int wl = opts.window_left, wr = opts.window_right;
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
  const int R = varlen ? 0 : 1, H = R + 1;
  p.dout = args.dout.data;
  p.lse_in = static_cast<const float*>(args.lse.data);
  p.dlse = static_cast<const float*>(args.dlse.data);
  p.dq = args.dq.data;
  p.dk = args.dk.data;
  p.dv = args.dv.data;
  auto strides = [&](const TensorView& t, int64_t* b, int64_t* r, int64_t* h) {
    *b = varlen ? 0 : t.stride[0];
    *r = t.stride[R];
    *h = t.stride[H];
  };
  strides(args.dout, &p.do_batch_stride, &p.do_row_stride, &p.do_head_stride);
  strides(args.dq, &p.dq_batch_stride, &p.dq_row_stride, &p.dq_head_stride);
  strides(args.dk, &p.dk_batch_stride, &p.dk_row_stride, &p.dk_head_stride);
  strides(args.dv, &p.dv_batch_stride, &p.dv_row_stride, &p.dv_head_stride);
  if (p.dlse != nullptr) {
    p.dlse_batch_stride = varlen ? 0 : args.dlse.stride[0];
    p.dlse_head_stride = varlen ? args.dlse.stride[0] : args.dlse.stride[1];
  }
  p.deterministic = args.opts.deterministic;
  return p;
}

}  // namespace flash3

