// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The host side of the runtime -> compile-time switch (implemented in dispatch.cu,
// the one file that maps (dtype, head_dim, head_dim_v, score modifier) onto the
// generated instantiations).
#pragma once
#include "bwd/workspace.h"
#include "common/params.h"
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
// Launches preprocess, main kernel and postprocess for validated params;
// params.workspace must hold backward_workspace_bytes(params).
Status launch_backward(const BwdParams& params, cudaStream_t stream);
size_t backward_workspace_bytes(const BwdParams& params);
// At least backward_workspace_bytes for any seqlen_k / heads_kv (the split
// plan's worst case), for callers that size scratch from q alone.
size_t backward_workspace_bytes_bound(const BwdParams& params);
// The backward's scratch layout for tiles of (tile_m, tile_n), including the
// unmasked launch's split plan (bwd_split_plan, on the current device's SM
// count; no split where the count cannot be read). The launcher and
// backward_workspace_bytes both come here, so they agree.
BwdWorkspaceLayout bwd_workspace_for(const BwdParams& params, int tile_m, int tile_n, BwdSplitPlan* split);

// Varlen backward scratch: the per-query-block arrays as one batch element of
// the query-tile bound's blocks (total_q / tile_m + sequences), then the prep
// kernel's scratch (tensor maps, sequences, tile maps) at scratch_offset.
struct BwdVarlenWorkspace {
  BwdWorkspaceLayout layout;
  int kv_tiles_bound = 0;
  size_t scratch_offset = 0, bytes = 0;
};
BwdVarlenWorkspace bwd_varlen_workspace(const BwdParams& params, int tile_m, int tile_n);
// The params of a varlen problem as one fixed-length batch element holding
// every row (batch stride = row stride), from which the launch's whole-tensor
// maps are built; the prep kernel derives each sequence's maps from them.
BwdParams bwd_varlen_as_one_batch(const BwdParams& params);
// The query length that picks the backward's tile config: seqlen_q, or for
// varlen the longest sequence (max_seqlen_q).
inline int bwd_tile_seqlen_q(const BwdParams& p) { return p.varlen ? p.max_seqlen_q : p.seqlen_q; }

}  // namespace flash3
