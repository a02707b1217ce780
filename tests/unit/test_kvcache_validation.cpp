// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests of forward_kvcache's host layer: check_kvcache_structure() (every
// bad argument rejected with a message naming it), the lowering to the varlen
// attention params and the append params, forward_plan(), and the C ABI's
// flash3_kvcache_args; the same for paged caches (page_table). Fake, aligned
// device addresses; nothing is launched.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "api/validate.h"
#include "flash3/flash3.h"
#include "flash3/flash3_c.h"
#include "plan/lower.h"
#include "status_matchers.h"

namespace {

using flash3::unittest::IsError;
using flash3::unittest::IsOk;

using flash3::DType;
using flash3::KVCacheArgs;
using flash3::Status;
using flash3::StatusCode;
using flash3::TensorView;

void* fake(uintptr_t addr) { return reinterpret_cast<void*>(addr); }
const int* fake_int(uintptr_t addr) { return reinterpret_cast<const int*>(addr); }

TensorView t4(uintptr_t p, int64_t a, int64_t b, int64_t c, int64_t d, DType dt = DType::kBFloat16) {
  return TensorView::make4d(fake(p), dt, a, b, c, d, b * c * d, c * d, d, 1);
}

// b 2, sq 3, hq 8, hkv 2, d 128; cache 4 x 256 rows; 5 new rows; rotary dim 64.
KVCacheArgs make_args() {
  KVCacheArgs a;
  a.q = t4(0x100000, 2, 3, 8, 128);
  a.k_cache = t4(0x1000000, 4, 256, 2, 128);
  a.v_cache = t4(0x2000000, 4, 256, 2, 128);
  a.k_new = t4(0x3000000, 2, 5, 2, 128);
  a.v_new = t4(0x3100000, 2, 5, 2, 128);
  const int64_t sh[2] = {256, 32};
  a.rotary_cos = TensorView::contiguous(fake(0x3200000), DType::kBFloat16, 2, sh);
  a.rotary_sin = TensorView::contiguous(fake(0x3300000), DType::kBFloat16, 2, sh);
  a.out = t4(0x4000000, 2, 3, 8, 128);
  a.lse = TensorView::make4d(fake(0x5000000), DType::kFloat32, 2, 8, 3, 1, 3, 6, 1, 1);  // (hq, b, sq) buffer
  a.lse.ndim = 3;
  a.cache_seqlens = fake_int(0x6000000);
  a.cache_batch_idx = fake_int(0x6000100);
  a.cache_leftpad = fake_int(0x6000200);
  return a;
}

TEST(KVCacheValidation, ValidArgsPass) { EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(make_args()))); }

// One rejection: an edit of valid args and the error it must give.
struct Rejection {
  const char* what;
  void (*edit)(KVCacheArgs&);
  StatusCode code;
  std::initializer_list<std::string> subs;
};

// Each edit of make()'s args fails the structure check with its code and message parts.
template <size_t N>
void expect_rejections(KVCacheArgs (*make)(), const Rejection (&cases)[N]) {
  for (const Rejection& c : cases) {
    KVCacheArgs a = make();
    c.edit(a);
    EXPECT_TRUE(IsError(flash3::check_kvcache_structure(a), c.code, c.subs)) << c.what;
  }
}

