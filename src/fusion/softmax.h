// Online softmax in base 2 (seed 4.6): softmax_scale * log2(e) is folded into
// one FMA per score; the row sum stays a per-thread partial until finalize(),
// which saves two shuffles per KV block on the critical path.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include <cute/tensor.hpp>

#include "common/cute_utils.h"

namespace flash3 {

template <int kNRows>
struct OnlineSoftmax {
  float row_max[kNRows];
  float row_sum[kNRows];  // per-thread partial sums until finalize()
  float scale_log2;

  CUTLASS_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) { row_max[r] = -INFINITY; row_sum[r] = 0.f; }
  }

  // S (rows, cols) -> unnormalised P in place; row_scale[r] = factor by which
  // the O accumulator of row r must be multiplied (1 on the first block).
  // Row by row on purpose: the FMNMX chain of row r+1 then overlaps the MUFU
  // exponentials of row r (measured: computing both rows' maxima first, with
  // four-way split chains, ran 10% slower at head_dim 64).
  // kExp2EmuEvery = k > 0: every k-th column's exp2 runs on the FMA pipe
  // (exp2_fma) instead of the MUFU.
  // kSlack > 0 (lazy rescaling): a row keeps its stored max until a block's max
  // exceeds it by more than kSlack in log2 units, so P stays <= 2^kSlack and
  // O / row_sum need no rescale for that row (row_scale exactly 1). The result
  // is unchanged: O, row_sum and the LSE all refer to the same stored max.
  // Returns whether any row of this warp has row_scale != 1 (warp-uniform, so
  // the caller can skip rescale_o without divergence); always true for kSlack = 0.
  template <bool kIsFirst, int kExp2EmuEvery = 0, int kSlack = 0, class TensorS>
  CUTLASS_DEVICE bool step(TensorS& s, float (&row_scale)[kNRows]) {
    using namespace cute;
    static_assert(decltype(size<0>(s))::value == kNRows);
    bool grew = false;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      const float old_max = row_max[r];
      float mx = old_max;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) mx = fmaxf(mx, s(r, c));
      mx = quad_allreduce(mx, MaxOp{});
      // Whether the stored max follows this block's (always, when eager).
      // -inf -> finite always moves; -inf -> -inf never does (the row stays empty).
      bool moved = true;
      if constexpr (kSlack > 0 && !kIsFirst) {
        moved = mx > old_max && (old_max == -INFINITY || (mx - old_max) * scale_log2 > float(kSlack));
        grew |= moved;
      }
      if (moved) row_max[r] = mx;
      // A row masked so far has max -inf: subtract 0 instead so exp2 gives 0, not NaN.
      const float m_scaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
      row_scale[r] = kIsFirst || !moved ? 1.f : exp2f(old_max * scale_log2 - m_scaled);
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        const float x = s(r, c) * scale_log2 - m_scaled;
        if constexpr (kExp2EmuEvery > 0) {
          s(r, c) = c % kExp2EmuEvery == kExp2EmuEvery - 1 ? exp2_fma(x) : exp2f(x);
        } else {
          s(r, c) = exp2f(x);
        }
        sum += s(r, c);
      }
      row_sum[r] = kIsFirst ? sum : row_sum[r] * row_scale[r] + sum;
    }
    if constexpr (kSlack > 0 && !kIsFirst) {
      return __any_sync(0xffffffffu, grew);
    } else {
      return !kIsFirst;
    }
  }

  // 2^x for x <= 0 without the MUFU: x = j + f with j = round(x) (the
  // 1.5 * 2^23 trick leaves j in the low mantissa bits of t), 2^f on
  // [-1/2, 1/2] by a degree-3 polynomial (relative error 1.0e-4, below half
  // an ulp of bf16 and a fifth of fp16's), and j added to the exponent field.
  // x is clamped at -127 where j = -127, f = 0 and the bits come out as +0.0,
  // so masked scores (-inf) give exactly 0 as the MUFU does.
  // Host-callable for tests/unit/test_softmax_exp2.cu: one body, with the
  // rounding pinned by the primitives below (__fadd_rn on the device, where
  // nvcc could otherwise contract the adds; plain IEEE adds on the host).
  CUTLASS_HOST_DEVICE static float exp2_fma(float x) {
    x = fmaxf(x, -127.f);
    const float t = add_rn(x, 12582912.f);
    const float j = add_rn(t, -12582912.f);
    const float f = add_rn(x, -j);
    const float p = fma_rn(fma_rn(fma_rn(0.05501849f, f, 0.24221099f), f, 0.69328095f), f, 1.f);
    return bits_float(float_bits(p) + (float_bits(t) << 23));
  }
  CUTLASS_HOST_DEVICE static float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
  }
  CUTLASS_HOST_DEVICE static float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
  CUTLASS_HOST_DEVICE static uint32_t float_bits(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  }
  CUTLASS_HOST_DEVICE static float bits_float(uint32_t u) {
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  }

  template <class TensorO>
  CUTLASS_DEVICE static void rescale_o(TensorO& o, const float (&row_scale)[kNRows]) {
    using namespace cute;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= row_scale[r];
    }
  }

  // After the last block: 1/rowsum into row_scale (0 for empty rows) and the
  // natural-log LSE (-inf for empty rows).
  CUTLASS_DEVICE void finalize(float softmax_scale, float (&row_scale)[kNRows], float (&lse)[kNRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      const float sum = quad_allreduce(row_sum[r], SumOp{});
      const bool empty = sum == 0.f || sum != sum;
      row_scale[r] = empty ? 0.f : __frcp_rn(sum);
      lse[r] = empty ? -INFINITY : row_max[r] * softmax_scale + __logf(sum);
    }
  }
};

}  // namespace flash3
