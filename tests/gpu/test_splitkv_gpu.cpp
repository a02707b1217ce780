// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU correctness tests of split-KV (AttentionOptions::num_splits, seed ch. 10:
// Flash-Decoding): the KV range [n_min, n_max) of each query tile is cut into
// at most num_splits pieces of ceil((n_max - n_min) / num_splits) blocks, each
// (tile, piece) CTA writes an fp32 partial O and LSE to the forward workspace
// and a combine kernel merges them into out / lse. Only speed may differ from
// the unsplit forward, so every result is judged like test_fwd_gpu.cpp's:
// against the fp32 GPU reference under the FlashAttention tolerance rule
// (flash3::ref::check_close)
//     max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// O and LSE separately (eps 1e-5 each), and a split result against the
// num_splits = 1 result of the same inputs within 2 * the larger baseline + eps
// (not bitwise: the pieces are summed in another order). Rows that see no key
// must be exactly out = 0, lse = -inf whatever the split.
//
// Splitting runs only in the packed units (PackGQA, with a pack factor of 1
// for MHA / pack_gqa = 0) and without softcap; elsewhere the unsplit kernel
// runs with the same results. Every call checks the launch's decision
// (fwd_num_splits, plan/fwd_plan.h): 1 for num_splits = 1 or without a
// split-capable unit (variants.txt's packgqa unit), min(n, KV blocks) for
// n > 1, and at most min(256, KV blocks) for the heuristic (0). So in a build
// without the packed units these tests still run and check the fallback.
//
// Suites:
//   SplitKv/SplitKvFwd      every head dim, bf16 all 24 problems, then fp16 every
//                           third: seqlen_q {1, 4, 128} x seqlen_k {1, 100, 1023,
//                           4096}, each pair under two of none / causal / local
//                           (100, 0), MHA 4:4, GQA 16:2, MQA 8:1, pack_gqa -1 / 0 / 1,
//                           each problem under num_splits 1, 0, 3 and 17
//   SplitKv/SplitKvVarlen   varlen batches of 4-8 sequences, lengths 0..1500 (0 and
//                           1 included; one decode batch of 0-4 queries per
//                           sequence), seqused_q / seqused_k, num_splits 1, 0, 5
//   SplitKvGpu.*            empty pieces, seqlen_k = 0, fully masked rows, the
//                           heuristic on decode shapes, the unsplit fallback,
//                           stores outside the problem, the workspace (size,
//                           caller-provided, too small), CUDA-graph capture,
//                           rejected values
// FLASH3_GPU_TESTS_QUICK=1 keeps a third of the fixed-length problems and half
// of the varlen batches.
//
// out and lse are poisoned (NaN) before every call; everything outside the
// views (padding, gaps after each batch element, the guard after each tensor,
// and for varlen the rows beyond seqused_q) must still hold the poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "fwd_case.h"
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "graph_capture.h"
#include "reference/reference.h"
#include "varlen_case.h"
#include "plan/lower.h"

// Internal: the launch's split decision on lowered params, the KV tile width
// it counts blocks in, and the clamp it applies.
#include "common/params.h"
#include "config/tile_size.h"
#include "launch/dispatch.h"
#include "plan/split_heuristic.h"

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

constexpr size_t kWsGuard = 4096;  // poisoned bytes after a caller workspace

// ---------------------------------------------------------------------------
// Device state shared by all tests of the process (buffers only grow).
// ---------------------------------------------------------------------------
struct DeviceState : VarlenDevice {
  tu::DeviceBuffer ws;  // caller workspaces
};

DeviceState& dev() { return device_state<DeviceState>(); }

// ---------------------------------------------------------------------------
// The decision the launch must take.
// ---------------------------------------------------------------------------
// KV blocks of the longest query tile, as the launch counts them (the tile
// width of the mask's config; varlen: of max_seqlen_k).
int kv_blocks(const flash3::FwdParams& p) {
  const flash3::FwdTileConfig cfg =
      flash3::fwd_tile_config(p.head_dim, p.head_dim_v, p.is_causal || p.is_local, p.is_local);
  const int sk = p.varlen ? p.max_seqlen_k : p.seqlen_k;
  return (sk + cfg.tile_n - 1) / cfg.tile_n;
}

// A split can run: the packed unit of (dtype, head dims) is listed in
// variants.txt and no softcap (whose units are unsplit).
bool split_capable(DType dt, int d, int dv, float softcap) { return softcap == 0.f && packgqa_built(dt, {d, dv}); }

// Checks fwd_num_splits() on the params of `a` against the contract (header);
// returns it.
int expect_split_decision(const flash3::ForwardArgs& a, const std::string& what) {
  const flash3::FwdParams p = flash3::make_fwd_params(a);
  const int got = flash3::fwd_num_splits(p);
  const int n = a.opts.num_splits, blocks = kv_blocks(p);
  std::ostringstream ctx;
  ctx << what << ": fwd_num_splits() with opts.num_splits = " << n << ", " << blocks << " KV blocks";
  if (n == 1 || !split_capable(a.q.dtype, p.head_dim, p.head_dim_v, a.opts.softcap)) {
    EXPECT_EQ(got, 1) << ctx.str() << " (no split requested, or no split-capable unit)";
  } else if (n > 1) {
    EXPECT_EQ(got, flash3::fwd_num_splits_clamp(n, blocks)) << ctx.str();
  } else {
    EXPECT_GE(got, 1) << ctx.str();
    EXPECT_LE(got, flash3::fwd_num_splits_clamp(flash3::kMaxSplits, blocks)) << ctx.str();
  }
  return got;
}

// A ForwardCall (fwd_case.h) that sets opts.num_splits = n (and a caller
// workspace where `ws` is given), checks the launch's split decision, then
// runs flash3::forward on the test stream; *splits (optional) receives the
// decision.
ForwardCall split_call(int n, std::string what, int* splits = nullptr, void* ws = nullptr, size_t ws_bytes = 0) {
  return [=](const flash3::ForwardArgs& args) {
    flash3::ForwardArgs a = args;
    a.opts.num_splits = n;
    a.workspace = ws;
    a.workspace_bytes = ws_bytes;
    const int got = expect_split_decision(a, what);
    if (splits != nullptr) *splits = got;
    return flash3::forward(a, dev().stream);
  };
}

