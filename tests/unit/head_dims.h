// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The (head_dim, head_dim_v) pairs that have kernels (tools/manifest.py, HDIMS,
// through the generated head_dims.inc), for the host tests that check a
// property of every variant's configuration.
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>

namespace flash3_test {

inline constexpr int kHeadDimPairs[][2] = {
#define FLASH3_HEAD_DIM(D, DV) {D, DV},
#include "head_dims.inc"
#undef FLASH3_HEAD_DIM
};
inline constexpr std::size_t kNumHeadDimPairs = sizeof(kHeadDimPairs) / sizeof(kHeadDimPairs[0]);

template <class F, std::size_t... I>
void for_each_head_dim_pair_impl(F&& f, std::index_sequence<I...>) {
  (f(std::integral_constant<int, kHeadDimPairs[I][0]>{}, std::integral_constant<int, kHeadDimPairs[I][1]>{}), ...);
}

// f(d, dv) with d, dv std::integral_constant<int, ...>, once per pair: for
// checks that instantiate a kernel's traits.
template <class F>
void for_each_head_dim_pair(F&& f) {
  for_each_head_dim_pair_impl(f, std::make_index_sequence<kNumHeadDimPairs>{});
}

}  // namespace flash3_test
