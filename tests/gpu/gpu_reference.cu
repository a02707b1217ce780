// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// fp32 GPU reference attention forward and backward; see gpu_reference.cuh for
// the contracts.
//
// Forward:
// One thread block computes a tile of kBM query rows of one (batch, head) in two
// passes over the visible key tiles (kBN keys each), with exact (not online-
// rescaled) probabilities in the second pass so the low-precision mode can round
// P exactly like a plain implementation does:
//   pass 1: S = Q K^T * scale (fp32)  ->  row max m and row sum l = sum exp(S - m)
//   pass 2: S again, P = exp(S - m) / l, O += P V.
// Tiles are staged in shared memory as fp32 (padded rows: no bank conflicts).
// Simple and exact rather than fast, but it still runs at a few TFLOP/s, which
// keeps the full GPU test matrix to seconds of reference time.
//
// Backward: a plain implementation with fp32 S / P / dS materialised in scratch
// (a chunk of the query heads of one (batch, kv head) at a time) and a generic
// register-blocked fp32 GEMM (64 x 64 tiles, arbitrary operand strides) whose
// epilogues apply scale / mask / rounding / dS; see the section at the end.
#include "gpu_reference.cuh"

#include <algorithm>
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace flash3::gpuref {
namespace {

constexpr int kBM = 64;        // query rows per block
constexpr int kBN = 64;        // keys per tile
constexpr int kThreads = 256;  // 16 x 16 threads; each owns 4 rows x (4 | kCols) columns
constexpr int kLdS = kBN + 1;

struct KParams {
  const void* q;
  const void* k;
  const void* v;
  float* out;
  float* lse;
  int batch, sq, sk, hq, hkv, d, dv;
  int64_t q_sb, q_sr, q_sh, k_sb, k_sr, k_sh, v_sb, v_sr, v_sh;
  float scale, softcap;
  int wl, wr;  // -1: unbounded (causal already folded into wr = 0)
  int ld_q, ld_kv;
};

template <class E>
__device__ __forceinline__ float to_f(E x);
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }

template <class E>
__device__ __forceinline__ float round_to(float x);
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
template <>
__device__ __forceinline__ float round_to<__half>(float x) { return __half2float(__float2half_rn(x)); }

// Query i sees key j iff j >= i + sk - sq - wl (wl >= 0) and j <= i + sk - sq + wr
// (wr >= 0), evaluated per element in int64 straight from the definition: a
// window of 2^31 - 1 gives the unbounded answer because the arithmetic says so,
// with no clamping or tile-level shortcut shared with the library's kernels.
__device__ __forceinline__ bool visible_at(int64_t i, int64_t j, int64_t sq, int64_t sk, int64_t wl, int64_t wr) {
  const int64_t diag = i + sk - sq;
  if (wl >= 0 && j < diag - wl) return false;
  if (wr >= 0 && j > diag + wr) return false;
  return true;
}

__device__ __forceinline__ bool visible(const KParams& p, int i, int j) {
  return visible_at(i, j, p.sq, p.sk, p.wl, p.wr);
}

// Loads rows [r0, r0 + kBM) (zero beyond `nrows`) of a strided 16-bit tensor into
// smem as fp32 with leading dimension ld; columns [cols, ld_cols) are zero-filled.
template <class E>
__device__ __forceinline__ void load_tile(float* dst, int ld, const E* base, int64_t row_stride, int nrows,
                                          int cols, int fill_cols) {
  const int total = kBM * fill_cols;
  for (int idx = threadIdx.x; idx < total; idx += kThreads) {
    const int r = idx / fill_cols;
    const int c = idx - r * fill_cols;
    float x = 0.f;
    if (r < nrows && c < cols) x = to_f<E>(base[int64_t(r) * row_stride + c]);
    dst[r * ld + c] = x;
  }
}

// S tile for rows [m0, m0 + kBM) x keys [n0, n0 + kBN): scaled, soft-capped,
// (rounded in low-precision mode), masked to -inf. Written to sS.
template <class E, bool kLowp>
__device__ __forceinline__ void score_tile(const KParams& p, const float* sQ, const float* sK, float* sS, int m0,
                                           int n0, int rows) {
  static_assert(kBN == 64 && kBM == 64, "thread mapping assumes 64 x 64 tiles");
  const int rg = threadIdx.x / 16, cg = threadIdx.x % 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  const float* q0 = sQ + (rg * 4) * p.ld_q;
  const float* k0 = sK + cg * p.ld_kv;
  for (int kk = 0; kk < p.d; ++kk) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = q0[i * p.ld_q + kk];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = k0[(16 * j) * p.ld_kv + kk];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg * 4 + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = cg + 16 * j;
      float s = acc[i][j] * p.scale;
      if (kLowp) s = round_to<E>(s);  // scaled scores materialised in the dtype
      if (p.softcap > 0.f) {
        s = p.softcap * tanhf(s / p.softcap);
        if (kLowp) s = round_to<E>(s);
      }
      const bool ok = r < rows && n0 + c < p.sk && visible(p, m0 + r, n0 + c);
      sS[r * kLdS + c] = ok ? s : -INFINITY;
    }
  }
}

