// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// What the ops of flash3._C share (common.h describes the extension): conversions to the
// library's types, the argument checks of several ops, the caching workspace and the forward's
// and backward's launch steps.
#include "common.h"

#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <mutex>

namespace flash3_torch {

// ---------------------------------------------------------------------------
// Conversions to the library's types.
// ---------------------------------------------------------------------------
std::string shape_str(const Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

flash3::DType to_f3(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return flash3::DType::kFloat16;
    case at::kBFloat16: return flash3::DType::kBFloat16;
    case at::kFloat8_e4m3fn: return flash3::DType::kFloat8E4M3;
    case at::kFloat: return flash3::DType::kFloat32;
    default: return flash3::DType::kFloat32;  // never reached: dtypes are checked first
  }
}

flash3::TensorView view(const Tensor& t) {
  flash3::TensorView v;
  v.data = t.defined() ? t.data_ptr() : nullptr;
  if (!t.defined()) return v;
  v.dtype = to_f3(t.scalar_type());
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim && i < flash3::kMaxTensorDims; ++i) {
    v.shape[i] = t.size(i);
    v.stride[i] = t.stride(i);
  }
  return v;
}

cudaStream_t current_stream(const Tensor& t) { return at::cuda::getCurrentCUDAStream(t.get_device()).stream(); }

void throw_if_error(const flash3::Status& s, const char* where) {
  if (s.ok()) return;
  switch (s.code) {
    case flash3::StatusCode::kInvalidArgument:
      value_error("flash3: ", where, ": ", s.message);
    case flash3::StatusCode::kNotSupported:
      not_implemented_error("flash3: ", where, ": ", s.message);
    case flash3::StatusCode::kCudaError:
      runtime_error("flash3: ", where, ": CUDA error: ", s.message);
    default:
      runtime_error("flash3: ", where, ": internal error: ", s.message);
  }
}

namespace {

// A Python int window side as the int of flash3::AttentionOptions: negative -> -1
// (unbounded); above INT32_MAX -> INT32_MAX, which the library treats as unbounded as well
// (any side >= seqlen - 1 cuts nothing).
int window_side(int64_t w) {
  if (w < 0) return -1;
  return w > INT32_MAX ? INT32_MAX : static_cast<int>(w);
}

}  // namespace

flash3::AttentionOptions make_opts(std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                   int64_t window_right, double softcap, bool deterministic) {
  flash3::AttentionOptions o;  // softmax_scale stays NaN (1/sqrt(head_dim)) for None
  if (softmax_scale.has_value()) o.softmax_scale = static_cast<float>(*softmax_scale);
  o.causal = causal;
  o.window_left = window_side(window_left);
  o.window_right = window_side(window_right);
  o.softcap = static_cast<float>(softcap);
  o.deterministic = deterministic;
  return o;
}

void set_launch_opts(flash3::AttentionOptions* o, int64_t pack_gqa, int64_t num_splits) {
  o->pack_gqa = static_cast<int>(pack_gqa);      // in [-1, 1]: checked
  o->num_splits = static_cast<int>(num_splits);  // in [0, 256]: checked
}

// ---------------------------------------------------------------------------
// Argument checks.
// ---------------------------------------------------------------------------
void check_cuda(const Tensor& t, const char* name) {
  if (!(t.is_cuda())) value_error("flash3: ", name, " must be a CUDA tensor, but ", name, " is on device '", t.device().str(), "' (move it with ", name, ".cuda())");
}

void check_same_device(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name) {
  if (!(t.device() == ref.device())) value_error("flash3: ", name, " is on device '", t.device().str(), "' but ", ref_name, " is on device '", ref.device().str(), "'; expected all tensors on the same CUDA device");
}

void check_cuda_on_device_of(std::initializer_list<NamedTensor> ts, const Tensor& ref, const char* ref_name) {
  for (const NamedTensor& a : ts) check_cuda(a.t, a.name);
  for (const NamedTensor& a : ts) check_same_device(a.t, a.name, ref, ref_name);
}

