// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// flash3 PyTorch binding: the torch.library operators
//
//   flash3::fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
//               pack_gqa=-1, num_splits=1) -> (out, softmax_lse)
//   flash3::bwd(dout, q, k, v, out, softmax_lse, dlse, softmax_scale, causal, window_left,
//               window_right, softcap, deterministic) -> (dq, dk, dv)
//   flash3::varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
//                      max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
//                      deterministic, pack_gqa=-1, num_splits=1) -> (out, softmax_lse)
//       variable-length forward: q (total_q, hq, d), k (total_k, hkv, d), v (total_k, hkv, dv),
//       out (total_q, hq, dv), softmax_lse (hq, total_q) fp32; rows of out / softmax_lse that no
//       sequence writes (beyond seqused, beyond cu_seqlens_q[-1]) are left as allocated.
//   flash3::varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q,
//                      seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
//                      window_right, softcap, deterministic, dlse) -> (dq, dk, dv)
//       variable-length backward, the layouts of varlen_fwd (dout as out, dlse as softmax_lse);
//       dq / dk / dv are zero-filled: rows that no sequence writes (beyond seqused, beyond
//       cu_seqlens[-1]) stay 0, as in FlashAttention-3. dlse comes last (optional) so that the
//       other arguments keep FlashAttention-3's varlen backward order.
//   flash3::combine(out_partial, lse_partial, out, softmax_lse) -> ()
//       split-KV combine (FlashAttention-3's fwd_combine), writing out and softmax_lse in place
//       (flash3.flash_attn_combine allocates them, FlashAttention-3's out=None / out_dtype
//       semantics): out_partial (num_splits, batch, seqlen, heads, head_dim) fp32, lse_partial
//       (num_splits, batch, seqlen, heads) fp32 -> out (batch, seqlen, heads, head_dim) fp32 /
//       fp16 / bf16 and softmax_lse (batch, seqlen, heads) fp32, any strides. Any head_dim in
//       [1, 256]: the library's kernel needs a multiple of 4, so other head dims are padded here
//       (as FlashAttention-3 does).
//   flash3::fwd_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
//                       cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
//                       page_table=None, rotary_seqlens=None, softmax_scale=None, causal=False,
//                       window_left=-1, window_right=-1, softcap=0.0, rotary_interleaved=True,
//                       num_splits=0, pack_gqa=-1) -> (out, softmax_lse)
//       KV-cache attention (FlashAttention-3's flash_attn_with_kvcache, flash3::forward_kvcache),
//       forward only: the new rows k (batch, seqlen_new, hkv, d) / v (batch, seqlen_new, hkv, dv),
//       rotated when rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2) are given, are written
//       into k_cache / v_cache (batch_cache, seqlen_cache, hkv, d / dv) in place at rows
//       [cache_seqlens[b], cache_seqlens[b] + seqlen_new) of entry cache_batch_idx[b], then q
//       (batch, seqlen_q, hq, d) attends to rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new).
//       cache_seqlens / cache_batch_idx / cache_leftpad / rotary_seqlens: (batch,) int32 on q's
//       device, read on the device only. page_table (FlashAttention-3's paged KV cache): a
//       (batch, max_num_pages_per_seq) int32 tensor on q's device with unit stride(1); k_cache /
//       v_cache are then page pools (num_pages, page_size, hkv, d / dv) and row r of sequence b
//       lives at row r % page_size of page page_table[b][r // page_size] (capacity
//       max_num_pages_per_seq * page_size rows; not with cache_batch_idx, cache_leftpad or
//       softcap > 0). out (batch, seqlen_q, hq, dv) contiguous; softmax_lse (batch, hq, seqlen_q)
//       fp32, a permuted view of a contiguous (hq, batch, seqlen_q) tensor.
//   flash3::forward_plan(dtype, batch, max_seqlen_q, max_seqlen_k, heads_q, heads_kv, head_dim,
//                        head_dim_v, causal=False, window_left=-1, window_right=-1, softcap=0.0,
//                        num_splits=0, pack_gqa=-1) -> int[]
//       [num_splits, pack_gqa] as flash3::forward_plan decides them on the current device (host
//       only, from shapes and options); flash3.get_scheduler_metadata returns them, and
//       flash_attn_with_kvcache passes them back as explicit num_splits / pack_gqa.
//
// Kernels registered here:
//   CUDA      the real implementation: checks every argument (raising ValueError / TypeError /
//             NotImplementedError naming the argument) before anything is queued, allocates
//             out / lse / dq / dk / dv and the forward's and backward's workspace with the caching
//             allocator (at::empty, at::zeros for the varlen gradients: CUDA-graph safe, so
//             flash3 never falls back to cudaMallocAsync here), and calls flash3::forward /
//             flash3::backward / flash3::combine / flash3::forward_kvcache on the current stream.
//   CPU       raises the "must be a CUDA tensor" error (instead of the dispatcher's generic
//             "could not run ... with arguments from the 'CPU' backend").
//   (any)     forward_plan has no tensor arguments: one catch-all kernel.
//   Autograd  fwd: a C++ autograd function whose backward calls flash3::bwd; varlen_fwd: one whose
//             backward calls flash3::varlen_bwd (gradients for q, k, v only); fwd_kvcache: runs
//             below autograd (forward only: its outputs never require grad). Doing this in
//             C++ rather than with torch.library.register_autograd keeps the per-call Python
//             overhead down (no Python autograd kernel on every call); torch.compile traces it
//             like any other C++ autograd kernel (the backward's flash3::bwd / flash3::varlen_bwd
//             call lands in the backward graph through its fake implementation).
// The fake (meta) implementations used by torch.compile live in Python
// (flash3/flash_attn_interface.py, torch.library.register_fake).
//
// Scale and mask arguments follow FlashAttention-3 (the full rules: include/flash3/flash3.h):
//   softmax_scale  None: 1/sqrt(head_dim); a number: used as given, 0 included; negative, inf
//                  or NaN: ValueError (a negative scale would make the row maximum that the
//                  online softmax tracks on the unscaled scores the minimum of the scaled ones).
//   window_left / window_right  int64 here (Python ints); any negative value means unbounded
//                  and becomes -1, values above INT32_MAX become INT32_MAX (>= any seqlen, so
//                  still unbounded) before reaching the int fields of flash3::AttentionOptions.
//                  No window is an error: causal=True with any right side is causal (the
//                  library sets right = 0), causal with a finite left side is local attention.
//   pack_gqa       forward ops only: -1 heuristic, 0 off, 1 on (AttentionOptions::pack_gqa; any
//                  other value: ValueError); the results do not depend on it. The backward ops
//                  take no pack_gqa (the library's backward never packs).
//   num_splits     forward ops only: 1 no split (default; fwd_kvcache: 0, as FlashAttention-3),
//                  0 heuristic, n in [2, 256] at most n KV splits (AttentionOptions::num_splits;
//                  other values: ValueError); the results do not depend on it beyond fp32
//                  rounding. The backward ignores it.
//
// The C++ library itself (libflash3.so) knows nothing about torch; this file is the only
// place the two meet.
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flash3/flash3.h"

// Error helpers: the message is assembled here from strings and numbers
// (std::to_string), then thrown as the matching c10 error (ValueError,
// TypeError, NotImplementedError, RuntimeError in Python). Messages are built
// before the throw so no stream formatting happens on the error path.
inline std::string msg_part(const char* s) { return s; }
inline std::string msg_part(const std::string& s) { return s; }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline std::string msg_part(T v) { return std::to_string(v); }
inline std::string msg_part(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);  // std::to_string would print 1e-7 as 0.000000
  return buf;
}
inline std::string msg_part(c10::IntArrayRef v) {
  std::string m = "[";
  for (size_t i = 0; i < v.size(); ++i) m += (i ? ", " : "") + std::to_string(v[i]);
  return m + "]";
}
template <class... A>
std::string msg_join(const A&... a) {
  std::string m;
  (m += ... += msg_part(a));
  return m;
}
template <class... A>
[[noreturn]] void value_error(const A&... a) { throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, msg_join(a...)); }
template <class... A>
[[noreturn]] void type_error(const A&... a) { throw c10::TypeError({__func__, __FILE__, uint32_t(__LINE__)}, msg_join(a...)); }
template <class... A>
[[noreturn]] void not_implemented_error(const A&... a) {
  throw c10::NotImplementedError({__func__, __FILE__, uint32_t(__LINE__)}, msg_join(a...));
}
template <class... A>
[[noreturn]] void runtime_error(const A&... a) { throw c10::Error({__func__, __FILE__, uint32_t(__LINE__)}, msg_join(a...)); }