TEST(KVCacheValidation, Rejections) {
  const Rejection cases[] = {
      {"k_new without v_new", [](KVCacheArgs& a) { a.v_new = TensorView{}; }, StatusCode::kInvalidArgument,
       {"k_new is set but v_new is not"}},
      {"append without cache_seqlens", [](KVCacheArgs& a) { a.cache_seqlens = nullptr; }, StatusCode::kInvalidArgument,
       {"cache_seqlens"}},
      {"new rows past the cache", [](KVCacheArgs& a) {
         a.k_new.shape[1] = a.v_new.shape[1] = 300;
       }, StatusCode::kInvalidArgument, {"k_new.shape[1] (seqlen_new)", "too small"}},
      {"k_new batch", [](KVCacheArgs& a) { a.k_new.shape[0] = 3; }, StatusCode::kInvalidArgument, {"k_new.shape[0]"}},
      {"v_new head dim", [](KVCacheArgs& a) { a.v_new.shape[3] = 64; }, StatusCode::kInvalidArgument,
       {"v_new.shape[3] (head_dim_v)"}},
      {"rotary without append", [](KVCacheArgs& a) {
         a.k_new = a.v_new = TensorView{};
       }, StatusCode::kInvalidArgument, {"rotary_cos / rotary_sin are set but k_new is not"}},
      {"cos without sin", [](KVCacheArgs& a) { a.rotary_sin = TensorView{}; }, StatusCode::kInvalidArgument,
       {"rotary_cos is set but rotary_sin is not"}},
      {"rotary dim past head dim", [](KVCacheArgs& a) {
         a.rotary_cos.shape[1] = a.rotary_sin.shape[1] = 65;
         a.rotary_cos.stride[0] = a.rotary_sin.stride[0] = 65;
       }, StatusCode::kInvalidArgument, {"rotary_cos.shape[1] (rotary_dim / 2)"}},
      {"rotary table too short", [](KVCacheArgs& a) { a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 100; },
       StatusCode::kInvalidArgument, {"rotary_cos.shape[0] (seqlen_ro)", "seqlen_cache"}},
      {"rotary dtype", [](KVCacheArgs& a) { a.rotary_sin.dtype = DType::kFloat32; }, StatusCode::kInvalidArgument,
       {"rotary_sin.dtype"}},
      {"rotary_seqlens without tables", [](KVCacheArgs& a) {
         a.rotary_cos = a.rotary_sin = TensorView{};
         a.rotary_seqlens = fake_int(0x6000300);
       }, StatusCode::kInvalidArgument, {"rotary_seqlens"}},
      {"lse layout", [](KVCacheArgs& a) {
         a.lse = TensorView::make4d(fake(0x5000000), DType::kFloat32, 2, 8, 3, 1, 24, 3, 1, 1);
         a.lse.ndim = 3;
       }, StatusCode::kInvalidArgument, {"lse has strides", "num_heads_q, batch * seqlen_q"}},
      {"q rows not one stride apart", [](KVCacheArgs& a) { a.q.stride[0] = 4 * 8 * 128; },
       StatusCode::kInvalidArgument, {"q.stride[0] (batch)"}},
      {"cache rows not one stride apart", [](KVCacheArgs& a) { a.k_cache.stride[0] = 300 * 2 * 128; },
       StatusCode::kInvalidArgument, {"k_cache.stride[0] (batch_cache)"}},
      {"cache batch too small", [](KVCacheArgs& a) {
         a.cache_batch_idx = nullptr;
         a.k_cache.shape[0] = a.v_cache.shape[0] = 1;
       }, StatusCode::kInvalidArgument, {"k_cache.shape[0] (batch_cache)"}},
      {"v_cache rows", [](KVCacheArgs& a) { a.v_cache.shape[1] = 128; }, StatusCode::kInvalidArgument,
       {"v_cache.shape[1] (seqlen_cache)"}},
      {"heads", [](KVCacheArgs& a) { a.q.shape[2] = a.out.shape[2] = 7; }, StatusCode::kInvalidArgument,
       {"num_heads_q % num_heads_kv"}},
      {"dtype", [](KVCacheArgs& a) { a.k_cache.dtype = DType::kFloat16; }, StatusCode::kInvalidArgument,
       {"k_cache.dtype"}},
      {"out shape", [](KVCacheArgs& a) { a.out.shape[1] = 4; }, StatusCode::kInvalidArgument, {"out.shape[1]"}},
      {"unaligned cache_seqlens", [](KVCacheArgs& a) { a.cache_seqlens = fake_int(0x6000002); },
       StatusCode::kInvalidArgument, {"cache_seqlens", "4-byte aligned"}},
      {"cu_seqlens_k", [](KVCacheArgs& a) {
         a.opts.cu_seqlens_q = a.opts.cu_seqlens_k = fake_int(0x7000000);
         a.opts.max_seqlen_q = a.opts.max_seqlen_k = 3;
         a.opts.num_sequences = 2;
       }, StatusCode::kInvalidArgument, {"opts.cu_seqlens_k is set", "cu_seqlens_k_new"}},

      {"varlen q, negative max_seqlen_q", [](KVCacheArgs& a) {
         a.opts.cu_seqlens_q = fake_int(0x7000000);
         a.opts.max_seqlen_q = -1;
         a.opts.num_sequences = 2;
       }, StatusCode::kInvalidArgument, {"opts.max_seqlen_q is -1"}},
      {"num_sequences without cu_seqlens_q", [](KVCacheArgs& a) { a.opts.num_sequences = 2; },
       StatusCode::kInvalidArgument, {"opts.num_sequences", "cu_seqlens_q is null"}},
      {"cu_seqlens_k_new without new rows", [](KVCacheArgs& a) {
         a.k_new = a.v_new = TensorView{};
         a.rotary_cos = a.rotary_sin = TensorView{};
         a.cu_seqlens_k_new = fake_int(0x7000100);
       }, StatusCode::kInvalidArgument, {"cu_seqlens_k_new is set but k_new"}},

      {"seqused_k", [](KVCacheArgs& a) { a.opts.seqused_k = fake_int(0x7000000); }, StatusCode::kInvalidArgument,
       {"seqused_k", "cache_seqlens"}},
      {"num_splits", [](KVCacheArgs& a) { a.opts.num_splits = 300; }, StatusCode::kInvalidArgument,
       {"opts.num_splits"}},
      {"out aliases the cache", [](KVCacheArgs& a) { a.out.data = a.k_cache.data; }, StatusCode::kInvalidArgument,
       {"out", "overlaps"}},
      {"cache written while aliasing k_new", [](KVCacheArgs& a) { a.k_new.data = fake(0x1000000 + 256); },
       StatusCode::kInvalidArgument, {"k_cache", "overlaps"}},
  };
  expect_rejections(make_args, cases);
}