void check_dtype_q(const Tensor& q) {
  const auto dt = q.scalar_type();
  if (!(dt == at::kHalf || dt == at::kBFloat16)) type_error("flash3: q.dtype is ", dtype_str(dt), "; expected torch.float16 or torch.bfloat16");
}

void check_same_dtype(const Tensor& t, const char* name, const Tensor& q) {
  if (!(t.scalar_type() == q.scalar_type())) type_error("flash3: ", name, ".dtype is ", dtype_str(t.scalar_type()), "; expected ", dtype_str(q.scalar_type()), " to match q.dtype");
}

void check_4d(const Tensor& t, const char* name, const char* layout) {
  if (!(t.dim() == 4)) value_error("flash3: ", name, " has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 4-d tensor ", layout);
}

void check_last_dim_contiguous(const Tensor& t, const char* name, const char* dim_name) {
  if (!(t.stride(-1) == 1)) value_error("flash3: ", name, ".stride(-1) (", dim_name, ") is ", t.stride(-1), "; expected 1: the ", dim_name, " dimension must be contiguous (use ", name, ".contiguous())");
}

void check_3d(const Tensor& t, const char* name, const char* layout) {
  if (!(t.dim() == 3)) value_error("flash3: ", name, " has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 3-d tensor ", layout, " (variable length: the sequences concatenated along dim 0)");
}

std::string built_head_dims(flash3::DType dt, bool forward) {
  std::string s;
  for (int d = 8; d <= 256; d += 8)
    for (int dv = 8; dv <= 256; dv += 8) {
      const bool built = forward ? flash3::forward_is_built(dt, d, dv) : flash3::backward_is_built(dt, d, dv);
      if (built) s += (s.empty() ? "(" : ", (") + std::to_string(d) + ", " + std::to_string(dv) + ")";
    }
  return s.empty() ? "none" : s;
}

bool kernel_built(flash3::DType dt, int64_t d, int64_t dv, bool forward) {
  if (d < 8 || d > 256 || dv < 8 || dv > 256 || d % 8 || dv % 8) return false;
  static std::once_flag once;
  static constexpr flash3::DType kTypes[3] = {flash3::DType::kFloat16, flash3::DType::kBFloat16,
                                              flash3::DType::kFloat8E4M3};
  static bool table[2][3][33][33];  // [forward][dtype][d/8][dv/8]
  std::call_once(once, [] {
    for (int f = 0; f < 2; ++f)
      for (int t = 0; t < 3; ++t)
        for (int a = 1; a <= 32; ++a)
          for (int b = 1; b <= 32; ++b) {
            const auto dt = kTypes[t];
            table[f][t][a][b] = f ? flash3::forward_is_built(dt, 8 * a, 8 * b) : flash3::backward_is_built(dt, 8 * a, 8 * b);
          }
  });
  int t = 0;
  while (t < 3 && kTypes[t] != dt) ++t;
  if (t == 3) return false;
  return table[forward ? 1 : 0][t][d / 8][dv / 8];
}

namespace {

// "torch.float16, torch.bfloat16": the dtypes with forward kernels in this build.
std::string built_dtypes() {
  std::string s;
  for (const auto t : {at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn})
    if (built_head_dims(to_f3(t), true) != "none") s += (s.empty() ? "" : ", ") + dtype_str(t);
  return s.empty() ? "none" : s;
}

}  // namespace

void check_head_dim(const Tensor& q, const Tensor& v, const char* v_name) {
  const auto dt = to_f3(q.scalar_type());
  const int64_t d = q.size(-1), dv = v.size(-1);
  if (kernel_built(dt, d, dv, /*forward=*/true)) return;
  const std::string built = built_head_dims(dt, true);
  if (built == "none") not_implemented_error("flash3: q.dtype is ", dtype_str(q.scalar_type()), ", and this flash3 build has no ", dtype_str(q.scalar_type()), " kernels (CMake FLASH3_DTYPES); built dtypes: ", built_dtypes());
  value_error("flash3: unsupported head dim: q.shape[-1] (head_dim) is ", d, " and ", v_name, ".shape[-1] (head_dim_v) is ", dv, "; this flash3 build has ", dtype_str(q.scalar_type()), " kernels for (head_dim, head_dim_v) in ", built);
}

