// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Forward mainloop: the producer's TMA load loop and the consumers' WGMMA +
// online-softmax loop (seed chapters 4-5).
//
// Consumer schedule with intra-warpgroup overlap, per KV block j (descending):
//   issue S(j) = Q K(j)^T   | issue O += P(j+1) V(j+1)   (both async)
//   wait S -> release K(j)  | mask + softmax S(j) while the PV GEMM runs
//   wait PV -> release V(j+1), P(j) = convert(S(j)), rescale O (skipped by
//   warps whose row maxima did not grow: kFwdRescaleSlack).
// The first block is a "half block" (GEMM0 + softmax only) and the last PV is a
// separate half block; the blocks that need a mask are peeled off so the
// steady-state loop evaluates no mask at all.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/block_info.h"
#include "common/cute_utils.h"
#include "common/named_barriers.h"
#include "flash3/flash3.h"  // kFp8ScaleBlock
#include "fusion/mask.h"
#include "fusion/softmax.h"
#if FLASH3_SERVING_WIP
#include "fwd/paged_kv.h"
#endif
#include "scheduler/tile_scheduler.h"

namespace flash3 {

template <class Traits>
struct FwdMainloop {
  using Element = typename Traits::Element;
  using Mask = typename Traits::Mask;
  using Params = typename Traits::Params;
  using SharedStorage = typename Traits::SharedStorage;
  using MainloopPipeline = typename Traits::MainloopPipeline;
  using PipelineState = typename Traits::PipelineState;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;