// The attention runs as varlen rows: q (b * sq, hq, d), cache rows (b_cache
// * s_cache), lse (hq, b * sq); the cache fields come through.
TEST(KVCacheValidation, Lowering) {
  const KVCacheArgs a = make_args();
  const flash3::FwdParams p = flash3::make_kvcache_fwd_params(a);
  EXPECT_TRUE(p.varlen);
  EXPECT_TRUE(p.kv_cache);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 6);
  EXPECT_EQ(p.seqlen_k, 4 * 256);
  EXPECT_EQ(p.max_seqlen_q, 3);
  EXPECT_EQ(p.max_seqlen_k, 256);
  EXPECT_EQ(p.kv_rows_per_batch, 256);
  EXPECT_EQ(p.seqlen_k_new, 5);
  EXPECT_EQ(p.q_row_stride, 8 * 128);
  EXPECT_EQ(p.k_row_stride, 2 * 128);
  EXPECT_EQ(p.lse_head_stride, 6);
  EXPECT_EQ(p.seqused_k, a.cache_seqlens);
  EXPECT_EQ(p.kv_batch_idx, a.cache_batch_idx);
  EXPECT_EQ(p.leftpad_k, a.cache_leftpad);
  const flash3::AppendKVParams ap = flash3::make_append_params(a);
  EXPECT_EQ(ap.seqlen_new, 5);
  EXPECT_EQ(ap.rotary_dim, 64);
  EXPECT_EQ(ap.seqlen_ro, 256);
  EXPECT_EQ(ap.cache_rows, 256);
  EXPECT_EQ(ap.cache_batches, 4);
  EXPECT_EQ(ap.kc_batch_stride, 256 * 2 * 128);
  EXPECT_FALSE(ap.q_positions_advance);
  KVCacheArgs causal = make_args();
  causal.opts.causal = true;
  EXPECT_TRUE(flash3::make_append_params(causal).q_positions_advance);
  // sq == 1: q's batch stride is its row stride, whatever the seqlen stride says.
  KVCacheArgs decode = make_args();
  decode.q = TensorView::make4d(fake(0x100000), DType::kBFloat16, 2, 1, 8, 128, 4096, 7, 128, 1);
  decode.out = t4(0x4000000, 2, 1, 8, 128);
  decode.lse = TensorView{};
  EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(decode)));
  EXPECT_EQ(flash3::make_kvcache_fwd_params(decode).q_row_stride, 4096);
}

