// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
#include "plan/kvcache_plan.h"

#include "plan/lower.h"

namespace flash3 {

KVCachePlan plan_kvcache(const KVCacheArgs& args) {
  auto align256 = [](size_t n) { return (n + 255) / 256 * 256; };
  KVCachePlan plan;
  plan.append = make_append_params(args);
  plan.attention = plan_forward(make_kvcache_fwd_params(args));
  plan.has_queries = kvcache_has_queries(args);
  plan.bytes = plan.attention.workspace.bytes;
  if (args.rotary_cos.defined() && args.q.numel() > 0) {
    plan.q_rot_offset = align256(plan.bytes);
    plan.bytes = plan.q_rot_offset + size_t(args.q.numel()) * size_t(dtype_size(args.q.dtype));
  }
  return plan;
}

}  // namespace flash3