// ===========================================================================
// Fixed length.
// ===========================================================================
// The whole out and lse allocations after a call (lse as bits).
struct Raw {
  std::vector<uint16_t> out;
  std::vector<uint32_t> lse;
};

::testing::AssertionResult download_fixed(const FwdPlan& p, Raw* r) {
  DeviceState& d = dev();
  r->out.assign(size_t(p.out_elems), 0);
  r->lse.assign(size_t(p.lse_elems), 0);
  cudaError_t e = cudaStreamSynchronize(d.stream);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(r->out.data(), d.out.ptr, r->out.size() * 2, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(r->lse.data(), d.lse.ptr, r->lse.size() * 4, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "download: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Poisons out / lse, runs the forward of c's uploaded inputs with num_splits
// n (through split_call), downloads the result.
::testing::AssertionResult run_split(const FwdCase& c, const FwdPlan& p, int n, Raw* raw, int* splits = nullptr,
                                     void* ws = nullptr, size_t ws_bytes = 0) {
  DeviceState& d = dev();
  const flash3::Status st =
      run_forward(d, c, p, d.out.ptr, d.lse.as<float>(), split_call(n, c.describe(), splits, ws, ws_bytes));
  if (!st.ok()) return ::testing::AssertionFailure() << "flash3::forward with num_splits " << n << ": " << st.message;
  return download_fixed(p, raw);
}

// Everything check_fwd_case (fwd_case.h) checks of one result
// (judge_fwd_result); and rows the reference finds fully masked (lse = -inf)
// exactly 0 in out.
void judge_fixed(const FwdCase& c, const FwdPlan& p, const RefOutputs& ref, const Raw& raw, FwdOutcome* outcome) {
  FwdOutcome got = judge_fwd_result(c, p, ref, raw.out, raw.lse, false);
  const std::vector<double>& o = got.o;
  const std::vector<double>& lse = got.lse;

  // Fully masked rows: exactly 0 (the combine must not turn 0 * NaN or
  // exp(-inf - -inf) into a NaN, or leave a partial's value).
  int64_t masked_rows = 0, bad_rows = 0;
  std::string first_bad;
  for (int64_t ib = 0; ib < c.batch; ++ib)
    for (int64_t ih = 0; ih < c.hq; ++ih)
      for (int64_t is = 0; is < c.sq; ++is) {
        const size_t li = size_t((ib * c.hq + ih) * c.sq + is);
        if (!(std::isinf(ref.lse[li]) && ref.lse[li] < 0)) continue;
        ++masked_rows;
        bool zero = std::isinf(lse[li]) && lse[li] < 0;
        const size_t o0 = size_t(((ib * c.sq + is) * c.hq + ih) * c.dv);
        for (int x = 0; x < c.dv; ++x) zero &= o[o0 + x] == 0.0;
        if (!zero && bad_rows++ == 0) first_bad = where_lse(c, li);
      }
  EXPECT_EQ(bad_rows, 0) << c.describe() << ": " << bad_rows << " of " << masked_rows
                         << " fully masked rows are not out = 0, lse = -inf (first " << first_bad << ")";
  if (outcome != nullptr) *outcome = std::move(got);
}

// judge_fixed of raw against the fp32 GPU reference of c's uploaded inputs.
void judge_against_reference(const FwdCase& c, const FwdPlan& p, const Raw& raw) {
  DeviceState& d = dev();
  RefOutputs ref;
  ASSERT_TRUE(run_gpu_reference(make_ref_args(c, p, d.in.ptr, nullptr, nullptr), d, &ref));
  judge_fixed(c, p, ref, raw, nullptr);
}

// x and y (two flash3 results of the same inputs) within `bound` of each other.
void expect_agree(const char* what, const std::vector<double>& x, const std::vector<double>& y, double bound,
                  const std::string& ctx) {
  ASSERT_EQ(x.size(), y.size());
  double err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) continue;
    const double e = std::fabs(x[i] - y[i]);
    err = std::max(err, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  }
  EXPECT_LE(err, bound) << ctx << ": " << what << " differs from num_splits = 1 by " << err << " (bound " << bound
                        << ")";
}

// One problem under each of `counts` (1 first): the inputs uploaded and the
// reference run once; each count judged on its own (judge_fixed) and, where
// it is not 1, against the num_splits = 1 result. Returns the largest split
// count the launch took.
int check_split_problem(const FwdCase& c, std::initializer_list<int> counts) {
  SCOPED_TRACE(c.describe());
  DeviceState& d = dev();
  FwdBuffers b;
  const ::testing::AssertionResult up = upload_fwd_inputs(d, c, &b);
  EXPECT_TRUE(up);
  if (!up) return 0;
  const FwdPlan& p = b.plan;
  RefOutputs ref;
  const ::testing::AssertionResult refd = run_gpu_reference(make_ref_args(c, p, d.in.ptr, nullptr, nullptr), d, &ref);
  EXPECT_TRUE(refd);
  if (!refd) return 0;
  FwdOutcome unsplit;
  bool have_unsplit = false;
  int most = 0;
  for (int n : counts) {
    SCOPED_TRACE("num_splits=" + std::to_string(n));
    Raw raw;
    int splits = 0;
    const ::testing::AssertionResult ran = run_split(c, p, n, &raw, &splits);
    EXPECT_TRUE(ran);
    if (!ran) return most;
    most = std::max(most, splits);
    FwdOutcome got;
    judge_fixed(c, p, ref, raw, &got);
    if (n == 1) {
      unsplit = std::move(got);
      have_unsplit = true;
    } else if (have_unsplit) {
      const std::string ctx =
          c.describe() + " num_splits=" + std::to_string(n) + " (ran " + std::to_string(splits) + ")";
      expect_agree("out", got.o, unsplit.o, 2 * std::max(got.o_base, unsplit.o_base) + kEpsO, ctx);
      expect_agree("lse", got.lse, unsplit.lse, 2 * std::max(got.lse_base, unsplit.lse_base) + kEpsLse, ctx);
    }
  }
  return most;
}

// ---------------------------------------------------------------------------
// The fixed-length problems.
// ---------------------------------------------------------------------------
struct SplitMask {
  const char* name;
  bool causal;
  int wl, wr;
};
constexpr SplitMask kSplitMasks[] = {
    {"nomask", false, -1, -1}, {"causal", true, -1, -1}, {"local100x0", false, 100, 0}};
constexpr Heads kSplitHeads[] = {{4, 4}, {16, 2}, {8, 1}};  // MHA, GQA 8:1, MQA
constexpr int kSplitSeqlensQ[] = {1, 4, 128};
constexpr int kSplitSeqlensK[] = {1, 100, 1023, 4096};
constexpr int kPackModes[] = {-1, 0, 1};

const char* pack_name(int pack) { return pack == 1 ? "_pack1" : (pack == 0 ? "_pack0" : "_packauto"); }

FwdCase make_problem(const char* prefix, DType dt, HeadDims h, const SplitMask& m, int sq, int sk, Heads heads,
                     int pack, int batch) {
  FwdCase c;
  c.dtype = dt, c.d = h.d, c.dv = h.dv;
  c.sq = sq, c.sk = sk, c.hq = heads.hq, c.hkv = heads.hkv, c.batch = batch;
  c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
  c.pack_gqa = pack;
  c.name = std::string(prefix) + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + m.name + "_sq" +
           std::to_string(sq) + "_sk" + std::to_string(sk) + "_" + heads_name(heads) + "_b" + std::to_string(batch) +
           pack_name(pack);
  c.seed = fnv1a(c.name);
  return c;
}

// The 24 problems of one (dtype, head dims), numbered k: seqlen pair i with
// masks i and i + 1 (mod 3); heads (i + k % 2 + i / 3) mod 3 and pack mode
// (k / 3 + i) mod 3, which give every (mask, heads), (heads, pack), (mask,
// pack) and (seqlen_q, heads) pair. Every fourth problem padded, every fifth
// with kGapRows rows of poison after each batch element's out / lse rows.
std::vector<FwdCase> all_split_problems(DType dt, HeadDims h) {
  std::vector<FwdCase> out;
  int i = 0;
  for (int sq : kSplitSeqlensQ)
    for (int sk : kSplitSeqlensK) {
      for (int t = 0; t < 2; ++t) {
        const int k = int(out.size());
        const SplitMask& m = kSplitMasks[(i + t) % 3];
        const Heads heads = kSplitHeads[(i + t + i / 3) % 3];
        const int pack = kPackModes[(k / 3 + i) % 3];
        const int batch = sq == 128 && sk == 4096 ? 1 : 1 + k % 2;
        FwdCase c = make_problem("splitkv_", dt, h, m, sq, sk, heads, pack, batch);
        if (k % 4 == 1) c.layout = Layout::kPadded;
        if (k % 5 == 2) c.gap_rows = kGapRows;
        out.push_back(c);
      }
      ++i;
    }
  return out;
}

// All 24 (quick: every third), or the second dtype's every third (quick:
// every ninth).
std::vector<FwdCase> split_problems(DType dt, HeadDims h, bool full) {
  const std::vector<FwdCase> all = all_split_problems(dt, h);
  const int mod = (full ? 1 : 3) * (quick_mode() ? 3 : 1);
  std::vector<FwdCase> out;
  for (size_t k = 0; k < all.size(); ++k)
    if (int(k) % mod == (full ? 0 : 1) % mod) out.push_back(all[k]);
  return out;
}

// Runs body(h, dt) for every head dim with a forward kernel, in the dtype
// pick_pack_dtype (gpu_case.h) picks, until a fatal failure.
template <class Body>
void for_each_head_dim(Body&& body) {
  for (const HeadDims& h : kAllHeadDims) {
    DType dt;
    if (!pick_pack_dtype(h, true, &dt)) continue;
    body(h, dt);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The end of a for_each_head_dim test that ran `ran` problems: the count as
// property `key` (none: nullptr), a skip where no forward kernel is built.
void finish_head_dims(int ran, const char* key) {
  if (::testing::Test::HasFatalFailure()) return;
  if (key != nullptr) ::testing::Test::RecordProperty(key, std::to_string(ran));
  if (ran == 0) GTEST_SKIP() << "not built: no forward kernel in this build";
}

int sm_count() {
  int dev_id = 0, sms = 0;
  if (cudaGetDevice(&dev_id) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id) != cudaSuccess) return 0;
  return sms;
}

// ===========================================================================
// The matrix: every head dim and dtype with a forward kernel (split or, where
// the packed unit is missing, the fallback).
// ===========================================================================
class SplitKvFwd : public ::testing::TestWithParam<HeadDims> {};

TEST_P(SplitKvFwd, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  int capable = 0, split_ran = 0;
  const int ran = run_per_dtype([&](DType dt) { return flash3::forward_is_built(dt, h.d, h.dv); },
                                [&](DType dt, bool full) { return split_problems(dt, h, full); },
                                [&](const FwdCase& c) {
                                  capable += split_capable(c.dtype, c.d, c.dv, c.softcap);
                                  split_ran += check_split_problem(c, {1, 0, 3, 17}) > 1;
                                });
  RecordProperty("problems", std::to_string(ran));
  RecordProperty("problems_split", std::to_string(split_ran));
  if (ran == 0 && !HasFatalFailure())
    GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(h) << " (FLASH3_HDIMS / FLASH3_DTYPES)";
  // Where a split-capable unit runs, the problems with more than one KV block
  // (those of 1023 and 4096 keys: half of them) must really have split.
  EXPECT_GE(split_ran, capable / 3) << "few of " << capable
                                    << " split-capable problems ran split: the suite would not test splitting";
}

INSTANTIATE_TEST_SUITE_P(SplitKv, SplitKvFwd, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Empty pieces: seqlen_k shorter than splits x tile_n, so that ceil(blocks /
// splits) x (splits - 1) >= blocks and the last pieces get no block; and
// masks whose per-tile KV ranges are much shorter than the longest (causal:
// the first tiles; a narrow local window: every tile), so most pieces of most
// tiles are empty.
// ===========================================================================
TEST(SplitKvGpu, EmptyPieces) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for_each_head_dim([&](const HeadDims& h, DType dt) {
    const int tn_none = flash3::fwd_tile_config(h.d, h.dv, false, false).tile_n;
    const int tn_local = flash3::fwd_tile_config(h.d, h.dv, true, true).tile_n;
    const SplitMask none = kSplitMasks[0], causal = kSplitMasks[1];
    const SplitMask narrow{"local37x5", false, 37, 5};
    // 5 blocks in 4 pieces (2, 2, 1, 0 blocks); 7 in 6 (2, 2, 2, 1, 0, 0).
    check_split_problem(make_problem("splitkv_empty_", dt, h, none, 3, 5 * tn_none - 3, {16, 2}, 1, 2), {1, 4, 17});
    check_split_problem(make_problem("splitkv_empty_", dt, h, none, 1, 7 * tn_none, {4, 4}, 0, 3), {1, 6, 5});
    check_split_problem(make_problem("splitkv_empty_", dt, h, causal, 700, 700, {8, 2}, 0, 1), {1, 17, 5});
    check_split_problem(make_problem("splitkv_empty_", dt, h, narrow, 300, 16 * tn_local, {8, 1}, -1, 1), {1, 8, 0});
    ran += 4;
  });
  finish_head_dims(ran, "problems");
}

// ===========================================================================
// seqlen_k = 0: out = 0 and lse = -inf everywhere, whatever the split (the
// launch clamps to one piece: there is no KV block), nothing outside written.
// ===========================================================================
TEST(SplitKvGpu, NoKeys) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for_each_head_dim([&](const HeadDims& h, DType dt) {
    for (int m : {0, 1}) {
      FwdCase c = make_problem("splitkv_nokeys_", dt, h, kSplitMasks[m], 70, 0, {8, 2}, m == 0 ? 1 : 0, 2);
      c.gap_rows = kGapRows;
      SCOPED_TRACE(c.describe());
      DeviceState& d = dev();
      FwdBuffers b;
      ASSERT_TRUE(upload_fwd_inputs(d, c, &b));
      RefOutputs none_visible;
      none_visible.o.assign(size_t(c.batch) * c.sq * c.hq * c.dv, 0.0);
      none_visible.low_o = none_visible.o;
      none_visible.lse.assign(size_t(c.batch) * c.hq * c.sq, -std::numeric_limits<double>::infinity());
      none_visible.low_lse = none_visible.lse;
      for (int n : {1, 0, 3, 17}) {
        SCOPED_TRACE("num_splits=" + std::to_string(n));
        Raw raw;
        int splits = 0;
        ASSERT_TRUE(run_split(c, b.plan, n, &raw, &splits));
        EXPECT_EQ(splits, 1) << "no KV block: nothing to split";
        // judge_fixed against out = 0, lse = -inf (a baseline of 0: exact),
        // which also looks for stores outside the views.
        judge_fixed(c, b.plan, none_visible, raw, nullptr);
      }
      ++ran;
    }
  });
  finish_head_dims(ran, nullptr);
}

// ===========================================================================
// Fully masked rows: a local window with seqlen_q > seqlen_k (bottom-right
// aligned: the first sq - sk rows see no key), and causal with sq > sk; GQA
// packed (masked and visible rows of different heads share tiles) and MHA.
// judge_fixed requires those rows to be exactly out = 0, lse = -inf.
// ===========================================================================
TEST(SplitKvGpu, FullyMaskedRows) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  const SplitMask local{"local100x0", false, 100, 0};
  const SplitMask local_wide{"local300x20", false, 300, 20};
  for_each_head_dim([&](const HeadDims& h, DType dt) {
    check_split_problem(make_problem("splitkv_masked_", dt, h, local, 300, 150, {16, 2}, 1, 2), {1, 0, 3, 17});
    check_split_problem(make_problem("splitkv_masked_", dt, h, kSplitMasks[1], 500, 130, {4, 4}, 0, 1), {1, 3, 17});
    check_split_problem(make_problem("splitkv_masked_", dt, h, local_wide, 1000, 900, {8, 1}, -1, 1), {1, 0, 5});
    ran += 3;
  });
  finish_head_dims(ran, "problems");
}

// ===========================================================================
// The heuristic (num_splits = 0) on decode shapes: few query tiles against
// the SMs and a long KV range, where it must split (split_heuristic.h) when a
// split-capable unit is built; results against the reference.
// ===========================================================================
TEST(SplitKvGpu, HeuristicSplitsDecode) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int sms = sm_count();
  int ran = 0;
  for_each_head_dim([&](const HeadDims& h, DType dt) {
    struct Decode {
      int batch, sk;
      Heads heads;
      int pack;
      int64_t tiles;  // unsplit query tiles: one per (tile head, batch element)
    };
    const Decode shapes[] = {{1, 8192, {16, 2}, 1, 2}, {2, 8192, {16, 2}, 0, 32}, {2, 4096, {4, 4}, -1, 8}};
    for (const Decode& s : shapes) {
      const FwdCase c = make_problem("splitkv_decode_", dt, h, kSplitMasks[0], 1, s.sk, s.heads, s.pack, s.batch);
      const int most = check_split_problem(c, {1, 0});
      if (HasFatalFailure()) return;
      ++ran;
      if (split_capable(dt, h.d, h.dv, 0.f) && double(s.tiles) < 0.8 * sms) {
        EXPECT_GT(most, 1) << c.describe() << ": the heuristic did not split " << s.tiles << " tiles on " << sms
                           << " SMs";
      }
    }
  });
  finish_head_dims(ran, "problems");
}

// ===========================================================================
// Where no split-capable unit runs (softcap; a dtype / head dim without the
// packed unit) num_splits > 1 and 0 run the unsplit kernel: decision 1 (checked
// on every call), results as without a split.
// ===========================================================================
TEST(SplitKvGpu, UnsplitFallback) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for (const HeadDims& h : kAllHeadDims)
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      if (!flash3::forward_is_built(dt, h.d, h.dv)) continue;
      if (softcap_built(dt, h, false)) {
        FwdCase c = make_problem("splitkv_softcap5_", dt, h, kSplitMasks[1], 4, 2000, {8, 2}, 1, 2);
        c.softcap = 5.f;
        check_split_problem(c, {1, 3, 17, 0});
        ++ran;
      }
      if (!packgqa_built(dt, h)) {
        check_split_problem(make_problem("splitkv_unit_not_built_", dt, h, kSplitMasks[0], 1, 3000, {8, 2}, -1, 2),
                            {1, 3, 17, 0});
        ++ran;
      }
      if (HasFatalFailure()) return;
    }
  RecordProperty("problems", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure())
    GTEST_SKIP() << "nothing to fall back from: no softcap unit, every packed unit built";
}

