// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The backward kernels (seed 7.3-7.4, 8.4):
//   flash_bwd_preprocess_kernel : D = rowsum(dO * O) - dLSE, LSE * log2(e), zero dQ accumulator
//   flash_bwd_kernel            : warp-specialized five-GEMM loop, one CTA per KV block
//       warpgroup 0, warp 0     : TMA producer (K, V once; Q + LSE, dO + D per query block)
//       warpgroup 0, warp 1     : dQ store agent (bulk reduce-add into the fp32 accumulator)
//       warpgroups 1..N         : consumers, 64 keys each
//   flash_bwd_postprocess_kernel: dQ accumulator -> dQ * softmax_scale in the input dtype
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/epilogue.h"
#include "common/cute_utils.h"
#include "bwd/kernel_traits.h"
#include "bwd/mainloop.h"
#include "bwd/workspace.h"
#include "scheduler/bwd_tile_scheduler.h"
#include "scheduler/tile_scheduler.h"

namespace flash3 {

// kSplit (unmasked launches whose last wave is split, BwdSplitPlan): the
// epilogue stages fp32 and hands split blocks' partials on. A separate
// instantiation because fp32 staging costs every tile (d = 128 512 unmasked:
// -5.5% when all unmasked launches used it).
template <class Traits, bool kLpt, bool kSplit>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_bwd_kernel(CUTE_GRID_CONSTANT typename Traits::Params const params) {
  using SharedStorage = typename Traits::SharedStorage;
  extern __shared__ char smem_buf[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_buf);

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group_idx = cutlass::canonical_warp_group_idx();
  const int lane = threadIdx.x % 32;

  // Varlen: the KV tile of map entry x, its sequence's first query block and
  // the launch's mask with the sequence's lengths.
  // (Generic, so that fixed-length kernels, whose Params have no varlen
  // fields, never instantiate it.)
  auto varlen_problem = [](auto const& prm, int x, BwdTile& tile, MaskSpec& mask) {
    const VarlenTile t = prm.varlen.kv_tiles[x];
    tile = BwdTile{t.m_block, int(blockIdx.y), t.batch};
    if (t.m_block < 0) return;
    const SeqlenInfo si = prm.varlen.seqs[t.batch];
    tile.q_tile_start = prm.varlen.q_tile_start[t.batch];
    mask = prm.mask;
    mask.seqlen_q = si.seqlen_q;
    mask.seqlen_k = si.seqlen_k;
  };
  // This CTA's tile. CTAs past the last tile (the grid is an upper bound)
  // leave before touching any barrier.
  BwdTile varlen_tile{};
  MaskSpec varlen_mask{};
  if constexpr (Traits::kVarlen) {
    varlen_problem(params, int(blockIdx.x), varlen_tile, varlen_mask);
    if (varlen_tile.n_block < 0) return;
  }
  // The tile's mask: the launch's, or for varlen the sequence's.
  MaskSpec const& mask = Traits::kVarlen ? varlen_mask : params.mask;

  if (warp_idx == 0 && lane == 0) {
    prefetch_tma_descriptor(params.tma_load_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_load_do.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_load_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_load_v.get_tma_descriptor());
    ss.barrier_k.init(1);
    ss.barrier_v.init(1);
  }
  const bool producer = warp_group_idx == 0;
  typename Traits::PipelineQ pipeline_q(
      ss.pipeline_q,
      tma_pipeline_params<typename Traits::PipelineQ>(producer, Traits::kNumMmaThreads, Traits::kTmaBytesQ),
      Shape<_1, _1, _1>{});
  typename Traits::PipelinedO pipeline_do(
      ss.pipeline_do,
      tma_pipeline_params<typename Traits::PipelinedO>(producer, Traits::kNumMmaThreads, Traits::kTmaBytesdO),
      Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialisation visible to every thread

  const BwdTile tile = Traits::kVarlen ? varlen_tile : BwdScheduler::tile(kLpt, params);
  const MBlockRange range = BwdScheduler::piece_range(
      bwd_m_block_range(mask, tile.n_block, Traits::kBlockM, Traits::kBlockN), tile);

  if (warp_group_idx == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (warp_idx == 0) {
      if (lane == 0 && !range.empty()) BwdMainloop<Traits>::load(params, ss, pipeline_q, pipeline_do, tile, mask, range);
    } else if (warp_idx == 1) {
      BwdMainloop<Traits>::store_dq(params, ss, tile, mask, range);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    const int thread_idx = threadIdx.x - 128;
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadV mma_dv;
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{});
    Tensor tdVrdV = partition_fragment_C(mma_dv, Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{});
    clear(tdKrdK);
    clear(tdVrdV);
    // Keys no query sees (empty range) get dK = dV = 0.
    if (!range.empty()) {
      BwdMainloop<Traits>::mma(params, ss, pipeline_q, pipeline_do, tile, mask, range, tdKrdK, tdVrdV, thread_idx);
    }
    // Unmasked launches decode their block again for the epilogue, from a
    // fresh read of the block index, rather than keep the decoded values live
    // across the main loop (the 3-D grid's indices were free to re-read).
    // Split launches hand split blocks' partials to the piece that ends last.
    // Varlen, d = 128: the tile and mask read again from the map (kept live,
    // the unmasked d = 128 varlen kernel spilled 16 bytes in its main loop).
    // Other head dims keep them live: read again, ptxas serialized their
    // WGMMAs for lack of registers (C7512) at d = 64, 192 and 256.
    constexpr bool kRereadTile = Traits::kVarlen && Traits::kHeadDim == 128;
    if constexpr (kRereadTile) {
      BwdTile out;
      MaskSpec out_mask;
      varlen_problem(params, fresh_block_idx_x(), out, out_mask);
      BwdEpilogue<Traits>::template store<kSplit>(params, ss, out, out_mask, tdKrdK, tdVrdV, thread_idx);
    } else {
      const BwdTile out =
          kLpt || Traits::kVarlen
              ? tile
              : BwdScheduler::unmasked_order(fresh_block_idx_x(), params.num_n_blocks, params.heads_kv,
                                             params.split_first, params.split_pieces);
      BwdEpilogue<Traits>::template store<kSplit>(params, ss, out, mask, tdKrdK, tdVrdV, thread_idx);
    }
  }
}

// ------------------------------------------------------------- preprocess
struct BwdPrepParams {
  const void* o;
  const void* dout;
  const float* lse;
  const float* dlse;  // may be null
  int64_t o_row_stride, o_head_stride, o_batch_stride;
  int64_t do_row_stride, do_head_stride, do_batch_stride;
  int64_t lse_head_stride, lse_batch_stride;
  int64_t dlse_head_stride, dlse_batch_stride;
  float* lse_log2;
  float* dpsum;
  float* dq_accum;
  int* dq_sem;
  int* split_count;  // BwdSplitPlan counters, split_tiles of them
  int split_tiles;
  int seqlen_q, heads_q, num_m_blocks, seqlen_q_pad, head_dim;
  int row_shift;  // bwd_row_shift: padded row r is query r - row_shift
  // Varlen: blockIdx.x is a query tile of the map (its sequence and block);
  // the per-block scratch is one batch element of num_m_blocks tiles.
  const VarlenTile* q_tiles;
  const SeqlenInfo* seqs;
};

// One CTA per (query block, head, batch); 4 threads per row, 16-byte loads.
template <class Element, int kHeadDimV, int kBlockM, bool kVarlen = false>
__global__ void __launch_bounds__(kBlockM * 4) flash_bwd_preprocess_kernel(const BwdPrepParams p) {
  constexpr float kLog2e = 1.4426950408889634f;
  int m_block = blockIdx.x, batch = blockIdx.z;
  const int head = blockIdx.y;
  int seqlen_q = p.seqlen_q;
  int64_t row0 = 0;  // varlen: the sequence's first row in q / out / lse
  if constexpr (kVarlen) {
    const VarlenTile t = p.q_tiles[blockIdx.x];
    if (t.m_block < 0) return;  // past the last tile
    const SeqlenInfo si = p.seqs[t.batch];
    m_block = t.m_block;
    seqlen_q = si.seqlen_q;
    row0 = si.offset_q;
    batch = 0;
  }
  const int row_in_block = threadIdx.x / 4, sub = threadIdx.x % 4;
  const int row_pad = m_block * kBlockM + row_in_block;
  const int row = row_pad - p.row_shift;
  const bool real = row >= 0 && row < seqlen_q;
  float d = 0.f;
  if (real) {
    const Element* o = static_cast<const Element*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                       (row0 + row) * p.o_row_stride;
    const Element* dout = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride +
                          head * p.do_head_stride + (row0 + row) * p.do_row_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int c = sub * 8; c < kHeadDimV; c += 32) {
      cutlass::Array<Element, 8> a = *reinterpret_cast<const cutlass::Array<Element, 8>*>(o + c);
      cutlass::Array<Element, 8> b = *reinterpret_cast<const cutlass::Array<Element, 8>*>(dout + c);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 8; ++i) d += float(a[i]) * float(b[i]);
    }
  }
  d += __shfl_xor_sync(0xffffffff, d, 1);
  d += __shfl_xor_sync(0xffffffff, d, 2);
  // The block's place in the per-block scratch (varlen: the tile's index).
  const int scratch_block = kVarlen ? int(blockIdx.x) : m_block;
  const int64_t stats = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_pad + scratch_block * kBlockM + row_in_block;
  if (sub == 0) {
    float lse2 = INFINITY;  // padded rows: P = exp2(s - inf) = 0
    if (real) {
      const float lse = p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + row0 + row];
      // A fully masked row (LSE = -inf) has P = 0 everywhere: same treatment.
      lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
      if (p.dlse != nullptr) d -= p.dlse[batch * p.dlse_batch_stride + head * p.dlse_head_stride + row0 + row];
    }
    p.lse_log2[stats] = lse2;
    p.dpsum[stats] = d;
  }
  // Zero this block's dQ accumulator (the main kernel only ever adds into it).
  const int64_t rb = (int64_t(batch) * p.heads_q + head) * p.num_m_blocks + scratch_block;
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + rb * kBlockM * p.head_dim);
  for (int i = threadIdx.x; i < kBlockM * p.head_dim / 4; i += blockDim.x) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (threadIdx.x == 0) p.dq_sem[rb] = 0;
  if (rb == 0) {
    for (int i = threadIdx.x; i < p.split_tiles; i += blockDim.x) p.split_count[i] = 0;
  }
}

