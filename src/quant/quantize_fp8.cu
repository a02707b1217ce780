// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// FP8 quantization kernels (quantize_fp8.h). Every kernel tiles x the same
// way: one CTA per (batch, 128-token block, head), h fastest, so neighbouring
// CTAs read neighbouring heads of the same tokens (adjacent memory for
// (b, s, h, d)). kLanes lanes share a row, each holding 8 consecutive
// elements (one 16-byte load, one 8-byte store); a warp covers 32 / kLanes
// rows per step. The Hadamard butterflies over the low three bits of the
// element index are in-register pairs, over the lane bits shuffles within
// the row's lanes (the transform is the same butterflies in any bit order).
//
// Block scales: the CTA holds its block in registers, so x is read once (the
// amax is needed before any element can be scaled). Per-(batch, head group)
// scales: two passes, the first maxing each block's amax into the group's
// descale slot (atomicMax, one per CTA), the second scaling.
#include "quant/quantize_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/cuda_check.h"

namespace flash3 {
namespace {

constexpr float kE4M3Max = 448.f;
constexpr int kPer = 8;  // elements per lane

template <class T>
__device__ float to_float(T v);
template <>
__device__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ float to_float<__half>(__half v) { return __half2float(v); }

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// 8 warps, or 16 for 32-lane rows (d > 128): 64 values per lane either way.
template <int kLanes>
struct Tiling {
  static constexpr int kWarps = kLanes == 32 ? 16 : 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerStep = 32 / kLanes;
  static constexpr int kSteps = kFp8ScaleBlock / (kWarps * kRowsPerStep);
};

// This lane's 8 elements of row (b, s, h) (rotated when p.hadamard); lanes
// past d hold 0. Validation guarantees 16-byte aligned rows.
template <class T, int kLanes>
__device__ void load_row(const QuantizeFp8Params& p, int64_t b, int64_t s, int64_t h, int part, float (&y)[kPer]) {
  if (part * kPer < p.d) {
    const T* x = static_cast<const T*>(p.x) + b * p.x_batch_stride + s * p.x_row_stride + h * p.x_head_stride;
    const Pack<T, kPer> v = *reinterpret_cast<const Pack<T, kPer>*>(x + part * kPer);
#pragma unroll
    for (int j = 0; j < kPer; ++j) y[j] = to_float(v.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kPer; ++j) y[j] = 0.f;
  }
}

// Rotary on this lane's elements e = part * 8 + j of token s, with the
// append-KV kernel's fp32 formula (x0' = fma(x0, c, -x1 s), x1' = fma(x0, s,
// x1 c)), the result kept in fp32. Interleaved pairs (2i, 2i + 1) lie in one
// lane; half-split pairs (i, i + rotary_dim / 2) in lanes rotary_dim / 16
// apart (a power of two: validation), exchanged by a shuffle.
template <class T, int kLanes>
__device__ void rotary(const QuantizeFp8Params& p, int64_t s, int part, float (&y)[kPer]) {
  const int half = p.rotary_dim / 2, e0 = part * kPer;
  const T* cos_row = static_cast<const T*>(p.rotary_cos) + s * p.cos_row_stride;
  const T* sin_row = static_cast<const T*>(p.rotary_sin) + s * p.sin_row_stride;
  if (p.rotary_interleaved) {
    if (e0 >= p.rotary_dim) return;
    const Pack<T, kPer / 2> c = *reinterpret_cast<const Pack<T, kPer / 2>*>(cos_row + e0 / 2);
    const Pack<T, kPer / 2> sn = *reinterpret_cast<const Pack<T, kPer / 2>*>(sin_row + e0 / 2);
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) {
      const float cf = to_float(c.v[i]), sf = to_float(sn.v[i]), x0 = y[2 * i], x1 = y[2 * i + 1];
      y[2 * i] = fmaf(x0, cf, -(x1 * sf));
      y[2 * i + 1] = fmaf(x0, sf, x1 * cf);
    }
    return;
  }
  const int lane_dist = half / kPer;  // >= 1
  float other[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) other[j] = __shfl_xor_sync(0xffffffffu, y[j], lane_dist);
  if (e0 >= p.rotary_dim) return;
  const bool upper = e0 >= half;
  const int t0 = upper ? e0 - half : e0;
  const Pack<T, kPer> c = *reinterpret_cast<const Pack<T, kPer>*>(cos_row + t0);
  const Pack<T, kPer> sn = *reinterpret_cast<const Pack<T, kPer>*>(sin_row + t0);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const float cf = to_float(c.v[j]), sf = to_float(sn.v[j]);
    const float x0 = upper ? other[j] : y[j], x1 = upper ? y[j] : other[j];
    y[j] = upper ? fmaf(x0, sf, x1 * cf) : fmaf(x0, cf, -(x1 * sf));
  }
}

