// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Split-KV combine kernel (see combine.h for the contract).
//
// One warp per (row, head): the lanes reduce the max and the sum of exp over
// the splits' LSEs (lane l reads splits l, l + 32, ...), compact the splits
// that contribute (lse_s != -inf) with their weights exp(lse_s - lse) into
// shared memory, then accumulate sum_s w_s * out_s over head_dim in float4
// pieces (lane l owns float4 columns l, l + 32, ...: head_dim <= 512, FlashAttention-3's
// MLA value dim, is at most 128 of them). The kernel is bound by the reads of out_partial (num_splits fp32
// rows per output row); a split at -inf is never read, so the partial output
// of an empty split may hold anything (FlashAttention-3 leaves it unwritten).
#include "combine/combine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "common/seqlen.h"
#include "launch/launch_kernel.cuh"

namespace flash3 {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
// Splits per lane in the LSE pass.
constexpr int kSplitsPerLane = kMaxCombineSplits / 32;
static_assert(kMaxCombineSplits % 32 == 0, "the LSE pass gives each lane kMaxCombineSplits / 32 splits");
// A grid-stride loop over the warps' rows: the grid stays below the x limit
// whatever the problem size (batch * seqlen * heads is int64).
constexpr int64_t kMaxBlocks = int64_t(1) << 24;

// Four fp32 values stored as the output type (one 16-, 8-byte store when
// `vec`, four scalar stores otherwise).
__device__ __forceinline__ void store4(float* dst, float4 v, bool vec) {
  if (vec) {
    *reinterpret_cast<float4*>(dst) = v;
  } else {
    dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
  }
}
// The 16-bit types: two converted pairs (T2 is T's pair type, 4 bytes).
template <class T, class T2>
__device__ __forceinline__ void store_pairs(T* dst, T2 a, T2 b, bool vec) {
  if (vec) {
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&a);
    u.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(dst) = u;
  } else {
    dst[0] = a.x; dst[1] = a.y; dst[2] = b.x; dst[3] = b.y;
  }
}
__device__ __forceinline__ void store4(__nv_bfloat16* dst, float4 v, bool vec) {
  store_pairs(dst, __floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w), vec);
}
__device__ __forceinline__ void store4(__half* dst, float4 v, bool vec) {
  store_pairs(dst, __floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w), vec);
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Varlen: whether packed row r is combined, i.e. the last sequence b with
// seqs[b].offset_q <= r has r < offset_q + seqlen_q. Sequences of length 0
// share their offset with the next one; taking the last such b skips them.
__device__ __forceinline__ bool varlen_row_used(const SeqlenInfo* seqs, int num_seqs, int r) {
  int lo = 0, hi = num_seqs;  // first b with offset_q > r lies in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (seqs[mid].offset_q <= r) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return false;  // r precedes every sequence
  const SeqlenInfo s = seqs[lo - 1];
  return r - s.offset_q < s.seqlen_q;
}

