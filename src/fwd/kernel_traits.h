// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Compile-time description of one forward variant: tile shapes, WGMMA atoms,
// shared-memory layouts, TMA atom types and the shared-storage plan.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/fast_math.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/seqlen.h"
#include "common/varlen.h"
#include "config/tile_size.h"
#include "fusion/mask.h"
#include "fusion/score_mod.h"

namespace flash3 {
using namespace cute;

// A tile-config "value type": Cfg::value is the FwdTileConfig to build.
template <int D, int DV, bool kCausalOrLocal, bool kLocal = false, bool kShortCausal = false, bool kFp8 = false>
struct DefaultFwdConfig {
  static constexpr FwdTileConfig value = fwd_tile_config(D, DV, kCausalOrLocal, kLocal, kShortCausal, kFp8);
};

// O's element type for an input type: FP8 inputs write bf16 (seed 6.3).
template <class Element>
using FwdOutputOf = std::conditional_t<sizeof(Element) == 1, cutlass::bfloat16_t, Element>;

// Stands in for the transposed-V pipeline of the 16-bit kernels (none).
struct NoPipeline {};

// Varlen configs: the tile table's shapes with one tile per CTA (the varlen
// scheduler hands out tiles from the map the prep kernel wrote).
constexpr FwdTileConfig one_tile_per_cta(FwdTileConfig c) {
  c.persistent = false;
  return c;
}
template <class Cfg>
struct OneTileConfig {
  static constexpr FwdTileConfig value = one_tile_per_cta(Cfg::value);
};

template <class Element_, int kHeadDim_, int kHeadDimV_, class Cfg, class Mask_, bool kVarlen_ = false,
          class ScoreMod_ = ScoreModIdentity, bool kPackGQA_ = false, class ElementOut_ = Element_>
struct FwdTraits {
  using Element = Element_;  // Q, K, V and both GEMMs' operands
  // O's element type (the TMA store, sO, the packed scatter): the input type
  // for 16-bit inputs; FP8 inputs write a 16-bit O (seed 6.3).
  using ElementOut = ElementOut_;
  using Mask = Mask_;
  using ScoreMod = ScoreMod_;  // fusion/score_mod.h
  // Variable-length batches: per-sequence tensor maps (SeqlenInfo, varlen_prep.h).
  static constexpr bool kVarlen = kVarlen_;
  // PackGQA (seed ch. 11): a tile's rows are (query row, query head) pairs of
  // one KV head's group, packed row p = query row * g + head in group; Q is
  // gathered and O scattered by the consumer threads (a tensor map's box cannot
  // follow the (row, head) pairs for every g), K/V still come by TMA.
  static constexpr bool kPackGQA = kPackGQA_;
  // Split-KV (seed ch. 10) is a run-time option of the packed kernels (the
  // decode kernels; a pack factor of 1 serves MHA and unpacked GQA): with
  // Params::num_splits > 1 each (tile, split) CTA visits its share of the KV
  // range and writes fp32 partial O and LSE for the combine kernel.
  static constexpr bool kSplit = kPackGQA;
  // The KV-cache launches (forward_kvcache) run the varlen packed kernels,
  // where Params::kv_direct is a run-time option, taken for paged caches
  // (Params::page_table): no prep kernel, the tiles from the grid, each
  // sequence's rows computed in the kernel, and K/V gathered page by page by
  // the producer warpgroup (fwd/paged_kv.h).
  static constexpr bool kPagedKV = kVarlen && kPackGQA;
  // FP8 (e4m3, seed ch. 6): both GEMMs take 8-bit operands, which WGMMA
  // reads K-major only. V arrives (keys, d_v) with d_v contiguous, so the
  // producer warpgroup's warps 1-3 transpose each V stage into a K-major copy
  // (sVt) that the PV GEMM reads (FwdMainloop::transpose_v), one block ahead
  // of the consumers under a pipeline of its own. P is written to e4m3 after a
  // max offset of 2^kMaxOffset (P <= 256 uses e4m3's range; the row sum and
  // the LSE carry the same offset, so O is unchanged).
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static constexpr bool kTransposeV = kFp8;
  static constexpr int kMaxOffset = kFp8 ? 8 : 0;
  static constexpr int kNumTransposeThreads = 96;  // producer warps 1-3
  static constexpr FwdTileConfig kCfg = Cfg::value;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kCfg.tile_m;
  static constexpr int kBlockN = kCfg.tile_n;
  static constexpr int kStages = kCfg.num_stages;
  static constexpr int kNumMmaWG = kCfg.num_mma_wg;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWG;
  static constexpr int kNumThreads = kNumMmaThreads + 128;  // + one producer warpgroup
  static constexpr bool kIntraWGOverlap = kCfg.intra_wg_overlap;
  static constexpr bool kPingpong = kCfg.pingpong && kNumMmaWG >= 2;
  static constexpr int kRescaleSlack = kCfg.rescale_slack;
  static constexpr bool kPersistent = kCfg.persistent;
  // d_v > 128: rescale O while GEMM0 is in flight, before the PV GEMM is issued,
  // so ALU writes to the large O accumulator never race the WGMMA (seed 4.5).
  static constexpr bool kRescaleOBeforeGemm = kHeadDimV > 128 && kIntraWGOverlap;
  // The gathering producer (kPagedKV: its unrolled cp.async pieces and the
  // looked-up rows of the next blocks) spills at 24 registers; with two
  // consumer warpgroups it takes 40 and they 232 (the file holds 504 per
  // thread slot either way; FlashAttention-3's split for its cp.async path).
  static constexpr bool kGatherRegs = FLASH3_SERVING_WIP && kPagedKV && kCfg.num_mma_wg == 2 && kCfg.producer_regs < 40;
  static constexpr int kProducerRegs = kGatherRegs ? 40 : kCfg.producer_regs;
  static constexpr int kConsumerRegs = kGatherRegs ? kCfg.consumer_regs - 8 : kCfg.consumer_regs;

