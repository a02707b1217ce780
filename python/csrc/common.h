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
// The C++ library itself (libflash3.so) knows nothing about torch; this extension is the only
// place the two meet. Its translation units, one per entry point:
//   common.h / common.cpp  this header: error helpers, Status -> Python exception, TensorView and
//                          option conversion, the argument checks several ops share, the caching
//                          workspace and the launch steps the forward and backward ops share
//   attention.cpp          fwd / bwd (fixed length), fwd_fp8, quantize_fp8 and fwd's autograd
//   varlen.cpp             varlen_fwd / varlen_bwd and varlen_fwd's autograd
//   combine.cpp            combine (split-KV)
//   kvcache.cpp            fwd_kvcache / fwd_kvcache_out and forward_plan
//   registration.cpp       the schemas (TORCH_LIBRARY), the CUDA / CPU / Autograd kernels and the
//                          Python module's helpers (PYBIND11_MODULE)
// Internal to the extension: nothing here is installed or part of flash3's API.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "flash3/flash3.h"

namespace flash3_torch {

using at::Tensor;

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

// ---------------------------------------------------------------------------
// Conversions to the library's types (common.cpp).
// ---------------------------------------------------------------------------
std::string shape_str(const Tensor& t);
std::string dtype_str(at::ScalarType t);
flash3::DType to_f3(at::ScalarType t);
flash3::TensorView view(const Tensor& t);
// The current CUDA stream of t's device, where every op queues its work.
cudaStream_t current_stream(const Tensor& t);
// A Status that is not ok becomes the matching Python exception.
void throw_if_error(const flash3::Status& s, const char* where);
// The options every attention op takes; window sides as the library's int (window_side).
flash3::AttentionOptions make_opts(std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                   int64_t window_right, double softcap, bool deterministic);
// The forward-only launch options (checked by check_pack_gqa / check_num_splits).
void set_launch_opts(flash3::AttentionOptions* o, int64_t pack_gqa, int64_t num_splits);

inline bool has(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

// ---------------------------------------------------------------------------
// Argument checks (common.cpp). Every failure raises before anything is launched; the messages
// name the argument, what was seen and what was expected.
// ---------------------------------------------------------------------------
void check_cuda(const Tensor& t, const char* name);
void check_same_device(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name);

struct NamedTensor {
  const Tensor& t;
  const char* name;
};

// Each of ts a CUDA tensor, then each on ref's device (ref itself is checked by the caller).
void check_cuda_on_device_of(std::initializer_list<NamedTensor> ts, const Tensor& ref, const char* ref_name);
void check_dtype_q(const Tensor& q);
void check_same_dtype(const Tensor& t, const char* name, const Tensor& q);
void check_3d(const Tensor& t, const char* name, const char* layout);
void check_4d(const Tensor& t, const char* name, const char* layout);
void check_last_dim_contiguous(const Tensor& t, const char* name, const char* dim_name);

// "(64, 64), (96, 96), ..." for the built forward (or backward) kernels of a dtype.
std::string built_head_dims(flash3::DType dt, bool forward);
// Caches forward_is_built per (dtype, d, dv): the answers never change within a process.
bool kernel_built(flash3::DType dt, int64_t d, int64_t dv, bool forward);
// No forward kernel for (q's dtype, head_dim, head_dim_v): NotImplementedError naming the dtype
// when the build has none of that dtype (CMake FLASH3_DTYPES), else ValueError naming the head dims.
void check_head_dim(const Tensor& q, const Tensor& v, const char* v_name = "v");
// q, k, v of fwd / bwd / fwd_fp8 (4-d) or varlen_fwd / varlen_bwd (3-d): devices and dtypes
// (fp8: torch.float8_e4m3fn, else fp16 / bf16), ranks, a contiguous head_dim.
void check_qkv_tensors(const Tensor& q, const Tensor& k, const Tensor& v, bool varlen, bool fp8 = false);

// Variable length (varlen_fwd, fwd_kvcache with cu_seqlens_q). Only the host-side facts are
// checked: the contents of cu_seqlens_* / seqused_* live on the device and are never read by the
// host (no sync).
inline constexpr const char* kCuSeqlensQ = "num_sequences + 1 prefix sums of the query lengths";
// An int32 index vector (cu_seqlens_*, seqused_*): CUDA, on q's device, int32, 1-d, contiguous.
void check_int32_vector(const Tensor& t, const char* name, const Tensor& q, const char* what);
void check_cu_seqlens_q_not_empty(const Tensor& cu_seqlens_q);
void check_num_sequences_fit_int32(const Tensor& cu_seqlens_q);
// 0 is FlashAttention-3's empty batch (every sequence empty): the lengths themselves come from the
// device arrays, max_seqlen only normalises the window.
void check_max_seqlen(int64_t m, const char* name, const char* what);

// The scalar arguments, checked before anything is allocated (common.cpp says why).
void check_softmax_scale(std::optional<double> softmax_scale);
void check_softcap(double softcap);
void check_pack_gqa(int64_t pack_gqa);
void check_num_splits(int64_t num_splits);
// The four above, in that order (fwd, varlen_fwd).
void check_forward_scalars(std::optional<double> softmax_scale, double softcap, int64_t pack_gqa,
                           int64_t num_splits);

// The checks of the backward ops (bwd, varlen_bwd) after the forward's, in this order: the
// tensors' devices and dtypes, out's shape (the op's layout), dout's shape, a backward kernel for
// the head dims, dlse.
void check_backward_device_dtype(const Tensor& dout, const Tensor& q, const Tensor& out, const Tensor& lse);
void check_dout_shape(const Tensor& dout, const Tensor& out);
void check_backward_kernel(const Tensor& q, const Tensor& v);
void check_dlse(const std::optional<Tensor>& dlse, const Tensor& lse, const Tensor& q);

// ---------------------------------------------------------------------------
// Scratch and the launch steps the forward and backward ops share (common.cpp).
// ---------------------------------------------------------------------------
struct Workspace {
  Tensor storage;
  void* ptr = nullptr;
  size_t bytes = 0;
};

Workspace caching_workspace(size_t bytes, const Tensor& like);

// The tensors of a forward call; a softmax_lse with no elements is "not stored" (null).
flash3::ForwardArgs forward_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse);
// flash3::forward on q's current stream with scratch from the caching allocator.
void launch_forward(flash3::ForwardArgs& args, const Tensor& q, const char* what);

// dout / out / softmax_lse / dlse as the backward kernels read them (dlse converted to fp32; an
// undefined dlse when None).
struct BackwardInputs {
  Tensor dout, out, lse, dlse;
};
BackwardInputs backward_inputs(const Tensor& dout, const Tensor& out, const Tensor& lse,
                               const std::optional<Tensor>& dlse);
std::tuple<Tensor, Tensor, Tensor> run_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const BackwardInputs& in, const flash3::AttentionOptions& opts,
                                                bool zero_grads, const char* what);

