// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Internal kernel parameters: the public TensorViews lowered once on the host
// (after validation) into plain integers the kernels and host heuristics use.
#pragma once
#include <cstdint>

#include "common/block_info.h"
#include "common/build_options.h"
#include "common/score_mod_kind.h"
#include "flash3/flash3.h"

namespace flash3 {

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: LSE not stored

  DType dtype = DType::kBFloat16;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0;
  int head_dim = 0, head_dim_v = 0;

  // Strides in elements; head_dim stride is 1 for every attention tensor.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse row stride is 1

  float softmax_scale = 0.f;       // already defaulted to 1/sqrt(d)
  float softmax_scale_log2 = 0.f;  // softmax_scale * log2(e); with softcap the launches use score_mod_scales()
  float softcap = 0.f;             // 0: off (ScoreModIdentity units), > 0: ScoreModSoftcap units
  // FP8 (dtype kFloat8E4M3; o is bf16): descales of q / k / v, fp32, null: 1.
  // Element (batch, KV head, block) at batch * batch_stride + KV head *
  // head_stride + block * block_stride, block = token / kFp8ScaleBlock; q's
  // block form is per query head (qhead_stride, with head_stride 0). The
  // (batch, heads_kv) form has block strides 0.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_batch_stride = 0, q_descale_head_stride = 0, q_descale_qhead_stride = 0;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
  int64_t q_descale_block_stride = 0, k_descale_block_stride = 0, v_descale_block_stride = 0;
  // PackGQA request (AttentionOptions::pack_gqa): -1 heuristic, 0 off, 1 on;
  // fwd_pack_gqa() (launch/dispatch.h) decides. The backward ignores it.
  int pack_gqa = -1;
  // Split-KV request (AttentionOptions::num_splits): 1 none, 0 heuristic, n > 1
  // at most n; fwd_num_splits() (launch/dispatch.h) decides. Forward only.
  int num_splits = 1;

  // Scratch, 256-byte aligned, laid out by the launch's plan (FwdPlan /
  // BwdPlan, src/plan/); the caller's or allocated by the entry point, never
  // null when the launch needs it.
  void* workspace = nullptr;

  // Variable length (cu_seqlens_q set): batch = number of sequences,
  // seqlen_q / seqlen_k = total rows of q / k, the batch strides unused (0),
  // lse is (heads, total_q) (lse_head_stride; lse_batch_stride 0).
  bool varlen = false;
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_q = nullptr;  // optional
  const int* seqused_k = nullptr;  // optional
  int max_seqlen_q = 0, max_seqlen_k = 0;
  // KV cache (forward_kvcache; varlen with cu_seqlens_q / cu_seqlens_k null,
  // common/varlen.h's VarlenSeqs): every sequence has max_seqlen_q query rows
  // (q / out / lse rows b * max_seqlen_q + i); k / v are cache entries of
  // kv_rows_per_batch rows (seqlen_k = all of them), sequence b reading entry
  // kv_batch_idx[b] from row leftpad_k[b] to seqused_k[b] (cache_seqlens) +
  // seqlen_k_new (the rows the append kernel wrote first).
  bool kv_cache = false;
  const int* kv_batch_idx = nullptr;
  const int* leftpad_k = nullptr;
  int kv_rows_per_batch = 0;
  int kv_entries = 0;  // cache entries (paged: page-table rows) cache_batch_idx may pick
  // Variable-length new rows (KVCacheArgs::cu_seqlens_k_new): sequence b
  // appended cu_seqlens_k_new[b + 1] - cu_seqlens_k_new[b] rows (of
  // total_k_new); seqlen_k_new is then 0.
  const int* cu_seqlens_k_new = nullptr;
  int total_k_new = 0;
  // K/V gathered by the producer warpgroup (fwd/paged_kv.h), no per-sequence
  // tensor maps: paged caches always, contiguous ones as the plan decides.
  bool kv_direct = false;
  // kv_direct launches whose sequences have several query tiles take their
  // tiles from the prep kernel's map (varlen queries mixing prefill chunks and
  // decode rows); otherwise the grid is the tile map (no prep kernel).
  bool kv_tile_map = false;
  int seqlen_k_new = 0;
  // Paged KV (KVCacheArgs::page_table): k / v are page pools of page_size
  // rows (k_row_stride apart, pages page_size rows apart), sequence b's row r
  // in page page_table[b * page_table_batch_stride + r / page_size];
  // kv_rows_per_batch is the capacity (max pages x page_size). The packed
  // varlen kernels gather such tiles (FwdMainloop::load_gathered; fwd/paged_kv.h
  // with FLASH3_SERVING_WIP).
  const int* page_table = nullptr;
  int64_t page_table_batch_stride = 0;
  int page_size = 0;

  // Mask, normalised: causal is local with (left=-1 -> unbounded, right=0).
  bool is_causal = false;
  bool is_local = false;
  int window_left = -1;   // -1: unbounded (only meaningful with is_local)
  int window_right = -1;
};

// The score modifier a problem needs (common/score_mod_kind.h).
inline ScoreModKind score_mod_kind(const FwdParams& p) {
  return p.softcap > 0.f ? ScoreModKind::kSoftcap : ScoreModKind::kIdentity;
}

// The kernels' view of the mask (shared by forward and backward launches):
// causal is a right bound of 0 with the left unbounded.
inline MaskSpec make_mask_spec(const FwdParams& p) {
  MaskSpec m;
  m.seqlen_q = p.seqlen_q;
  m.seqlen_k = p.seqlen_k;
  m.window_left = p.is_local ? p.window_left : -1;
  m.window_right = p.is_causal ? 0 : (p.is_local ? p.window_right : -1);
  return m;
}

// Backward: the forward's problem description (q/k/v/o, shapes, strides, scale,
// mask) plus the gradients, the statistics and the scratch buffers.
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  const float* lse_in = nullptr;  // (b, hq, sq) natural-log LSE from the forward
  const float* dlse = nullptr;    // optional gradient of the LSE
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dlse_batch_stride = 0, dlse_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  bool deterministic = false;
};

// Lowering (validated args -> these params): plan/lower.h.

}  // namespace flash3
