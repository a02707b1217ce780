// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU correctness tests of PackGQA (AttentionOptions::pack_gqa): the forward
// that packs the g = hq / hkv query heads of a KV head into one query tile's
// rows (packed row r of kv head hk -> query row r / g, query head hk * g + r % g),
// so each K/V tile is read once per group. Only speed may differ from the
// unpacked kernel, so every result is judged like test_fwd_gpu.cpp's: against
// the fp32 GPU reference under the FlashAttention tolerance rule
// (flash3::ref::check_close)
//     max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// O and LSE separately (eps 1e-5 each); LSE is stored and checked in every case.
//
// The packed kernel runs only where (a) variants.txt lists the forward's
// "packgqa" unit of the (dtype, head dims), (b) hq != hkv, (c) softcap = 0 and
// (d) pack_gqa = 1 (or the heuristic picks it); elsewhere the unpacked kernel
// runs and a "packed" case would pass without testing the packed kernel. So
// the packed suites run only where the unit is listed, assert (b) to (d) for
// every case, and check fwd_pack_gqa() (plan/fwd_plan.h) on every call.
//
// Suites:
//   PackGqa/PackGqaFwd       pack_gqa = 1, every head dim (bf16 all 56 cases, then
//                            fp16 an eighth of them): 5 masks x 6 head ratios (MQA,
//                            g = 4, 5, 6, 8, 16) over 28 seqlen pairs from 1 x 1 to
//                            1000 x 2048 (sq > sk and sq < sk), batch 1-3, padded q / out
//   PackGqa/PackGqaFwdModes  pack_gqa = 0 and -1 on inputs of PackGqaFwd and
//                            PackGqaVarlen (the same seeds)
//   PackGqa/PackGqaVarlen    varlen batches of 1-9 sequences, lengths 0..600 (0 and 1
//                            included), seqused_q / seqused_k, GQA 8:2 and 16:2
//   PackGqaGpu.*             packed against unpacked on the same inputs, stores
//                            outside the problem, the fallback where no packed
//                            unit runs, rejected values
// FLASH3_GPU_TESTS_QUICK=1 keeps about a third of the fixed-length cases and
// half of the first dtype's varlen batches.
//
// out and lse are poisoned (NaN) before every call; everything outside the
// views (padding, the guard after each tensor, and for varlen the rows beyond
// seqused) must still hold the poison afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
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
#include "reference/reference.h"
#include "varlen_case.h"
#include "plan/lower.h"

// Internal: the launch's PackGQA decision on lowered params.
#include "common/params.h"
#include "launch/dispatch.h"

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

// ---------------------------------------------------------------------------
// The decision the launch must take.
// ---------------------------------------------------------------------------
// Whether launch_forward must pack (the contract of fwd_pack_gqa): never for
// pack_gqa = 0, MHA, softcap or without the packed unit; always for 1; for -1
// (the heuristic) always for varlen, unknown here for fixed length.
std::optional<bool> expected_pack(DType dt, HeadDims h, int hq, int hkv, float softcap, int pack, bool varlen) {
  if (pack == 0 || hq == hkv || softcap > 0.f || !packgqa_built(dt, h)) return false;
  if (pack == 1 || varlen) return true;
  return std::nullopt;
}

// fwd_pack_gqa() on the params of `a` is `expected` (where the contract fixes it).
void expect_pack_decision(const flash3::ForwardArgs& a, std::optional<bool> expected, const std::string& what) {
  if (expected.has_value()) {
    EXPECT_EQ(flash3::fwd_pack_gqa(flash3::make_fwd_params(a)), *expected)
        << what << ": fwd_pack_gqa() with opts.pack_gqa = " << a.opts.pack_gqa;
  }
}

const char* pack_name(int pack) { return pack == 1 ? "_pack1" : (pack == 0 ? "_pack0" : "_packauto"); }

// ---------------------------------------------------------------------------
// Device state shared by all tests of the process (buffers only grow): the
// varlen forward's (varlen_case.h), which holds the fixed-length one's.
// ---------------------------------------------------------------------------
struct DeviceState : VarlenDevice {};

DeviceState& dev() { return device_state<DeviceState>(); }

// A ForwardCall (fwd_case.h) that checks the launch's packing decision on the
// arguments, then runs flash3::forward on the test stream.
ForwardCall checking_pack_decision(std::optional<bool> expected, std::string what) {
  return [expected, what](const flash3::ForwardArgs& a) {
    expect_pack_decision(a, expected, what);
    return flash3::forward(a, dev().stream);
  };
}

