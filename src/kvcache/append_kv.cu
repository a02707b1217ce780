// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// KV-cache append + rotary kernel (see append_kv.h for the contract). With
// FLASH3_SERVING_WIP (not yet run on a GPU): variable-length new rows and
// queries, and paged caches whose table rows are picked by cache_batch_idx.
//
// One thread per 8-element chunk (16 bytes) of a row. A grid-stride loop runs
// over three segments of chunks, in this order: the new K rows (batch,
// seqlen_new, heads_kv, head_dim / 8), the new V rows (head_dim_v / 8 chunks a
// row), then the q rows (batch, seqlen_q, heads_q, head_dim / 8) when q_out is
// written. The chunk of a source row is read with one 16-byte load and written
// with one 16-byte store (scalar accesses when an address or stride does not
// allow it); the rotary partner of a half-split (GPT-NeoX) pair lives
// rotary_dim / 2 elements away and is read again from the source (an L1 hit:
// the neighbouring thread loads it too). cos / sin are scalar loads (their row
// strides are arbitrary). The kernel is bound by the bytes moved; it uses no
// shared memory and needs no synchronisation: every output element is written
// by exactly one thread, and sources are never written.
#include "kvcache/append_kv.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_check.h"
#include "launch/launch_kernel.cuh"

namespace flash3 {

namespace {

constexpr int kThreads = 256;
// Elements per thread: 16 bytes of a 16-bit type (head dims are multiples of 8).
constexpr int kChunk = 8;
// A grid-stride loop keeps the grid below the x limit whatever the problem
// size (the chunk count is int64).
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// The header's rotary formula, x0' = fma(x0, c, -(x1 * s)) and x1' = fma(x0,
// s, x1 * c), each product rounded to fp32 before the fma. Inline PTX without
// .ftz: the library is built with -use_fast_math, under which nvcc emits
// mul.rn.ftz / fma.rn.ftz even for __fmul_rn / __fmaf_rn, flushing fp32
// subnormals (bf16 has them) that the CPU reference keeps. The negation is in
// the same asm block for the same reason (neg.ftz).
__device__ __forceinline__ float rotate_x0(float x0, float x1, float c, float s) {
  float r;
  asm("{\n\t.reg .f32 p;\n\tmul.rn.f32 p, %2, %4;\n\tneg.f32 p, p;\n\tfma.rn.f32 %0, %1, %3, p;\n\t}"
      : "=f"(r)
      : "f"(x0), "f"(x1), "f"(c), "f"(s));
  return r;
}
__device__ __forceinline__ float rotate_x1(float x0, float x1, float c, float s) {
  float r;
  asm("{\n\t.reg .f32 p;\n\tmul.rn.f32 p, %2, %3;\n\tfma.rn.f32 %0, %1, %4, p;\n\t}"
      : "=f"(r)
      : "f"(x0), "f"(x1), "f"(c), "f"(s));
  return r;
}

// 8 elements at p (one 16-byte access when `vec`, eight scalar ones otherwise).
template <class T>
__device__ __forceinline__ void load_chunk(const T* p, bool vec, T (&x)[kChunk]) {
  if (vec) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    *reinterpret_cast<uint4*>(x) = u;
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) x[e] = p[e];
  }
}
template <class T>
__device__ __forceinline__ void store_chunk(T* p, bool vec, const T (&x)[kChunk]) {
  if (vec) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(x);
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) p[e] = x[e];
  }
}

// How the chunks of a row are rotated (uniform over the grid).
struct RotaryShape {
  int dim = 0;  // 0: plain copy
  bool interleaved = true;
  bool vec = false;          // 16-byte accesses allowed
  bool partner_vec = false;  // half-split partner chunk in one 16-byte load (vec, rotary_dim % 16 == 0)
};