namespace {

using at::Tensor;

// ---------------------------------------------------------------------------
// Argument checks. Every failure raises before anything is launched; the messages
// name the argument, what was seen and what was expected.
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

void check_cuda(const Tensor& t, const char* name) {
  if (!(t.is_cuda())) value_error("flash3: ", name, " must be a CUDA tensor, but ", name, " is on device '", t.device().str(), "' (move it with ", name, ".cuda())");
}

void check_same_device(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name) {
  if (!(t.device() == ref.device())) value_error("flash3: ", name, " is on device '", t.device().str(), "' but ", ref_name, " is on device '", ref.device().str(), "'; expected all tensors on the same CUDA device");
}

struct NamedTensor {
  const Tensor& t;
  const char* name;
};

// Each of ts a CUDA tensor, then each on ref's device (ref itself is checked by the caller).
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

// "(64, 64), (96, 96), ..." for the built forward (or backward) kernels of a dtype.
std::string built_head_dims(flash3::DType dt, bool forward) {
  std::string s;
  for (int d = 8; d <= 256; d += 8)
    for (int dv = 8; dv <= 256; dv += 8) {
      const bool built = forward ? flash3::forward_is_built(dt, d, dv) : flash3::backward_is_built(dt, d, dv);
      if (built) s += (s.empty() ? "(" : ", (") + std::to_string(d) + ", " + std::to_string(dv) + ")";
    }
  return s.empty() ? "none" : s;
}

// Caches forward_is_built per (dtype, d, dv): the answers never change within a process.
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

// "torch.float16, torch.bfloat16": the dtypes with forward kernels in this build.
std::string built_dtypes() {
  std::string s;
  for (const auto t : {at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn})
    if (built_head_dims(to_f3(t), true) != "none") s += (s.empty() ? "" : ", ") + dtype_str(t);
  return s.empty() ? "none" : s;
}

// No forward kernel for (q's dtype, head_dim, head_dim_v): NotImplementedError naming the dtype
// when the build has none of that dtype (CMake FLASH3_DTYPES), else ValueError naming the head dims.
void check_head_dim(const Tensor& q, const Tensor& v, const char* v_name = "v") {
  const auto dt = to_f3(q.scalar_type());
  const int64_t d = q.size(-1), dv = v.size(-1);
  if (kernel_built(dt, d, dv, /*forward=*/true)) return;
  const std::string built = built_head_dims(dt, true);
  if (built == "none") not_implemented_error("flash3: q.dtype is ", dtype_str(q.scalar_type()), ", and this flash3 build has no ", dtype_str(q.scalar_type()), " kernels (CMake FLASH3_DTYPES); built dtypes: ", built_dtypes());
  value_error("flash3: unsupported head dim: q.shape[-1] (head_dim) is ", d, " and ", v_name, ".shape[-1] (head_dim_v) is ", dv, "; this flash3 build has ", dtype_str(q.scalar_type()), " kernels for (head_dim, head_dim_v) in ", built);
}

// q, k, v: CUDA tensors of one device, fp16 / bf16, one dtype (fixed length and varlen).
// fp8: the FP8 forward (fwd_fp8), whose q / k / v are torch.float8_e4m3fn.
void check_qkv_device_dtype(const Tensor& q, const Tensor& k, const Tensor& v, bool fp8 = false) {
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

// All the tensor checks of the forward, in the order a user would want to hear about them.
void check_forward_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool fp8 = false) {
  check_qkv_device_dtype(q, k, v, fp8);
  check_4d(q, "q", "(batch, seqlen_q, num_heads_q, head_dim)");
  check_4d(k, "k", "(batch, seqlen_k, num_heads_kv, head_dim)");
  check_4d(v, "v", "(batch, seqlen_k, num_heads_kv, head_dim_v)");
  check_last_dim_contiguous(q, "q", "head_dim");
  check_last_dim_contiguous(k, "k", "head_dim");
  check_last_dim_contiguous(v, "v", "head_dim_v");
  if (!(k.size(0) == q.size(0))) value_error("flash3: k.shape[0] (batch) is ", k.size(0), "; expected ", q.size(0), " to match q.shape[0] (q ", shape_str(q), ", k ", shape_str(k), ")");
  if (!(v.size(0) == q.size(0))) value_error("flash3: v.shape[0] (batch) is ", v.size(0), "; expected ", q.size(0), " to match q.shape[0] (q ", shape_str(q), ", v ", shape_str(v), ")");
  if (!(v.size(1) == k.size(1))) value_error("flash3: v.shape[1] (seqlen_k) is ", v.size(1), "; expected ", k.size(1), " to match k.shape[1] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(v.size(2) == k.size(2))) value_error("flash3: v.shape[2] (num_heads_kv) is ", v.size(2), "; expected ", k.size(2), " to match k.shape[2] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(k.size(3) == q.size(3))) value_error("flash3: k.shape[3] (head_dim) is ", k.size(3), "; expected ", q.size(3), " to match q.shape[3] (q ", shape_str(q), ", k ", shape_str(k), ")");
  if (!(k.size(2) >= 1 && q.size(2) % k.size(2) == 0)) value_error("flash3: q.shape[2] (num_heads_q) is ", q.size(2), ", which is not a multiple of k.shape[2] (num_heads_kv) ", k.size(2), "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  check_head_dim(q, v);
}

// ---------------------------------------------------------------------------
// Variable length (varlen_fwd). Only the host-side facts are checked here: the contents of
// cu_seqlens_* / seqused_* live on the device and are never read by the host (no sync).
// ---------------------------------------------------------------------------
void check_3d(const Tensor& t, const char* name, const char* layout) {
  if (!(t.dim() == 3)) value_error("flash3: ", name, " has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 3-d tensor ", layout, " (variable length: the sequences concatenated along dim 0)");
}

// An int32 index vector (cu_seqlens_*, seqused_*): CUDA, on q's device, int32, 1-d, contiguous.
void check_int32_vector(const Tensor& t, const char* name, const Tensor& q, const char* what) {
  if (!(t.is_cuda())) value_error("flash3: ", name, " must be a CUDA tensor on q's device (", q.device().str(), "), but ", name, " is on device '", t.device().str(), "' (move it with ", name, ".to(q.device))");
  check_same_device(t, name, q, "q");
  if (!(t.scalar_type() == at::kInt)) type_error("flash3: ", name, ".dtype is ", dtype_str(t.scalar_type()), "; expected torch.int32 (", what, "; use ", name, ".to(torch.int32))");
  if (!(t.dim() == 1)) value_error("flash3: ", name, " has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 1-d tensor (", what, ")");
  if (!(t.is_contiguous())) value_error("flash3: ", name, ".stride(0) is ", t.stride(0), "; expected a contiguous tensor (use ", name, ".contiguous())");
}

// 0 is FlashAttention-3's empty batch (every sequence empty): the lengths themselves come from the
// device arrays, max_seqlen only normalises the window.
void check_max_seqlen(int64_t m, const char* name, const char* what) {
  if (!(m >= 0 && m <= INT32_MAX)) value_error("flash3: ", name, " is ", m, "; expected a value in [0, 2147483647] (the length of the longest ", what, " sequence)");
}

void check_seqused(const std::optional<Tensor>& t, const char* name, const Tensor& q, const char* what,
                   int64_t num_sequences) {
  if (!(t.has_value() && t->defined())) return;  // None: every row of a sequence is real
  check_int32_vector(*t, name, q, what);
  if (!(t->numel() == num_sequences)) value_error("flash3: ", name, " has ", t->numel(), " entries; expected ", num_sequences, " (num_sequences = cu_seqlens_q.numel() - 1)");
}

constexpr const char* kCuSeqlensQ = "num_sequences + 1 prefix sums of the query lengths";
constexpr const char* kCuSeqlensK = "num_sequences + 1 prefix sums of the key lengths";

void check_varlen_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                         const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                         const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  check_qkv_device_dtype(q, k, v);
  check_3d(q, "q", "(total_q, num_heads_q, head_dim)");
  check_3d(k, "k", "(total_k, num_heads_kv, head_dim)");
  check_3d(v, "v", "(total_k, num_heads_kv, head_dim_v)");
  check_last_dim_contiguous(q, "q", "head_dim");
  check_last_dim_contiguous(k, "k", "head_dim");
  check_last_dim_contiguous(v, "v", "head_dim_v");
  if (!(v.size(0) == k.size(0))) value_error("flash3: v.shape[0] (total_k) is ", v.size(0), "; expected ", k.size(0), " to match k.shape[0] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(v.size(1) == k.size(1))) value_error("flash3: v.shape[1] (num_heads_kv) is ", v.size(1), "; expected ", k.size(1), " to match k.shape[1] (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(k.size(2) == q.size(2))) value_error("flash3: k.shape[2] (head_dim) is ", k.size(2), "; expected ", q.size(2), " to match q.shape[2] (q ", shape_str(q), ", k ", shape_str(k), ")");
  if (!(k.size(1) >= 1 && q.size(1) % k.size(1) == 0)) value_error("flash3: q.shape[1] (num_heads_q) is ", q.size(1), ", which is not a multiple of k.shape[1] (num_heads_kv) ", k.size(1), "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  check_head_dim(q, v);
  check_int32_vector(cu_seqlens_q, "cu_seqlens_q", q, kCuSeqlensQ);
  check_int32_vector(cu_seqlens_k, "cu_seqlens_k", q, kCuSeqlensK);
  if (!(cu_seqlens_q.numel() >= 1)) value_error("flash3: cu_seqlens_q is empty (shape ", shape_str(cu_seqlens_q), "); expected num_sequences + 1 >= 1 entries (", kCuSeqlensQ, ", starting with 0)");
  if (!(cu_seqlens_k.numel() == cu_seqlens_q.numel())) value_error("flash3: cu_seqlens_k has ", cu_seqlens_k.numel(), " entries; expected ", cu_seqlens_q.numel(), " to match cu_seqlens_q (both hold num_sequences + 1 prefix sums)");
  const int64_t num_sequences = cu_seqlens_q.numel() - 1;
  if (!(num_sequences <= INT32_MAX)) value_error("flash3: cu_seqlens_q has ", cu_seqlens_q.numel(), " entries; expected at most 2147483648 (num_sequences is an int32)");
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
// like softmax_lse; converted to fp32 by the caller). The fixed-length bwd's checks, in the same
// order, with the varlen shapes spelled out (the fixed-length bwd leaves softmax_lse's shape to
// the library).
void check_varlen_backward_tensors(const Tensor& dout, const Tensor& q, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const std::optional<Tensor>& dlse) {
  check_cuda_on_device_of({{dout, "dout"}, {out, "out"}, {lse, "softmax_lse"}}, q, "q");
  check_same_dtype(dout, "dout", q);
  check_same_dtype(out, "out", q);
  if (!(lse.scalar_type() == at::kFloat)) type_error("flash3: softmax_lse.dtype is ", dtype_str(lse.scalar_type()), "; expected torch.float32");
  const int64_t total_q = q.size(0), hq = q.size(1), dv = v.size(2);
  if (!(out.dim() == 3 && out.size(0) == total_q && out.size(1) == hq && out.size(2) == dv)) value_error("flash3: out has shape ", shape_str(out), "; expected ", dims_str({total_q, hq, dv}), " (total_q, num_heads_q, head_dim_v) from q ", shape_str(q), " and v ", shape_str(v));
  if (!(dout.sizes() == out.sizes())) value_error("flash3: dout has shape ", shape_str(dout), "; expected ", shape_str(out), " to match out");
  if (!(lse.dim() == 2 && lse.size(0) == hq && lse.size(1) == total_q)) value_error("flash3: softmax_lse has shape ", shape_str(lse), "; expected ", dims_str({hq, total_q}), " (num_heads_q, total_q) from q ", shape_str(q));
  if (!(kernel_built(to_f3(q.scalar_type()), q.size(2), v.size(2), /*forward=*/false))) not_implemented_error("flash3: no backward kernel for ", dtype_str(q.scalar_type()), " head_dim ", q.size(2), ", head_dim_v ", v.size(2), " in this build; backward kernels (head_dim, head_dim_v): ", built_head_dims(to_f3(q.scalar_type()), false));
  if (dlse.has_value() && dlse->defined()) {
    check_cuda(*dlse, "dlse");
    check_same_device(*dlse, "dlse", q, "q");
    if (!(dlse->sizes() == lse.sizes())) value_error("flash3: dlse has shape ", shape_str(*dlse), "; expected ", shape_str(lse), " to match softmax_lse");
  }
}

// The float that reaches flash3::AttentionOptions must be finite and >= 0; the library
// checks that too, but only once out / lse / dq / ... are allocated and dout possibly copied,
// and its message names the C++ field. The fake implementations make the same check.
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

void check_softmax_scale(std::optional<double> softmax_scale) {
  if (!softmax_scale.has_value()) return;
  // From 2^128 - 2^103 on, a double rounds to float infinity (and converting it is undefined).
  constexpr double kFloat32Overflow = 0x1.ffffffp127;
  const double s = *softmax_scale;
  const bool fits = std::fabs(s) < kFloat32Overflow;  // false for NaN and inf too
  if (!(fits && static_cast<float>(s) >= 0.f))
    value_error("flash3: softmax_scale is ", s, "; expected None (1/sqrt(head_dim)) or a finite number >= 0 "
                "(as float32): the online softmax tracks the row maximum of the unscaled scores, which a "
                "negative scale would turn into the row minimum");
  if (!kernel_float_ok(s)) value_error("flash3: softmax_scale is ", s, "; expected 0 or a value in fp32's normal range", kKernelFloatWhy);
}

// The same float32 range check for softcap (0 disables; the fake implementations
// and the Python wrappers raise the same message).
void check_softcap(double softcap) {
  constexpr double kFloat32Overflow = 0x1.ffffffp127;
  const bool fits = std::fabs(softcap) < kFloat32Overflow;  // false for NaN and inf too
  if (!(fits && static_cast<float>(softcap) >= 0.f))
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

// A Python int window side as the int of flash3::AttentionOptions: negative -> -1
// (unbounded); above INT32_MAX -> INT32_MAX, which the library treats as unbounded as well
// (any side >= seqlen - 1 cuts nothing).
int window_side(int64_t w) {
  if (w < 0) return -1;
  return w > INT32_MAX ? INT32_MAX : static_cast<int>(w);
}

// A Status that is not ok becomes the matching Python exception.
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

// The variable-length fields of flash3::AttentionOptions (arguments checked by check_varlen_inputs).
void set_varlen_opts(flash3::AttentionOptions* o, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                     const std::optional<Tensor>& seqused_q, const std::optional<Tensor>& seqused_k,
                     int64_t max_seqlen_q, int64_t max_seqlen_k) {
  o->cu_seqlens_q = cu_seqlens_q.data_ptr<int32_t>();
  o->cu_seqlens_k = cu_seqlens_k.data_ptr<int32_t>();
  o->num_sequences = static_cast<int>(cu_seqlens_q.numel() - 1);
  o->max_seqlen_q = static_cast<int>(max_seqlen_q);  // in [1, INT32_MAX]: checked
  o->max_seqlen_k = static_cast<int>(max_seqlen_k);
  if (seqused_q.has_value() && seqused_q->defined()) o->seqused_q = seqused_q->data_ptr<int32_t>();
  if (seqused_k.has_value() && seqused_k->defined()) o->seqused_k = seqused_k->data_ptr<int32_t>();
}

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

// Scratch for one flash3::forward / flash3::backward call from the caching
// allocator: a uint8 tensor on `like`'s device (none for 0 bytes), kept alive
// by the caller until the call has been queued; the allocator's stream
// semantics then order any reuse of the block after the kernels, and under
// CUDA-graph capture it comes from the graph's pool. flash3 wants 256-byte
// alignment: the caching allocator's blocks are 512-byte aligned, and a block
// that is not (another allocator) is replaced by one 255 bytes longer whose
// pointer is rounded up.
struct Workspace {
  Tensor storage;
  void* ptr = nullptr;
  size_t bytes = 0;
};

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

// ---------------------------------------------------------------------------
// CUDA kernels of the ops.
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

  flash3::ForwardArgs args;
  args.q = view(q);
  args.k = view(k);
  args.v = view(v);
  args.out = view(out);
  args.lse = view(lse);
  if (descales[0]) args.q_descale = view(*descales[0]);
  if (descales[1]) args.k_descale = view(*descales[1]);
  if (descales[2]) args.v_descale = view(*descales[2]);
  args.opts = opts;
  if (lse.numel() == 0) args.lse = flash3::TensorView{};  // nothing to store; a null lse is "not stored"
  // The persistent causal kernels' tile counter (most calls need none).
  const Workspace ws = caching_workspace(flash3::forward_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  throw_if_error(flash3::forward(args, stream), what);
  return {out, lse};
}

std::tuple<Tensor, Tensor> fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                    int64_t window_right, double softcap, bool deterministic, int64_t pack_gqa,
                                    int64_t num_splits) {
  check_forward_inputs(q, k, v);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
  flash3::AttentionOptions opts =
      make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic);
  opts.pack_gqa = static_cast<int>(pack_gqa);  // in [-1, 1]: checked
  opts.num_splits = static_cast<int>(num_splits);  // in [0, 256]: checked
  return run_fixed_forward(q, k, v, opts, q.scalar_type(), {}, "forward");
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
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.get_device()).stream();
  throw_if_error(flash3::quantize_fp8(a, stream), "quantize_fp8");
  return {out, descale};
}

std::tuple<Tensor, Tensor> fwd_fp8_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const std::optional<Tensor>&, const std::optional<Tensor>&,
                                       const std::optional<Tensor>&, std::optional<double>, bool, int64_t, int64_t) {
  check_forward_inputs(q, k, v, /*fp8=*/true);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");
  return {};
}

// The backward call shared by the fixed-length and varlen ops: gradients
// allocated like q / k / v (zeroed when the kernels leave rows unwritten),
// scratch from the caching allocator (stream-ordered and CUDA-graph safe; its
// size depends on the shapes, the mask and, for varlen, num_sequences and
// max_seqlen_*, never on values held on the device), the current stream.
std::tuple<Tensor, Tensor, Tensor> run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                const Tensor& dout, const Tensor& lse, const Tensor& dlse,
                                                const flash3::AttentionOptions& opts, bool zero_grads,
                                                const char* what) {
  auto alloc = [&](const Tensor& like) {
    return zero_grads ? at::zeros(like.sizes(), like.options()) : at::empty(like.sizes(), like.options());
  };
  Tensor dq = alloc(q), dk = alloc(k), dv = alloc(v);
  flash3::BackwardArgs args;
  args.q = view(q);
  args.k = view(k);
  args.v = view(v);
  args.out = view(out);
  args.dout = view(dout);
  args.lse = view(lse);
  args.dlse = view(dlse);
  args.dq = view(dq);
  args.dk = view(dk);
  args.dv = view(dv);
  args.opts = opts;
  const Workspace ws = caching_workspace(flash3::backward_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  throw_if_error(flash3::backward(args, stream), what);
  return {dq, dk, dv};
}

std::tuple<Tensor, Tensor, Tensor> bwd_cuda(const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse_in,
                                            std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                            int64_t window_right, double softcap, bool deterministic) {
  check_forward_inputs(q, k, v);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_cuda_on_device_of({{dout_in, "dout"}, {out, "out"}, {lse, "softmax_lse"}}, q, "q");
  check_same_dtype(dout_in, "dout", q);
  check_same_dtype(out, "out", q);
  if (!(lse.scalar_type() == at::kFloat)) type_error("flash3: softmax_lse.dtype is ", dtype_str(lse.scalar_type()), "; expected torch.float32");
  const auto ref_out = std::vector<int64_t>{q.size(0), q.size(1), q.size(2), v.size(3)};
  if (!(out.sizes() == at::IntArrayRef(ref_out))) value_error("flash3: out has shape ", shape_str(out), "; expected ", c10::IntArrayRef(ref_out), " (batch, seqlen_q, num_heads_q, head_dim_v)");
  if (!(dout_in.sizes() == out.sizes())) value_error("flash3: dout has shape ", shape_str(dout_in), "; expected ", shape_str(out), " to match out");
  if (!(kernel_built(to_f3(q.scalar_type()), q.size(3), v.size(3), /*forward=*/false))) not_implemented_error("flash3: no backward kernel for ", dtype_str(q.scalar_type()), " head_dim ", q.size(3), ", head_dim_v ", v.size(3), " in this build; backward kernels (head_dim, head_dim_v): ", built_head_dims(to_f3(q.scalar_type()), false));
  Tensor dlse;
  if (dlse_in.has_value() && dlse_in->defined()) {
    check_cuda(*dlse_in, "dlse");
    check_same_device(*dlse_in, "dlse", q, "q");
    if (!(dlse_in->sizes() == lse.sizes())) value_error("flash3: dlse has shape ", shape_str(*dlse_in), "; expected ", shape_str(lse), " to match softmax_lse");
    dlse = kernel_layout(dlse_in->scalar_type() == at::kFloat ? *dlse_in : dlse_in->to(at::kFloat), true);
  }
  const c10::cuda::CUDAGuard guard(q.device());
  const Tensor dout = kernel_layout(dout_in, false);
  const Tensor lse_k = kernel_layout(lse, true);
  const Tensor out_k = kernel_layout(out, false);
  return run_backward(q, k, v, out_k, dout, lse_k, dlse,
                      make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic),
                      /*zero_grads=*/false, "backward");
}

