// Forward launch template: builds the TMA descriptors and kernel params for one
// (dtype, head_dim, head_dim_v) and picks the mask variant at run time.
// Instantiated once per manifest row (build/generated/fwd_*.cu).
#pragma once
#include <cmath>
#include <limits>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/cuda_check.h"
#include "common/params.h"
#include "fwd/kernel.h"
#include "launch/launch_kernel.cuh"

namespace flash3 {

// Causal/local tile order (LptTileScheduler). Measured on H200, bf16 causal
// (docs/performance.md, "Causal forward tile order"): for d <= 128
// longest-first in groups of heads whose K/V fit in a share of L2 together
// beats the global order at 2k-8k (d=128 2k: 504 vs 437 TFLOP/s) and ties at
// 16k; for d > 128 the global longest-first order wins everywhere (d=256 8k:
// 717 vs 655). The longest-first
// grids put the query blocks in gridDim.y: beyond its 65535 limit the plain
// order (query blocks in gridDim.x) runs instead.
inline int fwd_tile_order(const FwdParams& p, int num_m_blocks, int d, int dv, int elem_bytes) {
  if (num_m_blocks > kMaxGridYZ) return -1;
  if (d > 128) return 0;
  constexpr double kL2Share = 24.0 * 1024 * 1024;  // of the H100/H200's 50 MB L2
  const double kv_bytes = double(p.seqlen_k > 0 ? p.seqlen_k : 1) * (d + dv) * elem_bytes;
  const int g = int(kL2Share / kv_bytes);
  return g < 1 ? 1 : g;
}

template <class Traits, class Scheduler>
Status launch_fwd_variant(const FwdParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  using namespace cute;
  typename Traits::Params kp{};
  // K/V extents: a tensor map needs every dimension >= 1; with seqlen_k == 0 no
  // KV block is ever loaded (the tile range is empty).
  const int sk = p.seqlen_k > 0 ? p.seqlen_k : 1;
  auto shape_q = make_shape(int32_t(p.seqlen_q), int32_t(p.head_dim), int32_t(p.heads_q), int32_t(p.batch));
  auto shape_k = make_shape(int32_t(sk), int32_t(p.head_dim), int32_t(p.heads_kv), int32_t(p.batch));
  auto shape_v = make_shape(int32_t(sk), int32_t(p.head_dim_v), int32_t(p.heads_kv), int32_t(p.batch));
  auto shape_o = make_shape(int32_t(p.seqlen_q), int32_t(p.head_dim_v), int32_t(p.heads_q), int32_t(p.batch));
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)), shape_q,
                          make_stride(p.q_row_stride, _1{}, p.q_head_stride, p.q_batch_stride));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)), shape_k,
                          make_stride(p.k_row_stride, _1{}, p.k_head_stride, p.k_batch_stride));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)), shape_v,
                          make_stride(p.v_row_stride, _1{}, p.v_head_stride, p.v_batch_stride));
  Tensor mO = make_tensor(make_gmem_ptr(static_cast<Element*>(p.o)), shape_o,
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride));
  kp.tma_load_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Traits::SmemLayoutQ{},
                                Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_load_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                                Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_load_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutV{}),
                                Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{}, _1{});
  kp.tma_store_o = make_tma_copy(SM90_TMA_STORE{}, mO, typename Traits::SmemLayoutO{},
                                 Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>{}, _1{});
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_q, "q"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_k, "k"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_load_v, "v"));
  FLASH3_RETURN_IF_ERROR(check_tma_descriptor(kp.tma_store_o, "out"));
  kp.shape_q = shape_q;
  kp.shape_k = shape_k;
  kp.shape_v = shape_v;
  kp.shape_o = shape_o;
  kp.lse = p.lse;
  kp.lse_batch_stride = p.lse_batch_stride;
  kp.lse_head_stride = p.lse_head_stride;
  kp.mask = make_mask_spec(p);
  kp.heads_q = p.heads_q;
  kp.heads_per_kv = p.heads_q / p.heads_kv;
  kp.num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  kp.softmax_scale = p.softmax_scale;
  kp.softmax_scale_log2 = p.softmax_scale_log2;

  constexpr auto kernel = &flash_fwd_kernel<Traits, Scheduler>;
  constexpr int smem = Traits::kSmemBytes;
  kp.tile_order = fwd_tile_order(p, kp.num_m_blocks, Traits::kHeadDim, Traits::kHeadDimV, sizeof(Element));
  kp.batch = p.batch;
  dim3 grid;
  if constexpr (Traits::kPersistent) {
    int num_sms = 0;
    FLASH3_RETURN_IF_ERROR(current_sm_count(&num_sms));
    grid = Scheduler::grid(kp.num_m_blocks, p.heads_q, p.batch, num_sms);
  } else {
    grid = Scheduler::grid(kp.num_m_blocks, p.heads_q, p.batch, kp.tile_order);
  }
  if constexpr (Traits::kPersistent && Scheduler::kDynamic) {
    // The tile counter: stream-ordered scratch, zeroed before the kernel (one
    // 4-byte memset; safe under concurrent launches on other streams and in
    // CUDA graphs, unlike a shared counter that the kernel resets itself).
    int* tile_counter = nullptr;
    FLASH3_CUDA_TRY(cudaMallocAsync(&tile_counter, sizeof(int), stream));
    Status s = cuda_call(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream), "cudaMemsetAsync(tile counter)");
    if (s.ok()) {
      s = launch_kernel_smem<kernel>("flash3 forward kernel launch", grid, dim3(Traits::kNumThreads), smem, stream,
                                     kp, tile_counter);
    }
    Status freed = cuda_call(cudaFreeAsync(tile_counter, stream), "cudaFreeAsync(tile counter)");
    return s.ok() ? freed : s;
  }
  return launch_kernel_smem<kernel>("flash3 forward kernel launch", grid, dim3(Traits::kNumThreads), smem, stream,
                                    kp, static_cast<int*>(nullptr));
}