// ===========================================================================
// Variable length (varlen_case.h).
// ===========================================================================
// One varlen result: the poison outside the used rows (rows beyond seqused_q,
// padding, the gap rows after the tensor and after each head's lse rows, the
// guards), then each sequence against its reference; fully masked rows
// exactly out = 0, lse = -inf.
void judge_varlen(const VCase& c, const VPlan& p, const std::vector<RefOutputs>& refs, const Downloaded& h) {
  expect_only_used_rows_written(c, p, h);
  for (int s = 0; s < c.n(); ++s) {
    const int sq = c.eff_q(s);
    if (sq == 0) continue;
    const RefOutputs& ref = refs[size_t(s)];
    const std::string seq = sequence_desc(c, p, s);
    const std::vector<double> o = ours_o(c, p, h, s), l = ours_lse(c, p, h, s);
    expect_sequence_close(c, s, seq, o, l, ref);
    int64_t bad = 0;
    for (int hh = 0; hh < c.hq; ++hh)
      for (int i = 0; i < sq; ++i) {
        const size_t li = size_t(hh) * sq + i;
        if (!(std::isinf(ref.lse[li]) && ref.lse[li] < 0)) continue;
        bool zero = std::isinf(l[li]) && l[li] < 0;
        for (int x = 0; x < c.dv; ++x) zero &= o[(size_t(i) * c.hq + hh) * c.dv + x] == 0.0;
        bad += !zero;
      }
    EXPECT_EQ(bad, 0) << c.describe() << "\n  " << seq << ": " << bad
                      << " fully masked rows are not out = 0, lse = -inf";
  }
}

