// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Masking policy (hook order: score modifier -> mask -> softmax). Scores of
// invisible (query, key) pairs become -inf before the row max. The kernel peels
// the iterations that need a mask, so the steady-state loop calls none of this.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

#include "common/block_info.h"

namespace flash3 {

struct MaskNone {
  static constexpr bool kHasRight = false, kHasLeft = false;
};
struct MaskCausal {
  static constexpr bool kHasRight = true, kHasLeft = false;
};
// Sliding window; either side may still be unbounded at run time (-1).
struct MaskLocal {
  static constexpr bool kHasRight = true, kHasLeft = true;
};

// A tile row's query row: the row itself, or under PackGQA (packed row p holds
// query row p / g of the group's head p % g) the quotient.
struct RowIsQuery {
  CUTLASS_DEVICE int operator()(int row) const { return row; }
};
struct PackedRowToQuery {
  cutlass::FastDivmod heads_per_kv;  // g
  CUTLASS_DEVICE int operator()(int packed_row) const { return heads_per_kv.div(packed_row); }
};

// tSrS: the score accumulator viewed (rows, cols); tScS: its (row, col)
// coordinates inside the tile (same view). kSeqlen masks columns >= seqlen_k.
template <bool kSeqlen, bool kRight, bool kLeft, class TensorS, class TensorC, class RowToQuery = RowIsQuery>
CUTLASS_DEVICE void apply_mask(TensorS& tSrS, TensorC const& tScS, const MaskSpec& m, int row_base, int col_base,
                               RowToQuery const& to_query = {}) {
  using namespace cute;
  const int col_limit_seqlen = m.seqlen_k - col_base;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < size<0>(tSrS); ++r) {
    const int row = to_query(row_base + get<0>(tScS(r, 0)));
    int hi = kSeqlen ? col_limit_seqlen : (1 << 30);  // exclusive, tile-relative
    int lo = -(1 << 30);                              // inclusive, tile-relative
    if constexpr (kRight) {
      if (m.has_right()) hi = imin(hi, row + m.offset() + m.window_right + 1 - col_base);
    }
    if constexpr (kLeft) {
      if (m.has_left()) lo = row + m.offset() - m.window_left - col_base;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(tSrS); ++c) {
      const int col = get<1>(tScS(0, c));
      if (col >= hi || col < lo) tSrS(r, c) = -INFINITY;
    }
  }
}

}  // namespace flash3
