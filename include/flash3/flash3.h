// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// flash3 public C++ API.
//
// Tensors are described by non-owning views (pointer, dtype, shape, strides in
// elements). Attention tensors use the FlashAttention layout
// (batch, seqlen, heads, head_dim): any batch/seqlen/head strides, unit stride in
// head_dim. softmax_lse is (batch, heads, seqlen_q) fp32. Element offsets are
// 64-bit: a tensor may hold more than 2^31 elements (each dimension, and
// seqlen_q + seqlen_k, stays below 2^31). The stride of a dimension of size 1
// is never used and may be anything.
//
// Every entry point validates all arguments before launching anything and
// reports problems through Status (never an exception, never a launch).
// Outputs must not overlap the inputs, each other or themselves.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <cuda_runtime_api.h>

#include "flash3/version.h"  // FLASH3_VERSION_MAJOR / MINOR / PATCH / STRING

namespace flash3 {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat8E4M3 = 3 };
const char* dtype_name(DType t);
int dtype_size(DType t);

// A non-owning view of a device tensor. Strides are in elements. Up to
// kMaxTensorDims dimensions (the attention tensors have 4; the split-KV
// partial outputs of combine() have 5); the entries past ndim are unused.
constexpr int kMaxTensorDims = 5;
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  int ndim = 0;
  int64_t shape[kMaxTensorDims] = {0, 0, 0, 0, 0};
  int64_t stride[kMaxTensorDims] = {0, 0, 0, 0, 0};

  // Contiguous row-major view (ndim <= kMaxTensorDims).
  static TensorView contiguous(void* data, DType dtype, int ndim, const int64_t* shape);
  static TensorView make4d(void* data, DType dtype, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                           int64_t st0, int64_t st1, int64_t st2, int64_t st3);
  static TensorView make3d(void* data, DType dtype, int64_t s0, int64_t s1, int64_t s2,
                           int64_t st0, int64_t st1, int64_t st2);
  bool defined() const { return data != nullptr || ndim > 0; }
  int64_t numel() const;
};

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // a tensor or option does not satisfy the contract
  kNotSupported = 2,      // a valid request for a feature that is not built / not implemented yet
  kCudaError = 3,         // a CUDA runtime/driver call failed
  kInternal = 4,
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;
  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
  static Status Invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotSupported(std::string m) {
    return {StatusCode::kNotSupported, "not supported yet: " + std::move(m)};
  }
  static Status Cuda(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
};

