// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The KV-cache call's plan (forward_kvcache): the append (+ rotary) launch,
// the attention launch's plan and the workspace both share. Built once per
// call from structurally valid arguments; kvcache_workspace_size() returns its
// bytes and forward_kvcache() launches it.
#pragma once
#include <cstddef>

#include "kvcache/append_kv.h"
#include "plan/fwd_plan.h"

namespace flash3 {

struct KVCachePlan {
  AppendKVParams append;  // q_out set by the launch when rotary is on (the rotated q's place below)
  FwdPlan attention;      // a varlen problem with FwdParams::kv_cache set; workspace set by the launch
  bool has_queries = false;  // false: the call only appends
  // The workspace: the attention's (FwdWorkspaceLayout, at 0), then the
  // rotated q (contiguous (b, sq, hq, d) or (total_q, hq, d)) when rotary is on.
  size_t q_rot_offset = 0;
  size_t bytes = 0;
};

// Only for arguments check_kvcache_structure() accepted and that are not empty.
KVCachePlan plan_kvcache(const KVCacheArgs& args);

}  // namespace flash3