// One varlen case under each of `counts`: inputs and the per-sequence
// references once, then each count poisoned, run (decision checked) and judged.
void check_split_vcase(const VCase& c, std::initializer_list<int> counts) {
  SCOPED_TRACE(c.describe());
  DeviceState& d = dev();
  VBuffers b;
  ASSERT_TRUE(upload_varlen_inputs(d, c, &b));
  const VPlan& p = b.plan;
  std::vector<RefOutputs> refs(size_t(c.n()));
  for (int s = 0; s < c.n(); ++s)
    if (c.eff_q(s) > 0) {
      ASSERT_TRUE(sequence_reference(d, c, p, s, &refs[size_t(s)])) << "sequence " << s;
    }
  for (int n : counts) {
    SCOPED_TRACE("num_splits=" + std::to_string(n));
    const flash3::Status st = run_varlen(d, c, p, d.out.ptr, d.lse.as<float>(), split_call(n, c.describe()));
    ASSERT_TRUE(st.ok()) << c.describe() << ": flash3::forward with num_splits " << n << " failed: " << st.message;
    FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
    FLASH3_CUDA_OK(cudaGetLastError());
    Downloaded h;
    ASSERT_TRUE(download(d, p, d.out.ptr, d.lse.as<float>(), &h));
    judge_varlen(c, p, refs, h);
  }
}

