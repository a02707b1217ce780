// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU correctness tests of flash3::forward.
//
// Every result is compared with the fp32 GPU reference (gpu_reference.cuh) under
// the FlashAttention tolerance rule (flash3::ref::check_close):
//     max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// where plain_lowp is the GPU emulation of a plain bf16/fp16 implementation on
// the same inputs. O and LSE are checked separately (LSE eps 1e-5, O eps 1e-5).
// The fp32 GPU reference itself is checked against the float64 CPU reference
// (src/reference) on small shapes.
//
// Every test first skips without a Hopper GPU, and a case whose
// (dtype, head_dim, head_dim_v) kernel is not built skips with "not built: ...".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "fwd_case.h"
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "reference/reference.h"

namespace flash3 {
// Internal linkage: only for this file's parameter printing.
static void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace flash3

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

constexpr float kNaN = flash3::gpuref::kDefaultScale;

// ---------------------------------------------------------------------------
// Device state shared by all tests of the process (buffers only grow): the
// forward check's (fwd_case.h) and a second out / lse for comparing two calls.
// ---------------------------------------------------------------------------
struct DeviceState : FwdDevice {
  tu::DeviceBuffer out2, lse2;
};

DeviceState& dev() { return device_state<DeviceState>(); }

// Plans c, reserves the buffers (out2 / lse2 like out / lse), fills q/k/v with
// fresh random normals (seeded by the case) and copies them up.
::testing::AssertionResult upload_inputs(const FwdCase& c, FwdBuffers* b) {
  DeviceState& d = dev();
  const ::testing::AssertionResult r = upload_fwd_inputs(d, c, b);
  if (!r) return r;
  return reserve_all({{&d.out2, size_t(b->plan.out_elems) * 2}, {&d.lse2, size_t(b->plan.lse_elems) * 4}});
}

// Poisons out/lse (+ guards), runs flash3::forward on them. Returns the status.
flash3::Status run_flash3(const FwdCase& c, const FwdPlan& p, void* out, float* lse, const ForwardCall& call = {}) {
  return run_forward(dev(), c, p, out, lse, call);
}

// Full check of one case: flash3 vs fp32 GPU reference, baseline = GPU emulation.
void check_case(const FwdCase& c, const ForwardCall& call = {}) { check_fwd_case(dev(), c, call); }

// First built forward variant, preferring the common ones.
bool pick_built(DType* dt, int* d, int* dv) {
  const HeadDims prefs[] = {{128, 128}, {64, 64}, {256, 256}, {96, 96}, {192, 192}, {192, 128}};
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (const HeadDims& h : prefs)
      if (flash3::forward_is_built(t, h.d, h.dv)) {
        *dt = t, *d = h.d, *dv = h.dv;
        return true;
      }
  return false;
}

#define FLASH3_SKIP_UNLESS_BUILT(c)                                                                        \
  do {                                                                                                     \
    if (!flash3::forward_is_built((c).dtype, (c).d, (c).dv))                                              \
      GTEST_SKIP() << "not built: forward kernel " << tu::short_dtype((c).dtype) << " " << (c).d << "x" \
                   << (c).dv << " is not in this build (FLASH3_DTYPES / FLASH3_HDIMS)";                    \
  } while (0)

// ===========================================================================
// The matrix.
// ===========================================================================
FwdCase matrix_case(const MatrixParam& mp) {
  FwdCase c;
  fill_matrix_case(&c, mp, "");
  return c;
}

class FwdMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(FwdMatrix, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const FwdCase c = matrix_case(GetParam());
  FLASH3_SKIP_UNLESS_BUILT(c);
  if (quick_mode() && c.sq == 4096) GTEST_SKIP() << "quick mode (FLASH3_GPU_TESTS_QUICK=1): seqlen 4096 left out";
  check_case(c);
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) { return matrix_case(info.param).name; }

// The 2016-case issue matrix (gpu_case.h). No case is dropped (batch 3 of (4096, 4096)
// with hq=8 is kept): the largest case (d=256, no mask) is ~1.2 TFLOP of reference work (both reference modes), and the
// whole matrix ~4e13 FLOP, i.e. seconds of GPU time; host-side checking and, under
// ctest, one process per case dominate (a few minutes with ctest -j8).
INSTANTIATE_TEST_SUITE_P(Fwd, FwdMatrix, issue_matrix(), matrix_name);

// ===========================================================================
// Extra shapes outside the matrix: decode-like long keys, odd lengths.
// ===========================================================================
TEST(FwdGpu, ExtraShapes) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  struct S {
    int b, sq, sk, hq, hkv;
    Mask m;
  };
  const S shapes[] = {{2, 1, 4096, 8, 1, Mask::kNone},   {1, 7, 3000, 16, 2, Mask::kCausal},
                      {4, 63, 65, 4, 4, Mask::kCausal},  {1, 257, 4095, 2, 1, Mask::kWindow256_256},
                      {2, 4096, 1, 2, 2, Mask::kCausal}, {1, 129, 127, 6, 3, Mask::kWindow128_0}};
  for (const S& s : shapes) {
    FwdCase c;
    c.dtype = dt, c.d = d, c.dv = dv;
    c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
    apply_mask(&c, s.m);
    c.layout = Layout::kPadded;
    c.name = "extra_b" + std::to_string(s.b) + "_sq" + std::to_string(s.sq) + "_sk" + std::to_string(s.sk) + "_" +
             heads_name({s.hq, s.hkv}) + "_" + mask_name(s.m);
    c.seed = fnv1a(c.name);
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

// Runs check_case on every case make(dtype, head dims) returns, for each pair in
// `dims` whose forward kernel is built (both dtypes); stops at the first fatal
// failure. Returns how many cases ran.
template <class Dims, class Make>
int check_built_cases(const Dims& dims, Make make) {
  int ran = 0;
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (const HeadDims& h : dims) {
      if (!flash3::forward_is_built(t, h.d, h.dv)) continue;
      for (FwdCase& c : make(t, h)) {
        c.seed = fnv1a(c.name);
        check_case(c);
        if (::testing::Test::HasFatalFailure()) return ran;
        ++ran;
      }
    }
  return ran;
}

// ===========================================================================
// Peaked softmax: with softmax_scale 2 (scores of about 30 in log2 units, std)
// the running row max keeps growing by more than the lazy-rescale slack
// (kFwdRescaleSlack), so the steady-state loop takes the O-rescale
// branch that the matrix's 1/sqrt(d) scores rarely reach, in every warp and
// at arbitrary blocks. Every built (dtype, head dims) pair, unmasked, causal
// and windowed.
// ===========================================================================
TEST(FwdGpu, PeakedScoresRescaleO) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int ran = check_built_cases(kAllHeadDims, [](DType t, HeadDims h) {
    std::vector<FwdCase> cases;
    for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kWindow256_256}) {
      FwdCase c;
      c.dtype = t, c.d = h.d, c.dv = h.dv;
      c.batch = 2, c.sq = 1000, c.sk = 1500, c.hq = 4, c.hkv = 2;
      c.scale = 2.f;
      apply_mask(&c, m);
      c.name = "peaked_" + std::string(tu::short_dtype(t)) + "_d" + std::to_string(h.d) + "x" +
               std::to_string(h.dv) + "_" + mask_name(m);
      cases.push_back(c);
    }
    return cases;
  });
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward kernel in this build";
}