// A case that runs the packed kernel once its unit is built: the suites of
// forced packing check this before the case itself.
::testing::AssertionResult takes_packed_path(int hq, int hkv, float softcap, int pack) {
  if (pack == 1 && hq != hkv && softcap == 0.f) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "not a packed case (pack_gqa=" << pack << " hq=" << hq << " hkv=" << hkv
                                       << " softcap=" << softcap << "): the unpacked kernel would run";
}

// The body of a forced-packing suite (PackGqaFwd, PackGqaVarlen) for head dims
// h: check(c) on every case of cases(dtype, full) of each dtype whose packed
// unit is built (run_per_dtype); the number run as property "cases", and a
// skip where none is built.
template <class Cases, class Check>
void run_packed_suite(HeadDims h, Cases&& cases, Check&& check) {
  const int ran = run_per_dtype([&](DType dt) { return packgqa_built(dt, h); }, cases, check);
  ::testing::Test::RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !::testing::Test::HasFatalFailure())
    GTEST_SKIP() << "not built: no forward packgqa unit " << head_dims_name(h)
                 << " (FLASH3_FEATURES / FLASH3_HDIMS / FLASH3_DTYPES)";
}

// ===========================================================================
// Fixed length.
// ===========================================================================
// Full check of one case (fwd_case.h's check_fwd_case) with the launch's
// packing decision; `outcome` (optional) receives the checked result.
void check_case(const FwdCase& c, FwdOutcome* outcome = nullptr) {
  const std::optional<bool> expected =
      expected_pack(c.dtype, {c.d, c.dv}, c.hq, c.hkv, c.softcap, c.pack_gqa, false);
  check_fwd_case(dev(), c, checking_pack_decision(expected, c.describe()), outcome);
}

void check_packed_case(const FwdCase& c) {
  ASSERT_TRUE(takes_packed_path(c.hq, c.hkv, c.softcap, c.pack_gqa)) << c.describe();
  check_case(c);
}

// ---------------------------------------------------------------------------
// The fixed-length cases.
// ---------------------------------------------------------------------------
struct PackMask {
  const char* name;
  bool causal;
  int wl, wr;
};
constexpr PackMask kPackMasks[] = {{"nomask", false, -1, -1},
                                   {"causal", true, -1, -1},
                                   {"local128x0", false, 128, 0},
                                   {"local37x5", false, 37, 5},
                                   {"left100", false, 100, -1}};
constexpr int kNumPackMasks = int(sizeof(kPackMasks) / sizeof(kPackMasks[0]));
// g = 4, MQA (g = 8), 5, 6, 8 and 16: packed tiles of whole and of split
// groups (128 and 192 rows are no multiples of 5, 6 or 12 x 16).
constexpr Heads kPackHeads[] = {{8, 2}, {8, 1}, {10, 2}, {12, 2}, {16, 2}, {32, 2}};
constexpr int kNumPackHeads = int(sizeof(kPackHeads) / sizeof(kPackHeads[0]));
// Decode-like (1, 2, 3 queries), a few tiles' worth of packed rows, tile
// edges and long problems; 1 or 7 keys under 1000 queries (rows with no
// visible key under causal / windows), and the reverse.
constexpr Seqlens kPackSeqlens[] = {
    {1, 1},      {1, 7},      {1, 128},    {1, 500},    {1, 2048},   {2, 1},      {2, 128},
    {2, 2048},   {3, 7},      {3, 500},    {3, 2048},   {16, 1},     {16, 128},   {16, 2048},
    {64, 7},     {64, 500},   {64, 2048},  {100, 7},    {100, 128},  {100, 2048}, {128, 128},
    {128, 500},  {200, 7},    {200, 500},  {200, 2048}, {1000, 1},   {1000, 128}, {1000, 2048}};
constexpr int kNumPackSeqlens = int(sizeof(kPackSeqlens) / sizeof(kPackSeqlens[0]));

// prefix + (dtype, head dims, mask, seqlens, heads): the start of a case's
// name, which seeds its inputs.
std::string pack_case_name(const char* prefix, DType dt, HeadDims h, const PackMask& m, Seqlens sl, Heads heads) {
  return std::string(prefix) + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + m.name + "_sq" +
         std::to_string(sl.sq) + "_sk" + std::to_string(sl.sk) + "_" + heads_name(heads);
}