constexpr int kVarlenMaxLen = 1500;

// Uniform in [0, 1500], with 0 and 1 a tenth of the time each.
int draw_len(Rng& g) { return draw_len_with_ends(g, kVarlenMaxLen); }

// The varlen cases of one (dtype, head dims): all five (quick: every other),
// or the second dtype's every other (quick: every fourth).
std::vector<VCase> split_varlen_cases(DType dt, HeadDims h, bool full) {
  const VSpec specs[] = {
      {"nomask_gqa16x2_b6", 6, {16, 2}, VMask::kNone, false, false, Layout::kContiguous,
       {{0, 300}, {1, 1500}, {3, 0}}, -1, 0},
      {"causal_seqused_mha4x4_b5", 5, {4, 4}, VMask::kCausal, true, true, Layout::kPadded,
       {{1, 1}, {200, 1400}}, 0, 0},
      {"local_seqused_q_mqa8x1_b4", 4, {8, 1}, VMask::kLocal, true, false, Layout::kContiguous,
       {{0, 0}, {5, 1000}}, 1, 37},
      {"causal_local_seqused_k_gqa8x2_b7", 7, {8, 2}, VMask::kCausalLocal, false, true, Layout::kPadded,
       {{1, 1500}, {64, 64}, {900, 20}}, -1, 0},
      // Decode: every length forced (0-4 queries), so the heuristic splits.
      {"decode_seqused_k_gqa16x2_b8", 8, {16, 2}, VMask::kNone, false, true, Layout::kContiguous,
       {{1, 1500}, {1, 700}, {0, 300}, {4, 1200}, {2, 0}, {1, 1}, {3, 999}, {1, 64}}, -1, 0},
  };
  std::vector<VCase> out;
  const int n_specs = int(sizeof(specs) / sizeof(specs[0]));
  for (int i = 0; i < n_specs; ++i) {
    const int mod = (full ? 1 : 2) * (quick_mode() ? 2 : 1);
    if (i % mod != 0) continue;
    out.push_back(spec_vcase(specs[i], "splitkv_varlen_", dt, h, draw_len));
  }
  return out;
}

class SplitKvVarlen : public ::testing::TestWithParam<HeadDims> {};

TEST_P(SplitKvVarlen, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return flash3::forward_is_built(dt, h.d, h.dv); },
                                [&](DType dt, bool full) { return split_varlen_cases(dt, h, full); },
                                [](const VCase& c) { check_split_vcase(c, {1, 0, 5}); });
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure())
    GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(h) << " (FLASH3_HDIMS / FLASH3_DTYPES)";
}