// dst[c, c + 8) = src[c, c + 8) rotated by the table rows cos_row / sin_row
// (null: position outside the tables, cos 1 sin 0); dims >= r.dim are copied.
template <class T>
__device__ __forceinline__ void rotate_chunk(const T* src, T* dst, int c, const RotaryShape& r, const T* cos_row,
                                             const T* sin_row) {
  alignas(16) T x[kChunk];  // 16 bytes: read and written as one uint4
  load_chunk(src + c, r.vec, x);
  if (c < r.dim) {
    alignas(16) T y[kChunk];
    auto cs = [&](int j, float* co, float* si) {
      *co = cos_row != nullptr ? to_float(cos_row[j]) : 1.f;
      *si = sin_row != nullptr ? to_float(sin_row[j]) : 0.f;
    };
    if (r.interleaved) {
      // c is even: the pairs (2j, 2j + 1) lie inside the chunk.
#pragma unroll
      for (int k = 0; k < kChunk; k += 2) {
        if (c + k < r.dim) {
          float co, si;
          cs((c + k) / 2, &co, &si);
          const float x0 = to_float(x[k]), x1 = to_float(x[k + 1]);
          y[k] = from_float<T>(rotate_x0(x0, x1, co, si));
          y[k + 1] = from_float<T>(rotate_x1(x0, x1, co, si));
        } else {
          y[k] = x[k];
          y[k + 1] = x[k + 1];
        }
      }
    } else {
      const int half = r.dim / 2;
      // Dim d < half pairs with d + half, half <= d < dim with d - half.
      alignas(16) T z[kChunk];
      if (r.partner_vec) {
        load_chunk(src + (c < half ? c + half : c - half), true, z);
      } else {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          const int d = c + e;
          z[e] = d < r.dim ? src[d < half ? d + half : d - half] : x[e];
        }
      }
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const int d = c + e;
        float co, si;
        if (d < half) {
          cs(d, &co, &si);
          y[e] = from_float<T>(rotate_x0(to_float(x[e]), to_float(z[e]), co, si));
        } else if (d < r.dim) {
          cs(d - half, &co, &si);
          y[e] = from_float<T>(rotate_x1(to_float(z[e]), to_float(x[e]), co, si));
        } else {
          y[e] = x[e];
        }
      }
    }
    store_chunk(dst + c, r.vec, y);
  } else {
    store_chunk(dst + c, r.vec, x);
  }
}

// Table rows of position pos (nulls outside [0, seqlen_ro): the identity).
template <class T>
__device__ __forceinline__ void table_rows(const AppendKVParams& p, int64_t pos, const T** cos_row,
                                           const T** sin_row) {
  if (pos >= 0 && pos < p.seqlen_ro) {
    *cos_row = static_cast<const T*>(p.rotary_cos) + pos * p.cos_row_stride;
    *sin_row = static_cast<const T*>(p.rotary_sin) + pos * p.sin_row_stride;
  } else {
    *cos_row = nullptr;
    *sin_row = nullptr;
  }
}

// Chunk counts of the three segments: new K, new V, q.
struct Segments {
  int64_t k = 0, v = 0, q = 0;
};

#if FLASH3_SERVING_WIP
// Row r of a variable-length segment (cu: num_seqs + 1 prefix sums over
// total rows, each clamped into [0, total] with a decreasing pair empty, as
// varlen_seq_info reads them): its sequence b and index i within it, or b =
// -1 for a row no sequence covers. Binary search over the (for valid input
// non-decreasing) clamped starts.
struct SeqRow {
  int b, i;
};
__device__ __forceinline__ SeqRow seq_of_row(const int* cu, int num_seqs, int total, int64_t r) {
  auto start = [&](int b) { return min(max(cu[b], 0), total); };
  int lo = 0, hi = num_seqs - 1;  // the last b with start(b) <= r
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start(mid) <= r) lo = mid;
    else hi = mid - 1;
  }
  const int s0 = start(lo), s1 = min(max(cu[lo + 1], s0), total);
  if (r < s0 || r >= s1) return {-1, 0};
  return {lo, int(r - s0)};
}
#endif

