// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The one host file that turns runtime options into compile-time variants.
// (dtype, head_dim, head_dim_v, score modifier) come from the manifest's
// kernel_table.inc; the mask variant (none / causal / local), varlen and the
// tile variant are chosen inside run_fwd / run_bwd.
#include "launch/dispatch.h"

#include <cstdint>

#include <cutlass/numeric_types.h>

#include "fusion/score_mod.h"

namespace flash3 {

template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_fwd(const FwdPlan& plan, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV, class ScoreMod>
Status run_bwd(const BwdPlan& plan, cudaStream_t stream);
template <class Element, int kHeadDim, int kHeadDimV>
Status run_fwd_packed(const FwdPlan& plan, cudaStream_t stream);

// One kernel_table.inc row per (pass, dtype, head_dim, head_dim_v, score
// modifier) unit; SM is the policy type (fusion/score_mod.h).
bool fwd_kernel_built(DType dtype, int head_dim, int head_dim_v, ScoreModKind mod) {
#define FLASH3_FWD(E, T, D, DV, SM) \
  if (dtype == DType::E && head_dim == D && head_dim_v == DV && mod == SM::kKind) return true;
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return false;
}

bool bwd_kernel_built(DType dtype, int head_dim, int head_dim_v, ScoreModKind mod) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM) \
  if (dtype == DType::E && head_dim == D && head_dim_v == DV && mod == SM::kKind) return true;
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return false;
}

bool fwd_pack_kernel_built(DType dtype, int head_dim, int head_dim_v) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV) \
  if (dtype == DType::E && head_dim == D && head_dim_v == DV) return true;
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return false;
}

static Status not_built(const char* pass, const FwdParams& p) {
  return Status::NotSupported(std::string(pass) + " kernel for dtype " + dtype_name(p.dtype) + ", head_dim " +
                              std::to_string(p.head_dim) + ", head_dim_v " + std::to_string(p.head_dim_v) +
                              ", score modifier " + score_mod_feature(score_mod_kind(p)) +
                              " is not built in this library");
}

// The plan (plan/fwd_plan.h) decided which unit runs: the packed one for
// PackGQA, split launches and gathered K/V; the unit of the score modifier
// otherwise.
Status launch_forward(const FwdPlan& plan, cudaStream_t stream) {
  const FwdParams& params = plan.params;
  if (plan.packed_unit) {
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)                                                     \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV) { \
    return run_fwd_packed<T, D, DV>(plan, stream);                                          \
  }
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
    return not_built(params.kv_direct ? "paged-KV (packgqa) forward" : "packgqa forward", params);
  }
  const ScoreModKind mod = score_mod_kind(params);
#define FLASH3_FWD(E, T, D, DV, SM)                                                                            \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV && mod == SM::kKind) { \
    return run_fwd<T, D, DV, SM>(plan, stream);                                                                \
  }
#define FLASH3_BWD(E, T, D, DV, SM)
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return not_built("forward", params);
}

Status launch_backward(const BwdPlan& plan, cudaStream_t stream) {
  const BwdParams& params = plan.params;
  const ScoreModKind mod = score_mod_kind(params);
#define FLASH3_FWD(E, T, D, DV, SM)
#define FLASH3_BWD(E, T, D, DV, SM)                                                                            \
  if (params.dtype == DType::E && params.head_dim == D && params.head_dim_v == DV && mod == SM::kKind) { \
    return run_bwd<T, D, DV, SM>(plan, stream);                                                                \
  }
#define FLASH3_FWD_PACKGQA(E, T, D, DV)
#include "kernel_table.inc"
#undef FLASH3_FWD
#undef FLASH3_BWD
#undef FLASH3_FWD_PACKGQA
  return not_built("backward", params);
}

}  // namespace flash3