TEST(KVCacheValidation, PlanRejectsBadShapes) {
  flash3::ForwardPlan plan;
  flash3::AttentionOptions o;
  EXPECT_TRUE(IsError(flash3::forward_plan(DType::kBFloat16, 2, 1, 100, 8, 3, 128, 128, o, &plan),
                      StatusCode::kInvalidArgument, {"heads_q"}));
  EXPECT_TRUE(IsError(flash3::forward_plan(DType::kFloat32, 2, 1, 100, 8, 2, 128, 128, o, &plan),
                      StatusCode::kInvalidArgument, {"dtype"}));
  o.num_splits = -1;
  EXPECT_TRUE(IsError(flash3::forward_plan(DType::kBFloat16, 2, 1, 100, 8, 2, 128, 128, o, &plan),
                      StatusCode::kInvalidArgument, {"opts.num_splits"}));
  // num_splits 1 never splits, whatever is built.
  o.num_splits = 1;
  ASSERT_TRUE(IsOk(flash3::forward_plan(DType::kBFloat16, 2, 1, 100, 8, 2, 128, 128, o, &plan)));
  EXPECT_EQ(plan.num_splits, 1);
}

TEST(KVCacheValidation, CAbiStructSize) {
  flash3_kvcache_args c = flash3_default_kvcache_args();
  EXPECT_EQ(c.struct_size, sizeof(flash3_kvcache_args));
  EXPECT_EQ(c.rotary_interleaved, 1);
  c.struct_size = 8;
  EXPECT_NE(flash3_forward_kvcache(&c, nullptr, nullptr, 0, nullptr), FLASH3_OK);
  EXPECT_NE(std::string(flash3_last_error()).find("struct_size"), std::string::npos);
  EXPECT_NE(flash3_forward_kvcache(nullptr, nullptr, nullptr, 0, nullptr), FLASH3_OK);
  EXPECT_EQ(flash3_kvcache_workspace_size(nullptr, nullptr), 0u);
}

// ---------------------------------------------------------------------------
// Paged caches (page_table).
// ---------------------------------------------------------------------------

// make_args() with a paged cache: pools of 10 pages of 64 rows, 4 pages per
// sequence (capacity 256, make_args' s_cache, so its 5 new rows and 256-row
// rotary tables fit), table rows 4 entries apart; no cache_batch_idx /
// cache_leftpad (PagedWithEntriesAndLeftpad adds them).
KVCacheArgs make_paged_args() {
  KVCacheArgs a = make_args();
  a.k_cache = t4(0x1000000, 10, 64, 2, 128);
  a.v_cache = t4(0x2000000, 10, 64, 2, 128);
  a.cache_batch_idx = nullptr;
  a.cache_leftpad = nullptr;
  a.page_table = fake_int(0x6000400);
  a.page_table_batch_stride = 4;
  a.page_table_max_pages = 4;
  return a;
}

// make_paged_args() with one sequence (b 1).
KVCacheArgs make_paged_args_b1() {
  KVCacheArgs a = make_paged_args();
  a.q = t4(0x100000, 1, 3, 8, 128);
  a.out = t4(0x4000000, 1, 3, 8, 128);
  a.k_new = t4(0x3000000, 1, 5, 2, 128);
  a.v_new = t4(0x3100000, 1, 5, 2, 128);
  a.lse = TensorView::make4d(fake(0x5000000), DType::kFloat32, 1, 8, 3, 1, 3, 3, 1, 1);
  a.lse.ndim = 3;
  return a;
}

