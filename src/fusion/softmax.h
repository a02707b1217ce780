// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Online softmax in base 2 (seed 4.6): softmax_scale * log2(e) is folded into
// one FMA per score; the row sum stays a per-thread partial until finalize(),
// which saves two shuffles per KV block on the critical path.
#pragma once
#include <cmath>

#include <cute/tensor.hpp>

#include "common/cute_utils.h"

namespace flash3 {

// kMaxOffset (FP8): P = exp2(s - max + kMaxOffset), so P <= 2^kMaxOffset
// uses more of the 8-bit P's range; the row sum carries the same factor and
// cancels it in O, and finalize() takes it out of the LSE.
// kScaledMax (FP8): row_max holds the scaled maximum (log2 units), so the
// caller may change scale_log2 between blocks (per-block K descales, seed
// 6.3); the instruction count per block is the same as with a raw max.
template <int kNRows, int kMaxOffset = 0, bool kScaledMax = false>
struct OnlineSoftmax {
  static constexpr int kRows = kNRows;
  static constexpr int kOffset = kMaxOffset;
  static constexpr bool kScaled = kScaledMax;
  float row_max[kNRows];  // raw score units; log2 units with kScaledMax
  float row_sum[kNRows];  // per-thread partial sums until finalize()
  float scale_log2;       // kScaledMax: this block's scale, set before step()

  CUTLASS_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) { row_max[r] = -INFINITY; row_sum[r] = 0.f; }
  }

  // S (rows, cols) -> unnormalised P in place; row_scale[r] = factor by which
  // the O accumulator of row r must be multiplied (1 on the first block).
  // Row by row on purpose: the FMNMX chain of row r+1 then overlaps the MUFU
  // exponentials of row r (computing both rows' maxima first, with four-way
  // split chains, measured 10% slower at head_dim 64).
  // kSlack > 0 (lazy rescaling): a row keeps its stored max until a block's max
  // exceeds it by more than kSlack in log2 units, so P stays <= 2^kSlack and
  // O / row_sum need no rescale for that row (row_scale exactly 1). The result
  // is unchanged: O, row_sum and the LSE all refer to the same stored max.
  // Returns whether any row of this warp has row_scale != 1 (warp-uniform, so
  // the caller can skip rescale_o without divergence); always true for kSlack = 0.
  template <bool kIsFirst, int kSlack = 0, class TensorS>
  CUTLASS_DEVICE bool step(TensorS& s, float (&row_scale)[kNRows]) {
    using namespace cute;
    static_assert(decltype(size<0>(s))::value == kNRows);
    bool grew = false;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      const float old_max = row_max[r];
      // A row masked so far has max -inf: subtract 0 instead so exp2 gives 0, not NaN.
      float m_scaled;
      if constexpr (kScaledMax) {
        static_assert(kSlack == 0, "lazy rescaling compares raw maxima");
        float mx = -INFINITY;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s); ++c) mx = fmaxf(mx, s(r, c));
        mx = fmaxf(old_max, quad_allreduce(mx, MaxOp{}) * scale_log2);  // scale_log2 > 0
        row_max[r] = mx;
        m_scaled = mx == -INFINITY ? 0.f : mx;
        row_scale[r] = kIsFirst ? 1.f : exp2f(old_max - m_scaled);
      } else {
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
        m_scaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
        row_scale[r] = kIsFirst || !moved ? 1.f : exp2f(old_max * scale_log2 - m_scaled);
      }
      const float m_offset = m_scaled - float(kMaxOffset);
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(s(r, c) * scale_log2 - m_offset);
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
  // natural-log LSE (-inf for empty rows). softmax_scale converts a raw
  // row_max (unused with kScaledMax, whose row_max is in log2 units).
  CUTLASS_DEVICE void finalize(float softmax_scale, float (&row_scale)[kNRows], float (&lse)[kNRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kNRows; ++r) {
      const float sum = quad_allreduce(row_sum[r], SumOp{});
      const bool empty = sum == 0.f || sum != sum;
      row_scale[r] = empty ? 0.f : __frcp_rn(sum);
      constexpr float kOffsetLn = float(kMaxOffset) * 0.69314718055994530942f;
      if constexpr (kScaledMax) {
        lse[r] = empty ? -INFINITY : row_max[r] * 0.69314718055994530942f + __logf(sum) - kOffsetLn;
      } else {
        lse[r] = empty ? -INFINITY : row_max[r] * softmax_scale + __logf(sum) - kOffsetLn;
      }
    }
  }
};

}  // namespace flash3