INSTANTIATE_TEST_SUITE_P(SplitKv, SplitKvVarlen, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Stores outside the problem: a split CTA of a tile past the last query row
// (or a piece with no block) must store nothing, and the combine must write
// only real rows. Each batch element's out and lse rows are followed by
// kGapRows rows of poison, out padded; for varlen, rows beyond seqused_q and
// the rows after the tensor keep their poison.
// ===========================================================================
TEST(SplitKvGpu, NoStoresOutsideTheProblem) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for_each_head_dim([&](const HeadDims& h, DType dt) {
    struct Shape {
      int b, sq, sk;
      Heads heads;
      int mask, pack;
    };
    // Packed rows 15, 272 (17 x 16), 100 and 1600 (200 x 8): no multiple of a tile height.
    const Shape shapes[] = {{2, 3, 2000, {10, 2}, 0, 1},
                            {3, 17, 1023, {32, 2}, 1, 1},
                            {2, 100, 777, {4, 4}, 2, 0},
                            {1, 200, 3000, {8, 1}, 0, -1}};
    for (const Shape& s : shapes) {
      FwdCase c = make_problem("splitkv_stores_", dt, h, kSplitMasks[s.mask], s.sq, s.sk, s.heads, s.pack, s.b);
      c.layout = Layout::kPadded;
      c.gap_rows = kGapRows;
      check_split_problem(c, {1, 3, 17, 0});
      if (HasFatalFailure()) return;
      ++ran;
    }
    check_split_vcase(stores_vcase("splitkv_stores_varlen_", dt, h, {900, 64, 1290, 7, 2500}, Layout::kPadded),
                      {1, 5, 17, 0});
    ++ran;
  });
  finish_head_dims(ran, "cases");
}

// ===========================================================================
// Workspace.
// ===========================================================================
// The decode shape of the workspace tests: batch 2, one query, 4096 keys,
// GQA 16:2, no mask (so num_splits = 1 needs no workspace at all).
FwdCase workspace_case(DType dt, HeadDims h) {
  return make_problem("splitkv_ws_", dt, h, kSplitMasks[0], 1, 4096, {16, 2}, -1, 2);
}

// c's inputs uploaded (into *b) and its arguments with opts.num_splits = n
// (outputs d.out / d.lse, no workspace); *need: their forward_workspace_size().
::testing::AssertionResult upload_split_args(const FwdCase& c, int n, FwdBuffers* b, flash3::ForwardArgs* a,
                                             size_t* need) {
  DeviceState& d = dev();
  const ::testing::AssertionResult up = upload_fwd_inputs(d, c, b);
  if (!up) return up;
  *a = make_args(c, b->plan, d.in.ptr, d.out.ptr, d.lse.as<float>());
  a->opts.num_splits = n;
  *need = flash3::forward_workspace_size(*a);
  return up;
}

// The varlen decode batch of the workspace tests.
VCase workspace_vcase(DType dt, HeadDims h) {
  VCase v;
  v.dtype = dt, v.d = h.d, v.dv = h.dv, v.hq = 16, v.hkv = 2;
  v.len_q = {1, 2, 0, 1};
  v.len_k = {3000, 700, 100, 4000};
  v.name = std::string("splitkv_ws_varlen_") + tu::short_dtype(dt) + "_" + head_dims_name(h);
  v.seed = fnv1a(v.name);
  return v;
}

// forward_workspace_size() grows by the partials: splits x rows x heads_q x
// (head_dim_v + 1) fp32, each array 256-byte aligned (so at most 2 x 255
// bytes more), where a split runs; unchanged elsewhere.
TEST(SplitKvGpu, WorkspaceGrowsByThePartials) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  DeviceState& d = dev();
  for_each_head_dim([&](const HeadDims& h, DType dt) {
    SCOPED_TRACE(std::string(tu::short_dtype(dt)) + " " + head_dims_name(h));
    const bool capable = split_capable(dt, h.d, h.dv, 0.f);
    auto expect_growth = [&](flash3::ForwardArgs a, int64_t rows, const char* what) {
      a.opts.num_splits = 1;
      const size_t one = flash3::forward_workspace_size(a);
      a.opts.num_splits = 5;
      const size_t five = flash3::forward_workspace_size(a);
      const int splits = flash3::fwd_num_splits(flash3::make_fwd_params(a));
      RecordProperty(std::string(what) + "_" + head_dims_name(h), std::to_string(one) + " -> " + std::to_string(five));
      if (!capable) {
        EXPECT_EQ(splits, 1) << what;
        EXPECT_EQ(five, one) << what << ": no split runs, the workspace must not grow";
        return;
      }
      ASSERT_EQ(splits, 5) << what << ": the decode shape has enough KV blocks for 5 pieces";
      const size_t partials = size_t(5) * size_t(rows) * 16 * size_t(h.dv + 1) * 4;
      EXPECT_GT(five, one) << what;
      EXPECT_GE(five - one, partials) << what << ": less than the partials (5 x " << rows << " rows x 16 heads x "
                                      << h.dv + 1 << " floats)";
      EXPECT_LT(five - one, partials + 512) << what << ": more than the partials and their alignment";
    };
    const FwdCase c = workspace_case(dt, h);
    const FwdPlan p = make_plan(c);
    ASSERT_TRUE(reserve_all(
        {{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2}, {&d.lse, size_t(p.lse_elems) * 4}}));
    const flash3::ForwardArgs a = make_args(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>());
    EXPECT_EQ(flash3::forward_workspace_size(a), 0u) << "an unsplit, unmasked fixed-length forward needs none";
    expect_growth(a, int64_t(c.batch) * c.sq, "fixed");
    const VCase v = workspace_vcase(dt, h);
    const VPlan vp = make_vplan(v);
    ASSERT_TRUE(reserve_all({{&d.in, size_t(vp.in_elems) * 2}, {&d.out, size_t(vp.out_elems) * 2},
                             {&d.lse, size_t(vp.lse_elems) * 4}, {&d.meta, size_t(vp.meta_ints) * 4}}));
    expect_growth(make_args(v, vp, d.in.ptr, d.out.ptr, d.lse.as<float>(), d.meta.ptr), v.total_q(), "varlen");
    ++ran;
  });
  finish_head_dims(ran, nullptr);
}