template <class E, bool kLowp, int kCols>
__global__ void __launch_bounds__(kThreads) ref_fwd_kernel(const KParams p) {
  extern __shared__ float smem[];
  float* sQ = smem;                   // kBM x ld_q
  float* sKV = sQ + kBM * p.ld_q;     // kBN x ld_kv (K tile, then V tile)
  float* sS = sKV + kBN * p.ld_kv;    // kBM x kLdS
  float* sM = sS + kBM * kLdS;        // kBM row max
  float* sL = sM + kBM;               // kBM row sum

  const int m0 = blockIdx.x * kBM;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / (p.hq / p.hkv);
  const int rows = min(kBM, p.sq - m0);
  const int tid = threadIdx.x;

  const E* qb = static_cast<const E*>(p.q) + b * p.q_sb + int64_t(m0) * p.q_sr + h * p.q_sh;
  const E* kb = static_cast<const E*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const E* vb = static_cast<const E*>(p.v) + b * p.v_sb + hk * p.v_sh;

  load_tile<E>(sQ, p.ld_q, qb, p.q_sr, rows, p.d, p.d);

  // Key range that can hold a visible key of the tile (tiles outside contribute
  // nothing; only a speed-up: every element is still masked by visible()).
  // int64: window + diagonal exceeds int32 for windows near 2^31.
  const int64_t diag_lo = int64_t(m0) + p.sk - p.sq, diag_hi = int64_t(m0) + rows - 1 + p.sk - p.sq;
  int64_t jlo = 0, jhi = int64_t(p.sk) - 1;
  if (p.wl >= 0) jlo = diag_lo - p.wl > jlo ? diag_lo - p.wl : jlo;
  if (p.wr >= 0) jhi = diag_hi + p.wr < jhi ? diag_hi + p.wr : jhi;
  const int t_begin = jlo <= jhi ? int(jlo / kBN) * kBN : 0;
  const int t_end = jlo <= jhi ? int(jhi) + 1 : 0;

  // ---- pass 1: row max / row sum. 4 threads per row, 16 columns each. ----
  const int pr = tid / 4, pp = tid % 4;
  float m_run = -INFINITY, l_run = 0.f;
  for (int n0 = t_begin; n0 < t_end; n0 += kBN) {
    __syncthreads();  // previous users of sKV / sS are done
    load_tile<E>(sKV, p.ld_kv, kb + int64_t(n0) * p.k_sr, p.k_sr, min(kBN, p.sk - n0), p.d, p.d);
    __syncthreads();
    score_tile<E, kLowp>(p, sQ, sKV, sS, m0, n0, rows);
    __syncthreads();
    float s[16];
    float mt = -INFINITY;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      s[c] = sS[pr * kLdS + pp + 4 * c];
      mt = fmaxf(mt, s[c]);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float m_new = fmaxf(m_run, mt);
    float sum = 0.f;
    if (m_new != -INFINITY) {
#pragma unroll
      for (int c = 0; c < 16; ++c) sum += s[c] == -INFINITY ? 0.f : expf(s[c] - m_new);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (m_new != -INFINITY) {
      l_run = (m_run == -INFINITY ? 0.f : l_run * expf(m_run - m_new)) + sum;
      m_run = m_new;
    }
  }
  if (pp == 0) {
    sM[pr] = m_run;
    sL[pr] = l_run;
    if (p.lse != nullptr && pr < rows) {
      const bool empty = m_run == -INFINITY || !(l_run > 0.f);
      p.lse[(int64_t(b) * p.hq + h) * p.sq + m0 + pr] = empty ? -INFINITY : m_run + logf(l_run);
    }
  }

  // ---- pass 2: P = exp(S - m) / l, O += P V. ----
  const int rg = tid / 16, cg = tid % 16;
  float acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) acc[i][j] = 0.f;

  for (int n0 = t_begin; n0 < t_end; n0 += kBN) {
    const int nk = min(kBN, p.sk - n0);
    __syncthreads();
    load_tile<E>(sKV, p.ld_kv, kb + int64_t(n0) * p.k_sr, p.k_sr, nk, p.d, p.d);
    __syncthreads();
    score_tile<E, kLowp>(p, sQ, sKV, sS, m0, n0, rows);
    __syncthreads();
    {
      const float m = sM[pr], l = sL[pr];
      const bool empty = m == -INFINITY || !(l > 0.f);
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        float& s = sS[pr * kLdS + pp + 4 * c];
        float pv = (empty || s == -INFINITY) ? 0.f : expf(s - m) / l;
        if (kLowp) pv = round_to<E>(pv);
        s = pv;
      }
    }
    // V tile, zero-padded to 16 * kCols columns and to kBN rows.
    load_tile<E>(sKV, p.ld_kv, vb + int64_t(n0) * p.v_sr, p.v_sr, nk, p.dv, 16 * kCols);
    __syncthreads();
    const float* s0 = sS + (rg * 4) * kLdS;
    for (int key = 0; key < kBN; ++key) {
      float a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = s0[i * kLdS + key];
      const float* vrow = sKV + key * p.ld_kv + cg;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const float bv = vrow[16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][j] = fmaf(a[i], bv, acc[i][j]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg * 4 + i;
    if (r >= rows) continue;
    float* orow = p.out + ((int64_t(b) * p.sq + m0 + r) * p.hq + h) * p.dv;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = cg + 16 * j;
      if (c < p.dv) orow[c] = kLowp ? round_to<E>(acc[i][j]) : acc[i][j];
    }
  }
}