// Variable-length forward.
std::tuple<Tensor, Tensor> varlen_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                           const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                                           const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                           int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                                           int64_t window_left, int64_t window_right, double softcap,
                                           bool deterministic, int64_t pack_gqa, int64_t num_splits) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t total_q = q.size(0), hq = q.size(1), dv = v.size(2);
  // Rows that no sequence covers (beyond seqused, beyond cu_seqlens_q[-1]) are not written and
  // keep whatever the allocator hands out, as in FlashAttention-3.
  Tensor out = at::empty({total_q, hq, dv}, q.options());
  Tensor lse = at::empty({hq, total_q}, q.options().dtype(at::kFloat));

  flash3::ForwardArgs args;
  args.q = view(q);
  args.k = view(k);
  args.v = view(v);
  args.out = view(out);
  args.lse = view(lse);
  args.opts = make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic);
  set_varlen_opts(&args.opts, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  args.opts.pack_gqa = static_cast<int>(pack_gqa);  // in [-1, 1]: checked
  args.opts.num_splits = static_cast<int>(num_splits);  // in [0, 256]: checked
  if (lse.numel() == 0) args.lse = flash3::TensorView{};  // nothing to store
  // The per-sequence tensor maps and tile map (sized from the shapes, num_sequences and
  // max_seqlen_*, never from values on the device).
  const Workspace ws = caching_workspace(flash3::forward_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  throw_if_error(flash3::forward(args, stream), "varlen forward");
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
  Tensor dlse;
  if (dlse_in.has_value() && dlse_in->defined())
    dlse = kernel_layout(dlse_in->scalar_type() == at::kFloat ? *dlse_in : dlse_in->to(at::kFloat), true);
  const Tensor dout = kernel_layout(dout_in, false);
  const Tensor lse_k = kernel_layout(lse, true);
  const Tensor out_k = kernel_layout(out, false);
  flash3::AttentionOptions opts =
      make_opts(softmax_scale, causal, window_left, window_right, softcap, deterministic);
  set_varlen_opts(&opts, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  // Rows no sequence uses get no gradient from the kernels: zeros, as in FlashAttention-3.
  return run_backward(q, k, v, out_k, dout, lse_k, dlse, opts, /*zero_grads=*/true, "varlen backward");
}

// ---------------------------------------------------------------------------
// Split-KV combine.
// ---------------------------------------------------------------------------
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
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(out_partial.get_device()).stream();
  throw_if_error(flash3::combine(args, stream), "combine");
  if (!direct_out) out.copy_(o.narrow(3, 0, d));
}

// ---------------------------------------------------------------------------
// KV-cache attention (fwd_kvcache) and the forward's launch plan (forward_plan).
// ---------------------------------------------------------------------------
bool has(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

// Whether the (batch, seqlen) rows of a 4-d tensor are one stride apart, as flash3::KVCacheArgs
// wants q / k_cache / v_cache / out: batch stride == seqlen * row stride, or one of the two
// dimensions has a single entry (its stride is never used).
bool rows_one_stride_apart(const Tensor& t) {
  return t.size(0) <= 1 || t.size(1) <= 1 || t.stride(0) == t.size(1) * t.stride(1);
}

constexpr const char* kPerSequence = "one entry per sequence";

// The layout of one fwd_kvcache call: fixed-length q (batch, seqlen_q, heads, d) or variable-length
// q (total_q, heads, d) with cu_seqlens_q; new rows (batch, seqlen_new, ...) or (total_new, ...)
// with cu_seqlens_k_new; a contiguous or a paged cache.
struct KVCacheLayout {
  bool varlen_q = false, varlen_new = false, paged = false;
  int64_t b = 0, sq = 0, hq = 0, d = 0, dv = 0, hkv = 0;
  int64_t capacity = 0;
  const char* capacity_what = "";
};

// An optional per-sequence int32 array (cache_seqlens, cache_batch_idx, cache_leftpad, rotary_seqlens):
// CUDA on q's device, int32, 1-d, contiguous, one entry per sequence. Its values stay on the device.
void check_per_sequence(const std::optional<Tensor>& t, const char* name, const Tensor& q, const KVCacheLayout& L) {
  if (!has(t)) return;
  check_int32_vector(*t, name, q, kPerSequence);
  if (!(t->numel() == L.b)) value_error("flash3: ", name, " has ", t->numel(), " entries (shape ", shape_str(*t), "); expected ", L.b, L.varlen_q ? " (one per sequence: cu_seqlens_q.numel() - 1)" : " (one per sequence: q.shape[0], batch)");
}

// New rows k / v: both or neither, CUDA on q's device, q's dtype, (batch, seqlen_new, num_heads_kv,
// head_dim[_v]), or (total_new, num_heads_kv, head_dim[_v]) with cu_seqlens_k_new, with the cache's
// heads and head dims, unit stride in the last dimension.
void check_kvcache_new_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
                            const Tensor& v, const KVCacheLayout& L) {
  check_cuda_on_device_of({{k, "k"}, {v, "v"}}, q, "q");
  check_same_dtype(k, "k", q);
  check_same_dtype(v, "v", q);
  if (L.varlen_new) {
    check_3d(k, "k", "(total_new, num_heads_kv, head_dim)");
    check_3d(v, "v", "(total_new, num_heads_kv, head_dim_v)");
  } else {
    check_4d(k, "k", "(batch, seqlen_new, num_heads_kv, head_dim)");
    check_4d(v, "v", "(batch, seqlen_new, num_heads_kv, head_dim_v)");
  }
  check_last_dim_contiguous(k, "k", "head_dim");
  check_last_dim_contiguous(v, "v", "head_dim_v");
  const int64_t H = k.dim() - 2;  // heads
  if (!L.varlen_new) {
    if (!(k.size(0) == L.b)) value_error("flash3: k.shape[0] (batch) is ", k.size(0), "; expected ", L.b, " to match q.shape[0] (q ", shape_str(q), ", k ", shape_str(k), ")");
    if (!(v.size(0) == L.b)) value_error("flash3: v.shape[0] (batch) is ", v.size(0), "; expected ", L.b, " to match q.shape[0] (q ", shape_str(q), ", v ", shape_str(v), ")");
  }
  if (!(v.size(H - 1) == k.size(H - 1))) value_error("flash3: v.shape[", H - 1, "] (", L.varlen_new ? "total_new" : "seqlen_new", ") is ", v.size(H - 1), "; expected ", k.size(H - 1), " to match k (k ", shape_str(k), ", v ", shape_str(v), ")");
  if (!(k.size(H) == L.hkv)) value_error("flash3: k.shape[", H, "] (num_heads_kv) is ", k.size(H), "; expected ", L.hkv, " to match k_cache.shape[2] (k ", shape_str(k), ", k_cache ", shape_str(k_cache), ")");
  if (!(v.size(H) == L.hkv)) value_error("flash3: v.shape[", H, "] (num_heads_kv) is ", v.size(H), "; expected ", L.hkv, " to match k_cache.shape[2] (v ", shape_str(v), ", k_cache ", shape_str(k_cache), ")");
  if (!(k.size(H + 1) == L.d)) value_error("flash3: k.shape[", H + 1, "] (head_dim) is ", k.size(H + 1), "; expected ", L.d, " to match k_cache.shape[3] (k ", shape_str(k), ", k_cache ", shape_str(k_cache), ")");
  if (!(v.size(H + 1) == L.dv)) value_error("flash3: v.shape[", H + 1, "] (head_dim_v) is ", v.size(H + 1), "; expected ", L.dv, " to match v_cache.shape[3] (v ", shape_str(v), ", v_cache ", shape_str(v_cache), ")");
  if (!L.varlen_new && !(k.size(1) <= L.capacity)) value_error("flash3: k.shape[1] (seqlen_new) is ", k.size(1), "; expected at most ", L.capacity_what, " = ", L.capacity, ": the cache is too small for the new rows");
}

// Rotary tables: CUDA on q's device, q's dtype, (seqlen_ro, rotary_dim / 2) each, unit stride in
// the last dimension, rotary_dim <= head_dim, seqlen_ro >= the capacity (seqlen_cache, or
// max_num_pages_per_seq * page_size with a page table).
void check_rotary_tables(const Tensor& q, const KVCacheLayout& L, const Tensor& cos, const Tensor& sin) {
  check_cuda_on_device_of({{cos, "rotary_cos"}, {sin, "rotary_sin"}}, q, "q");
  check_same_dtype(cos, "rotary_cos", q);
  check_same_dtype(sin, "rotary_sin", q);
  if (!(cos.dim() == 2)) value_error("flash3: rotary_cos has ", cos.dim(), " dimensions (shape ", shape_str(cos), "); expected a 2-d tensor (seqlen_ro, rotary_dim / 2)");
  if (!(sin.sizes() == cos.sizes())) value_error("flash3: rotary_sin has shape ", shape_str(sin), "; expected ", shape_str(cos), " to match rotary_cos (seqlen_ro, rotary_dim / 2)");
  if (!(cos.size(1) >= 1 && 2 * cos.size(1) <= L.d)) value_error("flash3: rotary_cos.shape[1] (rotary_dim / 2) is ", cos.size(1), "; expected 1 to ", L.d / 2, " (rotary_dim = 2 * rotary_cos.shape[1] must be in [2, head_dim], head_dim = ", L.d, ")");
  if (!(cos.size(0) >= L.capacity)) value_error("flash3: rotary_cos.shape[0] (seqlen_ro) is ", cos.size(0), "; expected at least ", L.capacity_what, " = ", L.capacity, " (one row per cache position)");
  check_last_dim_contiguous(cos, "rotary_cos", "rotary_dim / 2");
  check_last_dim_contiguous(sin, "rotary_sin", "rotary_dim / 2");
}

constexpr const char* kPageTableLayout = "(batch, max_num_pages_per_seq)";

// A paged cache's page_table (FlashAttention-3's): CUDA on q's device, int32, 2-d with one row per
// sequence (or, with cache_batch_idx, one row per cache entry: any number of rows >= 1, sequence b
// reading row cache_batch_idx[b]) of >= 1 entries, each row contiguous (stride(1) == 1) and the rows
// not overlapping (stride(0) >= shape[1]); k_cache's page_size >= 1. Its values (page indices) stay
// on the device: indices outside [0, num_pages) are the caller's contract. The flash3::KVCacheArgs
// fields come from data_ptr, stride(0), shape[0] and shape[1].
void check_page_table(const Tensor& t, const Tensor& q, const Tensor& k_cache,
                      const std::optional<Tensor>& cache_batch_idx, const KVCacheLayout& L) {
  if (!(t.is_cuda())) value_error("flash3: page_table must be a CUDA tensor on q's device (", q.device().str(), "), but page_table is on device '", t.device().str(), "' (move it with page_table.to(q.device))");
  check_same_device(t, "page_table", q, "q");
  if (!(t.scalar_type() == at::kInt)) type_error("flash3: page_table.dtype is ", dtype_str(t.scalar_type()), "; expected torch.int32 (the page indices of each sequence; use page_table.to(torch.int32))");
  if (!(t.dim() == 2)) value_error("flash3: page_table has ", t.dim(), " dimensions (shape ", shape_str(t), "); expected a 2-d tensor ", kPageTableLayout, " of int32 page indices");
  if (has(cache_batch_idx)) {
    if (!(t.size(0) >= 1 && t.size(0) <= INT32_MAX)) value_error("flash3: page_table.shape[0] is ", t.size(0), " (page_table ", shape_str(t), "); expected at least 1 row (one per cache entry that cache_batch_idx picks)");
  } else if (!(t.size(0) == L.b)) {
    value_error("flash3: page_table.shape[0] is ", t.size(0), " (page_table ", shape_str(t), "); expected ", L.b, " (one row per sequence; with cache_batch_idx, one per cache entry)");
  }
  if (!(t.size(1) >= 1 && t.size(1) <= INT32_MAX)) value_error("flash3: page_table.shape[1] (max_num_pages_per_seq) is ", t.size(1), "; expected a value in [1, 2147483647]");
  if (!(t.size(1) == 1 || t.stride(1) == 1)) value_error("flash3: page_table.stride(1) is ", t.stride(1), "; expected 1: each sequence's page indices must be contiguous (use page_table.contiguous())");
  if (!(t.size(0) <= 1 || t.stride(0) >= t.size(1))) value_error("flash3: page_table.stride(0) is ", t.stride(0), "; expected at least page_table.shape[1] (max_num_pages_per_seq) = ", t.size(1), ": the rows of page_table must not overlap (use page_table.contiguous())");
  if (!(k_cache.size(1) >= 1)) value_error("flash3: k_cache.shape[1] (page_size) is ", k_cache.size(1), "; expected >= 1 with page_table (k_cache is a (num_pages, page_size, num_heads_kv, head_dim) page pool)");
}

// softcap > 0 with a page table: the paged kernels have no softcap (the library says so too, but
// only after out / lse are allocated). float as AttentionOptions::softcap holds it.
void check_page_table_softcap(const std::optional<Tensor>& page_table, double softcap) {
  if (has(page_table) && static_cast<float>(softcap) != 0.f) not_implemented_error("flash3: page_table (paged KV cache) with softcap ", softcap, " is not supported yet; pass softcap=0.0, or a contiguous cache");
}

// Every tensor check of fwd_kvcache, in the order a user would want to hear about them; returns
// the call's layout. The library validates again (strides, alignment, overlaps) before launching
// anything.
KVCacheLayout check_kvcache_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const std::optional<Tensor>& k, const std::optional<Tensor>& v,
                                   const std::optional<Tensor>& rotary_cos, const std::optional<Tensor>& rotary_sin,
                                   const std::optional<Tensor>& cache_seqlens,
                                   const std::optional<Tensor>& cache_batch_idx,
                                   const std::optional<Tensor>& cache_leftpad, const std::optional<Tensor>& page_table,
                                   const std::optional<Tensor>& rotary_seqlens,
                                   const std::optional<Tensor>& cu_seqlens_q,
                                   const std::optional<Tensor>& cu_seqlens_k_new, std::optional<int64_t> max_seqlen_q) {
  KVCacheLayout L;
  L.varlen_q = has(cu_seqlens_q);
  L.varlen_new = has(cu_seqlens_k_new);
  check_cuda(q, "q");
  check_cuda_on_device_of({{k_cache, "k_cache"}, {v_cache, "v_cache"}}, q, "q");
  check_dtype_q(q);
  check_same_dtype(k_cache, "k_cache", q);
  check_same_dtype(v_cache, "v_cache", q);
  if (L.varlen_q) check_3d(q, "q", "(total_q, num_heads_q, head_dim)");
  else check_4d(q, "q", "(batch, seqlen_q, num_heads_q, head_dim)");
  check_4d(k_cache, "k_cache", "(batch_cache, seqlen_cache, num_heads_kv, head_dim)");
  check_4d(v_cache, "v_cache", "(batch_cache, seqlen_cache, num_heads_kv, head_dim_v)");
  check_last_dim_contiguous(q, "q", "head_dim");
  check_last_dim_contiguous(k_cache, "k_cache", "head_dim");
  check_last_dim_contiguous(v_cache, "v_cache", "head_dim_v");
  const int64_t H = q.dim() - 2;
  L.hq = q.size(H);
  L.d = q.size(H + 1);
  L.dv = v_cache.size(3);
  L.hkv = k_cache.size(2);
  if (L.varlen_q) {
    check_int32_vector(*cu_seqlens_q, "cu_seqlens_q", q, kCuSeqlensQ);
    if (!(cu_seqlens_q->numel() >= 1)) value_error("flash3: cu_seqlens_q is empty (shape ", shape_str(*cu_seqlens_q), "); expected num_sequences + 1 >= 1 entries (", kCuSeqlensQ, ", starting with 0)");
    if (!(cu_seqlens_q->numel() - 1 <= INT32_MAX)) value_error("flash3: cu_seqlens_q has ", cu_seqlens_q->numel(), " entries; expected at most 2147483648 (num_sequences is an int32)");
    if (!max_seqlen_q.has_value()) value_error("flash3: max_seqlen_q is None with cu_seqlens_q; expected the longest query sequence (an int >= 0)");
    if (!(*max_seqlen_q >= 0 && *max_seqlen_q <= INT32_MAX)) value_error("flash3: max_seqlen_q is ", *max_seqlen_q, "; expected a value in [0, 2147483647] (the length of the longest query sequence)");
    L.b = cu_seqlens_q->numel() - 1;
    L.sq = *max_seqlen_q;
  } else {
    L.b = q.size(0);
    L.sq = q.size(1);
  }
  if (!(v_cache.size(0) == k_cache.size(0))) value_error("flash3: v_cache.shape[0] (batch_cache) is ", v_cache.size(0), "; expected ", k_cache.size(0), " to match k_cache.shape[0] (k_cache ", shape_str(k_cache), ", v_cache ", shape_str(v_cache), ")");
  if (!(v_cache.size(1) == k_cache.size(1))) value_error("flash3: v_cache.shape[1] (seqlen_cache) is ", v_cache.size(1), "; expected ", k_cache.size(1), " to match k_cache.shape[1] (k_cache ", shape_str(k_cache), ", v_cache ", shape_str(v_cache), ")");
  if (!(v_cache.size(2) == k_cache.size(2))) value_error("flash3: v_cache.shape[2] (num_heads_kv) is ", v_cache.size(2), "; expected ", k_cache.size(2), " to match k_cache.shape[2] (k_cache ", shape_str(k_cache), ", v_cache ", shape_str(v_cache), ")");
  if (!(k_cache.size(3) == L.d)) value_error("flash3: k_cache.shape[3] (head_dim) is ", k_cache.size(3), "; expected ", L.d, " to match q's head_dim (q ", shape_str(q), ", k_cache ", shape_str(k_cache), ")");
  if (!(L.hkv >= 1 && L.hq % L.hkv == 0)) value_error("flash3: q's num_heads_q is ", L.hq, ", which is not a multiple of k_cache.shape[2] (num_heads_kv) ", L.hkv, "; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)");
  check_head_dim(q, v_cache, "v_cache");
  // A page table: k_cache / v_cache are page pools (num_pages, page_size, ...), whose num_pages
  // has nothing to do with the batch; a sequence holds max_num_pages_per_seq * page_size rows.
  L.paged = has(page_table);
  if (L.paged) check_page_table(*page_table, q, k_cache, cache_batch_idx, L);
  L.capacity = L.paged ? page_table->size(1) * k_cache.size(1) : k_cache.size(1);
  L.capacity_what = L.paged ? "page_table.shape[1] * k_cache.shape[1] (max_num_pages_per_seq * page_size)"
                            : "k_cache.shape[1] (seqlen_cache)";
  if (!(L.paged || has(cache_batch_idx) || k_cache.size(0) >= L.b)) value_error("flash3: k_cache.shape[0] (batch_cache) is ", k_cache.size(0), ", less than the batch (", L.b, " sequences); expected batch_cache >= batch without cache_batch_idx (sequence b uses cache entry b)");
  // The caches are written in place, so they cannot be copied into the layout the kernels want.
  // (A page pool likewise: its pages are page_size rows apart.)
  for (const NamedTensor& c : {NamedTensor{k_cache, "k_cache"}, NamedTensor{v_cache, "v_cache"}})
    if (!(rows_one_stride_apart(c.t))) {
      if (L.paged) value_error("flash3: ", c.name, ".stride(0) (num_pages) is ", c.t.stride(0), "; expected ", c.t.size(1) * c.t.stride(1), " = ", c.name, ".shape[1] * ", c.name, ".stride(1) (page_size * row stride): the rows of all pages must be one stride apart (e.g. a contiguous page pool, or one sliced along the heads)");
      value_error("flash3: ", c.name, ".stride(0) (batch_cache) is ", c.t.stride(0), "; expected ", c.t.size(1) * c.t.stride(1), " = ", c.name, ".shape[1] * ", c.name, ".stride(1) (seqlen_cache * row stride): the rows of all cache entries must be one stride apart (e.g. a contiguous cache, or one sliced along the heads, not along seqlen_cache)");
    }
  if (has(k) != has(v)) value_error("flash3: k and v (the new rows) must be given together, but ", has(k) ? "v" : "k", " is None");
  if (L.varlen_new && !has(k)) value_error("flash3: cu_seqlens_k_new is given but k / v are None; expected the new rows it describes");
  if (has(k)) {
    check_kvcache_new_rows(q, k_cache, v_cache, *k, *v, L);
    if (!has(cache_seqlens)) value_error("flash3: k / v (new rows) need cache_seqlens: the new rows of sequence b are written at rows [cache_seqlens[b], cache_seqlens[b] + seqlen_new) of its cache entry (pass cache_seqlens: an int or a (batch,) torch.int32 tensor)");
  }
  if (L.varlen_new) {
    check_int32_vector(*cu_seqlens_k_new, "cu_seqlens_k_new", q, "num_sequences + 1 prefix sums of the new rows");
    if (!(cu_seqlens_k_new->numel() == L.b + 1)) value_error("flash3: cu_seqlens_k_new has ", cu_seqlens_k_new->numel(), " entries; expected ", L.b + 1, " (num_sequences + 1 prefix sums over k's rows)");
  }
  if (has(rotary_cos) != has(rotary_sin)) value_error("flash3: rotary_cos and rotary_sin must be given together, but ", has(rotary_cos) ? "rotary_sin" : "rotary_cos", " is None");
  if (has(rotary_cos)) {
    if (!has(k)) value_error("flash3: rotary_cos / rotary_sin need k and v: the rotary embedding is applied to the new keys (and to q) as they are appended; pass k and v, or no rotary tables");
    check_rotary_tables(q, L, *rotary_cos, *rotary_sin);
  }
  check_per_sequence(cache_seqlens, "cache_seqlens", q, L);
  check_per_sequence(cache_batch_idx, "cache_batch_idx", q, L);
  check_per_sequence(cache_leftpad, "cache_leftpad", q, L);
  check_per_sequence(rotary_seqlens, "rotary_seqlens", q, L);
  return L;
}