TEST(KVCacheValidation, PagedValidArgsPass) {
  EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(make_paged_args())));
  struct Case {
    const char* what;
    void (*edit)(KVCacheArgs&);
  };
  const Case cases[] = {
      {"more new rows than a page holds (within the capacity)", [](KVCacheArgs& a) {
         a.k_new = t4(0x3000000, 2, 100, 2, 128);
         a.v_new = t4(0x3100000, 2, 100, 2, 128);
       }},
      {"new rows filling the capacity", [](KVCacheArgs& a) {
         a.k_new = t4(0x3000000, 2, 256, 2, 128);
         a.v_new = t4(0x3100000, 2, 256, 2, 128);
       }},
      {"fewer pages than sequences", [](KVCacheArgs& a) {
         a.k_cache.shape[0] = a.v_cache.shape[0] = 1;
       }},
      {"page size 3 (not a power of two), capacity 258", [](KVCacheArgs& a) {
         a.k_cache = t4(0x1000000, 200, 3, 2, 128);
         a.v_cache = t4(0x2000000, 200, 3, 2, 128);
         a.page_table_max_pages = 86;
         a.page_table_batch_stride = 86;
         a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 258;
       }},
      {"page size 1", [](KVCacheArgs& a) {
         a.k_cache = t4(0x1000000, 600, 1, 2, 128);
         a.v_cache = t4(0x2000000, 600, 1, 2, 128);
         a.page_table_max_pages = 256;
         a.page_table_batch_stride = 256;
       }},
      {"padded table rows", [](KVCacheArgs& a) { a.page_table_batch_stride = 7; }},
      {"rotary tables longer than the capacity", [](KVCacheArgs& a) {
         a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 1000;
       }},
      {"no append, no cache_seqlens (every sequence full)", [](KVCacheArgs& a) {
         a.k_new = a.v_new = a.rotary_cos = a.rotary_sin = TensorView{};
         a.cache_seqlens = nullptr;
       }},
      {"page_table_* ignored without page_table", [](KVCacheArgs& a) {
         a = make_args();
         a.page_table_max_pages = -1;
         a.page_table_batch_stride = -5;
       }},
  };
  for (const Case& c : cases) {
    KVCacheArgs a = make_paged_args();
    c.edit(a);
    EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(a))) << c.what;
  }
  // One sequence: the batch stride is never used.
  KVCacheArgs one = make_paged_args_b1();
  EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(one)));
  one.page_table_batch_stride = 0;
  EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(one))) << "b 1, page_table_batch_stride 0";
}

TEST(KVCacheValidation, PagedWithEntriesAndLeftpad) {
  // FlashAttention-3's paged cache with cache_batch_idx (the page table has a
  // row per cache entry: here 7, more than the 2 sequences) and cache_leftpad.
  KVCacheArgs a = make_paged_args();
  a.cache_batch_idx = fake_int(0x6000100);
  a.cache_leftpad = fake_int(0x6000200);
  a.page_table_rows = 7;
  if (!FLASH3_SERVING_WIP) {
    EXPECT_TRUE(IsError(flash3::check_kvcache_structure(a), StatusCode::kNotSupported,
                        {"page_table together with cache_batch_idx", "FLASH3_SERVING_WIP"}));
    a.cache_batch_idx = nullptr;
    a.page_table_rows = 0;
    EXPECT_TRUE(IsError(flash3::check_kvcache_structure(a), StatusCode::kNotSupported,
                        {"page_table together with cache_leftpad", "FLASH3_SERVING_WIP"}));
    return;
  }
  EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(a)));
  const flash3::FwdParams p = flash3::make_kvcache_fwd_params(a);
  EXPECT_EQ(p.kv_entries, 7);
  EXPECT_EQ(p.kv_batch_idx, a.cache_batch_idx);
  EXPECT_EQ(p.leftpad_k, a.cache_leftpad);
  const flash3::AppendKVParams ap = flash3::make_append_params(a);
  EXPECT_EQ(ap.cache_batches, 7);
  EXPECT_EQ(ap.cache_batch_idx, a.cache_batch_idx);
  a.page_table_rows = 1;  // one shared row, picked by cache_batch_idx
  EXPECT_TRUE(IsOk(flash3::check_kvcache_structure(a)));
}