// Causal d = 64 takes the dynamic persistent kernel at every length
// (fwd_short_causal); the matrix stops at 4096 keys, where
// every d <= 128 head dim does, so this covers the longer problems.
TEST(FwdGpu, D64CausalLongSequences) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims d64[] = {{64, 64}};
  const int ran = check_built_cases(d64, [](DType t, HeadDims) {
    FwdCase c;
    c.dtype = t, c.d = 64, c.dv = 64;
    c.batch = 2, c.sq = 6000, c.sk = 6200, c.hq = 4, c.hkv = 1;
    c.causal = true;
    c.name = std::string("long_causal_") + tu::short_dtype(t) + "_d64";
    return std::vector<FwdCase>{c};
  });
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no d = 64 forward kernel in this build";
}

// ===========================================================================
// The GPU reference itself, against the float64 CPU reference.
// ===========================================================================
TEST(GpuReference, MatchesCpuFloat64) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  struct S {
    DType dt;
    int b, sq, sk, hq, hkv, d, dv;
    bool causal;
    int wl, wr;
    Layout layout;
    float scale = flash3::gpuref::kDefaultScale;
    const char* tag = "";  // name suffix (the name seeds the inputs)
    float softcap = 0.f;
  };
  const S shapes[] = {
      {DType::kBFloat16, 2, 37, 53, 4, 2, 64, 64, true, -1, -1, Layout::kPadded},            // causal, GQA, sq < sk
      {DType::kFloat16, 1, 65, 65, 2, 2, 128, 128, false, 16, 8, Layout::kPackedQKV},        // window, packed q/k/v
      {DType::kBFloat16, 2, 100, 30, 6, 1, 192, 128, false, 32, 0, Layout::kContiguous},     // fully masked rows, MQA
      {DType::kFloat16, 1, 1, 300, 3, 3, 256, 256, false, -1, -1, Layout::kContiguous},      // one query, long keys
      {DType::kBFloat16, 1, 70, 70, 2, 2, 96, 96, true, -1, -1, Layout::kPackedQKV},         // causal, packed
      {DType::kFloat16, 3, 129, 129, 8, 2, 40, 24, false, 64, 64, Layout::kPadded},          // odd dims, window
      // Windows of 2^31 - 1 (unbounded by the arithmetic) and negative sides.
      {DType::kBFloat16, 2, 37, 53, 4, 2, 64, 64, false, kIntMax, kIntMax, Layout::kContiguous, kNaN, "_intmax"},
      {DType::kFloat16, 1, 90, 40, 2, 1, 64, 64, false, kIntMax, 0, Layout::kContiguous, kNaN, "_intmax0"},
      {DType::kBFloat16, 1, 40, 90, 2, 2, 64, 64, false, kIntMin, kIntMax, Layout::kPadded, kNaN, "_intmin"},
      {DType::kFloat16, 1, 77, 77, 2, 2, 64, 64, true, 10, kIntMax, Layout::kContiguous, kNaN, "_causal_local"},
      // softmax_scale used as given, 0 included (uniform attention).
      {DType::kBFloat16, 2, 50, 61, 2, 1, 128, 128, true, -1, -1, Layout::kContiguous, 0.3f, "_scale0.3"},
      {DType::kFloat16, 1, 33, 70, 2, 2, 64, 64, false, 20, 5, Layout::kContiguous, 0.f, "_scale0"},
      // Softcap: s -> softcap * tanh(s / softcap) after scaling (1: saturated scores).
      {DType::kBFloat16, 1, 70, 70, 2, 2, 96, 96, true, -1, -1, Layout::kPackedQKV, kNaN, "_softcap5", 5.f},
      {DType::kFloat16, 2, 45, 130, 4, 1, 128, 128, false, 30, 10, Layout::kPadded, 1.f, "_softcap1_scale1", 1.f},
      {DType::kBFloat16, 1, 100, 30, 2, 2, 192, 128, false, -1, -1, Layout::kContiguous, 0.f, "_softcap30_scale0", 30.f},
  };
  for (const S& s : shapes) {
    FwdCase c;
    c.dtype = s.dt, c.batch = s.b, c.sq = s.sq, c.hq = s.hq, c.hkv = s.hkv, c.d = s.d, c.dv = s.dv;
    c.sk = s.sk;
    c.causal = s.causal, c.wl = s.wl, c.wr = s.wr;
    c.scale = s.scale;
    c.softcap = s.softcap;
    c.layout = s.layout;
    if (c.layout == Layout::kPackedQKV) {
      ASSERT_TRUE(c.hq == c.hkv && c.d == c.dv && c.sq == c.sk) << "packed q/k/v needs hq == hkv, d == dv, sq == sk";
    }
    c.name = "ref_" + std::string(tu::short_dtype(s.dt)) + "_b" + std::to_string(s.b) + "_sq" + std::to_string(c.sq) +
             "_sk" + std::to_string(c.sk) + "_d" + std::to_string(s.d) + "x" + std::to_string(s.dv) + s.tag;
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());

    FwdBuffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& d = dev();
    const FwdPlan& p = b.plan;
    const auto ra = make_ref_args(c, p, d.in.ptr, d.ref_o.as<float>(), d.ref_lse.as<float>());
    FLASH3_CUDA_OK(flash3::gpuref::forward(ra, flash3::gpuref::Mode::kFloat32, d.stream));
    const auto la = make_ref_args(c, p, d.in.ptr, d.low_o.as<float>(), d.low_lse.as<float>());
    FLASH3_CUDA_OK(flash3::gpuref::forward(la, flash3::gpuref::Mode::kLowPrecision, d.stream));
    const size_t n_o = size_t(c.batch) * c.sq * c.hq * c.dv, n_lse = size_t(c.batch) * c.hq * c.sq;
    std::vector<float> g_o(n_o), g_lse(n_lse), l_o(n_o), l_lse(n_lse);
    FLASH3_CUDA_OK(cudaMemcpyAsync(g_o.data(), d.ref_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream));
    FLASH3_CUDA_OK(cudaMemcpyAsync(g_lse.data(), d.ref_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream));
    FLASH3_CUDA_OK(cudaMemcpyAsync(l_o.data(), d.low_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream));
    FLASH3_CUDA_OK(cudaMemcpyAsync(l_lse.data(), d.low_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream));
    FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));

    flash3::ref::Problem pr;
    pr.batch = c.batch, pr.seqlen_q = c.sq, pr.seqlen_k = c.sk, pr.heads_q = c.hq, pr.heads_kv = c.hkv;
    pr.head_dim = c.d, pr.head_dim_v = c.dv;
    flash3::ref::Options opt;
    opt.causal = c.causal, opt.window_left = c.wl, opt.window_right = c.wr;
    opt.softmax_scale = c.scale;
    opt.softcap = c.softcap;
    const std::vector<double> q = extract(b.host_in, p.q, c.dtype), k = extract(b.host_in, p.k, c.dtype),
                              v = extract(b.host_in, p.v, c.dtype);
    std::vector<double> o64(n_o), lse64(n_lse), olow64(n_o), lselow64(n_lse);
    flash3::ref::forward(pr, opt, q.data(), k.data(), v.data(), o64.data(), lse64.data());
    const auto lp = c.dtype == DType::kBFloat16 ? flash3::ref::LowPrecision::kBFloat16 : flash3::ref::LowPrecision::kFloat16;
    flash3::ref::forward_lowp(lp, pr, opt, q.data(), k.data(), v.data(), olow64.data(), lselow64.data());

    // fp32 GPU reference == float64 CPU reference within 1e-5 (relative for |x| > 1).
    auto max_err = [](const std::vector<float>& g, const std::vector<double>& r, size_t* at) {
      double m = 0;
      *at = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        double e;
        if (std::isinf(r[i]) || std::isnan(g[i])) e = (double(g[i]) == r[i]) ? 0.0 : std::numeric_limits<double>::infinity();
        else e = std::fabs(double(g[i]) - r[i]) / std::max(1.0, std::fabs(r[i]));
        if (e > m) m = e, *at = i;
      }
      return m;
    };
    size_t at = 0;
    const double eo = max_err(g_o, o64, &at);
    EXPECT_LE(eo, 1e-5) << c.describe() << ": GPU fp32 reference O differs from the float64 reference by " << eo
                        << " at " << where_o(c, at) << " (gpu=" << g_o[at] << " cpu=" << o64[at] << ")";
    const double el = max_err(g_lse, lse64, &at);
    EXPECT_LE(el, 1e-5) << c.describe() << ": GPU fp32 reference LSE differs from the float64 reference by " << el
                        << " at " << where_lse(c, at) << " (gpu=" << g_lse[at] << " cpu=" << lse64[at] << ")";

    // The emulation rounds like the CPU emulation: its error against float64 is of the
    // same size (fp32-vs-float64 rounding ties may flip a few elements, so a factor of 2).
    auto err_vs = [](const std::vector<double>& a, const std::vector<double>& r) {
      double m = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (!std::isinf(r[i])) m = std::max(m, std::fabs(a[i] - r[i]));
      return m;
    };
    const double gpu_low_o = err_vs(to_double(l_o), o64), cpu_low_o = err_vs(olow64, o64);
    const double gpu_low_l = err_vs(to_double(l_lse), lse64), cpu_low_l = err_vs(lselow64, lse64);
    EXPECT_GT(cpu_low_o, 0.0) << c.describe() << ": CPU low-precision emulation has no error at all";
    EXPECT_GE(gpu_low_o, 0.5 * cpu_low_o) << c.describe() << ": O emulation error gpu=" << gpu_low_o
                                          << " cpu=" << cpu_low_o;
    EXPECT_LE(gpu_low_o, 2.0 * cpu_low_o + 1e-6) << c.describe() << ": O emulation error gpu=" << gpu_low_o
                                                 << " cpu=" << cpu_low_o;
    EXPECT_GE(gpu_low_l, 0.5 * cpu_low_l) << c.describe() << ": LSE emulation error gpu=" << gpu_low_l
                                          << " cpu=" << cpu_low_l;
    EXPECT_LE(gpu_low_l, 2.0 * cpu_low_l + 1e-6) << c.describe() << ": LSE emulation error gpu=" << gpu_low_l
                                                 << " cpu=" << cpu_low_l;
    // Fully masked rows agree exactly.
    for (size_t i = 0; i < n_lse; ++i)
      if (std::isinf(lse64[i])) {
        EXPECT_TRUE(std::isinf(l_lse[i]) && l_lse[i] < 0) << c.describe() << ": emulation LSE at " << where_lse(c, i);
      }
  }
}