// The options fwd's and varlen_fwd's autograd functions keep for their backward in
// ctx->saved_data (torch::autograd::AutogradContext::saved_data), and the scale read back.
using SavedData = ska::flat_hash_map<std::string, at::IValue>;
void save_options(SavedData& saved, std::optional<double> softmax_scale, bool causal, int64_t window_left,
                  int64_t window_right, double softcap, bool deterministic);
std::optional<double> saved_softmax_scale(SavedData& saved);

// ---------------------------------------------------------------------------
// The ops' kernels, registered by registration.cpp.
// ---------------------------------------------------------------------------
// attention.cpp: fixed length and FP8.
std::tuple<Tensor, Tensor> fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                    int64_t window_right, double softcap, bool deterministic, int64_t pack_gqa,
                                    int64_t num_splits);
std::tuple<Tensor, Tensor> fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double>, bool,
                                   int64_t, int64_t, double, bool, int64_t, int64_t);
std::tuple<Tensor, Tensor> fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                        std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                        int64_t window_right, double softcap, bool deterministic, int64_t pack_gqa,
                                        int64_t num_splits);
std::tuple<Tensor, Tensor, Tensor> bwd_cuda(const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse_in,
                                            std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                            int64_t window_right, double softcap, bool deterministic);
std::tuple<Tensor, Tensor, Tensor> bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                           std::optional<double>, bool, int64_t, int64_t, double, bool);
std::tuple<Tensor, Tensor> fwd_fp8_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const std::optional<Tensor>& q_descale, const std::optional<Tensor>& k_descale,
                                        const std::optional<Tensor>& v_descale, std::optional<double> softmax_scale,
                                        bool causal, int64_t window_left, int64_t window_right);
