// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The forward kernel: shared memory, pipelines and warp roles only
// (mainloop, epilogue and scheduler do the work).
//   warpgroup 0    : producer (setmaxnreg down; warp 0 lane 0 issues all TMA;
//                    KV-cache launches without the prep kernel: all 128
//                    threads gather K/V with cp.async; FP8: warps 1-3
//                    transpose each V stage for the PV GEMM)
//   warpgroups 1..N: consumers, 64 query rows each (setmaxnreg up)
// Single-tile CTAs run one tile; persistent CTAs (Traits::kPersistent) loop
// over tiles with the K/V pipeline states, barrier_q's phase and the pingpong
// turn carried from tile to tile. Their tiles come from a static round-robin
// or, for Scheduler::kDynamic, from a global counter a scheduler thread bumps.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/cute_utils.h"
#include "fwd/epilogue.h"
#include "fwd/kernel_traits.h"
#include "fwd/mainloop.h"
#include "scheduler/tile_scheduler.h"

namespace flash3 {

template <class Traits, class Scheduler>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_kernel(CUTE_GRID_CONSTANT typename Traits::Params const params, int* tile_counter) {
  // tile_counter: DynamicLptTileScheduler's claim counter (zeroed before the
  // launch), null otherwise. A separate argument, not a Params field: a larger
  // Params changed the code ptxas generates for the other kernels.
  using SharedStorage = typename Traits::SharedStorage;
  using MainloopPipeline = typename Traits::MainloopPipeline;
  using PipelineState = typename Traits::PipelineState;
  constexpr bool kDynamic = Traits::kPersistent && Scheduler::kDynamic;
  extern __shared__ char smem_buf[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_buf);

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group_idx = cutlass::canonical_warp_group_idx();
  const int lane = threadIdx.x % 32;

  // Varlen: this CTA's tile and its sequence's lengths. CTAs past the last
  // tile (the grid is an upper bound) leave before touching any barrier.
  WorkTile varlen_tile{};
  MaskSpec varlen_mask{};
  if constexpr (Traits::kVarlen) {
    SeqlenInfo si;
#if FLASH3_SERVING_WIP
    if (FwdMainloop<Traits>::tiles_from_grid(params)) {
      // KV-cache launch without the prep kernel: the grid is the tile map,
      // num_m_blocks tiles per sequence for its longest; a shorter
      // sequence's extra tiles leave here (varlen queries).
      varlen_tile = KVCacheTileScheduler::tile(params.num_m_blocks, Traits::Mask::kHasRight);
      si = FwdMainloop<Traits>::kv_seq_info(params, varlen_tile.batch);
      if (!FwdMainloop<Traits>::tile_has_rows(params, varlen_tile, si)) return;
    } else {
#else
    if (FwdMainloop<Traits>::gathers_kv(params)) {
      // KV-cache launch without the prep kernel: the grid is the tile map.
      varlen_tile = KVCacheTileScheduler::tile(params.num_m_blocks, Traits::Mask::kHasRight);
      si = FwdMainloop<Traits>::kv_seq_info(params, varlen_tile.batch);
    } else {
#endif
      varlen_tile = VarlenTileScheduler::tile(params.varlen);
      if (varlen_tile.m_block < 0) return;
      si = params.varlen.seqs[varlen_tile.batch];
    }
    if constexpr (Traits::kSplit) varlen_tile = split_work_tile(varlen_tile, params.num_splits);
    varlen_mask = params.mask;
    varlen_mask.seqlen_q = si.seqlen_q;
    varlen_mask.seqlen_k = si.seqlen_k;
  }
  // The tile's mask: the launch's, or for varlen the sequence's.
  MaskSpec const& mask = Traits::kVarlen ? varlen_mask : params.mask;

  if (warp_idx == 0 && lane == 0) {
    prefetch_tma_descriptor(params.tma_load_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_load_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_load_v.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_store_o.get_tma_descriptor());
    ss.barrier_q.init(1);  // one arrival: the producer's arrive_and_expect_tx
    if constexpr (Traits::kPersistent) ss.barrier_q_empty.init(Traits::kNumMmaThreads);
    if constexpr (kDynamic) {
      for (int s = 0; s < 2; ++s) {
        ss.tile_full[s].init(1);
        ss.tile_empty[s].init(Traits::kNumMmaThreads + 1);  // + the TMA thread
      }
      ss.tile_request.init(1);
    }
  }

  // Full barriers expect the stage's TMA bytes; empty barriers count every
  // consumer thread (cluster of 1: each consumer thread arrives on release).
  const bool producer = warp_group_idx == 0;
  MainloopPipeline pipeline_k(
      ss.pipeline_k, tma_pipeline_params<MainloopPipeline>(producer, Traits::kNumMmaThreads, Traits::kTmaBytesK),
      Shape<_1, _1, _1>{});
  // FP8: V's stages are consumed by the transposing threads, whose sVt
  // stages the consumers read (pipeline_vt).
  constexpr int kVConsumers = Traits::kTransposeV ? Traits::kNumTransposeThreads : Traits::kNumMmaThreads;
  MainloopPipeline pipeline_v(
      ss.pipeline_v, tma_pipeline_params<MainloopPipeline>(producer, kVConsumers, Traits::kTmaBytesV),
      Shape<_1, _1, _1>{});
  using PipelineVt = typename Traits::PipelineVt;
  PipelineVt pipeline_vt = [&] {
    if constexpr (Traits::kTransposeV) {
      typename PipelineVt::Params vp;
      vp.role = producer ? PipelineVt::ThreadCategory::Producer : PipelineVt::ThreadCategory::Consumer;
      vp.producer_arv_count = Traits::kNumTransposeThreads;
      vp.consumer_arv_count = Traits::kNumMmaThreads;
      return PipelineVt(ss.pipeline_vt, vp);
    } else {
      return PipelineVt{};
    }
  }();
  // The PV GEMM's pipeline.
  auto& pipeline_pv = select_ref<Traits::kTransposeV>(pipeline_vt, pipeline_v);
  // Barrier initialisation must be visible to every thread before first use.
  __syncthreads();

  // The tiles of this CTA: one (the launch order is the schedule), or, for a
  // persistent CTA, every gridDim.x-th tile.
  int first = 0, stride = 1, count = 1;
  if constexpr (Traits::kPersistent) {
    first = int(blockIdx.x);
    stride = int(gridDim.x);
    count = Scheduler::num_tiles(params.num_m_blocks, params.tile_heads, params.batch);
  }
  auto tile_at = [&](int linear) {
    if constexpr (Traits::kVarlen) {
      return varlen_tile;
    } else if constexpr (Traits::kPersistent) {
      return Scheduler::tile_at(linear, params.num_m_blocks, params.tile_heads, params.batch, params.tile_order);
    } else if constexpr (Traits::kSplit) {
      return split_work_tile(Scheduler::tile(params.num_m_blocks, params.tile_heads, params.tile_order),
                             params.num_splits);
    } else {
      return Scheduler::tile(params.num_m_blocks, params.tile_heads, params.tile_order);
    }
  };

  // Dynamic schedule: a scheduler thread (warp 1 of the producer warpgroup)
  // claims this CTA's tiles and publishes the n-th tile index (>= count: no
  // more tiles) in slot n % 2. The TMA thread and every consumer thread read
  // it and release the slot when done with the tile (the TMA thread once its
  // loads are issued, consumers after the epilogue). The claim is not made in
  // the TMA thread: at 24 registers, the atomic in its loop made ptxas spill
  // 160 B (32 registers would fit 32 + 2 x 240 = 64K exactly, but the
  // consumers' setmaxnreg.inc then never returned: the kernels hung).
  auto publish_tile = [&](int n, int linear) {
    const int slot = n & 1;
    if (n >= 2) ss.tile_empty[slot].wait(((n >> 1) - 1) & 1);
    ss.tile_slot[slot] = linear;
    ss.tile_full[slot].arrive();  // release: the slot write is visible to the waiters
  };
  auto receive_tile = [&](int n) {
    ss.tile_full[n & 1].wait((n >> 1) & 1);
    return ss.tile_slot[n & 1];
  };

  // FP8, producer warps 1-3: the tiles of the TMA thread's static loop, each
  // V block transposed.
  auto transpose_tiles = [&] {
    if constexpr (Traits::kTransposeV) {
      static_assert(!kDynamic, "FP8 kernels take no dynamic scheduler thread (warp 1 transposes)");
      PipelineState read;  // V staging stages
      PipelineState write = cutlass::make_producer_start_state<PipelineVt>();
      for (int linear = first; linear < count; linear += stride) {
        const WorkTile tile = tile_at(linear);
        const NBlockRange range = FwdMainloop<Traits>::n_block_range(params, mask, tile);
        FwdMainloop<Traits>::transpose_v(ss, pipeline_v, pipeline_vt, range, read, write, int(threadIdx.x) - 32);
      }
    }
  };

  if (warp_group_idx == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    // Gathered K/V (kv_direct): the whole producer warpgroup loads.
    if ((warp_idx == 0 && lane == 0) || FwdMainloop<Traits>::gathers_kv(params)) {
      PipelineState write = cutlass::make_producer_start_state<MainloopPipeline>();
      if constexpr (kDynamic) {
        // n: this CTA's tile count so far. The consumers release
        // barrier_q_empty once per tile (masked-out tiles too), so tile n
        // (n > 0) waits for phase n - 1 before its Q overwrites sQ: one
        // counter for the tile slots and the Q phase (24 registers here).
        for (int n = 0;; ++n) {
          const int linear = receive_tile(n);
          if (linear >= count) break;
          const WorkTile tile = tile_at(linear);
          const NBlockRange range = FwdMainloop<Traits>::n_block_range(params, mask, tile);
          const int q_empty_phase = n > 0 ? (n - 1) & 1 : -1;
          if (!range.empty()) {
            FwdMainloop<Traits>::load(params, ss, pipeline_k, pipeline_v, tile, mask, range, write, q_empty_phase);
          } else if (q_empty_phase >= 0) {
            ss.barrier_q_empty.wait(q_empty_phase);  // keep in step with the per-tile releases
          }
          ss.tile_empty[n & 1].arrive();
          ss.tile_request.arrive();
        }
      } else {
        int loaded = 0;  // Q loads so far: the n-th waits for the consumers' (n-1)-th release
        for (int linear = first; linear < count; linear += stride) {
          const WorkTile tile = tile_at(linear);
          const NBlockRange range = FwdMainloop<Traits>::n_block_range(params, mask, tile);
          if (range.empty()) continue;
          FwdMainloop<Traits>::load(params, ss, pipeline_k, pipeline_v, tile, mask, range, write,
                                    loaded > 0 ? (loaded - 1) & 1 : -1);
          ++loaded;
        }
      }
    } else if (Traits::kTransposeV && warp_idx >= 1 && warp_idx <= 3) {
      transpose_tiles();
    } else if (kDynamic && warp_idx == 1 && lane == 0) {
      // Tile n + 1 is claimed when the TMA thread has issued tile n's last
      // loads, about two KV blocks before the consumers finish tile n: the
      // tile goes to the CTA about to be free. (Claiming a whole tile ahead, as
      // soon as a slot is free, hands it to the CTA that started first: d = 128
      // 16k causal ran 6% more cycles at lower SM throughput, ncu.)
      int linear = first;
      for (int n = 0;; ++n) {
        publish_tile(n, linear);
        if (linear >= count) break;
        ss.tile_request.wait(n & 1);
        linear = atomicAdd(tile_counter, 1) + stride;
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    const int thread_idx = threadIdx.x - 128;
    typename Traits::TiledMmaPV tiled_mma_pv;
    FwdMainloop<Traits>::scheduler_init(thread_idx / 128);
    PipelineState read;  // index 0, phase 0
    int loaded = 0;      // tiles whose Q this thread has consumed (barrier_q phase)
    if constexpr (kDynamic) {
      for (int n = 0;; ++n) {
        const int linear = receive_tile(n);
        if (linear >= count) break;
        const WorkTile tile = tile_at(linear);
        const NBlockRange range = FwdMainloop<Traits>::n_block_range(params, mask, tile);
        Tensor tOrO = partition_fragment_C(tiled_mma_pv, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>{});
        constexpr int kNRows = decltype(size<0>(acc_rowcol(tOrO.layout())))::value;
        // FP8: the scale is set per KV block (FwdMainloop::mma).
        OnlineSoftmax<kNRows, Traits::kMaxOffset, Traits::kFp8> softmax(params.softmax_scale_log2);
        float o_descale = 1.f;
        if (!range.empty()) {
          o_descale = FwdMainloop<Traits>::mma(params, ss, pipeline_k, pipeline_pv, tile, mask, range, tOrO, softmax,
                                               thread_idx, read, loaded & 1);
          ++loaded;
        } else {
          clear(tOrO);  // fully masked tile: O = 0, LSE = -inf
        }
        ss.barrier_q_empty.arrive();  // once per tile, masked-out ones too (see the producer)
        FwdEpilogue<Traits>::store(params, ss, tile, mask, tOrO, softmax, o_descale, thread_idx);
        ss.tile_empty[n & 1].arrive();  // slot n % 2 may take tile n + 2
      }
    } else {
      // Kept separate from the dynamic loop: sharing one body (together with
      // routing the tile order through LptTileScheduler::from_linear and a
      // larger Params) made ptxas compile the spill-bound d = 64 causal
      // kernel differently, 3-5% slower.
      for (int linear = first; linear < count; linear += stride) {
        const WorkTile tile = tile_at(linear);
        const NBlockRange range = FwdMainloop<Traits>::n_block_range(params, mask, tile);
        Tensor tOrO = partition_fragment_C(tiled_mma_pv, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>{});
        constexpr int kNRows = decltype(size<0>(acc_rowcol(tOrO.layout())))::value;
        // FP8: the scale is set per KV block (FwdMainloop::mma).
        OnlineSoftmax<kNRows, Traits::kMaxOffset, Traits::kFp8> softmax(params.softmax_scale_log2);
        float o_descale = 1.f;
        if (!range.empty()) {
          o_descale = FwdMainloop<Traits>::mma(params, ss, pipeline_k, pipeline_pv, tile, mask, range, tOrO, softmax,
                                               thread_idx, read, loaded & 1);
          // Every QK^T of this tile has completed (mma waits for all its WGMMAs):
          // the producer may load the next tile's Q.
          if constexpr (Traits::kPersistent) ss.barrier_q_empty.arrive();
          ++loaded;
        } else {
          clear(tOrO);  // fully masked tile: O = 0, LSE = -inf
        }
        FwdEpilogue<Traits>::store(params, ss, tile, mask, tOrO, softmax, o_descale, thread_idx);
      }
    }
    if constexpr (Traits::kPersistent) FwdEpilogue<Traits>::drain(thread_idx);
  }
}

}  // namespace flash3
