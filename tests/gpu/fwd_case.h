// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The fixed-length forward check, shared by test_fwd_gpu.cpp and
// test_packgqa_gpu.cpp: a case, its memory plan, the flash3 and GPU-reference
// arguments, and one run judged against the fp32 GPU reference under the
// FlashAttention tolerance rule (flash3::ref::check_close)
//     max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// O and LSE separately, with nothing written outside the out / lse views.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_case.h"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"

namespace flash3::gputest {

constexpr double kEpsO = 1e-5;
constexpr double kEpsLse = 1e-5;

// Rows of poison after each batch element's out / lse rows (and after varlen's
// last row) in the cases that look for stores outside the problem: more than
// a packed tile's worth of query rows (tile_m <= 192).
constexpr int kGapRows = 192;

// FixedCase (gpu_case.h) and the forward's own options.
struct FwdCase : FixedCase {
  int pack_gqa = -1;  // opts.pack_gqa; -1 (the API's default): the launch decides
  int gap_rows = 0;   // > 0: out (padded) and lse rows of each batch element followed by this many rows of poison

  std::string describe() const {
    std::ostringstream os;
    describe_problem(os);
    if (pack_gqa != -1) os << " pack_gqa=" << pack_gqa;
    os << " layout=" << layout_name(layout);
    if (gap_rows > 0) os << " gap_rows=" << gap_rows;
    os << " seed=" << seed << "]";
    return os.str();
  }
};

// q / k / v in one allocation; out (b, sq, hq, dv) and lse (b, hq, sq) in their
// own, each followed by at least kGuard poisoned elements.
struct FwdPlan {
  View q, k, v, o;
  int64_t in_elems = 0, out_elems = 0;
  int64_t lse_sh = 0, lse_sb = 0, lse_elems = 0;  // lse head / batch strides, allocation (floats)
};

inline FwdPlan make_plan(const FwdCase& c) {
  FwdPlan p;
  const QKV in = make_qkv(c.layout, c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.dv);
  p.q = in.q, p.k = in.k, p.v = in.v;
  p.in_elems = in.elems;
  const int64_t sq1 = std::max(c.sq, 1);
  if (c.gap_rows > 0) {
    p.o = padded_view(0, c.batch, c.sq, c.hq, c.dv);
    p.o.sb = (sq1 + c.gap_rows) * p.o.sr;
  } else {
    p.o = c.layout == Layout::kPadded ? padded_view(0, c.batch, c.sq, c.hq, c.dv)
                                      : dense_view(0, c.batch, c.sq, c.hq, c.dv);
  }
  p.out_elems = p.o.span() + std::max<int64_t>(kGuard, int64_t(c.gap_rows) * p.o.sr);
  p.lse_sh = sq1 + c.gap_rows;
  p.lse_sb = c.hq * p.lse_sh;
  // The rows the view spans (none for sq = 0), then the guard.
  p.lse_elems = int64_t(c.batch) * c.hq * (c.sq + c.gap_rows) + std::max<int64_t>(kGuard, c.gap_rows);
  return p;
}

inline flash3::ForwardArgs make_args(const FwdCase& c, const FwdPlan& p, void* in, void* out, float* lse) {
  flash3::ForwardArgs a;
  auto view4 = [&](void* base, const View& v) {
    return TensorView::make4d(elem16(base, v.offset), c.dtype, v.b, v.s, v.h, v.d, v.sb, v.sr, v.sh, 1);
  };
  a.q = view4(in, p.q);
  a.k = view4(in, p.k);
  a.v = view4(in, p.v);
  a.out = view4(out, p.o);
  a.lse = TensorView::make3d(lse, DType::kFloat32, c.batch, c.hq, c.sq, p.lse_sb, p.lse_sh, 1);
  set_mask_and_scale(c, &a.opts);
  a.opts.pack_gqa = c.pack_gqa;
  return a;
}

inline flash3::gpuref::Args make_ref_args(const FwdCase& c, const FwdPlan& p, const void* in, float* out, float* lse) {
  flash3::gpuref::Args r;
  set_ref_problem(c, &r);
  r.q = strided16(in, p.q);
  r.k = strided16(in, p.k);
  r.v = strided16(in, p.v);
  r.out = out;
  r.lse = lse;
  return r;
}

// Dense index i of o (b, sq, hq, dv) / lse (b, hq, sq) as coordinates.
inline std::string where_o(const FwdCase& c, size_t i) {
  const int64_t dv = c.dv, hq = c.hq, sq = c.sq;
  std::ostringstream os;
  os << "(b=" << int64_t(i) / (dv * hq * sq) << ", s=" << (int64_t(i) / (dv * hq)) % sq
     << ", h=" << (int64_t(i) / dv) % hq << ", c=" << int64_t(i) % dv << ")";
  return os.str();
}
inline std::string where_lse(const FwdCase& c, size_t i) {
  std::ostringstream os;
  os << "(b=" << int64_t(i) / (int64_t(c.hq) * c.sq) << ", h=" << (int64_t(i) / c.sq) % c.hq
     << ", s=" << int64_t(i) % c.sq << ")";
  return os.str();
}

// The buffers of a forward check. Each test file derives its device state
// (gpu_case.h's device_state) from this, adding buffers of its own.
struct FwdDevice {
  cudaStream_t stream = nullptr;
  tu::DeviceBuffer in, out, lse, ref_o, ref_lse, low_o, low_lse;
};

// The fp32 GPU reference and its emulation of a plain bf16 / fp16
// implementation, as doubles: o (b, sq, hq, dv), lse (b, hq, sq).
struct RefOutputs {
  std::vector<double> o, lse, low_o, low_lse;
};

// Runs both references of `ra` (its out / lse are set here, to d's reference
// buffers) on d.stream and downloads them.
inline ::testing::AssertionResult run_gpu_reference(flash3::gpuref::Args ra, FwdDevice& d, RefOutputs* r) {
  const size_t n_o = size_t(ra.batch) * ra.seqlen_q * ra.heads_q * ra.head_dim_v;
  const size_t n_lse = size_t(ra.batch) * ra.heads_q * ra.seqlen_q;
  const size_t o_bytes = std::max<size_t>(n_o, 1) * 4, lse_bytes = std::max<size_t>(n_lse, 1) * 4;
  const ::testing::AssertionResult rs =
      reserve_all({{&d.ref_o, o_bytes}, {&d.low_o, o_bytes}, {&d.ref_lse, lse_bytes}, {&d.low_lse, lse_bytes}});
  if (!rs) return rs;
  flash3::gpuref::Args la = ra;
  ra.out = d.ref_o.as<float>(), ra.lse = d.ref_lse.as<float>();
  la.out = d.low_o.as<float>(), la.lse = d.low_lse.as<float>();
  cudaError_t e = flash3::gpuref::forward(ra, flash3::gpuref::Mode::kFloat32, d.stream);
  if (e == cudaSuccess) e = flash3::gpuref::forward(la, flash3::gpuref::Mode::kLowPrecision, d.stream);
  std::vector<float> fo(n_o), fl(n_lse), lo(n_o), ll(n_lse);
  if (e == cudaSuccess) e = cudaMemcpyAsync(fo.data(), d.ref_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(lo.data(), d.low_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(fl.data(), d.ref_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(ll.data(), d.low_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "GPU reference: " << cudaGetErrorString(e);
  r->o = to_double(fo), r->low_o = to_double(lo), r->lse = to_double(fl), r->low_lse = to_double(ll);
  return ::testing::AssertionSuccess();
}

struct FwdBuffers {
  FwdPlan plan;
  std::vector<uint16_t> host_in;  // what d.in holds
};

// Plans c, reserves d's buffers (in, out, lse and the references'), fills
// q / k / v with fresh random normals seeded by the case and copies them up
// (synchronously).
inline ::testing::AssertionResult upload_fwd_inputs(FwdDevice& d, const FwdCase& c, FwdBuffers* b) {
  b->plan = make_plan(c);
  const FwdPlan& p = b->plan;
  const size_t ref_o_bytes = std::max<size_t>(size_t(c.batch) * c.sq * c.hq * c.dv, 1) * 4;
  const size_t ref_lse_bytes = std::max<size_t>(size_t(c.batch) * c.hq * c.sq, 1) * 4;
  const ::testing::AssertionResult r = reserve_all(
      {{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2}, {&d.lse, size_t(p.lse_elems) * 4},
       {&d.ref_o, ref_o_bytes}, {&d.low_o, ref_o_bytes}, {&d.ref_lse, ref_lse_bytes}, {&d.low_lse, ref_lse_bytes}});
  if (!r) return r;
  b->host_in.assign(size_t(p.in_elems), 0);
  tu::fill_normal(b->host_in.data(), b->host_in.size(), c.dtype, c.seed);
  cudaError_t e = cudaMemcpyAsync(d.in.ptr, b->host_in.data(), b->host_in.size() * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "upload: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// How a test calls flash3::forward on prepared arguments. Empty: on the test
// stream. Otherwise the call may use any stream, but must leave no work of its
// own pending on a stream other than the test stream when it returns.
using ForwardCall = std::function<flash3::Status(const flash3::ForwardArgs&)>;

// Poisons out / lse (with what follows them in their allocations), runs
// flash3::forward on them with d.in's inputs. Returns the status.
inline flash3::Status run_forward(FwdDevice& d, const FwdCase& c, const FwdPlan& p, void* out, float* lse,
                                  const ForwardCall& call = {}) {
  cudaMemsetAsync(out, 0xff, size_t(p.out_elems) * 2, d.stream);
  cudaMemsetAsync(lse, 0xff, size_t(p.lse_elems) * 4, d.stream);
  const flash3::ForwardArgs args = make_args(c, p, d.in.ptr, out, lse);
  if (!call) return flash3::forward(args, d.stream);
  cudaStreamSynchronize(d.stream);  // the poison is in place whatever stream `call` uses
  return call(args);
}

// A checked result, dense (o (b, sq, hq, dv), lse (b, hq, sq)), with the
// tolerance baselines, for comparing two flash3 results of the same inputs.
struct FwdOutcome {
  std::vector<double> o, lse;
  double o_base = 0, lse_base = 0;
};

// The checks of one downloaded result (the whole out and lse allocations, lse
// as bits): nothing written outside the out and lse views, O and LSE against
// the reference. Returns the result dense, with its baselines; `record` adds
// the errors and baselines as test properties.
inline FwdOutcome judge_fwd_result(const FwdCase& c, const FwdPlan& p, const RefOutputs& ref,
                                   const std::vector<uint16_t>& h_out, const std::vector<uint32_t>& h_lse,
                                   bool record) {
  const int64_t clobbered = count_clobbered(h_out, {&p.o});
  EXPECT_EQ(clobbered, 0) << c.describe() << ": flash3 wrote " << clobbered
                          << " elements of the out allocation outside the (b, sq, hq, dv) view";
  std::vector<double> lse(size_t(c.batch) * c.hq * c.sq);
  std::vector<uint8_t> inside(h_lse.size(), 0);
  for (int64_t ib = 0; ib < c.batch; ++ib)
    for (int64_t ih = 0; ih < c.hq; ++ih)
      for (int64_t is = 0; is < c.sq; ++is) {
        const size_t at = size_t(ib * p.lse_sb + ih * p.lse_sh + is);
        inside[at] = 1;
        lse[size_t((ib * c.hq + ih) * c.sq + is)] = tu::bits_f32(h_lse[at]);
      }
  int64_t lse_outside = 0;
  for (size_t i = 0; i < h_lse.size(); ++i) lse_outside += !inside[i] && h_lse[i] != kPoison32;
  EXPECT_EQ(lse_outside, 0) << c.describe() << ": flash3 wrote " << lse_outside
                            << " floats of the lse allocation outside the (b, hq, sq) view";

  std::vector<double> o = extract(h_out, p.o, c.dtype);
  const Verdict vo = judge("O", o, ref.o, ref.low_o, kEpsO, [&](size_t i) { return where_o(c, i); }, tol_factor(c));
  if (record) {
    ::testing::Test::RecordProperty("o_err", std::to_string(vo.r.err));
    ::testing::Test::RecordProperty("o_baseline", std::to_string(vo.r.base_err));
  }
  EXPECT_TRUE(vo.ok) << c.describe() << "\n  " << vo.text;
  const Verdict vl =
      judge("LSE", lse, ref.lse, ref.low_lse, kEpsLse, [&](size_t i) { return where_lse(c, i); }, tol_factor(c));
  if (record) {
    ::testing::Test::RecordProperty("lse_err", std::to_string(vl.r.err));
    ::testing::Test::RecordProperty("lse_baseline", std::to_string(vl.r.base_err));
  }
  EXPECT_TRUE(vl.ok) << c.describe() << "\n  " << vl.text;
  FwdOutcome got;
  got.o = std::move(o);
  got.lse = std::move(lse);
  got.o_base = vo.r.base_err;
  got.lse_base = vl.r.base_err;
  return got;
}

// Full check of one case: inputs from the case's seed, out / lse poisoned,
// flash3::forward (through `call` if given), nothing written outside the out
// and lse views (padding, gaps, guards), O and LSE against the fp32 GPU
// reference (baseline: its emulation of a plain bf16 / fp16 implementation).
inline void check_fwd_case(FwdDevice& d, const FwdCase& c, const ForwardCall& call = {},
                           FwdOutcome* outcome = nullptr) {
  SCOPED_TRACE(c.describe());
  FwdBuffers b;
  ASSERT_TRUE(upload_fwd_inputs(d, c, &b));
  const FwdPlan& p = b.plan;

  const flash3::Status st = run_forward(d, c, p, d.out.ptr, d.lse.as<float>(), call);
  ASSERT_TRUE(st.ok()) << c.describe() << ": flash3::forward failed: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
  FLASH3_CUDA_OK(cudaGetLastError());

  RefOutputs ref;
  ASSERT_TRUE(run_gpu_reference(make_ref_args(c, p, d.in.ptr, nullptr, nullptr), d, &ref));

  std::vector<uint16_t> h_out(size_t(p.out_elems));
  std::vector<uint32_t> h_lse(size_t(p.lse_elems));
  FLASH3_CUDA_OK(cudaMemcpy(h_out.data(), d.out.ptr, h_out.size() * 2, cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(h_lse.data(), d.lse.ptr, h_lse.size() * 4, cudaMemcpyDeviceToHost));

  FwdOutcome got = judge_fwd_result(c, p, ref, h_out, h_lse, true);
  if (outcome != nullptr) *outcome = std::move(got);
}

}  // namespace flash3::gputest
