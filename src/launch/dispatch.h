// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The host side of the runtime -> compile-time switch (implemented in dispatch.cu,
// the one file that maps (dtype, head_dim, head_dim_v, score modifier) onto the
// generated instantiations).
#pragma once
#include "common/params.h"
#include "plan/bwd_plan.h"
#include "plan/fwd_plan.h"

namespace flash3 {

// Whether the unit of (dtype, head_dim, head_dim_v) with score modifier `mod`
// is built (the manifest's feature axis).
bool fwd_kernel_built(DType dtype, int head_dim, int head_dim_v, ScoreModKind mod = ScoreModKind::kIdentity);
bool bwd_kernel_built(DType dtype, int head_dim, int head_dim_v, ScoreModKind mod = ScoreModKind::kIdentity);
// Whether the PackGQA forward unit of (dtype, head_dim, head_dim_v) is built.
bool fwd_pack_kernel_built(DType dtype, int head_dim, int head_dim_v);
// Launches the forward a plan describes (plan/fwd_plan.h: the unit, the mask
// variant and scheduler chosen from its fields); plan.params.workspace must
// hold plan.workspace.bytes where that is > 0.
Status launch_forward(const FwdPlan& plan, cudaStream_t stream);
// Launches preprocess, main kernel and postprocess a plan describes
// (plan/bwd_plan.h); plan.params.workspace must hold plan.workspace_bytes.
Status launch_backward(const BwdPlan& plan, cudaStream_t stream);

}  // namespace flash3
