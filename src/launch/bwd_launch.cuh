// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Backward launch template: carves the workspace, then enqueues preprocess,
// the main kernel (mask variant and block order chosen at run time) and
// postprocess on one stream. Instantiated once per manifest row
// (build/generated/bwd_*.cu).
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "bwd/kernel.h"
#include "bwd/varlen_prep.h"
#include "bwd/workspace.h"
#include "common/cuda_check.h"
#include "common/params.h"
#include "launch/dispatch.h"
#include "plan/bwd_plan.h"
#include "plan/lower.h"
#include "launch/launch_kernel.cuh"

namespace flash3 {

// Longest-first group size for causal/local backward launches (BwdScheduler):
// how many (KV head, batch) pairs' Q, dO (input dtype) and fp32 dQ accumulator
// fit in a share of the 50 MB L2 together. Two groups are in flight at a group
// boundary, so the share is a third of L2.
inline int bwd_tile_group(const BwdParams& p, int elem_bytes) {
  constexpr double kL2Share = double(kBwdL2ShareMB) * 1024 * 1024;
  const double per_q_head = double(p.seqlen_q > 0 ? p.seqlen_q : 1) *
                            (p.head_dim * (4.0 + elem_bytes) + p.head_dim_v * double(elem_bytes) + 8.0);
  const int g = int(kL2Share / (per_q_head * (p.heads_q / p.heads_kv)));
  return g < 1 ? 1 : g;
}

// The main kernel's tensor maps, shapes and problem fields from p and the
// workspace layout (the split plan and block order are the caller's).
template <class Traits, class KParams>
Status build_bwd_kernel_params(const BwdParams& p, const BwdWorkspaceLayout& w, int row_shift, KParams& kp) {
  using Element = typename Traits::Element;
  using namespace cute;
  char* ws = static_cast<char*>(p.workspace);
  // Tensor maps need every extent >= 1; empty extents never reach a load.
  const int sq = p.seqlen_q > 0 ? p.seqlen_q : 1;
  auto shape_q = make_shape(int32_t(sq), int32_t(p.head_dim), int32_t(p.heads_q), int32_t(p.batch));
  auto shape_do = make_shape(int32_t(sq), int32_t(p.head_dim_v), int32_t(p.heads_q), int32_t(p.batch));
  auto shape_k = make_shape(int32_t(p.seqlen_k), int32_t(p.head_dim), int32_t(p.heads_kv), int32_t(p.batch));
  auto shape_v = make_shape(int32_t(p.seqlen_k), int32_t(p.head_dim_v), int32_t(p.heads_kv), int32_t(p.batch));
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)), shape_q,
                          make_stride(p.q_row_stride, _1{}, p.q_head_stride, p.q_batch_stride));
  Tensor mdO = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.dout)), shape_do,
                           make_stride(p.do_row_stride, _1{}, p.do_head_stride, p.do_batch_stride));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)), shape_k,
                          make_stride(p.k_row_stride, _1{}, p.k_head_stride, p.k_batch_stride));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)), shape_v,
                          make_stride(p.v_row_stride, _1{}, p.v_head_stride, p.v_batch_stride));
  kp.tma_load_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}),
                                Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_load_do = make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename Traits::SmemLayoutdO{}),
                                 Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>{}, _1{});
  kp.tma_load_k = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutK{},
                                Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_load_v = make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutV{},
                                Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{}, _1{});
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_q, "q"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_do, "dout"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_k, "k"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_v, "v"));
  kp.shape_q = shape_q;
  kp.shape_do = shape_do;
  kp.shape_k = shape_k;
  kp.shape_v = shape_v;
  kp.lse_log2 = reinterpret_cast<const float*>(ws + w.lse_offset);
  kp.dpsum = reinterpret_cast<const float*>(ws + w.dpsum_offset);
  kp.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum_offset);
  kp.dq_sem = reinterpret_cast<int*>(ws + w.sem_offset);
  kp.dk = static_cast<Element*>(p.dk);
  kp.dv = static_cast<Element*>(p.dv);
  kp.dk_row_stride = p.dk_row_stride;
  kp.dk_head_stride = p.dk_head_stride;
  kp.dk_batch_stride = p.dk_batch_stride;
  kp.dv_row_stride = p.dv_row_stride;
  kp.dv_head_stride = p.dv_head_stride;
  kp.dv_batch_stride = p.dv_batch_stride;
  kp.mask = make_mask_spec(p);
  kp.mask.seqlen_q += row_shift;  // the kernel works in padded-grid rows (bwd_row_shift)
  kp.row_shift = row_shift;
  kp.heads_q = p.heads_q;
  kp.heads_kv = p.heads_kv;
  kp.heads_per_kv = p.heads_q / p.heads_kv;
  kp.num_m_blocks = w.num_m_blocks;
  kp.seqlen_q_pad = w.seqlen_q_pad;
  // softmax_scale scales dQ and dK whatever the score modifier (its
  // derivative goes into dS); P uses the modifier's log2 scale.
  const ScoreModScales sc =
      score_mod_scales(p.softmax_scale, p.softmax_scale_log2, Traits::ScoreMod::kEnabled ? p.softcap : 0.f);
  kp.softmax_scale = p.softmax_scale;
  kp.softmax_scale_log2 = sc.scale_log2;
  if constexpr (Traits::ScoreMod::kEnabled) kp.score_mod_scale = sc.pre_scale;
  kp.deterministic = p.deterministic;
  return Status::Ok();
}

