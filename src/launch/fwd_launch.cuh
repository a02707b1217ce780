// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Forward launch template: builds the TMA descriptors and kernel params for one
// (dtype, head_dim, head_dim_v) and picks the mask variant at run time.
// Instantiated once per manifest row (build/generated/fwd_*.cu).
#pragma once
#include <cmath>
#include <limits>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/cuda_check.h"
#include "common/params.h"
#include "fwd/kernel.h"
#include "fwd/varlen_prep.h"
#include "combine/combine.h"
#include "launch/launch_kernel.cuh"
#include "plan/fwd_plan.h"
#include "plan/lower.h"

namespace flash3 {

// Causal/local tile order (LptTileScheduler). Measured on H200, bf16 causal
// (docs/performance.md, "Causal forward tile order"): for d <= 128
// longest-first in groups of heads whose K/V fit in a share of L2 together
// beats the global order at 2k-8k (d=128 2k: 504 vs 437 TFLOP/s) and ties at
// 16k; for d > 128 the global longest-first order wins everywhere (d=256 8k:
// 717 vs 655). The longest-first
// grids put the query blocks in gridDim.y: beyond its 65535 limit the plain
// order (query blocks in gridDim.x) runs instead.
inline int fwd_tile_order(const FwdParams& p, int num_m_blocks, int d, int dv, int elem_bytes) {
  if (num_m_blocks > kMaxGridYZ) return -1;
  if (d > 128) return 0;
  constexpr double kL2Share = 24.0 * 1024 * 1024;  // of the H100/H200's 50 MB L2
  const double kv_bytes = double(p.seqlen_k > 0 ? p.seqlen_k : 1) * (d + dv) * elem_bytes;
  const int g = int(kL2Share / kv_bytes);
  return g < 1 ? 1 : g;
}

// The kernel's tensor maps, shapes and problem fields from p. Varlen launches
// pass p lowered by varlen_as_one_batch: whole tensors as one batch element,
// which the prep kernel's per-sequence maps then cut.
template <class Traits, class KParams>
Status build_fwd_kernel_params(const FwdParams& p, KParams& kp) {
  using Element = typename Traits::Element;
  using namespace cute;
  // K/V extents: a tensor map needs every dimension >= 1; with seqlen_k == 0 no
  // KV block is ever loaded (the tile range is empty).
  const int sk = p.seqlen_k > 0 ? p.seqlen_k : 1;
  auto shape_q = make_shape(int32_t(p.seqlen_q), int32_t(p.head_dim), int32_t(p.heads_q), int32_t(p.batch));
  auto shape_k = make_shape(int32_t(sk), int32_t(p.head_dim), int32_t(p.heads_kv), int32_t(p.batch));
  auto shape_v = make_shape(int32_t(sk), int32_t(p.head_dim_v), int32_t(p.heads_kv), int32_t(p.batch));
  auto shape_o = make_shape(int32_t(p.seqlen_q), int32_t(p.head_dim_v), int32_t(p.heads_q), int32_t(p.batch));
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)), shape_q,
                          make_stride(p.q_row_stride, _1{}, p.q_head_stride, p.q_batch_stride));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)), shape_k,
                          make_stride(p.k_row_stride, _1{}, p.k_head_stride, p.k_batch_stride));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)), shape_v,
                          make_stride(p.v_row_stride, _1{}, p.v_head_stride, p.v_batch_stride));
  Tensor mO = make_tensor(make_gmem_ptr(static_cast<typename Traits::ElementOut*>(p.o)), shape_o,
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride));
  kp.tma_load_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Traits::SmemLayoutQ{},
                                Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_load_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                                Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_load_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutV{}),
                                Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{}, _1{});
  kp.tma_store_o = make_tma_copy(SM90_TMA_STORE{}, mO, typename Traits::SmemLayoutO{},
                                 Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>{}, _1{});
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_q, "q"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_k, "k"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_v, "v"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_store_o, "out"));
  kp.shape_q = shape_q;
  kp.shape_k = shape_k;
  kp.shape_v = shape_v;
  kp.shape_o = shape_o;
  kp.lse = p.lse;
  kp.lse_batch_stride = p.lse_batch_stride;
  kp.lse_head_stride = p.lse_head_stride;
  kp.mask = make_mask_spec(p);
  kp.tile_heads = p.heads_q;
  kp.heads_per_kv = p.heads_q / p.heads_kv;
  kp.num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if constexpr (Traits::kPackGQA) {
    // P query heads per tile: g when packing (p.pack_gqa == 1, decided by
    // plan_forward), 1 for a split launch that does not pack. Tiles over
    // seqlen_q x P packed rows (fwd_pack_gqa keeps that product, and the
    // packed row index, below 2^31); the schedulers span heads x splits.
    const int pack = p.pack_gqa == 1 ? kp.heads_per_kv : 1;
    kp.num_splits = p.num_splits > 1 ? p.num_splits : 1;
    kp.tile_heads = p.heads_q / pack * kp.num_splits;
    kp.num_m_blocks = int((int64_t(p.seqlen_q) * pack + Traits::kBlockM - 1) / Traits::kBlockM);
    kp.q_ptr = static_cast<Element const*>(p.q);
    kp.o_ptr = static_cast<typename Traits::ElementOut*>(p.o);
    kp.q_row_stride = p.q_row_stride;
    kp.q_head_stride = p.q_head_stride;
    kp.q_batch_stride = p.q_batch_stride;
    kp.o_row_stride = p.o_row_stride;
    kp.o_head_stride = p.o_head_stride;
    kp.o_batch_stride = p.o_batch_stride;
    kp.pack_divmod = cutlass::FastDivmod(pack);
    // kv_direct stays off here (launch_fwd_kvcache_direct turns it on).
    kp.kv_direct = false;
#if FLASH3_SERVING_WIP
    kp.kv_tile_map = false;
#endif
    kp.page_table = nullptr;
    if constexpr (Traits::kPagedKV) {
      kp.k_ptr = static_cast<Element const*>(p.k);
      kp.v_ptr = static_cast<Element const*>(p.v);
      kp.k_row_stride = p.k_row_stride;
      kp.k_head_stride = p.k_head_stride;
      kp.v_row_stride = p.v_row_stride;
      kp.v_head_stride = p.v_head_stride;
      if (p.page_table != nullptr) {
        kp.page_table = p.page_table;
        kp.page_table_batch_stride = p.page_table_batch_stride;
        kp.page_divmod = cutlass::FastDivmod(p.page_size);
      }
    }
  }
  // The score modifier's scales (identity: the plain softmax_scale pair).
  const ScoreModScales sc =
      score_mod_scales(p.softmax_scale, p.softmax_scale_log2, Traits::ScoreMod::kEnabled ? p.softcap : 0.f);
  kp.softmax_scale = sc.lse_scale;
  kp.softmax_scale_log2 = sc.scale_log2;
  if constexpr (Traits::ScoreMod::kEnabled) kp.score_mod_scale = sc.pre_scale;
  if constexpr (Traits::kFp8) {
    kp.q_descale = p.q_descale;
    kp.k_descale = p.k_descale;
    kp.v_descale = p.v_descale;
    kp.q_descale_batch_stride = p.q_descale_batch_stride;
    kp.q_descale_head_stride = p.q_descale_head_stride;
    kp.k_descale_batch_stride = p.k_descale_batch_stride;
    kp.k_descale_head_stride = p.k_descale_head_stride;
    kp.v_descale_batch_stride = p.v_descale_batch_stride;
    kp.v_descale_head_stride = p.v_descale_head_stride;
    kp.q_descale_qhead_stride = p.q_descale_qhead_stride;
    kp.q_descale_block_stride = p.q_descale_block_stride;
    kp.k_descale_block_stride = p.k_descale_block_stride;
    kp.v_descale_block_stride = p.v_descale_block_stride;
  }
  return Status::Ok();
}

