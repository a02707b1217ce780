// fp32 GPU reference attention forward; see gpu_reference.cuh for the contract.
//
// One thread block computes a tile of kBM query rows of one (batch, head) in two
// passes over the visible key tiles (kBN keys each), with exact (not online-
// rescaled) probabilities in the second pass so the low-precision mode can round
// P exactly like a plain implementation does:
//   pass 1: S = Q K^T * scale (fp32)  ->  row max m and row sum l = sum exp(S - m)
//   pass 2: S again, P = exp(S - m) / l, O += P V.
// Tiles are staged in shared memory as fp32 (padded rows: no bank conflicts).
// Simple and exact rather than fast, but it still runs at a few TFLOP/s, which
// keeps the full GPU test matrix to seconds of reference time.
#include "gpu_reference.cuh"

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

__device__ __forceinline__ bool visible(const KParams& p, int i, int j) {
  const int diag = i + p.sk - p.sq;
  if (p.wl >= 0 && j < diag - p.wl) return false;
  if (p.wr >= 0 && j > diag + p.wr) return false;
  return true;
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

  // Visible key range of the whole tile (tiles outside contribute nothing).
  const int diag_lo = m0 + p.sk - p.sq, diag_hi = m0 + rows - 1 + p.sk - p.sq;
  int jlo = 0, jhi = p.sk - 1;
  if (p.wl >= 0) jlo = max(jlo, diag_lo - p.wl);
  if (p.wr >= 0) jhi = min(jhi, diag_hi + p.wr);
  const int t_begin = jlo <= jhi ? (jlo / kBN) * kBN : 0;
  const int t_end = jlo <= jhi ? jhi + 1 : 0;

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
  p.scale = (a.softmax_scale > 0.f) ? a.softmax_scale : 1.f / std::sqrt(float(a.head_dim));
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

}  // namespace flash3::gpuref