template <class Element, int kHeadDim, int kHeadDimV, class Mask, class Scheduler, bool kCausalOrLocal,
          bool kShortCausal = false>
Status run_fwd_mask(const FwdParams& p, cudaStream_t stream) {
  using Base = DefaultFwdConfig<kHeadDim, kHeadDimV, kCausalOrLocal, Mask::kHasLeft, kShortCausal>;
  using PersistentSched = std::conditional_t<kCausalOrLocal, DynamicLptTileScheduler, PersistentTileScheduler>;
  using Sched = std::conditional_t<Base::value.persistent, PersistentSched, Scheduler>;
  return launch_fwd_variant<FwdTraits<Element, kHeadDim, kHeadDimV, Base, Mask>, Sched>(p, stream);
}

// Mask variant and scheduler: causal/local tiles are unequal, so they use the
// longest-first order; unmasked tiles keep m_block fastest for L2 reuse.
template <class Element, int kHeadDim, int kHeadDimV>
Status run_fwd(const FwdParams& p, cudaStream_t stream) {
  if (p.is_local) return run_fwd_mask<Element, kHeadDim, kHeadDimV, MaskLocal, LptTileScheduler, true>(p, stream);
  if (p.is_causal) {
    // Head dims whose causal problems all take the short-causal kernel
    // (fwd_short_causal: d <= 64) do not instantiate the other one.
    constexpr bool kAlwaysShort = fwd_short_causal(kHeadDim, std::numeric_limits<int>::max());
    static_assert(!kAlwaysShort || fwd_has_short_causal(kHeadDim, kHeadDimV), "short-causal kernel missing");
    if constexpr (fwd_has_short_causal(kHeadDim, kHeadDimV)) {
      if (kAlwaysShort || fwd_short_causal(kHeadDim, p.seqlen_k)) {
        return run_fwd_mask<Element, kHeadDim, kHeadDimV, MaskCausal, LptTileScheduler, true, true>(p, stream);
      }
    }
    if constexpr (!kAlwaysShort) {
      return run_fwd_mask<Element, kHeadDim, kHeadDimV, MaskCausal, LptTileScheduler, true>(p, stream);
    }
  }
  return run_fwd_mask<Element, kHeadDim, kHeadDimV, MaskNone, SingleTileScheduler, false>(p, stream);
}

}  // namespace flash3
