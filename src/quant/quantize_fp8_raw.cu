// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// FP8 quantization kernels, the register-lean variant (quantize_fp8.h,
// launch_quantize_fp8_raw: taken where FLASH3_QUANTIZE_RAW=1 is set, until it
// has been measured against quantize_fp8.cu on a GPU). Every kernel tiles x
// the same way: one CTA per (batch, 128-token block, head), h fastest, so neighbouring
// CTAs read neighbouring heads of the same tokens (adjacent memory for
// (b, s, h, d)). kLanes lanes share a row (d <= 32 kLanes), each holding
// four 16-byte pieces of it: piece i of lane `part` is elements
// [8 (i kLanes + part), + 8), so for each i the row's lanes load one
// contiguous 16 kLanes-byte span. A thread covers two rows (kSteps), so a CTA
// is 64 kLanes threads and holds its block as raw 16-bit values in 32
// registers per thread: several CTAs per SM keep their loads in flight while
// others reduce and store.
//
// The rotation and rotary are recomputed from the raw values in the write
// pass (registers are what limit the loads in flight; arithmetic is not).
// The Hadamard butterflies over the element index bits run in registers for
// the 3 bits inside a piece and the 2 piece bits, and as shuffles for the
// lane bits (the transform is the same butterflies in any bit order).
//
// Block scales: one kernel (amax, then the write from the same registers).
// Per-(batch, head group) scales: two passes, the first maxing each block's
// amax into the group's descale slot (atomicMax, one per CTA), the second
// scaling.
#include "quant/quantize_fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "common/cuda_check.h"
#include "quant/fp8_divide.h"

