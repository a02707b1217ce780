// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors

/* flash3 C ABI: the same entry points as flash3.h, for FFI (ctypes, Rust, ...).
 * Every function returns a flash3_status (0 = ok); the message of the last
 * failure on the calling thread is returned by flash3_last_error(). */
#ifndef FLASH3_C_H_
#define FLASH3_C_H_

#include <stddef.h>
#include <stdint.h>

#include "flash3/version.h" /* FLASH3_VERSION_MAJOR / MINOR / PATCH / STRING / NUMBER */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FLASH3_OK = 0,
  FLASH3_INVALID_ARGUMENT = 1,
  FLASH3_NOT_SUPPORTED = 2,
  FLASH3_CUDA_ERROR = 3,
  FLASH3_INTERNAL = 4
} flash3_status;

typedef enum { FLASH3_FP16 = 0, FLASH3_BF16 = 1, FLASH3_FP32 = 2, FLASH3_FP8_E4M3 = 3 } flash3_dtype;

typedef struct {
  void* data;
  int32_t dtype; /* flash3_dtype */
  int32_t ndim;
  int64_t shape[4];
  int64_t stride[4]; /* in elements */
} flash3_tensor;

/* Options. Initialise with flash3_default_options(), then set fields: it sets
 * struct_size, which lets later versions add fields at the end without
 * breaking callers built against this header (a struct_size of 0, e.g. from
 * memset, is rejected). Mask rules as in flash3.h (FlashAttention-3's). */
typedef struct {
  uint32_t struct_size; /* sizeof(flash3_options), set by flash3_default_options() */
  float softmax_scale;  /* NaN: 1/sqrt(head_dim); otherwise used as given (finite, >= 0) */
  int32_t causal;       /* forces window_right = 0 */
  int32_t window_left;  /* < 0: unbounded */
  int32_t window_right; /* < 0: unbounded */
  float softcap;        /* 0: off */
  int32_t deterministic;
  /* Variable length (forward and backward), as in flash3.h: int32 device arrays of
   * num_sequences + 1 prefix sums, both or neither; q/k/v/out are then
   * (total, heads, head_dim) and lse (heads, total_q). */
  const int32_t* cu_seqlens_q; /* NULL: fixed length */
  const int32_t* cu_seqlens_k;
  int32_t max_seqlen_q;        /* >= 0 with cu_seqlens: the longest sequence */
  int32_t max_seqlen_k;
  /* Fields added after the first layout above: a caller's struct_size says
   * whether they are present. */
  int32_t num_sequences;       /* >= 0: number of sequences (cu_seqlens_* have num_sequences + 1 entries) */
  const int32_t* seqused_q;    /* NULL, or int32 device array of num_sequences real-token counts (needs cu_seqlens_q) */
  const int32_t* seqused_k;    /* NULL, or as seqused_q for the keys (needs cu_seqlens_k) */
  int32_t pack_gqa;            /* forward only: -1 heuristic, 0 off, 1 on (PackGQA, as in flash3.h) */
  /* Split-KV, forward only (as in flash3.h): 1 no split, 0 heuristic, n in
   * [2, 256] at most n splits. */
  int32_t num_splits;
  /* Set to 0 (flash3_default_options does). It keeps sizeof(flash3_options)
   * apart from that of the layout ending at pack_gqa (88 bytes on LP64,
   * padding included), whose callers' struct_size would otherwise claim
   * num_splits, which sits in that layout's padding. Not read. */
  int32_t reserved0;
} flash3_options;

/* Defaults: struct_size set, scale from head_dim (NaN), no mask, no softcap,
 * fixed length (cu_seqlens / seqused NULL, max_seqlen and num_sequences 0),
 * pack_gqa -1 (heuristic), num_splits 1 (no split). */
flash3_options flash3_default_options(void);

/* lse may be NULL (not stored). opts may be NULL (defaults). stream is a
 * cudaStream_t of the current device (NULL: legacy default stream). Scratch,
 * where the call needs any, is allocated internally (stream-ordered), as
 * flash3_forward_with_workspace with workspace NULL. */
flash3_status flash3_forward(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                             const flash3_tensor* out, const flash3_tensor* lse,
                             const flash3_options* opts, void* stream);

/* flash3_forward with caller scratch: workspace may be NULL (allocated
 * internally, stream-ordered); otherwise at least flash3_forward_workspace_size()
 * bytes, 256-byte aligned (FLASH3_INVALID_ARGUMENT before anything is launched
 * if not), written by the kernels and not in use by other streams during the call. */
flash3_status flash3_forward_with_workspace(const flash3_tensor* q, const flash3_tensor* k,
                                            const flash3_tensor* v, const flash3_tensor* out,
                                            const flash3_tensor* lse, const flash3_options* opts,
                                            void* workspace, size_t workspace_bytes, void* stream);

