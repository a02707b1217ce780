/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright (c) 2026 the flash3 authors
 *
 * flash3 from C, without torch: bf16 attention forward and backward through the C ABI
 * (flash3/flash3_c.h) on memory from the CUDA runtime, checked against a float64 CPU
 * reference written here. Causal GQA: batch 2, 4 query heads over 2 KV heads, 96 queries over
 * 160 keys (the causal mask is aligned to the bottom-right corner, as FlashAttention-3's).
 *
 * Exit code 0 when every result is within tolerance, or with a "skipped: ..." line when this
 * machine has no GPU flash3 runs on (Hopper, sm_90) or the build has no bf16 kernels for a
 * forward and backward; 1 on a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <flash3/flash3_c.h>

enum { B = 2, HQ = 4, HK = 2, SQ = 96, SK = 160 };

/* bf16 <-> float (round to nearest even), the storage the kernels read and write. */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform_pm1(void) { /* xorshift64*, uniform in [-1, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (float)((rng_state * 0x2545f4914f6cdd1dull) >> 40) / (float)(1u << 23) - 1.0f;
}

/* A contiguous (b, s, h, d) bf16 tensor description (strides in elements). */
static flash3_tensor tensor4(void* data, int32_t dtype, int64_t b, int64_t s, int64_t h, int64_t d) {
  flash3_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
  t.stride[3] = 1, t.stride[2] = d, t.stride[1] = h * d, t.stride[0] = s * h * d;
  return t;
}

/* (b, h, s) fp32 softmax_lse. */
static flash3_tensor lse_tensor(void* data) {
  flash3_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = FLASH3_FP32;
  t.ndim = 3;
  t.shape[0] = B, t.shape[1] = HQ, t.shape[2] = SQ;
  t.stride[2] = 1, t.stride[1] = SQ, t.stride[0] = (int64_t)HQ * SQ;
  return t;
}

static size_t idx(int b, int s, int h, int d, int S, int H, int D) {
  return (((size_t)b * S + s) * H + h) * D + d;
}

/* float64 reference: out, lse and the gradients dq, dk, dv of sum(out * dout), causal, GQA. */
static void reference(int D, const float* q, const float* k, const float* v, const float* dout, double* out,
                      double* lse, double* dq, double* dk, double* dv) {
  const double scale = 1.0 / sqrt((double)D);
  double* p = malloc(sizeof(double) * SK);
  double* dp = malloc(sizeof(double) * SK);
  memset(dk, 0, sizeof(double) * B * SK * HK * D);
  memset(dv, 0, sizeof(double) * B * SK * HK * D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HQ; ++h) {
      const int hk = h / (HQ / HK);
      for (int i = 0; i < SQ; ++i) {
        const int last = i + SK - SQ; /* bottom-right causal: keys j <= i + SK - SQ */
        double m = -INFINITY, l = 0.0;
        for (int j = 0; j <= last; ++j) {
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += (double)q[idx(b, i, h, d, SQ, HQ, D)] * k[idx(b, j, hk, d, SK, HK, D)];
          p[j] = s * scale;
          if (p[j] > m) m = p[j];
        }
        for (int j = 0; j <= last; ++j) l += (p[j] = exp(p[j] - m));
        lse[((size_t)b * HQ + h) * SQ + i] = m + log(l);
        for (int j = 0; j <= last; ++j) p[j] /= l;
        double rowsum = 0.0; /* D_i = sum_d dout * out */
        for (int d = 0; d < D; ++d) {
          double o = 0.0;
          for (int j = 0; j <= last; ++j) o += p[j] * v[idx(b, j, hk, d, SK, HK, D)];
          out[idx(b, i, h, d, SQ, HQ, D)] = o;
          rowsum += o * dout[idx(b, i, h, d, SQ, HQ, D)];
        }
        for (int j = 0; j <= last; ++j) {
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += (double)dout[idx(b, i, h, d, SQ, HQ, D)] * v[idx(b, j, hk, d, SK, HK, D)];
          dp[j] = p[j] * (s - rowsum); /* dS = P (dP - D), before the scale */
        }
        for (int d = 0; d < D; ++d) {
          double g = 0.0;
          for (int j = 0; j <= last; ++j) {
            g += dp[j] * k[idx(b, j, hk, d, SK, HK, D)];
            dk[idx(b, j, hk, d, SK, HK, D)] += dp[j] * scale * q[idx(b, i, h, d, SQ, HQ, D)];
            dv[idx(b, j, hk, d, SK, HK, D)] += p[j] * dout[idx(b, i, h, d, SQ, HQ, D)];
          }
          dq[idx(b, i, h, d, SQ, HQ, D)] = g * scale;
        }
      }
    }
  free(p);
  free(dp);
}

/* max |got - want| over n entries, and whether it is within rtol * max|want| + atol. */
static int check(const char* name, const uint16_t* got16, const float* got32, const double* want, size_t n,
                 double rtol, double atol) {
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got16 ? from_bf16(got16[i]) : got32[i];
    const double e = fabs(g - want[i]);
    if (!(e <= err)) err = e; /* NaN counts as the largest error */
    if (fabs(want[i]) > mag) mag = fabs(want[i]);
  }
  const double bound = rtol * mag + atol;
  const int ok = err <= bound;
  printf("  %-4s max error %.3e (bound %.3e, max |ref| %.3e) %s\n", name, err, bound, mag, ok ? "ok" : "FAIL");
  return ok;
}

#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#define CHECK_FLASH3(call)                                                               \
  do {                                                                                  \
    if ((call) != FLASH3_OK) {                                                          \
      fprintf(stderr, "%s failed: %s\n", #call, flash3_last_error());                   \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int main(void) {
  printf("flash3 %s (C ABI; headers %s)\n", flash3_version(), FLASH3_VERSION_STRING);
  if (!flash3_device_is_supported()) {
    printf("skipped: no GPU flash3 runs on (%s)\n", flash3_last_error());
    return 0;
  }
  static const int dims[] = {128, 64, 96, 192, 256};
  int D = 0;
  for (size_t i = 0; i < sizeof dims / sizeof dims[0] && !D; ++i)
    if (flash3_forward_is_built(FLASH3_BF16, dims[i], dims[i]) && flash3_backward_is_built(FLASH3_BF16, dims[i], dims[i]))
      D = dims[i];
  if (!D) {
    printf("skipped: this build has no bf16 forward + backward kernels\n");
    return 0;
  }
  printf("bf16, batch %d, %d query heads over %d KV heads, %d queries x %d keys, head dim %d, causal\n", B, HQ, HK,
         SQ, SK, D);

  const size_t nq = (size_t)B * SQ * HQ * D, nk = (size_t)B * SK * HK * D, nl = (size_t)B * HQ * SQ;
  uint16_t *hq = malloc(2 * nq), *hk = malloc(2 * nk), *hv = malloc(2 * nk), *hdo = malloc(2 * nq);
  float *fq = malloc(4 * nq), *fk = malloc(4 * nk), *fv = malloc(4 * nk), *fdo = malloc(4 * nq);
  for (size_t i = 0; i < nq; ++i) fq[i] = from_bf16(hq[i] = to_bf16(uniform_pm1()));
  for (size_t i = 0; i < nk; ++i) fk[i] = from_bf16(hk[i] = to_bf16(uniform_pm1()));
  for (size_t i = 0; i < nk; ++i) fv[i] = from_bf16(hv[i] = to_bf16(uniform_pm1()));
  for (size_t i = 0; i < nq; ++i) fdo[i] = from_bf16(hdo[i] = to_bf16(uniform_pm1()));

  void *dq_in, *dk_in, *dv_in, *dout, *dout_grad, *dlse, *dgq, *dgk, *dgv;
  CUDA_OK(cudaMalloc(&dq_in, 2 * nq));
  CUDA_OK(cudaMalloc(&dk_in, 2 * nk));
  CUDA_OK(cudaMalloc(&dv_in, 2 * nk));
  CUDA_OK(cudaMalloc(&dout, 2 * nq));
  CUDA_OK(cudaMalloc(&dout_grad, 2 * nq));
  CUDA_OK(cudaMalloc(&dlse, 4 * nl));
  CUDA_OK(cudaMalloc(&dgq, 2 * nq));
  CUDA_OK(cudaMalloc(&dgk, 2 * nk));
  CUDA_OK(cudaMalloc(&dgv, 2 * nk));
  CUDA_OK(cudaMemcpy(dq_in, hq, 2 * nq, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk_in, hk, 2 * nk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv_in, hv, 2 * nk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dout_grad, hdo, 2 * nq, cudaMemcpyHostToDevice));

  const flash3_tensor q = tensor4(dq_in, FLASH3_BF16, B, SQ, HQ, D), k = tensor4(dk_in, FLASH3_BF16, B, SK, HK, D),
                      v = tensor4(dv_in, FLASH3_BF16, B, SK, HK, D), o = tensor4(dout, FLASH3_BF16, B, SQ, HQ, D),
                      d_o = tensor4(dout_grad, FLASH3_BF16, B, SQ, HQ, D), lse = lse_tensor(dlse),
                      gq = tensor4(dgq, FLASH3_BF16, B, SQ, HQ, D), gk = tensor4(dgk, FLASH3_BF16, B, SK, HK, D),
                      gv = tensor4(dgv, FLASH3_BF16, B, SK, HK, D);
  flash3_options opts = flash3_default_options();
  opts.causal = 1;

  /* Forward, then backward with scratch allocated by the library (workspace NULL), on the
   * legacy default stream (NULL). */
  CHECK_FLASH3(flash3_forward(&q, &k, &v, &o, &lse, &opts, NULL));
  CHECK_FLASH3(flash3_backward(&q, &k, &v, &o, &d_o, &lse, NULL, &gq, &gk, &gv, &opts, NULL, 0, NULL));
  CUDA_OK(cudaDeviceSynchronize());

  uint16_t *ho = malloc(2 * nq), *hgq = malloc(2 * nq), *hgk = malloc(2 * nk), *hgv = malloc(2 * nk);
  float* hl = malloc(4 * nl);
  CUDA_OK(cudaMemcpy(ho, dout, 2 * nq, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hl, dlse, 4 * nl, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hgq, dgq, 2 * nq, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hgk, dgk, 2 * nk, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hgv, dgv, 2 * nk, cudaMemcpyDeviceToHost));

  double *ro = malloc(8 * nq), *rl = malloc(8 * nl), *rq = malloc(8 * nq), *rk = malloc(8 * nk), *rv = malloc(8 * nk);
  reference(D, fq, fk, fv, fdo, ro, rl, rq, rk, rv);
  /* bf16 outputs: a few units of bf16 rounding (2^-8 relative) at the results' magnitude. */
  int ok = 1;
  ok &= check("out", ho, NULL, ro, nq, 2e-2, 1e-3);
  ok &= check("lse", NULL, hl, rl, nl, 1e-4, 1e-3);
  ok &= check("dq", hgq, NULL, rq, nq, 2e-2, 1e-3);
  ok &= check("dk", hgk, NULL, rk, nk, 2e-2, 1e-3);
  ok &= check("dv", hgv, NULL, rv, nk, 2e-2, 1e-3);
  printf("%s\n", ok ? "PASS" : "FAIL");

  cudaFree(dq_in), cudaFree(dk_in), cudaFree(dv_in), cudaFree(dout), cudaFree(dout_grad), cudaFree(dlse);
  cudaFree(dgq), cudaFree(dgk), cudaFree(dgv);
  free(hq), free(hk), free(hv), free(hdo), free(fq), free(fk), free(fv), free(fdo);
  free(ho), free(hgq), free(hgk), free(hgv), free(hl), free(ro), free(rl), free(rq), free(rk), free(rv);
  return ok ? 0 : 1;
}
