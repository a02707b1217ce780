// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Forward epilogue (seed 4.10): O normalised, converted, staged in shared memory
// over Q's buffer and written with one TMA store; LSE (natural log) written from
// registers by the thread owning column 0 of each row.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/cute_utils.h"
#include "common/named_barriers.h"
#include "fusion/softmax.h"
#include "fwd/mainloop.h"
#include "scheduler/tile_scheduler.h"

namespace flash3 {

template <class Traits>
struct FwdEpilogue {
  using ElementOut = typename Traits::ElementOut;
  using Params = typename Traits::Params;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  using TiledMmaPV = typename Traits::TiledMmaPV;

  template <class TensorO, class Softmax>
  CUTLASS_DEVICE static void store(Params const& params, SharedStorage& ss, WorkTile tile, MaskSpec const& mask,
                                   TensorO& tOrO, Softmax& softmax, float o_descale, int thread_idx) {
    constexpr int kNRows = Softmax::kRows;
    TiledMmaPV tiled_mma_pv;
    auto thr_pv = tiled_mma_pv.get_thread_slice(thread_idx);

    float inv_sum[kNRows], lse[kNRows];
    if constexpr (Traits::kFp8) {
      // The LSE of the de-quantized scores (row_max holds them scaled); O times
      // the descale of the V block it is in (FwdMainloop::mma).
      softmax.finalize(params.softmax_scale, inv_sum, lse);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kNRows; ++r) inv_sum[r] *= o_descale;
    } else {
      softmax.finalize(params.softmax_scale, inv_sum, lse);
    }
    {
      Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
      OnlineSoftmax<kNRows>::rescale_o(o, inv_sum);
    }
    if constexpr (Traits::kSplit) {
      if (params.num_splits > 1) {  // fp32 partials for the combine, straight from registers
        store_partial(params, tile, mask, tOrO, lse, thread_idx);
        return;
      }
    }
    Tensor tOrO_out = convert_fragment<ElementOut>(tOrO);

    // Single tile: sO aliases sQ, so wait until every consumer warpgroup is past
    // its last QK^T. Persistent: sO is free once the previous tile's TMA store
    // has read it (thread 0 issued that store, so thread 0 waits for it).
    if constexpr (Traits::kPersistent) {
      if (thread_idx == 0) tma_store_wait<0>();
    }
    named_barrier_sync(Traits::kNumMmaThreads, FwdBarrier::kEpilogue);
    Tensor sO = make_tensor(make_smem_ptr(ss.smem_o.data()), typename Traits::SmemLayoutO{});
    auto smem_tiled_copy_O = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, ElementOut>{}, tiled_mma_pv);
    auto smem_thr_copy_O = smem_tiled_copy_O.get_thread_slice(thread_idx);
    Tensor taccOrO = smem_thr_copy_O.retile_S(tOrO_out);
    Tensor taccOsO = smem_thr_copy_O.partition_D(sO);
    copy(smem_tiled_copy_O, taccOrO, taccOsO);
    // Generic-proxy smem writes must be visible to the async proxy (TMA store).
    if constexpr (!Traits::kPackGQA) cutlass::arch::fence_view_async_shared();
    named_barrier_sync(Traits::kNumMmaThreads, FwdBarrier::kEpilogue);

    if constexpr (Traits::kPackGQA) {
      store_lse_packed(params, tile, mask, lse, thread_idx);
      store_o_packed(params, sO, tile, mask, thread_idx);
      return;
    }