  // ---------------------------------------------------------------- producer
  // Runs on one thread (lane 0 of warp 0): TMA needs a single issuing thread,
  // and the pipelines' producer "leader" is that same thread.
  // write: the next free K/V stage, advanced past this tile's blocks on return
  // (persistent CTAs carry it from tile to tile). q_empty_phase >= 0: wait for
  // the consumers to be done with the previous tile's Q before overwriting sQ.
  CUTLASS_DEVICE static void load(Params const& params, SharedStorage& ss, MainloopPipeline& pipeline_k,
                                  MainloopPipeline& pipeline_v, WorkTile tile, MaskSpec const& mask,
                                  NBlockRange range, PipelineState& write, int q_empty_phase) {
    if (range.empty()) return;  // consumers write O = 0 / LSE = -inf without waiting
    if constexpr (Traits::kPagedKV) {
#if FLASH3_SERVING_WIP
      if (gathers_kv(params)) {
        return PagedKVGather<Traits>::load(params, ss, tile.batch, kv_head(params, tile), mask, range, write);
      }
#else
      if (gathers_kv(params)) return load_gathered(params, ss, tile, mask, range, write);
#endif
    }
    const int head_kv = kv_head(params, tile);
    // Fixed length: the launch's tensor maps, batch as the last coordinate.
    // Varlen: the sequence's own maps (batch extent 1), whose row extents end
    // at the sequence's end; acquired first (the prep kernel released its edits).
    cute::TmaDescriptor const* desc_q = nullptr;
    cute::TmaDescriptor const* desc_k = nullptr;
    cute::TmaDescriptor const* desc_v = nullptr;
    auto views = [&] {
      if constexpr (Traits::kVarlen) {
        cute::TmaDescriptor const* seq = params.varlen.desc + int64_t(tile.batch) * kNumVarlenDesc;
        desc_q = seq + kDescQ;
        desc_k = seq + kDescK;
        desc_v = seq + kDescV;
        cute::tma_descriptor_fence_acquire(desc_q);
        cute::tma_descriptor_fence_acquire(desc_k);
        cute::tma_descriptor_fence_acquire(desc_v);
        const int32_t sq = imax(mask.seqlen_q, 1), sk = imax(mask.seqlen_k, 1);
        auto shape_q = make_shape(sq, get<1>(params.shape_q), get<2>(params.shape_q), int32_t(1));
        auto shape_k = make_shape(sk, get<1>(params.shape_k), get<2>(params.shape_k), int32_t(1));
        auto shape_v = make_shape(sk, get<1>(params.shape_v), get<2>(params.shape_v), int32_t(1));
        return cute::make_tuple(params.tma_load_q.get_tma_tensor(shape_q)(_, _, tile.head, 0),
                                params.tma_load_k.get_tma_tensor(shape_k)(_, _, head_kv, 0),
                                params.tma_load_v.get_tma_tensor(shape_v)(_, _, head_kv, 0));
      } else {
        return cute::make_tuple(params.tma_load_q.get_tma_tensor(params.shape_q)(_, _, tile.head, tile.batch),
                                params.tma_load_k.get_tma_tensor(params.shape_k)(_, _, head_kv, tile.batch),
                                params.tma_load_v.get_tma_tensor(params.shape_v)(_, _, head_kv, tile.batch));
      }
    }();
    Tensor mQ = get<0>(views);
    Tensor mK = get<1>(views);
    Tensor mV = get<2>(views);
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<Traits::kHeadDim>>{}, make_coord(tile.m_block, _0{}));
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<Traits::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>{}, make_coord(_, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    auto [tQgQ, tQsQ] = tma_partition(params.tma_load_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    // (TMA, n_blocks) / (TMA, stages); plain tensors so the lambdas can capture them (C++17).
    auto k_part = tma_partition(params.tma_load_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto v_part = tma_partition(params.tma_load_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    Tensor tKgK = get<0>(k_part);
    Tensor tKsK = get<1>(k_part);
    Tensor tVgV = get<0>(v_part);
    Tensor tVsV = get<1>(v_part);

    auto load_k = [&](int n_block, PipelineState const& st) {
      pipeline_k.producer_acquire(st);
      if constexpr (Traits::kVarlen) {
        copy(params.tma_load_k.with(desc_k, *pipeline_k.producer_get_barrier(st)), tKgK(_, n_block),
             tKsK(_, st.index()));
      } else {
        copy(params.tma_load_k.with(*pipeline_k.producer_get_barrier(st), 0), tKgK(_, n_block), tKsK(_, st.index()));
      }
    };
    auto load_v = [&](int n_block, PipelineState const& st) {
      pipeline_v.producer_acquire(st);
      if constexpr (Traits::kVarlen) {
        copy(params.tma_load_v.with(desc_v, *pipeline_v.producer_get_barrier(st)), tVgV(_, n_block),
             tVsV(_, st.index()));
      } else {
        copy(params.tma_load_v.with(*pipeline_v.producer_get_barrier(st), 0), tVgV(_, n_block), tVsV(_, st.index()));
      }
    };

    int n_block = range.n_max - 1;
    // K first: the consumers' first GEMM needs K and Q, not V.
    load_k(n_block, write);
    if constexpr (!Traits::kPackGQA) {  // (PackGQA: the consumers gather Q, load_q_packed)
      if (q_empty_phase >= 0) ss.barrier_q_empty.wait(q_empty_phase);
      ss.barrier_q.arrive_and_expect_tx(Traits::kTmaBytesQ);
      auto& bar_q = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_q);
      if constexpr (Traits::kVarlen) {
        copy(params.tma_load_q.with(desc_q, bar_q), tQgQ, tQsQ);
      } else {
        copy(params.tma_load_q.with(bar_q, 0), tQgQ, tQsQ);
      }
    }
    // (The first K is issued: Q's load goes between it and the rest.)
    issue_kv_loads(range, write, load_k, load_v, true);
  }

  // ------------------------------------------------ gathering producer
  // KV-cache launches without the prep kernel (Params::kv_direct): no
  // per-sequence tensor maps, so the producer warpgroup gathers K/V itself
  // (fwd/paged_kv.h).
  CUTLASS_DEVICE static bool gathers_kv(Params const& params) {
    if constexpr (Traits::kPagedKV) {
      return params.kv_direct;
    } else {
      return false;
    }
  }

#if FLASH3_SERVING_WIP
  // kv_direct launches without the prep kernel's tile map take their tiles
  // from the grid (KVCacheTileScheduler).
  CUTLASS_DEVICE static bool tiles_from_grid(Params const& params) {
    if constexpr (Traits::kPagedKV) {
      return params.kv_direct && !params.kv_tile_map;
    } else {
      return false;
    }
  }

  // Whether a grid tile holds any of its sequence's (packed) query rows.
  CUTLASS_DEVICE static bool tile_has_rows(Params const& params, WorkTile tile, SeqlenInfo const& si) {
    if constexpr (Traits::kPackGQA) {
      return int64_t(tile.m_block) * kBlockM < int64_t(si.seqlen_q) * params.pack_divmod.divisor;
    } else {
      return tile.m_block * kBlockM < si.seqlen_q;
    }
  }

#endif

  // A KV-cache sequence's rows (kv_direct launches), computed where needed
  // instead of read from the prep kernel's table.
  CUTLASS_DEVICE static SeqlenInfo kv_seq_info(Params const& params, int batch) {
    if constexpr (Traits::kPagedKV) {
      return varlen_seq_info(params.kv_seqs, batch);
    } else {
      return SeqlenInfo{};
    }
  }

#if !FLASH3_SERVING_WIP
  // One K or V tile into stage sX (kBlockN x kD) by the 128 producer threads
  // (tid = threadIdx.x). Warp w fills rows [w * kBlockN / 4, + kBlockN / 4):
  // lane l first finds the pool row of the warp's row l (row r of the
  // sequence is row r % page_size of page pt[r / page_size], pt being the
  // sequence's row of the page table; -1 at or past seqlen_k),
  // then the warp copies its rows in 16-byte cp.async pieces, 32 consecutive
  // pieces per instruction (whole rows: coalesced), each piece's cache row
  // taken from its lane by a shuffle. So each thread does one table lookup
  // per tile and then issues its copies back to back (a lookup per piece,
  // each gating its copy, ran the decode rows at a quarter of the TMA
  // bandwidth). Rows past the sequence are zero-filled: the mask sets their
  // scores to -inf, and a zero V row keeps P = 0 times stale data (NaN, Inf)
  // out of O.
  template <int kD, class SmemTile>
  CUTLASS_DEVICE static void gather_tile(Params const& params, SmemTile sX, const Element* base, int64_t row_stride,
                                         const int* pt, int n_block, int seqlen_k, int tid) {
    using Vec = cute::uint128_t;
    constexpr int kVec = int(sizeof(Vec) / sizeof(Element));
    constexpr int kVecsPerRow = kD / kVec;
    constexpr int kRowsPerWarp = kBlockN / 4;
    constexpr int kPieces = kRowsPerWarp * kVecsPerRow;  // per warp
    static_assert(kD % kVec == 0, "K/V rows are copied in 16-byte pieces");
    static_assert(kBlockN % 4 == 0 && kRowsPerWarp <= 32, "a warp's rows are looked up one per lane");
    const int warp = tid / 32, lane = tid % 32;
    const int warp_row0 = warp * kRowsPerWarp;
    int cache_row = -1;
    {
      const int row = n_block * kBlockN + warp_row0 + lane;
      if (lane < kRowsPerWarp && row < seqlen_k) {
        int page_idx, in_page;
        params.page_divmod(page_idx, in_page, row);
        cache_row = __ldg(pt + page_idx) * params.page_divmod.divisor + in_page;
      }
    }
    // Not unrolled: the producer runs at 24 registers (setmaxnreg), and the
    // unrolled loop spilled there (about 1.2 KB at d = 128; 12-36 B at 2 pieces per trip).
    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = 0; j < (kPieces + 31) / 32; ++j) {
      const int piece = j * 32 + lane;
      const int r = piece / kVecsPerRow, c = piece % kVecsPerRow;
      const int src_row = __shfl_sync(0xffffffff, cache_row, r % 32);
      if (piece < kPieces) {
        const bool valid = src_row >= 0;
        const Element* src = valid ? base + int64_t(src_row) * row_stride + c * kVec : base;
        // 16-byte pieces stay contiguous under every WGMMA smem swizzle (its unit is 16 bytes).
        Vec& dst = *reinterpret_cast<Vec*>(&sX(warp_row0 + r, c * kVec));
        SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<Vec>::copy(*reinterpret_cast<const Vec*>(src), dst, valid);
      }
    }
  }

  // The TMA loop's order and stages with the tiles gathered instead. The
  // stage's full barrier expects one arrival and no transaction bytes: each
  // thread's cp.async.mbarrier.arrive adds a pending arrival that completes
  // with its copies, the named barrier orders all 128 of those before thread
  // 0's plain arrival, so the phase flips only once every piece has landed.
  // (The pipelines' producer_acquire would also expect TMA bytes: the
  // barriers are used directly.)
  CUTLASS_DEVICE static void load_gathered(Params const& params, SharedStorage& ss, WorkTile tile,
                                           MaskSpec const& mask, NBlockRange range, PipelineState& write) {
    const int tid = threadIdx.x;
    const int head_kv = kv_head(params, tile);
    const int* pt = params.page_table + int64_t(tile.batch) * params.page_table_batch_stride;
    const Element* k_base = params.k_ptr + int64_t(head_kv) * params.k_head_stride;
    const Element* v_base = params.v_ptr + int64_t(head_kv) * params.v_head_stride;
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    auto load_stage = [&](auto& storage, PipelineState const& st, auto fill) {
      storage.empty_barrier_[st.index()].wait(st.phase());
      fill(st.index());
      auto& full = storage.full_barrier_[st.index()];
      cutlass::arch::cpasync_barrier_arrive(reinterpret_cast<uint64_t const*>(&full));
      named_barrier_sync(128, FwdBarrier::kPagedKVProducer);
      if (tid == 0) full.arrive();
    };
    auto load_k = [&](int n_block, PipelineState const& st) {
      load_stage(ss.pipeline_k, st, [&](int stage) {
        gather_tile<Traits::kHeadDim>(params, sK(_, _, stage), k_base, params.k_row_stride, pt, n_block, mask.seqlen_k,
                                      tid);
      });
    };
    auto load_v = [&](int n_block, PipelineState const& st) {
      load_stage(ss.pipeline_v, st, [&](int stage) {
        gather_tile<Traits::kHeadDimV>(params, sV(_, _, stage), v_base, params.v_row_stride, pt, n_block, mask.seqlen_k,
                                       tid);
      });
    };
    issue_kv_loads(range, write, load_k, load_v);
  }

#endif

  // The K/V load order of one tile: K(j) before V(j + 1), as the overlapped
  // consumers read them (else K(j), V(j)); write advances past the tile.
  template <class LoadK, class LoadV>
  CUTLASS_DEVICE static void issue_kv_loads(NBlockRange range, PipelineState& write, LoadK&& load_k,
                                            LoadV&& load_v, bool first_k_issued = false) {
    int n_block = range.n_max - 1;
    if (!first_k_issued) load_k(n_block, write);
    if constexpr (Traits::kIntraWGOverlap) {
      for (; n_block > range.n_min; --n_block) {
        PipelineState prev = write;
        ++write;
        load_k(n_block - 1, write);
        load_v(n_block, prev);
      }
      load_v(n_block, write);
    } else {
      load_v(n_block, write);
      for (--n_block; n_block >= range.n_min; --n_block) {
        ++write;
        load_k(n_block, write);
        load_v(n_block, write);
      }
    }
    ++write;
  }

  // ---------------------------------------------------------------- consumer
  // Waits for a K/V stage. Gathered stages were written by cp.async (generic
  // proxy), which the WGMMAs read through the async proxy: a proxy fence
  // after the wait orders them (TMA stages need none).
  template <class Pipeline>
  CUTLASS_DEVICE static void wait_kv(Params const& params, Pipeline& pipeline, PipelineState const& st) {
    pipeline.consumer_wait(st);
    if (gathers_kv(params)) cutlass::arch::fence_view_async_shared();
  }

  // Pingpong: the warpgroup owns the tensor-core issue turn between sync and arrive.
  CUTLASS_DEVICE static void scheduler_sync(int wg) {
    if constexpr (Traits::kPingpong) {
      named_barrier_sync(2 * 128, static_cast<int>(FwdBarrier::kWarpSchedulerWG1) + wg);
    }
  }
  CUTLASS_DEVICE static void scheduler_arrive(int wg) {
    if constexpr (Traits::kPingpong) {
      const int next = (wg + 1) % Traits::kNumMmaWG;
      named_barrier_arrive(2 * 128, static_cast<int>(FwdBarrier::kWarpSchedulerWG1) + next);
    }
  }
  // Warpgroup 0 takes the first turn: pre-arrive on its own barrier. Once per
  // CTA: a tile leaves exactly one arrival (the last warpgroup's final arrive)
  // pending on warpgroup 0's barrier, which serves as the next tile's pre-arrive.
  CUTLASS_DEVICE static void scheduler_init(int wg) {
    if constexpr (Traits::kPingpong) {
      if (wg == 0) named_barrier_arrive(2 * 128, static_cast<int>(FwdBarrier::kWarpSchedulerWG1));
    }
  }

  // The KV blocks a tile visits (PackGQA: its packed rows' query rows; a
  // split launch: the split's share of them).
  CUTLASS_DEVICE static NBlockRange n_block_range(Params const& params, MaskSpec const& mask, WorkTile tile) {
    if constexpr (Traits::kPackGQA) {
      const NBlockRange r =
          fwd_n_block_range_packed(mask, tile.m_block, kBlockM, kBlockN, params.pack_divmod.divisor);
      return split_n_block_range(r, tile.split, params.num_splits);
    } else {
      return fwd_n_block_range(mask, tile.m_block, kBlockM, kBlockN);
    }
  }

  // The KV head a tile reads (PackGQA: tile head t holds query heads
  // [t * P, t * P + P) of one group).
  CUTLASS_DEVICE static int kv_head(Params const& params, WorkTile tile) {
    if constexpr (Traits::kPackGQA) {
      return tile.head * params.pack_divmod.divisor / params.heads_per_kv;
    } else {
      return tile.head / params.heads_per_kv;
    }
  }

  // The tile's first query head (PackGQA: P per tile).
  CUTLASS_DEVICE static int64_t first_q_head(Params const& params, WorkTile tile) {
    return int64_t(tile.head) * params.pack_divmod.divisor;
  }

  // Packed row -> query row (mask), or the identity.
  CUTLASS_DEVICE static auto row_to_query(Params const& params) {
    if constexpr (Traits::kPackGQA) {
      return PackedRowToQuery{params.pack_divmod};
    } else {
      return RowIsQuery{};
    }
  }

  // PackGQA: the tile's first Q / O / LSE element of packed row p = (query row q,
  // head j in the group): base + q * row_stride + (head_kv * g + j) * head_stride.
  // Fixed length: base is the batch's; varlen: the sequence's first row.
  CUTLASS_DEVICE static int64_t packed_seq_offset(Params const& params, WorkTile tile, int64_t batch_stride,
                                                  int64_t row_stride) {
    if constexpr (Traits::kVarlen) {
#if FLASH3_SERVING_WIP
      if (gathers_kv(params)) return int64_t(kv_seq_info(params, tile.batch).offset_q) * row_stride;
#else
      if (gathers_kv(params)) return int64_t(tile.batch) * params.kv_seqs.fixed_seqlen_q * row_stride;
#endif
      return int64_t(params.varlen.seqs[tile.batch].offset_q) * row_stride;
    } else {
      return int64_t(tile.batch) * batch_stride;
    }
  }

  // PackGQA Q: each consumer warpgroup gathers its own 64 rows of sQ (the
  // rows its QK^T WGMMAs read) with 16-byte cp.async, rows past the
  // sequence zero-filled, then makes them visible to the WGMMAs (async proxy)
  // and syncs its 128 threads. The producer meanwhile loads K.
  CUTLASS_DEVICE static void load_q_packed(Params const& params, SharedStorage& ss, WorkTile tile,
                                           MaskSpec const& mask, int thread_idx) {
    using Vec = cute::uint128_t;
    constexpr int kVec = int(sizeof(Vec) / sizeof(Element));
    constexpr int kVecsPerRow = Traits::kHeadDim / kVec;
    static_assert(Traits::kHeadDim % kVec == 0, "Q rows are copied in 16-byte pieces");
    const int wg = thread_idx / 128;
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    const Element* q = params.q_ptr + packed_seq_offset(params, tile, params.q_batch_stride, params.q_row_stride) +
                       first_q_head(params, tile) * params.q_head_stride;
    const int row0 = tile.m_block * kBlockM + wg * 64;
    CUTLASS_PRAGMA_UNROLL
    for (int i = thread_idx % 128; i < 64 * kVecsPerRow; i += 128) {
      const int r = i / kVecsPerRow, c = i % kVecsPerRow;
      int q_row, head;
      params.pack_divmod(q_row, head, row0 + r);
      const bool valid = q_row < mask.seqlen_q;
      // (A row past the sequence reads nothing: cp.async with 0 source bytes.)
      const Element* src = valid ? q + int64_t(q_row) * params.q_row_stride + int64_t(head) * params.q_head_stride +
                                       c * kVec
                                 : q;
      // 16-byte pieces stay contiguous under every WGMMA smem swizzle (its unit is 16 bytes).
      Vec& dst = *reinterpret_cast<Vec*>(&sQ(wg * 64 + r, c * kVec));
      SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<Vec>::copy(*reinterpret_cast<const Vec*>(src), dst, valid);
    }
    cp_async_fence();
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();  // generic-proxy smem writes -> WGMMA operand reads
    named_barrier_sync(128, static_cast<int>(FwdBarrier::kPackedQWG1) + wg);
  }

  // FP8 descales (seed 6.3). Per (batch, KV head), or per 128-token block
  // (kFp8ScaleBlock) of each head: q's block is constant over a consumer
  // warpgroup's 64 rows, k's and v's over a KV block (tile_n divides 128).
  // q * k folds into the softmax's scale_log2 for each (warpgroup, KV block);
  // v into O's per-block rescale: O is kept in units of the current V block's
  // descale, so moving from block j + 1 to j multiplies it by
  // v(j + 1) / v(j), and the epilogue multiplies by the last block's v.
  struct Fp8Descales {
    const float* k = nullptr;  // this (batch, KV head)'s k / v descales; null: 1
    const float* v = nullptr;
    float q_scale_log2 = 0.f;  // softmax_scale_log2 * q descale
    float v_prev = 1.f;        // descale of the V block O is currently in
    CUTLASS_DEVICE float k_at(int64_t stride, int n) const { return k ? k[block(n) * stride] : 1.f; }
    CUTLASS_DEVICE float v_at(int64_t stride, int n) const { return v ? v[block(n) * stride] : 1.f; }
    CUTLASS_DEVICE static int64_t block(int n) { return int64_t(n) * kBlockN / kFp8ScaleBlock; }
  };
  static_assert(!Traits::kFp8 || kFp8ScaleBlock % kBlockN == 0, "a KV block must lie in one descale block");
  CUTLASS_DEVICE static Fp8Descales fp8_descales(Params const& params, WorkTile tile, int wg) {
    Fp8Descales d;
    const int64_t b = tile.batch, h = kv_head(params, tile);
    float q = 1.f;
    if (params.q_descale) {
      const int64_t q_block = (int64_t(tile.m_block) * kBlockM + wg * 64) / kFp8ScaleBlock;
      q = params.q_descale[b * params.q_descale_batch_stride + h * params.q_descale_head_stride +
                           int64_t(tile.head) * params.q_descale_qhead_stride + q_block * params.q_descale_block_stride];
    }
    if (params.k_descale) d.k = params.k_descale + b * params.k_descale_batch_stride + h * params.k_descale_head_stride;
    if (params.v_descale) d.v = params.v_descale + b * params.v_descale_batch_stride + h * params.v_descale_head_stride;
    d.q_scale_log2 = params.softmax_scale_log2 * q;
    return d;
  }
  // ------------------------------------------------ FP8 V transpose
  // FP8 P (seed 6.2): a register of the PV WGMMA's e4m3 A operand holds four
  // consecutive k of one row (k = 4q .. 4q + 3 for q = lane % 4, then + 16),
  // while the fp32 S accumulator holds columns 2q, 2q + 1, 2q + 8, 2q + 9 of
  // each 16. Instead of exchanging values between lanes, the keys of each
  // 16-key chunk are permuted: k-slot 4q + t of the chunk holds key
  // 2q + kSlotKey[t], kSlotKey = {0, 1, 8, 9}, in P (to_p_fp8) and in the
  // transposed V (transpose_v) alike, so the sum over keys is unchanged.
  // (tests/unit/test_fp8_layout.cu checks this against CuTe's layouts.)
  CUTLASS_HOST_DEVICE static constexpr int slot_key(int t) { return (t & 1) + 8 * (t >> 1); }

  // One V stage (keys x d_v, d_v contiguous) -> sVt (d_v x keys, keys
  // contiguous, slot order), by the transposing threads (t in [0, 96)). Unit
  // of work, one per warp at a time: the 16 keys of chunk c x 32 columns of
  // pair P, read as four 8 x 8 16-bit matrices by one LDSM.T (A: keys 0-7, B:
  // keys 8-15 of the chunk; columns 32P .. + 15, then + 16 .. + 31) and
  // written as four by one STSM (E: even columns, O: odd ones). After the
  // 16-bit transpose, lane (r, q) = (lane / 4, lane % 4) holds in A the bytes
  // (key 2q, 2q + 1) x (column 2r, 2r + 1) and in B the same for keys 2q + 8,
  // 2q + 9: two byte permutes give, per column, keys 2q, 2q + 1, 2q + 8,
  // 2q + 9 side by side, which is k-slots 4q .. 4q + 3 of the chunk, the
  // order to_p's P has (slot_key). Under the 128-byte swizzle the LDSM rows
  // (8 consecutive keys) hit 8 different 16-byte bank groups, and so do the
  // STSM rows (st_col below).
  static constexpr int kTransposeChunks = kBlockN / 16;
  static constexpr int kTransposeUnits = kTransposeChunks * (Traits::kHeadDimV / 32);
  struct TransposeUnit {
    int chunk, pair;  // keys 16 chunk .. + 15, columns 32 pair .. + 31
  };
  CUTLASS_HOST_DEVICE static TransposeUnit transpose_unit(int unit) {
    return {unit % kTransposeChunks, unit / kTransposeChunks};
  }
  template <class TensorV, class TensorVt>
  CUTLASS_DEVICE static void transpose_stage(TensorV const& sV, TensorVt& sVt, int t) {
    using Row = cute::uint128_t;
    const int warp = t / 32, lane = t % 32;
    const int m = lane / 8, r = lane % 8;  // the matrix and row this lane addresses
    // Lanes 16-31 (rows 4-7 of each matrix) store odd columns in the "even"
    // registers and even ones in the "odd": matrix 0's rows are then columns
    // 0, 2, 4, 6, 9, 11, 13, 15, eight different 16-byte bank groups under the
    // 128-byte swizzle (all-even rows hit four, a two-way conflict).
    const uint32_t sel_e = lane < 16 ? 0x6420 : 0x7531, sel_o = lane < 16 ? 0x7531 : 0x6420;
    const int st_col = 2 * r + ((m & 1) ^ (r >> 2));  // this lane's STSM row, within 16 columns
    auto unit_step = [&](int unit) {
      const TransposeUnit u = transpose_unit(unit);
      const int col0 = 32 * u.pair + 16 * (m >> 1);
      uint32_t a0, b0, a1, b1;
      SM75_U16x8_LDSM_T::copy(*reinterpret_cast<Row const*>(&sV(16 * u.chunk + 8 * (m & 1) + r, col0)), a0, b0, a1,
                              b1);
      const uint32_t e0 = __byte_perm(a0, b0, sel_e), o0 = __byte_perm(a0, b0, sel_o);
      const uint32_t e1 = __byte_perm(a1, b1, sel_e), o1 = __byte_perm(a1, b1, sel_o);
      SM90_U32x4_STSM_N::copy(e0, o0, e1, o1, *reinterpret_cast<Row*>(&sVt(col0 + st_col, 16 * u.chunk)));
    };
    // Two units per trip: the second LDSM is in flight while the first
    // unit's permutes and STSM wait for theirs.
    constexpr int kWarps = Traits::kNumTransposeThreads / 32;
    constexpr int kUnroll = 2;
    int unit = warp;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; unit + (kUnroll - 1) * kWarps < kTransposeUnits; unit += kUnroll * kWarps) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kUnroll; ++i) unit_step(unit + i * kWarps);
    }
    for (; unit < kTransposeUnits; unit += kWarps) unit_step(unit);
  }

  // The transposing threads' loop over one tile's V blocks (the order the
  // producer loads them): staging stage read -> sVt stage write, the
  // generic-proxy stores fenced before the consumers' WGMMAs (async proxy)
  // may read them.
  template <class PipelineVt>
  CUTLASS_DEVICE static void transpose_v(SharedStorage& ss, MainloopPipeline& pipeline_v, PipelineVt& pipeline_vt,
                                         NBlockRange range, PipelineState& read, PipelineState& write, int t) {
    if constexpr (Traits::kTransposeV) {
      Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
      Tensor sVt = make_tensor(make_smem_ptr(ss.smem_vt.data()), typename Traits::SmemLayoutVt{});
      for (int n = range.n_max - 1; n >= range.n_min; --n) {
        pipeline_v.consumer_wait(read);
        pipeline_vt.producer_acquire(write);
        Tensor dst = sVt(_, _, write.index());
        transpose_stage(sV(_, _, read.index()), dst, t);
        cutlass::arch::fence_view_async_shared();
        pipeline_vt.producer_commit(write);
        pipeline_v.consumer_release(read);
        ++read;
        ++write;
      }
    }
  }

  // The score modifier, before the mask (masked scores must end as -inf).
  template <class TensorS>
  CUTLASS_DEVICE static void modify_scores(Params const& params, TensorS& tSrS) {
    if constexpr (Traits::ScoreMod::kEnabled) Traits::ScoreMod::apply(tSrS, params.score_mod_scale);
  }

  template <bool kSeqlen, bool kRight, bool kLeft, class TensorS, class TensorC>
  CUTLASS_DEVICE static void mask_scores(Params const& params, TensorS& tSrS, TensorC const& tScS,
                                         MaskSpec const& mask, int m_block, int n_block) {
    if constexpr (kSeqlen || kRight || kLeft) {
      Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor c = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
      apply_mask<kSeqlen, kRight, kLeft>(s, c, mask, m_block * kBlockM, n_block * kBlockN, row_to_query(params));
    }
  }

  // The PV GEMM's B operand buffer: sV (16-bit, read transposed) or sVt (FP8).
  CUTLASS_DEVICE static Element* pv_smem(SharedStorage& ss) {
    if constexpr (Traits::kTransposeV) {
      return ss.smem_vt.data();
    } else {
      return ss.smem_v.data();
    }
  }

  // Runs the whole KV loop for one tile; on return tOrO holds the unnormalised O.
  // read: the next K/V stage to consume, advanced past this tile's blocks;
  // q_phase: the phase of barrier_q for this tile (its n-th Q load: n & 1).
  // scheduler_init must have run once before the first tile.
  // pipeline_v: the PV GEMM's V stages (FP8: the transposed copies).
  // Returns the factor O still needs besides 1/rowsum (FP8: the last V block's
  // descale; 1 otherwise).
  template <class TensorO, class PipelineV, class Softmax>
  CUTLASS_DEVICE static float mma(Params const& params, SharedStorage& ss, MainloopPipeline& pipeline_k,
                                 PipelineV& pipeline_v, WorkTile tile, MaskSpec const& mask, NBlockRange range,
                                 TensorO& tOrO, Softmax& softmax, int thread_idx, PipelineState& read, int q_phase) {
    constexpr int kNRows = Softmax::kRows;
    using SoftmaxT = OnlineSoftmax<kNRows, Softmax::kOffset>;
    using TiledMmaQK = typename Traits::TiledMmaQK;
    using TiledMmaPV = typename Traits::TiledMmaPV;
    const int wg = thread_idx / 128;
    TiledMmaQK tiled_mma_qk;
    TiledMmaPV tiled_mma_pv;
    auto thr_qk = tiled_mma_qk.get_thread_slice(thread_idx);
    auto thr_pv = tiled_mma_pv.get_thread_slice(thread_idx);
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(pv_smem(ss)), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tSrK = thr_qk.partition_fragment_B(sK);
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);
    Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor tScS = thr_qk.partition_C(cS);
    using SFrag = decltype(partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    // FP8: ((4, 2, 2) values, 1, k blocks of 32) as CuTe's 8-bit A fragment.
    using PLayout = std::conditional_t<Traits::kFp8, Layout<Shape<Shape<_4, _2, _2>, _1, Int<kBlockN / 32>>>,
                                       decltype(acc_to_operand_a(SFrag{}.layout()))>;
    Tensor tOrP = make_tensor<Element>(PLayout{});
    float row_scale[kNRows];
    bool rescale = false;  // some row of this warp has row_scale != 1 (OnlineSoftmax::step)
    Fp8Descales fp8;
    if constexpr (Traits::kFp8) fp8 = fp8_descales(params, tile, wg);
    // Per-block k / v descales (uniform): otherwise the first block's hold for
    // all, and the loop neither loads nor rescales for them.
    bool kv_blocks = false;
    if constexpr (Traits::kFp8)
      kv_blocks = params.k_descale_block_stride != 0 || params.v_descale_block_stride != 0;
    // FP8: block n's K descale into the softmax scale before step(); after a
    // non-first step, O's move from the previous V block's descale to n's
    // into row_scale (step() has already used row_scale for the row sums).
    auto fp8_scale = [&](float k_descale) {
      if constexpr (Traits::kFp8) softmax.scale_log2 = fp8.q_scale_log2 * k_descale;
    };
    auto fp8_v = [&](float v_descale) {
      if constexpr (Traits::kFp8) {
        if (v_descale != fp8.v_prev) {  // (uniform; exact 1 for per-head descales)
          const float ratio = fp8.v_prev / v_descale;
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kNRows; ++r) row_scale[r] *= ratio;
          fp8.v_prev = v_descale;
        }
      }
    };

    auto rowcol = [](auto& t) { return make_tensor(t.data(), acc_rowcol(t.layout())); };
    auto to_p = [&](auto& tSrS) {
      if constexpr (Traits::kFp8) {
        // A register (kb, v2, v1) = row half v1, slots 32 kb + 16 v2 + 4q + [0, 4):
        // accumulator entries base + {0, 1, 4, 5} (slot_key: columns 2q + {0, 1, 8, 9}).
        cutlass::NumericArrayConverter<Element, float, 4> convert;
        uint32_t* dst = reinterpret_cast<uint32_t*>(tOrP.data());
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < kBlockN / 32; ++kb) {
          CUTLASS_PRAGMA_UNROLL
          for (int v2 = 0; v2 < 2; ++v2) {
            CUTLASS_PRAGMA_UNROLL
            for (int v1 = 0; v1 < 2; ++v1) {
              const int base = 2 * v1 + 4 * (4 * kb + 2 * v2);
              cutlass::Array<float, 4> f;
              CUTLASS_PRAGMA_UNROLL
              for (int t = 0; t < 4; ++t) f[t] = tSrS(base + (t & 1) + 4 * (t >> 1));
              auto e = convert(f);
              dst[4 * kb + 2 * v2 + v1] = reinterpret_cast<uint32_t const&>(e);
            }
          }
        }
      } else {
        // tOrP's layout is a reinterpretation of the accumulator's registers
        // (acc_to_operand_a), so the copy is by register offset, not coordinate.
        Tensor p = convert_fragment<Element>(tSrS);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(tOrP); ++i) tOrP.data()[i] = p.data()[i];
      }
    };

    clear(tOrO);
    if constexpr (Traits::kPackGQA) {
      load_q_packed(params, ss, tile, mask, thread_idx);
    } else {
      ss.barrier_q.wait(q_phase);
    }

    int n_block = range.n_max - 1;

    // First (half) block: GEMM0 + softmax, with the sequence-tail and full mask.
    {
      if constexpr (Traits::kFp8) {
        fp8_scale(fp8.k_at(params.k_descale_block_stride, n_block));
        fp8.v_prev = fp8.v_at(params.v_descale_block_stride, n_block);
      }
      wait_kv(params, pipeline_k, read);
      scheduler_sync(wg);
      SFrag tSrS;
      wgmma_gemm<true, -1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read.index()), tSrS);
      scheduler_arrive(wg);
      warpgroup_wait<0>();
      pipeline_k.consumer_release(read);
      modify_scores(params, tSrS);
      mask_scores<true, Mask::kHasRight, Mask::kHasLeft>(params, tSrS, tScS, mask, tile.m_block, n_block);
      Tensor s = rowcol(tSrS);
      softmax.template step<true, Traits::kRescaleSlack>(s, row_scale);
      if constexpr (Traits::kIntraWGOverlap) {
        to_p(tSrS);
      } else {
        to_p(tSrS);
        wait_kv(params, pipeline_v, read);
        wgmma_gemm<false, 0>(tiled_mma_pv, tOrP, tOrV(_, _, _, read.index()), tOrO);
        pipeline_v.consumer_release(read);
        ++read;
      }
    }

    // One KV block in the steady state (with the mask flavour of the segment).
    auto one_block = [&](int n, auto seqlen_c, auto right_c, auto left_c) {
      constexpr bool kS = decltype(seqlen_c)::value, kR = decltype(right_c)::value, kL = decltype(left_c)::value;
      float k_ds = 1.f, v_ds = 1.f;  // FP8 block descales: loaded early, used after the GEMMs
      if constexpr (Traits::kFp8) {
        if (kv_blocks) {
          k_ds = fp8.k_at(params.k_descale_block_stride, n);
          v_ds = fp8.v_at(params.v_descale_block_stride, n);
        }
      }
      if constexpr (Traits::kIntraWGOverlap) {
        PipelineState read_v = read;  // V lags K by one block
        ++read;
        wait_kv(params, pipeline_k, read);
        scheduler_sync(wg);
        SFrag tSrS;
        wgmma_gemm<true, -1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read.index()), tSrS);
        if constexpr (Traits::kRescaleOBeforeGemm) {
          Tensor o = rowcol(tOrO);
          if (rescale) SoftmaxT::rescale_o(o, row_scale);
        }
        wait_kv(params, pipeline_v, read_v);
        wgmma_gemm<false, -1>(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
        scheduler_arrive(wg);
        warpgroup_wait<1>();  // S ready; the PV GEMM may still run
        pipeline_k.consumer_release(read);
        modify_scores(params, tSrS);
        mask_scores<kS, kR, kL>(params, tSrS, tScS, mask, tile.m_block, n);
        Tensor s = rowcol(tSrS);
        if (kv_blocks) fp8_scale(k_ds);
        rescale = softmax.template step<false, Traits::kRescaleSlack>(s, row_scale);
        if (kv_blocks) fp8_v(v_ds);
        warpgroup_wait<0>();  // PV done: V stage free, tOrP and tOrO writable
        pipeline_v.consumer_release(read_v);
        to_p(tSrS);
        if constexpr (!Traits::kRescaleOBeforeGemm) {
          Tensor o = rowcol(tOrO);
          if (rescale) SoftmaxT::rescale_o(o, row_scale);
        }
      } else {
        wait_kv(params, pipeline_k, read);
        scheduler_sync(wg);
        SFrag tSrS;
        wgmma_gemm<true, -1>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read.index()), tSrS);
        scheduler_arrive(wg);
        warpgroup_wait<0>();
        pipeline_k.consumer_release(read);
        modify_scores(params, tSrS);
        mask_scores<kS, kR, kL>(params, tSrS, tScS, mask, tile.m_block, n);
        Tensor s = rowcol(tSrS);
        if (kv_blocks) fp8_scale(k_ds);
        rescale = softmax.template step<false, Traits::kRescaleSlack>(s, row_scale);
        if (kv_blocks) fp8_v(v_ds);
        Tensor o = rowcol(tOrO);
        if (rescale) SoftmaxT::rescale_o(o, row_scale);
        to_p(tSrS);
        wait_kv(params, pipeline_v, read);
        wgmma_gemm<false, 0>(tiled_mma_pv, tOrP, tOrV(_, _, _, read.index()), tOrO);
        pipeline_v.consumer_release(read);
        ++read;
      }
    };
    using T = cute::true_type;
    using F = cute::false_type;

    --n_block;
    // Blocks crossing the right (causal) bound: full mask, no sequence-tail check.
    if constexpr (Mask::kHasRight) {
      const int n_stop = imax(range.n_min_right_masked, range.n_min);
      for (; n_block >= n_stop; --n_block) one_block(n_block, F{}, T{}, cute::bool_constant<Mask::kHasLeft>{});
    }
    // Steady state: no mask evaluated.
    {
      const int n_stop = Mask::kHasLeft ? range.n_max_left_masked : range.n_min;
      for (; n_block >= n_stop; --n_block) one_block(n_block, F{}, F{}, F{});
    }
    // Blocks crossing the left (window) bound.
    if constexpr (Mask::kHasLeft) {
      for (; n_block >= range.n_min; --n_block) one_block(n_block, F{}, T{}, T{});
    }

    // Last half block: the final PV GEMM.
    if constexpr (Traits::kIntraWGOverlap) {
      if constexpr (Traits::kRescaleOBeforeGemm) {
        Tensor o = rowcol(tOrO);
        if (rescale) SoftmaxT::rescale_o(o, row_scale);
      }
      wait_kv(params, pipeline_v, read);
      wgmma_gemm<false, 0>(tiled_mma_pv, tOrP, tOrV(_, _, _, read.index()), tOrO);
      pipeline_v.consumer_release(read);
      ++read;  // (the non-overlapped loop has already advanced it)
    }
    return Traits::kFp8 ? fp8.v_prev : 1.f;
  }
};

}  // namespace flash3
