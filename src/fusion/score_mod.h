// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Score-modifier policy (hook order: score modifier -> mask -> softmax), the
// same type in both passes. A policy maps the raw Q K^T accumulator S onto the
// value the softmax exponentiates and gives the factor the backward applies to
// dS (the modifier's derivative).
//
// ScoreModIdentity: nothing; the kernels compile exactly as without a policy.
// ScoreModSoftcap (Gemma-style tanh capping, s -> softcap * tanh(scale * s / softcap)):
//   forward:  S <- t = tanh(S * pre_scale) with pre_scale = softmax_scale / softcap;
//             the softmax then runs with scale_log2 = softcap * log2(e) and the
//             LSE with softcap as its scale, so P, O and the LSE are those of
//             the capped scores (score_mod_scales on the host sets all three).
//   backward: S^T is capped the same way before the mask and P, and grad()
//             keeps 1 - t^2 = d(capped)/d(raw) / softmax_scale per score, packed
//             to fp16 (in [0, 1]: absolute error <= 2^-12; half the registers of
//             an fp32 copy, which spilled at d = 128). dS^T is multiplied by it;
//             softmax_scale stays where it always is, on dQ and dK.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

#include "common/cute_utils.h"
#include "common/score_mod_kind.h"

namespace flash3 {

struct ScoreModIdentity {
  static constexpr bool kEnabled = false;
  static constexpr ScoreModKind kKind = ScoreModKind::kIdentity;
};

struct ScoreModSoftcap {
  static constexpr bool kEnabled = true;
  static constexpr ScoreModKind kKind = ScoreModKind::kSoftcap;

  // S (any shape) -> tanh(S * pre_scale), in place. tanh.approx (MUFU.TANH,
  // relative error ~2^-11): the forward and the backward recompute the same
  // values, so P stays consistent with the stored LSE.
  template <class TensorS>
  CUTLASS_DEVICE static void apply(TensorS& s, float pre_scale) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(s); ++i) s(i) = cutlass::fast_tanh(s(i) * pre_scale);
  }

  // t (capped scores, any fragment) -> 1 - t^2 as an fp16 fragment of the same layout.
  template <class TensorT>
  CUTLASS_DEVICE static auto grad(TensorT const& t) {
    cute::Tensor g = cute::make_tensor<float>(t.layout());
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(t); ++i) g(i) = 1.f - t(i) * t(i);
    return convert_fragment<cutlass::half_t>(g);
  }
};

// The three scales a launch derives from (softmax_scale, softcap): the
// multiplier before the modifier, the softmax's log2 scale and the LSE's
// natural scale. Identity: (unused, softmax_scale_log2, softmax_scale).
struct ScoreModScales {
  float pre_scale = 1.f, scale_log2 = 0.f, lse_scale = 0.f;
};
inline ScoreModScales score_mod_scales(float softmax_scale, float softmax_scale_log2, float softcap) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (!(softcap > 0.f)) return {1.f, softmax_scale_log2, softmax_scale};
  return {softmax_scale / softcap, softcap * kLog2e, softcap};
}

}  // namespace flash3