namespace {

// q, k, v: CUDA tensors of one device, fp16 / bf16, one dtype (fixed length and varlen).
// fp8: the FP8 forward (fwd_fp8), whose q / k / v are torch.float8_e4m3fn.
void check_qkv_device_dtype(const Tensor& q, const Tensor& k, const Tensor& v, bool fp8) {
  check_cuda(q, "q");
  check_cuda(k, "k");
  check_cuda(v, "v");
  check_same_device(k, "k", q, "q");
  check_same_device(v, "v", q, "q");
  if (fp8) {
    if (!(q.scalar_type() == at::kFloat8_e4m3fn)) type_error("flash3: q.dtype is ", dtype_str(q.scalar_type()), "; expected torch.float8_e4m3fn (flash3's FP8 kernels take e4m3fn; e5m2 is not supported)");
  } else {
    check_dtype_q(q);
  }
  check_same_dtype(k, "k", q);
  check_same_dtype(v, "v", q);
}

}  // namespace

void check_qkv_tensors(const Tensor& q, const Tensor& k, const Tensor& v, bool varlen, bool fp8) {
  check_qkv_device_dtype(q, k, v, fp8);
  if (varlen) {
    check_3d(q, "q", "(total_q, num_heads_q, head_dim)");
    check_3d(k, "k", "(total_k, num_heads_kv, head_dim)");
    check_3d(v, "v", "(total_k, num_heads_kv, head_dim_v)");
  } else {
    check_4d(q, "q", "(batch, seqlen_q, num_heads_q, head_dim)");
    check_4d(k, "k", "(batch, seqlen_k, num_heads_kv, head_dim)");
    check_4d(v, "v", "(batch, seqlen_k, num_heads_kv, head_dim_v)");
  }
  check_last_dim_contiguous(q, "q", "head_dim");
  check_last_dim_contiguous(k, "k", "head_dim");
  check_last_dim_contiguous(v, "v", "head_dim_v");
}

// ---------------------------------------------------------------------------
// Variable length: only the host-side facts are checked here; the contents of cu_seqlens_* /
// seqused_* live on the device and are never read by the host (no sync).
// ---------------------------------------------------------------------------
void check_int32_vector(const Tensor& t, const char* name, const Tensor& q, const char* what) {
  if (!(t.is_cuda())) value_error("flash3: ", name, " must be a CUDA tensor on q's device (", q.device().str(), "), but ", name, " is on device '", t.device().str(), "' (move it with ", name, ".to(q.device))");
  check_same_device(t, name, q, "q");
  if (!(t.scalar_type() == at::kInt)) type_error("flash3: ", name, ".dtype is ", dtype_str(t.scalar_type()), "; expected torch.int32 (", what, "; use ", name, ".to(torch.int32))");
  if (!(t.dim() == 1)) value_error("flash3: ", name, " has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 1-d tensor (", what, ")");
  if (!(t.is_contiguous())) value_error("flash3: ", name, ".stride(0) is ", t.stride(0), "; expected a contiguous tensor (use ", name, ".contiguous())");
}

void check_max_seqlen(int64_t m, const char* name, const char* what) {
  if (!(m >= 0 && m <= INT32_MAX)) value_error("flash3: ", name, " is ", m, "; expected a value in [0, 2147483647] (the length of the longest ", what, " sequence)");
}

void check_cu_seqlens_q_not_empty(const Tensor& cu_seqlens_q) {
  if (!(cu_seqlens_q.numel() >= 1)) value_error("flash3: cu_seqlens_q is empty (shape ", shape_str(cu_seqlens_q), "); expected num_sequences + 1 >= 1 entries (", kCuSeqlensQ, ", starting with 0)");
}