/* FP8 forward (FlashAttention-3's FP8 flash_attn_func; flash3::ForwardArgs
 * in flash3.h): q, k, v FLASH3_FP8_E4M3, out FLASH3_BF16; q_descale,
 * k_descale, v_descale NULL (1) or FLASH3_FP32 tensors, each either 2-d
 * (batch, heads_kv) or block scales: q_descale (batch, heads_q,
 * ceil(seqlen_q / 128)), k_descale / v_descale (batch, heads_kv,
 * ceil(seqlen_k / 128)), one per 128 tokens of each head. Otherwise as
 * flash3_forward_with_workspace. */
flash3_status flash3_forward_fp8(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                 const flash3_tensor* out, const flash3_tensor* lse, const flash3_tensor* q_descale,
                                 const flash3_tensor* k_descale, const flash3_tensor* v_descale,
                                 const flash3_options* opts, void* workspace, size_t workspace_bytes, void* stream);

/* FP8 quantization for flash3_forward_fp8 (flash3::quantize_fp8 in flash3.h):
 * x (batch, seqlen, heads, head_dim) FLASH3_FP16 / FLASH3_BF16 -> out (x's
 * shape) FLASH3_FP8_E4M3, out = round(x / descale), and descale FLASH3_FP32,
 * contiguous, amax / 448 of each group: (batch, heads / heads_per_scale), or
 * with block_scales != 0 (batch, heads, ceil(seqlen / 128)). hadamard != 0
 * rotates each row first (x -> x (1/sqrt d) H D, signs from hadamard_seed; q
 * and k with one seed, never v). Rows 16-byte aligned. */
flash3_status flash3_quantize_fp8(const flash3_tensor* x, const flash3_tensor* out, const flash3_tensor* descale,
                                  int heads_per_scale, int block_scales, int hadamard, uint64_t hadamard_seed,
                                  void* stream);
/* flash3_quantize_fp8 with rotary applied to each row first (before the
 * rotation), as flash3::QuantizeFp8Args::rotary_cos / rotary_sin: token s
 * uses row s of the tables, (seqlen_ro >= seqlen, rotary_dim / 2) in x's
 * dtype, unit last stride, 16-byte rows; rotary_dim = 2 x their columns, a
 * multiple of 16 up to head_dim (a power of two with rotary_interleaved = 0:
 * the halves (i, i + rotary_dim / 2) rotate together; 1: pairs (2i, 2i + 1)).
 * NULL tables: none (flash3_quantize_fp8). */
flash3_status flash3_quantize_fp8_rotary(const flash3_tensor* x, const flash3_tensor* out,
                                         const flash3_tensor* descale, int heads_per_scale, int block_scales,
                                         int hadamard, uint64_t hadamard_seed, const flash3_tensor* rotary_cos,
                                         const flash3_tensor* rotary_sin, int rotary_interleaved, void* stream);

/* Bytes of forward scratch the call needs, from the shapes of q, k, v and opts
 * (0: none, as for most fixed-length calls; varlen calls need their
 * per-sequence maps). 0 also for malformed shapes and a bad opts->struct_size. */
size_t flash3_forward_workspace_size(const flash3_tensor* q, const flash3_tensor* k,
                                     const flash3_tensor* v, const flash3_options* opts);

/* dlse may be NULL. workspace may be NULL (allocated internally, stream-ordered). */
flash3_status flash3_backward(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                              const flash3_tensor* out, const flash3_tensor* dout,
                              const flash3_tensor* lse, const flash3_tensor* dlse,
                              const flash3_tensor* dq, const flash3_tensor* dk, const flash3_tensor* dv,
                              const flash3_options* opts, void* workspace, size_t workspace_bytes,
                              void* stream);

size_t flash3_backward_workspace_size(const flash3_tensor* q, const flash3_tensor* k,
                                      const flash3_tensor* v, const flash3_options* opts);

/* Split-KV combine (flash3::combine in flash3.h; FlashAttention-3's
 * flash_attn_combine): merges the fp32 partial outputs and LSEs of num_splits
 * KV splits,  lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s;
 * a split at -inf weighs 0 (its partial output is not read), a row with every
 * split at -inf gets out = 0 and lse = -inf.
 *
 * flash3_tensor holds 4 dimensions, so the split dimension is passed apart:
 *   out_partial  the 4-d (batch, seqlen, heads, head_dim) fp32 view of split 0;
 *                split s starts out_partial_split_stride elements after it.
 *                Unit stride in head_dim, 16-byte aligned, the other strides
 *                (split stride included) multiples of 4 elements.
 *   lse_partial  the 3-d (batch, seqlen, heads) fp32 view of split 0 (natural
 *                log); split s starts lse_partial_split_stride elements after it.
 *   num_splits   in [1, 256] (a stride is ignored when num_splits is 1).
 *   out          (batch, seqlen, heads, head_dim), written: FLASH3_BF16,
 *                FLASH3_FP16 or FLASH3_FP32, unit stride in head_dim.
 *   lse          NULL (not stored) or (batch, seqlen, heads) fp32, written.
 * head_dim in [4, 256], a multiple of 4. Split strides >= 0. Outputs must not
 * overlap the inputs or each other. stream: a cudaStream_t of the current
 * device (NULL: legacy default stream). Nothing is launched for batch, seqlen
 * or heads 0. Messages name the 5-d (num_splits, batch, seqlen, heads, head_dim)
 * view the library validates: out_partial.shape[i + 1] / stride[i + 1] is the C
 * view's shape[i] / stride[i], and out_partial.stride[0] the split stride
 * (likewise for lse_partial). */
