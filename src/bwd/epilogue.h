// Backward epilogue: dK (scaled by softmax_scale, seed 7.1.5) and dV converted
// in registers and written straight to global memory, two adjacent elements per
// 32-bit store; keys past seqlen_k are dropped. GQA needs no reduction here:
// the CTA has already summed over the query heads that share its KV head.
#pragma once
#include <cute/tensor.hpp>

#include "bwd/mainloop.h"
#include "common/cute_utils.h"

namespace flash3 {

template <class Traits>
struct BwdEpilogue {
  using Element = typename Traits::Element;
  using Params = typename Traits::Params;
  static constexpr int kBlockN = Traits::kBlockN;

  // acc: a (kBlockN x kCols) accumulator of `mma` (rows = keys of this block).
  template <int kCols, class TiledMma, class TensorAcc>
  CUTLASS_DEVICE static void store_one(TiledMma& mma, TensorAcc& acc, Element* base, int64_t row_stride,
                                       int n_block, int seqlen_k, int thread_idx, float scale) {
    auto thr = mma.get_thread_slice(thread_idx);
    Tensor c = thr.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kCols>>{}));
    Tensor c_rc = make_tensor(c.data(), acc_rowcol(c.layout()));
    Tensor a_rc = make_tensor(acc.data(), acc_rowcol(acc.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(a_rc); ++r) {
      const int row = n_block * kBlockN + get<0>(c_rc(r, 0));
      if (row >= seqlen_k) continue;
      Element* row_ptr = base + row * row_stride;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(a_rc); j += 2) {
        // Columns j and j + 1 of the row view are adjacent (the accumulator's pair).
        const int col = get<1>(c_rc(r, j));
        cutlass::Array<float, 2> v2;
        v2[0] = a_rc(r, j) * scale;
        v2[1] = a_rc(r, j + 1) * scale;
        cutlass::NumericArrayConverter<Element, float, 2> cvt;
        *reinterpret_cast<cutlass::Array<Element, 2>*>(row_ptr + col) = cvt(v2);
      }
    }
  }

  template <class TensordK, class TensordV>
  CUTLASS_DEVICE static void store(Params const& params, BwdTile tile, TensordK& tdKrdK, TensordV& tdVrdV,
                                   int thread_idx) {
    const int seqlen_k = params.mask.seqlen_k;
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadV mma_dv;
    Element* dk = params.dk + tile.batch * params.dk_batch_stride + tile.head_kv * params.dk_head_stride;
    Element* dv = params.dv + tile.batch * params.dv_batch_stride + tile.head_kv * params.dv_head_stride;
    store_one<Traits::kHeadDim>(mma_dk, tdKrdK, dk, params.dk_row_stride, tile.n_block, seqlen_k, thread_idx,
                                params.softmax_scale);
    store_one<Traits::kHeadDimV>(mma_dv, tdVrdV, dv, params.dv_row_stride, tile.n_block, seqlen_k, thread_idx, 1.f);
  }
};

}  // namespace flash3
