// Backward epilogue: dK (scaled by softmax_scale, seed 7.1.5) and dV converted
// in registers, staged in shared memory (the K and V buffers, free once every
// GEMM of the CTA is done) and written to global memory in whole 16-byte row
// chunks; keys past seqlen_k are dropped. GQA needs no reduction here: the CTA
// has already summed over the query heads that share its KV head.
//
// Why staged: the accumulator layout's own stores are 4 bytes per thread, 16
// bytes per row per instruction, half of every 32-byte sector. Skipping the
// epilogue (timing experiment, bench/fixed_cost.py) cut the per-tile fixed
// cost at d = 128 from 4.0 to 1.2 query-block iterations (2026-11-30), the
// same pathology as the dQ postprocess before it was staged.
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
  static constexpr int kChunk = 16 / int(sizeof(Element));  // elements per 16-byte chunk

  // Byte offset of (row, col) in a staged (kBlockN x kCols) tile: rows of
  // kCols elements, 16-byte chunks XOR-swizzled by row % 8, so that the
  // fragment stores (8 rows x one chunk per warp instruction) hit 8 distinct
  // chunk positions, and the row reads are whole chunks. (d = 96 has 12
  // chunks per row: row % 4, 2-way conflicts.)
  template <int kCols>
  CUTLASS_HOST_DEVICE static uint32_t staged_offset(int row, int col) {
    constexpr int kChunksPerRow = kCols / kChunk;
    static_assert(kCols % kChunk == 0 && kChunksPerRow % 4 == 0, "rows of a multiple of 4 chunks");
    constexpr int kSwizzle = kChunksPerRow % 8 == 0 ? 8 : 4;
    const int chunk = (col / kChunk) ^ (row % kSwizzle);
    return uint32_t(row * kCols + chunk * kChunk + col % kChunk) * uint32_t(sizeof(Element));
  }

  // acc: a (kBlockN x kCols) accumulator of `mma` (rows = keys of this block)
  // -> the staged tile at `smem` (scaled, converted).
  template <int kCols, class TiledMma, class TensorAcc>
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
        cutlass::NumericArrayConverter<Element, float, 2> cvt;
        *reinterpret_cast<cutlass::Array<Element, 2>*>(smem + staged_offset<kCols>(row, get<1>(c_rc(r, j)))) =
            cvt(v2);
      }
    }
  }

  // The staged tile -> global rows n_block * kBlockN + row (< seqlen_k), one
  // 16-byte chunk per thread and step: consecutive threads write consecutive
  // chunks of a row.
  template <int kCols>
  CUTLASS_DEVICE static void write_rows(const char* smem, Element* base, int64_t row_stride, int n_block,
                                        int seqlen_k, int thread_idx) {
    constexpr int kChunksPerRow = kCols / kChunk;
    static_assert(kBlockN * kChunksPerRow % Traits::kNumMmaThreads == 0, "every thread writes the same number of chunks");
    CUTLASS_PRAGMA_UNROLL
    for (int step = 0; step < kBlockN * kChunksPerRow / Traits::kNumMmaThreads; ++step) {
      const int i = thread_idx + step * Traits::kNumMmaThreads;
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int key = n_block * kBlockN + row;
      if (key < seqlen_k) {
        *reinterpret_cast<uint4*>(base + key * row_stride + chunk * kChunk) =
            *reinterpret_cast<const uint4*>(smem + staged_offset<kCols>(row, chunk * kChunk));
      }
    }
  }

  template <class TensordK, class TensordV>
  CUTLASS_DEVICE static void store(Params const& params, SharedStorage& ss, BwdTile tile, TensordK& tdKrdK,
                                   TensordV& tdVrdV, int thread_idx) {
    static_assert(sizeof(ss.smem_k) >= kBlockN * Traits::kHeadDim * sizeof(Element));
    static_assert(sizeof(ss.smem_v) >= kBlockN * Traits::kHeadDimV * sizeof(Element));
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadV mma_dv;
    char* sdk = reinterpret_cast<char*>(ss.smem_k.data());
    char* sdv = reinterpret_cast<char*>(ss.smem_v.data());
    // Every warpgroup's last GEMMs (which read sK / sV) have completed.
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);
    stage<Traits::kHeadDim>(mma_dk, tdKrdK, sdk, thread_idx, params.softmax_scale);
    stage<Traits::kHeadDimV>(mma_dv, tdVrdV, sdv, thread_idx, 1.f);
    named_barrier_sync(Traits::kNumMmaThreads, BwdBarrier::kEpilogue);  // the whole tiles are staged
    const int seqlen_k = params.mask.seqlen_k;
    Element* dk = params.dk + tile.batch * params.dk_batch_stride + tile.head_kv * params.dk_head_stride;
    Element* dv = params.dv + tile.batch * params.dv_batch_stride + tile.head_kv * params.dv_head_stride;
    write_rows<Traits::kHeadDim>(sdk, dk, params.dk_row_stride, tile.n_block, seqlen_k, thread_idx);
    write_rows<Traits::kHeadDimV>(sdv, dv, params.dv_row_stride, tile.n_block, seqlen_k, thread_idx);
  }
};

}  // namespace flash3
