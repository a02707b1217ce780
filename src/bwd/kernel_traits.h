// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Compile-time description of one backward variant (seed chapters 7-8): tile
// shapes, the five tiled WGMMAs, shared-memory layouts (with the transposed
// views the dual-orientation operands need), TMA types, shared storage.
//
// GEMMs per iteration, keys split (d <= 128; warpgroup w owns keys [64w, 64w + 64)):
//   G1 S^T  = K Q^T      SS  A = sK (K-major)        B = sQ  (K-major)
//   G2 dP^T = V dO^T     SS  A = sV (K-major)        B = sdO (K-major)
//   G3 dV  += P^T dO     RS  A = P^T (registers)     B = sdO read MN-major
//   G4 dQ   = dS K       SS  A = sdS (MN-major)      B = sK read MN-major (N split over warpgroups;
//                                                       tile_m = 128: M split, one query half each)
//      or dQ^T = K^T dS^T SS A = sK read MN-major    B = sdS (MN-major)   (tile_m = 80: swapAB,
//                                                       M = head_dim split over warpgroups)
//   G5 dK  += dS^T Q     RS  A = dS^T (registers)    B = sQ read MN-major
// Head dim split (d > 128; 64 keys, warpgroup w owns half of the queries of
// S^T / dP^T and half of the columns of dK / dV / dQ):
//   G1, G2 as above on the warpgroup's queries; P^T and dS^T to shared memory;
//   G3 dV  += P^T dO     SS  A = sP^T (K-major)      B = sdO read MN-major (N split)
//   G5 dK  += dS^T Q     SS  A = sdS^T (K-major)     B = sQ read MN-major (N split)
//   G4 as above.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/block_info.h"
#include "common/seqlen.h"
#include "config/tile_size.h"
#include "fusion/mask.h"
#include "fusion/score_mod.h"

namespace flash3 {
using namespace cute;

template <int D, int DV, bool kCausalOrLocal, bool kShortQ = false>
struct DefaultBwdConfig {
  static constexpr BwdTileConfig value = bwd_tile_config(D, DV, kCausalOrLocal, kShortQ);
};

template <class Element_, int kHeadDim_, int kHeadDimV_, class Cfg, class Mask_, bool kVarlen_ = false,
          class ScoreMod_ = ScoreModIdentity>
struct BwdTraits {
  using Element = Element_;
  using Mask = Mask_;
  using ScoreMod = ScoreMod_;  // fusion/score_mod.h
  // Variable-length batches: per-sequence tensor maps and tile maps
  // (bwd/varlen_prep.h); one KV tile per CTA, no split plan, no row shift.
  static constexpr bool kVarlen = kVarlen_;
  static constexpr BwdTileConfig kCfg = Cfg::value;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kCfg.tile_m;
  static constexpr int kBlockN = kCfg.tile_n;
  static constexpr int kStagesQ = kCfg.q_stages;
  static constexpr int kStagesdO = kCfg.do_stages;
  // Two dS buffers: with one PdS barrier per iteration a warpgroup can be at
  // most one iteration ahead of the other, so it never overwrites the buffer
  // the slower warpgroup's dQ GEMM is still reading.
  static constexpr int kStagesdS = 2;
  static constexpr int kNumMmaWG = kCfg.num_mma_wg;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWG;
  static constexpr int kNumThreads = kNumMmaThreads + 128;
  static constexpr int kProducerRegs = kCfg.producer_regs;
  static constexpr int kConsumerRegs = kCfg.consumer_regs;
  static constexpr bool kSplitHdim = kCfg.split_hdim;
  // dQ = dS K. With one 64-row query block per warpgroup (tile_m = 128, keys
  // split) each warpgroup computes all head_dim columns of its own queries:
  // m64 x n(head_dim) SS reads 4 KB of shared memory per 32 tensor-clocks at
  // d = 64, where splitting the columns (m128 x n32 per warpgroup) reads 6 KB.
  // Otherwise the head_dim columns are split over the consumer warpgroups.
  // A query tile that is not a multiple of the 64-row WGMMA atom (tile_m = 80
  // at d = 128) computes dQ^T = K^T dS^T instead (swapAB): warpgroup w owns
  // head_dim rows [64w, 64w + 64) and all tile_m queries (N = tile_m).
  static constexpr bool kdQSplitM = !kSplitHdim && kBlockM == 64 * kNumMmaWG;
  static constexpr bool kdQSwapAB = !kSplitHdim && kBlockM % 64 != 0;
  static constexpr int kdQCols = kdQSplitM ? kHeadDim : kHeadDim / kNumMmaWG;
  static constexpr int kdQChunk = kBlockM * kHeadDim / kNumMmaWG;  // fp32 values per warpgroup and query block
  // Wide query tiles (keys split, tile_m >= kBwdLeanSdPMinTileM: 80 at
  // d = 128, 128 at d = 64) carry S^T and dP^T of 40-64 registers each next
  // to dK / dV: the LSE is read from shared memory inside the exp2 loop (not
  // held per column), and dS^T = P^T (dP^T - D) uses the packed 16-bit P^T that
  // G3 reads, so the fp32 S^T dies at the conversion.
  static constexpr bool kLeanSdP = !kSplitHdim && kBlockM >= kBwdLeanSdPMinTileM;