void check_num_sequences_fit_int32(const Tensor& cu_seqlens_q) {
  if (!(cu_seqlens_q.numel() - 1 <= INT32_MAX)) value_error("flash3: cu_seqlens_q has ", cu_seqlens_q.numel(), " entries; expected at most 2147483648 (num_sequences is an int32)");
}

// ---------------------------------------------------------------------------
// Scalar arguments.
// ---------------------------------------------------------------------------
namespace {

// The float that reaches flash3::AttentionOptions must be finite and >= 0; the library
// checks that too, but only once out / lse / dq / ... are allocated and dout possibly copied,
// and its message names the C++ field. The fake implementations make the same check.
// From 2^128 - 2^103 on, a double rounds to float infinity (and converting it is undefined).
constexpr double kFloat32Overflow = 0x1.ffffffp127;

// x as float32 is finite and >= 0 (false for NaN and inf too).
bool finite_nonnegative_float32(double x) { return std::fabs(x) < kFloat32Overflow && static_cast<float>(x) >= 0.f; }

// A scale the kernels take as float32: 0, or in fp32's normal range below FLT_MAX / 2 (the
// kernels flush subnormal floats to 0 and multiply the value by log2(e)); the library's
// check (validate.cpp kernel_float_ok), made before anything is allocated.
bool kernel_float_ok(double x) {
  constexpr double kMin = 0x1p-126, kMax = 0x1.fffffep127 / 2;
  const float f = static_cast<float>(x);  // x is finite and below the float32 overflow here
  return f == 0.f || (f >= kMin && f <= kMax);
}
constexpr const char* kKernelFloatWhy =
    " (fp32's normal range, [1.17549435e-38, 1.70141173e+38]: the kernels flush subnormal floats to 0 and "
    "multiply the value by log2(e))";

}  // namespace

void check_softmax_scale(std::optional<double> softmax_scale) {
  if (!softmax_scale.has_value()) return;
  const double s = *softmax_scale;
  if (!finite_nonnegative_float32(s))
    value_error("flash3: softmax_scale is ", s, "; expected None (1/sqrt(head_dim)) or a finite number >= 0 "
                "(as float32): the online softmax tracks the row maximum of the unscaled scores, which a "
                "negative scale would turn into the row minimum");
  if (!kernel_float_ok(s)) value_error("flash3: softmax_scale is ", s, "; expected 0 or a value in fp32's normal range", kKernelFloatWhy);
}

// The same float32 range check for softcap (0 disables; the fake implementations
// and the Python wrappers raise the same message).
void check_softcap(double softcap) {
  if (!finite_nonnegative_float32(softcap))
    value_error("flash3: softcap is ", softcap, "; expected a finite number >= 0 (as float32): 0 disables the "
                "capping, a value > 0 caps the scaled scores s -> softcap * tanh(s / softcap)");
  if (!kernel_float_ok(softcap)) value_error("flash3: softcap is ", softcap, "; expected 0 (off) or a value in fp32's normal range", kKernelFloatWhy);
}

// opts.pack_gqa's values, checked before anything is allocated (an int64 beyond int32 would
// otherwise wrap on its way into the int field; the fake implementations raise the same message).
void check_pack_gqa(int64_t pack_gqa) {
  if (!(pack_gqa >= -1 && pack_gqa <= 1))
    value_error("flash3: pack_gqa is ", pack_gqa, "; expected -1 (heuristic), 0 (off) or 1 (on)");
}

// opts.num_splits's values, checked like pack_gqa before anything is allocated (the fake
// implementations raise the same message).
void check_num_splits(int64_t num_splits) {
  if (!(num_splits >= 0 && num_splits <= 256))
    value_error("flash3: num_splits is ", num_splits, "; expected 0 (heuristic), 1 (no split) or n in [2, 256] "
                "(at most n KV splits)");
}

void check_forward_scalars(std::optional<double> softmax_scale, double softcap, int64_t pack_gqa,
                           int64_t num_splits) {
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
}