TEST(KVCacheValidation, VarlenQueriesAndNewRows) {
  // q (total_q 7, hq 8, d 128) over 2 sequences, new rows (total_new 6, hkv 2, d 128).
  KVCacheArgs a = make_args();
  const int64_t qs[3] = {7, 8, 128}, ns[3] = {6, 2, 128}, ls[2] = {8, 7};
  a.q = TensorView::contiguous(fake(0x8000000), DType::kBFloat16, 3, qs);
  a.out = TensorView::contiguous(fake(0x8100000), DType::kBFloat16, 3, qs);
  a.lse = TensorView::contiguous(fake(0x8200000), DType::kFloat32, 2, ls);
  a.k_new = TensorView::contiguous(fake(0x8300000), DType::kBFloat16, 3, ns);
  a.v_new = TensorView::contiguous(fake(0x8400000), DType::kBFloat16, 3, ns);
  a.cu_seqlens_k_new = fake_int(0x7000100);
  a.opts.cu_seqlens_q = fake_int(0x7000000);
  a.opts.num_sequences = 2;
  a.opts.max_seqlen_q = 5;
  if (!FLASH3_SERVING_WIP) {
    EXPECT_TRUE(IsError(flash3::check_kvcache_structure(a), StatusCode::kNotSupported,
                        {"variable-length queries with a KV cache", "FLASH3_SERVING_WIP"}));
    return;
  }
  ASSERT_TRUE(IsOk(flash3::check_kvcache_structure(a)));
  EXPECT_TRUE(flash3::kvcache_has_queries(a));
  const flash3::FwdParams p = flash3::make_kvcache_fwd_params(a);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 7);
  EXPECT_EQ(p.max_seqlen_q, 5);
  EXPECT_EQ(p.cu_seqlens_q, a.opts.cu_seqlens_q);
  EXPECT_EQ(p.cu_seqlens_k_new, a.cu_seqlens_k_new);
  EXPECT_EQ(p.total_k_new, 6);
  EXPECT_EQ(p.seqlen_k_new, 0);
#if FLASH3_SERVING_WIP
  const flash3::AppendKVParams ap = flash3::make_append_params(a);
  EXPECT_EQ(ap.batch, 2);
  EXPECT_EQ(ap.cu_seqlens_new, a.cu_seqlens_k_new);
  EXPECT_EQ(ap.total_new, 6);
  EXPECT_EQ(ap.cu_seqlens_q, a.opts.cu_seqlens_q);
  EXPECT_EQ(ap.total_q, 7);
#endif
  a.opts.max_seqlen_q = 0;  // every sequence empty: only the append runs
  ASSERT_TRUE(IsOk(flash3::check_kvcache_structure(a)));
  EXPECT_FALSE(flash3::kvcache_has_queries(a));
  EXPECT_FALSE(flash3::kvcache_is_empty(a));
  a.lse.shape[1] = 6;
  EXPECT_TRUE(IsError(flash3::check_kvcache_structure(a), StatusCode::kInvalidArgument, {"lse.shape[1] (total_q)"}));
}

TEST(KVCacheValidation, VarlenLayoutRejections) {
  if (!FLASH3_SERVING_WIP) GTEST_SKIP() << "variable-length KV-cache calls need FLASH3_SERVING_WIP";
  const Rejection cases[] = {
      {"cu_seqlens_k_new with 4-d new rows", [](KVCacheArgs& a) { a.cu_seqlens_k_new = fake_int(0x7000100); },
       StatusCode::kInvalidArgument, {"k_new.ndim is 4; expected 3"}},
      {"varlen q with a 4-d q", [](KVCacheArgs& a) {
         a.opts.cu_seqlens_q = fake_int(0x7000000);
         a.opts.max_seqlen_q = 3;
         a.opts.num_sequences = 2;
       }, StatusCode::kInvalidArgument, {"q.ndim is 4; expected 3"}},
  };
  expect_rejections(make_args, cases);
}