// Every fixed-length case of one (dtype, head dims), numbered: each seqlen pair
// i with masks i and i + 2 (mod 5), which gives every (mask, head ratio) pair
// and both sq > sk and sq < sk under every mask. Batch 1-3 (1 where sq * hq is
// large), every fourth case padded. The name (without the pack_gqa setting)
// seeds the inputs, so the same case with another pack_gqa reads the same ones.
std::vector<FwdCase> all_pack_cases(DType dt, HeadDims h, int pack) {
  std::vector<FwdCase> out;
  for (int i = 0; i < kNumPackSeqlens; ++i)
    for (int j : {i % kNumPackMasks, (i + 2) % kNumPackMasks}) {
      const int k = int(out.size());
      const Seqlens sl = kPackSeqlens[i];
      const Heads heads = kPackHeads[(i + j) % kNumPackHeads];
      const PackMask& m = kPackMasks[j];
      FwdCase c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv;
      c.sq = sl.sq, c.sk = sl.sk;
      c.hq = heads.hq, c.hkv = heads.hkv;
      c.batch = int64_t(sl.sq) * heads.hq > 8000 ? 1 : 1 + k % 3;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.layout = k % 4 == 1 ? Layout::kPadded : Layout::kContiguous;
      c.pack_gqa = pack;
      c.name = pack_case_name("packgqa_", dt, h, m, sl, heads) + "_b" + std::to_string(c.batch) +
               (c.layout == Layout::kPadded ? "_padded" : "");
      c.seed = fnv1a(c.name);
      c.name += pack_name(pack);
      out.push_back(c);
    }
  return out;
}

// The cases whose number is `rem` mod `mod`.
std::vector<FwdCase> every(const std::vector<FwdCase>& all, int mod, int rem) {
  std::vector<FwdCase> out;
  for (size_t k = 0; k < all.size(); ++k)
    if (int(k) % mod == rem) out.push_back(all[k]);
  return out;
}

// Forced packing: all 56 (quick: every third), or the reduced set of the
// second dtype, every eighth (every mask; quick: every 24th).
std::vector<FwdCase> forced_cases(DType dt, HeadDims h, bool full) {
  const std::vector<FwdCase> all = all_pack_cases(dt, h, 1);
  if (full) return quick_mode() ? every(all, 3, 0) : all;
  return quick_mode() ? every(all, 24, 0) : every(all, 8, 0);
}

// pack_gqa = 0 / -1: every eighth case (quick: every 24th), not those of the
// reduced forced set.
std::vector<FwdCase> mode_cases(DType dt, HeadDims h, int pack) {
  const std::vector<FwdCase> all = all_pack_cases(dt, h, pack);
  return quick_mode() ? every(all, 24, 2) : every(all, 8, 2);
}

// A hand-picked shape of the single tests (mask: an index into kPackMasks).
struct PackShape {
  int b, sq, sk;
  Heads heads;
  int mask;
  Layout layout;
};

// Shape s in (dt, h), named and seeded by pack_case_name(prefix, ...).
FwdCase shape_case(const char* prefix, DType dt, HeadDims h, const PackShape& s) {
  const PackMask& m = kPackMasks[s.mask];
  FwdCase c;
  c.dtype = dt, c.d = h.d, c.dv = h.dv;
  c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.heads.hq, c.hkv = s.heads.hkv;
  c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
  c.layout = s.layout;
  c.name = pack_case_name(prefix, dt, h, m, {s.sq, s.sk}, s.heads);
  c.seed = fnv1a(c.name);
  return c;
}

// ===========================================================================
// Forced packing, every head dim: bf16 with every case, then fp16 (where its
// unit is built) with the reduced set.
// ===========================================================================
class PackGqaFwd : public ::testing::TestWithParam<HeadDims> {};

TEST_P(PackGqaFwd, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  run_packed_suite(h, [&](DType dt, bool full) { return forced_cases(dt, h, full); },
                   [](const FwdCase& c) { check_packed_case(c); });
}