    // LSE: the thread holding column 0 of a row writes it (rows past seqlen_q skipped).
    if (params.lse != nullptr) {
      Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{});
      Tensor tOcO = thr_pv.partition_C(cO);
      Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
      int seqlen_q = get<0>(params.shape_q);
      float* lse_ptr = params.lse + tile.batch * params.lse_batch_stride + tile.head * params.lse_head_stride;
      if constexpr (Traits::kVarlen) {  // (heads, total_q): the sequence's rows
        seqlen_q = mask.seqlen_q;
        lse_ptr = params.lse + tile.head * params.lse_head_stride + params.varlen.seqs[tile.batch].offset_q;
      }
      if (get<1>(tOcO_rc(0, 0)) == 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kNRows; ++r) {
          const int row = tile.m_block * kBlockM + get<0>(tOcO_rc(r, 0));
          if (row < seqlen_q) lse_ptr[row] = lse[r];
        }
      }
    }

    // One thread issues the TMA store; rows past seqlen_q are clipped by the
    // tensor map. It must wait for the smem reads before the CTA exits (a
    // persistent CTA waits before the next tile's sO writes, and in drain()).
    if (thread_idx == 0) {
      auto block_tma_o = params.tma_store_o.get_slice(_0{});
      Tensor tOsO = block_tma_o.partition_S(sO);
      if constexpr (Traits::kVarlen) {
        // The sequence's map: rows past its end (and past seqused) are dropped.
        cute::TmaDescriptor const* desc_o = params.varlen.desc + int64_t(tile.batch) * kNumVarlenDesc + kDescO;
        cute::tma_descriptor_fence_acquire(desc_o);
        auto shape_o = make_shape(int32_t(imax(mask.seqlen_q, 1)), get<1>(params.shape_o), get<2>(params.shape_o),
                                  int32_t(1));
        Tensor mO = params.tma_store_o.get_tma_tensor(shape_o)(_, _, tile.head, 0);
        Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{}, make_coord(tile.m_block, _0{}));
        copy(params.tma_store_o.with(desc_o), tOsO, block_tma_o.partition_D(gO));
      } else {
        Tensor mO = params.tma_store_o.get_tma_tensor(params.shape_o)(_, _, tile.head, tile.batch);
        Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{}, make_coord(tile.m_block, _0{}));
        Tensor tOgO = block_tma_o.partition_D(gO);
        copy(params.tma_store_o, tOsO, tOgO);
      }
      tma_store_arrive();
      if constexpr (!Traits::kPersistent) tma_store_wait<0>();
    }
  }

  // PackGQA LSE: packed row p is (query row p / g, head p % g of the group).
  template <int kNRows>
  CUTLASS_DEVICE static void store_lse_packed(Params const& params, WorkTile tile, MaskSpec const& mask,
                                              float const (&lse)[kNRows], int thread_idx) {
    if (params.lse == nullptr) return;
    TiledMmaPV tiled_mma_pv;
    auto thr_pv = tiled_mma_pv.get_thread_slice(thread_idx);
    Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{});
    Tensor tOcO = thr_pv.partition_C(cO);
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    if (get<1>(tOcO_rc(0, 0)) != 0) return;
    // Fixed length: (batch, heads, seqlen_q); varlen: (heads, total_q), row stride 1.
    float* lse_ptr = params.lse + FwdMainloop<Traits>::packed_seq_offset(params, tile, params.lse_batch_stride, 1) +
                     FwdMainloop<Traits>::first_q_head(params, tile) * params.lse_head_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      int q_row, head;
      params.pack_divmod(q_row, head, tile.m_block * kBlockM + get<0>(tOcO_rc(r, 0)));
      if (q_row < mask.seqlen_q) lse_ptr[int64_t(head) * params.lse_head_stride + q_row] = lse[r];
    }
  }

  // PackGQA O: every consumer thread scatters 16-byte pieces of sO (staged by
  // the STSM above, complete at the barrier) to their rows; rows past the
  // sequence are not written. One tile per CTA: sO is not reused afterwards.
  template <class TensorSO>
  CUTLASS_DEVICE static void store_o_packed(Params const& params, TensorSO const& sO, WorkTile tile,
                                            MaskSpec const& mask, int thread_idx) {
    using Vec = cute::uint128_t;
    constexpr int kVec = int(sizeof(Vec) / sizeof(ElementOut));
    constexpr int kVecsPerRow = Traits::kHeadDimV / kVec;
    static_assert(Traits::kHeadDimV % kVec == 0, "O rows are copied in 16-byte pieces");
    ElementOut* o = params.o_ptr +
                 FwdMainloop<Traits>::packed_seq_offset(params, tile, params.o_batch_stride, params.o_row_stride) +
                 FwdMainloop<Traits>::first_q_head(params, tile) * params.o_head_stride;
    CUTLASS_PRAGMA_UNROLL
    for (int i = thread_idx; i < kBlockM * kVecsPerRow; i += Traits::kNumMmaThreads) {
      const int r = i / kVecsPerRow, c = i % kVecsPerRow;
      int q_row, head;
      params.pack_divmod(q_row, head, tile.m_block * kBlockM + r);
      if (q_row < mask.seqlen_q) {
        *reinterpret_cast<Vec*>(o + int64_t(q_row) * params.o_row_stride + int64_t(head) * params.o_head_stride +
                                c * kVec) = *reinterpret_cast<Vec const*>(&sO(r, c * kVec));
      }
    }
  }

  // Split-KV: the split's normalised O (fp32) and LSE of each real row, for
  // the combine kernel. Each thread writes its accumulator registers: pairs of
  // adjacent columns (float2) of two rows per 8-column group; the four threads
  // of a quad fill 32 contiguous bytes of a row. Packed rows of one query row
  // are adjacent heads, so consecutive rows of the tile are contiguous too.
  template <class TensorO, int kNRows>
  CUTLASS_DEVICE static void store_partial(Params const& params, WorkTile tile, MaskSpec const& mask,
                                           TensorO const& tOrO, float const (&lse)[kNRows], int thread_idx) {
    TiledMmaPV tiled_mma_pv;
    auto thr_pv = tiled_mma_pv.get_thread_slice(thread_idx);
    Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<Traits::kHeadDimV>>{});
    Tensor tOcO = thr_pv.partition_C(cO);
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    static_assert(decltype(size<1>(o_rc))::value % 2 == 0, "accumulator columns come in pairs");
    const int64_t q_head0 = FwdMainloop<Traits>::first_q_head(params, tile);
    float* o_base = params.o_partial + int64_t(tile.split) * params.op_split_stride +
                    FwdMainloop<Traits>::packed_seq_offset(params, tile, params.op_batch_stride, params.op_row_stride) +
                    q_head0 * Traits::kHeadDimV;
    float* lse_base = params.lse_partial + int64_t(tile.split) * params.lp_split_stride +
                      FwdMainloop<Traits>::packed_seq_offset(params, tile, params.lp_batch_stride, 1) +
                      q_head0 * params.lp_head_stride;
    const bool lse_writer = get<1>(tOcO_rc(0, 0)) == 0;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      int q_row, head;
      params.pack_divmod(q_row, head, tile.m_block * kBlockM + get<0>(tOcO_rc(r, 0)));
      if (q_row >= mask.seqlen_q) continue;
      float* o_row = o_base + int64_t(q_row) * params.op_row_stride + int64_t(head) * Traits::kHeadDimV;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o_rc); c += 2) {
        *reinterpret_cast<float2*>(o_row + get<1>(tOcO_rc(r, c))) = make_float2(o_rc(r, c), o_rc(r, c + 1));
      }
      if (lse_writer) lse_base[int64_t(head) * params.lp_head_stride + q_row] = lse[r];
    }
  }

  // Persistent CTAs, after the last tile: the last TMA store must have read sO
  // before the CTA (and its shared memory) goes away.
  CUTLASS_DEVICE static void drain(int thread_idx) {
    if (thread_idx == 0) tma_store_wait<0>();
  }
};

}  // namespace flash3
