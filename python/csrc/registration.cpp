// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The registrations of flash3._C: the operators' schemas (TORCH_LIBRARY), their CUDA, CPU and
// Autograd kernels (TORCH_LIBRARY_IMPL; defined in attention.cpp, varlen.cpp, combine.cpp and
// kvcache.cpp) and the Python module's helpers (PYBIND11_MODULE). common.h describes the ops.
#include <torch/csrc/utils/pybind.h>  // pybind11 with torch's type casters (torch.dtype <-> ScalarType)
#include <torch/library.h>

#include "common.h"

namespace flash3_torch {
namespace {

// ---------------------------------------------------------------------------
// Helpers for Python (introspection; the overhead benchmark is attention.cpp's
// bench_direct_forward).
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

}  // namespace
}  // namespace flash3_torch

using namespace flash3_torch;

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