// ------------------------------------------------------------ postprocess
struct BwdPostParams {
  const float* dq_accum;
  void* dq;
  int64_t dq_row_stride, dq_head_stride, dq_batch_stride;
  int seqlen_q, heads_q, num_m_blocks;
  int row_shift;
  float softmax_scale;
  const VarlenTile* q_tiles;  // varlen, as in BwdPrepParams
  const SeqlenInfo* seqs;
};

// One CTA per (query block, head, batch) with the consumer threads' layout:
// thread t reads back exactly the fragment consumer thread t staged (16-byte
// loads, coalesced), and the dQ tiled MMA's partition tells which (row,
// column) each value is. The scaled, converted tile goes through shared
// memory so that global memory is written in whole 16-byte row chunks: the
// fragment layout's own 4-byte stores left half of every 32-byte sector
// unwritten per instruction (ncu, d = 128 2k causal: 164 us at 30% of DRAM
// bandwidth; 45 us this way; cuDNN's conversion: 53-55 us).
template <class Traits>
__global__ void __launch_bounds__(Traits::kNumMmaThreads) flash_bwd_postprocess_kernel(const BwdPostParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim;
  constexpr int kChunk = 16 / int(sizeof(Element));  // elements per 16-byte chunk
  constexpr int kRowPitch = kHeadDim + kChunk;       // padded: row starts rotate across banks
  __shared__ alignas(16) Element tile[kBlockM * kRowPitch];
  int m_block = blockIdx.x, batch = blockIdx.z;
  const int head = blockIdx.y;
  int seqlen_q = p.seqlen_q;
  int64_t row0 = 0;  // varlen: the sequence's first row in dq
  if constexpr (Traits::kVarlen) {
    const VarlenTile t = p.q_tiles[blockIdx.x];
    if (t.m_block < 0) return;  // past the last tile
    const SeqlenInfo si = p.seqs[t.batch];
    m_block = t.m_block;
    seqlen_q = si.seqlen_q;
    row0 = si.offset_q;
    batch = 0;
  }
  const int thread_idx = threadIdx.x, wg = thread_idx / 128, t128 = thread_idx % 128;
  typename Traits::TiledMmadQ mma_dq;
  auto thr = mma_dq.get_thread_slice(thread_idx);
  // (query, column) of each staged value; swapAB accumulators are (column, query).
  Tensor c = thr.partition_C(make_identity_tensor(typename Traits::ShapedQAcc{}));
  const int scratch_block = Traits::kVarlen ? int(blockIdx.x) : m_block;
  const int64_t rb = (int64_t(batch) * p.heads_q + head) * p.num_m_blocks + scratch_block;
  const float* chunk = p.dq_accum + rb * kBlockM * kHeadDim + wg * Traits::kdQChunk;
  CUTLASS_PRAGMA_UNROLL
  for (int v = 0; v < size(c); v += 4) {
    const float4 a = *reinterpret_cast<const float4*>(chunk + v * 128 + t128 * 4);
    const float vals[4] = {a.x, a.y, a.z, a.w};
    if constexpr (Traits::kdQSwapAB) {  // fragment pairs are adjacent queries: element stores
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        tile[get<1>(c(v + i)) * kRowPitch + get<0>(c(v + i))] = Element(vals[i] * p.softmax_scale);
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; i += 2) {  // fragment pairs (v, v + 1) are adjacent columns
        cutlass::Array<float, 2> f2;
        f2[0] = vals[i] * p.softmax_scale;
        f2[1] = vals[i + 1] * p.softmax_scale;
        cutlass::NumericArrayConverter<Element, float, 2> cvt;
        *reinterpret_cast<cutlass::Array<Element, 2>*>(tile + get<0>(c(v + i)) * kRowPitch + get<1>(c(v + i))) = cvt(f2);
      }
    }
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
               row0 * p.dq_row_stride;
  constexpr int kChunksPerRow = kHeadDim / kChunk;
  for (int i = thread_idx; i < kBlockM * kChunksPerRow; i += Traits::kNumMmaThreads) {
    const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * kChunk;
    const int row = m_block * kBlockM + r - p.row_shift;
    if (row >= 0 && row < seqlen_q) {
      *reinterpret_cast<uint4*>(dq + row * p.dq_row_stride + col) =
          *reinterpret_cast<const uint4*>(tile + r * kRowPitch + col);
    }
  }
}

}  // namespace flash3
