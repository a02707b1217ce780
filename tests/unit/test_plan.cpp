// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// One plan per call (src/plan/): forward_plan() (get_scheduler_metadata in
// Python) decides what the KV-cache launch then runs, the size queries return
// the bytes of the plans the launches carve (forward and backward), and the
// workspace layouts keep their arrays apart and aligned. Over a matrix of shapes and requests; with
// the kernels of this build (no packgqa unit: nothing packs or splits, which
// the comparisons cover as well). Host pointers, device checks off: nothing
// is launched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "api/validate.h"
#include "flash3/flash3.h"
#include "launch/dispatch.h"
#include "plan/bwd_plan.h"
#include "plan/fwd_plan.h"
#include "plan/kvcache_plan.h"
#include "plan/lower.h"
#include "skip_device_check.h"

namespace {

using flash3::DType;
using flash3::TensorView;

void* fake(uintptr_t addr) { return reinterpret_cast<void*>(addr); }

TensorView t4(uintptr_t p, DType dt, int64_t a, int64_t b, int64_t c, int64_t d) {
  return TensorView::make4d(fake(p), dt, a, b, c, d, b * c * d, c * d, d, 1);
}

struct Shape {
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
};

// Contiguous cache of capacity seqlen_k, one entry per sequence; no append.
flash3::KVCacheArgs kvcache_args(DType dt, const Shape& s, const flash3::AttentionOptions& o) {
  flash3::KVCacheArgs a;
  a.q = t4(0x10000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  a.k_cache = t4(0x100000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  a.v_cache = t4(0x200000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  a.out = t4(0x300000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  a.cache_seqlens = reinterpret_cast<const int*>(0x400000000);
  a.opts = o;
  return a;
}

std::string describe(const Shape& s, const flash3::AttentionOptions& o) {
  return "b " + std::to_string(s.batch) + " sq " + std::to_string(s.seqlen_q) + " sk " + std::to_string(s.seqlen_k) +
         " h " + std::to_string(s.heads_q) + "/" + std::to_string(s.heads_kv) + " d " + std::to_string(s.head_dim) +
         " pack_gqa " + std::to_string(o.pack_gqa) + " num_splits " + std::to_string(o.num_splits) +
         (o.causal ? " causal" : "");
}

const Shape kShapes[] = {
    {1, 1, 4096, 32, 4, 128}, {3, 1, 100, 8, 8, 128}, {64, 1, 8192, 64, 8, 128}, {2, 4, 300, 8, 2, 64},
    {4, 130, 1000, 16, 2, 128}, {1, 1, 1, 8, 1, 64},  {8, 7, 65536, 8, 1, 128},  {2, 1, 16384, 4, 4, 256},
};

class Plan : public flash3::testutil::SkipDeviceCheckTest {};

// forward_plan() for (batch, max_seqlen_q, max_seqlen_k) decides what a
// KV-cache call of those shapes launches: the same pack and split, and
// kvcache_workspace_size() is that launch plan's workspace.
TEST_F(Plan, ForwardPlanIsWhatTheKVCacheLaunchRuns) {
  int compared = 0;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (const Shape& s : kShapes)
      for (int pack : {-1, 0, 1})
        for (int splits : {0, 1, 3, 256})
          for (bool causal : {false, true}) {
            flash3::AttentionOptions o;
            o.pack_gqa = pack;
            o.num_splits = splits;
            o.causal = causal;
            const std::string what = describe(s, o);
            flash3::ForwardPlan fp;
            ASSERT_TRUE(flash3::forward_plan(dt, s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim,
                                             s.head_dim, o, &fp)
                            .ok())
                << what;
            const flash3::KVCacheArgs a = kvcache_args(dt, s, o);
            ASSERT_TRUE(flash3::check_kvcache_structure(a).ok()) << what;
            const flash3::KVCachePlan plan = flash3::plan_kvcache(a);
            EXPECT_EQ(plan.attention.params.num_splits, fp.num_splits) << what;
            EXPECT_EQ(plan.attention.params.pack_gqa, fp.pack_gqa) << what;
            EXPECT_EQ(flash3::kvcache_workspace_size(a), plan.bytes) << what;
            // Passing the plan back (what get_scheduler_metadata's caller does) keeps it.
            flash3::AttentionOptions explicit_opts = o;
            explicit_opts.num_splits = fp.num_splits;
            explicit_opts.pack_gqa = fp.pack_gqa;
            const flash3::KVCachePlan again = flash3::plan_kvcache(kvcache_args(dt, s, explicit_opts));
            EXPECT_EQ(again.attention.params.num_splits, fp.num_splits) << what;
            EXPECT_EQ(again.attention.params.pack_gqa, fp.pack_gqa) << what;
            EXPECT_EQ(again.bytes, plan.bytes) << what;
            ++compared;
          }
  EXPECT_EQ(compared, 2 * 8 * 3 * 4 * 2);
}

// The split partials come after the other scratch, each array 256-byte
// aligned, and the whole workspace holds them.
void expect_layout_sound(const flash3::FwdPlan& plan, const std::string& what) {
  const flash3::FwdParams& p = plan.params;
  const flash3::FwdWorkspaceLayout& w = plan.workspace;
  EXPECT_TRUE(w.tile_counter_bytes == 0 || w.varlen_bytes == 0) << what;
  EXPECT_EQ(w.tile_counter_bytes > 0, plan.dynamic_causal) << what;
  EXPECT_EQ(plan.packed_unit, p.pack_gqa == 1 || p.num_splits > 1 || p.kv_direct) << what;
  if (p.num_splits <= 1) {
    EXPECT_EQ(w.split.bytes, 0u) << what;
    EXPECT_EQ(w.bytes, w.tile_counter_bytes + w.varlen_bytes) << what;
    return;
  }
  const size_t rows = size_t(p.varlen ? 1 : p.batch) * size_t(p.seqlen_q);
  const size_t row_heads = size_t(p.num_splits) * rows * size_t(p.heads_q);
  EXPECT_EQ(w.split.lse_offset % 256, 0u) << what;
  EXPECT_EQ(w.split.o_offset % 256, 0u) << what;
  EXPECT_GE(w.split.lse_offset, w.tile_counter_bytes + w.varlen_bytes) << what;
  EXPECT_GE(w.split.o_offset, w.split.lse_offset + row_heads * sizeof(float)) << what;
  EXPECT_EQ(w.bytes, w.split.o_offset + row_heads * size_t(p.head_dim_v) * sizeof(float)) << what;
}

// Fixed length: forward_workspace_size() is the launch plan's workspace (one
// launch at these batch sizes), and every plan's layout is sound.
TEST_F(Plan, ForwardWorkspaceIsTheLaunchPlans) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (const Shape& s : kShapes)
      for (int splits : {0, 1, 3})
        for (bool causal : {false, true}) {
          flash3::ForwardArgs a;
          a.q = t4(0x10000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
          a.k = t4(0x100000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
          a.v = t4(0x200000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
          a.out = t4(0x300000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
          a.opts.num_splits = splits;
          a.opts.causal = causal;
          const std::string what = describe(s, a.opts);
          ASSERT_TRUE(flash3::check_forward_structure(a).ok()) << what;
          const flash3::FwdPlan plan = flash3::plan_forward(flash3::make_fwd_params(a));
          EXPECT_EQ(flash3::forward_workspace_size(a), plan.workspace.bytes) << what;
          expect_layout_sound(plan, what);
        }
}

// The split heuristic reads the SM count the caller gives (the plan is a
// pure function of the problem and that count): decode on 132 SMs splits
// where a packed unit is built, and never more than the KV blocks.
TEST_F(Plan, SplitHeuristicUsesTheGivenSmCount) {
  flash3::KVCacheArgs a = kvcache_args(DType::kBFloat16, {1, 1, 65536, 32, 4, 128}, flash3::AttentionOptions{});
  a.opts.num_splits = 0;
  flash3::FwdParams p = flash3::make_kvcache_fwd_params(a);
  const int sms = 132;
  const flash3::FwdPlan plan = flash3::plan_forward(p, &sms);
  const bool built = flash3::fwd_pack_kernel_built(DType::kBFloat16, 128, 128);
  if (built) EXPECT_GT(plan.params.num_splits, 1);
  else EXPECT_EQ(plan.params.num_splits, 1);
  EXPECT_LE(plan.params.num_splits, (65536 + plan.tile.tile_n - 1) / plan.tile.tile_n);
  expect_layout_sound(plan, "decode 1 x 64k, 132 SMs");
  const int none = 0;
  EXPECT_EQ(flash3::plan_forward(p, &none).params.num_splits, 1) << "no SMs known: no split";
}

// The backward's layout: the arrays in order, 256-byte aligned, the split
// partials sized for the plan's pieces, the front padding only where masked.
void expect_bwd_layout_sound(const flash3::BwdPlan& plan, const std::string& what) {
  const flash3::BwdParams& p = plan.params;
  const flash3::BwdWorkspaceLayout& w = plan.layout;
  for (size_t off : {w.dpsum_offset, w.dq_accum_offset, w.sem_offset, w.split_partials_offset, w.split_count_offset})
    EXPECT_EQ(off % 256, 0u) << what;
  EXPECT_LT(w.lse_offset, w.dpsum_offset) << what;
  EXPECT_LT(w.dpsum_offset, w.dq_accum_offset) << what;
  EXPECT_LT(w.dq_accum_offset, w.sem_offset) << what;
  EXPECT_LE(w.sem_offset, w.split_partials_offset) << what;
  EXPECT_LE(w.split_partials_offset + size_t(plan.split.slots()) * plan.tile.tile_n * (p.head_dim + p.head_dim_v) * 4,
            w.split_count_offset)
      << what;
  EXPECT_EQ(plan.tile.tile_m * w.num_m_blocks, w.seqlen_q_pad) << what;
  if (!(p.is_causal || p.is_local)) EXPECT_EQ(plan.row_shift, 0) << what;
  if (p.varlen) {
    EXPECT_EQ(plan.split.pieces, 1) << what;
    EXPECT_GE(plan.workspace_bytes, plan.varlen_scratch_offset) << what;
  } else {
    EXPECT_EQ(plan.workspace_bytes, w.bytes) << what;
    EXPECT_EQ(plan.row_shift, (p.is_causal || p.is_local) ? w.seqlen_q_pad - p.seqlen_q : 0) << what;
  }
}

// backward_workspace_size() is the launch plan's workspace (one launch at
// these batch sizes); the plan's tile follows the short-sequence rule.
TEST_F(Plan, BackwardWorkspaceIsTheLaunchPlans) {
  for (const Shape& s : kShapes)
    for (bool causal : {false, true}) {
      const DType dt = DType::kBFloat16;
      flash3::BackwardArgs a;
      a.q = t4(0x10000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
      a.k = t4(0x100000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
      a.v = t4(0x200000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
      a.out = t4(0x300000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
      a.dout = t4(0x400000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
      a.dq = t4(0x500000000, dt, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
      a.dk = t4(0x600000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
      a.dv = t4(0x700000000, dt, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
      a.lse = TensorView::make4d(fake(0x800000000), DType::kFloat32, s.batch, s.heads_q, s.seqlen_q, 1,
                                 int64_t(s.heads_q) * s.seqlen_q, s.seqlen_q, 1, 1);
      a.lse.ndim = 3;
      a.opts.causal = causal;
      const std::string what = describe(s, a.opts);
      ASSERT_TRUE(flash3::check_backward_structure(a).ok()) << what;
      const flash3::BwdPlan plan = flash3::plan_backward(flash3::make_bwd_params(a));
      EXPECT_EQ(flash3::backward_workspace_size(a), plan.workspace_bytes) << what;
      EXPECT_EQ(plan.short_tile, flash3::bwd_short_tile(s.head_dim, s.seqlen_q)) << what;
      expect_bwd_layout_sound(plan, what);
    }
}

// With an SM count, an unmasked launch whose last wave is short splits it,
// and the split partials fit in the plan's workspace; masked launches never
// split. The plan is a pure function of the problem and the count.
TEST_F(Plan, BackwardSplitUsesTheGivenSmCount) {
  flash3::BwdParams p;
  p.dtype = DType::kBFloat16;
  p.batch = 2;
  p.seqlen_q = p.seqlen_k = 8192;
  p.heads_q = p.heads_kv = 16;
  p.head_dim = p.head_dim_v = 128;
  const int sms = 132;
  const flash3::BwdPlan plan = flash3::plan_backward(p, &sms);
  const int tiles = (8192 + plan.tile.tile_n - 1) / plan.tile.tile_n * 16 * 2;
  EXPECT_GE(plan.split.ctas(), tiles);
  // 2048 blocks on 132 SMs: 15.5 waves, the last one half empty (design.md).
  EXPECT_GT(plan.split.pieces, 1) << tiles << " blocks on " << sms << " SMs";
  expect_bwd_layout_sound(plan, "bwd 2 x 8k x 16 heads, 132 SMs");
  p.is_causal = true;
  const flash3::BwdPlan masked = flash3::plan_backward(p, &sms);
  EXPECT_EQ(masked.split.pieces, 1);
  expect_bwd_layout_sound(masked, "causal");
  const int none = 0;
  p.is_causal = false;
  EXPECT_EQ(flash3::plan_backward(p, &none).split.pieces, 1) << "no SMs known: no split";
}

}  // namespace