// ===========================================================================
// Empty sequences.
// ===========================================================================
TEST(FwdGpu, EmptySeqlenKGivesZeroAndMinusInf) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  for (Mask m : {Mask::kNone, Mask::kCausal}) {
    FwdCase c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 70, c.sk = 0, c.hq = 4, c.hkv = 2;
    apply_mask(&c, m);
    c.name = std::string("empty_k_") + mask_name(m);
    c.seed = 7;
    SCOPED_TRACE(c.describe());
    FwdBuffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const flash3::Status st = run_flash3(c, b.plan, ds.out.ptr, ds.lse.as<float>());
    ASSERT_TRUE(st.ok()) << "seqlen_k = 0: " << st.message;
    FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
    const size_t n_lse = size_t(c.batch) * c.hq * c.sq;
    std::vector<uint16_t> h_out(size_t(b.plan.out_elems));
    std::vector<float> h_lse(n_lse);
    FLASH3_CUDA_OK(cudaMemcpy(h_out.data(), ds.out.ptr, h_out.size() * 2, cudaMemcpyDeviceToHost));
    FLASH3_CUDA_OK(cudaMemcpy(h_lse.data(), ds.lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    const std::vector<double> o = extract(h_out, b.plan.o, c.dtype);
    int64_t bad_o = 0, bad_lse = 0;
    for (double x : o) bad_o += !(x == 0.0);
    for (float x : h_lse) bad_lse += !(std::isinf(x) && x < 0);
    EXPECT_EQ(bad_o, 0) << "seqlen_k = 0: " << bad_o << " of " << o.size() << " out elements are not 0";
    EXPECT_EQ(bad_lse, 0) << "seqlen_k = 0: " << bad_lse << " of " << n_lse << " lse values are not -inf";
    EXPECT_EQ(count_clobbered(h_out, {&b.plan.o}), 0);
  }
}

TEST(FwdGpu, EmptySeqlenQIsOk) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  int d = 128, dv = 128;
  pick_built(&dt, &d, &dv);  // an empty problem is valid even without kernels
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 0, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "empty_q";
  FwdBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const flash3::Status st = run_flash3(c, b.plan, ds.out.ptr, ds.lse.as<float>());
  EXPECT_TRUE(st.ok()) << "seqlen_q = 0: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  // Also batch = 0.
  c.batch = 0, c.sq = 16, c.name = "empty_batch";
  ASSERT_TRUE(upload_inputs(c, &b));
  const flash3::Status st2 = run_flash3(c, b.plan, ds.out.ptr, ds.lse.as<float>());
  EXPECT_TRUE(st2.ok()) << "batch = 0: " << st2.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
}

