// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// float64 CPU reference for attention forward and backward, and the
// low-precision "plain implementation" emulation the tolerance rule compares with.
//
// Layouts are dense and contiguous:
//   fixed length: q (b, sq, hq, d), k (b, sk, hkv, d), v (b, sk, hkv, dv),
//                 out (b, sq, hq, dv), lse (b, hq, sq)
//   varlen (cu_seqlens set): q (total_q, hq, d), k/v (total_k, hkv, d/dv),
//                 out (total_q, hq, dv), lse (hq, total_q)
// Masking follows flash3::AttentionOptions: causal / window aligned bottom-right
// (query i of a sequence sees key j iff
//   j >= i + sk - sq - window_left (when window_left >= 0) and
//   j <= i + sk - sq + window_right (when window_right >= 0)); causal sets
// window_right = 0 and keeps window_left. Evaluated in int64 exactly as written:
// a window larger than the sequence is unbounded because it cuts nothing, not
// by a rule.
// Fully masked rows: out = 0, lse = -inf, and they contribute no gradient.
// GQA/MQA: query head h uses kv head h / (hq / hkv).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace flash3::ref {

struct Problem {
  int batch = 1;
  int seqlen_q = 0, seqlen_k = 0;  // fixed-length; ignored when cu_seqlens_* are set
  int heads_q = 1, heads_kv = 1;
  int head_dim = 0, head_dim_v = 0;
  // Optional varlen: batch+1 prefix sums each (both or neither).
  std::vector<int> cu_seqlens_q, cu_seqlens_k;

  bool varlen() const { return !cu_seqlens_q.empty(); }
  int seqlen_q_of(int b) const;
  int seqlen_k_of(int b) const;
  int64_t q_offset(int b) const;  // first token row of sequence b
  int64_t k_offset(int b) const;
  int64_t total_q() const;
  int64_t total_k() const;
  size_t q_elems() const { return size_t(total_q()) * heads_q * head_dim; }
  size_t k_elems() const { return size_t(total_k()) * heads_kv * head_dim; }
  size_t v_elems() const { return size_t(total_k()) * heads_kv * head_dim_v; }
  size_t o_elems() const { return size_t(total_q()) * heads_q * head_dim_v; }
  size_t lse_elems() const { return size_t(total_q()) * heads_q; }
};

struct Options {
  // NaN: 1/sqrt(head_dim); any other value is used as given.
  double softmax_scale = std::numeric_limits<double>::quiet_NaN();
  bool causal = false;
  int window_left = -1, window_right = -1;
  double softcap = 0.0;  // 0: off; else s -> softcap * tanh(s / softcap) (after scaling)
};

// Index of lse[b, h, i] (fixed) or lse[h, row] (varlen) in the dense lse array.
int64_t lse_index(const Problem& p, int b, int h, int i);

// True when key j is visible to query i of a sequence of lengths (sq, sk).
bool visible(const Options& o, int i, int j, int sq, int sk);

void forward(const Problem& p, const Options& o, const double* q, const double* k, const double* v,
             double* out, double* lse);

// dlse may be null. dq/dk/dv are overwritten.
void backward(const Problem& p, const Options& o, const double* q, const double* k, const double* v,
              const double* dout, const double* dlse, double* dq, double* dk, double* dv);

// Rounding of a double to the nearest bf16 / fp16 value (round-to-nearest-even).
double round_bf16(double x);
double round_fp16(double x);
enum class LowPrecision { kBFloat16, kFloat16 };
double round_to(LowPrecision t, double x);

// "Plain implementation" forward: what a straightforward bf16/fp16 PyTorch
// implementation computes: S = round(Q K^T * scale) (fp32 accumulate), softmax in fp32,
// P rounded, O = round(P V). out/lse as in forward(). Used for the tolerance baseline.
void forward_lowp(LowPrecision t, const Problem& p, const Options& o, const double* q, const double* k,
                  const double* v, double* out, double* lse);

// FlashAttention tolerance rule: max|ours - ref| <= 2 * max|lowp - ref| + eps,
// and no NaN in ours. Fills a short description on failure.
struct CloseResult {
  bool ok = false;
  double err = 0, base_err = 0, bound = 0;
  int64_t nan_count = 0;
};
// factor: 2 (the FlashAttention rule); softcap problems use kSoftcapTolFactor.
CloseResult check_close(const double* ours, const double* ref, const double* lowp, size_t n, double eps,
                        double factor = 2.0);
// FlashAttention-3's own rule for softcap (its tests' rtol 3 instead of 2): the
// kernels evaluate tanh with the hardware approximation (relative error ~2^-11),
// an error the plain implementation, whose capped scores round to exactly +-1
// when tanh saturates, does not make.
inline constexpr double kSoftcapTolFactor = 3.0;

}  // namespace flash3::ref