// Split launches: the partials at the plan's offsets in the workspace
// (FwdWorkspaceLayout::split) and their strides; rows = batch x seqlen_q or
// total_q.
template <class Traits, class KParams>
Status set_split_partials(const FwdPlan& plan, KParams& kp) {
  if (kp.num_splits <= 1) return Status::Ok();
  const FwdParams& p = plan.params;
  if (p.workspace == nullptr) return Status{StatusCode::kInternal, "split forward: no workspace"};
  if (kp.num_splits != p.num_splits || plan.workspace.split.bytes == 0)
    return Status{StatusCode::kInternal, "split forward: the plan's workspace has no partials for this launch"};
  const int64_t sq = p.seqlen_q, rows = int64_t(p.varlen ? 1 : p.batch) * sq;
  const FwdSplitLayout& l = plan.workspace.split;
  char* base = static_cast<char*>(p.workspace);
  kp.lse_partial = reinterpret_cast<float*>(base + l.lse_offset);
  kp.o_partial = reinterpret_cast<float*>(base + l.o_offset);
  kp.op_row_stride = int64_t(p.heads_q) * Traits::kHeadDimV;
  kp.op_batch_stride = p.varlen ? 0 : sq * kp.op_row_stride;
  kp.op_split_stride = rows * kp.op_row_stride;
  kp.lp_head_stride = sq;
  kp.lp_batch_stride = p.varlen ? 0 : sq * p.heads_q;
  kp.lp_split_stride = rows * p.heads_q;
  return Status::Ok();
}