namespace flash3 {
namespace {

constexpr int kPer = 8;     // elements per piece (16 bytes of x)
constexpr int kPieces = 4;  // pieces per lane per row

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

template <int kLanes>
struct Tiling {
  static constexpr int kSteps = 2;  // rows per thread
  static constexpr int kRowsPerWarp = 32 / kLanes;
  static constexpr int kRowsPerStep = kFp8ScaleBlock / kSteps;
  static constexpr int kThreads = kRowsPerStep * kLanes;
  static constexpr int kWarps = kThreads / 32;
  static_assert(kWarps * kRowsPerWarp == kRowsPerStep, "a step covers whole warps");
};

using Raw = uint4;  // one piece of x as loaded: 8 16-bit values, two per word
using Row = float[kPieces][kPer];  // one row's elements of this lane

// Element index of this lane's piece i, element j.
template <int kLanes>
__device__ __forceinline__ int element(int i, int part, int j) { return (i * kLanes + part) * kPer + j; }

// The pieces of row (b, s, h) this lane holds; pieces past d (and rows past
// seqlen) are zero. Validation guarantees 16-byte aligned rows.
template <int kLanes>
__device__ void load_row(const QuantizeFp8Params& p, int64_t b, int64_t s, int64_t h, int part, Raw (&raw)[kPieces]) {
  const uint16_t* x = static_cast<const uint16_t*>(p.x) + b * p.x_batch_stride + s * p.x_row_stride + h * p.x_head_stride;
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int e0 = element<kLanes>(i, part, 0);
    raw[i] = s < p.seqlen && e0 < p.d ? *reinterpret_cast<const Raw*>(x + e0) : make_uint4(0, 0, 0, 0);
  }
}

// Rotary on this lane's elements of token s, with the append-KV kernel's fp32
// formula (x0' = fma(x0, c, -x1 s), x1' = fma(x0, s, x1 c)), the result kept
// in fp32. Interleaved pairs (2t, 2t + 1) lie in one piece. Half-split pairs
// (t, t + rotary_dim / 2) are pieces dist = rotary_dim / 16 apart (a power of
// two: validation), i.e. piece index q and q ^ dist for q < 2 dist: lanes
// dist apart when dist < kLanes (a shuffle), else pieces dist / kLanes (1 or
// 2: rotary_dim <= d <= 32 kLanes) apart in this lane.
template <class T, int kLanes>
__device__ void rotary(const QuantizeFp8Params& p, int64_t s, int part, Row& y) {
  const T* cos_row = static_cast<const T*>(p.rotary_cos) + s * p.cos_row_stride;
  const T* sin_row = static_cast<const T*>(p.rotary_sin) + s * p.sin_row_stride;
  if (p.rotary_interleaved) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int e0 = element<kLanes>(i, part, 0);
      if (e0 >= p.rotary_dim) continue;
      const Pack<T, kPer / 2> c = *reinterpret_cast<const Pack<T, kPer / 2>*>(cos_row + e0 / 2);
      const Pack<T, kPer / 2> sn = *reinterpret_cast<const Pack<T, kPer / 2>*>(sin_row + e0 / 2);
#pragma unroll
      for (int t = 0; t < kPer / 2; ++t) {
        const float cf = to_float(c.v[t]), sf = to_float(sn.v[t]), x0 = y[i][2 * t], x1 = y[i][2 * t + 1];
        y[i][2 * t] = fmaf(x0, cf, -(x1 * sf));
        y[i][2 * t + 1] = fmaf(x0, sf, x1 * cf);
      }
    }
    return;
  }
  const int dist = p.rotary_dim / (2 * kPer);
  Row other;
  if (dist < kLanes) {  // (uniform: every lane shuffles)
#pragma unroll
    for (int i = 0; i < kPieces; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) other[i][j] = __shfl_xor_sync(0xffffffffu, y[i][j], dist);
  } else {
    const bool far = dist > kLanes;  // pieces i ^ 2, else i ^ 1
#pragma unroll
    for (int i = 0; i < kPieces; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) other[i][j] = far ? y[i ^ 2][j] : y[i ^ 1][j];
  }
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int q = i * kLanes + part;
    if (q >= 2 * dist) continue;
    const bool upper = q >= dist;
    const int t0 = (upper ? q - dist : q) * kPer;
    const Pack<T, kPer> c = *reinterpret_cast<const Pack<T, kPer>*>(cos_row + t0);
    const Pack<T, kPer> sn = *reinterpret_cast<const Pack<T, kPer>*>(sin_row + t0);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float cf = to_float(c.v[j]), sf = to_float(sn.v[j]);
      const float x0 = upper ? other[i][j] : y[i][j], x1 = upper ? y[i][j] : other[i][j];
      y[i][j] = upper ? fmaf(x0, sf, x1 * cf) : fmaf(x0, cf, -(x1 * sf));
    }
  }
}

// x -> x (1/sqrt d) H D over the row (d == 32 kLanes: validation allows the
// rotation for powers of two from 32 on, so every piece is inside the row).
template <int kLanes>
__device__ void rotate(const QuantizeFp8Params& p, int part, Row& y) {
#pragma unroll
  for (int m = 1; m < kPer; m <<= 1)
#pragma unroll
    for (int i = 0; i < kPieces; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (j & m) continue;
        const float a = y[i][j], c = y[i][j | m];
        y[i][j] = a + c;
        y[i][j | m] = a - c;
      }
#pragma unroll
  for (int m = 1; m < kPieces; m <<= 1)
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      if (i & m) continue;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float a = y[i][j], c = y[i | m][j];
        y[i][j] = a + c;
        y[i | m][j] = a - c;
      }
    }
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) {
    const bool upper = part & off;
#pragma unroll
    for (int i = 0; i < kPieces; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, y[i][j], off);
        y[i][j] = upper ? other - y[i][j] : y[i][j] + other;
      }
  }
  const float norm = rsqrtf(float(p.d));
#pragma unroll
  for (int i = 0; i < kPieces; ++i)
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = element<kLanes>(i, part, j);
      const bool neg = (p.sign_bits[e >> 5] >> (e & 31)) & 1;
      y[i][j] *= neg ? -norm : norm;
    }
}