// Options shared by forward and backward. The mask rules are FlashAttention-3's:
//   * query i sees key j iff  j >= i + sk - sq - window_left   (when window_left >= 0)
//                        and  j <= i + sk - sq + window_right  (when window_right >= 0),
//     i.e. masks are aligned bottom-right when seqlen_q (sq) != seqlen_k (sk);
//   * a negative window side is unbounded;
//   * window_left >= sk - 1 and window_right >= sq - 1 cut nothing and are
//     treated as unbounded (so any int is a valid window, INT_MAX included);
//   * causal sets window_right = 0 whatever value it had; window_left is kept,
//     so causal with a finite window_left is local (sliding-window) attention;
//   * window (-1, 0) without causal is the causal mask.
struct AttentionOptions {
  // NaN (the default) means 1/sqrt(head_dim). Any finite value >= 0 is used as
  // given (0 too). Negative values are rejected: the online softmax tracks each
  // row's maximum of the unscaled scores, which is the minimum of the scaled
  // ones when the scale is negative.
  float softmax_scale = std::numeric_limits<float>::quiet_NaN();
  // Causal mask, aligned bottom-right (query i sees keys j <= i + sk - sq).
  bool causal = false;
  // Sliding window (see above); -1 (any negative value) means unbounded.
  int window_left = -1;
  int window_right = -1;
  // tanh soft-capping of the scaled scores, s -> softcap * tanh(s / softcap),
  // before the mask and the softmax (forward and backward); 0 disables. Finite
  // and >= 0. Runs the softcap units (CMake FLASH3_FEATURES, built by default;
  // without them: kNotSupported naming opts.softcap).
  float softcap = 0.f;
  // Backward: bitwise reproducible dQ / dK / dV. Cost on an H200 (bf16, sustained):
  // 1-12% unmasked, 5-12% causal at 4k-16k, d = 64 / 128 (docs/performance.md).
  bool deterministic = false;
  // Variable-length batches, forward and backward. cu_seqlens_q / cu_seqlens_k
  // are int32 device arrays of num_sequences + 1 prefix sums (both or neither);
  // q/k/v/out are then (total_tokens, heads, head_dim) and softmax_lse is
  // (heads, total_q). Sequence b owns rows [cu[b], cu[b+1]); masks are aligned
  // bottom-right per sequence; sequences of length 0 are valid. The prefix sums
  // live on the device and are not read by the host (no synchronisation):
  // values outside [0, total_tokens] are clamped and a decreasing pair gives
  // a sequence of length 0, so nothing outside the tensors is ever read or
  // written, but such inputs give meaningless results.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // max_seqlen_q / max_seqlen_k (>= 0; 0: every sequence of that side is
  // empty): the longest sequence, as in FlashAttention-3. Used to plan the
  // launch (splits, workspace) and to normalise the window (a side >= max - 1
  // cuts nothing and becomes unbounded); a value below a real length is not
  // detected and turns such a window off for the longer sequences.
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  // Number of sequences (cu_seqlens_* have num_sequences + 1 entries); >= 0.
  int num_sequences = 0;
  // Optional int32 device arrays of num_sequences entries: how many tokens of
  // each sequence are real (the rest of its rows are neither read nor
  // written: out / lse / dq / dk / dv keep their contents there). Clamped to
  // [0, cu[b+1] - cu[b]].
  const int* seqused_q = nullptr;
  const int* seqused_k = nullptr;
  // PackGQA, forward only (the backward ignores it): with hq > hkv the query
  // heads sharing a KV head are packed into one tile's rows, so each K/V tile
  // is loaded once per group. -1: heuristic (varlen packs; fixed length packs
  // when that fills the query tiles clearly better, e.g. short seqlen_q),
  // 0: off, 1: on; other values are rejected (forward and backward). Only
  // speed differs: where no packed kernel exists (MHA, softcap, a build
  // without the packgqa feature) the unpacked kernel runs, same results.
  int pack_gqa = -1;
  // Split-KV, forward only (the backward ignores it): the KV range of each
  // query tile is split over num_splits CTAs, each writing fp32 partial
  // outputs and LSEs that a combine kernel (see combine() below) then merges;
  // this fills the SMs when there are few query tiles (decode-like problems:
  // short seqlen_q, long seqlen_k). 0: heuristic (splits where that fills the
  // SMs), 1: no split (the default, as FlashAttention-3's flash_attn_func),
  // n > 1: at most n splits (fewer when there are fewer KV blocks). Values < 0
  // or > 256 are rejected (forward and backward). Only speed differs: where no
  // split-capable kernel is built (softcap, a build without the packgqa
  // feature) the unsplit kernel runs, same results.
  int num_splits = 1;
};

// Tokens per FP8 block scale (ForwardArgs::q_descale, QuantizeFp8Args::block_scales).
inline constexpr int kFp8ScaleBlock = 128;

