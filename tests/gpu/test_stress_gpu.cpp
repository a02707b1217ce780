// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Race stress of flash3::forward and flash3::backward (default, non-deterministic
// mode): one problem that fills the GPU (4 x 16 heads x 2048 tokens: 512 tiles
// of 128 rows, several waves on 132 SMs) runs 1000 times on the same inputs.
// out and lse of every forward, and dK and dV of every backward, must be
// bitwise equal to the first run's (their sums have a fixed order; only dQ is
// accumulated with atomics in this mode, so it may differ in the last bits). A
// race between warps, warpgroups or CTAs that only bites now and then shows up
// as a differing run. Outputs are poisoned (NaN) before every run and the first
// run is checked against the fp32 GPU reference under the tolerance rule, so
// "equal" cannot mean "equally unwritten". Comparisons run on the device.
//
// Named Stress.* so a quick run can filter them out; about 1-2 s each on an H200.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

constexpr int kRuns = 1000;

struct StressShape {
  int batch, seqlen, heads, d;
  bool causal;
};

::testing::AssertionResult cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
}

std::vector<uint16_t> fetch16(const tu::DeviceBuffer& b, size_t n) {
  std::vector<uint16_t> h(n);
  cudaMemcpy(h.data(), b.ptr, n * 2, cudaMemcpyDeviceToHost);
  return h;
}
std::vector<double> fetch_f32(const tu::DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), b.ptr, n * 4, cudaMemcpyDeviceToHost);
  return to_double(h);
}
std::vector<double> halves(const std::vector<uint16_t>& h, DType dt) {
  std::vector<double> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = tu::half_bits_to_float(dt, h[i]);
  return out;
}