  static_assert(kCfg.mma_pv_is_rs, "only the register-sourced PV WGMMA is implemented");
  static_assert(kBlockM == 64 * kNumMmaWG, "tile_m must be 64 x the number of consumer warpgroups");
  static_assert(kBlockN % (kFp8 ? 32 : 16) == 0, "tile_n must be a multiple of the PV GEMM's WGMMA K (16; FP8: 32)");
  static_assert(!kFp8 || (!kPackGQA && !kVarlen && kCfg.rescale_slack == 0),
                "FP8 kernels: fixed length, unpacked, eager rescaling (P's max offset leaves no slack)");
  static_assert(!kFp8 || kHeadDimV % 32 == 0, "FP8 V transpose: d_v in 32-byte blocks");
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "head dims must be multiples of 16");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kNumMmaThreads <= 65536, "register file overcommitted");
  static_assert(!kPackGQA || !kPersistent, "PackGQA tiles run one per CTA (the consumers load Q)");

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>;
  using AtomLayout = Layout<Shape<Int<kNumMmaWG>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(), AtomLayout{}));
  // B = V read MN-major through a transposed view of the K-major V tile: a
  // descriptor reinterpretation legal for 16-bit WGMMA, no data movement.
  // FP8: B = the transposed copy sVt, K-major.
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDimV>, Int<kBlockN>>, GMMA::Major::K,
                           kFp8 ? GMMA::Major::K : GMMA::Major::MN>(),
      AtomLayout{}));

  template <int Rows, int Cols, class E = Element>
  using KMajorAtom =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, E, Int<Rows>, Int<Cols>>());
  using SmemLayoutQ = decltype(tile_to_shape(KMajorAtom<kBlockM, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(KMajorAtom<kBlockN, kHeadDim>{},
                                             Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(KMajorAtom<kBlockN, kHeadDimV>{},
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // The PV GEMM's B: (d_v, keys, stages). 16-bit: a transposed view of sV.
  // FP8: its own K-major buffer, keys contiguous, written by transpose_v.
  using SmemLayoutVtView = decltype(composition(
      SmemLayoutV{},
      make_ordered_layout(make_shape(Int<kHeadDimV>{}, Int<kBlockN>{}, Int<kStages>{}), Step<_2, _1, _3>{})));
  using SmemLayoutVtCopy = decltype(tile_to_shape(KMajorAtom<kHeadDimV, kBlockN>{},
                                                  Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}));
  using SmemLayoutVt = std::conditional_t<kTransposeV, SmemLayoutVtCopy, SmemLayoutVtView>;
  using SmemLayoutO =
      decltype(tile_to_shape(KMajorAtom<kBlockM, kHeadDimV, ElementOut>{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));

  // Global views are (seqlen, head_dim, head, batch) with unit head_dim stride.
  using ShapeQKV = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = cute::Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensorIn = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using GmemTensorOut =
      decltype(make_tensor(make_gmem_ptr(static_cast<ElementOut*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, take<0, 2>(SmemLayoutK{}),
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorIn{}, take<0, 2>(SmemLayoutV{}),
                                      Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{}, SmemLayoutO{},
                                      Shape<Int<kBlockM>, Int<kHeadDimV>>{}, _1{}));

  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesV = kBlockN * kHeadDimV * sizeof(Element);

  // K and V get separate full/empty pipelines: the overlapped consumer releases
  // K(j+1) while V(j) is still being read by the PV WGMMA.
  using MainloopPipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  // Single-tile CTAs: sO reuses sQ (Q is dead once every warpgroup's last
  // QK^T has completed). Persistent CTAs: sO is separate, so the next tile's
  // Q can land while this tile's O is still being stored.
  struct SharedStorageQO {
    union {
      cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> smem_q;
      cute::array_aligned<ElementOut, cute::cosize_v<SmemLayoutO>, 1024> smem_o;
    };
  };
  struct SharedStorageQandO {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<ElementOut, cute::cosize_v<SmemLayoutO>, 1024> smem_o;
  };
  struct SharedStorageBase : std::conditional_t<kPersistent, SharedStorageQandO, SharedStorageQO> {
    // 1024-byte alignment: required by the 128-byte TMA/WGMMA swizzle.
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> smem_v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> smem_k;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q;
    // Persistent only: every consumer thread arrives once its last QK^T of a
    // tile has completed; the producer waits before overwriting sQ.
    alignas(16) cutlass::arch::ClusterBarrier barrier_q_empty;
    typename MainloopPipeline::SharedStorage pipeline_k;
    typename MainloopPipeline::SharedStorage pipeline_v;
    // Dynamic persistent CTAs (DynamicLptTileScheduler): the producer claims
    // each next tile and hands its index to the consumers through a two-slot
    // ring (full: one producer arrival; empty: every consumer thread).
    alignas(16) cutlass::arch::ClusterBarrier tile_full[2];
    alignas(16) cutlass::arch::ClusterBarrier tile_empty[2];
    // The TMA thread has issued its current tile's loads: claim the next one.
    alignas(16) cutlass::arch::ClusterBarrier tile_request;
    int tile_slot[2];
  };
  // FP8: the transposed V ring and its pipeline (producer: the transposing
  // threads; consumers: the consumer warpgroups).
  using PipelineVt = std::conditional_t<kTransposeV, cutlass::PipelineAsync<kStages>, NoPipeline>;
  struct SharedStorageVt : SharedStorageBase {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutVtCopy>, 1024> smem_vt;
    typename cutlass::PipelineAsync<kStages>::SharedStorage pipeline_vt;
  };
  using SharedStorage = std::conditional_t<kTransposeV, SharedStorageVt, SharedStorageBase>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared storage exceeds the 227 KB per-CTA limit");

  struct FixedParams {
    TmaQ tma_load_q;
    TmaK tma_load_k;
    TmaV tma_load_v;
    TmaO tma_store_o;
    ShapeQKV shape_q, shape_k, shape_v, shape_o;
    float* lse;
    int64_t lse_batch_stride, lse_head_stride;
    MaskSpec mask;
    int tile_heads;  // heads the scheduler spans: query heads, KV heads under PackGQA
    int heads_per_kv, num_m_blocks;
    float softmax_scale, softmax_scale_log2;
    int tile_order;  // LptTileScheduler order: < 0 plain, 0 global longest-first, G grouped
    int batch;       // PersistentTileScheduler: tiles = num_m_blocks x tile_heads x batch
  };
  // Varlen launches add the prep kernel's outputs: four tensor maps per
  // sequence (q, k, v, out: TMA then never crosses a sequence boundary), the
  // sequences' offsets and lengths, and the tile map. The fixed-length kernels
  // keep FixedParams as it is (a larger Params changed their code).
  struct VarlenParams : FixedParams {
    VarlenScratch varlen;
  };
  using BaseParams = std::conditional_t<kVarlen, VarlenParams, FixedParams>;
  // A score modifier adds its pre-scale (the identity keeps BaseParams as it is).
  struct ScoreModParams : BaseParams {
    float score_mod_scale;
  };
  using ModParams = std::conditional_t<ScoreMod::kEnabled, ScoreModParams, BaseParams>;
  // FP8 descales (FlashAttention-3's q/k/v_descale, (batch, heads_kv) fp32;
  // null: 1), read once per tile (FwdMainloop::descales).
  struct Fp8Params : ModParams {
    const float* q_descale;
    const float* k_descale;
    const float* v_descale;
    int64_t q_descale_batch_stride, q_descale_head_stride, q_descale_qhead_stride;
    int64_t k_descale_batch_stride, k_descale_head_stride;
    int64_t v_descale_batch_stride, v_descale_head_stride;
    int64_t q_descale_block_stride, k_descale_block_stride, v_descale_block_stride;  // FwdParams's
  };
  using ScaledParams = std::conditional_t<kFp8, Fp8Params, ModParams>;
  // PackGQA gathers Q and scatters O through plain pointers (strides in
  // elements; varlen adds the sequence's offset_q rows instead of a batch).
  // A tile holds P = pack_divmod.divisor query heads (g = heads_per_kv when
  // packing, 1 for a split launch that does not pack): tile head t covers
  // query heads [t * P, t * P + P) and reads KV head t * P / g.
  // Split-KV partials (num_splits > 1): o_partial (split, batch | total_q rows,
  // seqlen_q, heads_q, d_v), lse_partial (split, batch, heads_q, seqlen_q)
  // (varlen: (split, heads_q, total_q)), both fp32, in the call's workspace.
  struct PackGQAParams : ScaledParams {
    const Element* q_ptr;
    ElementOut* o_ptr;
    int64_t q_row_stride, q_head_stride, q_batch_stride;
    int64_t o_row_stride, o_head_stride, o_batch_stride;
    cutlass::FastDivmod pack_divmod;  // P query heads per tile
    int num_splits;
    float* o_partial;
    float* lse_partial;
    int64_t op_split_stride, op_batch_stride, op_row_stride;  // head stride d_v
    int64_t lp_split_stride, lp_batch_stride, lp_head_stride;  // row stride 1
    // kv_direct launches (kPagedKV kernels; false otherwise): the caches'
    // sequences (common/varlen.h's KV-cache layout), the page pools (rows
    // k_row_stride apart, pages page_size rows apart) and the page table,
    // sequence b's row of it at page_table + b * page_table_batch_stride.
    bool kv_direct;
#if FLASH3_SERVING_WIP
    bool kv_tile_map;  // kv_direct with the prep kernel's tile map (varlen queries of several tiles)
#endif
    VarlenSeqs kv_seqs;
    const Element* k_ptr;
    const Element* v_ptr;
    int64_t k_row_stride, k_head_stride, v_row_stride, v_head_stride;
    const int* page_table;
    int64_t page_table_batch_stride;
    cutlass::FastDivmod page_divmod;  // page_size rows per page
  };
  using Params = std::conditional_t<kPackGQA, PackGQAParams, ScaledParams>;
};

}  // namespace flash3
