// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU reference for the FP8 (e4m3) forward (seed ch. 6): e4m3 rounding, the
// quantization of Q / K / V with descales (per tensor, per (batch, head group)
// or per block of rows), the randomized Hadamard rotation x -> x (1/sqrt d) H D
// (incoherent processing, seed 6.4), and the "plain implementation" in FP8
// precision that the FP8 tolerance rule compares with.
//
// Tensors are dense fixed-length (batch, seqlen, heads, d) doubles, as in
// reference.h. A quantized tensor holds e4m3 values (as doubles) and descales;
// its value is x8 * descale. The FP8 tolerance rule: the kernel's error against
// forward() on the dequantized inputs is at most 2x forward_fp8_plain()'s error
// against the same reference, plus eps.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/reference.h"

namespace flash3::ref {

inline constexpr double kE4M3Max = 448.0;
inline constexpr int kFp8PScaleLog2 = 8;  // P * 2^8 <= 256 < 448

// The nearest e4m3fn value (bias 7, 3 mantissa bits, subnormals in steps of
// 2^-9, no infinities), ties to even. |x| beyond the largest finite value
// saturates to +-448, as the quantizer's satfinite conversion does (callers
// scale so that it never happens); NaN stays NaN.
double round_e4m3(double x);
// The e4m3fn byte of round_e4m3(x) (NaN: 0x7f), and its value (0x7f / 0xff: NaN).
uint8_t e4m3_bits(double x);
double e4m3_value(uint8_t bits);

// Fast Walsh-Hadamard rotation of n_rows rows of d (a power of two) values:
// y = x (1/sqrt d) H D with H the Sylvester Hadamard matrix and D = diag(signs).
// Orthogonal, so rotating q and k with the same signs leaves q k^T unchanged.
// x and y may be the same array.
void hadamard_rows(const double* x, double* y, int64_t n_rows, int d, const std::vector<int8_t>& signs);
// The seeded +-1 diagonal D (a splitmix64 stream: the same seed gives the same signs).
std::vector<int8_t> hadamard_signs(int d, uint64_t seed);

// Descale granularity. kPerTensor: one; kPerHead: one per (batch, group of
// heads_per_scale heads) (FlashAttention-3's (batch, heads_kv) for q with
// heads_per_scale = hq / hkv); kPerBlock: one per (batch, head group, block of
// block_rows rows), the tiles the kernel reads (seed 6.3).
enum class Fp8Scaling { kPerTensor, kPerHead, kPerBlock };

struct Fp8Tensor {
  int batch = 0, seqlen = 0, heads = 0, d = 0;
  Fp8Scaling scaling = Fp8Scaling::kPerTensor;
  int heads_per_scale = 1, block_rows = 0;
  std::vector<double> x8;       // e4m3 values, (batch, seqlen, heads, d)
  std::vector<double> descale;  // (batch, heads / heads_per_scale, blocks) for kPerBlock, without blocks for kPerHead
  int64_t scale_index(int b, int row, int h) const;
  double value(int b, int row, int h, int c) const;  // x8 * descale
  std::vector<double> dequantized() const;
};

// descale = amax / 448 over the scale's elements (1 where amax is 0), x8 =
// round_e4m3(x / descale) (x / descale computed in double, so the largest
// element maps to exactly +-448).
Fp8Tensor quantize_e4m3(const double* x, int batch, int seqlen, int heads, int d, Fp8Scaling scaling,
                        int heads_per_scale = 1, int block_rows = 0);

// Plain FP8 forward (what a straightforward FP8 implementation computes): S =
// sum(q8 * k8) accumulated in fp32, times descale_q * descale_k and the
// softmax scale; the mask and softcap as in forward(); fp32 softmax with the
// row max; P (in [0, 1]) rounded to e4m3 after scaling by 2^kFp8PScaleLog2
// (the max offset FlashAttention-3's FP8 softmax uses: small probabilities
// stay normal numbers instead of flushing to e4m3's coarse subnormals); O =
// sum over keys of P8 * v8 * descale_v, accumulated in fp32, divided by the
// fp32 row sum of the unrounded P (and the scale). Fixed length only; out /
// lse as in forward().
void forward_fp8_plain(const Problem& p, const Options& o, const Fp8Tensor& q, const Fp8Tensor& k,
                       const Fp8Tensor& v, double* out, double* lse);

}  // namespace flash3::ref