// The row's values as the quantizer sees them: x, rotary, rotation. (All
// lanes, rows past seqlen too, which are zero: the shuffles need every lane.)
template <class T, int kLanes, bool kTransform>
__device__ void transform(const QuantizeFp8Params& p, int64_t s, int part, const Raw (&raw)[kPieces], Row& y) {
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // (a bf16 is the top half of its float)
        y[i][2 * k] = __uint_as_float(w[k] << 16);
        y[i][2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
        y[i][2 * k] = f.x;
        y[i][2 * k + 1] = f.y;
      }
    }
  }
  if constexpr (kTransform) {
    if (p.rotary_dim > 0) rotary<T, kLanes>(p, s < p.seqlen ? s : 0, part, y);
    if (p.hadamard) rotate<kLanes>(p, part, y);
  }
}

// max |x| over raw values, two per instruction in x's own type (exact), so
// that no fp32 copy of the block is formed before the write pass needs it.
template <class T, int kSteps>
__device__ uint32_t raw_amax(const Raw (&raw)[kSteps][kPieces]) {
  using T2 = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
  T2 m = __habs2(*reinterpret_cast<const T2*>(&raw[0][0].x));
#pragma unroll
  for (int t = 0; t < kSteps; ++t)
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const uint32_t w[4] = {raw[t][i].x, raw[t][i].y, raw[t][i].z, raw[t][i].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) m = __hmax2(m, __habs2(*reinterpret_cast<const T2*>(&w[k])));
    }
  return max(amax_bits(to_float(m.x)), amax_bits(to_float(m.y)));
}

// y / descale rounded to e4m3 (ties to even, saturating) into row (b, s, h) of out.
template <int kLanes>
__device__ void store_row(const QuantizeFp8Params& p, int64_t b, int64_t s, int64_t h, int part, const Row& y,
                          const Divider& div) {
  uint8_t* out = p.out + b * p.o_batch_stride + s * p.o_row_stride + h * p.o_head_stride;
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int e0 = element<kLanes>(i, part, 0);
    if (e0 >= p.d) continue;
    Pack<__nv_fp8x2_storage_t, kPer / 2> o;
#pragma unroll
    for (int t = 0; t < kPer / 2; ++t)
      o.v[t] = __nv_cvt_float2_to_fp8x2(make_float2(div(y[i][2 * t]), div(y[i][2 * t + 1])), __NV_SATFINITE,
                                        __NV_E4M3);
    *reinterpret_cast<Pack<__nv_fp8x2_storage_t, kPer / 2>*>(out + e0) = o;
  }
}

enum class Pass { kBlock, kAmax, kWrite };