template <class Traits, bool kLpt>
Status launch_bwd_main(const BwdParams& p, const BwdWorkspaceLayout& w, const BwdSplitPlan& split, int row_shift,
                       cudaStream_t stream) {
  typename Traits::Params kp{};
  FLASH3_RETURN_IF_ERROR(build_bwd_kernel_params<Traits>(p, w, row_shift, kp));
  char* ws = static_cast<char*>(p.workspace);
  kp.tile_group = kLpt ? bwd_tile_group(p, int(sizeof(typename Traits::Element))) : 0;
  const int num_n_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  kp.num_n_blocks = num_n_blocks;
  kp.split_first = split.first;
  kp.split_pieces = split.pieces;
  kp.split_partials = reinterpret_cast<float*>(ws + w.split_partials_offset);
  kp.split_count = reinterpret_cast<int*>(ws + w.split_count_offset);
  kp.tail_heads = 0;
  if (kLpt && kp.tile_group > 0) {
    int num_sms = 0;
    FLASH3_RETURN_IF_ERROR(current_sm_count(&num_sms));
    kp.tail_heads = BwdScheduler::tail_heads(p.heads_kv * p.batch, num_n_blocks, kp.tile_group, num_sms);
  }

  constexpr int smem = Traits::kSmemBytes;
  const dim3 grid = BwdScheduler::grid(kLpt, num_n_blocks, p.heads_kv, p.batch, split);
  constexpr const char* kWhat = "flash3 backward kernel launch";
  if constexpr (!kLpt) {
    if (split.pieces > 1) {
      return launch_kernel_smem<&flash_bwd_kernel<Traits, false, true>>(kWhat, grid, dim3(Traits::kNumThreads), smem,
                                                                       stream, kp);
    }
  }
  return launch_kernel_smem<&flash_bwd_kernel<Traits, kLpt, false>>(kWhat, grid, dim3(Traits::kNumThreads), smem,
                                                                   stream, kp);
}

// Preprocess / postprocess parameters from p and the workspace layout
// (varlen launches then add their tile map).
inline BwdPrepParams bwd_prep_params(const BwdParams& p, const BwdWorkspaceLayout& w, int row_shift) {
  char* ws = static_cast<char*>(p.workspace);
  BwdPrepParams pp{};
  pp.o = p.o;
  pp.dout = p.dout;
  pp.lse = p.lse_in;
  pp.dlse = p.dlse;
  pp.o_row_stride = p.o_row_stride;
  pp.o_head_stride = p.o_head_stride;
  pp.o_batch_stride = p.o_batch_stride;
  pp.do_row_stride = p.do_row_stride;
  pp.do_head_stride = p.do_head_stride;
  pp.do_batch_stride = p.do_batch_stride;
  pp.lse_head_stride = p.lse_head_stride;
  pp.lse_batch_stride = p.lse_batch_stride;
  pp.dlse_head_stride = p.dlse_head_stride;
  pp.dlse_batch_stride = p.dlse_batch_stride;
  pp.lse_log2 = reinterpret_cast<float*>(ws + w.lse_offset);
  pp.dpsum = reinterpret_cast<float*>(ws + w.dpsum_offset);
  pp.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum_offset);
  pp.dq_sem = reinterpret_cast<int*>(ws + w.sem_offset);
  pp.split_count = reinterpret_cast<int*>(ws + w.split_count_offset);
  pp.split_tiles = 0;
  pp.seqlen_q = p.seqlen_q;
  pp.heads_q = p.heads_q;
  pp.num_m_blocks = w.num_m_blocks;
  pp.seqlen_q_pad = w.seqlen_q_pad;
  pp.head_dim = p.head_dim;
  pp.row_shift = row_shift;
  return pp;
}