// ---------------------------------------------------------------------------
// Backward checks (bwd, varlen_bwd): dout / out / softmax_lse as the forward returned them.
// ---------------------------------------------------------------------------
void check_backward_device_dtype(const Tensor& dout, const Tensor& q, const Tensor& out, const Tensor& lse) {
  check_cuda_on_device_of({{dout, "dout"}, {out, "out"}, {lse, "softmax_lse"}}, q, "q");
  check_same_dtype(dout, "dout", q);
  check_same_dtype(out, "out", q);
  if (!(lse.scalar_type() == at::kFloat)) type_error("flash3: softmax_lse.dtype is ", dtype_str(lse.scalar_type()), "; expected torch.float32");
}

void check_dout_shape(const Tensor& dout, const Tensor& out) {
  if (!(dout.sizes() == out.sizes())) value_error("flash3: dout has shape ", shape_str(dout), "; expected ", shape_str(out), " to match out");
}

void check_backward_kernel(const Tensor& q, const Tensor& v) {
  if (!(kernel_built(to_f3(q.scalar_type()), q.size(-1), v.size(-1), /*forward=*/false))) not_implemented_error("flash3: no backward kernel for ", dtype_str(q.scalar_type()), " head_dim ", q.size(-1), ", head_dim_v ", v.size(-1), " in this build; backward kernels (head_dim, head_dim_v): ", built_head_dims(to_f3(q.scalar_type()), false));
}

// dlse: any float dtype, shaped like softmax_lse (converted to fp32 by backward_inputs).
void check_dlse(const std::optional<Tensor>& dlse, const Tensor& lse, const Tensor& q) {
  if (!has(dlse)) return;
  check_cuda(*dlse, "dlse");
  check_same_device(*dlse, "dlse", q, "q");
  if (!(dlse->sizes() == lse.sizes())) value_error("flash3: dlse has shape ", shape_str(*dlse), "; expected ", shape_str(lse), " to match softmax_lse");
}

// ---------------------------------------------------------------------------
// Scratch and launches.
// ---------------------------------------------------------------------------
// Scratch for one flash3::forward / flash3::backward call from the caching
// allocator: a uint8 tensor on `like`'s device (none for 0 bytes), kept alive
// by the caller until the call has been queued; the allocator's stream
// semantics then order any reuse of the block after the kernels, and under
// CUDA-graph capture it comes from the graph's pool. flash3 wants 256-byte
// alignment: the caching allocator's blocks are 512-byte aligned, and a block
// that is not (another allocator) is replaced by one 255 bytes longer whose
// pointer is rounded up.
Workspace caching_workspace(size_t bytes, const Tensor& like) {
  constexpr uintptr_t kAlign = 256;
  Workspace w;
  if (bytes == 0) return w;
  const auto opts = like.options().dtype(at::kByte);
  w.storage = at::empty({static_cast<int64_t>(bytes)}, opts);
  uintptr_t p = reinterpret_cast<uintptr_t>(w.storage.data_ptr());
  if (p % kAlign != 0) {
    w.storage = at::empty({static_cast<int64_t>(bytes + kAlign - 1)}, opts);
    p = (reinterpret_cast<uintptr_t>(w.storage.data_ptr()) + kAlign - 1) / kAlign * kAlign;
  }
  w.ptr = reinterpret_cast<void*>(p);
  w.bytes = bytes;
  return w;
}

flash3::ForwardArgs forward_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse) {
  flash3::ForwardArgs args;
  args.q = view(q);
  args.k = view(k);
  args.v = view(v);
  args.out = view(out);
  args.lse = view(lse);
  if (lse.numel() == 0) args.lse = flash3::TensorView{};  // nothing to store; a null lse is "not stored"
  return args;
}