TEST(KVCacheValidation, PagedRejections) {
  const Rejection cases[] = {
      {"page_table_rows negative", [](KVCacheArgs& a) { a.page_table_rows = -2; }, StatusCode::kInvalidArgument,
       {"page_table_rows is -2"}},
      {"fewer rows than sequences without cache_batch_idx", [](KVCacheArgs& a) { a.page_table_rows = 1; },
       StatusCode::kInvalidArgument, {"page_table_rows is 1", "cache_batch_idx"}},
      {"cache_batch_idx without page_table_rows", [](KVCacheArgs& a) { a.cache_batch_idx = fake_int(0x6000100); },
       StatusCode::kInvalidArgument, {"page_table_rows is 0 with cache_batch_idx", "page_table.shape[0]"}},
      {"with softcap", [](KVCacheArgs& a) { a.opts.softcap = 30.f; }, StatusCode::kNotSupported, {"softcap"}},
      {"max pages 0", [](KVCacheArgs& a) { a.page_table_max_pages = 0; }, StatusCode::kInvalidArgument,
       {"page_table_max_pages"}},
      {"max pages negative", [](KVCacheArgs& a) {
         a.page_table_max_pages = -3;
       }, StatusCode::kInvalidArgument, {"page_table_max_pages"}},
      {"table rows overlap", [](KVCacheArgs& a) { a.page_table_batch_stride = 3; }, StatusCode::kInvalidArgument,
       {"page_table_batch_stride"}},
      {"table rows at stride 0", [](KVCacheArgs& a) { a.page_table_batch_stride = 0; },
       StatusCode::kInvalidArgument, {"page_table_batch_stride"}},
      {"unaligned page_table", [](KVCacheArgs& a) { a.page_table = fake_int(0x6000402); },
       StatusCode::kInvalidArgument, {"page_table", "aligned"}},
      {"page size 0", [](KVCacheArgs& a) { a.k_cache.shape[1] = a.v_cache.shape[1] = 0; },
       StatusCode::kInvalidArgument, {"page_size"}},
      {"capacity past int32", [](KVCacheArgs& a) {
         // 2^25 pages of 64 rows: 2^31 rows. No rotary (its tables would be too short first).
         a.rotary_cos = a.rotary_sin = TensorView{};
         a.page_table_max_pages = 1 << 25;
         a.page_table_batch_stride = int64_t(1) << 25;
       }, StatusCode::kInvalidArgument, {"page_table_max_pages"}},
      {"new rows past the capacity", [](KVCacheArgs& a) {
         a.k_new = t4(0x3000000, 2, 257, 2, 128);
         a.v_new = t4(0x3100000, 2, 257, 2, 128);
       }, StatusCode::kInvalidArgument, {"seqlen_new"}},
      {"rotary tables one row short of the capacity", [](KVCacheArgs& a) {
         a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 255;
       }, StatusCode::kInvalidArgument, {"seqlen_ro"}},
      {"rotary tables of one page's rows", [](KVCacheArgs& a) {
         a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = 64;
       }, StatusCode::kInvalidArgument, {"seqlen_ro"}},
  };
  expect_rejections(make_paged_args, cases);
  // The pages checks hold for one sequence too, except the batch stride's.
  KVCacheArgs one = make_paged_args_b1();
  one.page_table_max_pages = 0;
  EXPECT_TRUE(IsError(flash3::check_kvcache_structure(one), StatusCode::kInvalidArgument, {"page_table_max_pages"}))
      << "b 1, max pages 0";
}