// A split forward in a caller workspace of exactly forward_workspace_size()
// bytes (0xff garbage, a poisoned guard after it), twice: out and lse bitwise
// equal to the run where flash3 allocates, nothing past the workspace
// written. One byte less is kInvalidArgument naming "workspace", with out /
// lse untouched. Fixed length (num_splits 5 and 0) and varlen (5).
TEST(SplitKvGpu, CallerWorkspace) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DeviceState& d = dev();
  int ran = 0;
  for (const HeadDims& h : kAllHeadDims) {
    DType dt;
    if (!pick_pack_dtype(h, true, &dt)) continue;
    auto guard_written = [&](size_t need) {
      int64_t n = -1;
      EXPECT_EQ(cudaStreamSynchronize(d.stream), cudaSuccess);
      EXPECT_EQ(count_bytes_not(d.ws.as<char>() + need, kWsGuard, 0xff, &n), cudaSuccess);
      return n;
    };
    // a with a workspace one byte short of `need`: kInvalidArgument naming
    // "workspace", out / lse (poisoned before) untouched.
    auto expect_rejected = [&](flash3::ForwardArgs a, size_t need, size_t out_bytes, size_t lse_bytes) {
      a.workspace = d.ws.ptr;
      a.workspace_bytes = need - 1;
      const flash3::Status st = flash3::forward(a, d.stream);
      EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << st.message;
      EXPECT_NE(st.message.find("workspace"), std::string::npos) << st.message;
      int64_t wrote_out = -1, wrote_lse = -1;
      EXPECT_EQ(cudaStreamSynchronize(d.stream), cudaSuccess);
      EXPECT_EQ(count_bytes_not(d.out.ptr, out_bytes, 0xff, &wrote_out), cudaSuccess);
      EXPECT_EQ(count_bytes_not(d.lse.ptr, lse_bytes, 0xff, &wrote_lse), cudaSuccess);
      EXPECT_TRUE(wrote_out == 0 && wrote_lse == 0) << "a rejected call wrote out / lse";
    };
    // Fixed length.
    for (int n : {5, 0}) {
      const FwdCase c = workspace_case(dt, h);
      SCOPED_TRACE(c.describe() + " num_splits=" + std::to_string(n));
      FwdBuffers b;
      flash3::ForwardArgs a;
      size_t need = 0;
      ASSERT_TRUE(upload_split_args(c, n, &b, &a, &need));
      const FwdPlan& p = b.plan;
      if (split_capable(dt, h.d, h.dv, 0.f) && n == 5) {
        EXPECT_GT(need, 0u) << "a split needs its partials";
      }
      Raw internal;
      ASSERT_TRUE(run_split(c, p, n, &internal));
      judge_against_reference(c, p, internal);
      if (HasFatalFailure()) return;
      ASSERT_TRUE(d.ws.reserve(need + kWsGuard) == cudaSuccess);
      FLASH3_CUDA_OK(cudaMemsetAsync(d.ws.ptr, 0xff, need + kWsGuard, d.stream));
      for (const char* run : {"first run", "second run (the first run's workspace contents)"}) {
        SCOPED_TRACE(run);
        Raw got;
        ASSERT_TRUE(run_split(c, p, n, &got, nullptr, need > 0 ? d.ws.ptr : nullptr, need));
        EXPECT_TRUE(got.out == internal.out) << "out differs bitwise from the run in flash3's own workspace";
        EXPECT_TRUE(got.lse == internal.lse) << "lse differs bitwise from the run in flash3's own workspace";
        EXPECT_EQ(guard_written(need), 0) << "written past the end of a " << need << "-byte workspace";
      }
      if (need > 0) {
        SCOPED_TRACE("one byte too small");
        FLASH3_CUDA_OK(cudaMemsetAsync(d.out.ptr, 0xff, size_t(p.out_elems) * 2, d.stream));
        FLASH3_CUDA_OK(cudaMemsetAsync(d.lse.ptr, 0xff, size_t(p.lse_elems) * 4, d.stream));
        expect_rejected(a, need, size_t(p.out_elems) * 2, size_t(p.lse_elems) * 4);
        EXPECT_EQ(guard_written(need), 0) << "a rejected call wrote past the workspace";
        FLASH3_CUDA_OK(cudaGetLastError());
      }
    }
    // Varlen.
    {
      const VCase v = workspace_vcase(dt, h);
      SCOPED_TRACE(v.describe() + " num_splits=5");
      VBuffers b;
      ASSERT_TRUE(upload_varlen_inputs(d, v, &b));
      const VPlan& p = b.plan;
      flash3::ForwardArgs a = make_args(v, p, d.in.ptr, d.out.ptr, d.lse.as<float>(), d.meta.ptr);
      a.opts.num_splits = 5;
      const size_t need = flash3::forward_workspace_size(a);
      ASSERT_GT(need, 0u) << "a varlen forward needs its per-sequence maps";
      Downloaded internal;
      ASSERT_TRUE(run_varlen(d, v, p, d.out.ptr, d.lse.as<float>(), split_call(5, v.describe())).ok());
      ASSERT_TRUE(download(d, p, d.out.ptr, d.lse.as<float>(), &internal));
      std::vector<RefOutputs> refs(size_t(v.n()));
      for (int s = 0; s < v.n(); ++s)
        if (v.eff_q(s) > 0) {
          ASSERT_TRUE(sequence_reference(d, v, p, s, &refs[size_t(s)]));
        }
      judge_varlen(v, p, refs, internal);
      ASSERT_TRUE(d.ws.reserve(need + kWsGuard) == cudaSuccess);
      FLASH3_CUDA_OK(cudaMemsetAsync(d.ws.ptr, 0xff, need + kWsGuard, d.stream));
      for (const char* run : {"first run", "second run"}) {
        SCOPED_TRACE(run);
        Downloaded got;
        ASSERT_TRUE(
            run_varlen(d, v, p, d.out.ptr, d.lse.as<float>(), split_call(5, v.describe(), nullptr, d.ws.ptr, need))
                .ok());
        ASSERT_TRUE(download(d, p, d.out.ptr, d.lse.as<float>(), &got));
        EXPECT_TRUE(got.out == internal.out) << "out differs bitwise from the run in flash3's own workspace";
        EXPECT_TRUE(got.lse == internal.lse) << "lse differs bitwise from the run in flash3's own workspace";
        EXPECT_EQ(guard_written(need), 0) << "written past the end of a " << need << "-byte workspace";
      }
      SCOPED_TRACE("one byte too small");
      poison_outputs(p, d.out.ptr, d.lse.as<float>(), d.stream);
      expect_rejected(a, need, size_t(p.out_elems) * 2, size_t(p.lse_elems) * 4);
      FLASH3_CUDA_OK(cudaGetLastError());
    }
    if (HasFatalFailure()) return;
    ++ran;
    break;  // one head dim: the workspace is sized on the host, the same way for all
  }
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward kernel in this build";
}