template <class T>
__global__ void __launch_bounds__(kThreads)
    append_kv_kernel(const AppendKVParams p, const Segments n, const RotaryShape rot) {
  const int64_t total = n.k + n.v + n.q;
  const RotaryShape copy{0, true, rot.vec, false};
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * kThreads) {
    if (t < n.k + n.v) {
      const bool is_k = t < n.k;
      const int64_t u = is_k ? t : t - n.k;
      const int chunks = (is_k ? p.head_dim : p.head_dim_v) / kChunk;
      const int c = static_cast<int>(u % chunks) * kChunk;
      const int64_t row = u / chunks;  // (b, i, h)
      const int h = static_cast<int>(row % p.heads_kv);
      const int64_t bi = row / p.heads_kv;
#if FLASH3_SERVING_WIP
      int b, i;
      if (p.cu_seqlens_new != nullptr) {  // row bi of (total_new, ...)
        const SeqRow sr = seq_of_row(p.cu_seqlens_new, p.batch, p.total_new, bi);
        if (sr.b < 0) continue;  // a row no sequence appends
        b = sr.b, i = sr.i;
      } else {
        i = static_cast<int>(bi % p.seqlen_new);
        b = static_cast<int>(bi / p.seqlen_new);
      }
#else
      const int i = static_cast<int>(bi % p.seqlen_new);
      const int b = static_cast<int>(bi / p.seqlen_new);
#endif
      const int cache_len = max(p.cache_seqlens[b], 0);
      const int64_t dst_row = int64_t(cache_len) + i;
      if (dst_row >= p.cache_rows) continue;  // dropped: past the cache's end
      // The cache row: (entry, dst_row), or for a paged cache (0, the row in the pool).
      int64_t entry = min(max(p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b, 0), p.cache_batches - 1);
      int64_t cache_row = dst_row;
      if (p.page_table != nullptr) {
#if FLASH3_SERVING_WIP
        // (the entry's row of the page table)
        const int page = p.page_table[entry * p.page_table_batch_stride + dst_row / p.page_size];
#else
        const int page = p.page_table[b * p.page_table_batch_stride + dst_row / p.page_size];
#endif
        cache_row = int64_t(page) * p.page_size + dst_row % p.page_size;
        entry = 0;
      }
      if (is_k) {
#if FLASH3_SERVING_WIP
        const int64_t r = p.cu_seqlens_new != nullptr ? bi * p.kn_row_stride : b * p.kn_batch_stride + i * p.kn_row_stride;
        const T* src = static_cast<const T*>(p.k_new) + r + h * p.kn_head_stride;
#else
        const T* src = static_cast<const T*>(p.k_new) + b * p.kn_batch_stride + i * p.kn_row_stride +
                       h * p.kn_head_stride;
#endif
        T* dst = static_cast<T*>(p.k_cache) + entry * p.kc_batch_stride + cache_row * p.kc_row_stride +
                 h * p.kc_head_stride;
        const T *cos_row = nullptr, *sin_row = nullptr;
        if (rot.dim > 0) {
          const int pos_b = p.rotary_seqlens != nullptr ? p.rotary_seqlens[b] : cache_len;
          table_rows(p, int64_t(pos_b) + i, &cos_row, &sin_row);
        }
        rotate_chunk(src, dst, c, rot, cos_row, sin_row);
      } else {
#if FLASH3_SERVING_WIP
        const int64_t r = p.cu_seqlens_new != nullptr ? bi * p.vn_row_stride : b * p.vn_batch_stride + i * p.vn_row_stride;
        const T* src = static_cast<const T*>(p.v_new) + r + h * p.vn_head_stride;
#else
        const T* src = static_cast<const T*>(p.v_new) + b * p.vn_batch_stride + i * p.vn_row_stride +
                       h * p.vn_head_stride;
#endif
        T* dst = static_cast<T*>(p.v_cache) + entry * p.vc_batch_stride + cache_row * p.vc_row_stride +
                 h * p.vc_head_stride;
        rotate_chunk(src, dst, c, copy, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr));
      }
    } else {
      const int64_t u = t - n.k - n.v;
      const int chunks = p.head_dim / kChunk;
      const int c = static_cast<int>(u % chunks) * kChunk;
      const int64_t row = u / chunks;  // (b, i, h)
      const int h = static_cast<int>(row % p.heads_q);
      const int64_t bi = row / p.heads_q;
#if FLASH3_SERVING_WIP
      int b, i;
      if (p.cu_seqlens_q != nullptr) {  // row bi of (total_q, ...)
        const SeqRow sr = seq_of_row(p.cu_seqlens_q, p.batch, p.total_q, bi);
        if (sr.b < 0) continue;  // a row no sequence covers: not attended to
        b = sr.b, i = sr.i;
      } else {
        i = static_cast<int>(bi % p.seqlen_q);
        b = static_cast<int>(bi / p.seqlen_q);
      }
#else
      const int i = static_cast<int>(bi % p.seqlen_q);
      const int b = static_cast<int>(bi / p.seqlen_q);
#endif
      const int pos_b = p.rotary_seqlens != nullptr  ? p.rotary_seqlens[b]
                        : p.cache_seqlens != nullptr ? max(p.cache_seqlens[b], 0)
                                                     : 0;
      const T *cos_row, *sin_row;
      table_rows(p, int64_t(pos_b) + (p.q_positions_advance ? i : 0), &cos_row, &sin_row);
#if FLASH3_SERVING_WIP
      const bool vq = p.cu_seqlens_q != nullptr;
      const T* src = static_cast<const T*>(p.q) + (vq ? bi * p.q_row_stride : b * p.q_batch_stride + i * p.q_row_stride) +
                     h * p.q_head_stride;
      T* dst = static_cast<T*>(p.q_out) + (vq ? bi * p.qo_row_stride : b * p.qo_batch_stride + i * p.qo_row_stride) +
               h * p.qo_head_stride;
#else
      const T* src = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride + h * p.q_head_stride;
      T* dst = static_cast<T*>(p.q_out) + b * p.qo_batch_stride + i * p.qo_row_stride + h * p.qo_head_stride;
#endif
      rotate_chunk(src, dst, c, rot, cos_row, sin_row);
    }
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// 16-byte accesses: every base pointer 16-byte aligned and every stride a
// multiple of 8 elements (what validation guarantees; checked, not assumed).
bool vectorizable(const AppendKVParams& p, const Segments& n) {
  auto strides_ok = [](std::initializer_list<int64_t> strides) {
    for (int64_t s : strides)
      if (s % kChunk != 0) return false;
    return true;
  };
  if (n.k > 0 &&
      !(aligned16(p.k_new) && aligned16(p.v_new) && aligned16(p.k_cache) && aligned16(p.v_cache) &&
        strides_ok({p.kn_batch_stride, p.kn_row_stride, p.kn_head_stride, p.vn_batch_stride, p.vn_row_stride,
                    p.vn_head_stride, p.kc_batch_stride, p.kc_row_stride, p.kc_head_stride, p.vc_batch_stride,
                    p.vc_row_stride, p.vc_head_stride})))
    return false;
  if (n.q > 0 && !(aligned16(p.q) && aligned16(p.q_out) &&
                   strides_ok({p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.qo_batch_stride,
                               p.qo_row_stride, p.qo_head_stride})))
    return false;
  return true;
}