INSTANTIATE_TEST_SUITE_P(PackGqa, PackGqaFwd, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Packed and unpacked on the same inputs: each against the reference, the
// launch's decision for each (true / false), and the two results within the
// rule's bound of each other (2 * the larger baseline + eps; not required
// bitwise: the tiles hold other rows, so the accumulation differs in order).
// ===========================================================================
TEST(PackGqaGpu, PackedAndUnpackedAgree) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const PackShape shapes[] = {{2, 1, 2048, {32, 2}, 0, Layout::kContiguous},
                              {1, 100, 500, {10, 2}, 1, Layout::kPadded},
                              {3, 64, 128, {8, 1}, 3, Layout::kContiguous},
                              {1, 1000, 2048, {16, 2}, 4, Layout::kContiguous},
                              {2, 3, 7, {12, 2}, 2, Layout::kPadded}};
  int ran = 0;
  int64_t total_diff_o = 0, total_diff_lse = 0;
  for (const HeadDims& h : kAllHeadDims) {
    DType dt;
    if (!pick_pack_dtype(h, false, &dt)) continue;
    for (const PackShape& s : shapes) {
      FwdCase c = shape_case("packed_vs_unpacked_", dt, h, s);
      const std::string base = c.name;  // seeds both runs
      FwdOutcome packed, unpacked;
      c.pack_gqa = 1, c.name = base + pack_name(1);
      ASSERT_TRUE(takes_packed_path(c.hq, c.hkv, c.softcap, c.pack_gqa));
      check_case(c, &packed);
      if (HasFatalFailure()) return;
      c.pack_gqa = 0, c.name = base + pack_name(0);
      check_case(c, &unpacked);
      if (HasFatalFailure()) return;
      ++ran;
      auto compare = [&](const char* what, const std::vector<double>& x, const std::vector<double>& y, double bound,
                         int64_t* bitwise) {
        ASSERT_EQ(x.size(), y.size());
        double err = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          const bool same = x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]));
          *bitwise += !same;
          if (same) continue;
          const double e = std::fabs(x[i] - y[i]);
          err = std::max(err, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
        }
        EXPECT_LE(err, bound) << base << ": packed and unpacked " << what << " differ by " << err << " (bound "
                              << bound << ")";
      };
      compare("out", packed.o, unpacked.o, 2 * std::max(packed.o_base, unpacked.o_base) + kEpsO, &total_diff_o);
      compare("lse", packed.lse, unpacked.lse, 2 * std::max(packed.lse_base, unpacked.lse_base) + kEpsLse,
              &total_diff_lse);
    }
  }
  RecordProperty("bitwise_diff_o", std::to_string(total_diff_o));
  RecordProperty("bitwise_diff_lse", std::to_string(total_diff_lse));
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward packgqa unit in this build";
}

// ===========================================================================
// pack_gqa = 1 where no packed kernel runs (MHA, softcap, a head dim or dtype
// without the packed unit): the unpacked kernel, the same results, no error.
// ===========================================================================
TEST(PackGqaGpu, ForcedWithoutPackedUnitRunsUnpacked) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for (const HeadDims& h : kAllHeadDims)
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      if (!flash3::forward_is_built(dt, h.d, h.dv)) continue;
      std::vector<FwdCase> cases;
      auto add = [&](const char* tag, Heads heads, float softcap, bool causal) {
        FwdCase c;
        c.dtype = dt, c.d = h.d, c.dv = h.dv;
        c.batch = 2, c.sq = 77, c.sk = 300, c.hq = heads.hq, c.hkv = heads.hkv;
        c.causal = causal;
        c.softcap = softcap;
        c.pack_gqa = 1;
        c.name = std::string("forced_fallback_") + tag + "_" + tu::short_dtype(dt) + "_" + head_dims_name(h);
        c.seed = fnv1a(c.name);
        cases.push_back(c);
      };
      add("mha4x4", {4, 4}, 0.f, true);
      if (softcap_built(dt, h, false)) add("softcap5_gqa8x2", {8, 2}, 5.f, false);
      if (!packgqa_built(dt, h)) add("unit_not_built_gqa8x2", {8, 2}, 0.f, true);
      for (const FwdCase& c : cases) {
        check_case(c);
        if (HasFatalFailure()) return;
        ++ran;
      }
    }
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward kernel in this build";
}