inline BwdPostParams bwd_post_params(const BwdParams& p, const BwdWorkspaceLayout& w, int row_shift) {
  BwdPostParams pp{};
  pp.dq_accum = reinterpret_cast<const float*>(static_cast<char*>(p.workspace) + w.dq_accum_offset);
  pp.dq = p.dq;
  pp.dq_row_stride = p.dq_row_stride;
  pp.dq_head_stride = p.dq_head_stride;
  pp.dq_batch_stride = p.dq_batch_stride;
  pp.seqlen_q = p.seqlen_q;
  pp.heads_q = p.heads_q;
  pp.num_m_blocks = w.num_m_blocks;
  pp.row_shift = row_shift;
  pp.softmax_scale = p.softmax_scale;
  return pp;
}

// The plan's tile must be the kernel's (plan_backward and the launch pick
// the tile config by the same rules; a disagreement would carve the workspace
// for another tile).
template <class Traits>
Status check_plan_tile(const BwdPlan& plan) {
  if (plan.tile.tile_m == Traits::kBlockM && plan.tile.tile_n == Traits::kBlockN) return Status::Ok();
  return Status{StatusCode::kInternal, "backward: the plan's tile is not this kernel's"};
}

// The backward's varlen problem as one batch element (varlen_as_one_batch,
// plan/lower.h), dO included.
inline BwdParams bwd_varlen_as_one_batch(const BwdParams& p) {
  BwdParams w = p;
  static_cast<FwdParams&>(w) = varlen_as_one_batch(p);
  w.do_batch_stride = p.do_row_stride;
  return w;
}