// out= of fwd_kvcache: q's device and dtype, (batch, seqlen_q, num_heads_q, head_dim_v) or
// (total_q, num_heads_q, head_dim_v), unit stride in the last dimension; the library checks the
// rest (strides, alignment, that it shares memory with nothing the call reads or writes).
void check_out_arg(const Tensor& out, const Tensor& q, int64_t dv) {
  check_cuda(out, "out");
  check_same_device(out, "out", q, "q");
  if (!(out.scalar_type() == q.scalar_type())) type_error("flash3: out.dtype is ", dtype_str(out.scalar_type()), "; expected ", dtype_str(q.scalar_type()), " to match q.dtype");
  std::vector<int64_t> want = q.sizes().vec();
  want.back() = dv;
  if (!(out.sizes() == at::IntArrayRef(want))) value_error("flash3: out has shape ", shape_str(out), "; expected ", c10::IntArrayRef(want), " (q's shape with head_dim_v)");
  check_last_dim_contiguous(out, "out", "head_dim_v");
}

const int* int32_ptr(const std::optional<Tensor>& t) { return has(t) ? t->data_ptr<int32_t>() : nullptr; }

// KV-cache forward: appends k / v (rotary applied) to k_cache / v_cache in place, then attention
// of q over each sequence's cache rows. out (batch, seqlen_q, num_heads_q, head_dim_v) or, with
// cu_seqlens_q, (total_q, num_heads_q, head_dim_v): the caller's out= or a new contiguous tensor;
// softmax_lse (batch, num_heads_q, seqlen_q) fp32, a permuted view of a contiguous
// (num_heads_q, batch, seqlen_q) buffer (KVCacheArgs::lse's layout: batch stride seqlen_q, row
// stride 1), or (num_heads_q, total_q). Workspace (per-sequence maps, split partials, rotated q)
// from the caching allocator.
std::tuple<Tensor, Tensor> fwd_kvcache_impl(
    const Tensor& q_in, const Tensor& k_cache, const Tensor& v_cache, const std::optional<Tensor>& k,
    const std::optional<Tensor>& v, const std::optional<Tensor>& rotary_cos, const std::optional<Tensor>& rotary_sin,
    const std::optional<Tensor>& cache_seqlens, const std::optional<Tensor>& cache_batch_idx,
    const std::optional<Tensor>& cache_leftpad, const std::optional<Tensor>& page_table,
    const std::optional<Tensor>& rotary_seqlens, std::optional<double> softmax_scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, bool rotary_interleaved, int64_t num_splits,
    int64_t pack_gqa, const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k_new,
    std::optional<int64_t> max_seqlen_q, const std::optional<Tensor>& out_arg) {
  const KVCacheLayout L =
      check_kvcache_inputs(q_in, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, page_table, rotary_seqlens, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q);
  check_softmax_scale(softmax_scale);
  check_softcap(softcap);
  check_page_table_softcap(page_table, softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
  if (has(out_arg)) check_out_arg(*out_arg, q_in, L.dv);
  const c10::cuda::CUDAGuard guard(q_in.device());
  // q is only read: a fixed-length q whose (batch, seqlen_q) rows are not one stride apart (e.g. a
  // slice along seqlen) is copied into that layout.
  const Tensor q = L.varlen_q || rows_one_stride_apart(q_in) ? q_in : q_in.contiguous();
  Tensor out, lse;
  if (L.varlen_q) {
    out = has(out_arg) ? *out_arg : at::empty({q.size(0), L.hq, L.dv}, q.options());
    lse = at::empty({L.hq, q.size(0)}, q.options().dtype(at::kFloat));
  } else {
    out = has(out_arg) ? *out_arg : at::empty({L.b, L.sq, L.hq, L.dv}, q.options());
    lse = at::empty({L.hq, L.b, L.sq}, q.options().dtype(at::kFloat)).permute({1, 0, 2});
  }

  flash3::KVCacheArgs args;
  args.q = view(q);
  args.k_cache = view(k_cache);
  args.v_cache = view(v_cache);
  if (has(k)) {
    args.k_new = view(*k);
    args.v_new = view(*v);
    args.cu_seqlens_k_new = int32_ptr(cu_seqlens_k_new);
  }
  if (has(rotary_cos)) {
    args.rotary_cos = view(*rotary_cos);
    args.rotary_sin = view(*rotary_sin);
  }
  args.rotary_interleaved = rotary_interleaved;
  args.cache_seqlens = int32_ptr(cache_seqlens);
  args.cache_batch_idx = int32_ptr(cache_batch_idx);
  args.cache_leftpad = int32_ptr(cache_leftpad);
  if (has(page_table)) {  // checked: int32, 2-d, unit stride(1)
    // batch 0: nothing to compute, and the empty table has no data pointer (a null one would
    // read as "no page table" and get the contiguous cache's checks).
    if (L.b == 0) return {out, lse};
    args.page_table = page_table->data_ptr<int32_t>();
    args.page_table_batch_stride = page_table->stride(0);
    args.page_table_max_pages = static_cast<int>(page_table->size(1));  // in [1, INT32_MAX]: checked
    args.page_table_rows = static_cast<int>(page_table->size(0));        // likewise
  }
  // rotary_seqlens only matters with rotary tables; without them it is ignored, as in FlashAttention-3.
  args.rotary_seqlens = has(rotary_cos) ? int32_ptr(rotary_seqlens) : nullptr;
  args.out = view(out);
  args.lse = lse.numel() == 0 ? flash3::TensorView{} : view(lse);  // nothing to store: "not stored"
  args.opts = make_opts(softmax_scale, causal, window_left, window_right, softcap, /*deterministic=*/false);
  args.opts.pack_gqa = static_cast<int>(pack_gqa);      // in [-1, 1]: checked
  args.opts.num_splits = static_cast<int>(num_splits);  // in [0, 256]: checked
  if (L.varlen_q) {
    args.opts.cu_seqlens_q = cu_seqlens_q->data_ptr<int32_t>();
    args.opts.num_sequences = static_cast<int>(L.b);   // <= INT32_MAX: checked
    args.opts.max_seqlen_q = static_cast<int>(L.sq);   // likewise
  }
  // Sized from the shapes and options only (never from values on the device): CUDA-graph safe.
  const Workspace ws = caching_workspace(flash3::kvcache_workspace_size(args), q);
  args.workspace = ws.ptr;
  args.workspace_bytes = ws.bytes;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
  throw_if_error(flash3::forward_kvcache(args, stream), "kvcache forward");
  return {out, lse};
}

// The two operators over fwd_kvcache_impl: fwd_kvcache returns a new out, fwd_kvcache_out writes
// the caller's out (out=) and returns softmax_lse.
#define FLASH3_KVCACHE_PARAMS                                                                                      \
  const Tensor &q, const Tensor &k_cache, const Tensor &v_cache, const std::optional<Tensor>&k,                   \
      const std::optional<Tensor>&v, const std::optional<Tensor>&rotary_cos,                                      \
      const std::optional<Tensor>&rotary_sin, const std::optional<Tensor>&cache_seqlens,                           \
      const std::optional<Tensor>&cache_batch_idx, const std::optional<Tensor>&cache_leftpad,                      \
      const std::optional<Tensor>&page_table, const std::optional<Tensor>&rotary_seqlens,                          \
      std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap, \
      bool rotary_interleaved, int64_t num_splits, int64_t pack_gqa, const std::optional<Tensor>&cu_seqlens_q,     \
      const std::optional<Tensor>&cu_seqlens_k_new, std::optional<int64_t> max_seqlen_q
#define FLASH3_KVCACHE_ARGS                                                                                        \
  q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, page_table,  \
      rotary_seqlens, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved, num_splits,   \
      pack_gqa, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q

std::tuple<Tensor, Tensor> fwd_kvcache_cuda(FLASH3_KVCACHE_PARAMS) {
  return fwd_kvcache_impl(FLASH3_KVCACHE_ARGS, std::nullopt);
}

Tensor fwd_kvcache_out_cuda(FLASH3_KVCACHE_PARAMS, const Tensor& out) {
  return std::get<1>(fwd_kvcache_impl(FLASH3_KVCACHE_ARGS, out));
}

// An int argument of forward_plan as the library's int (ValueError outside [lo, INT32_MAX]).
int plan_int(int64_t v, const char* name, int64_t lo, const char* what) {
  if (!(v >= lo && v <= INT32_MAX)) value_error("flash3: forward_plan: ", name, " is ", v, "; expected a value in [", lo, ", 2147483647] (", what, ")");
  return static_cast<int>(v);
}

// The forward's launch plan on the current device (flash3::forward_plan): [num_splits, pack_gqa].
// No tensor arguments: a CompositeImplicitAutograd (catch-all) kernel, so it also runs under
// torch.compile's fake tensors (it never touches a tensor).
std::vector<int64_t> forward_plan_op(at::ScalarType dtype, int64_t batch, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                     int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t head_dim_v,
                                     bool causal, int64_t window_left, int64_t window_right, double softcap,
                                     int64_t num_splits, int64_t pack_gqa) {
  if (!(dtype == at::kHalf || dtype == at::kBFloat16)) type_error("flash3: forward_plan: dtype is ", dtype_str(dtype), "; expected torch.float16 or torch.bfloat16");
  const int b = plan_int(batch, "batch", 1, "the number of sequences");
  const int sq = plan_int(max_seqlen_q, "max_seqlen_q", 1, "the longest query sequence");
  const int sk = plan_int(max_seqlen_k, "max_seqlen_k", 1, "the longest key sequence, new rows included");
  const int hq = plan_int(heads_q, "heads_q", 1, "query heads");
  const int hkv = plan_int(heads_kv, "heads_kv", 1, "key/value heads");
  const int d = plan_int(head_dim, "head_dim", 1, "q / k head dim");
  const int dv = plan_int(head_dim_v, "head_dim_v", 1, "v head dim");
  check_softcap(softcap);
  check_pack_gqa(pack_gqa);
  check_num_splits(num_splits);
  flash3::AttentionOptions opts = make_opts(std::nullopt, causal, window_left, window_right, softcap, false);
  opts.num_splits = static_cast<int>(num_splits);
  opts.pack_gqa = static_cast<int>(pack_gqa);
  flash3::ForwardPlan plan;
  throw_if_error(flash3::forward_plan(to_f3(dtype), b, sq, sk, hq, hkv, d, dv, opts, &plan), "forward_plan");
  return {plan.num_splits, plan.pack_gqa};
}

// CPU "kernels": only reached when every tensor argument is on the CPU.
std::tuple<Tensor, Tensor> fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double>, bool,
                                   int64_t, int64_t, double, bool, int64_t, int64_t) {
  check_forward_inputs(q, k, v);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");
  return {};
}

