// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The forward's plan: one launch's problem (FwdParams, lowered from validated
// arguments or from shapes alone) with every decision the launch depends on
// resolved, and the layout of its workspace. plan_forward() is the one place
// these are decided: forward() / forward_kvcache() launch what it says,
// forward_workspace_size() / kvcache_workspace_size() return its bytes, and
// forward_plan() (get_scheduler_metadata in Python) returns its pack / split
// decisions. The launcher (fwd_launch.cuh) carves the workspace at the plan's
// offsets and refuses (kInternal) a plan its kernel's tile shape disagrees with,
// so a size query and a launch can never disagree silently.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/params.h"
#include "config/tile_size.h"
#include "plan/split_kv.h"

namespace flash3 {

// The fixed-length persistent causal kernels' claim counter (DynamicLptTileScheduler).
constexpr size_t kFwdTileCounterBytes = 256;

// The forward workspace (the caller's or allocated per call, 256-byte
// aligned), in this order:
//   [0, tile_counter_bytes)  the tile counter (fixed-length causal, persistent kernel), or
//   [0, varlen_bytes)        the varlen prep kernel's maps, sized for varlen_tiles query tiles;
//   split                    a split launch's fp32 partials after them (split.bytes = 0: no split).
struct FwdWorkspaceLayout {
  size_t tile_counter_bytes = 0;
  size_t varlen_bytes = 0;
  int64_t varlen_tiles = 0;
  FwdSplitLayout split;
  size_t bytes = 0;  // the whole workspace
};

struct FwdPlan {
  // The problem with the requests resolved: pack_gqa 1 / 0, num_splits >= 1,
  // and for KV caches kv_direct / kv_tile_map.
  FwdParams params;
  // The one-tile config of the packed and varlen kernels (the unpacked
  // fixed-length kernels add the short-causal / FP8 policies of
  // fwd_tile_config, chosen by fwd_launch.cuh from the same fields).
  FwdTileConfig tile{};
  int pack = 1;              // query heads per tile (g with PackGQA)
  bool packed_unit = false;  // the PackGQA unit runs: PackGQA, a split, or gathered K/V
  bool dynamic_causal = false;  // the persistent causal kernel with the tile counter
  FwdWorkspaceLayout workspace;
};

// The plan of one launch. num_sms: the device's SM count for the split
// heuristic (opts.num_splits = 0); null reads the current device's, only when
// the heuristic runs (no device: no split).
FwdPlan plan_forward(const FwdParams& problem, const int* num_sms = nullptr);

// The two request decisions plan_forward makes, named for the unit tests.
// PackGQA: problem.pack_gqa (1 on, 0 off, -1 heuristic) where a packed unit
// exists (GQA/MQA, no softcap).
bool fwd_pack_gqa(const FwdParams& problem);
// KV splits (1: none): problem.num_splits (1 none, 0 heuristic, n at most n)
// where a split-capable (packed) unit exists, else 1.
int fwd_num_splits(const FwdParams& problem, const int* num_sms = nullptr);

// The forward problem of q / k / v's shapes and the options alone (no
// pointers, no validation beyond what sizing needs), for `batch` elements of
// a fixed-length call (varlen: the whole call). False for shapes validation
// would reject; the size queries then return 0.
bool forward_shape_problem(const ForwardArgs& args, int64_t batch, FwdParams* problem);

}  // namespace flash3