std::tuple<Tensor, Tensor> fwd_fp8_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const std::optional<Tensor>&, const std::optional<Tensor>&,
                                       const std::optional<Tensor>&, std::optional<double>, bool, int64_t, int64_t);
std::tuple<Tensor, Tensor> quantize_fp8_cuda(const Tensor& x, int64_t heads_per_scale, bool block_scales,
                                             bool hadamard, int64_t hadamard_seed,
                                             const std::optional<Tensor>& rotary_cos,
                                             const std::optional<Tensor>& rotary_sin, bool rotary_interleaved);
// The Python module's bench_direct_forward (the overhead benchmark).
double bench_direct_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                            bool causal, int64_t iters);

// varlen.cpp: variable length.
std::tuple<Tensor, Tensor> varlen_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                           const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                                           const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                           int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                                           int64_t window_left, int64_t window_right, double softcap,
                                           bool deterministic, int64_t pack_gqa, int64_t num_splits);
std::tuple<Tensor, Tensor> varlen_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                          const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
                                          const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                          int64_t max_seqlen_k, std::optional<double>, bool, int64_t, int64_t, double,
                                          bool, int64_t, int64_t);
std::tuple<Tensor, Tensor> varlen_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                               const std::optional<Tensor>& seqused_q,
                                               const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                               int64_t max_seqlen_k, std::optional<double> softmax_scale, bool causal,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               bool deterministic, int64_t pack_gqa, int64_t num_splits);
std::tuple<Tensor, Tensor, Tensor> varlen_bwd_cuda(
    const Tensor& dout_in, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
    const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    bool deterministic, const std::optional<Tensor>& dlse_in);
std::tuple<Tensor, Tensor, Tensor> varlen_bwd_cpu(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&, const Tensor&,
    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_q,
    const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<double>, bool,
    int64_t, int64_t, double, bool, const std::optional<Tensor>&);

// combine.cpp: split-KV combine.
void combine_cuda(const Tensor& out_partial, const Tensor& lse_partial, const Tensor& out, const Tensor& softmax_lse);
void combine_cpu(const Tensor& out_partial, const Tensor& lse_partial, const Tensor& out, const Tensor& softmax_lse);

// kvcache.cpp: KV-cache attention and the forward's launch plan. The parameters of fwd_kvcache
// (fwd_kvcache_out adds out) and the arguments that pass them on.
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

std::tuple<Tensor, Tensor> fwd_kvcache_cuda(FLASH3_KVCACHE_PARAMS);
std::tuple<Tensor, Tensor> fwd_kvcache_cpu(FLASH3_KVCACHE_PARAMS);
std::tuple<Tensor, Tensor> fwd_kvcache_autograd(FLASH3_KVCACHE_PARAMS);
Tensor fwd_kvcache_out_cuda(FLASH3_KVCACHE_PARAMS, const Tensor& out);
Tensor fwd_kvcache_out_cpu(FLASH3_KVCACHE_PARAMS, const Tensor&);
Tensor fwd_kvcache_out_autograd(FLASH3_KVCACHE_PARAMS, const Tensor& out);
std::vector<int64_t> forward_plan_op(at::ScalarType dtype, int64_t batch, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                     int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t head_dim_v,
                                     bool causal, int64_t window_left, int64_t window_right, double softcap,
                                     int64_t num_splits, int64_t pack_gqa);

}  // namespace flash3_torch