std::tuple<Tensor, Tensor, Tensor> bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                           std::optional<double>, bool, int64_t, int64_t, double, bool) {
  check_forward_inputs(q, k, v);
  check_cuda(dout, "dout");
  runtime_error("flash3: unreachable");
  return {};
}

std::tuple<Tensor, Tensor> varlen_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                          const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                                          const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                          int64_t max_seqlen_k, std::optional<double>, bool, int64_t, int64_t, double,
                                          bool, int64_t, int64_t) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  runtime_error("flash3: unreachable");
  return {};
}

void combine_cpu(const Tensor& out_partial, const Tensor& lse_partial, const Tensor& out, const Tensor& softmax_lse) {
  check_combine_inputs(out_partial, lse_partial, out, softmax_lse);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");
}

std::tuple<Tensor, Tensor> fwd_kvcache_cpu(FLASH3_KVCACHE_PARAMS) {
  check_kvcache_inputs(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                       cache_leftpad, page_table, rotary_seqlens, cu_seqlens_q, cu_seqlens_k_new,
                       max_seqlen_q);  // raises for the first CPU tensor
  runtime_error("flash3: unreachable");
  return {};
}

Tensor fwd_kvcache_out_cpu(FLASH3_KVCACHE_PARAMS, const Tensor&) {
  return std::get<1>(fwd_kvcache_cpu(FLASH3_KVCACHE_ARGS));
}