// x -> x (1/sqrt d) H D over the row's kLanes lanes (d == 8 * kLanes).
template <int kLanes>
__device__ void rotate(const QuantizeFp8Params& p, int part, float (&y)[kPer]) {
#pragma unroll
  for (int m = 1; m < kPer; m <<= 1) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (j & m) continue;
      const float a = y[j], c = y[j | m];
      y[j] = a + c;
      y[j | m] = a - c;
    }
  }
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) {
    const bool upper = part & off;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, y[j], off);
      y[j] = upper ? other - y[j] : y[j] + other;
    }
  }
  const float norm = rsqrtf(float(p.d));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = part * kPer + j;
    const bool neg = (p.sign_bits[e >> 5] >> (e & 31)) & 1;
    y[j] *= neg ? -norm : norm;
  }
}

// y / descale rounded to e4m3 (ties to even, saturating) into row (b, s, h) of out.
__device__ void store_row(const QuantizeFp8Params& p, int64_t b, int64_t s, int64_t h, int part,
                          const float (&y)[kPer], float descale) {
  if (part * kPer >= p.d) return;
  Pack<uint8_t, kPer> o;
#pragma unroll
  for (int j = 0; j < kPer; ++j) o.v[j] = __nv_cvt_float_to_fp8(__fdiv_rn(y[j], descale), __NV_SATFINITE, __NV_E4M3);
  uint8_t* out = p.out + b * p.o_batch_stride + s * p.o_row_stride + h * p.o_head_stride;
  *reinterpret_cast<Pack<uint8_t, kPer>*>(out + part * kPer) = o;
}

// amax / 448, correctly rounded (1 for an all-zero group).
__device__ float descale_of(float amax) { return amax > 0.f ? __fdiv_rn(amax, kE4M3Max) : 1.f; }

enum class Pass { kBlock, kAmax, kWrite };

// kBlock: the block's own descale; kAmax: atomicMax of the block's amax into
// its group's slot (as the bits of a non-negative float, which order as the
// floats); kWrite: scale by the group's descale (the slot holds the amax).
template <class T, int kLanes, Pass kPass>
__global__ void __launch_bounds__(Tiling<kLanes>::kThreads) quantize_kernel(QuantizeFp8Params p) {
  using Tl = Tiling<kLanes>;
  __shared__ float warp_amax[Tl::kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int part = lane % kLanes, sub = lane / kLanes;
  const int blocks = (p.seqlen + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int64_t linear = blockIdx.x;
  const int64_t h = linear % p.heads, blk = (linear / p.heads) % blocks, b = linear / (int64_t(p.heads) * blocks);
  // Step t of this warp: row s0 + t * kRowsPerStep * kWarps (rows interleave
  // across warps so a step's loads of all warps cover consecutive rows).
  const int64_t s0 = blk * kFp8ScaleBlock + warp * Tl::kRowsPerStep + sub;
  constexpr int kStride = Tl::kRowsPerStep * Tl::kWarps;
  float y[Tl::kSteps][kPer];
  float m = 0.f;
#pragma unroll
  for (int t = 0; t < Tl::kSteps; ++t) {
    const int64_t s = s0 + t * kStride;
    if (s < p.seqlen) load_row<T, kLanes>(p, b, s, h, part, y[t]);
    else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) y[t][j] = 0.f;
    }
  }
#pragma unroll
  for (int t = 0; t < Tl::kSteps; ++t) {
    // (All lanes, rows past seqlen too: the shuffles need every lane.)
    const int64_t s = s0 + t * kStride;
    if (p.rotary_dim > 0) rotary<T, kLanes>(p, s < p.seqlen ? s : 0, part, y[t]);
    if (p.hadamard) rotate<kLanes>(p, part, y[t]);
#pragma unroll
    for (int j = 0; j < kPer; ++j) m = fmaxf(m, fabsf(y[t][j]));  // (fmaxf skips NaN: NaN stays NaN)
  }
  float descale;
  if constexpr (kPass == Pass::kWrite) {
    const int64_t g = b * (p.heads / p.heads_per_scale) + h / p.heads_per_scale;
    descale = descale_of(p.descale[g]);
  } else {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
    m = 0.f;
#pragma unroll
    for (int w = 0; w < Tl::kWarps; ++w) m = fmaxf(m, warp_amax[w]);
    if constexpr (kPass == Pass::kAmax) {
      const int64_t g = b * (p.heads / p.heads_per_scale) + h / p.heads_per_scale;
      if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<uint32_t*>(p.descale) + g, __float_as_uint(m));
      return;
    }
    descale = descale_of(m);
    if (threadIdx.x == 0) p.descale[(b * p.heads + h) * blocks + blk] = descale;
  }