// Split launches, after the attention kernel: the combine into out / lse.
template <class Traits, class KParams>
Status combine_split_partials(const FwdParams& p, KParams const& kp, cudaStream_t stream) {
  if (kp.num_splits <= 1) return Status::Ok();
  CombineParams c;
  c.out_partial = kp.o_partial;
  c.lse_partial = kp.lse_partial;
  c.out = p.o;
  c.out_dtype = p.dtype;
  c.lse = p.lse;
  c.num_splits = kp.num_splits;
  c.batch = p.varlen ? 1 : p.batch;
  c.seqlen = p.seqlen_q;
  c.heads = p.heads_q;
  c.head_dim = Traits::kHeadDimV;
  c.op_split_stride = kp.op_split_stride;
  c.op_batch_stride = kp.op_batch_stride;
  c.op_row_stride = kp.op_row_stride;
  c.op_head_stride = Traits::kHeadDimV;
  c.lp_split_stride = kp.lp_split_stride;
  c.lp_batch_stride = kp.lp_batch_stride;
  c.lp_row_stride = 1;
  c.lp_head_stride = kp.lp_head_stride;
  c.o_batch_stride = p.varlen ? 0 : p.o_batch_stride;
  c.o_row_stride = p.o_row_stride;
  c.o_head_stride = p.o_head_stride;
  c.lse_batch_stride = p.varlen ? 0 : p.lse_batch_stride;
  c.lse_row_stride = 1;
  c.lse_head_stride = p.lse_head_stride;
  if constexpr (Traits::kVarlen) {
    c.seqs = kp.varlen.seqs;
    c.num_seqs = p.batch;
  }
  return launch_combine(c, stream);
}

template <class Traits, class Scheduler>
Status launch_fwd_variant(const FwdPlan& plan, cudaStream_t stream) {
  using Element = typename Traits::Element;
  const FwdParams& p = plan.params;
  typename Traits::Params kp{};
  FLASH3_RETURN_IF_ERROR(build_fwd_kernel_params<Traits>(p, kp));

  constexpr auto kernel = &flash_fwd_kernel<Traits, Scheduler>;
  constexpr int smem = Traits::kSmemBytes;
  kp.tile_order = fwd_tile_order(p, kp.num_m_blocks, Traits::kHeadDim, Traits::kHeadDimV, sizeof(Element));
  kp.batch = p.batch;
  dim3 grid;
  if constexpr (Traits::kPersistent) {
    int num_sms = 0;
    FLASH3_RETURN_IF_ERROR(current_sm_count(&num_sms));
    grid = Scheduler::grid(kp.num_m_blocks, kp.tile_heads, p.batch, num_sms);
  } else {
    grid = Scheduler::grid(kp.num_m_blocks, kp.tile_heads, p.batch, kp.tile_order);
  }
  if constexpr (Traits::kPersistent && Scheduler::kDynamic) {
    // The tile counter: in the call's workspace (stream-ordered), zeroed
    // before the kernel (one 4-byte memset; safe under concurrent launches on
    // other streams and in CUDA graphs, unlike a shared counter that the
    // kernel resets itself).
    int* tile_counter = static_cast<int*>(p.workspace);
    if (tile_counter == nullptr || plan.workspace.tile_counter_bytes < sizeof(int))
      return Status{StatusCode::kInternal, "forward: no workspace for the tile counter in the plan or the call"};
    FLASH3_RETURN_IF_ERROR(
        cuda_call(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream), "cudaMemsetAsync(tile counter)"));
    return launch_kernel_smem<kernel>("flash3 forward kernel launch", grid, dim3(Traits::kNumThreads), smem, stream,
                                      kp, tile_counter);
  }
  if constexpr (Traits::kSplit) FLASH3_RETURN_IF_ERROR(set_split_partials<Traits>(plan, kp));
  FLASH3_RETURN_IF_ERROR(launch_kernel_smem<kernel>("flash3 forward kernel launch", grid, dim3(Traits::kNumThreads),
                                                    smem, stream, kp, static_cast<int*>(nullptr)));
  if constexpr (Traits::kSplit) return combine_split_partials<Traits>(p, kp, stream);
  return Status::Ok();
}

