// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Which KV blocks a query tile visits, and which of them need a mask.
// Host + device so the CPU tests check exactly what the kernel runs.
//
// Masks are aligned bottom-right: with offset = seqlen_k - seqlen_q, query row i
// sees key columns [i + offset - window_left, i + offset + window_right]
// (a bound of -1 is unbounded; causal is window_right = 0, window_left = -1).
#pragma once
#include <cutlass/cutlass.h>

namespace flash3 {

struct MaskSpec {
  int seqlen_q = 0, seqlen_k = 0;
  int window_left = -1;   // < 0: unbounded on the left
  int window_right = -1;  // < 0: unbounded on the right
  CUTLASS_HOST_DEVICE bool has_left() const { return window_left >= 0; }
  CUTLASS_HOST_DEVICE bool has_right() const { return window_right >= 0; }
  CUTLASS_HOST_DEVICE int offset() const { return seqlen_k - seqlen_q; }
};

CUTLASS_HOST_DEVICE constexpr int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
CUTLASS_HOST_DEVICE constexpr int ceil_div_int(int a, int b) { return -floor_div(-a, b); }
CUTLASS_HOST_DEVICE constexpr int imin(int a, int b) { return a < b ? a : b; }
CUTLASS_HOST_DEVICE constexpr int imax(int a, int b) { return a > b ? a : b; }

struct NBlockRange {
  int n_min = 0;               // first KV block visited
  int n_max = 0;               // one past the last; empty when n_max <= n_min
  int n_min_right_masked = 0;  // blocks in [n_min_right_masked, n_max) cross the right bound
  int n_max_left_masked = 0;   // blocks in [n_min, n_max_left_masked) cross the left bound
  CUTLASS_HOST_DEVICE bool empty() const { return n_max <= n_min; }
};

// The KV blocks that query rows [row_first, row_last] visit (row_last may
// exceed seqlen_q: padded rows only widen the range).
CUTLASS_HOST_DEVICE NBlockRange fwd_n_block_range_rows(const MaskSpec& m, int row_first, int row_last, int tile_n) {
  NBlockRange r;
  int n_max = ceil_div_int(m.seqlen_k, tile_n);
  if (m.has_right()) {
    // Last visible column of the tile's last row, inclusive.
    n_max = imin(n_max, imax(0, floor_div(row_last + m.offset() + m.window_right, tile_n) + 1));
  }
  int n_min = 0;
  if (m.has_left()) {
    n_min = imax(0, floor_div(row_first + m.offset() - m.window_left, tile_n));
  }
  r.n_min = n_min;
  r.n_max = n_max;
  // Right mask needed unless every column of the block is visible to the first row.
  r.n_min_right_masked = m.has_right()
      ? imax(n_min, imin(n_max, floor_div(row_first + m.offset() + m.window_right + 1, tile_n)))
      : n_max;
  // Left mask needed unless the block starts at or after the last row's first visible column.
  r.n_max_left_masked = m.has_left()
      ? imin(n_max, imax(n_min, ceil_div_int(row_last + m.offset() - m.window_left, tile_n)))
      : n_min;
  return r;
}

CUTLASS_HOST_DEVICE NBlockRange fwd_n_block_range(const MaskSpec& m, int m_block, int tile_m, int tile_n) {
  const int row_first = m_block * tile_m;
  return fwd_n_block_range_rows(m, row_first, row_first + tile_m - 1, tile_n);
}

// PackGQA (seed ch. 11): the query heads sharing a KV head are packed into the
// tile's rows, packed row p holding query row p / g of head p % g of the group
// (g query heads per KV head), so m_block covers query rows
// [m_block * tile_m / g, ((m_block + 1) * tile_m - 1) / g].
CUTLASS_HOST_DEVICE NBlockRange fwd_n_block_range_packed(const MaskSpec& m, int m_block, int tile_m, int tile_n,
                                                        int g) {
  const int packed_first = m_block * tile_m;
  return fwd_n_block_range_rows(m, packed_first / g, (packed_first + tile_m - 1) / g, tile_n);
}

// Split-KV (seed ch. 10): split `split` of `num_splits` visits its share of
// the tile's own range, ceil((n_max - n_min) / num_splits) blocks each
// (splitting the tile's range, not the whole sequence, keeps causal tiles'
// splits equal). The mask boundaries are clamped into the share, so the
// mainloop's peeled segments stay inside it; a share past the range is empty
// (its rows get O = 0, LSE = -inf, which the combine weighs 0).
CUTLASS_HOST_DEVICE NBlockRange split_n_block_range(NBlockRange r, int split, int num_splits) {
  if (num_splits <= 1) return r;
  const int per = ceil_div_int(imax(r.n_max - r.n_min, 0), num_splits);
  const int lo = r.n_min + split * per;
  const int hi = imin(r.n_max, lo + per);
  NBlockRange s;
  s.n_min = lo;
  s.n_max = hi;
  s.n_min_right_masked = imin(hi, imax(lo, r.n_min_right_masked));
  s.n_max_left_masked = imin(hi, imax(lo, r.n_max_left_masked));
  return s;
}

// Backward: which query blocks KV block n_block visits. Exactly the transpose of
// fwd_n_block_range: m is visited iff fwd_n_block_range(m).n_min <= n_block <
// fwd_n_block_range(m).n_max (checked by the CPU tests).
struct MBlockRange {
  int m_min = 0, m_max = 0;  // [m_min, m_max); empty when m_max <= m_min
  CUTLASS_HOST_DEVICE bool empty() const { return m_max <= m_min; }
};

CUTLASS_HOST_DEVICE MBlockRange bwd_m_block_range(const MaskSpec& m, int n_block, int tile_m, int tile_n) {
  MBlockRange r;
  r.m_max = ceil_div_int(m.seqlen_q, tile_m);
  const int col_first = n_block * tile_n;
  const int col_last = col_first + tile_n - 1;  // unclipped, as in fwd_n_block_range
  if (col_first >= m.seqlen_k) {  // block entirely past seqlen_k
    r.m_max = 0;
    return r;
  }
  if (m.has_right()) {
    // Row i sees col_last iff col_last <= i + offset + window_right.
    r.m_min = imax(0, floor_div(col_first - m.offset() - m.window_right, tile_m));
  }
  if (m.has_left()) {
    // Row i sees col_first iff col_first >= i + offset - window_left.
    r.m_max = imin(r.m_max, imax(0, floor_div(col_last - m.offset() + m.window_left, tile_m) + 1));
  }
  return r;
}

// Whether the (m_block, n_block) tile has any invisible (query, key) pair,
// counting keys past seqlen_k; query rows past seqlen_q are neutralised by
// their statistics instead (LSE = +inf), so they need no mask.
CUTLASS_HOST_DEVICE bool bwd_tile_needs_mask(const MaskSpec& m, int m_block, int n_block, int tile_m, int tile_n) {
  const int row_first = m_block * tile_m, row_last = row_first + tile_m - 1;
  const int col_first = n_block * tile_n, col_last = col_first + tile_n - 1;
  if (col_last >= m.seqlen_k) return true;
  if (m.has_right() && col_last > row_first + m.offset() + m.window_right) return true;
  if (m.has_left() && col_first < row_last + m.offset() - m.window_left) return true;
  return false;
}

}  // namespace flash3