#pragma unroll
  for (int t = 0; t < Tl::kSteps; ++t) {
    const int64_t s = s0 + t * kStride;
    if (s < p.seqlen) store_row(p, b, s, h, part, y[t], descale);
  }
}

__global__ void quantize_descale_kernel(float* descale, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) descale[i] = descale_of(descale[i]);  // (the slot holds the amax)
}

template <class T, int kLanes, Pass kPass>
Status launch_pass(const QuantizeFp8Params& p, int64_t ctas, cudaStream_t stream, const char* what) {
  quantize_kernel<T, kLanes, kPass><<<unsigned(ctas), Tiling<kLanes>::kThreads, 0, stream>>>(p);
  return cuda_call(cudaGetLastError(), what);
}

template <class T, int kLanes>
Status launch_typed(const QuantizeFp8Params& p, cudaStream_t stream) {
  const int64_t ctas = int64_t(p.batch) * p.heads * ((p.seqlen + kFp8ScaleBlock - 1) / kFp8ScaleBlock);
  if (p.block_scales) {
    if (ctas == 0) return Status::Ok();
    return launch_pass<T, kLanes, Pass::kBlock>(p, ctas, stream, "flash3 quantize_fp8 launch");
  }
  const int groups = p.batch * (p.heads / p.heads_per_scale);
  FLASH3_RETURN_IF_ERROR(cuda_call(cudaMemsetAsync(p.descale, 0, size_t(groups) * sizeof(float), stream),
                                   "cudaMemsetAsync(descale)"));
  if (ctas > 0) {
    FLASH3_RETURN_IF_ERROR((launch_pass<T, kLanes, Pass::kAmax>(p, ctas, stream, "flash3 quantize_fp8 amax launch")));
    FLASH3_RETURN_IF_ERROR((launch_pass<T, kLanes, Pass::kWrite>(p, ctas, stream, "flash3 quantize_fp8 launch")));
  }
  quantize_descale_kernel<<<(groups + 255) / 256, 256, 0, stream>>>(p.descale, groups);
  return cuda_call(cudaGetLastError(), "flash3 quantize_fp8 descale launch");
}

// kLanes: d / 8 rounded up to a power of two (at least 4: d >= 32 with the
// rotation, and a d <= 32 row is one step of 4 lanes).
template <class T>
Status launch_for_dim(const QuantizeFp8Params& p, cudaStream_t stream) {
  if (p.d <= 32) return launch_typed<T, 4>(p, stream);
  if (p.d <= 64) return launch_typed<T, 8>(p, stream);
  if (p.d <= 128) return launch_typed<T, 16>(p, stream);
  return launch_typed<T, 32>(p, stream);
}

}  // namespace

void hadamard_sign_bits(int d, uint64_t seed, uint32_t (&bits)[8]) {
  for (uint32_t& b : bits) b = 0;
  uint64_t state = seed;
  for (int j = 0; j < d && j < 256; ++j) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (z >> 63) bits[j / 32] |= 1u << (j % 32);
  }
}

Status launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t stream) {
  if (p.x_dtype == DType::kBFloat16) return launch_for_dim<__nv_bfloat16>(p, stream);
  return launch_for_dim<__half>(p, stream);
}

}  // namespace flash3