// kBlock: the block's own descale; kAmax: atomicMax of the block's amax into
// its group's slot (as the bits of a non-negative float, which order as the
// floats); kWrite: scale by the group's descale (the slot holds the amax).
// Plain kernels at 64 registers (four 256-thread CTAs per SM at d = 128),
// the transforming ones at 128.
template <class T, int kLanes, Pass kPass, bool kTransform>
__global__ void __launch_bounds__(Tiling<kLanes>::kThreads, (kTransform ? 512 : 1024) / Tiling<kLanes>::kThreads)
    quantize_kernel(QuantizeFp8Params p) {
  using Tl = Tiling<kLanes>;
  __shared__ uint32_t warp_amax[Tl::kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int part = lane % kLanes, sub = lane / kLanes;
  const int blocks = (p.seqlen + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int64_t linear = blockIdx.x;
  const int64_t h = linear % p.heads, blk = (linear / p.heads) % blocks, b = linear / (int64_t(p.heads) * blocks);
  // Step t's row: s0 + t * kRowsPerStep (a step's loads of all warps cover
  // consecutive rows).
  const int64_t s0 = blk * kFp8ScaleBlock + warp * Tl::kRowsPerWarp + sub;
  Raw raw[Tl::kSteps][kPieces];
#pragma unroll
  for (int t = 0; t < Tl::kSteps; ++t) load_row<kLanes>(p, b, s0 + t * Tl::kRowsPerStep, h, part, raw[t]);
  float descale;
  if constexpr (kPass == Pass::kWrite) {
    const int64_t g = b * (p.heads / p.heads_per_scale) + h / p.heads_per_scale;
    descale = descale_of(__float_as_uint(p.descale[g]));
  } else {
    uint32_t mb;  // (fmaxf and __hmax2 skip NaN)
    if constexpr (kTransform) {
      float m = 0.f;
#pragma unroll
      for (int t = 0; t < Tl::kSteps; ++t) {
        Row y;
        transform<T, kLanes, kTransform>(p, s0 + t * Tl::kRowsPerStep, part, raw[t], y);
#pragma unroll
        for (int i = 0; i < kPieces; ++i)
#pragma unroll
          for (int j = 0; j < kPer; ++j) m = fmaxf(m, fabsf(y[i][j]));
      }
      mb = amax_bits(m);
    } else {
      mb = raw_amax<T>(raw);
    }
    mb = __reduce_max_sync(0xffffffffu, mb);
    if (lane == 0) warp_amax[warp] = mb;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < Tl::kWarps; ++w) mb = max(mb, warp_amax[w]);
    if constexpr (kPass == Pass::kAmax) {
      const int64_t g = b * (p.heads / p.heads_per_scale) + h / p.heads_per_scale;
      if (threadIdx.x == 0 && mb > 0) atomicMax(reinterpret_cast<uint32_t*>(p.descale) + g, mb);
      return;
    }
    descale = descale_of(mb);
    if (threadIdx.x == 0) p.descale[(b * p.heads + h) * blocks + blk] = descale;
  }
  const Divider div = divider(descale);
#pragma unroll
  for (int t = 0; t < Tl::kSteps; ++t) {
    const int64_t s = s0 + t * Tl::kRowsPerStep;
    Row y;
    transform<T, kLanes, kTransform>(p, s, part, raw[t], y);
    if (s < p.seqlen) store_row<kLanes>(p, b, s, h, part, y, div);
  }
}

__global__ void quantize_descale_kernel(float* descale, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) descale[i] = descale_of(__float_as_uint(descale[i]));  // (the slot holds the amax's bits)
}

// Plain quantization (no rotary, no rotation) has kernels of its own: the
// transforms' registers would otherwise limit every kernel's occupancy.
template <class T, int kLanes, Pass kPass>
Status launch_pass(const QuantizeFp8Params& p, int64_t ctas, cudaStream_t stream, const char* what) {
  constexpr int kThreads = Tiling<kLanes>::kThreads;
  if (p.hadamard || p.rotary_dim > 0) quantize_kernel<T, kLanes, kPass, true><<<unsigned(ctas), kThreads, 0, stream>>>(p);
  else quantize_kernel<T, kLanes, kPass, false><<<unsigned(ctas), kThreads, 0, stream>>>(p);
  return cuda_call(cudaGetLastError(), what);
}

// (The launch sequence is quantize_fp8.cu's: one of the two files is removed
// once both have been measured.)
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

// kLanes: d / 32 rounded up to a power of two.
template <class T>
Status launch_for_dim(const QuantizeFp8Params& p, cudaStream_t stream) {
  if (p.d <= 32) return launch_typed<T, 1>(p, stream);
  if (p.d <= 64) return launch_typed<T, 2>(p, stream);
  if (p.d <= 128) return launch_typed<T, 4>(p, stream);
  return launch_typed<T, 8>(p, stream);
}

}  // namespace

Status launch_quantize_fp8_raw(const QuantizeFp8Params& p, cudaStream_t stream) {
  if (p.x_dtype == DType::kBFloat16) return launch_for_dim<__nv_bfloat16>(p, stream);
  return launch_for_dim<__half>(p, stream);
}

}  // namespace flash3
