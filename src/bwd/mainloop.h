// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Backward mainloop (seed 7.4-7.6): the producer's TMA load loop, the dQ store
// agent, and the consumers' five-GEMM loop over query blocks.
//
// One CTA owns one KV block of one KV head. It visits, for each query head
// sharing that KV head (GQA: dK/dV accumulate in registers across them), the
// query blocks of the block's trapezoid in ascending order (deterministic
// mode: descending, see query_block). The three roles walk the same
// (head, m_block) sequence.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/kernel_traits.h"
#include "common/block_info.h"
#include "common/bulk_ops.h"
#include "common/cute_utils.h"
#include "common/named_barriers.h"
#include "scheduler/bwd_tile_scheduler.h"

namespace flash3 {

template <class Traits>
struct BwdMainloop {
  using Element = typename Traits::Element;
  using Mask = typename Traits::Mask;
  using ScoreMod = typename Traits::ScoreMod;
  using Params = typename Traits::Params;

  // The score modifier's per-score derivative (ScoreMod::grad: fp16, in the
  // S^T accumulator's layout, whose flat index matches dP^T's); an unused int
  // for the identity.
  template <class SFrag>
  using ModGrad = std::conditional_t<ScoreMod::kEnabled,
                                     decltype(convert_fragment<cutlass::half_t>(std::declval<SFrag&>())), int>;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  static constexpr int kNumMmaWG = Traits::kNumMmaWG;

  CUTLASS_DEVICE static int q_head(Params const& p, BwdTile t, int g) { return t.head_kv * p.heads_per_kv + g; }
  // The query block's index in the per-block scratch (dQ accumulator, its
  // counters; times kBlockM: the statistics' first row).
  CUTLASS_DEVICE static int64_t row_block_index(Params const& p, BwdTile t, int head, int m_block) {
    if constexpr (Traits::kVarlen) {
      return int64_t(head) * p.num_m_blocks + t.q_tile_start + m_block;
    } else {
      return (int64_t(t.batch) * p.heads_q + head) * p.num_m_blocks + m_block;
    }
  }
  // The i-th query block a CTA visits. Deterministic mode walks the range top
  // down: its reduce-adds into query block m go in ascending KV-block order,
  // and KV block n's range starts at the diagonal, so walking up from m_min
  // made KV block n spin until blocks 0..n-1 had climbed to its diagonal
  // (causal: about m_min(n) idle iterations per CTA, 30-40% of the
  // deterministic causal time). Top down, every KV block of a head
  // reaches block m at the same time, and the wait targets (lower n, launched
  // earlier) still make deadlock impossible. The default mode keeps the
  // ascending walk, which staggers the CTAs' reduce-adds over different query
  // blocks instead of piling them onto one.
  CUTLASS_DEVICE static int query_block(Params const& p, MBlockRange range, int i) {
    return p.deterministic ? range.m_max - 1 - i : range.m_min + i;
  }