// ===========================================================================
// CUDA graphs: a split forward (the split kernel and the combine) captured
// with a caller workspace contains no allocation node, capturing runs
// nothing, and two replays (outputs and workspace poisoned before each) give
// the eager result bitwise. As test_fwd_workspace_gpu.cpp's check_graph.
// ===========================================================================
TEST(SplitKvGpu, CudaGraphCapture) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DeviceState& d = dev();
  DType dt = DType::kBFloat16;
  HeadDims h{128, 128};
  bool found = false;
  for (const HeadDims& x : kAllHeadDims)
    if (pick_pack_dtype(x, true, &dt)) {
      h = x, found = true;
      if (split_capable(dt, x.d, x.dv, 0.f)) break;
    }
  if (!found) GTEST_SKIP() << "not built: no forward kernel in this build";
  for (int n : {5, 0}) {
    const FwdCase c = workspace_case(dt, h);
    SCOPED_TRACE(c.describe() + " num_splits=" + std::to_string(n));
    FwdBuffers b;
    flash3::ForwardArgs a;
    size_t need = 0;
    ASSERT_TRUE(upload_split_args(c, n, &b, &a, &need));
    const FwdPlan& p = b.plan;
    ASSERT_EQ(d.ws.reserve(std::max<size_t>(need, 256)), cudaSuccess);
    a.workspace = need > 0 ? d.ws.ptr : nullptr;
    a.workspace_bytes = need;
    // Eager run, also the warm-up (first launches set the kernels' attributes).
    int splits = 0;
    Raw eager;
    ASSERT_TRUE(run_split(c, p, n, &eager, &splits, a.workspace, need));
    if (split_capable(dt, h.d, h.dv, 0.f)) {
      EXPECT_GT(splits, 1) << "the captured forward would not split";
    }
    judge_against_reference(c, p, eager);
    if (HasFatalFailure()) return;

    auto poison = [&] {
      cudaMemsetAsync(d.out.ptr, 0xff, size_t(p.out_elems) * 2, d.stream);
      cudaMemsetAsync(d.lse.ptr, 0xff, size_t(p.lse_elems) * 4, d.stream);
      if (need > 0) cudaMemsetAsync(d.ws.ptr, 0xff, need, d.stream);
    };
    poison();
    FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
    CapturedForward g;
    int kernels = 0;
    capture_forward(a, d.stream, &g, &kernels);
    if (HasFatalFailure()) return;
    if (splits > 1) {
      EXPECT_GE(kernels, 2) << "a split forward is the split kernel and the combine";
    }
    {
      int64_t written = -1;
      FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
      FLASH3_CUDA_OK(count_bytes_not(d.out.ptr, size_t(p.out_elems) * 2, 0xff, &written));
      EXPECT_EQ(written, 0) << "capturing the forward ran it";
    }
    for (int replay = 1; replay <= 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      poison();
      FLASH3_CUDA_OK(cudaGraphLaunch(g.exec, d.stream));
      Raw got;
      ASSERT_TRUE(download_fixed(p, &got));
      EXPECT_TRUE(got.out == eager.out) << "out of the replay differs bitwise from the eager run";
      EXPECT_TRUE(got.lse == eager.lse) << "lse of the replay differs bitwise from the eager run";
    }
  }
}

// ===========================================================================
// Values < 0 or > 256 are rejected, naming the option, before anything runs;
// 0, 1, 2 and 256 are accepted (256 on 4096 keys: clamped to the KV blocks).
// ===========================================================================
TEST(SplitKvGpu, OutOfRangeValuesAreRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  HeadDims h{128, 128};
  bool found = false;
  for (const HeadDims& x : kAllHeadDims)
    if (pick_pack_dtype(x, true, &dt)) {
      h = x, found = true;
      break;
    }
  FwdCase c = workspace_case(dt, h);
  const FwdPlan p = make_plan(c);
  DeviceState& d = dev();
  ASSERT_TRUE(reserve_all(
      {{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2}, {&d.lse, size_t(p.lse_elems) * 4}}));
  FLASH3_CUDA_OK(cudaMemsetAsync(d.in.ptr, 0, size_t(p.in_elems) * 2, d.stream));
  for (int bad : {-1, -2, -100, 257, 1000, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    flash3::ForwardArgs a = make_args(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>());
    a.opts.num_splits = bad;
    FLASH3_CUDA_OK(cudaMemsetAsync(d.out.ptr, 0xff, size_t(p.out_elems) * 2, d.stream));
    const flash3::Status v = flash3::validate_forward(a);
    EXPECT_EQ(v.code, flash3::StatusCode::kInvalidArgument)
        << "validate_forward, num_splits " << bad << ": " << v.message;
    const flash3::Status st = flash3::forward(a, d.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "num_splits " << bad << ": " << st.message;
    EXPECT_NE(st.message.find("opts.num_splits"), std::string::npos) << "num_splits " << bad << ": " << st.message;
    int64_t written = -1;
    FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
    FLASH3_CUDA_OK(count_bytes_not(d.out.ptr, size_t(p.out_elems) * 2, 0xff, &written));
    EXPECT_EQ(written, 0) << "a rejected call (num_splits " << bad << ") wrote out";
  }
  if (found) {
    for (int ok : {0, 1, 2, 256}) {
      flash3::ForwardArgs a = make_args(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>());
      a.opts.num_splits = ok;
      const flash3::Status st = flash3::forward(a, d.stream);
      EXPECT_TRUE(st.ok()) << "num_splits " << ok << ": " << st.message;
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(d.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