template <class E, bool kLowp, int kCols>
cudaError_t launch(const KParams& p, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (size_t(kBM) * p.ld_q + size_t(kBN) * p.ld_kv + size_t(kBM) * kLdS + 2 * kBM);
  auto kernel = ref_fwd_kernel<E, kLowp, kCols>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid((p.sq + kBM - 1) / kBM, p.hq, p.batch);
  kernel<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <class E, bool kLowp>
cudaError_t launch_cols(const KParams& p, cudaStream_t stream) {
  if (p.dv <= 64) return launch<E, kLowp, 4>(p, stream);
  if (p.dv <= 128) return launch<E, kLowp, 8>(p, stream);
  return launch<E, kLowp, 16>(p, stream);
}

}  // namespace

cudaError_t forward(const Args& a, Mode mode, cudaStream_t stream) {
  if (a.dtype != DType::kFloat16 && a.dtype != DType::kBFloat16) return cudaErrorInvalidValue;
  if (a.batch < 0 || a.seqlen_q < 0 || a.seqlen_k < 0 || a.heads_q < 1 || a.heads_kv < 1) return cudaErrorInvalidValue;
  if (a.heads_q % a.heads_kv != 0) return cudaErrorInvalidValue;
  if (a.head_dim < 1 || a.head_dim > 256 || a.head_dim_v < 1 || a.head_dim_v > 256) return cudaErrorInvalidValue;
  if (a.out == nullptr) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.seqlen_q == 0) return cudaSuccess;
  if (a.seqlen_k > 0 && (a.q.data == nullptr || a.k.data == nullptr || a.v.data == nullptr))
    return cudaErrorInvalidValue;

  KParams p{};
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out;
  p.lse = a.lse;
  p.batch = a.batch;
  p.sq = a.seqlen_q;
  p.sk = a.seqlen_k;
  p.hq = a.heads_q;
  p.hkv = a.heads_kv;
  p.d = a.head_dim;
  p.dv = a.head_dim_v;
  p.q_sb = a.q.batch_stride, p.q_sr = a.q.row_stride, p.q_sh = a.q.head_stride;
  p.k_sb = a.k.batch_stride, p.k_sr = a.k.row_stride, p.k_sh = a.k.head_stride;
  p.v_sb = a.v.batch_stride, p.v_sr = a.v.row_stride, p.v_sh = a.v.head_stride;
  p.scale = std::isnan(a.softmax_scale) ? 1.f / std::sqrt(float(a.head_dim)) : a.softmax_scale;
  p.softcap = a.softcap > 0.f ? a.softcap : 0.f;
  p.wl = a.window_left < 0 ? -1 : a.window_left;
  p.wr = a.causal ? 0 : (a.window_right < 0 ? -1 : a.window_right);
  const int cols = p.dv <= 64 ? 64 : (p.dv <= 128 ? 128 : 256);
  p.ld_q = p.d + 1;
  p.ld_kv = (p.d > cols ? p.d : cols) + 1;

  const bool lowp = mode == Mode::kLowPrecision;
  if (a.dtype == DType::kBFloat16)
    return lowp ? launch_cols<__nv_bfloat16, true>(p, stream) : launch_cols<__nv_bfloat16, false>(p, stream);
  return lowp ? launch_cols<__half, true>(p, stream) : launch_cols<__half, false>(p, stream);
}