// Values other than -1, 0 and 1 are rejected, naming the option.
TEST(PackGqaGpu, OtherValuesAreRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  HeadDims h{128, 128};
  for (const HeadDims& x : kAllHeadDims)
    if (pick_pack_dtype(x, true, &dt)) {
      h = x;
      break;
    }
  FwdCase c;
  c.dtype = dt, c.d = h.d, c.dv = h.dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 8, c.hkv = 2;
  const FwdPlan p = make_plan(c);
  DeviceState& d = dev();
  ASSERT_TRUE(reserve_all(
      {{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2}, {&d.lse, size_t(p.lse_elems) * 4}}));
  for (int bad : {2, -2, 100, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    flash3::ForwardArgs a = make_args(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>());
    a.opts.pack_gqa = bad;
    const flash3::Status st = flash3::forward(a, d.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "pack_gqa " << bad << ": " << st.message;
    EXPECT_NE(st.message.find("opts.pack_gqa"), std::string::npos) << "pack_gqa " << bad << ": " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(d.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ===========================================================================
// Variable length (varlen_case.h): every case has kGapRows rows of poison after
// out and after each head's lse rows.
// ===========================================================================
// Full check of one varlen case: upload, poison, run (with the launch's
// packing decision), then the poison outside the used rows and each sequence
// against its own reference.
void check_vcase(const VCase& c) {
  SCOPED_TRACE(c.describe());
  DeviceState& d = dev();
  VBuffers b;
  ASSERT_TRUE(upload_varlen_inputs(d, c, &b));
  const VPlan& p = b.plan;
  const std::optional<bool> expected = expected_pack(c.dtype, {c.d, c.dv}, c.hq, c.hkv, c.softcap, c.pack_gqa, true);
  const flash3::Status st =
      run_varlen(d, c, p, d.out.ptr, d.lse.as<float>(), checking_pack_decision(expected, c.describe()));
  ASSERT_TRUE(st.ok()) << c.describe() << ": flash3::forward failed: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  Downloaded h;
  ASSERT_TRUE(download(d, p, d.out.ptr, d.lse.as<float>(), &h));

  expect_only_used_rows_written(c, p, h);

  for (int s = 0; s < c.n(); ++s) {
    if (c.eff_q(s) == 0) continue;
    RefOutputs ref;
    ASSERT_TRUE(sequence_reference(d, c, p, s, &ref)) << "sequence " << s;
    expect_sequence_close(c, s, sequence_desc(c, p, s), ours_o(c, p, h, s), ours_lse(c, p, h, s), ref);
  }
}

// ---------------------------------------------------------------------------
// The varlen cases.
// ---------------------------------------------------------------------------
constexpr int kVarlenMaxLen = 600;

// Uniform in [0, 600], with 0 and 1 a tenth of the time each.
int draw_len(Rng& g) { return draw_len_with_ends(g, kVarlenMaxLen); }

// The varlen cases of one (dtype, head dims): all eight (quick: every other),
// or the reduced set of the second dtype (every third).
std::vector<VCase> varlen_cases(DType dt, HeadDims h, bool full) {
  const VSpec specs[] = {
      {"nomask_gqa8x2_b9", 9, {8, 2}, VMask::kNone, false, false, Layout::kContiguous,
       {{0, 37}, {1, 1}, {1, 600}, {600, 1}, {129, 0}}},
      {"causal_gqa16x2_b7", 7, {16, 2}, VMask::kCausal, false, false, Layout::kPadded,
       {{1, 0}, {200, 100}, {100, 200}, {0, 0}}},
      {"local_seqused_gqa8x2_b5", 5, {8, 2}, VMask::kLocal, true, true, Layout::kContiguous, {{1, 7}, {300, 300}}},
      {"causal_local_seqused_q_gqa16x2_b6", 6, {16, 2}, VMask::kCausalLocal, true, false, Layout::kPadded,
       {{0, 5}, {64, 64}}},
      {"nomask_gqa16x2_b1", 1, {16, 2}, VMask::kNone, false, false, Layout::kContiguous, {{511, 577}}},
      {"left_seqused_k_gqa8x2_b4", 4, {8, 2}, VMask::kLeftOnly, false, true, Layout::kContiguous, {{1, 600}}},
      {"causal_seqused_gqa8x2_b3", 3, {8, 2}, VMask::kCausal, true, true, Layout::kPadded, {{17, 3}}},
      {"nomask_seqused_q_gqa16x2_b2", 2, {16, 2}, VMask::kNone, true, false, Layout::kContiguous,
       {{5, 0}, {450, 333}}},
  };
  std::vector<VCase> out;
  const int n_specs = int(sizeof(specs) / sizeof(specs[0]));
  for (int i = 0; i < n_specs; ++i) {
    if (full ? (quick_mode() && i % 2 != 0) : i % 3 != 0) continue;
    out.push_back(spec_vcase(specs[i], "packgqa_varlen_", dt, h, draw_len));
  }
  return out;
}

void check_packed_vcase(const VCase& c) {
  ASSERT_TRUE(takes_packed_path(c.hq, c.hkv, c.softcap, c.pack_gqa)) << c.describe();
  check_vcase(c);
}

class PackGqaVarlen : public ::testing::TestWithParam<HeadDims> {};

TEST_P(PackGqaVarlen, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  run_packed_suite(h, [&](DType dt, bool full) { return varlen_cases(dt, h, full); },
                   [](const VCase& c) { check_packed_vcase(c); });
}

INSTANTIATE_TEST_SUITE_P(PackGqa, PackGqaVarlen, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// pack_gqa = 0 (never) and -1 (the heuristic) on inputs of the forced suites
// (fixed length and varlen, the same seeds): the same results under the same
// rule. Runs wherever the plain kernel is built (packing or not is then the
// launch's choice; varlen with -1 must pack where the unit is built).
// ===========================================================================
class PackGqaFwdModes : public ::testing::TestWithParam<HeadDims> {};

TEST_P(PackGqaFwdModes, MatchReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  DType dt;
  if (!pick_pack_dtype(h, true, &dt)) GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(h);
  int ran = 0;
  for (int pack : {0, -1}) {
    for (const FwdCase& c : mode_cases(dt, h, pack)) {
      check_case(c);
      if (HasFatalFailure()) return;
      ++ran;
    }
    for (VCase c : varlen_cases(dt, h, false)) {
      c.pack_gqa = pack;
      c.name += pack_name(pack);
      check_vcase(c);
      if (HasFatalFailure()) return;
      ++ran;
    }
  }
  RecordProperty("cases", std::to_string(ran));
}

INSTANTIATE_TEST_SUITE_P(PackGqa, PackGqaFwdModes, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Stores outside the problem. A packed tile's rows past sq * g stand for query
// rows >= sq (past the end of a batch element, or of a sequence), and its
// epilogue must drop them: here each batch element's out and lse rows are
// followed by kGapRows rows of poison (more than a tile's worth of query rows),
// with sq * g not a multiple of any tile height; for varlen, rows beyond
// seqused_q and the kGapRows rows after the tensor must keep their poison.
// ===========================================================================
TEST(PackGqaGpu, NoStoresOutsideTheProblem) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  // Packed rows: 15, 272 (17 x 16), 600, 32 and 1600 (200 x 8).
  const PackShape shapes[] = {{2, 3, 500, {10, 2}, 0, Layout::kPadded},
                              {3, 17, 128, {32, 2}, 1, Layout::kPadded},
                              {1, 100, 7, {12, 2}, 3, Layout::kPadded},
                              {2, 1, 2048, {32, 2}, 2, Layout::kPadded},
                              {1, 200, 1000, {8, 1}, 4, Layout::kPadded}};
  int ran = 0;
  for (const HeadDims& h : kAllHeadDims) {
    DType dt;
    if (!pick_pack_dtype(h, false, &dt)) continue;
    for (const PackShape& s : shapes) {
      FwdCase c = shape_case("packgqa_stores_", dt, h, s);
      c.pack_gqa = 1;
      c.gap_rows = kGapRows;
      check_packed_case(c);
      if (HasFatalFailure()) return;
      ++ran;
    }
    // Varlen: every sequence shortened by seqused_q, the last one ending the
    // tensor mid-tile.
    check_packed_vcase(stores_vcase("packgqa_stores_varlen_", dt, h, {300, 64, 129, 7, 250}, Layout::kContiguous));
    if (HasFatalFailure()) return;
    ++ran;
  }
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward packgqa unit in this build";
}

// ===========================================================================
// The variant list and the library agree on which packed units are built.
// ===========================================================================
TEST(PackGqaGpu, VariantsFileMatchesPackKernelBuilt) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  bool found = false;
  tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), &found);
  ASSERT_TRUE(found) << "cannot read " << tu::variants_path(FLASH3_VARIANTS_FILE) << " (set FLASH3_VARIANTS_FILE)";
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (const HeadDims& h : kAllHeadDims)
      EXPECT_EQ(variant_listed("fwd", dt, h, "packgqa"), flash3::fwd_pack_kernel_built(dt, h.d, h.dv))
          << tu::short_dtype(dt) << " " << head_dims_name(h)
          << ": variants.txt and fwd_pack_kernel_built() disagree on the packgqa unit";
}

}  // namespace