inline VarlenSeqs varlen_seqs_of(const FwdParams& p) {
  VarlenSeqs s{p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k, p.batch, p.seqlen_q, p.seqlen_k};
  if (p.kv_cache) {
    s.fixed_seqlen_q = p.max_seqlen_q;
    s.k_rows_per_batch = p.kv_rows_per_batch;
#if FLASH3_SERVING_WIP
    s.k_entries = p.kv_entries;
    s.cu_k_new = p.cu_seqlens_k_new;
    s.total_k_new = p.total_k_new;
#endif
    s.k_batch_idx = p.kv_batch_idx;
    s.k_leftpad = p.leftpad_k;
    s.k_new = p.seqlen_k_new;
  }
  return s;
}

// One prep thread per tensor map (at least one CTA: CTA 0 writes the tile map).
inline dim3 varlen_prep_grid(int num_seqs) {
  const int64_t maps = int64_t(num_seqs) * kNumVarlenDesc;
  const int64_t ctas = (maps + kVarlenPrepThreads - 1) / kVarlenPrepThreads;
  return dim3(unsigned(ctas > 0 ? ctas : 1));
}

// KV-cache forward without the prep kernel (paged caches): every sequence
// has max_seqlen_q query rows, so the grid is the tile map
// (KVCacheTileScheduler); each CTA computes its sequence's rows
// (varlen_seq_info) and the producer warpgroup gathers K/V
// (FwdMainloop::load_gathered, or fwd/paged_kv.h with FLASH3_SERVING_WIP),
// so no tensor maps are needed. The split
// partials start at the workspace's base.
template <class Traits>
Status launch_fwd_kvcache_direct(const FwdPlan& plan, cudaStream_t stream) {
  static_assert(Traits::kPagedKV, "the packed varlen kernels gather K/V");
  const FwdParams& p = plan.params;
  typename Traits::Params kp{};
  FLASH3_RETURN_IF_ERROR(build_fwd_kernel_params<Traits>(varlen_as_one_batch(p), kp));
  kp.tile_order = -1;
  kp.batch = p.batch;
  kp.kv_direct = true;
#if FLASH3_SERVING_WIP
  kp.kv_tile_map = false;
#endif
  kp.kv_seqs = varlen_seqs_of(p);
  const int64_t rows = int64_t(p.max_seqlen_q) * kp.pack_divmod.divisor;
  const int64_t m_blocks = (rows + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks * p.batch > int64_t(INT32_MAX)) return Status::Invalid("kvcache: more than 2^31 query tiles");
  kp.num_m_blocks = int(m_blocks);
  if constexpr (Traits::kSplit) FLASH3_RETURN_IF_ERROR(set_split_partials<Traits>(plan, kp));
  // The varlen kernel itself: with kv_direct it takes its tile from
  // KVCacheTileScheduler's grid at run time (one instantiation serves both).
  constexpr auto kernel = &flash_fwd_kernel<Traits, VarlenTileScheduler>;
  FLASH3_RETURN_IF_ERROR(launch_kernel_smem<kernel>(
      "flash3 forward kernel launch", KVCacheTileScheduler::grid(kp.num_m_blocks, p.batch, kp.tile_heads),
      dim3(Traits::kNumThreads), Traits::kSmemBytes, stream, kp, static_cast<int*>(nullptr)));
  if constexpr (Traits::kSplit) return combine_split_partials<Traits>(p, kp, stream);  // (rows of one batch: no seqs)
  return Status::Ok();
}