void run_stress(const StressShape& sh) {
  DType dt = DType::kBFloat16;
  bool built = false;
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    if (!built && flash3::forward_is_built(t, sh.d, sh.d) && flash3::backward_is_built(t, sh.d, sh.d)) {
      dt = t;
      built = true;
    }
  if (!built) GTEST_SKIP() << "not built: no forward + backward kernel " << sh.d << "x" << sh.d;
  const int64_t b = sh.batch, s = sh.seqlen, h = sh.heads, d = sh.d;
  const int64_t n = b * s * h * d, n_lse = b * h * s;
  std::ostringstream what;
  what << tu::short_dtype(dt) << " b=" << b << " s=" << s << " h=" << h << " d=" << d << " causal=" << sh.causal;
  SCOPED_TRACE(what.str());

  cudaStream_t st = nullptr;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream"));
  struct StreamOwner {
    cudaStream_t s;
    ~StreamOwner() {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  } owner{st};

  tu::DeviceBuffer q, k, v, dout, out0, lse0, out, lse, dq0, dk0, dv0, dq, dk, dv, counts;
  for (auto [buf, bytes] : {std::pair{&q, n * 2}, std::pair{&k, n * 2}, std::pair{&v, n * 2}, std::pair{&dout, n * 2},
                            std::pair{&out0, n * 2}, std::pair{&out, n * 2}, std::pair{&lse0, n_lse * 4},
                            std::pair{&lse, n_lse * 4}, std::pair{&dq0, n * 2}, std::pair{&dk0, n * 2},
                            std::pair{&dv0, n * 2}, std::pair{&dq, n * 2}, std::pair{&dk, n * 2},
                            std::pair{&dv, n * 2}, std::pair{&counts, int64_t(kRuns) * 4 * 8}})
    ASSERT_TRUE(cuda_ok(buf->reserve(static_cast<size_t>(bytes)), "cudaMalloc"));
  const uint64_t seed = fnv1a(what.str());
  ASSERT_TRUE(cuda_ok(fill_normal_device(q.ptr, n, dt, seed + 1, st), "fill q"));
  ASSERT_TRUE(cuda_ok(fill_normal_device(k.ptr, n, dt, seed + 2, st), "fill k"));
  ASSERT_TRUE(cuda_ok(fill_normal_device(v.ptr, n, dt, seed + 3, st), "fill v"));
  ASSERT_TRUE(cuda_ok(fill_normal_device(dout.ptr, n, dt, seed + 4, st), "fill dout"));
  ASSERT_TRUE(cuda_ok(cudaMemsetAsync(counts.ptr, 0, counts.bytes, st), "zero counters"));

  auto view = [&](const tu::DeviceBuffer& buf) {
    return TensorView::make4d(buf.ptr, dt, b, s, h, d, s * h * d, h * d, d, 1);
  };
  auto lse_view = [&](const tu::DeviceBuffer& buf) {
    return TensorView::make3d(buf.ptr, DType::kFloat32, b, h, s, h * s, s, 1);
  };
  flash3::ForwardArgs fa;
  fa.q = view(q), fa.k = view(k), fa.v = view(v);
  fa.opts.causal = sh.causal;
  flash3::BackwardArgs ba;
  ba.q = view(q), ba.k = view(k), ba.v = view(v), ba.dout = view(dout);
  ba.out = view(out0), ba.lse = lse_view(lse0);
  ba.opts.causal = sh.causal;
  ASSERT_FALSE(ba.opts.deterministic) << "the stress runs the default (atomic dQ) mode";

  const auto t0 = std::chrono::steady_clock::now();
  for (int run = 0; run < kRuns; ++run) {
    const bool first = run == 0;
    tu::DeviceBuffer& o = first ? out0 : out;
    tu::DeviceBuffer& l = first ? lse0 : lse;
    ASSERT_TRUE(cuda_ok(cudaMemsetAsync(o.ptr, 0xff, size_t(n) * 2, st), "poison out"));
    ASSERT_TRUE(cuda_ok(cudaMemsetAsync(l.ptr, 0xff, size_t(n_lse) * 4, st), "poison lse"));
    fa.out = view(o), fa.lse = lse_view(l);
    const flash3::Status fs = flash3::forward(fa, st);
    ASSERT_TRUE(fs.ok()) << "run " << run << ": forward: " << fs.message;
    tu::DeviceBuffer& gq = first ? dq0 : dq;
    tu::DeviceBuffer& gk = first ? dk0 : dk;
    tu::DeviceBuffer& gv = first ? dv0 : dv;
    for (tu::DeviceBuffer* g : {&gq, &gk, &gv})
      ASSERT_TRUE(cuda_ok(cudaMemsetAsync(g->ptr, 0xff, size_t(n) * 2, st), "poison gradients"));
    ba.dq = view(gq), ba.dk = view(gk), ba.dv = view(gv);
    const flash3::Status bs = flash3::backward(ba, st);  // always on run 0's out / lse: the same inputs
    ASSERT_TRUE(bs.ok()) << "run " << run << ": backward: " << bs.message;
    if (first) continue;
    auto* c = counts.as<unsigned long long>() + int64_t(run) * 4;
    ASSERT_TRUE(cuda_ok(count_mismatches(out.ptr, out0.ptr, n, 2, c + 0, st), "compare out"));
    ASSERT_TRUE(cuda_ok(count_mismatches(lse.ptr, lse0.ptr, n_lse, 4, c + 1, st), "compare lse"));
    ASSERT_TRUE(cuda_ok(count_mismatches(dk.ptr, dk0.ptr, n, 2, c + 2, st), "compare dk"));
    ASSERT_TRUE(cuda_ok(count_mismatches(dv.ptr, dv0.ptr, n, 2, c + 3, st), "compare dv"));
  }
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "runs"));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::testing::Test::RecordProperty("seconds", std::to_string(secs));

  std::vector<unsigned long long> hc(size_t(kRuns) * 4);
  ASSERT_TRUE(cuda_ok(cudaMemcpy(hc.data(), counts.ptr, hc.size() * 8, cudaMemcpyDeviceToHost), "counters"));
  const char* names[4] = {"out", "lse", "dK", "dV"};
  for (int w = 0; w < 4; ++w) {
    int bad_runs = 0, first_bad = -1;
    unsigned long long worst = 0;
    for (int run = 1; run < kRuns; ++run) {
      const unsigned long long x = hc[size_t(run) * 4 + w];
      if (x == 0) continue;
      if (first_bad < 0) first_bad = run;
      ++bad_runs;
      worst = std::max(worst, x);
    }
    EXPECT_EQ(bad_runs, 0) << names[w] << " differs from run 0 in " << bad_runs << " of " << kRuns - 1
                           << " runs (first: run " << first_bad << "; up to " << worst << " elements)";
  }

  // Run 0 is right (so bitwise equality means equally right).
  flash3::gpuref::Args ra;
  ra.dtype = dt, ra.batch = int(b), ra.seqlen_q = ra.seqlen_k = int(s), ra.heads_q = ra.heads_kv = int(h);
  ra.head_dim = ra.head_dim_v = int(d);
  auto s16 = [&](const tu::DeviceBuffer& buf) {
    flash3::gpuref::Strided16 t;
    t.data = buf.ptr, t.batch_stride = s * h * d, t.row_stride = h * d, t.head_stride = d;
    return t;
  };
  ra.q = s16(q), ra.k = s16(k), ra.v = s16(v);
  ra.causal = sh.causal;
  tu::DeviceBuffer ref_o, ref_l, low_o, low_l;
  for (tu::DeviceBuffer* x : {&ref_o, &low_o}) ASSERT_TRUE(cuda_ok(x->reserve(size_t(n) * 4), "alloc"));
  for (tu::DeviceBuffer* x : {&ref_l, &low_l}) ASSERT_TRUE(cuda_ok(x->reserve(size_t(n_lse) * 4), "alloc"));
  flash3::gpuref::Args la = ra;
  ra.out = ref_o.as<float>(), ra.lse = ref_l.as<float>();
  la.out = low_o.as<float>(), la.lse = low_l.as<float>();
  ASSERT_TRUE(cuda_ok(flash3::gpuref::forward(ra, flash3::gpuref::Mode::kFloat32, st), "gpuref forward"));
  ASSERT_TRUE(cuda_ok(flash3::gpuref::forward(la, flash3::gpuref::Mode::kLowPrecision, st), "gpuref forward"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "gpuref forward"));
  auto nowhere = [](size_t i) { return "index " + std::to_string(i); };
  {
    const Verdict vo = judge("O", halves(fetch16(out0, size_t(n)), dt), fetch_f32(ref_o, size_t(n)),
                             fetch_f32(low_o, size_t(n)), 1e-5, nowhere);
    EXPECT_TRUE(vo.ok) << vo.text;
    std::vector<float> l0(static_cast<size_t>(n_lse));
    cudaMemcpy(l0.data(), lse0.ptr, l0.size() * 4, cudaMemcpyDeviceToHost);
    const Verdict vl = judge("LSE", to_double(l0), fetch_f32(ref_l, size_t(n_lse)), fetch_f32(low_l, size_t(n_lse)),
                             1e-5, nowhere);
    EXPECT_TRUE(vl.ok) << vl.text;
  }
  flash3::gpuref::BwdArgs rb;
  rb.dtype = dt, rb.batch = int(b), rb.seqlen_q = rb.seqlen_k = int(s), rb.heads_q = rb.heads_kv = int(h);
  rb.head_dim = rb.head_dim_v = int(d);
  rb.q = s16(q), rb.k = s16(k), rb.v = s16(v), rb.dout = s16(dout);
  rb.causal = sh.causal;
  tu::DeviceBuffer g[6];
  for (tu::DeviceBuffer& x : g) ASSERT_TRUE(cuda_ok(x.reserve(size_t(n) * 4), "alloc"));
  flash3::gpuref::BwdArgs lb = rb;
  rb.dq = g[0].as<float>(), rb.dk = g[1].as<float>(), rb.dv = g[2].as<float>();
  lb.dq = g[3].as<float>(), lb.dk = g[4].as<float>(), lb.dv = g[5].as<float>();
  ASSERT_TRUE(cuda_ok(flash3::gpuref::backward(rb, flash3::gpuref::Mode::kFloat32, st), "gpuref backward"));
  ASSERT_TRUE(cuda_ok(flash3::gpuref::backward(lb, flash3::gpuref::Mode::kLowPrecision, st), "gpuref backward"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "gpuref backward"));
  const tu::DeviceBuffer* ours[3] = {&dq0, &dk0, &dv0};
  const char* gnames[3] = {"dQ", "dK", "dV"};
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> ref = fetch_f32(g[i], size_t(n));
    const Verdict vg = judge(gnames[i], halves(fetch16(*ours[i], size_t(n)), dt), ref, fetch_f32(g[i + 3], size_t(n)),
                             grad_eps(ref, dt), nowhere);
    EXPECT_TRUE(vg.ok) << vg.text;
  }
}

TEST(Stress, RepeatedRunsBitwiseEqualD128) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  run_stress({4, 2048, 16, 128, false});
}

TEST(Stress, RepeatedRunsBitwiseEqualD64Causal) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  run_stress({4, 2048, 16, 64, true});
}

}  // namespace