Status internal(const std::string& what) { return {StatusCode::kInternal, "launch_append_kv: " + what}; }

}  // namespace

Status launch_append_kv(const AppendKVParams& p, cudaStream_t stream) {
#if FLASH3_SERVING_WIP
  const int64_t new_rows = p.cu_seqlens_new != nullptr ? p.total_new : int64_t(p.batch) * p.seqlen_new;
  const int64_t q_rows = p.cu_seqlens_q != nullptr ? p.total_q : int64_t(p.batch) * p.seqlen_q;
#else
  const int64_t new_rows = int64_t(p.batch) * p.seqlen_new;
  const int64_t q_rows = int64_t(p.batch) * p.seqlen_q;
#endif
  const bool append = new_rows > 0 && p.batch > 0 && p.heads_kv > 0;
  const bool rotate_q = p.rotary_dim > 0 && p.q_out != nullptr && p.batch > 0 && q_rows > 0 && p.heads_q > 0;
  if (!append && !rotate_q) return Status::Ok();

  // Validation's contract, re-checked where the kernel relies on it: whole
  // chunks, pairs inside the head, and the pointers it dereferences.
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16)
    return internal(std::string("dtype ") + dtype_name(p.dtype) + "; expected bf16 or fp16");
  if (p.head_dim <= 0 || p.head_dim % kChunk != 0 || (append && (p.head_dim_v <= 0 || p.head_dim_v % kChunk != 0)))
    return internal("head_dim " + std::to_string(p.head_dim) + " / head_dim_v " + std::to_string(p.head_dim_v) +
                    " not a positive multiple of 8");
  if (p.rotary_dim < 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim)
    return internal("rotary_dim " + std::to_string(p.rotary_dim) + " not even in [0, head_dim]");
  if (append && (p.k_new == nullptr || p.v_new == nullptr || p.k_cache == nullptr || p.v_cache == nullptr ||
                 p.cache_seqlens == nullptr || p.cache_batches <= 0))
    return internal("appending needs k_new, v_new, both caches, cache_seqlens and cache_batches > 0");
  if (rotate_q && p.q == nullptr) return internal("q_out without q");
#if FLASH3_SERVING_WIP
  if (append && p.page_table != nullptr && p.page_size <= 0) return internal("a paged cache needs page_size > 0");
#else
  if (append && p.page_table != nullptr && (p.page_size <= 0 || p.cache_batch_idx != nullptr))
    return internal("a paged cache needs page_size > 0 and no cache_batch_idx");
#endif
  if (p.rotary_dim > 0 && p.seqlen_ro > 0 && (p.rotary_cos == nullptr || p.rotary_sin == nullptr))
    return internal("rotary_dim > 0 without the cos / sin tables");

  Segments n;
  if (append) {
    const int64_t rows = new_rows * p.heads_kv;
    n.k = rows * (p.head_dim / kChunk);
    n.v = rows * (p.head_dim_v / kChunk);
  }
  if (rotate_q) n.q = q_rows * p.heads_q * (p.head_dim / kChunk);

  RotaryShape rot;
  rot.dim = p.rotary_dim;
  rot.interleaved = p.rotary_interleaved;
  rot.vec = vectorizable(p, n);
  rot.partner_vec = rot.vec && p.rotary_dim % (2 * kChunk) == 0;

  const int64_t total = n.k + n.v + n.q;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
  if (p.dtype == DType::kBFloat16)
    return launch_kernel("append_kv_kernel", append_kv_kernel<__nv_bfloat16>, grid, block, 0, stream, p, n, rot);
  return launch_kernel("append_kv_kernel", append_kv_kernel<__half>, grid, block, 0, stream, p, n, rot);
}

}  // namespace flash3