  // ---------------------------------------------------------------- producer
  // Lane 0 of warp 0. K and V once; then per (head, m_block) Q + LSE on one
  // stage barrier and dO + D on another (transaction bytes counted together).
  CUTLASS_DEVICE static void load(Params const& params, SharedStorage& ss, typename Traits::PipelineQ& pipeline_q,
                                  typename Traits::PipelinedO& pipeline_do, BwdTile tile, MaskSpec const& mask,
                                  MBlockRange range) {
    // Fixed length: the launch's tensor maps, batch as the last coordinate.
    // Varlen: the sequence's own maps (batch extent 1), whose row extents end
    // at the sequence's end; acquired first (the prep kernel released its edits).
    cute::TmaDescriptor const* desc_q = nullptr;
    cute::TmaDescriptor const* desc_do = nullptr;
    cute::TmaDescriptor const* desc_k = nullptr;
    cute::TmaDescriptor const* desc_v = nullptr;
    if constexpr (Traits::kVarlen) {
      cute::TmaDescriptor const* seq = params.varlen.desc + int64_t(tile.batch) * kNumVarlenDesc;
      desc_q = seq + kDescQ;
      desc_do = seq + kDescdO;
      desc_k = seq + kDescK;
      desc_v = seq + kDescV;
      cute::tma_descriptor_fence_acquire(desc_q);
      cute::tma_descriptor_fence_acquire(desc_do);
      cute::tma_descriptor_fence_acquire(desc_k);
      cute::tma_descriptor_fence_acquire(desc_v);
    }
    // (rows, cols, head, batch) coordinates of one tensor map.
    auto coords = [&](auto const& tma, auto const& shape, int rows, int head) {
      if constexpr (Traits::kVarlen) {
        auto s = make_shape(int32_t(imax(rows, 1)), get<1>(shape), get<2>(shape), int32_t(1));
        return tma.get_tma_tensor(s)(_, _, head, 0);
      } else {
        return tma.get_tma_tensor(shape)(_, _, head, tile.batch);
      }
    };
    auto with = [&](auto const& tma, cute::TmaDescriptor const* desc, auto& bar) {
      if constexpr (Traits::kVarlen) {
        return tma.with(desc, bar);
      } else {
        return tma.with(bar, 0);
      }
    };
    Tensor mK = coords(params.tma_load_k, params.shape_k, mask.seqlen_k, tile.head_kv);
    Tensor mV = coords(params.tma_load_v, params.shape_v, mask.seqlen_k, tile.head_kv);
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<Traits::kHeadDim>>{}, make_coord(tile.n_block, _0{}));
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>{}, make_coord(tile.n_block, _0{}));
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
    auto [tKgK, tKsK] = tma_partition(params.tma_load_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_load_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    using BarrierT = cutlass::arch::ClusterTransactionBarrier::ValueType;

    ss.barrier_k.arrive_and_expect_tx(Traits::kTmaBytesK);
    copy(with(params.tma_load_k, desc_k, reinterpret_cast<BarrierT&>(ss.barrier_k)), tKgK, tKsK);

    typename Traits::PipelineStateQ wq = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
    typename Traits::PipelineStatedO wdo = cutlass::make_producer_start_state<typename Traits::PipelinedO>();
    bool v_loaded = false;
    for (int g = 0; g < params.heads_per_kv; ++g) {
      const int head = q_head(params, tile, g);
      // Padded-grid rows: rows before the first query (row_shift) and past the
      // last are outside the tensor map, so TMA fills them with zeros.
      Tensor mQ = domain_offset(make_coord(-params.row_shift, _0{}),
                                coords(params.tma_load_q, params.shape_q, mask.seqlen_q, head));
      Tensor mdO = domain_offset(make_coord(-params.row_shift, _0{}),
                                 coords(params.tma_load_do, params.shape_do, mask.seqlen_q, head));
      Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{}, make_coord(_, _0{}));
      Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{}, make_coord(_, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_load_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] =
          tma_partition(params.tma_load_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      int64_t stats_row0 = (int64_t(tile.batch) * params.heads_q + head) * params.seqlen_q_pad;
      if constexpr (Traits::kVarlen) stats_row0 = row_block_index(params, tile, head, 0) * kBlockM;
      for (int i = 0; i < range.m_max - range.m_min; ++i) {
        const int m_block = query_block(params, range, i);
        pipeline_q.producer_acquire(wq);
        BarrierT* bq = pipeline_q.producer_get_barrier(wq);
        copy(with(params.tma_load_q, desc_q, *bq), tQgQ(_, m_block), tQsQ(_, wq.index()));
        SM90_BULK_COPY_G2S::copy(params.lse_log2 + stats_row0 + m_block * kBlockM, bq,
                                 ss.smem_lse.data() + wq.index() * kBlockM, Traits::kBytesStats);
        if (!v_loaded) {  // V after the first Q: G1 needs K and Q, G2 comes second
          ss.barrier_v.arrive_and_expect_tx(Traits::kTmaBytesV);
          copy(with(params.tma_load_v, desc_v, reinterpret_cast<BarrierT&>(ss.barrier_v)), tVgV, tVsV);
          v_loaded = true;
        }
        pipeline_do.producer_acquire(wdo);
        BarrierT* bdo = pipeline_do.producer_get_barrier(wdo);
        copy(with(params.tma_load_do, desc_do, *bdo), tdOgdO(_, m_block), tdOsdO(_, wdo.index()));
        SM90_BULK_COPY_G2S::copy(params.dpsum + stats_row0 + m_block * kBlockM, bdo,
                                 ss.smem_dpsum.data() + wdo.index() * kBlockM, Traits::kBytesStats);
        ++wq;
        ++wdo;
      }
    }
  }