// Variable-length forward: the prep kernel (per-sequence info, tensor maps
// and tile map, all on the device), then the attention kernel over the tile
// map's upper bound, on one stream; both use the call's workspace.
template <class Traits>
Status launch_fwd_varlen(const FwdPlan& plan, cudaStream_t stream) {
  static_assert(Traits::kVarlen && !Traits::kPersistent, "varlen runs one tile per CTA");
  const FwdParams& p = plan.params;
  if constexpr (Traits::kPagedKV) {
    if (p.kv_cache && p.kv_direct && !p.kv_tile_map) return launch_fwd_kvcache_direct<Traits>(plan, stream);
  }
  typename Traits::Params kp{};
  FLASH3_RETURN_IF_ERROR(build_fwd_kernel_params<Traits>(varlen_as_one_batch(p), kp));
  kp.tile_order = -1;
  kp.batch = p.batch;
  // PackGQA: each sequence has seqlen_q x P packed rows.
  int64_t rows = p.seqlen_q;
  if constexpr (Traits::kPackGQA) rows *= kp.pack_divmod.divisor;
  const int64_t bound = varlen_tiles_bound(rows, p.batch, Traits::kBlockM);
  if (bound > int64_t(INT32_MAX)) return Status::Invalid("varlen: more than 2^31 query tiles");
  // The scratch is the call's workspace, sized by the plan for this tile
  // shape and packing.
  if (p.workspace == nullptr) return Status{StatusCode::kInternal, "varlen forward: no workspace"};
  if (bound != plan.workspace.varlen_tiles)
    return Status{StatusCode::kInternal, "varlen forward: the plan's workspace is sized for another tile bound"};
  kp.varlen = varlen_scratch_at(p.workspace, p.batch, bound);
#if FLASH3_SERVING_WIP
  if constexpr (Traits::kPagedKV) {
    // A gathering KV-cache launch whose sequences have several query tiles:
    // the prep kernel's tile map and sequence info, K/V gathered (its K/V
    // tensor maps go unused).
    if (p.kv_cache && p.kv_direct) {
      kp.kv_direct = true;
      kp.kv_tile_map = true;
      kp.kv_seqs = varlen_seqs_of(p);
    }
  }
#endif

  VarlenPrepArgs a{};
  a.seqs = varlen_seqs_of(p);
  a.q = {p.q, p.q_row_stride, p.q_head_stride};
  a.k = {p.k, p.k_row_stride, p.k_head_stride};
  a.v = {p.v, p.v_row_stride, p.v_head_stride};
  a.o = {p.o, p.o_row_stride, p.o_head_stride};
  a.longest_first = Traits::Mask::kHasRight;
  a.scratch = kp.varlen;
  FLASH3_RETURN_IF_ERROR(launch_kernel("flash3 varlen prep launch", flash_fwd_varlen_prep_kernel<Traits>,
                                       varlen_prep_grid(p.batch), dim3(kVarlenPrepThreads), 0, stream, kp, a));
  if constexpr (Traits::kSplit) {
    FLASH3_RETURN_IF_ERROR(set_split_partials<Traits>(plan, kp));
  }
  constexpr auto kernel = &flash_fwd_kernel<Traits, VarlenTileScheduler>;
  FLASH3_RETURN_IF_ERROR(launch_kernel_smem<kernel>(
      "flash3 forward kernel launch", VarlenTileScheduler::grid(int(bound), kp.tile_heads), dim3(Traits::kNumThreads),
      Traits::kSmemBytes, stream, kp, static_cast<int*>(nullptr)));
  if constexpr (Traits::kSplit) return combine_split_partials<Traits>(p, kp, stream);
  return Status::Ok();
}

// The tile table's shapes. (d = 64 causal: the three-warpgroup tile spills
// 12 STL / 15 LDL in one main loop at 160 registers without persistence, yet
// measured 0.970 / 0.997 of the fixed-length kernel at 8k / 16k against
// 0.888 / 0.913 for the two-warpgroup sliding-window tile, which does not
// spill; docs/performance.md.)
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod, class Mask, bool kCausalOrLocal,
          bool kPackGQA = false>
Status run_fwd_varlen_mask(const FwdPlan& plan, cudaStream_t stream) {
  using Cfg = OneTileConfig<DefaultFwdConfig<kHeadDim, kHeadDimV, kCausalOrLocal, Mask::kHasLeft>>;
  return launch_fwd_varlen<FwdTraits<Element, kHeadDim, kHeadDimV, Cfg, Mask, true, ScoreMod, kPackGQA>>(plan, stream);
}

// PackGQA (fixed length): the varlen tile shapes (one tile per CTA), causal
// and local tiles in longest-first order.
template <class Element, int kHeadDim, int kHeadDimV, class Mask, class Scheduler, bool kCausalOrLocal>
Status run_fwd_packed_mask(const FwdPlan& plan, cudaStream_t stream) {
  using Cfg = OneTileConfig<DefaultFwdConfig<kHeadDim, kHeadDimV, kCausalOrLocal, Mask::kHasLeft>>;
  using Traits = FwdTraits<Element, kHeadDim, kHeadDimV, Cfg, Mask, false, ScoreModIdentity, true>;
  return launch_fwd_variant<Traits, Scheduler>(plan, stream);
}