// ===========================================================================
// Backward.
// ===========================================================================
namespace {

constexpr int kGT = 64;          // GEMM tile: kGT x kGT outputs per block
constexpr int kGK = 16;          // GEMM k step
constexpr int kGThreads = 256;   // 16 x 16 threads, 4 x 4 outputs each
constexpr size_t kScratchBudget = size_t(1) << 30;  // default scratch (internal allocation)

template <>
__device__ __forceinline__ float to_f<float>(float x) { return x; }

struct MaskP {
  int sq, sk, wl, wr;  // wl / wr: -1 unbounded (causal folded into wr = 0)
};

__device__ __forceinline__ bool bwd_visible(const MaskP& mk, int i, int j) {
  return visible_at(i, j, mk.sq, mk.sk, mk.wl, mk.wr);
}

// C(z, m, n) = epi(sum_k A(z, m, k) B(z, k, n)) with
//   A(z, m, k) = a[z * a_zs + m * a_rs + k * a_ks],  B(z, k, n) = b[z * b_zs + k * b_ks + n * b_ns].
struct GemmDesc {
  int M, N, K;
  const void* a;
  int64_t a_rs, a_ks, a_zs;
  const void* b;
  int64_t b_ks, b_ns, b_zs;
};

template <class TA, class TB, class Epi>
__global__ void __launch_bounds__(kGThreads) ref_gemm_kernel(const GemmDesc g, const Epi epi) {
  __shared__ __align__(16) float sA[kGK][kGT + 4];
  __shared__ __align__(16) float sB[kGK][kGT + 4];
  const int z = blockIdx.z;
  const int m0 = blockIdx.y * kGT, n0 = blockIdx.x * kGT;
  const TA* A = static_cast<const TA*>(g.a) + int64_t(z) * g.a_zs;
  const TB* B = static_cast<const TB*>(g.b) + int64_t(z) * g.b_zs;
  const int tid = threadIdx.x, rg = tid / 16, cg = tid % 16;
  // Consecutive threads walk the operand's contiguous dimension (coalesced loads).
  const bool a_m_fast = g.a_ks != 1;
  const bool b_n_fast = g.b_ks != 1;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  for (int k0 = 0; k0 < g.K; k0 += kGK) {
    for (int e = tid; e < kGT * kGK; e += kGThreads) {
      const int m = a_m_fast ? e % kGT : e / kGK;
      const int k = a_m_fast ? e / kGT : e % kGK;
      float x = 0.f;
      if (m0 + m < g.M && k0 + k < g.K) x = to_f<TA>(A[int64_t(m0 + m) * g.a_rs + int64_t(k0 + k) * g.a_ks]);
      sA[k][m] = x;
    }
    for (int e = tid; e < kGT * kGK; e += kGThreads) {
      const int n = b_n_fast ? e % kGT : e / kGK;
      const int k = b_n_fast ? e / kGT : e % kGK;
      float x = 0.f;
      if (n0 + n < g.N && k0 + k < g.K) x = to_f<TB>(B[int64_t(k0 + k) * g.b_ks + int64_t(n0 + n) * g.b_ns]);
      sB[k][n] = x;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kGK; ++k) {
      const float4 a4 = *reinterpret_cast<const float4*>(&sA[k][rg * 4]);
      const float a[4] = {a4.x, a4.y, a4.z, a4.w};
      float b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = sB[k][cg + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + rg * 4 + i;
    if (m >= g.M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + cg + 16 * j;
      if (n < g.N) epi(z, m, n, acc[i][j]);
    }
  }
}

// S = Q K^T * scale [rounded] [softcapped, rounded], -inf where masked.
template <class E, bool kLowp>
struct EpiScores {
  float* s;
  int64_t zs, rs;
  float scale, softcap;
  MaskP mk;
  __device__ __forceinline__ void operator()(int z, int m, int n, float acc) const {
    float x = acc * scale;
    if (kLowp) x = round_to<E>(x);
    if (softcap > 0.f) {
      x = softcap * tanhf(x / softcap);
      if (kLowp) x = round_to<E>(x);
    }
    s[int64_t(z) * zs + int64_t(m) * rs + n] = bwd_visible(mk, m, n) ? x : -INFINITY;
  }
};

// C = alpha * acc (+ C when accumulating), rounded when `round` (low-precision mode).
template <class E, bool kLowp>
struct EpiStore {
  float* c;
  int64_t zs, rs;
  float alpha;
  bool accumulate, round;
  __device__ __forceinline__ void operator()(int z, int m, int n, float acc) const {
    float* p = c + int64_t(z) * zs + int64_t(m) * rs + n;
    float x = acc * alpha;
    if (accumulate) x += *p;
    if (kLowp && round) x = round_to<E>(x);
    *p = x;
  }
};

// acc = dP. dS = P (dP - D) (times the softcap derivative), written over S.
template <class E, bool kLowp>
struct EpiDS {
  float* s;        // in: S (post-cap, -inf where masked); out: dS
  const float* p;  // P, same layout
  int64_t zs, rs;
  const float* delta;  // (z, sq): D - dLSE
  int64_t d_zs;
  float softcap;
  __device__ __forceinline__ void operator()(int z, int m, int n, float acc) const {
    const int64_t idx = int64_t(z) * zs + int64_t(m) * rs + n;
    const float sv = s[idx];
    if (sv == -INFINITY) {  // masked: no gradient
      s[idx] = 0.f;
      return;
    }
    float dp = acc;
    if (kLowp) dp = round_to<E>(dp);
    float ds = p[idx] * (dp - delta[int64_t(z) * d_zs + m]);
    if (softcap > 0.f) {
      const float t = sv / softcap;  // tanh of the pre-cap score
      ds *= 1.f - t * t;
    }
    if (kLowp) ds = round_to<E>(ds);
    s[idx] = ds;
  }
};

template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nw ? red[lane] : (kMax ? -INFINITY : 0.f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = kMax ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) red[32] = v;
  }
  __syncthreads();
  const float r = red[32];
  __syncthreads();  // red is reused by the next call
  return r;
}

// One block per (row m, head z): P = exp(S - max) / sum [rounded]; lse.
template <class E, bool kLowp>
__global__ void __launch_bounds__(256) ref_softmax_kernel(const float* S, float* P, int sq, int sk, float* lse,
                                                          int64_t lse_zs) {
  __shared__ float red[33];
  const int m = blockIdx.x, z = blockIdx.y;
  const int64_t row = (int64_t(z) * sq + m) * sk;
  const float* s = S + row;
  float* pr = P + row;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < sk; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = block_reduce<true>(mx, red);
  float l = 0.f;
  if (mx != -INFINITY)
    for (int j = threadIdx.x; j < sk; j += blockDim.x) l += s[j] == -INFINITY ? 0.f : expf(s[j] - mx);
  l = block_reduce<false>(l, red);
  const bool empty = mx == -INFINITY || !(l > 0.f);
  for (int j = threadIdx.x; j < sk; j += blockDim.x) {
    float pv = (empty || s[j] == -INFINITY) ? 0.f : expf(s[j] - mx) / l;
    if (kLowp) pv = round_to<E>(pv);
    pr[j] = pv;
  }
  if (threadIdx.x == 0 && lse != nullptr) lse[int64_t(z) * lse_zs + m] = empty ? -INFINITY : mx + logf(l);
}

// One warp per (row m, head z): D = sum_c dO * O - dlse (fp32).
template <class E>
__global__ void __launch_bounds__(256) ref_delta_kernel(const E* dout, int64_t do_rs, int64_t do_zs, const float* o,
                                                        int64_t o_rs, int64_t o_zs, const float* dlse, int64_t dl_zs,
                                                        float* delta, int sq, int dv) {
  const int lane = threadIdx.x % 32;
  const int m = blockIdx.x * 8 + threadIdx.x / 32, z = blockIdx.y;
  if (m >= sq) return;
  const E* dr = dout + int64_t(z) * do_zs + int64_t(m) * do_rs;
  const float* orow = o + int64_t(z) * o_zs + int64_t(m) * o_rs;
  float acc = 0.f;
  for (int c = lane; c < dv; c += 32) acc = fmaf(to_f<E>(dr[c]), orow[c], acc);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta[int64_t(z) * sq + m] = acc - (dlse != nullptr ? dlse[int64_t(z) * dl_zs + m] : 0.f);
}

__global__ void ref_fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}