  // ------------------------------------------------------- dQ store agent
  // Warp 1 (all lanes take part in the named barriers; lane 0 issues). Each
  // consumer warpgroup's dQ chunk is added into dq_accum with one bulk
  // reduce-add; no per-element atomics. Deterministic mode: the add for query
  // block m waits until every KV block before this one (in the fixed ascending
  // order) has added its contribution, tracked by a counter per query block.
  CUTLASS_DEVICE static void store_dq(Params const& params, SharedStorage& ss, BwdTile tile, MaskSpec const& mask,
                                      MBlockRange range) {
    const int lane = threadIdx.x % 32;
    if (range.empty()) return;
    constexpr int kFull = 128 + 32;
    for (int w = 0; w < kNumMmaWG; ++w) named_barrier_arrive(kFull, BwdBarrier::kdQEmptyWG0, w);
    const int total = params.heads_per_kv * (range.m_max - range.m_min);
    int it = 0;
    for (int g = 0; g < params.heads_per_kv; ++g) {
      const int head = q_head(params, tile, g);
      for (int i = 0; i < range.m_max - range.m_min; ++i, ++it) {
        const int m_block = query_block(params, range, i);
        for (int w = 0; w < kNumMmaWG; ++w) named_barrier_sync(kFull, BwdBarrier::kdQFullWG0, w);
        const int64_t rb = row_block_index(params, tile, head, m_block);
        if (lane == 0) {
          int* sem = params.dq_sem + rb;
          if (params.deterministic) {
            const int order = tile.n_block - fwd_n_block_range(mask, m_block, kBlockM, kBlockN).n_min;
            while (ld_acquire_gpu(sem) != order) {
            }
          }
          float* gdq = params.dq_accum + rb * (kBlockM * Traits::kHeadDim);
          for (int w = 0; w < kNumMmaWG; ++w) {
            bulk_reduce_add_f32(gdq + w * Traits::kdQChunk, ss.smem_dq.data() + w * Traits::kdQChunk,
                                Traits::kdQChunk * int(sizeof(float)));
          }
          bulk_commit_group();
          if (params.deterministic) {
            bulk_wait_group<0>();  // the adds are complete in global memory before the release
            red_release_gpu_add(sem, 1);
          } else {
            bulk_wait_group_read<0>();  // staging buffer read; the adds finish on their own
          }
        }
        __syncwarp();
        if (it + 1 < total) {
          for (int w = 0; w < kNumMmaWG; ++w) named_barrier_arrive(kFull, BwdBarrier::kdQEmptyWG0, w);
        }
      }
    }
    // Before the CTA exits only the staging buffer's reads must be done (as
    // for CuTe's TMA-store tail); the adds complete on their own and the
    // postprocess launch is ordered after them. Waiting for the last add's
    // global completion kept every CTA, and its SM, about one L2 reduce
    // round trip longer.
    if (lane == 0) bulk_wait_group_read<0>();
  }

  // ---------------------------------------------------------------- consumer
  template <class TensordK, class TensordV>
  CUTLASS_DEVICE static void mma(Params const& params, SharedStorage& ss, typename Traits::PipelineQ& pipeline_q,
                                 typename Traits::PipelinedO& pipeline_do, BwdTile tile, MaskSpec const& mask,
                                 MBlockRange range, TensordK& tdKrdK, TensordV& tdVrdV, int thread_idx) {
    if constexpr (Traits::kSplitHdim) {
      mma_split_hdim(params, ss, pipeline_q, pipeline_do, tile, mask, range, tdKrdK, tdVrdV, thread_idx);
    } else {
      mma_split_keys(params, ss, pipeline_q, pipeline_do, tile, mask, range, tdKrdK, tdVrdV, thread_idx);
    }
  }

