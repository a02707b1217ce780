// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// fp32 GPU reference for the attention forward and backward (tests only).
//
// Reads the same 16-bit strided (batch, seqlen, heads, head_dim) tensors flash3
// reads and follows the semantics of src/reference/reference.h:
//   * scale: softmax_scale NaN means 1/sqrt(head_dim); any other value is used
//     as given (0 included),
//   * optional softcap: s -> softcap * tanh(s / softcap) after scaling,
//   * causal / sliding window aligned bottom-right: query i sees key j iff
//       j >= i + sk - sq - window_left   (window_left >= 0)
//       j <= i + sk - sq + window_right  (window_right >= 0)
//     evaluated per element in int64 (any window value, up to 2^31 - 1, is exact);
//     a negative side is unbounded; causal == (window_left unchanged, window_right = 0),
//   * GQA / MQA: query head h reads kv head h / (heads_q / heads_kv),
//   * fully masked rows: out = 0, lse = -inf.
// Outputs are fp32 and dense: out (b, sq, hq, dv), lse (b, hq, sq).
//
// Two modes:
//   kFloat32       : everything in fp32 (the reference flash3 is compared with),
//   kLowPrecision  : emulates a plain bf16/fp16 implementation: S = round(QK^T*scale),
//                    softmax in fp32, P rounded to the input dtype, O = round(P V)
//                    (fp32 accumulation). Its error against kFloat32 is the
//                    baseline of the tolerance rule.
//
// This header is plain C++ (no device code) so it can be included from .cpp files.
#pragma once
#include <cstdint>
#include <limits>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3::gpuref {

enum class Mode : int { kFloat32 = 0, kLowPrecision = 1 };

// softmax_scale meaning 1/sqrt(head_dim).
inline constexpr float kDefaultScale = std::numeric_limits<float>::quiet_NaN();

// A 16-bit (b, s, h, d) device tensor; unit stride in head_dim. Strides in elements.
struct Strided16 {
  const void* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

struct Args {
  DType dtype = DType::kBFloat16;  // kFloat16 or kBFloat16 (inputs and emulated dtype)
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0;
  int head_dim = 0, head_dim_v = 0;  // each in [1, 256]
  Strided16 q, k, v;
  float softmax_scale = kDefaultScale;  // NaN: 1/sqrt(head_dim); else as given
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float* out = nullptr;  // (b, sq, hq, dv) dense fp32, written
  float* lse = nullptr;  // (b, hq, sq) dense fp32, written; may be null
};

// Enqueues the reference on `stream`. Returns cudaErrorInvalidValue for bad
// arguments and the launch error otherwise (does not synchronise).
cudaError_t forward(const Args& args, Mode mode, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Backward.
//
// Gradients of O = softmax(scale * Q K^T [softcapped] + mask) V with respect to
// q, k and v, plus the path through LSE when dlse is given:
//   dS_ij = P_ij (dP_ij - (D_i - dLSE_i)),  D_i = rowsum(dO_i * O_i),
// same masking / GQA / scale semantics as forward() (and src/reference). Fully
// masked rows (LSE = -inf) contribute nothing; keys no query sees get dk = dv = 0.
// Everything is recomputed from q, k, v (the flash3 forward's out / lse are not
// read), so the reference does not depend on what it checks.
//
// Algorithm (one (batch, kv head) at a time, a chunk of its query heads per launch),
// with fp32 S/P/dS materialised in scratch, as a plain implementation does:
//   S  = Q K^T * scale (masked -inf)        P  = softmax(S)        O = P V
//   D  = rowsum(dO * O) - dlse              dP = dO V^T            dS = P * (dP - D)
//   dQ = dS K * scale    dK = sum_h dS^T Q * scale    dV = sum_h P^T dO
// Modes:
//   kFloat32      : all fp32 (fp32 accumulation everywhere).
//   kLowPrecision : a plain bf16/fp16 implementation: S, P, O, dP, dS, dQ rounded to
//                   the input dtype after each fp32-accumulated product; D in fp32;
//                   dK / dV summed over the query heads of a kv head in fp32 and then
//                   rounded once.
// Outputs are dense fp32: dq (b, sq, hq, d), dk (b, sk, hkv, d), dv (b, sk, hkv, dv);
// optionally the recomputed out (b, sq, hq, dv) and lse (b, hq, sq).
// ---------------------------------------------------------------------------
struct BwdArgs {
  DType dtype = DType::kBFloat16;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0;
  int head_dim = 0, head_dim_v = 0;  // each in [1, 256]
  Strided16 q, k, v;
  Strided16 dout;                // (b, sq, hq, dv)
  const float* dlse = nullptr;   // (b, hq, sq) dense fp32; optional
  float softmax_scale = kDefaultScale;  // NaN: 1/sqrt(head_dim); else as given
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float* dq = nullptr;   // (b, sq, hq, d)  dense fp32, written
  float* dk = nullptr;   // (b, sk, hkv, d) dense fp32, written
  float* dv = nullptr;   // (b, sk, hkv, dv) dense fp32, written
  float* out = nullptr;  // (b, sq, hq, dv) dense fp32, written; optional
  float* lse = nullptr;  // (b, hq, sq) dense fp32, written; optional
  // Device scratch of at least backward_scratch_bytes(args) bytes (a smaller one,
  // but at least that of one query head, processes fewer heads per launch). If
  // null, backward() allocates and frees it stream-ordered (cudaMallocAsync).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

// Scratch the reference uses for `args` (<= ~1 GiB unless one query head alone
// needs more: 8 * seqlen_q * seqlen_k bytes + small terms per head).
size_t backward_scratch_bytes(const BwdArgs& args);

// Enqueues the reference backward on `stream`. Returns cudaErrorInvalidValue for
// bad arguments (or a too small scratch) and the launch error otherwise (does not
// synchronise).
cudaError_t backward(const BwdArgs& args, Mode mode, cudaStream_t stream);

}  // namespace flash3::gpuref