// ===========================================================================
// Determinism: the same call twice gives bitwise-identical out and lse.
// ===========================================================================
TEST(FwdGpu, Deterministic) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  struct S {
    int b, sq, sk, hq, hkv;
    Mask m;
  };
  // Includes decode-like shapes, where a split-KV path would be taken if there is one.
  const S shapes[] = {{2, 1000, 1000, 8, 2, Mask::kCausal},
                      {1, 1, 4096, 8, 1, Mask::kNone},
                      {3, 113, 1023, 4, 1, Mask::kWindow256_256},
                      {1, 4096, 4096, 2, 2, Mask::kNone}};
  for (const S& s : shapes) {
    FwdCase c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
    apply_mask(&c, s.m);
    c.name = "determinism_sq" + std::to_string(s.sq) + "_sk" + std::to_string(s.sk);
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());
    FwdBuffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const flash3::Status s1 = run_flash3(c, b.plan, ds.out.ptr, ds.lse.as<float>());
    ASSERT_TRUE(s1.ok()) << s1.message;
    const flash3::Status s2 = run_flash3(c, b.plan, ds.out2.ptr, ds.lse2.as<float>());
    ASSERT_TRUE(s2.ok()) << s2.message;
    FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
    const size_t n_lse = size_t(c.batch) * c.hq * c.sq;
    std::vector<uint16_t> o1(size_t(b.plan.out_elems)), o2(o1.size());
    std::vector<uint32_t> l1(n_lse), l2(n_lse);
    FLASH3_CUDA_OK(cudaMemcpy(o1.data(), ds.out.ptr, o1.size() * 2, cudaMemcpyDeviceToHost));
    FLASH3_CUDA_OK(cudaMemcpy(o2.data(), ds.out2.ptr, o2.size() * 2, cudaMemcpyDeviceToHost));
    FLASH3_CUDA_OK(cudaMemcpy(l1.data(), ds.lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    FLASH3_CUDA_OK(cudaMemcpy(l2.data(), ds.lse2.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    int64_t diff_o = 0, diff_l = 0, first_o = -1;
    for (size_t i = 0; i < o1.size(); ++i)
      if (o1[i] != o2[i]) {
        if (first_o < 0) first_o = int64_t(i);
        ++diff_o;
      }
    for (size_t i = 0; i < n_lse; ++i) diff_l += l1[i] != l2[i];
    EXPECT_EQ(diff_o, 0) << c.describe() << ": two identical forward calls differ in " << diff_o
                         << " out elements (first at allocation index " << first_o << ")";
    EXPECT_EQ(diff_l, 0) << c.describe() << ": two identical forward calls differ in " << diff_l << " lse values";
  }
}

// ===========================================================================
// Bad pointers: an error Status, no crash, no sticky CUDA error.
// ===========================================================================
TEST(FwdGpu, HostOrMisalignedPointerIsAnError) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  int d = 128, dv = 128;
  const bool built = pick_built(&dt, &d, &dv);
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "bad_pointers";
  FwdBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const FwdPlan& p = b.plan;
  std::vector<uint16_t> host_q(size_t(p.in_elems) + 64, 0x3c00);
  std::vector<uint16_t> host_o(size_t(p.out_elems) + 64, 0);
  std::vector<float> host_lse(size_t(c.batch) * c.hq * c.sq + 64, 0.f);

  struct Bad {
    const char* what;
    void (*mutate)(flash3::ForwardArgs&, void*, void*, void*);
  };
  const Bad bads[] = {
      {"q is a host pointer", [](flash3::ForwardArgs& a, void* hq, void*, void*) { a.q.data = hq; }},
      {"out is a host pointer", [](flash3::ForwardArgs& a, void*, void* ho, void*) { a.out.data = ho; }},
      {"lse is a host pointer", [](flash3::ForwardArgs& a, void*, void*, void* hl) { a.lse.data = hl; }},
      {"q misaligned by one element",
       [](flash3::ForwardArgs& a, void*, void*, void*) { a.q.data = static_cast<uint16_t*>(a.q.data) + 1; }},
      {"v misaligned by one byte",
       [](flash3::ForwardArgs& a, void*, void*, void*) { a.v.data = static_cast<char*>(a.v.data) + 1; }},
      {"out misaligned by 4 elements",
       [](flash3::ForwardArgs& a, void*, void*, void*) { a.out.data = static_cast<uint16_t*>(a.out.data) + 4; }},
      {"lse misaligned by 2 bytes",
       [](flash3::ForwardArgs& a, void*, void*, void*) { a.lse.data = static_cast<char*>(a.lse.data) + 2; }},
  };
  for (const Bad& bad : bads) {
    flash3::ForwardArgs a = make_args(c, p, ds.in.ptr, ds.out.ptr, ds.lse.as<float>());
    bad.mutate(a, host_q.data(), host_o.data(), host_lse.data());
    const flash3::Status st = flash3::forward(a, ds.stream);
    EXPECT_FALSE(st.ok()) << bad.what << ": flash3::forward returned Ok";
    EXPECT_FALSE(st.message.empty()) << bad.what << ": error without a message";
    if (built) {
      EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << bad.what << ": " << st.message;
    }
    EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess) << bad.what;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << bad.what;
  }
  // The host buffers were not touched.
  for (uint16_t x : host_o) ASSERT_EQ(x, 0u) << "flash3 wrote into the host out buffer";
  // And a correct call afterwards still works.
  if (built) check_case(c);
}