  // Hands this warpgroup's dQ chunk to the store warp: fragment order, 16-byte
  // stores (a warp writes 512 contiguous bytes per instruction: no bank conflicts).
  // (Deferring the fence until after G5's wait, so the stores land meanwhile,
  // measured no change.)
  template <class TensordQ>
  CUTLASS_DEVICE static void stage_dq(SharedStorage& ss, TensordQ const& tdQrdQ, int wg, int t128) {
    float* sdq_chunk = ss.smem_dq.data() + wg * Traits::kdQChunk;
    named_barrier_sync(128 + 32, BwdBarrier::kdQEmptyWG0, wg);
    static_assert(decltype(size(tdQrdQ))::value * 128 == Traits::kdQChunk);
    static_assert(decltype(size(tdQrdQ))::value % 4 == 0);
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < size(tdQrdQ); v += 4) {
      *reinterpret_cast<float4*>(sdq_chunk + v * 128 + t128 * 4) =
          make_float4(tdQrdQ(v), tdQrdQ(v + 1), tdQrdQ(v + 2), tdQrdQ(v + 3));
    }
    cutlass::arch::fence_view_async_shared();  // read next by the bulk copy (async proxy)
    named_barrier_arrive(128 + 32, BwdBarrier::kdQFullWG0, wg);
  }

  // Shared by both consumer layouts: G1 S^T = K Q^T and G2 dP^T = V dO^T
  // issued back to back (async), the query statistics read meanwhile (or,
  // Traits::kLeanSdP, a column pair at a time inside the exp2 loop), then -
  // once G1 is done - P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)) in
  // place (seed 7.1.3: no row max needed). G2 may still run on return.
  template <class MmaS, class MmadP, class TK, class TQ, class TV, class TdO, class TC, class SFrag, class dPFrag>
  CUTLASS_DEVICE static void issue_sdp_then_p(Params const& params, MaskSpec const& mask, SharedStorage& ss,
                                              typename Traits::PipelineQ& pipeline_q,
                                              typename Traits::PipelinedO& pipeline_do,
                                              typename Traits::PipelineStateQ const& rq,
                                              typename Traits::PipelineStatedO const& rdo, bool first, int m_block,
                                              int n_block, MmaS& mma_s, MmadP& mma_dp, TK const& tSrK,
                                              TQ const& tSrQ, TV const& tdPrV, TdO const& tdPrdO,
                                              TC const& tScS_rc, SFrag& tSrS, dPFrag& tdPrdP,
                                              [[maybe_unused]] ModGrad<SFrag>& mod_grad) {
    pipeline_q.consumer_wait(rq);
    wgmma_gemm<true, -1>(mma_s, tSrK, tSrQ(_, _, _, rq.index()), tSrS);
    constexpr int kNCols = decltype(size<1>(tScS_rc))::value;
    const float* lse_smem = ss.smem_lse.data() + rq.index() * kBlockM;
    [[maybe_unused]] float lse[Traits::kLeanSdP ? 1 : kNCols];  // lean: read in the exp2 loop instead
    if constexpr (!Traits::kLeanSdP) load_stats(lse, lse_smem, tScS_rc);
    if (first) ss.barrier_v.wait(0);
    pipeline_do.consumer_wait(rdo);
    wgmma_gemm<true, -1>(mma_dp, tdPrV, tdPrdO(_, _, _, rdo.index()), tdPrdP);
    warpgroup_wait<1>();  // S^T ready; dP^T may still run

    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    if constexpr (ScoreMod::kEnabled) {
      ScoreMod::apply(s, params.score_mod_scale);
      mod_grad = ScoreMod::grad(tSrS);
    }
    if (bwd_tile_needs_mask(mask, m_block, n_block, kBlockM, kBlockN)) {
      mask_keys_queries(s, tScS_rc, mask, m_block * kBlockM, n_block * kBlockN);
    }
    if constexpr (Traits::kLeanSdP) {
      const float scale_log2 = params.softmax_scale_log2;
      for_each_column_pair(s, lse_smem, tScS_rc, [&](int r, int c, float2 l) {
        s(r, c) = exp2f(s(r, c) * scale_log2 - l.x);
        s(r, c + 1) = exp2f(s(r, c + 1) * scale_log2 - l.y);
      });
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(s); ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kNCols; ++c) s(r, c) = exp2f(s(r, c) * params.softmax_scale_log2 - lse[c]);
      }
    }
  }

  // dS^T = P^T * (dP^T - D), in place in the dP^T accumulator (p: the P^T row
  // view). D is read from shared memory here, a column pair at a time, instead
  // of being held in registers from G2's issue on: at this point dK, dV, P^T
  // (in flight for G3), S^T and dP^T are all live, and those kNCols registers
  // were what spilled (d = 128: 16 B -> 0, +3-6% measured).
  template <class TP, class dPFrag, class TC>
  CUTLASS_DEVICE static void ds_from_p(TP const& p, dPFrag& tdPrdP, const float* dpsum_smem, TC const& c_rc) {
    Tensor dp = make_tensor(tdPrdP.data(), acc_rowcol(tdPrdP.layout()));
    for_each_column_pair(dp, dpsum_smem, c_rc, [&](int r, int c, float2 d) {
      dp(r, c) = p(r, c) * (dp(r, c) - d.x);
      dp(r, c + 1) = p(r, c + 1) * (dp(r, c + 1) - d.y);
    });
  }

  // dS^T *= the score modifier's derivative (nothing for the identity).
  template <class dPFrag, class Grad>
  CUTLASS_DEVICE static void ds_times_mod_grad(dPFrag& tdPrdP, [[maybe_unused]] Grad const& grad) {
    if constexpr (ScoreMod::kEnabled) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tdPrdP); ++i) tdPrdP(i) *= float(grad(i));
    }
  }

  // f(r, c, stat) for every row r and column pair (c, c + 1) of an accumulator
  // row view, stat = the per-query statistics of the pair (LSE or D) from
  // shared memory: the pair is adjacent there, so one 8-byte load per pair,
  // reused across the rows.
  template <class TensorRC, class TC, class F>
  CUTLASS_DEVICE static void for_each_column_pair(TensorRC const& t, const float* stats, TC const& c_rc, F&& f) {
    constexpr int kNCols = decltype(size<1>(t))::value;
    static_assert(kNCols % 2 == 0);
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kNCols; c += 2) {
      const float2 stat = *reinterpret_cast<const float2*>(stats + get<1>(c_rc(0, c)));
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(t); ++r) f(r, c, stat);
    }
  }

  // The same from the packed 16-bit P^T that G3 reads (Traits::kLeanSdP):
  // fragment pairs (v, v + 1) are adjacent queries of one key and share one
  // 32-bit register, unpacked here with a shift / mask (bf16) or one
  // conversion (fp16). Converting element by element made nvcc split every
  // pair into two registers first (PRMT), 20 more live registers and spills
  // at tile_m = 80.
  template <class TP, class dPFrag, class TC>
  CUTLASS_DEVICE static void ds_from_packed_p(TP const& rP, dPFrag& tdPrdP, const float* dpsum_smem, TC const& tScS) {
    static_assert(decltype(size(rP))::value % 2 == 0 && decltype(size<0, 0>(rP))::value == 2);
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < size(rP); v += 2) {
      const uint32_t w = reinterpret_cast<const uint32_t*>(rP.data())[v / 2];
      float2 p;
      if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
        p = make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
      } else {
        p = __half22float2(reinterpret_cast<__half2 const&>(w));
      }
      const float2 d = *reinterpret_cast<const float2*>(dpsum_smem + get<1>(tScS(v)));
      tdPrdP(v) = p.x * (tdPrdP(v) - d.x);
      tdPrdP(v + 1) = p.y * (tdPrdP(v + 1) - d.y);
    }
  }

  // Head dim split (d > 128): see kernel_traits.h. Per query block:
  //   G1 S^T, G2 dP^T on this warpgroup's queries | P^T, dS^T to shared memory |
  //   PdS barrier | G3 dV += P^T dO, G5 dK += dS^T Q, G4 dQ = dS K on this
  //   warpgroup's columns (all SS).
  template <class TensordK, class TensordV>
  CUTLASS_DEVICE static void mma_split_hdim(Params const& params, SharedStorage& ss,
                                            typename Traits::PipelineQ& pipeline_q,
                                            typename Traits::PipelinedO& pipeline_do, BwdTile tile,
                                            MaskSpec const& mask, MBlockRange range, TensordK& tdKrdK, TensordV& tdVrdV, int thread_idx) {
    const int wg = thread_idx / 128;
    typename Traits::TiledMmaS mma_s;
    typename Traits::TiledMmadP mma_dp;
    typename Traits::TiledMmadV mma_dv;
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_s = mma_s.get_thread_slice(thread_idx);
    auto thr_dp = mma_dp.get_thread_slice(thread_idx);
    auto thr_dv = mma_dv.get_thread_slice(thread_idx);
    auto thr_dk = mma_dk.get_thread_slice(thread_idx);
    auto thr_dq = mma_dq.get_thread_slice(thread_idx);

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdSt{});
    Tensor sPt = make_tensor(make_smem_ptr(ss.smem_p.data()), typename Traits::SmemLayoutdSt{});

    Tensor tSrK = thr_s.partition_fragment_A(sK);
    Tensor tSrQ = thr_s.partition_fragment_B(sQ);
    Tensor tdPrV = thr_dp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_dp.partition_fragment_B(sdO);
    Tensor tdVrP = thr_dv.partition_fragment_A(sPt);     // (.., stage)
    Tensor tdVrdO = thr_dv.partition_fragment_B(sdOt);   // (.., stage)
    Tensor tdKrdS = thr_dk.partition_fragment_A(sdSt);   // (.., stage)
    Tensor tdKrQ = thr_dk.partition_fragment_B(sQt);     // (.., stage)
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
    Tensor tdQrK = thr_dq.partition_fragment_B(sKt);

    Tensor cS = make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tScS = thr_s.partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
    const uint32_t smem_ds = cute::cast_smem_ptr_to_uint(ss.smem_ds.data());
    const uint32_t smem_p = cute::cast_smem_ptr_to_uint(ss.smem_p.data());
    using SFrag = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockN>, Int<kBlockM>>{}));
    using dPFrag = decltype(partition_fragment_C(mma_dp, Shape<Int<kBlockN>, Int<kBlockM>>{}));
    using dQFrag = decltype(partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{}));

    typename Traits::PipelineStateQ rq;
    typename Traits::PipelineStatedO rdo;
    const int t128 = thread_idx % 128;

    ss.barrier_k.wait(0);
    int it = 0;
    for (int g = 0; g < params.heads_per_kv; ++g) {
      for (int i = 0; i < range.m_max - range.m_min; ++i, ++it) {
        const int m_block = query_block(params, range, i);
        SFrag tSrS;
        dPFrag tdPrdP;
        ModGrad<SFrag> mod_grad;
        issue_sdp_then_p(params, mask, ss, pipeline_q, pipeline_do, rq, rdo, it == 0, m_block, tile.n_block, mma_s, mma_dp,
                         tSrK, tSrQ, tdPrV, tdPrdO, tScS_rc, tSrS, tdPrdP, mod_grad);
        Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
        const int pds_stage = it % Traits::kStagesdS;
        store_pairs(convert_fragment<Element>(tSrS), tScS, smem_p, pds_stage);
        warpgroup_wait<0>();
        ds_from_p(s, tdPrdP, ss.smem_dpsum.data() + rdo.index() * kBlockM, tScS_rc);
        ds_times_mod_grad(tdPrdP, mod_grad);
        store_pairs(convert_fragment<Element>(tdPrdP), tScS, smem_ds, pds_stage);
        // Both warpgroups' P^T / dS^T slices visible to the async proxy before any
        // GEMM reads the whole tiles.
        cutlass::arch::fence_view_async_shared();
        named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kPdS);

        wgmma_gemm<false, -1>(mma_dv, tdVrP(_, _, _, pds_stage), tdVrdO(_, _, _, rdo.index()), tdVrdV);
        wgmma_gemm<false, -1>(mma_dk, tdKrdS(_, _, _, pds_stage), tdKrQ(_, _, _, rq.index()), tdKrdK);
        dQFrag tdQrdQ;
        wgmma_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, pds_stage), tdQrK, tdQrdQ);
        warpgroup_wait<1>();  // G3 and G5 done: Q and dO stages free
        pipeline_do.consumer_release(rdo);
        pipeline_q.consumer_release(rq);
        warpgroup_wait<0>();  // G4 done
        stage_dq(ss, tdQrdQ, wg, t128);
        ++rq;
        ++rdo;
      }
    }
  }

  template <class TensordK, class TensordV>
  CUTLASS_DEVICE static void mma_split_keys(Params const& params, SharedStorage& ss,
                                            typename Traits::PipelineQ& pipeline_q,
                                            typename Traits::PipelinedO& pipeline_do, BwdTile tile,
                                            MaskSpec const& mask, MBlockRange range, TensordK& tdKrdK, TensordV& tdVrdV, int thread_idx) {
    const int wg = thread_idx / 128;
    typename Traits::TiledMmaS mma_s;
    typename Traits::TiledMmadP mma_dp;
    typename Traits::TiledMmadV mma_dv;
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_s = mma_s.get_thread_slice(thread_idx);
    auto thr_dp = mma_dp.get_thread_slice(thread_idx);
    auto thr_dv = mma_dv.get_thread_slice(thread_idx);
    auto thr_dk = mma_dk.get_thread_slice(thread_idx);
    auto thr_dq = mma_dq.get_thread_slice(thread_idx);

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});

    Tensor tSrK = thr_s.partition_fragment_A(sK);
    Tensor tSrQ = thr_s.partition_fragment_B(sQ);
    Tensor tdPrV = thr_dp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_dp.partition_fragment_B(sdO);
    Tensor tdVrdO = thr_dv.partition_fragment_B(sdOt);
    Tensor tdKrQ = thr_dk.partition_fragment_B(sQt);
    // G4 operands: (dS, K) or, swapAB, (K^T, dS^T).
    auto dq_operands = [&] {
      if constexpr (Traits::kdQSwapAB) {
        return cute::make_tuple(thr_dq.partition_fragment_A(sKt), thr_dq.partition_fragment_B(sdS));
      } else {
        return cute::make_tuple(thr_dq.partition_fragment_A(sdS), thr_dq.partition_fragment_B(sKt));
      }
    }();
    auto& tdQrA = get<0>(dq_operands);
    auto& tdQrB = get<1>(dq_operands);

    // (key, query) coordinates of this thread's S^T / dP^T accumulator entries.
    Tensor cS = make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tScS = thr_s.partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
    const uint32_t smem_ds = cute::cast_smem_ptr_to_uint(ss.smem_ds.data());
    using SFrag = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockN>, Int<kBlockM>>{}));
    using dPFrag = decltype(partition_fragment_C(mma_dp, Shape<Int<kBlockN>, Int<kBlockM>>{}));
    using dQFrag = decltype(partition_fragment_C(mma_dq, typename Traits::ShapedQAcc{}));

    typename Traits::PipelineStateQ rq;
    typename Traits::PipelineStatedO rdo;
    const int t128 = thread_idx % 128;

    ss.barrier_k.wait(0);
    int it = 0;
    for (int g = 0; g < params.heads_per_kv; ++g) {
      for (int i = 0; i < range.m_max - range.m_min; ++i, ++it) {
        const int m_block = query_block(params, range, i);
        // G1 S^T, G2 dP^T; P^T from S^T while G2 runs.
        SFrag tSrS;
        dPFrag tdPrdP;
        ModGrad<SFrag> mod_grad;
        issue_sdp_then_p(params, mask, ss, pipeline_q, pipeline_do, rq, rdo, it == 0, m_block, tile.n_block, mma_s, mma_dp,
                         tSrK, tSrQ, tdPrV, tdPrdO, tScS_rc, tSrS, tdPrdP, mod_grad);
        Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
        Tensor rP = convert_fragment<Element>(tSrS);
        Tensor tdVrP = make_tensor(rP.data(), acc_to_operand_a(rP.layout()));
        // G3: dV += P^T dO (P^T straight from registers).
        wgmma_gemm<false, -1>(mma_dv, tdVrP, tdVrdO(_, _, _, rdo.index()), tdVrdV);
        warpgroup_wait<1>();  // dP^T ready; G3 may still run

        // dS^T = P^T * (dP^T - D)
        const float* dpsum_smem = ss.smem_dpsum.data() + rdo.index() * kBlockM;
        if constexpr (Traits::kLeanSdP) {
          ds_from_packed_p(rP, tdPrdP, dpsum_smem, tScS);
        } else {
          ds_from_p(s, tdPrdP, dpsum_smem, tScS_rc);
        }
        ds_times_mod_grad(tdPrdP, mod_grad);
        Tensor rdS = convert_fragment<Element>(tdPrdP);
        const int ds_stage = it % Traits::kStagesdS;
        store_pairs(rdS, tScS, smem_ds, ds_stage);
        // Generic-proxy stores must be visible to the WGMMA (async proxy) reads,
        // and the other warpgroup's slice must be complete: fence, then barrier.
        cutlass::arch::fence_view_async_shared();
        named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kPdS);

        // G4: dQ = dS K (this warpgroup's head_dim slice or query half), or dQ^T
        // = K^T dS^T (swapAB: its head_dim rows). G5: dK += dS^T Q.
        dQFrag tdQrdQ;
        if constexpr (Traits::kdQSwapAB) {
          wgmma_gemm<true, -1>(mma_dq, tdQrA, tdQrB(_, _, _, ds_stage), tdQrdQ);
        } else {
          wgmma_gemm<true, -1>(mma_dq, tdQrA(_, _, _, ds_stage), tdQrB, tdQrdQ);
        }
        Tensor tdKrdS = make_tensor(rdS.data(), acc_to_operand_a(rdS.layout()));
        wgmma_gemm<false, -1>(mma_dk, tdKrdS, tdKrQ(_, _, _, rq.index()), tdKrdK);
        warpgroup_wait<1>();  // G3 and G4 done: dO stage free, dQ ready
        pipeline_do.consumer_release(rdo);

        stage_dq(ss, tdQrdQ, wg, t128);

        warpgroup_wait<0>();  // G5 done: Q stage free
        pipeline_q.consumer_release(rq);
        ++rq;
        ++rdo;
      }
    }
  }

  // Per-query statistics for this thread's accumulator columns. Columns come
  // in adjacent pairs (the accumulator's innermost mode), so one 8-byte load
  // fetches two.
  template <int kNCols, class TensorC>
  CUTLASS_DEVICE static void load_stats(float (&out)[kNCols], const float* stats, TensorC const& c_rc) {
    static_assert(kNCols % 2 == 0);
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kNCols; c += 2) {
      const float2 v = *reinterpret_cast<const float2*>(stats + get<1>(c_rc(0, c)));
      out[c] = v.x;
      out[c + 1] = v.y;
    }
  }

  // P^T / dS^T fragment -> shared memory (sP / sdS, query-contiguous) with
  // stmatrix: each x4 store writes four 8x8 (key x query) blocks of the warp's
  // accumulator rows; lane l gives the 16-byte row address of block l / 8,
  // row l % 8. Fragment pairs 4i .. 4i+3 are exactly the blocks (keys +0 / +8)
  // x (queries 16i + 0 / + 8) of the m64nN accumulator, so no shuffling.
  // Explicit 32-bit shared addresses: indexing the swizzled smem tensor made
  // nvcc build 64-bit generic addresses (ST.E, IMAD.X chains and spills in the
  // d = 128 loop's SASS).
  template <class TensorR, class TensorC>
  CUTLASS_DEVICE static void store_pairs(TensorR const& r, TensorC const& tScS, uint32_t smem_base, int stage) {
    static_assert(decltype(size<0, 0>(r))::value == 2 && decltype(size<0, 1>(r))::value == 2);
    static_assert(decltype(size<1>(r))::value == 1 && decltype(size<2>(r))::value == 1, "one atom per warpgroup");
    static_assert(decltype(size(r))::value == decltype(size(tScS))::value);
    constexpr int kPairs = decltype(size(r))::value / 2;
    static_assert(kPairs % 4 == 0, "stmatrix.x4 needs an even number of 8-query blocks");
    const int lane = threadIdx.x % 32;
    // This warp's first key and first query (thread (lane) holds key +lane/4, query +2*(lane%4)).
    const int key0 = get<0>(tScS(0)) - lane / 4;
    const int q0 = get<1>(tScS(0)) - 2 * (lane % 4);
    const int my_key = key0 + lane % 8 + 8 * ((lane / 8) % 2);
    const int my_q = q0 + 8 * (lane / 16);
    const uint32_t linear0 = Traits::ds_linear_bytes(my_q, my_key, stage);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kPairs / 4; ++i) {
      uint32_t v[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        cutlass::Array<Element, 2> pair;
        pair[0] = r(8 * i + 2 * j);
        pair[1] = r(8 * i + 2 * j + 1);
        v[j] = reinterpret_cast<uint32_t const&>(pair);
      }
      const uint32_t addr =
          smem_base + (Traits::kdSQueryBlockStep ? Traits::ds_swizzle(linear0 + Traits::ds_linear_bytes(16 * i, 0, 0))
                                                 : Traits::ds_byte_offset(my_q + 16 * i, my_key, stage));
      asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]),
                   "r"(v[1]), "r"(v[2]), "r"(v[3])
                   : "memory");
    }
  }

  // S^T (keys x queries) -> -inf where the pair is invisible: keys past
  // seqlen_k, and the causal / window bounds of the mask variant.
  template <class TensorS, class TensorC>
  CUTLASS_DEVICE static void mask_keys_queries(TensorS& s, TensorC const& c, MaskSpec const& m, int q0, int k0) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      const int key = k0 + get<0>(c(r, 0));
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        const int q = q0 + get<1>(c(0, j));
        bool invisible = key >= m.seqlen_k;
        if constexpr (Mask::kHasRight) invisible |= m.has_right() && key > q + m.offset() + m.window_right;
        if constexpr (Mask::kHasLeft) invisible |= m.has_left() && key < q + m.offset() - m.window_left;
        if (invisible) s(r, j) = -INFINITY;
      }
    }
  }
};

}  // namespace flash3