std::tuple<Tensor, Tensor, Tensor> varlen_bwd_cpu(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&, const Tensor&,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
    const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double>, bool,
    int64_t, int64_t, double, bool, const std::optional<Tensor>&) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  check_cuda(dout, "dout");
  runtime_error("flash3: unreachable");
  return {};
}

// ---------------------------------------------------------------------------
// Autograd.
// ---------------------------------------------------------------------------
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
    ctx->saved_data["has_scale"] = softmax_scale.has_value();
    ctx->saved_data["scale"] = softmax_scale.value_or(0.0);
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["wl"] = window_left;
    ctx->saved_data["wr"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["deterministic"] = deterministic;
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
    std::optional<double> scale;
    if (ctx->saved_data["has_scale"].toBool()) scale = ctx->saved_data["scale"].toDouble();
    std::optional<Tensor> dlse_opt;
    if (dlse.defined()) dlse_opt = dlse;
    auto [dq, dk, dv] = call_bwd(dout, q, k, v, out, lse, dlse_opt, scale, ctx->saved_data["causal"].toBool(),
                                 ctx->saved_data["wl"].toInt(), ctx->saved_data["wr"].toInt(),
                                 ctx->saved_data["softcap"].toDouble(), ctx->saved_data["deterministic"].toBool());
    // No pack_gqa / num_splits for the backward: forward-only options.
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

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

// varlen_fwd: the same scheme; the backward calls flash3::varlen_bwd with the saved cu_seqlens /
// seqused tensors (so a CUDA graph replays with the lengths they hold at replay time).
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
    ctx->saved_data["has_scale"] = softmax_scale.has_value();
    ctx->saved_data["scale"] = softmax_scale.value_or(0.0);
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["wl"] = window_left;
    ctx->saved_data["wr"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->set_materialize_grads(false);  // as FlashAttnFunction: unused outputs cost nothing
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
    std::optional<double> scale;
    if (ctx->saved_data["has_scale"].toBool()) scale = ctx->saved_data["scale"].toDouble();
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

// fwd_kvcache: forward only (FlashAttention-3's flash_attn_with_kvcache has no backward either).
// This Autograd kernel runs the op below autograd, so its outputs never require grad (gradients do
// not flow to q, the caches or k / v), and spares each call the dispatcher's boxed autograd
// fallback. The caches are written in place when k / v are given: their version counters are
// bumped, as an in-place torch op would (so autograd notices if they were saved for some other
// backward); inference tensors have no version counter and are left alone.
// The caches (appending) and out= are written in place: their version counters are bumped, as an
// in-place torch op would; inference tensors have none and are left alone.
void bump_written(const std::optional<Tensor>& k, const Tensor& k_cache, const Tensor& v_cache, const Tensor* out) {
  std::vector<const Tensor*> written;
  if (has(k)) written = {&k_cache, &v_cache};
  if (out != nullptr) written.push_back(out);
  for (const Tensor* c : written)
    if (!c->is_inference()) torch::autograd::impl::bump_version(*c);
}

std::tuple<Tensor, Tensor> fwd_kvcache_autograd(FLASH3_KVCACHE_PARAMS) {
  using Opt = const std::optional<Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::fwd_kvcache", "")
                       .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, Opt, Opt, Opt,
                                                         Opt, Opt, Opt, Opt, Opt, Opt, std::optional<double>, bool,
                                                         int64_t, int64_t, double, bool, int64_t, int64_t, Opt, Opt,
                                                         std::optional<int64_t>)>();
  std::tuple<Tensor, Tensor> r;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    r = op.call(FLASH3_KVCACHE_ARGS);
  }
  bump_written(k, k_cache, v_cache, nullptr);
  return r;
}

