// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// FP8 quantization for the FP8 forward (seed 6.3-6.4): x -> e4m3 with one
// descale (amax / 448) per (batch, group of heads) or per 128-token block of
// each head, optionally after the
// randomized Hadamard rotation x -> x (1/sqrt d) H D. Host-safe (no CuTe).
#pragma once
#include <cstdint>

#include "flash3/flash3.h"

namespace flash3 {

struct QuantizeFp8Params {
  const void* x = nullptr;  // (batch, seqlen, heads, d), x_dtype
  DType x_dtype = DType::kBFloat16;
  uint8_t* out = nullptr;   // (batch, seqlen, heads, d) e4m3
  // (batch, heads / heads_per_scale), or with block_scales (batch, heads,
  // ceil(seqlen / kFp8ScaleBlock)); contiguous.
  float* descale = nullptr;
  bool block_scales = false;
  int batch = 0, seqlen = 0, heads = 0, d = 0, heads_per_scale = 1;
  int64_t x_batch_stride = 0, x_row_stride = 0, x_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // Rotary (before the Hadamard rotation): token s by row s of the tables
  // (rotary_dim / 2 values each, x_dtype); rotary_dim 0: none.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t cos_row_stride = 0, sin_row_stride = 0;
  int rotary_dim = 0;
  bool rotary_interleaved = true;
  // Rotation: the sign of column j is -1 where bit j of sign_bits is set.
  bool hadamard = false;
  uint32_t sign_bits[8] = {0, 0, 0, 0, 0, 0, 0, 0};
};

// The rotation's signs for a seed: splitmix64 drawn once per column, the sign
// bit of each draw (-1 where it is set).
void hadamard_sign_bits(int d, uint64_t seed, uint32_t (&bits)[8]);

// On `stream`. Block scales: one kernel, each block's amax, descale and
// values. Otherwise: the descale tensor zeroed, each group's amax atomically
// maxed into it (as the bits of a non-negative float), the quantization
// (reading the amax), then descale = amax / 448 in place (1 for an all-zero
// group).
Status launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t stream);

// The same, by the register-lean kernels of quantize_fp8_raw.cu: the block
// held as raw 16-bit values (64 registers, four CTAs per SM at d = 128), the
// amax in x's type, the quotient by a reciprocal and one FMA correction
// without flushing subnormals (quant/fp8_divide.h). The API takes it where the
// environment sets FLASH3_QUANTIZE_RAW=1: it has not run on a GPU yet, and
// replaces launch_quantize_fp8 once its tests pass and it measures faster.
Status launch_quantize_fp8_raw(const QuantizeFp8Params& p, cudaStream_t stream);

}  // namespace flash3