// vec_out: out's base and row / head / batch strides allow the 4-element
// vector store (uniform over the grid, decided on the host).
template <class OutT>
__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineParams p, const bool vec_out) {
  // Per warp: the contributing splits (index, weight), compacted.
  __shared__ float s_weight[kWarpsPerBlock][kMaxCombineSplits];
  __shared__ int s_split[kWarpsPerBlock][kMaxCombineSplits];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t num_rows = int64_t(p.batch) * p.seqlen * p.heads;
  const int num_vec = p.head_dim / 4;

  for (int64_t w = int64_t(blockIdx.x) * kWarpsPerBlock + warp; w < num_rows;
       w += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int h = static_cast<int>(w % p.heads);
    const int64_t bs = w / p.heads;
    const int r = static_cast<int>(bs % p.seqlen);
    const int b = static_cast<int>(bs / p.seqlen);
    if (p.seqs != nullptr && !varlen_row_used(p.seqs, p.num_seqs, r)) continue;  // warp-uniform

    // LSE pass: max, then sum of exp relative to it.
    const float* lp = p.lse_partial + b * p.lp_batch_stride + r * p.lp_row_stride + h * p.lp_head_stride;
    float lse_s[kSplitsPerLane];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) {
      const int s = lane + 32 * i;
      lse_s[i] = s < p.num_splits ? lp[s * p.lp_split_stride] : -INFINITY;
      m = fmaxf(m, lse_s[i]);
    }
    m = warp_max(m);
    // Every split at -inf: no visible key in any split; out = 0, lse = -inf
    // (as the unsplit forward writes for a fully masked row), never NaN.
    const bool all_masked = m == -INFINITY;
    float lse = -INFINITY;
    if (!all_masked) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kSplitsPerLane; ++i) sum += lse_s[i] == -INFINITY ? 0.f : expf(lse_s[i] - m);
      lse = m + logf(warp_sum(sum));  // sum >= 1: the maximum's own term
    }
    if (p.lse != nullptr && lane == 0)
      p.lse[b * p.lse_batch_stride + r * p.lse_row_stride + h * p.lse_head_stride] = lse;

    // Compact the contributing splits: a split at -inf weighs 0 and its
    // partial output is not read (it may be uninitialised memory: 0 * NaN is
    // NaN). A NaN lse_s is kept and makes the row NaN (unless every other
    // split is -inf: fmaxf ignores NaN, so the row counts as fully masked).
    int count = 0;
    if (!all_masked) {
#pragma unroll
      for (int i = 0; i < kSplitsPerLane; ++i) {
        const int s = lane + 32 * i;
        const bool used = s < p.num_splits && lse_s[i] != -INFINITY;
        const unsigned ballot = __ballot_sync(0xffffffffu, used);
        if (used) {
          const int slot = count + __popc(ballot & ((1u << lane) - 1u));
          s_split[warp][slot] = s;
          s_weight[warp][slot] = expf(lse_s[i] - lse);
        }
        count += __popc(ballot);
      }
    }
    __syncwarp();

    // Output pass: lane owns float4 columns lane, lane + 32, ...
    const float* op = p.out_partial + b * p.op_batch_stride + r * p.op_row_stride + h * p.op_head_stride;
    OutT* o = static_cast<OutT*>(p.out) + b * p.o_batch_stride + r * p.o_row_stride + h * p.o_head_stride;
    for (int c = lane; c < num_vec; c += 32) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
      for (int j = 0; j < count; ++j) {
        const float wt = s_weight[warp][j];
        const float4 v = __ldg(reinterpret_cast<const float4*>(op + s_split[warp][j] * p.op_split_stride) + c);
        acc.x = fmaf(wt, v.x, acc.x);
        acc.y = fmaf(wt, v.y, acc.y);
        acc.z = fmaf(wt, v.z, acc.z);
        acc.w = fmaf(wt, v.w, acc.w);
      }
      store4(o + 4 * c, acc, vec_out);
    }
    // The next row's compaction overwrites this row's slots.
    __syncwarp();
  }
}

// The 4-element vector store needs 4 * sizeof(OutT) bytes of alignment at
// every (batch, row, head) start.
bool out_vectorizable(const CombineParams& p) {
  const int64_t es = dtype_size(p.out_dtype);
  const int64_t align = 4 * es;
  if (reinterpret_cast<uintptr_t>(p.out) % align != 0) return false;
  for (int64_t st : {p.o_batch_stride, p.o_row_stride, p.o_head_stride})
    if ((st * es) % align != 0) return false;
  return true;
}

template <class OutT>
Status launch_typed(const CombineParams& p, cudaStream_t stream) {
  const int64_t num_rows = int64_t(p.batch) * p.seqlen * p.heads;
  const int64_t blocks = std::min<int64_t>((num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  return launch_kernel("combine_kernel", combine_kernel<OutT>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                       stream, p, out_vectorizable(p));
}

}  // namespace

Status launch_combine(const CombineParams& p, cudaStream_t stream) {
  if (int64_t(p.batch) * p.seqlen * p.heads == 0) return Status::Ok();
  // Validation's contract, re-checked: the kernel indexes fixed-size arrays with it.
  if (p.num_splits < 1 || p.num_splits > kMaxCombineSplits || p.head_dim < 1 || p.head_dim > kMaxCombineHeadDim ||
      p.head_dim % 4 != 0 || (p.seqs != nullptr && (p.batch != 1 || p.num_seqs < 0)))
    return {StatusCode::kInternal, "launch_combine: num_splits " + std::to_string(p.num_splits) + ", head_dim " +
                                       std::to_string(p.head_dim) + ", batch " + std::to_string(p.batch) +
                                       " outside the validated range"};
  switch (p.out_dtype) {
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kFloat32: return launch_typed<float>(p, stream);
    default: break;
  }
  return {StatusCode::kInternal,
          std::string("launch_combine: out dtype ") + dtype_name(p.out_dtype) + "; expected bf16, fp16 or fp32"};
}

}  // namespace flash3