template <class TA, class TB, class Epi>
cudaError_t launch_gemm(const GemmDesc& g, const Epi& epi, int nz, cudaStream_t stream) {
  if (g.M <= 0 || g.N <= 0 || nz <= 0) return cudaSuccess;
  const dim3 grid((g.N + kGT - 1) / kGT, (g.M + kGT - 1) / kGT, nz);
  ref_gemm_kernel<TA, TB, Epi><<<grid, kGThreads, 0, stream>>>(g, epi);
  return cudaGetLastError();
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Scratch regions for `hc` query heads processed together.
struct ScratchLayout {
  size_t s_off = 0, p_off = 0, o_off = 0, d_off = 0, total = 0;
};

ScratchLayout scratch_layout(const BwdArgs& a, int hc) {
  const size_t sqsk = size_t(a.seqlen_q) * size_t(a.seqlen_k);
  ScratchLayout l;
  l.s_off = 0;
  l.p_off = l.s_off + align256(size_t(hc) * sqsk * 4);
  l.o_off = l.p_off + align256(size_t(hc) * sqsk * 4);
  const size_t o_bytes = a.out != nullptr ? 0 : align256(size_t(hc) * a.seqlen_q * a.head_dim_v * 4);
  l.d_off = l.o_off + o_bytes;
  l.total = l.d_off + align256(size_t(hc) * a.seqlen_q * 4);
  return l;
}

// Query heads per chunk: the most (<= heads_q / heads_kv) whose scratch fits `budget`.
int chunk_heads(const BwdArgs& a, size_t budget) {
  const int group = a.heads_q / a.heads_kv;
  int hc = 1;
  while (hc < group && scratch_layout(a, hc + 1).total <= budget) ++hc;
  return hc;
}

bool bwd_args_ok(const BwdArgs& a) {
  if (a.dtype != DType::kFloat16 && a.dtype != DType::kBFloat16) return false;
  if (a.batch < 0 || a.seqlen_q < 0 || a.seqlen_k < 0 || a.heads_q < 1 || a.heads_kv < 1) return false;
  if (a.heads_q % a.heads_kv != 0) return false;
  if (a.head_dim < 1 || a.head_dim > 256 || a.head_dim_v < 1 || a.head_dim_v > 256) return false;
  return true;
}

bool bwd_is_empty(const BwdArgs& a) { return a.batch == 0 || a.seqlen_q == 0 || a.seqlen_k == 0; }

#define GPUREF_TRY(expr)                 \
  do {                                   \
    const cudaError_t _e = (expr);       \
    if (_e != cudaSuccess) return _e;    \
  } while (0)

template <class E, bool kLowp>
cudaError_t run_backward(const BwdArgs& a, char* scratch, int hc, cudaStream_t st) {
  const int sq = a.seqlen_q, sk = a.seqlen_k, hq = a.heads_q, hkv = a.heads_kv, d = a.head_dim, dv = a.head_dim_v;
  const int group = hq / hkv;
  const float scale = std::isnan(a.softmax_scale) ? 1.f / std::sqrt(float(d)) : a.softmax_scale;
  const float cap = a.softcap > 0.f ? a.softcap : 0.f;
  MaskP mk;
  mk.sq = sq, mk.sk = sk;
  mk.wl = a.window_left < 0 ? -1 : a.window_left;
  mk.wr = a.causal ? 0 : (a.window_right < 0 ? -1 : a.window_right);
  const int64_t sqsk = int64_t(sq) * sk;
  const ScratchLayout lay = scratch_layout(a, hc);
  float* S = reinterpret_cast<float*>(scratch + lay.s_off);
  float* P = reinterpret_cast<float*>(scratch + lay.p_off);
  float* Osc = reinterpret_cast<float*>(scratch + lay.o_off);
  float* D = reinterpret_cast<float*>(scratch + lay.d_off);
  const E* q = static_cast<const E*>(a.q.data);
  const E* k = static_cast<const E*>(a.k.data);
  const E* v = static_cast<const E*>(a.v.data);
  const E* dout = static_cast<const E*>(a.dout.data);

  for (int b = 0; b < a.batch; ++b)
    for (int kh = 0; kh < hkv; ++kh)
      for (int h0 = kh * group; h0 < (kh + 1) * group; h0 += hc) {
        const int n = std::min(hc, (kh + 1) * group - h0);
        const E* qb = q + b * a.q.batch_stride + h0 * a.q.head_stride;  // + z * head_stride
        const E* kb = k + b * a.k.batch_stride + kh * a.k.head_stride;
        const E* vb = v + b * a.v.batch_stride + kh * a.v.head_stride;
        const E* dob = dout + b * a.dout.batch_stride + h0 * a.dout.head_stride;

        // 1. S = Q K^T * scale, masked.
        {
          const GemmDesc g{sq, sk, d, qb, a.q.row_stride, 1, a.q.head_stride, kb, 1, a.k.row_stride, 0};
          const EpiScores<E, kLowp> epi{S, sqsk, sk, scale, cap, mk};
          GPUREF_TRY((launch_gemm<E, E>(g, epi, n, st)));
        }
        // 2. P = softmax(S), lse.
        float* lse_b = a.lse != nullptr ? a.lse + (int64_t(b) * hq + h0) * sq : nullptr;
        ref_softmax_kernel<E, kLowp><<<dim3(sq, n), 256, 0, st>>>(S, P, sq, sk, lse_b, sq);
        GPUREF_TRY(cudaGetLastError());
        // 3. O = P V.
        float* O = Osc;
        int64_t o_rs = dv, o_zs = int64_t(sq) * dv;
        if (a.out != nullptr) {
          O = a.out + (int64_t(b) * sq * hq + h0) * dv;
          o_rs = int64_t(hq) * dv;
          o_zs = dv;
        }
        {
          const GemmDesc g{sq, dv, sk, P, sk, 1, sqsk, vb, a.v.row_stride, 1, 0};
          const EpiStore<E, kLowp> epi{O, o_zs, o_rs, 1.f, false, true};
          GPUREF_TRY((launch_gemm<float, E>(g, epi, n, st)));
        }
        // 4. D = rowsum(dO * O) - dlse.
        const float* dl = a.dlse != nullptr ? a.dlse + (int64_t(b) * hq + h0) * sq : nullptr;
        ref_delta_kernel<E><<<dim3((sq + 7) / 8, n), 256, 0, st>>>(dob, a.dout.row_stride, a.dout.head_stride, O, o_rs,
                                                                   o_zs, dl, sq, D, sq, dv);
        GPUREF_TRY(cudaGetLastError());
        // 5. dP = dO V^T; dS = P (dP - D), over S.
        {
          const GemmDesc g{sq, sk, dv, dob, a.dout.row_stride, 1, a.dout.head_stride, vb, 1, a.v.row_stride, 0};
          const EpiDS<E, kLowp> epi{S, P, sqsk, sk, D, sq, cap};
          GPUREF_TRY((launch_gemm<E, E>(g, epi, n, st)));
        }
        // 6. dQ = dS K * scale.
        {
          float* dqb = a.dq + (int64_t(b) * sq * hq + h0) * d;
          const GemmDesc g{sq, d, sk, S, sk, 1, sqsk, kb, a.k.row_stride, 1, 0};
          const EpiStore<E, kLowp> epi{dqb, d, int64_t(hq) * d, scale, false, true};
          GPUREF_TRY((launch_gemm<float, E>(g, epi, n, st)));
        }
        // 7. dK += dS^T Q * scale, dV += P^T dO, summed over the heads of kv head kh
        //    (fp32; rounded once after the last head in low-precision mode).
        for (int z = 0; z < n; ++z) {
          const int h = h0 + z;
          const bool first = h == kh * group, last = h == (kh + 1) * group - 1;
          {
            float* dkb = a.dk + (int64_t(b) * sk * hkv + kh) * d;
            const GemmDesc g{sk, d, sq, S + z * sqsk, 1, sk, 0, qb + z * a.q.head_stride, a.q.row_stride, 1, 0};
            const EpiStore<E, kLowp> epi{dkb, 0, int64_t(hkv) * d, scale, !first, last};
            GPUREF_TRY((launch_gemm<float, E>(g, epi, 1, st)));
          }
          {
            float* dvb = a.dv + (int64_t(b) * sk * hkv + kh) * dv;
            const GemmDesc g{sk, dv, sq, P + z * sqsk, 1, sk, 0, dob + z * a.dout.head_stride, a.dout.row_stride, 1, 0};
            const EpiStore<E, kLowp> epi{dvb, 0, int64_t(hkv) * dv, 1.f, !first, last};
            GPUREF_TRY((launch_gemm<float, E>(g, epi, 1, st)));
          }
        }
      }
  return cudaSuccess;
}

}  // namespace