// Variable-length backward: the prep kernel (per-sequence info, tensor maps,
// query- and KV-tile maps), preprocess over the query tiles, the main kernel
// over the KV-tile map's upper bound (one KV block per CTA, no split plan, no
// row shift) and postprocess, on one stream. The per-query-block scratch is
// laid out as one batch element of (query-tile bound) blocks, followed by the
// prep kernel's scratch (BwdPlan::varlen_scratch_offset).
template <class Traits>
Status launch_bwd_varlen(const BwdPlan& plan, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  FLASH3_RETURN_IF_ERROR(check_plan_tile<Traits>(plan));
  const BwdParams& p = plan.params;
  const BwdWorkspaceLayout& w = plan.layout;
  char* ws = static_cast<char*>(p.workspace);
  const int q_bound = w.num_m_blocks;

  typename Traits::Params kp{};
  FLASH3_RETURN_IF_ERROR(build_bwd_kernel_params<Traits>(bwd_varlen_as_one_batch(p), w, 0, kp));
  kp.varlen = varlen_scratch_at(ws + plan.varlen_scratch_offset, p.batch, q_bound, plan.kv_tiles_bound);
  kp.tile_group = 0;
  kp.tail_heads = 0;
  kp.num_n_blocks = 0;
  kp.split_first = 0;
  kp.split_pieces = 1;

  BwdVarlenPrepArgs a{};
  a.seqs = {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k, p.batch, p.seqlen_q, p.seqlen_k};
  a.q = {p.q, p.q_row_stride, p.q_head_stride};
  a.k = {p.k, p.k_row_stride, p.k_head_stride};
  a.v = {p.v, p.v_row_stride, p.v_head_stride};
  a.dout = {p.dout, p.do_row_stride, p.do_head_stride};
  a.scratch = kp.varlen;
  const int64_t maps = int64_t(p.batch) * kNumVarlenDesc;
  const int64_t prep_ctas = (maps + kVarlenPrepThreads - 1) / kVarlenPrepThreads;
  FLASH3_RETURN_IF_ERROR(launch_kernel("flash3 varlen backward prep launch", flash_bwd_varlen_prep_kernel<Traits>,
                                       dim3(unsigned(prep_ctas > 1 ? prep_ctas : 1)), dim3(kVarlenPrepThreads), 0,
                                       stream, kp, a));

  BwdPrepParams pp = bwd_prep_params(p, w, 0);
  pp.q_tiles = kp.varlen.tiles;
  pp.seqs = kp.varlen.seqs;
  FLASH3_RETURN_IF_ERROR(launch_kernel("flash3 backward preprocess launch",
                                       flash_bwd_preprocess_kernel<Element, Traits::kHeadDimV, kBlockM, true>,
                                       dim3(q_bound, p.heads_q, 1), dim3(kBlockM * 4), 0, stream, pp));
  FLASH3_RETURN_IF_ERROR((launch_kernel_smem<&flash_bwd_kernel<Traits, true, false>>(
      "flash3 backward kernel launch", dim3(plan.kv_tiles_bound, p.heads_kv, 1), dim3(Traits::kNumThreads),
      Traits::kSmemBytes, stream, kp)));
  BwdPostParams post = bwd_post_params(p, w, 0);
  post.q_tiles = kp.varlen.tiles;
  post.seqs = kp.varlen.seqs;
  return launch_kernel("flash3 backward postprocess launch", flash_bwd_postprocess_kernel<Traits>,
                       dim3(q_bound, p.heads_q, 1), dim3(Traits::kNumMmaThreads), 0, stream, post);
}

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod, class Mask, bool kCausalOrLocal, bool kShortQ>
Status run_bwd_varlen_mask(const BwdPlan& plan, cudaStream_t stream) {
  using Cfg = DefaultBwdConfig<kHeadDim, kHeadDimV, kCausalOrLocal, kShortQ>;
  return launch_bwd_varlen<BwdTraits<Element, kHeadDim, kHeadDimV, Cfg, Mask, true, ScoreMod>>(plan, stream);
}

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod, class Mask, bool kCausalOrLocal, bool kShortQ>
Status run_bwd_mask(const BwdPlan& plan, cudaStream_t stream) {
  using Traits =
      BwdTraits<Element, kHeadDim, kHeadDimV, DefaultBwdConfig<kHeadDim, kHeadDimV, kCausalOrLocal, kShortQ>, Mask,
                false, ScoreMod>;
  constexpr int kBlockM = Traits::kBlockM;
  FLASH3_RETURN_IF_ERROR(check_plan_tile<Traits>(plan));
  const BwdParams& p = plan.params;
  // Causal/local launches put the KV blocks in gridDim.y (BwdScheduler::grid).
  if (kCausalOrLocal && (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN > kMaxGridYZ)
    return Status::NotSupported("causal or local backward with seqlen_k " + std::to_string(p.seqlen_k) + " > " +
                                std::to_string(int64_t(kMaxGridYZ) * Traits::kBlockN) +
                                " for this head dim (65535 KV blocks in gridDim.y)");
  const BwdSplitPlan& split = plan.split;
  const BwdWorkspaceLayout& w = plan.layout;
  const int row_shift = plan.row_shift;

  if (w.num_m_blocks > 0) {
    BwdPrepParams pp = bwd_prep_params(p, w, row_shift);
    pp.split_tiles = split.tiles;
    FLASH3_RETURN_IF_ERROR(launch_kernel("flash3 backward preprocess launch",
                                         flash_bwd_preprocess_kernel<Element, kHeadDimV, kBlockM>,
                                         dim3(w.num_m_blocks, p.heads_q, p.batch), dim3(kBlockM * 4), 0, stream, pp));
  }
  if (p.seqlen_k > 0) {
    FLASH3_RETURN_IF_ERROR((launch_bwd_main<Traits, kCausalOrLocal>(p, w, split, row_shift, stream)));
  }
  if (w.num_m_blocks > 0) {
    const BwdPostParams pp = bwd_post_params(p, w, row_shift);
    FLASH3_RETURN_IF_ERROR(launch_kernel("flash3 backward postprocess launch", flash_bwd_postprocess_kernel<Traits>,
                                         dim3(w.num_m_blocks, p.heads_q, p.batch), dim3(Traits::kNumMmaThreads), 0,
                                         stream, pp));
  }
  return Status::Ok();
}

// Mask variant: causal/local blocks are unequal (LPT block order), unmasked
// blocks keep n_block fastest for L2 reuse.
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod, bool kShortQ>
Status run_bwd_masks(const BwdPlan& plan, cudaStream_t stream) {
  const BwdParams& p = plan.params;
  if (p.varlen) {
    if (p.is_local) {
      return run_bwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskLocal, true, kShortQ>(plan, stream);
    }
    if (p.is_causal) {
      return run_bwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskCausal, true, kShortQ>(plan, stream);
    }
    return run_bwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskNone, false, kShortQ>(plan, stream);
  }
  if (p.is_local) return run_bwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskLocal, true, kShortQ>(plan, stream);
  if (p.is_causal) return run_bwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskCausal, true, kShortQ>(plan, stream);
  return run_bwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskNone, false, kShortQ>(plan, stream);
}

// Query-tile variant: short sequences of some head dims keep 64-row tiles
// (the plan's short_tile: bwd_short_tile on the longest query sequence).
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_bwd(const BwdPlan& plan, cudaStream_t stream) {
  if constexpr (bwd_has_short_tile(kHeadDim)) {
    if (plan.short_tile) return run_bwd_masks<Element, kHeadDim, kHeadDimV, ScoreMod, true>(plan, stream);
  }
  return run_bwd_masks<Element, kHeadDim, kHeadDimV, ScoreMod, false>(plan, stream);
}

}  // namespace flash3
