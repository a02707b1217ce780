// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Small CuTe helpers shared by the forward and backward kernels: the WGMMA
// issue/commit/wait wrapper, accumulator layout views, quad reductions and the
// paired fp32 -> fp16/bf16 conversion.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

namespace flash3 {
using namespace cute;

// blockIdx.x read again (volatile asm: never merged with an earlier read), so
// that values decoded from it need not stay live across a long loop.
CUTLASS_DEVICE int fresh_block_idx_x() {
  uint32_t x;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  return int(x);
}

// Issues one warpgroup GEMM C (+)= A * B over all k-blocks as a single WGMMA
// group. wg_wait < 0: return with the group in flight (the caller waits later,
// which is what lets softmax overlap the PV GEMM); otherwise wait until at most
// wg_wait groups are pending.
template <bool kZeroInit, int kWgWait, class TiledMma, class TensorA, class TensorB, class TensorC>
CUTLASS_DEVICE void wgmma_gemm(TiledMma& tiled_mma, TensorA const& tCrA, TensorB const& tCrB, TensorC& tCrC) {
  constexpr bool kIsRS =
      !cute::is_base_of<cute::GMMA::DescriptorIterator, std::decay_t<decltype(tCrA.data())>>::value;
  // RS: the register operand was written by ordinary instructions; the fence
  // keeps those writes ordered before the asynchronous WGMMA reads them.
  if constexpr (kIsRS) { warpgroup_fence_operand(const_cast<TensorA&>(tCrA)); }
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  if constexpr (kZeroInit) { tiled_mma.accumulate_ = GMMA::ScaleOut::Zero; }
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWgWait >= 0) { warpgroup_wait<kWgWait>(); }
  warpgroup_fence_operand(tCrC);
  if constexpr (kIsRS) { warpgroup_fence_operand(const_cast<TensorA&>(tCrA)); }
}

// SM90 accumulator ((2, 2, V), MMA_M, MMA_N) viewed as (rows, cols):
// ((2, MMA_M), (2, V, MMA_N)). Each thread owns 2 rows per 64-row atom (r, r+8).
template <class Layout>
CUTLASS_HOST_DEVICE auto acc_rowcol(Layout const& acc) {
  static_assert(decltype(size<0, 0>(acc))::value == 2);
  static_assert(decltype(size<0, 1>(acc))::value == 2);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The S accumulator of a 64 x N WGMMA reused as the register A operand of the
// next (P V) WGMMA with K = N: ((2, 2, N/8), 1, 1) -> ((2, 2, 2), 1, N/16).
template <class Layout>
CUTLASS_HOST_DEVICE auto acc_to_operand_a(Layout const& acc) {
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(l), get<2>(acc))));
}

// Converts a whole register fragment, two elements per instruction
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32).
template <class To, class Engine, class Layout>
CUTLASS_DEVICE auto convert_fragment(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int N = decltype(size(src))::value;
  static_assert(N % 2 == 0, "paired conversion needs an even fragment");
  cutlass::NumericArrayConverter<To, From, N> convert;
  Tensor dst = make_tensor<To>(src.layout());
  *reinterpret_cast<cutlass::Array<To, N>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, N>*>(src.data()));
  return dst;
}

// Params of a single-CTA PipelineTmaAsync as every kernel here uses it:
// warpgroup 0 produces (thread 0 is the leader that arms each full barrier
// with the stage's TMA bytes); every consumer thread arrives on the empty
// barriers when it releases a stage.
template <class Pipeline>
CUTLASS_DEVICE typename Pipeline::Params tma_pipeline_params(bool is_producer, int num_consumers, uint32_t bytes) {
  typename Pipeline::Params p;
  p.role = is_producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  p.is_leader = threadIdx.x == 0;
  p.num_consumers = num_consumers;
  p.transaction_bytes = bytes;
  return p;
}

// a if kFirst, else b (objects of different types chosen at compile time).
template <bool kFirst, class A, class B>
CUTLASS_HOST_DEVICE auto& select_ref(A& a, B& b) {
  if constexpr (kFirst) {
    return a;
  } else {
    return b;
  }
}

// The 4 threads of a quad share a row of the SM90 accumulator.
template <class Op>
CUTLASS_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
  return x;
}
struct MaxOp {
  CUTLASS_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTLASS_DEVICE float operator()(float a, float b) const { return a + b; }
};

}  // namespace flash3