size_t backward_scratch_bytes(const BwdArgs& a) {
  if (!bwd_args_ok(a) || bwd_is_empty(a)) return 0;
  return scratch_layout(a, chunk_heads(a, kScratchBudget)).total;
}

cudaError_t backward(const BwdArgs& a, Mode mode, cudaStream_t stream) {
  if (!bwd_args_ok(a)) return cudaErrorInvalidValue;
  if (a.batch == 0) return cudaSuccess;
  const size_t nq = size_t(a.batch) * a.seqlen_q * a.heads_q * a.head_dim;
  const size_t nk = size_t(a.batch) * a.seqlen_k * a.heads_kv * a.head_dim;
  const size_t nv = size_t(a.batch) * a.seqlen_k * a.heads_kv * a.head_dim_v;
  if ((nq > 0 && a.dq == nullptr) || (nk > 0 && a.dk == nullptr) || (nv > 0 && a.dv == nullptr))
    return cudaErrorInvalidValue;
  if (bwd_is_empty(a)) {
    // No keys: every row fully masked (dq = 0, out = 0, lse = -inf). No queries: dk = dv = 0.
    if (nq > 0) GPUREF_TRY(cudaMemsetAsync(a.dq, 0, nq * 4, stream));
    if (nk > 0) GPUREF_TRY(cudaMemsetAsync(a.dk, 0, nk * 4, stream));
    if (nv > 0) GPUREF_TRY(cudaMemsetAsync(a.dv, 0, nv * 4, stream));
    const size_t no = size_t(a.batch) * a.seqlen_q * a.heads_q * a.head_dim_v;
    if (a.out != nullptr && no > 0) GPUREF_TRY(cudaMemsetAsync(a.out, 0, no * 4, stream));
    const int64_t nl = int64_t(a.batch) * a.heads_q * a.seqlen_q;
    if (a.lse != nullptr && nl > 0) {
      ref_fill_kernel<<<int((nl + 255) / 256 < 1024 ? (nl + 255) / 256 : 1024), 256, 0, stream>>>(a.lse, nl, -INFINITY);
      GPUREF_TRY(cudaGetLastError());
    }
    return cudaSuccess;
  }
  if (a.q.data == nullptr || a.k.data == nullptr || a.v.data == nullptr || a.dout.data == nullptr)
    return cudaErrorInvalidValue;

  int hc;
  char* scratch = nullptr;
  bool owned = false;
  if (a.scratch != nullptr) {
    if (scratch_layout(a, 1).total > a.scratch_bytes) return cudaErrorInvalidValue;
    hc = chunk_heads(a, a.scratch_bytes);
    scratch = static_cast<char*>(a.scratch);
  } else {
    hc = chunk_heads(a, kScratchBudget);
    void* ptr = nullptr;
    GPUREF_TRY(cudaMallocAsync(&ptr, scratch_layout(a, hc).total, stream));
    scratch = static_cast<char*>(ptr);
    owned = true;
  }

  const bool lowp = mode == Mode::kLowPrecision;
  cudaError_t e;
  if (a.dtype == DType::kBFloat16)
    e = lowp ? run_backward<__nv_bfloat16, true>(a, scratch, hc, stream)
             : run_backward<__nv_bfloat16, false>(a, scratch, hc, stream);
  else
    e = lowp ? run_backward<__half, true>(a, scratch, hc, stream) : run_backward<__half, false>(a, scratch, hc, stream);
  if (owned) {
    const cudaError_t f = cudaFreeAsync(scratch, stream);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

#undef GPUREF_TRY

}  // namespace flash3::gpuref