Tensor fwd_kvcache_out_autograd(FLASH3_KVCACHE_PARAMS, const Tensor& out) {
  using Opt = const std::optional<Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("flash3::fwd_kvcache_out", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, Opt, Opt, Opt, Opt, Opt, Opt, Opt,
                                     Opt, Opt, std::optional<double>, bool, int64_t, int64_t, double, bool, int64_t,
                                     int64_t, Opt, Opt, std::optional<int64_t>, const Tensor&)>();
  Tensor lse;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    lse = op.call(FLASH3_KVCACHE_ARGS, out);
  }
  bump_written(k, k_cache, v_cache, &out);
  return lse;
}

// ---------------------------------------------------------------------------
// Helpers for Python (introspection and the overhead benchmark).
// ---------------------------------------------------------------------------
int dtype_code(at::ScalarType t) {
  if (!(t == at::kHalf || t == at::kBFloat16 || t == at::kFloat8_e4m3fn)) type_error("flash3: dtype must be torch.float16, torch.bfloat16 or torch.float8_e4m3fn, got ", dtype_str(t));
  return t == at::kHalf ? 0 : (t == at::kBFloat16 ? 1 : 2);
}

bool py_forward_is_built(at::ScalarType t, int64_t d, int64_t dv) {
  dtype_code(t);
  return kernel_built(to_f3(t), d, dv, true);
}

