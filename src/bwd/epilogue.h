// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Backward epilogue: dK (scaled by softmax_scale, seed 7.1.5) and dV converted
// in registers, staged in shared memory (the K and V buffers, free once every
// GEMM of the CTA is done) and written to global memory in whole 16-byte row
// chunks; keys past seqlen_k are dropped. GQA needs no reduction here: the CTA
// has already summed over the query heads that share its KV head.
//
// Why staged: the accumulator layout's own stores are 4 bytes per thread, 16
// bytes per row per instruction, half of every 32-byte sector; with them the
// per-tile fixed cost at d = 128 was 4.0 query-block iterations, of which
// skipping the epilogue removed 2.8 (docs/performance.md). The dQ postprocess
// is staged for the same reason.
//
// Split launches (unmasked, last wave split over the query range, BwdSplitPlan;
// their own kernel instantiation) stage fp32 instead, over the K, V, Q, dO and
// dS buffers (all free by then): a piece copies its staged partial to its
// slot in global memory and only the piece that finishes last sums the slots
// and writes dK / dV. Staging first and branching after is deliberate: any
// branch while the accumulators were still live (even a uniform one guarding
// a shared-memory store) made ptxas spill the d = 64 kernel's dK / dV
// accumulators around its main loop (32 LDL + 32 STL per iteration).
// The wider staging doubles the staged bytes; when every unmasked launch used
// it, d = 128 / 256 at 512 queries ran 5.5% / 3.6% slower, so launches that
// split nothing keep Element staging.
#pragma once
#include <cute/tensor.hpp>

#include "bwd/mainloop.h"
#include "common/cute_utils.h"

namespace flash3 {

template <class Traits>
struct BwdEpilogue {
  using Element = typename Traits::Element;
  using Params = typename Traits::Params;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockN = Traits::kBlockN;

  // Byte offset of (row, col) in a staged (kBlockN x kCols) tile of T: rows
  // of kCols elements, 16-byte chunks XOR-swizzled by row % 8, so that the
  // fragment stores (8 rows x one chunk per warp instruction) hit 8 distinct
  // chunk positions, and the row reads are whole chunks. (d = 96 in 16-bit
  // types has 12 chunks per row: row % 4, 2-way conflicts.)
  template <int kCols, class T = Element>
  CUTLASS_HOST_DEVICE static uint32_t staged_offset(int row, int col) {
    constexpr int kElems = 16 / int(sizeof(T));  // elements per chunk
    constexpr int kChunksPerRow = kCols / kElems;
    static_assert(kCols % kElems == 0 && kChunksPerRow % 4 == 0, "rows of a multiple of 4 chunks");
    constexpr int kSwizzle = kChunksPerRow % 8 == 0 ? 8 : 4;
    const int chunk = (col / kElems) ^ (row % kSwizzle);
    return uint32_t(row * kCols + chunk * kElems + col % kElems) * uint32_t(sizeof(T));
  }