// The lowering carries the table, the page size and the capacity (in place
// of s_cache) to the attention and the append; contiguous calls get none.
TEST(KVCacheValidation, PagedLowering) {
  const KVCacheArgs a = make_paged_args();
  const flash3::FwdParams p = flash3::make_kvcache_fwd_params(a);
  EXPECT_TRUE(p.kv_cache);
  EXPECT_EQ(p.page_table, a.page_table);
  EXPECT_EQ(p.page_table_batch_stride, 4);
  EXPECT_EQ(p.page_size, 64);
  EXPECT_EQ(p.kv_rows_per_batch, 256);
  EXPECT_EQ(p.max_seqlen_k, 256);
  EXPECT_EQ(p.seqlen_k_new, 5);
  EXPECT_EQ(p.seqused_k, a.cache_seqlens);
  EXPECT_EQ(p.kv_batch_idx, nullptr);
  EXPECT_EQ(p.leftpad_k, nullptr);
  EXPECT_EQ(p.k_row_stride, 2 * 128);
  const flash3::AppendKVParams ap = flash3::make_append_params(a);
  EXPECT_EQ(ap.page_table, a.page_table);
  EXPECT_EQ(ap.page_table_batch_stride, 4);
  EXPECT_EQ(ap.page_size, 64);
  EXPECT_EQ(ap.cache_rows, 256);
  EXPECT_EQ(ap.kc_row_stride, 2 * 128);
  EXPECT_EQ(ap.seqlen_new, 5);
  EXPECT_EQ(ap.seqlen_ro, 256);
  EXPECT_EQ(ap.cache_batch_idx, nullptr);
  // Page size 3, 86 pages: capacity 258.
  KVCacheArgs odd = make_paged_args();
  odd.k_cache = t4(0x1000000, 200, 3, 2, 128);
  odd.v_cache = t4(0x2000000, 200, 3, 2, 128);
  odd.page_table_max_pages = odd.page_table_batch_stride = 86;
  EXPECT_EQ(flash3::make_kvcache_fwd_params(odd).kv_rows_per_batch, 258);
  EXPECT_EQ(flash3::make_kvcache_fwd_params(odd).page_size, 3);
  EXPECT_EQ(flash3::make_append_params(odd).cache_rows, 258);
  // Contiguous.
  const flash3::FwdParams c = flash3::make_kvcache_fwd_params(make_args());
  EXPECT_EQ(c.page_table, nullptr);
  EXPECT_EQ(c.page_size, 0);
  EXPECT_EQ(flash3::make_append_params(make_args()).page_table, nullptr);
}

// The C ABI: flash3_default_kvcache_args() has no page table; the paged
// fields reach validation; a struct_size of the layout before them (callers
// built against the older header) is accepted and reads no paged fields.
TEST(KVCacheValidation, CAbiPagedFields) {
  flash3_kvcache_args c = flash3_default_kvcache_args();
  EXPECT_EQ(c.page_table, nullptr);
  EXPECT_EQ(c.page_table_batch_stride, 0);
  EXPECT_EQ(c.page_table_max_pages, 0);
  const auto tensor = [](uintptr_t p, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    flash3_tensor t{};
    t.data = fake(p);
    t.dtype = FLASH3_BF16;
    t.ndim = 4;
    const int64_t sh[4] = {s0, s1, s2, s3};
    int64_t st = 1;
    for (int i = 3; i >= 0; --i) {
      t.shape[i] = sh[i];
      t.stride[i] = st;
      st *= sh[i];
    }
    return t;
  };
  // b 2, one pool page of 64 rows (fine paged; too few entries for a
  // contiguous cache), page_table unaligned.
  const flash3_tensor q = tensor(0x100000, 2, 3, 8, 128), kc = tensor(0x1000000, 1, 64, 2, 128),
                      vc = tensor(0x2000000, 1, 64, 2, 128), out = tensor(0x4000000, 2, 3, 8, 128);
  c.q = &q;
  c.k_cache = &kc;
  c.v_cache = &vc;
  c.out = &out;
  c.cache_seqlens = fake_int(0x6000000);
  c.page_table = fake_int(0x6000402);
  c.page_table_batch_stride = 4;
  c.page_table_max_pages = 4;
  EXPECT_NE(flash3_forward_kvcache(&c, nullptr, nullptr, 0, nullptr), FLASH3_OK);
  std::string msg = flash3_last_error();
  EXPECT_NE(msg.find("page_table"), std::string::npos) << msg;
  EXPECT_EQ(flash3_kvcache_workspace_size(&c, nullptr), 0u);
  // The older layout: no page table, so the single entry is too few for 2 sequences.
  c.struct_size = static_cast<uint32_t>(offsetof(flash3_kvcache_args, page_table));
  EXPECT_NE(flash3_forward_kvcache(&c, nullptr, nullptr, 0, nullptr), FLASH3_OK);
  msg = flash3_last_error();
  EXPECT_EQ(msg.find("struct_size"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("page_table"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch_cache"), std::string::npos) << msg;
}

}  // namespace