bool py_backward_is_built(at::ScalarType t, int64_t d, int64_t dv) {
  dtype_code(t);
  return kernel_built(to_f3(t), d, dv, false);
}

std::tuple<bool, std::string> py_device_is_supported() {
  std::string why;
  const bool ok = flash3::device_is_supported(&why);
  return {ok, why};
}

// The overhead benchmark's "direct C++ call": `iters` calls of flash3::forward on the
// current stream with preallocated out/lse, each building its ForwardArgs from scratch as a
// C++ caller would. Returns the host wall time per call in microseconds (no synchronisation
// inside: call torch.cuda.synchronize() afterwards).
double bench_direct_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, bool causal,
                            int64_t iters) {
  check_forward_inputs(q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.get_device()).stream();
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

}  // namespace

TORCH_LIBRARY(flash3, m) {
  // Fake implementations: flash3.flash_attn_interface (torch.library.register_fake).
  m.set_python_module("flash3.flash_attn_interface");
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, float softcap=0.0, bool deterministic=False, int pack_gqa=-1, int num_splits=1) "
      "-> (Tensor out, Tensor softmax_lse)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor? dlse=None, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, "
      "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, bool deterministic=False, int pack_gqa=-1, "
      "int num_splits=1) "
      "-> (Tensor out, Tensor softmax_lse)");
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "bool deterministic=False, Tensor? dlse=None) -> (Tensor dq, Tensor dk, Tensor dv)");
  // FP8 (float8_e4m3fn q / k / v), forward only: out bf16.
  m.def(
      "fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor? q_descale=None, Tensor? k_descale=None, "
      "Tensor? v_descale=None, float? softmax_scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1) -> (Tensor out, Tensor softmax_lse)");
  m.def("quantize_fp8(Tensor x, int heads_per_scale=1, bool block_scales=False, bool hadamard=False, "
        "int hadamard_seed=0, Tensor? rotary_cos=None, Tensor? rotary_sin=None, bool rotary_interleaved=True) "
        "-> (Tensor out, Tensor descale)");
  // Writes out and softmax_lse in place (flash3.flash_attn_combine allocates them).
  m.def("combine(Tensor out_partial, Tensor lse_partial, Tensor(a!) out, Tensor(b!) softmax_lse) -> ()");
  // Writes the new rows k / v (when given) into k_cache / v_cache in place.
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, "
      "Tensor? rotary_cos=None, Tensor? rotary_sin=None, Tensor? cache_seqlens=None, Tensor? cache_batch_idx=None, "
      "Tensor? cache_leftpad=None, Tensor? page_table=None, Tensor? rotary_seqlens=None, float? softmax_scale=None, "
      "bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, bool rotary_interleaved=True, "
      "int num_splits=0, int pack_gqa=-1, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k_new=None, "
      "int? max_seqlen_q=None) -> (Tensor out, Tensor softmax_lse)");
  // fwd_kvcache writing the caller's out (flash_attn_with_kvcache's out=) in place.
  m.def(
      "fwd_kvcache_out(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, "
      "Tensor? rotary_cos=None, Tensor? rotary_sin=None, Tensor? cache_seqlens=None, Tensor? cache_batch_idx=None, "
      "Tensor? cache_leftpad=None, Tensor? page_table=None, Tensor? rotary_seqlens=None, float? softmax_scale=None, "
      "bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, bool rotary_interleaved=True, "
      "int num_splits=0, int pack_gqa=-1, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k_new=None, "
      "int? max_seqlen_q=None, *, Tensor(c!) out) -> Tensor softmax_lse");
  // No tensor arguments: one kernel for every dispatch key (CompositeImplicitAutograd).
  m.def(
      "forward_plan(ScalarType dtype, int batch, int max_seqlen_q, int max_seqlen_k, int heads_q, int heads_kv, "
      "int head_dim, int head_dim_v, bool causal=False, int window_left=-1, int window_right=-1, "
      "float softcap=0.0, int num_splits=0, int pack_gqa=-1) -> int[]",
      &forward_plan_op);
}

TORCH_LIBRARY_IMPL(flash3, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("fwd_fp8", &fwd_fp8_cuda);
  m.impl("quantize_fp8", &quantize_fp8_cuda);
  m.impl("bwd", &bwd_cuda);
  m.impl("varlen_fwd", &varlen_fwd_cuda);
  m.impl("varlen_bwd", &varlen_bwd_cuda);
  m.impl("combine", &combine_cuda);
  m.impl("fwd_kvcache", &fwd_kvcache_cuda);
  m.impl("fwd_kvcache_out", &fwd_kvcache_out_cuda);
}

TORCH_LIBRARY_IMPL(flash3, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("fwd_fp8", &fwd_fp8_cpu);
  m.impl("bwd", &bwd_cpu);
  m.impl("varlen_fwd", &varlen_fwd_cpu);
  m.impl("varlen_bwd", &varlen_bwd_cpu);
  m.impl("combine", &combine_cpu);
  m.impl("fwd_kvcache", &fwd_kvcache_cpu);
  m.impl("fwd_kvcache_out", &fwd_kvcache_out_cpu);
}

TORCH_LIBRARY_IMPL(flash3, Autograd, m) {
  m.impl("fwd", &fwd_autograd);
  m.impl("varlen_fwd", &varlen_fwd_autograd);
  m.impl("fwd_kvcache", &fwd_kvcache_autograd);
  m.impl("fwd_kvcache_out", &fwd_kvcache_out_autograd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.doc() =
      "flash3 PyTorch binding (registers torch.ops.flash3.fwd / bwd / varlen_fwd / varlen_bwd / combine / "
      "fwd_kvcache / forward_plan)";
  mod.def("version", [] { return std::string(flash3::version()); });
  mod.def("serving_wip", [] { return flash3::serving_wip_built(); },
          "whether libflash3 was built with FLASH3_SERVING_WIP (the serving work not yet run on a GPU)");
  mod.def("forward_is_built", &py_forward_is_built, "whether a forward kernel for (dtype, head_dim, head_dim_v) is built");
  mod.def("backward_is_built", &py_backward_is_built, "whether a backward kernel for (dtype, head_dim, head_dim_v) is built");
  mod.def("device_is_supported", &py_device_is_supported, "(ok, reason): whether the current CUDA device is a Hopper GPU");
  mod.def("bench_direct_forward", &bench_direct_forward,
          "benchmark helper: host microseconds per direct flash3::forward call (no Python in the loop)");
}
