// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The FP8 quantizer's arithmetic on one value, host and device (the device
// kernel in quantize_fp8.cu; the host copy is what tests/unit/test_fp8_divide.cu
// checks against IEEE division). nvcc only.
//
// The library compiles with -use_fast_math, which flushes fp32 subnormals in
// every float instruction (-ftz=true); the device instructions here are
// spelled without .ftz, so bf16 inputs and descales below 2^-126 are handled
// exactly too.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace flash3 {

constexpr float kE4M3Max = 448.f;

__host__ __device__ __forceinline__ float fp8q_bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

__host__ __device__ __forceinline__ uint32_t fp8q_float_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ float fp8q_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a * b;
#endif
}

__host__ __device__ __forceinline__ float fp8q_fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
#else
  return std::fma(a, b, c);
#endif
}

__host__ __device__ __forceinline__ float fp8q_div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a / b;
#endif
}

// A non-negative float's bits, which order as the floats; NaN -> 0 (the
// amax skips NaN, as fmaxf does: NaN stays NaN in the output). Integer
// maxima also keep subnormals, which the -ftz float max would flush.
__host__ __device__ __forceinline__ uint32_t amax_bits(float m) {
  const uint32_t u = fp8q_float_to_bits(m);
  return u <= 0x7f800000u ? u : 0u;
}

// amax / 448, correctly rounded (1 for an all-zero group); amax as bits.
__host__ __device__ __forceinline__ float descale_of(uint32_t amax) {
  return amax == 0 ? 1.f : fp8q_div_rn(fp8q_bits_to_float(amax), kE4M3Max);
}

// y / descale, correctly rounded (as IEEE division) without a division per
// element. descale = m 2^-k with m in [1, 2): y / descale = (y 2^k) / m. For
// k > 0 (descale < 1) y is scaled first, so that a subnormal y becomes normal
// before dividing; otherwise the quotient is scaled after. Either scaling is
// exact wherever the quotient is a normal float; where it is not
// (|q| < 2^-126), e4m3 rounds it to zero either way. 2^k is two factors so
// that subnormal and huge descales stay in range. The division by m: q0 = y r
// with r = RN(1 / m) is within an ulp, and one correction with the exact
// residual y - q0 m (an FMA) rounds it correctly (Markstein's theorem).
// y / inf: 0 (NaN for y = inf).
struct Divider {
  float m, r;
  float pre1, pre2;    // 2^k when k > 0, else 1
  float post1, post2;  // 2^k when k <= 0, else 1
  __host__ __device__ __forceinline__ float operator()(float y) const {
    const float ys = fp8q_mul_rn(fp8q_mul_rn(y, pre1), pre2);
    const float q0 = fp8q_mul_rn(ys, r);
    const float q = fp8q_fma_rn(fp8q_fma_rn(-q0, m, ys), r, q0);
    return copysignf(fp8q_mul_rn(fp8q_mul_rn(q, post1), post2), y);  // (-0: the correction's sum is +0)
  }
};

// descale > 0 (descale_of's results).
__host__ __device__ __forceinline__ Divider divider(float descale) {
  const uint32_t u = fp8q_float_to_bits(descale);
  int e = int(u >> 23);  // biased exponent: descale = 1.mant 2^(e - 127)
  uint32_t mant = u & 0x7fffffu;
  if (e == 255) return {1.f, 1.f, 1.f, 1.f, 0.f, 1.f};
  if (e == 0) {  // subnormal: normalise the mantissa
#ifdef __CUDA_ARCH__
    const int sh = __clz(mant) - 8;
#else
    const int sh = __builtin_clz(mant) - 8;
#endif
    mant = (mant << sh) & 0x7fffffu;
    e = 1 - sh;
  }
  const float m = fp8q_bits_to_float(0x3f800000u | mant);
  const int k = 127 - e, k1 = k < -126 ? -126 : (k > 127 ? 127 : k);
  const float f1 = fp8q_bits_to_float(uint32_t(k1 + 127) << 23), f2 = fp8q_bits_to_float(uint32_t(k - k1 + 127) << 23);
#ifdef __CUDA_ARCH__
  const float r = __frcp_rn(m);
#else
  const float r = 1.f / m;
#endif
  if (k > 0) return {m, r, f1, f2, 1.f, 1.f};
  return {m, r, 1.f, 1.f, f1, f2};
}

}  // namespace flash3