flash3_status flash3_combine(const flash3_tensor* out_partial, int64_t out_partial_split_stride,
                             const flash3_tensor* lse_partial, int64_t lse_partial_split_stride,
                             int32_t num_splits, const flash3_tensor* out, const flash3_tensor* lse,
                             void* stream);

/* Validation only; nothing is launched. */
/* KV-cache attention (flash3::forward_kvcache in flash3.h; FlashAttention-3's
 * flash_attn_with_kvcache): q (b, sq, hq, d), or (total_q, hq, d) with
 * opts->cu_seqlens_q, attends to each sequence's cache
 * entry after the optional new rows k_new / v_new were appended at
 * cache_seqlens (rotated, with q, when rotary_cos / rotary_sin are given).
 * Tensors NULL where absent (q, k_cache, v_cache, out required); the int32
 * arrays are device memory of b entries, NULL where absent. Initialise with
 * flash3_default_kvcache_args() (sets struct_size, rotary_interleaved 1). */
typedef struct {
  uint32_t struct_size; /* sizeof(flash3_kvcache_args) */
  int32_t rotary_interleaved;
  const flash3_tensor* q;
  const flash3_tensor* k_cache;
  const flash3_tensor* v_cache;
  const flash3_tensor* k_new;
  const flash3_tensor* v_new;
  const flash3_tensor* rotary_cos;
  const flash3_tensor* rotary_sin;
  const flash3_tensor* out;
  const flash3_tensor* lse; /* (b, hq, sq) with batch stride sq, row stride 1 */
  const int32_t* cache_seqlens;
  const int32_t* cache_batch_idx;
  const int32_t* cache_leftpad;
  const int32_t* rotary_seqlens;
  /* Paged KV (flash3::KVCacheArgs::page_table): (b, page_table_max_pages)
   * int32, row b at page_table + b * page_table_batch_stride; NULL: contiguous
   * caches. Added after rotary_seqlens: callers built against the shorter
   * struct (smaller struct_size) get NULL. */
  const int32_t* page_table;
  int64_t page_table_batch_stride;
  int32_t page_table_max_pages;
  /* Added after page_table_max_pages (callers built against the shorter
   * struct get the defaults, 0 / NULL): the rows of page_table (the cache
   * entries cache_batch_idx picks; 0: b), and FlashAttention-3's
   * cu_seqlens_k_new (variable-length new rows: k_new / v_new (total_new,
   * hkv, d[v]), b + 1 int32 prefix sums; NULL: (b, s_new, hkv, d[v])).
   * Variable-length queries come through opts (cu_seqlens_q, max_seqlen_q,
   * num_sequences), as for flash3_forward. */
  int32_t page_table_rows;
  const int32_t* cu_seqlens_k_new;
} flash3_kvcache_args;

flash3_kvcache_args flash3_default_kvcache_args(void);

/* opts: softmax_scale, causal, window, softcap, pack_gqa, num_splits (NULL:
 * defaults; varlen fields must be unset). workspace may be NULL (allocated
 * internally, stream-ordered), else >= flash3_kvcache_workspace_size() bytes,
 * 256-byte aligned. */
flash3_status flash3_forward_kvcache(const flash3_kvcache_args* args, const flash3_options* opts, void* workspace,
                                     size_t workspace_bytes, void* stream);
/* 0 for malformed arguments. */
size_t flash3_kvcache_workspace_size(const flash3_kvcache_args* args, const flash3_options* opts);

/* The forward's launch plan (flash3::forward_plan): *num_splits (1: none) and
 * *pack_gqa (0 / 1) for batch sequences of at most seqlen_q x seqlen_k rows,
 * on the current device. */
flash3_status flash3_forward_plan(int32_t dtype, int32_t batch, int32_t seqlen_q, int32_t seqlen_k, int32_t heads_q,
                                  int32_t heads_kv, int32_t head_dim, int32_t head_dim_v, const flash3_options* opts,
                                  int32_t* num_splits, int32_t* pack_gqa);

flash3_status flash3_validate_forward(const flash3_tensor* q, const flash3_tensor* k, const flash3_tensor* v,
                                      const flash3_tensor* out, const flash3_tensor* lse,
                                      const flash3_options* opts);

int flash3_forward_is_built(int32_t dtype, int32_t head_dim, int32_t head_dim_v);
int flash3_backward_is_built(int32_t dtype, int32_t head_dim, int32_t head_dim_v);
int flash3_device_is_supported(void);
const char* flash3_last_error(void);
/* The loaded library's version: "MAJOR.MINOR.PATCH", and as FLASH3_VERSION_NUMBER
 * (MAJOR * 10000 + MINOR * 100 + PATCH). A program can compare it with the
 * FLASH3_VERSION_* macros of the headers it was compiled against. */
const char* flash3_version(void);
int flash3_version_number(void);

#ifdef __cplusplus
}
#endif
#endif /* FLASH3_C_H_ */