  static_assert(kBlockN == (kSplitHdim ? 64 : 64 * kNumMmaWG), "tile_n: 64 keys per consumer warpgroup, or 64 split");
  static_assert(kBlockM % 16 == 0 && kBlockM <= 128, "tile_m: a multiple of 16, at most 128");
  static_assert(kBlockM % 64 == 0 || (!kSplitHdim && kHeadDim == 64 * kNumMmaWG),
                "a tile_m that is not a multiple of 64 needs dQ swapAB: keys split and 64 head_dim rows per warpgroup");
  static_assert(kHeadDim % (16 * kNumMmaWG) == 0 && kHeadDimV % (kSplitHdim ? 16 * kNumMmaWG : 16) == 0,
                "unsupported head dims");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kNumMmaThreads <= 65536, "register file overcommitted");

  using SplitM = Layout<Shape<Int<kNumMmaWG>, _1, _1>>;
  using SplitN = Layout<Shape<_1, Int<kNumMmaWG>, _1>>;
  // S^T / dP^T: keys split (M) or queries split (N).
  using SdPSplit = std::conditional_t<kSplitHdim, SplitN, SplitM>;
  static constexpr int kSdPAtomN = kSplitHdim ? kBlockM / kNumMmaWG : kBlockM;
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kSdPAtomN>, Int<kHeadDim>>>(), SdPSplit{}));
  using TiledMmadP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kSdPAtomN>, Int<kHeadDimV>>>(), SdPSplit{}));
  using TiledMmadVRS = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      SplitM{}));
  using TiledMmadKRS = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      SplitM{}));
  using TiledMmadVSS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV / kNumMmaWG>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      SplitN{}));
  using TiledMmadKSS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / kNumMmaWG>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      SplitN{}));
  using TiledMmadV = std::conditional_t<kSplitHdim, TiledMmadVSS, TiledMmadVRS>;
  using TiledMmadK = std::conditional_t<kSplitHdim, TiledMmadKSS, TiledMmadKRS>;
  using TiledMmadQNormal = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kdQCols>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      std::conditional_t<kdQSplitM, SplitM, SplitN>{}));
  // dQ^T (head_dim x queries) = K^T (A: sK read MN-major) x dS^T (B: sdS, queries contiguous).
  using TiledMmadQSwapAB = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      SplitM{}));
  using TiledMmadQ = std::conditional_t<kdQSwapAB, TiledMmadQSwapAB, TiledMmadQNormal>;
  // Shape of the dQ accumulator tile: (queries, head_dim), or transposed for swapAB.
  using ShapedQAcc = std::conditional_t<kdQSwapAB, Shape<Int<kHeadDim>, Int<kBlockM>>, Shape<Int<kBlockM>, Int<kHeadDim>>>;

  // Swizzle atoms. A buffer read in two orientations must use an atom both
  // reads can decode (seed 8.2): sK is also read MN-major by G4 in per-warpgroup
  // slices of kdQCols columns, so its atom is chosen from that width.
  template <GMMA::Major M, int MN, int K>
  using Atom = decltype(cutlass::gemm::collective::detail::ss_smem_selector<M, Element, Int<MN>, Int<K>>());
  // Q and dO are read MN-major by G5 / G3 in per-warpgroup column slices when
  // the head dim is split (96 columns for d = 192 need the 64-byte swizzle).
  static constexpr int kQAtomCols = kSplitHdim ? kHeadDim / kNumMmaWG : kHeadDim;
  static constexpr int kdOAtomCols = kSplitHdim ? kHeadDimV / kNumMmaWG : kHeadDimV;
  using SmemLayoutQ = decltype(tile_to_shape(Atom<GMMA::Major::K, kBlockM, kQAtomCols>{},
                                             Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStagesQ>>{}));
  using SmemLayoutdO = decltype(tile_to_shape(Atom<GMMA::Major::K, kBlockM, kdOAtomCols>{},
                                              Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStagesdO>>{}));
  using SmemLayoutK = decltype(tile_to_shape(Atom<GMMA::Major::K, kBlockN, kdQCols>{},
                                             Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = decltype(tile_to_shape(Atom<GMMA::Major::K, kBlockN, kHeadDimV>{},
                                             Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
  // dS is stored query-contiguous (MN-major for G4's A operand), which is also
  // the direction in which each thread's accumulator pairs are adjacent.
  using SmemLayoutdS = decltype(tile_to_shape(Atom<GMMA::Major::MN, kBlockM, kBlockN>{},
                                              Shape<Int<kBlockM>, Int<kBlockN>, Int<kStagesdS>>{}));
  // Transposed views: descriptor reinterpretations, no data movement.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(make_shape(Int<kHeadDim>{}, Int<kBlockM>{}, Int<kStagesQ>{}), Step<_2, _1, _3>{})));
  using SmemLayoutdOt = decltype(composition(
      SmemLayoutdO{}, make_ordered_layout(make_shape(Int<kHeadDimV>{}, Int<kBlockM>{}, Int<kStagesdO>{}), Step<_2, _1, _3>{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(make_shape(Int<kHeadDim>{}, Int<kBlockN>{}), Step<_2, _1>{})));
  // P (head-dim split only) has dS's layout; G3 reads it as P^T (keys x queries).
  using SmemLayoutP = SmemLayoutdS;
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_ordered_layout(make_shape(Int<kBlockN>{}, Int<kBlockM>{}, Int<kStagesdS>{}), Step<_2, _1, _3>{})));

  // Byte offset of sdS(query, key, stage) (and of sP, same layout): the 128-byte
  // swizzle that the smem tensor applies to its pointer, here on a 32-bit
  // offset so the consumers can store with st.shared (unit test:
  // tests/unit/test_bwd_smem_offsets.cu).
  CUTLASS_HOST_DEVICE static uint32_t ds_byte_offset(int query, int key, int stage) {
    return ds_swizzle(ds_linear_bytes(query, key, stage));
  }
  CUTLASS_HOST_DEVICE static uint32_t ds_linear_bytes(int query, int key, int stage) {
    constexpr auto linear = get_nonswizzle_portion(SmemLayoutdS{});
    return uint32_t(linear(query, key, stage)) * uint32_t(sizeof(Element));
  }
  CUTLASS_HOST_DEVICE static uint32_t ds_swizzle(uint32_t linear_bytes) {
    constexpr auto swizzle = get_swizzle_portion(SmemLayoutdS{});
    return swizzle(linear_bytes);
  }

  // With keys split every warp's accumulator covers queries [0, tile_m), so a
  // thread's stmatrix rows are queries q < 16 plus 16 i. The swizzle atoms are
  // at least 16 queries wide, so the unswizzled offset is additive:
  //   ds_linear_bytes(q + 16 i, key, stage) == ds_linear_bytes(q, key, stage) + ds_linear_bytes(16 i, 0, 0)
  // (unit test), and a store costs an add of a constant and the swizzle. Without
  // this nvcc hoisted per-store address terms and spilled them (tile_m = 80 / 128).
  static constexpr bool kdSQueryBlockStep = !kSplitHdim;

  using ShapeQKV = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = cute::Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensorIn = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmadO = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, take<0, 2>(SmemLayoutdO{}),
                                       Shape<Int<kBlockM>, Int<kHeadDimV>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, SmemLayoutV{},
                                      Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}));

  static constexpr uint32_t kBytesStats = kBlockM * sizeof(float);
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element) + kBytesStats;     // + LSE
  static constexpr uint32_t kTmaBytesdO = kBlockM * kHeadDimV * sizeof(Element) + kBytesStats;  // + D
  static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesV = kBlockN * kHeadDimV * sizeof(Element);

  using PipelineQ = cutlass::PipelineTmaAsync<kStagesQ>;
  using PipelinedO = cutlass::PipelineTmaAsync<kStagesdO>;
  using PipelineStateQ = cutlass::PipelineState<kStagesQ>;
  using PipelineStatedO = cutlass::PipelineState<kStagesdO>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> smem_v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>, 1024> smem_do;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>, 1024> smem_ds;
    cute::array_aligned<Element, kSplitHdim ? cute::cosize_v<SmemLayoutP> : 8, 1024> smem_p;
    cute::array_aligned<float, kdQChunk * kNumMmaWG, 128> smem_dq;  // dQ staging, one chunk per warpgroup
    cute::array_aligned<float, kBlockM * kStagesQ, 128> smem_lse;
    cute::array_aligned<float, kBlockM * kStagesdO, 128> smem_dpsum;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_k;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_v;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelinedO::SharedStorage pipeline_do;
    int split_last;  // BwdEpilogue::combine_pieces: this piece finished last
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared storage exceeds the 227 KB per-CTA limit");

  struct FixedParams {
    TmaQ tma_load_q;
    TmadO tma_load_do;
    TmaK tma_load_k;
    TmaV tma_load_v;
    ShapeQKV shape_q, shape_k, shape_v, shape_do;
    const float* lse_log2;  // workspace, (b, hq, seqlen_q_pad)
    const float* dpsum;
    float* dq_accum;
    int* dq_sem;
    Element* dk;
    Element* dv;
    int64_t dk_row_stride, dk_head_stride, dk_batch_stride;
    int64_t dv_row_stride, dv_head_stride, dv_batch_stride;
    MaskSpec mask;   // in padded-grid rows: seqlen_q includes row_shift
    int row_shift;   // bwd_row_shift: padded row r is query r - row_shift (Q / dO loads start there)
    int heads_q, heads_kv, heads_per_kv, num_m_blocks, seqlen_q_pad;
    float softmax_scale, softmax_scale_log2;
    bool deterministic;
    int tile_group;  // BwdScheduler: (KV head, batch) pairs per longest-first group (0: one group)
    int tail_heads;  // BwdScheduler: the last pairs, launched as one longest-first group (BwdScheduler::tail_heads)
    int num_n_blocks;
    int split_first, split_pieces;  // BwdSplitPlan (unmasked launches): blocks from split_first on run in pieces
    float* split_partials;          // workspace: one (kBlockN x (d + dv)) fp32 slot per piece
    int* split_count;               // workspace: pieces done per split block
  };
  // Varlen: the per-query-block scratch is laid out as one batch element of
  // num_m_blocks = the query-tile bound (sequence b's blocks start at
  // varlen.q_tile_start[b]), plus the prep kernel's outputs.
  struct VarlenParams : FixedParams {
    VarlenScratch varlen;
  };
  using BaseParams = std::conditional_t<kVarlen, VarlenParams, FixedParams>;
  // A score modifier adds its pre-scale (the identity keeps BaseParams as it is).
  struct ScoreModParams : BaseParams {
    float score_mod_scale;
  };
  using Params = std::conditional_t<ScoreMod::kEnabled, ScoreModParams, BaseParams>;
};

}  // namespace flash3