void launch_forward(flash3::ForwardArgs& args, const Tensor& q, const char* what) {
  // The persistent causal kernels' tile counter (most calls need none); varlen adds the
  // per-sequence tensor maps and tile map (sized from the shapes, num_sequences and
  // max_seqlen_*, never from values on the device).
  const Workspace ws = caching_workspace(flash3::forward_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  throw_if_error(flash3::forward(args, current_stream(q)), what);
}

namespace {

// A tensor the kernels can read: unit stride in the last dim, other strides multiples of
// 16 bytes, 16-byte aligned data. Gradients handed to backward (dout, dlse) can be anything
// (expanded, sliced); they are copied when needed.
Tensor kernel_layout(const Tensor& t, bool is_lse) {
  const int64_t esize = static_cast<int64_t>(t.element_size());
  bool ok = t.numel() == 0 || t.stride(-1) == 1;
  if (ok && !is_lse) {
    const int64_t mult = 16 / esize;
    for (int64_t i = 0; i + 1 < t.dim(); ++i) ok = ok && (t.stride(i) % mult == 0 || t.size(i) == 1);
  }
  for (int64_t i = 0; ok && i < t.dim(); ++i) ok = !(t.stride(i) == 0 && t.size(i) > 1);  // expanded
  const uintptr_t align = is_lse ? 4 : 16;
  ok = ok && reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0;
  if (ok) return t;
  Tensor c = at::empty(t.sizes(), t.options());  // fresh allocation: contiguous and aligned
  c.copy_(t);
  return c;
}

}  // namespace

BackwardInputs backward_inputs(const Tensor& dout, const Tensor& out, const Tensor& lse,
                               const std::optional<Tensor>& dlse) {
  BackwardInputs in;
  if (has(dlse)) in.dlse = kernel_layout(dlse->scalar_type() == at::kFloat ? *dlse : dlse->to(at::kFloat), true);
  in.dout = kernel_layout(dout, false);
  in.lse = kernel_layout(lse, true);
  in.out = kernel_layout(out, false);
  return in;
}

// The backward call shared by the fixed-length and varlen ops: gradients
// allocated like q / k / v (zeroed when the kernels leave rows unwritten),
// scratch from the caching allocator (stream-ordered and CUDA-graph safe; its
// size depends on the shapes, the mask and, for varlen, num_sequences and
// max_seqlen_*, never on values held on the device), the current stream.
std::tuple<Tensor, Tensor, Tensor> run_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const BackwardInputs& in, const flash3::AttentionOptions& opts,
                                                bool zero_grads, const char* what) {
  auto alloc = [&](const Tensor& like) {
    return zero_grads ? at::zeros(like.sizes(), like.options()) : at::empty(like.sizes(), like.options());
  };
  Tensor dq = alloc(q), dk = alloc(k), dv = alloc(v);
  flash3::BackwardArgs args;
  args.q = view(q);
  args.k = view(k);
  args.v = view(v);
  args.out = view(in.out);
  args.dout = view(in.dout);
  args.lse = view(in.lse);
  args.dlse = view(in.dlse);
  args.dq = view(dq);
  args.dk = view(dk);
  args.dv = view(dv);
  args.opts = opts;
  const Workspace ws = caching_workspace(flash3::backward_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  throw_if_error(flash3::backward(args, current_stream(q)), what);
  return {dq, dk, dv};
}

// ---------------------------------------------------------------------------
// Autograd.
// ---------------------------------------------------------------------------
void save_options(SavedData& saved, std::optional<double> softmax_scale, bool causal, int64_t window_left,
                  int64_t window_right, double softcap, bool deterministic) {
  saved["has_scale"] = softmax_scale.has_value();
  saved["scale"] = softmax_scale.value_or(0.0);
  saved["causal"] = causal;
  saved["wl"] = window_left;
  saved["wr"] = window_right;
  saved["softcap"] = softcap;
  saved["deterministic"] = deterministic;
}

std::optional<double> saved_softmax_scale(SavedData& saved) {
  if (saved["has_scale"].toBool()) return saved["scale"].toDouble();
  return std::nullopt;
}

}  // namespace flash3_torch