// ===========================================================================
// The manifest's variant list and forward_is_built() agree.
// ===========================================================================
TEST(FwdGpu, VariantsFileMatchesIsBuilt) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  bool found = false;
  const std::vector<tu::Variant> vars = tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), &found);
  ASSERT_TRUE(found) << "cannot read " << tu::variants_path(FLASH3_VARIANTS_FILE) << " (set FLASH3_VARIANTS_FILE)";
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (HeadDims h : kAllHeadDims) {
      bool listed = false;
      for (const tu::Variant& v : vars)
        listed |= v.pass == "fwd" && v.dtype == tu::short_dtype(dt) && v.d == h.d && v.dv == h.dv;
      EXPECT_EQ(listed, flash3::forward_is_built(dt, h.d, h.dv))
          << tu::short_dtype(dt) << " " << h.d << "x" << h.dv << ": variants.txt and forward_is_built() disagree";
    }
}

// ===========================================================================
// Windows: 2^31 - 1 and other windows past the sequence are unbounded, negative
// sides too; causal ignores window_right and keeps window_left (gpu_case.h).
// Every built head-dim pair (bf16 where built), each spec against the reference.
// ===========================================================================
// The dtype a head-dim pair runs in: `prefer` when its forward kernel is built,
// else the other one.
bool pick_dtype(HeadDims h, DType prefer, DType* dt) {
  const DType other = prefer == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
  for (DType t : {prefer, other})
    if (flash3::forward_is_built(t, h.d, h.dv)) {
      *dt = t;
      return true;
    }
  return false;
}