  // acc: a (kBlockN x kCols) accumulator of `mma` (rows = keys of this block)
  // -> the staged tile of T at `smem` (scaled, converted).
  template <int kCols, class T = Element, class TiledMma, class TensorAcc>
  CUTLASS_DEVICE static void stage(TiledMma& mma, TensorAcc& acc, char* smem, int thread_idx, float scale) {
    auto thr = mma.get_thread_slice(thread_idx);
    Tensor c = thr.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kCols>>{}));
    Tensor c_rc = make_tensor(c.data(), acc_rowcol(c.layout()));
    Tensor a_rc = make_tensor(acc.data(), acc_rowcol(acc.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(a_rc); ++r) {
      const int row = get<0>(c_rc(r, 0));
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(a_rc); j += 2) {
        // Columns j and j + 1 of the row view are adjacent (the accumulator's pair).
        cutlass::Array<float, 2> v2;
        v2[0] = a_rc(r, j) * scale;
        v2[1] = a_rc(r, j + 1) * scale;
        cutlass::NumericArrayConverter<T, float, 2> cvt;
        *reinterpret_cast<cutlass::Array<T, 2>*>(smem + staged_offset<kCols, T>(row, get<1>(c_rc(r, j)))) = cvt(v2);
      }
    }
  }

  // The staged tile -> global rows n_block * kBlockN + row (< seqlen_k), one
  // staged 16-byte chunk per thread and step, so that a warp reads whole
  // swizzled rows (conflict-free) and consecutive threads write consecutive
  // pieces of a row: 16 bytes from Element staging, 8 bytes (4 converted
  // values, still whole sectors per warp) from fp32 staging.
  template <int kCols, class T = Element>
  CUTLASS_DEVICE static void write_rows(const char* smem, Element* base, int64_t row_stride, int n_block,
                                        int seqlen_k, int thread_idx) {
    constexpr int kElems = 16 / int(sizeof(T));  // values per staged chunk
    constexpr int kChunksPerRow = kCols / kElems;
    static_assert(kBlockN * kChunksPerRow % Traits::kNumMmaThreads == 0, "every thread writes the same number of chunks");
    CUTLASS_PRAGMA_UNROLL
    for (int step = 0; step < kBlockN * kChunksPerRow / Traits::kNumMmaThreads; ++step) {
      const int i = thread_idx + step * Traits::kNumMmaThreads;
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int key = n_block * kBlockN + row;
      if (key < seqlen_k) {
        const char* src = smem + staged_offset<kCols, T>(row, chunk * kElems);
        Element* dst = base + key * row_stride + chunk * kElems;
        if constexpr (sizeof(T) == sizeof(Element)) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          static_assert(sizeof(T) == 4 && sizeof(Element) == 2, "fp32 staging of a 16-bit output");
          cutlass::NumericArrayConverter<Element, float, 4> cvt;
          *reinterpret_cast<cutlass::Array<Element, 4>*>(dst) = cvt(*reinterpret_cast<const cutlass::Array<float, 4>*>(src));
        }
      }
    }
  }

  // A split KV block (BwdSplitPlan), after its fp32 tiles are staged at
  // `staged` (kSlotFloats floats, dK then dV): the piece copies them to its
  // slot; the piece whose count comes last sums all slots in piece order
  // (its own from shared memory: the same order whatever the arrival order,
  // so the result is bitwise reproducible) back into the staged tiles and
  // returns true to write them. Memory order, as in CUDA's threadfence
  // reduction: each thread's slot stores, its fence, the named barrier, one
  // thread's counter add; the last piece fences after the count and reads the
  // other slots through L2 (ld.global.cg).
  static constexpr int kSlotFloats = kBlockN * (Traits::kHeadDim + Traits::kHeadDimV);

  CUTLASS_DEVICE static bool combine_pieces(Params const& params, SharedStorage& ss, BwdTile tile, char* staged,
                                            int thread_idx) {
    static_assert(kSlotFloats % (4 * Traits::kNumMmaThreads) == 0, "whole 16-byte chunks per thread");
    constexpr int kSteps = kSlotFloats / 4 / Traits::kNumMmaThreads;
    float4* chunks = reinterpret_cast<float4*>(staged);
    float4* slot0 = reinterpret_cast<float4*>(params.split_partials + int64_t(tile.split) * tile.pieces * kSlotFloats);
    float4* mine = slot0 + int64_t(tile.piece) * (kSlotFloats / 4);
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kSteps; ++s) mine[thread_idx + s * Traits::kNumMmaThreads] = chunks[thread_idx + s * Traits::kNumMmaThreads];
    __threadfence();
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);
    if (thread_idx == 0) ss.split_last = atomicAdd(params.split_count + tile.split, 1) == tile.pieces - 1;
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);
    if (!ss.split_last) return false;
    __threadfence();
    for (int s = 0; s < kSteps; ++s) {
      const int i = thread_idx + s * Traits::kNumMmaThreads;
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int p = 0; p < tile.pieces; ++p) {
        const float4 x = p == tile.piece ? chunks[i] : __ldcg(slot0 + int64_t(p) * (kSlotFloats / 4) + i);
        sum = p == 0 ? x : make_float4(sum.x + x.x, sum.y + x.y, sum.z + x.z, sum.w + x.w);
      }
      chunks[i] = sum;
    }
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);  // the summed tiles are staged
    return true;
  }

  // kSplit: fp32 staging over the operand buffers and the split-block
  // hand-off (unmasked launches); otherwise Element staging in sK / sV.
  template <bool kSplit, class TensordK, class TensordV>
  CUTLASS_DEVICE static void store(Params const& params, SharedStorage& ss, BwdTile tile, MaskSpec const& mask,
                                   TensordK& tdKrdK, TensordV& tdVrdV, int thread_idx) {
    using T = std::conditional_t<kSplit, float, Element>;
    if constexpr (kSplit) {
      // One contiguous fp32 region from sK on, ending before the dQ staging
      // buffer (which the dQ store agent may still be reading).
      static_assert(sizeof(ss.smem_k) + sizeof(ss.smem_v) + sizeof(ss.smem_q) + sizeof(ss.smem_do) +
                        sizeof(ss.smem_ds) + sizeof(ss.smem_p) >=
                    kSlotFloats * sizeof(float));
    } else {
      static_assert(sizeof(ss.smem_k) >= kBlockN * Traits::kHeadDim * sizeof(Element));
      static_assert(sizeof(ss.smem_v) >= kBlockN * Traits::kHeadDimV * sizeof(Element));
    }
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadV mma_dv;
    char* sdk = reinterpret_cast<char*>(ss.smem_k.data());
    char* sdv = kSplit ? sdk + kBlockN * Traits::kHeadDim * sizeof(float) : reinterpret_cast<char*>(ss.smem_v.data());
    // Every warpgroup's last GEMMs (which read sK / sV, and sQ / sdO / sdS) have completed.
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);
    stage<Traits::kHeadDim, T>(mma_dk, tdKrdK, sdk, thread_idx, params.softmax_scale);
    stage<Traits::kHeadDimV, T>(mma_dv, tdVrdV, sdv, thread_idx, 1.f);
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);  // the whole tiles are staged
    if constexpr (kSplit) {
      if (tile.pieces > 1 && !combine_pieces(params, ss, tile, sdk, thread_idx)) return;
    }
    const int seqlen_k = mask.seqlen_k;
    Element* dk = params.dk + tile.batch * params.dk_batch_stride + tile.head_kv * params.dk_head_stride;
    Element* dv = params.dv + tile.batch * params.dv_batch_stride + tile.head_kv * params.dv_head_stride;
    if constexpr (Traits::kVarlen) {  // the sequence's rows
      const int64_t row0 = params.varlen.seqs[tile.batch].offset_k;
      dk = params.dk + row0 * params.dk_row_stride + tile.head_kv * params.dk_head_stride;
      dv = params.dv + row0 * params.dv_row_stride + tile.head_kv * params.dv_head_stride;
    }
    write_rows<Traits::kHeadDim, T>(sdk, dk, params.dk_row_stride, tile.n_block, seqlen_k, thread_idx);
    write_rows<Traits::kHeadDimV, T>(sdv, dv, params.dv_row_stride, tile.n_block, seqlen_k, thread_idx);
  }
};

}  // namespace flash3