// The PackGQA unit's entry (the manifest's "packgqa" feature; dispatch.cu
// calls it where the plan says so: FwdPlan::packed_unit).
template <class Element, int kHeadDim, int kHeadDimV>
Status run_fwd_packed(const FwdPlan& plan, cudaStream_t stream) {
  const FwdParams& p = plan.params;
  if (p.varlen) {
    if (p.is_local) return run_fwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreModIdentity, MaskLocal, true, true>(plan, stream);
    if (p.is_causal) return run_fwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreModIdentity, MaskCausal, true, true>(plan, stream);
    return run_fwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreModIdentity, MaskNone, false, true>(plan, stream);
  }
  if (p.is_local) return run_fwd_packed_mask<Element, kHeadDim, kHeadDimV, MaskLocal, LptTileScheduler, true>(plan, stream);
  if (p.is_causal) return run_fwd_packed_mask<Element, kHeadDim, kHeadDimV, MaskCausal, LptTileScheduler, true>(plan, stream);
  return run_fwd_packed_mask<Element, kHeadDim, kHeadDimV, MaskNone, SingleTileScheduler, false>(plan, stream);
}

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod, class Mask, class Scheduler,
          bool kCausalOrLocal, bool kShortCausal = false>
Status run_fwd_mask(const FwdPlan& plan, cudaStream_t stream) {
  constexpr bool kFp8 = sizeof(Element) == 1;
  using Base = DefaultFwdConfig<kHeadDim, kHeadDimV, kCausalOrLocal, Mask::kHasLeft, kShortCausal, kFp8>;
  using PersistentSched = std::conditional_t<kCausalOrLocal, DynamicLptTileScheduler, PersistentTileScheduler>;
  using Sched = std::conditional_t<Base::value.persistent, PersistentSched, Scheduler>;
  using Traits = FwdTraits<Element, kHeadDim, kHeadDimV, Base, Mask, false, ScoreMod, false, FwdOutputOf<Element>>;
  return launch_fwd_variant<Traits, Sched>(plan, stream);
}

// Mask variant and scheduler: causal/local tiles are unequal, so they use the
// longest-first order; unmasked tiles keep m_block fastest for L2 reuse.
// ScoreMod (the manifest's feature axis) is fixed per generated unit.
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_fwd_16bit(const FwdPlan& plan, cudaStream_t stream) {
  const FwdParams& p = plan.params;
  if (p.varlen) {
    if (p.is_local) return run_fwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskLocal, true>(plan, stream);
    if (p.is_causal) return run_fwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskCausal, true>(plan, stream);
    return run_fwd_varlen_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskNone, false>(plan, stream);
  }
  if (p.is_local) {
    return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskLocal, LptTileScheduler, true>(plan, stream);
  }
  if (p.is_causal) {
    // Head dims whose causal problems all take the short-causal kernel
    // (fwd_short_causal: d <= 64) do not instantiate the other one.
    constexpr bool kAlwaysShort = fwd_short_causal(kHeadDim, std::numeric_limits<int>::max());
    static_assert(!kAlwaysShort || fwd_has_short_causal(kHeadDim, kHeadDimV), "short-causal kernel missing");
    if constexpr (fwd_has_short_causal(kHeadDim, kHeadDimV)) {
      // The plan's choice (fwd_short_causal on seqlen_k): the persistent kernel with the tile counter.
      if (kAlwaysShort || plan.dynamic_causal) {
        return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskCausal, LptTileScheduler, true, true>(plan,
                                                                                                              stream);
      }
    }
    if constexpr (!kAlwaysShort) {
      return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskCausal, LptTileScheduler, true>(plan, stream);
    }
  }
  return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskNone, SingleTileScheduler, false>(plan, stream);
}

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_fwd(const FwdPlan& plan, cudaStream_t stream) {
  const FwdParams& p = plan.params;
  if constexpr (sizeof(Element) == 1) {
    // FP8: fixed length; causal and local tiles one per CTA, longest first
    // (no short-causal persistent kernel: fwd_tile_config).
    if (p.varlen) return Status::NotSupported("fp8 with variable-length batches (opts.cu_seqlens_q)");
    if (p.is_local) return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskLocal, LptTileScheduler, true>(plan, stream);
    if (p.is_causal) return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskCausal, LptTileScheduler, true>(plan, stream);
    return run_fwd_mask<Element, kHeadDim, kHeadDimV, ScoreMod, MaskNone, SingleTileScheduler, false>(plan, stream);
  } else {
    return run_fwd_16bit<Element, kHeadDim, kHeadDimV, ScoreMod>(plan, stream);
  }
}

}  // namespace flash3
