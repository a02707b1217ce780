// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The backward's plan: one launch's problem (BwdParams) with the decisions its
// launch depends on (the tile config with its short-sequence variant, the
// unmasked last wave's split, the front padding of masked launches) and the
// workspace layout they imply. plan_backward() is the one place these are
// decided: backward() launches what it says, backward_workspace_size() returns
// its bytes, and the launcher (bwd_launch.cuh) carves the workspace at its
// offsets, refusing (kInternal) a plan whose tile its kernel does not have.
#pragma once
#include <cstddef>

#include "bwd/workspace.h"
#include "common/params.h"
#include "config/tile_size.h"

namespace flash3 {

struct BwdPlan {
  BwdParams params;
  BwdTileConfig tile{};      // bwd_tile_config of the mask and, for short sequences, the short tile
  bool short_tile = false;   // bwd_short_tile on the longest query sequence
  BwdSplitPlan split;        // fixed-length unmasked launches only (none without a device)
  BwdWorkspaceLayout layout; // varlen: the per-query-block arrays as one batch element of the query-tile bound
  int row_shift = 0;         // masked fixed-length launches: front padding (bwd_row_shift)
  // Varlen: the KV-tile bound the main kernel's grid spans and where the prep
  // kernel's scratch (tensor maps, sequences, tile maps) starts.
  int kv_tiles_bound = 0;
  size_t varlen_scratch_offset = 0;
  size_t workspace_bytes = 0;  // the whole workspace
};

// The plan of one launch. num_sms: the device's SM count for the split of the
// unmasked last wave; null reads the current device's (no device: no split).
BwdPlan plan_backward(const BwdParams& problem, const int* num_sms = nullptr);

// At least plan_backward(p).workspace_bytes for any seqlen_k / heads_kv and
// mask (the split plan's worst case), for callers that size scratch from q
// alone (p: batch, seqlen_q, heads_q, head_dims set).
size_t backward_workspace_bytes_bound(const BwdParams& p);

}  // namespace flash3
