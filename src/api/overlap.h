// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Memory overlap of strided tensor views (host only), for the validation of
// outputs: an output that shares an element with an input or another output,
// or whose own elements overlap, would be a race inside the kernels.
#pragma once
#include <cstdint>

#include "flash3/flash3.h"

namespace flash3 {

// Whether two distinct index vectors of t address overlapping bytes. Sufficient
// test: sorted by stride, each stride of a dimension of size > 1 must exceed
// the byte span of the smaller ones (layouts that interleave dimensions in
// other ways are reported as overlapping). Dimensions of size 1 are ignored.
bool self_overlaps(const TensorView& t);

// Whether a and b share a byte. Exact when both have the same element size and
// the same strides on their dimensions of size > 1 (views into one packed
// buffer, such as dq / dk / dv of a (b, s, 3, h, d) tensor: a search over
// index differences); otherwise any overlap of their byte ranges counts.
bool views_overlap(const TensorView& a, const TensorView& b);

}  // namespace flash3