class FwdLargeWindows : public ::testing::TestWithParam<HeadDims> {};

TEST_P(FwdLargeWindows, MatchReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  DType dt;
  if (!pick_dtype(h, DType::kBFloat16, &dt)) GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(h);
  for (const WindowSpec& w : large_window_specs()) {
    FwdCase c;
    c.dtype = dt, c.d = h.d, c.dv = h.dv;
    c.batch = 2, c.sq = w.sq, c.sk = w.sk, c.hq = 4, c.hkv = 2;
    c.causal = w.causal, c.wl = w.wl, c.wr = w.wr;
    c.name = std::string("large_window_") + w.name + "_" + head_dims_name(h);
    c.seed = fnv1a(c.name);
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Fwd, FwdLargeWindows, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// Causal with any window_right, or with a window_left past the keys, is plain
// causal: the same call, so bitwise the same out and lse.
TEST(FwdGpu, CausalIgnoresWindowRightBitwise) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  struct W {
    int wl, wr;
  };
  const W windows[] = {{-1, 7}, {-1, 1000}, {-1, kIntMax}, {kIntMax, -1}, {1299, 3}, {-5, -5}};
  for (Seqlens sl : {Seqlens{1000, 1000}, Seqlens{700, 1300}, Seqlens{1300, 700}}) {
    FwdCase c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = sl.sq, c.sk = sl.sk, c.hq = 4, c.hkv = 2;
    c.causal = true;
    c.name = "causal_bitwise_sq" + std::to_string(sl.sq) + "_sk" + std::to_string(sl.sk);
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());
    FwdBuffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const size_t n_lse = size_t(c.batch) * c.hq * c.sq;
    const flash3::Status s0 = run_flash3(c, b.plan, ds.out.ptr, ds.lse.as<float>());
    ASSERT_TRUE(s0.ok()) << s0.message;
    FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
    std::vector<uint16_t> o0(size_t(b.plan.out_elems)), o1(o0.size());
    std::vector<uint32_t> l0(n_lse), l1(n_lse);
    FLASH3_CUDA_OK(cudaMemcpy(o0.data(), ds.out.ptr, o0.size() * 2, cudaMemcpyDeviceToHost));
    FLASH3_CUDA_OK(cudaMemcpy(l0.data(), ds.lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    for (const W& w : windows) {
      if (w.wl >= 0 && w.wl != kIntMax && w.wl < c.sk - 1) continue;  // only windows that cut nothing
      FwdCase cw = c;
      cw.wl = w.wl, cw.wr = w.wr;
      const flash3::Status st = run_flash3(cw, b.plan, ds.out2.ptr, ds.lse2.as<float>());
      ASSERT_TRUE(st.ok()) << cw.describe() << ": " << st.message;
      FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
      FLASH3_CUDA_OK(cudaMemcpy(o1.data(), ds.out2.ptr, o1.size() * 2, cudaMemcpyDeviceToHost));
      FLASH3_CUDA_OK(cudaMemcpy(l1.data(), ds.lse2.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(o0.data(), o1.data(), o0.size() * 2), 0)
          << cw.describe() << ": out differs from plain causal (window (" << w.wl << ", " << w.wr << "))";
      EXPECT_EQ(std::memcmp(l0.data(), l1.data(), n_lse * 4), 0)
          << cw.describe() << ": lse differs from plain causal (window (" << w.wl << ", " << w.wr << "))";
    }
  }
}

// ===========================================================================
// Random windows (FlashAttention's draw: left, right uniform in [0, sk)), per
// built head-dim pair and seqlen pair, in four kinds (gpu_case.h): local, causal
// + local, one side past the sequence, one side unbounded. bf16 and fp16
// alternate over the seqlen pairs.
// ===========================================================================
class FwdRandomWindows : public ::testing::TestWithParam<RandomWindowParam> {};

TEST_P(FwdRandomWindows, MatchReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const auto& [h, sl] = GetParam();
  DType dt;
  if (!pick_dtype(h, random_window_dtype(sl), &dt))
    GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(h);
  if (quick_mode() && sl.sq >= 4096) GTEST_SKIP() << "quick mode (FLASH3_GPU_TESTS_QUICK=1): seqlen 4224 left out";
  for (const FwdCase& c : random_window_cases<FwdCase>(GetParam(), dt, "random_window_")) {
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Fwd, FwdRandomWindows,
                         ::testing::Combine(::testing::ValuesIn(kAllHeadDims),
                                            ::testing::ValuesIn(kRandomWindowSeqlens)),
                         random_window_name);

// ===========================================================================
// softmax_scale is used exactly as given, 0 included (every key of a row gets
// the same weight: out = mean of the visible values, lse = log(#visible)).
// ===========================================================================
TEST(FwdGpu, SoftmaxScaleIsUsedAsGiven) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int ran = check_built_cases(kAllHeadDims, [](DType t, HeadDims h) {
    std::vector<FwdCase> cases;
    for (float scale : {0.3f, 0.f})
      for (Mask m : {Mask::kNone, Mask::kCausal}) {
        FwdCase c;
        c.dtype = t, c.d = h.d, c.dv = h.dv;
        c.batch = 2, c.sq = 300, c.sk = 517, c.hq = 4, c.hkv = 2;
        c.scale = scale;
        apply_mask(&c, m);
        c.name = "scale" + std::string(scale == 0.f ? "0" : "0.3") + "_" + tu::short_dtype(t) + "_" +
                 head_dims_name(h) + "_" + mask_name(m);
        cases.push_back(c);
      }
    return cases;
  });
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward kernel in this build";
}

TEST(FwdGpu, NegativeOrInfiniteSoftmaxScaleIsRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  int d = 128, dv = 128;
  pick_built(&dt, &d, &dv);
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "bad_scale";
  FwdBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  for (float scale : {-1.f, -1e-30f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()}) {
    flash3::ForwardArgs a = make_args(c, b.plan, ds.in.ptr, ds.out.ptr, ds.lse.as<float>());
    a.opts.softmax_scale = scale;
    const flash3::Status st = flash3::forward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "softmax_scale " << scale << ": " << st.message;
    EXPECT_NE(st.message.find("softmax_scale"), std::string::npos) << "softmax_scale " << scale << ": " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ===========================================================================
// The caller's stream: flash3 runs all its work on the stream it is given
// (run_behind_gate in gpu_case.h: the inputs are NaN until the held stream
// restores them and the outputs must stay poisoned while it is held), and the
// result is right once the stream runs.
// ===========================================================================
TEST(FwdGpu, RunsOnTheCallersStream) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  for (Mask m : {Mask::kNone, Mask::kCausal}) {
    FwdCase c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 1000, c.sk = 1000, c.hq = 4, c.hkv = 2;
    apply_mask(&c, m);
    c.name = std::string("callers_stream_") + mask_name(m);
    c.seed = fnv1a(c.name);
    const FwdPlan p = make_plan(c);
    DeviceState& ds = dev();
    check_case(c, [&](const flash3::ForwardArgs& a) {
      return run_behind_gate(
          ds.stream, [&](cudaStream_t s) { return flash3::forward(a, s); },
          {{ds.in.ptr, size_t(p.in_elems) * 2, "q/k/v"}},
          {{ds.out.ptr, size_t(p.out_elems) * 2, "out"}, {ds.lse.ptr, size_t(p.lse_elems) * 4, "lse"}});
    });
    if (HasFatalFailure()) return;
  }
}

// ===========================================================================
// Error paths.
// ===========================================================================
// A CUDA error the caller left pending (an unrelated failed launch) is not this
// call's error: the call succeeds, its result is right and the error is still
// pending afterwards.
TEST(FwdGpu, PendingCudaErrorDoesNotFailTheCall) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 300, c.sk = 400, c.hq = 4, c.hkv = 2;
  c.causal = true;
  c.name = "pending_cuda_error";
  c.seed = fnv1a(c.name);
  check_case(c, [](const flash3::ForwardArgs& a) {
    return call_with_pending_error([&] { return flash3::forward(a, dev().stream); }, dev().stream);
  });
}

// lse with a shape but no data is a mistake, not "lse absent" (a default view is).
TEST(FwdGpu, LseWithShapeButNoDataIsAnError) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "lse_null_data";
  FwdBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  flash3::ForwardArgs a = make_args(c, b.plan, ds.in.ptr, ds.out.ptr, ds.lse.as<float>());
  a.lse.data = nullptr;
  const flash3::Status st = flash3::forward(a, ds.stream);
  EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "lse (2, 2, 64) with data = null: " << st.message;
  a.lse = TensorView{};
  const flash3::Status absent = flash3::forward(a, ds.stream);
  EXPECT_TRUE(absent.ok()) << "lse absent (default view): " << absent.message;
  EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A stream of another device cannot order work on this one.
TEST(FwdGpu, StreamOfAnotherDeviceIsRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int n = 0;
  FLASH3_CUDA_OK(cudaGetDeviceCount(&n));
  if (n < 2) GTEST_SKIP() << "one GPU: a stream of another device needs two";
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "other_device_stream";
  FwdBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const flash3::ForwardArgs a = make_args(c, b.plan, ds.in.ptr, ds.out.ptr, ds.lse.as<float>());
  expect_other_device_stream_rejected([&](cudaStream_t s) { return flash3::forward(a, s); });
}

// Outputs that alias an input, or each other, are rejected before any launch.
TEST(FwdGpu, OutputAliasingIsRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  if (d != dv) GTEST_SKIP() << "needs a built d == dv variant (out shaped like q and k)";
  FwdCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 128, c.sk = 128, c.hq = 4, c.hkv = 4;
  c.name = "aliasing";
  FwdBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  struct Alias {
    const char* what;
    void (*mutate)(flash3::ForwardArgs&);
  };
  const Alias aliases[] = {
      {"out == k (same shape and strides)", [](flash3::ForwardArgs& a) { a.out.data = a.k.data; }},
      {"out == q (same shape and strides)", [](flash3::ForwardArgs& a) { a.out.data = a.q.data; }},
      {"out == v, second row on", [](flash3::ForwardArgs& a) {
         a.out.data = static_cast<uint16_t*>(a.v.data) + a.v.stride[1];
         a.out.shape[1] -= 1;
         a.q.shape[1] -= 1;
         a.lse.shape[2] -= 1;
       }},
      {"lse inside out", [](flash3::ForwardArgs& a) { a.lse.data = a.out.data; }},
  };
  for (const Alias& al : aliases) {
    flash3::ForwardArgs a = make_args(c, b.plan, ds.in.ptr, ds.out.ptr, ds.lse.as<float>());
    al.mutate(a);
    const flash3::Status st = flash3::forward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << al.what << ": " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ===========================================================================
// Softcap: opts.softcap > 0 caps the scaled scores, s -> softcap * tanh(s /
// softcap), before the mask and the softmax (LSE of the capped scores). The
// softcap kernels are units of their own (FLASH3_FEATURES): a (dtype, head
// dims) pair runs here only where variants.txt lists its "fwd ... softcap"
// unit (and the plain kernel is built). Checked like every other case against
// the fp32 GPU reference (which applies the same cap) under the tolerance rule.
// ===========================================================================
struct SoftcapShape {
  const char* tag;
  int b, sq, sk, hq, hkv;
  Layout layout;  // kPackedQKV falls back to kContiguous where d != dv
  float scale;    // NaN: 1/sqrt(d)
};
// sq not a multiple of 64, sk not a multiple of any tile, sq > sk (causal: fully
// masked rows), decode-like, several KV blocks; MHA, GQA, MQA; default and
// explicit softmax_scale (1.0: scores of std ~sqrt(d), where every cap bites).
constexpr SoftcapShape kSoftcapShapes[] = {
    {"sq128_sk128_mha2x2", 2, 128, 128, 2, 2, Layout::kPackedQKV, kNaN},
    {"sq113_sk203_mqa4x1", 2, 113, 203, 4, 1, Layout::kPadded, 0.3f},
    {"sq300_sk177_gqa4x2", 1, 300, 177, 4, 2, Layout::kContiguous, kNaN},
    {"sq1_sk257_mqa4x1", 2, 1, 257, 4, 1, Layout::kContiguous, 1.f},
    {"sq257_sk1100_gqa4x2", 1, 257, 1100, 4, 2, Layout::kPadded, 1.f},
};

// The softcap cases of one (dtype, head dims) pair. full: every mask x shape
// (15) plus softmax_scale 0 (uniform attention); else the 5 of them with shape
// index % 3 == mask index. The cap cycles so that every mask sees every cap.
std::vector<FwdCase> softcap_cases(DType dt, HeadDims h, bool full) {
  std::vector<FwdCase> out;
  constexpr int kShapes = int(sizeof(kSoftcapShapes) / sizeof(kSoftcapShapes[0]));
  for (int m = 0; m < 3; ++m)
    for (int si = 0; si < kShapes; ++si) {
      if (!full && si % 3 != m) continue;
      const SoftcapShape& s = kSoftcapShapes[si];
      const SoftcapMask& mk = kSoftcapMasks[m];
      FwdCase c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv;
      c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
      c.causal = mk.causal, c.wl = mk.wl, c.wr = mk.wr;
      c.layout = s.layout == Layout::kPackedQKV && (h.d != h.dv || s.hq != s.hkv || s.sq != s.sk) ? Layout::kContiguous
                                                                                                   : s.layout;
      c.scale = s.scale;
      c.softcap = kSoftcaps[(m + si) % 3];
      c.name = "softcap" + num_name(c.softcap) + "_" + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + mk.name +
               "_" + s.tag + (std::isnan(s.scale) ? "" : "_scale" + num_name(s.scale));
      c.seed = fnv1a(c.name);
      out.push_back(c);
    }
  if (full) {  // softmax_scale 0: every capped score is 0, out = mean of the visible values
    FwdCase c;
    c.dtype = dt, c.d = h.d, c.dv = h.dv;
    c.batch = 2, c.sq = 300, c.sk = 177, c.hq = 4, c.hkv = 2;
    c.causal = true;
    c.scale = 0.f;
    c.softcap = 5.f;
    c.name = "softcap5_" + std::string(tu::short_dtype(dt)) + "_" + head_dims_name(h) + "_causal_scale0";
    c.seed = fnv1a(c.name);
    out.push_back(c);
  }
  return out;
}

// Every head-dim pair: bf16 (fp16 where bf16 has no softcap unit) with every
// case, then the other dtype, where built, with the reduced set.
class SoftcapFwdHeadDims : public ::testing::TestWithParam<HeadDims> {};

TEST_P(SoftcapFwdHeadDims, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return softcap_built(dt, h, false); },
                                [&](DType dt, bool full) { return softcap_cases(dt, h, full); },
                                [](const FwdCase& c) { check_case(c); });
  ::testing::Test::RecordProperty("cases", std::to_string(ran));
  if (ran == 0)
    GTEST_SKIP() << "not built: no forward softcap kernel " << head_dims_name(h) << " (FLASH3_FEATURES / FLASH3_HDIMS)";
}

INSTANTIATE_TEST_SUITE_P(Softcap, SoftcapFwdHeadDims, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

}  // namespace