struct ForwardArgs {
  TensorView q;     // (b, sq, hq, d)
  TensorView k;     // (b, sk, hkv, d)
  TensorView v;     // (b, sk, hkv, dv)
  TensorView out;   // (b, sq, hq, dv), written
  TensorView lse;   // (b, hq, sq) fp32, written; optional: a default TensorView{} (no data,
                    // ndim 0) means not stored; a view with a shape but no data is an error
  // FP8 (FlashAttention-3's FP8 forward): q, k, v fp8_e4m3 and out bf16.
  // The scores are softmax_scale * (q_descale * q) . (k_descale * k) and the
  // output P (v_descale * v). Each descale is optional (TensorView{}: 1), fp32,
  // any strides, and either
  //   - (b, hkv): one per (batch, KV head), as FlashAttention-3 takes them, or
  //   - block scales (seed 6.3): q_descale (b, hq, ceil(sq / kFp8ScaleBlock)),
  //     k_descale / v_descale (b, hkv, ceil(sk / kFp8ScaleBlock)): one per
  //     kFp8ScaleBlock tokens of each head (block i: tokens [128 i, 128 i + 128)),
  //     as quantize_fp8 writes them with block_scales.
  // The two forms mix freely. Descales must be positive and finite (a zero
  // descale gives NaN: quantize_fp8 writes 1 for an all-zero block). Given for
  // 16-bit inputs, or with cu_seqlens / softcap / the backward: an error. e4m3
  // values are finite (|x| <= 448; NaN inputs give NaN outputs).
  TensorView q_descale, k_descale, v_descale;
  AttentionOptions opts;
  // Scratch memory, 256-byte aligned; query its size with
  // forward_workspace_size() (it depends on the shapes and options only, and is
  // 0 for most fixed-length calls; varlen calls need their per-sequence maps,
  // split calls their fp32 partials; with num_splits = 0 it also depends on
  // the current device's SM count).
  // If null, flash3 allocates what it needs (stream-ordered) and frees it
  // itself. The kernels write it, so it must not be in use by other work on
  // other streams during the call.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct BackwardArgs {
  TensorView q, k, v, out;  // as in forward
  TensorView dout;          // (b, sq, hq, dv)
  TensorView lse;           // (b, hq, sq) fp32 from the forward
  TensorView dlse;          // optional (b, hq, sq) fp32 gradient of lse (TensorView{}: none)
  TensorView dq, dk, dv;    // written, same shapes/dtypes as q, k, v
  AttentionOptions opts;
  // Scratch memory; query its size with backward_workspace_size() on the
  // device that will run the call (it depends on q's, k's and v's shapes, the
  // mask and, for unmasked calls, that device's SM count; backward() checks
  // the size again). If null, flash3 allocates (stream-ordered) and frees it
  // itself.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Split-KV combine (FlashAttention-3's flash_attn_combine): merges the fp32
// partial outputs and LSEs of num_splits KV splits of one attention problem,
// row by row:
//   lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s.
// A split whose lse_s is -inf (no visible key) weighs 0 and its out_s is not
// read (it may hold anything, NaN included); a row with every split at -inf
// gets out = 0 and lse = -inf, never NaN.
// The largest head_dim combine() takes (FlashAttention-3's MLA value dim).
inline constexpr int kMaxCombineHeadDim = 512;
struct CombineArgs {
  // (num_splits, batch, seqlen, heads, head_dim) fp32, unit stride in head_dim,
  // 16-byte aligned with the other strides multiples of 4 elements (the
  // kernel reads float4s). num_splits in [1, 256], head_dim in [4,
  // kMaxCombineHeadDim] and a multiple of 4.
  TensorView out_partial;
  // (num_splits, batch, seqlen, heads) fp32, natural log; any strides.
  TensorView lse_partial;
  // (batch, seqlen, heads, head_dim), written: bf16, fp16 or fp32, unit
  // stride in head_dim, other strides any (vector stores where aligned).
  TensorView out;
  // Optional (batch, seqlen, heads) fp32, written; any strides (a
  // (batch, heads, seqlen) tensor's transposed view is FlashAttention-3's
  // layout). TensorView{} (no data, ndim 0): not stored.
  TensorView lse;
};

// KV-cache attention (FlashAttention-3's flash_attn_with_kvcache), forward
// only: q attends to the first cache_seqlens[b] rows of its cache entry,
// after the optional new rows k_new / v_new have been appended there (with
// rotary applied to them and to q when rotary_cos / rotary_sin are given).
// Masks are aligned bottom-right per sequence, as in forward(): with
// seqlen_k = cache_seqlens[b] - cache_leftpad[b] + seqlen_new[b], query i of
// seqlen_q[b] sees key j (counted from the leftpad) iff j <= i + seqlen_k -
// seqlen_q under causal. softmax_scale, causal, window_*, softcap, pack_gqa
// and num_splits come from opts (the Python flash_attn_with_kvcache defaults
// num_splits to 0, the heuristic, as FlashAttention-3 does).
//
// Variable-length queries (FlashAttention-3's cu_seqlens_q / max_seqlen_q,
// the call serving frameworks make on a batch mixing prefill chunks and
// decode tokens): opts.cu_seqlens_q (b + 1 int32 prefix sums over q's rows,
// b = opts.num_sequences) with opts.max_seqlen_q (>= the longest sequence;
// 0 is the empty batch); q / out are then (total_q, hq, d) / (total_q, hq,
// dv), lse (hq, total_q), and sequence b's queries are rows [cu_seqlens_q[b],
// cu_seqlens_q[b + 1]). opts.cu_seqlens_k, opts.seqused_q / seqused_k stay
// null (the keys are the cache's: cache_seqlens). Rows of out / lse that no
// sequence covers are not written.
//
// The int32 arrays are device memory of b entries and are not read by the
// host (no synchronisation, CUDA-graph capturable). Their values are the
// caller's contract: cache_batch_idx values outside [0, entries) and
// cache_seqlens / cache_leftpad outside [0, capacity] are clamped into
// range (nothing outside the tensors is read or written, but the results are
// meaningless); appended rows at or past the capacity are dropped.
struct KVCacheArgs {
  TensorView q;        // (b, sq, hq, d); its (b, sq) rows one stride apart: batch stride == sq * row stride, or sq == 1, or b == 1
                       // (varlen queries: (total_q, hq, d))
  TensorView k_cache;  // (b_cache, s_cache, hkv, d), rows likewise one stride apart; written where k_new is given
                       // (paged: (num_pages, page_size, hkv, d), see page_table)
  TensorView v_cache;  // (b_cache, s_cache, hkv, dv), likewise
  // Optional new rows (both or neither): (b, s_new, hkv, d) / (b, s_new, hkv, dv),
  // written into the cache at rows [cache_seqlens[b], cache_seqlens[b] + s_new)
  // of cache entry cache_batch_idx[b] (the row order ignores cache_leftpad),
  // then attended to. Needs cache_seqlens. With cu_seqlens_k_new (b + 1 int32
  // prefix sums, FlashAttention-3's): (total_new, hkv, d) / (total_new, hkv,
  // dv), sequence b appending rows [cu_seqlens_k_new[b], cu_seqlens_k_new[b + 1]).
  TensorView k_new;
  TensorView v_new;
  const int* cu_seqlens_k_new = nullptr;
  // Optional rotary tables (both or neither; needs k_new): (seqlen_ro,
  // rotary_dim / 2) in q's dtype, unit stride in the last dimension,
  // rotary_dim even, <= d, and seqlen_ro >= s_cache. New key i of sequence b
  // is rotated to position pos_b + i, with pos_b = rotary_seqlens[b] if given,
  // else cache_seqlens[b]; query i to pos_b + i when causal or local, else to
  // pos_b (all queries at the first new position, as FlashAttention-3).
  // interleaved: pairs (2j, 2j + 1); else (j, j + rotary_dim / 2) (GPT-NeoX).
  // Per pair, in fp32: x0' = fma(x0, cos, -(x1 * sin)), x1' = fma(x0, sin, x1 * cos),
  // rounded to the dtype; dims >= rotary_dim unchanged. q is not modified
  // (the rotated copy lives in the workspace).
  TensorView rotary_cos;
  TensorView rotary_sin;
  bool rotary_interleaved = true;
  const int* cache_seqlens = nullptr;    // (b,); null: every entry holds s_cache rows (no k_new then)
  const int* cache_batch_idx = nullptr;  // (b,); null: entry b
  const int* cache_leftpad = nullptr;    // (b,); the entry's first row; null: 0
  const int* rotary_seqlens = nullptr;   // (b,); null: cache_seqlens
  // Paged KV (optional): page_table is a (page_table_rows, page_table_max_pages)
  // int32 device array, row e at page_table + e * page_table_batch_stride: one
  // row per cache entry (page_table_rows 0 means b: entry b is sequence b's;
  // with cache_batch_idx, sequence b uses row cache_batch_idx[b], as in
  // FlashAttention-3, so a server can reuse cache slots). k_cache / v_cache
  // are then page pools (num_pages, page_size, hkv, d[v]) (any page_size >= 1,
  // fewer than 2^31 rows in all) and cache position p of entry e lives in page
  // page_table[e][p / page_size] at row p % page_size; a sequence's keys are
  // positions [cache_leftpad[b], cache_seqlens[b] + s_new). An entry holds at
  // most page_table_max_pages * page_size rows (the role s_cache has without
  // pages: cache_seqlens null means every sequence is that full, s_new and
  // seqlen_ro are checked against it). The pages a call touches (positions
  // below cache_seqlens[b] + s_new) must lie in [0, num_pages): the caller's
  // contract, not checked (a page out of range reads or writes out of bounds).
  const int* page_table = nullptr;
  int64_t page_table_batch_stride = 0;  // elements; >= page_table_max_pages when it has several rows
  int page_table_max_pages = 0;
  int page_table_rows = 0;              // 0: b (one row per sequence)
  TensorView out;  // (b, sq, hq, dv), written; rows one stride apart as q's
  // Optional (b, hq, sq) fp32, written; batch stride sq and row stride 1
  // (the kernels' layout is (hq, b * sq): e.g. a (b, hq, sq) view of an
  // (hq, b, sq) buffer), or b == 1. TensorView{}: not stored.
  TensorView lse;
  AttentionOptions opts;
  // Scratch, 256-byte aligned, kvcache_workspace_size() bytes (the per-sequence
  // maps, the split partials, the rotated q); null: flash3 allocates.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// FP8 quantization for the FP8 forward (FlashAttention-3 leaves it to the
// caller): x (b, s, h, d) fp16 / bf16 -> out (b, s, h, d) fp8_e4m3 and fp32
// descales = amax / 448 of each group (1 for an all-zero group), out =
// round(x / descale) (ties to even, saturating at 448). The groups:
//   - block_scales = false: each (batch, group of heads_per_scale heads);
//     descale (b, h / heads_per_scale), contiguous. For q with GQA,
//     heads_per_scale = heads_q / heads_kv gives the forward's (batch,
//     heads_kv) q_descale. Two passes over x (the amax first).
//   - block_scales = true: each kFp8ScaleBlock tokens of each head (seed 6.3);
//     descale (b, h, ceil(s / kFp8ScaleBlock)), contiguous, the forward's
//     block-scale form. One pass; heads_per_scale must be 1.
// hadamard (seed 6.4, incoherent processing): x is first rotated, x -> x
// (1/sqrt d) H D, H Sylvester's Hadamard matrix and D = diag(+-1), column j's
// sign the top bit of the j-th splitmix64 draw from hadamard_seed; q and k
// rotated with the same seed keep q k^T (v must not be rotated: P V would
// change). d a power of two in [32, 256] with the rotation, a multiple of 8 up
// to 256 without. Any batch / row / head strides, unit stride in d.
// rotary_cos / rotary_sin (optional, both or neither; q and k only): rotary
// applied first, in fp32 (the values are not rounded to x's dtype before the
// rest): token s rotated by row s of the tables, (seqlen_ro >= seqlen,
// rotary_dim / 2) in x's dtype, unit stride in the last dimension, 16-byte
// aligned rows; rotary_dim a multiple of 16 up to d, and with half-split pairs
// (rotary_interleaved = false, GPT-NeoX: (j, j + rotary_dim / 2)) a power of
// two; interleaved pairs (2j, 2j + 1) (GPT-J) otherwise. Dims >= rotary_dim
// are unchanged. For a chunk starting at position p, pass the tables from row p.
struct QuantizeFp8Args {
  TensorView x;
  TensorView out;      // written
  TensorView descale;  // written
  int heads_per_scale = 1;
  bool block_scales = false;
  bool hadamard = false;
  uint64_t hadamard_seed = 0;
  TensorView rotary_cos, rotary_sin;
  bool rotary_interleaved = true;
};
Status validate_quantize_fp8(const QuantizeFp8Args& args);
Status quantize_fp8(const QuantizeFp8Args& args, cudaStream_t stream);

// Validation only (no launch). Used by forward()/backward()/combine() and
// exposed for tests and bindings that want to raise before any work is queued.
Status validate_forward(const ForwardArgs& args);
Status validate_backward(const BackwardArgs& args);
Status validate_combine(const CombineArgs& args);
Status validate_kvcache(const KVCacheArgs& args);

// The kernels run on `stream`, which must belong to the current device (the
// device of the tensors). A CUDA error left pending by earlier work of the
// caller is not reported as this call's failure, and not cleared either, with
// one exception: the first launch of each kernel on a device raises its shared
// memory limit with cudaFuncSetAttribute, which resets the runtime's pending
// error. Batches larger than the grid allows run as several launches.
Status forward(const ForwardArgs& args, cudaStream_t stream);
Status backward(const BackwardArgs& args, cudaStream_t stream);
size_t backward_workspace_size(const BackwardArgs& args);
// Bytes of ForwardArgs::workspace the call needs (0: none, or shapes that
// validation would reject).
size_t forward_workspace_size(const ForwardArgs& args);
// KV-cache attention on `stream`: the append (+ rotary) kernel when k_new is
// given, then the attention kernels, then the combine when split.
Status forward_kvcache(const KVCacheArgs& args, cudaStream_t stream);
size_t kvcache_workspace_size(const KVCacheArgs& args);
// The combine on `stream` (of the current device); nothing is launched for an
// empty problem (batch, seqlen or heads 0). Needs no scratch; its kernel is
// part of every build (no FLASH3_DTYPES / FLASH3_HDIMS variant).
Status combine(const CombineArgs& args, cudaStream_t stream);

// The forward's launch plan for a problem of these shapes (varlen / KV-cache:
// the longest sequences), as forward() / forward_kvcache() would decide it on
// the current device: the number of KV splits (1: none) and whether the query
// heads are packed (PackGQA: 1, else 0). Deciding depends on shapes, options
// and the SM count only, never on device data, so a plan computed once can be
// passed back as explicit opts.num_splits / opts.pack_gqa (what
// get_scheduler_metadata does in the Python API). Invalid shapes or options:
// kInvalidArgument.
struct ForwardPlan {
  int num_splits = 1;
  int pack_gqa = 0;
};
Status forward_plan(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim,
                    int head_dim_v, const AttentionOptions& opts, ForwardPlan* plan);

// Which (dtype, head_dim, head_dim_v) forward/backward kernels this build contains.
bool forward_is_built(DType dtype, int head_dim, int head_dim_v);
bool backward_is_built(DType dtype, int head_dim, int head_dim_v);
// True when the current device is a Hopper (sm_90) GPU flash3 can run on.
bool device_is_supported(std::string* why = nullptr);

const char* version();
// Whether this library was built with the CMake option FLASH3_SERVING_WIP: the
// serving work that has not run on a GPU yet (variable-length queries and new
// rows with a KV cache, paged caches with cache_batch_idx / cache_leftpad, the
// paged gather with few instructions per piece). Without it those calls
// return kNotSupported naming the option.
bool serving_wip_built();

}  // namespace flash3
