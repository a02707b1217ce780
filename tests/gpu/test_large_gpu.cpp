// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Problems at the limits of 32-bit indexing and of the launch grid.
//
// Large64.*: tensors of more than 2^31 elements. Every element offset past 2^31
// must be computed in 64 bits (a 32-bit product wraps and reads or writes
// another batch element, or out of bounds). K and V are (32, sk, 8, d) with
// sk = 2^24 / d (d = 128: 131072 keys), i.e. 2^32 elements each (8.6 GB in
// bf16): batch element 16 starts at element 2^31 exactly and batch element 31
// near 2^32. They are filled on the device by a counter-based random kernel.
//   Forward: q (32, 4, 64, d) (GQA 64:8), unmasked: every key of every batch
//     element is read.
//   Backward: q (32, 16, 64, d), causal with window_left 63 (each query sees 64
//     keys, so the gradients are O(1)): dK / dV (2^32 elements each) must be
//     exactly zero for the keys no query sees, in every batch element (counted
//     on the device), and right for the last 128 keys (the reference runs on
//     those keys alone: the keys before them are seen by no query, so they
//     change nothing).
// Each skips when the device lacks the memory (about 19 GB forward, 36 GB
// backward at d = 128).
//
// LargeBatch.*: 70000 batch elements of a short problem, more than a launch
// grid dimension holds (65535): no output may stay unwritten (no NaN left of
// the poison anywhere), and the batch elements around the 65535 boundary and
// the last one are right.
//
// The checked batch elements are copied back and compared with the float64
// CPU reference computed on just their slice, under the tolerance rule (the
// baseline is the GPU low-precision emulation on the same slice). A few
// seconds each on an H200 (mostly the CPU reference and host copies); the
// names let a quick run filter them out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "reference/reference.h"

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

::testing::AssertionResult cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
}

// First built variant, d = 128 preferred; with its backward too when `bwd`.
bool pick(bool bwd, DType* dt, HeadDims* hd) {
  const HeadDims prefs[] = {{128, 128}, {64, 64}, {256, 256}, {96, 96}, {192, 192}, {192, 128}};
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (const HeadDims& h : prefs)
      if (flash3::forward_is_built(t, h.d, h.dv) && (!bwd || flash3::backward_is_built(t, h.d, h.dv))) {
        *dt = t, *hd = h;
        return true;
      }
  return false;
}

// Free device memory for `bytes` plus 2 GiB of slack (workspace, references).
bool memory_for(size_t bytes, std::string* why) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    *why = "cudaMemGetInfo failed";
    return false;
  }
  const size_t need = bytes + (size_t(2) << 30);
  if (free_b >= need) return true;
  std::ostringstream os;
  os << "needs " << need / 1e9 << " GB of free device memory, " << free_b / 1e9 << " GB free";
  *why = os.str();
  return false;
}

// Host doubles of `n` 16-bit device elements starting at element `offset`.
std::vector<double> fetch_halves(const void* base, int64_t offset, int64_t n, DType dt) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  cudaMemcpy(h.data(), static_cast<const uint16_t*>(base) + offset, size_t(n) * 2, cudaMemcpyDeviceToHost);
  std::vector<double> out(h.size());
  tu::parallel_for(h.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) out[i] = tu::half_bits_to_float(dt, h[i]);
  });
  return out;
}
std::vector<double> fetch_floats(const void* base, int64_t offset, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  cudaMemcpy(h.data(), static_cast<const float*>(base) + offset, size_t(n) * 4, cudaMemcpyDeviceToHost);
  return to_double(h);
}

// Elements of [offset, offset + n) of a device allocation of `bytes_per`-byte
// elements whose bytes are not all 0xff (the poison).
int64_t guard_written(const void* base, int64_t offset, int64_t n, int bytes_per) {
  int64_t written = 0;
  std::vector<uint8_t> h(size_t(n) * bytes_per);
  cudaMemcpy(h.data(), static_cast<const uint8_t*>(base) + offset * bytes_per, h.size(), cudaMemcpyDeviceToHost);
  for (uint8_t x : h) written += x != 0xff;
  return written;
}

flash3::gpuref::Strided16 strided(const void* base, int64_t offset, int64_t row_stride, int64_t head_stride) {
  flash3::gpuref::Strided16 t;
  t.data = static_cast<const uint16_t*>(base) + offset;
  t.row_stride = row_stride, t.head_stride = head_stride;
  return t;
}

// A fixed-length problem on dense (b, s, h, d) device tensors.
struct Shape {
  DType dt = DType::kBFloat16;
  int64_t batch = 0, sq = 0, sk = 0, hq = 0, hkv = 0, d = 0, dv = 0;
  bool causal = false;
  int wl = -1;
  int64_t n_q() const { return batch * sq * hq * d; }
  int64_t n_k() const { return batch * sk * hkv * d; }
  int64_t n_v() const { return batch * sk * hkv * dv; }
  int64_t n_o() const { return batch * sq * hq * dv; }
  int64_t n_l() const { return batch * hq * sq; }
  TensorView q(void* p) const { return TensorView::make4d(p, dt, batch, sq, hq, d, sq * hq * d, hq * d, d, 1); }
  TensorView o(void* p) const { return TensorView::make4d(p, dt, batch, sq, hq, dv, sq * hq * dv, hq * dv, dv, 1); }
  TensorView k(void* p) const { return TensorView::make4d(p, dt, batch, sk, hkv, d, sk * hkv * d, hkv * d, d, 1); }
  TensorView v(void* p) const {
    return TensorView::make4d(p, dt, batch, sk, hkv, dv, sk * hkv * dv, hkv * dv, dv, 1);
  }
  TensorView lse(void* p) const { return TensorView::make3d(p, DType::kFloat32, batch, hq, sq, hq * sq, sq, 1); }
  flash3::AttentionOptions opts() const {
    flash3::AttentionOptions o;
    o.causal = causal;
    o.window_left = wl;
    return o;
  }
  std::string describe() const {
    std::ostringstream os;
    os << tu::short_dtype(dt) << " q (" << batch << ", " << sq << ", " << hq << ", " << d << ") k/v (" << batch << ", "
       << sk << ", " << hkv << ", " << d << "/" << dv << ") causal=" << causal << " window_left=" << wl;
    return os.str();
  }
};

struct Tensors {
  tu::DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, counts;
};

auto nowhere = [](size_t i) { return "index " + std::to_string(i); };

// Batch element b of flash3's out / lse against the float64 CPU reference on
// its slice (baseline: the GPU emulation on the same slice).
void check_forward_batch(const Shape& s, const Tensors& t, int64_t b, cudaStream_t st) {
  SCOPED_TRACE("batch element " + std::to_string(b) + " (K starts at element " +
               std::to_string(b * s.sk * s.hkv * s.d) + ")");
  const int64_t nq1 = s.sq * s.hq * s.d, nk1 = s.sk * s.hkv * s.d, nv1 = s.sk * s.hkv * s.dv;
  const int64_t no1 = s.sq * s.hq * s.dv, nl1 = s.hq * s.sq;
  flash3::ref::Problem pr;
  pr.batch = 1, pr.seqlen_q = int(s.sq), pr.seqlen_k = int(s.sk), pr.heads_q = int(s.hq), pr.heads_kv = int(s.hkv);
  pr.head_dim = int(s.d), pr.head_dim_v = int(s.dv);
  flash3::ref::Options ro;
  ro.causal = s.causal, ro.window_left = s.wl;
  std::vector<double> o64(static_cast<size_t>(no1)), l64(static_cast<size_t>(nl1));
  {
    const std::vector<double> hq = fetch_halves(t.q.ptr, b * nq1, nq1, s.dt),
                              hk = fetch_halves(t.k.ptr, b * nk1, nk1, s.dt),
                              hv = fetch_halves(t.v.ptr, b * nv1, nv1, s.dt);
    flash3::ref::forward(pr, ro, hq.data(), hk.data(), hv.data(), o64.data(), l64.data());
  }
  tu::DeviceBuffer low_o, low_l;
  ASSERT_TRUE(cuda_ok(low_o.reserve(size_t(no1) * 4), "alloc"));
  ASSERT_TRUE(cuda_ok(low_l.reserve(size_t(nl1) * 4), "alloc"));
  flash3::gpuref::Args la;
  la.dtype = s.dt, la.batch = 1, la.seqlen_q = int(s.sq), la.seqlen_k = int(s.sk);
  la.heads_q = int(s.hq), la.heads_kv = int(s.hkv), la.head_dim = int(s.d), la.head_dim_v = int(s.dv);
  la.q = strided(t.q.ptr, b * nq1, s.hq * s.d, s.d);
  la.k = strided(t.k.ptr, b * nk1, s.hkv * s.d, s.d);
  la.v = strided(t.v.ptr, b * nv1, s.hkv * s.dv, s.dv);
  la.causal = s.causal, la.window_left = s.wl;
  la.out = low_o.as<float>(), la.lse = low_l.as<float>();
  ASSERT_TRUE(cuda_ok(flash3::gpuref::forward(la, flash3::gpuref::Mode::kLowPrecision, st), "gpuref"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "gpuref"));
  const Verdict vo = judge("O", fetch_halves(t.out.ptr, b * no1, no1, s.dt), o64, fetch_floats(low_o.ptr, 0, no1),
                           1e-5, nowhere);
  EXPECT_TRUE(vo.ok) << vo.text;
  const Verdict vl = judge("LSE", fetch_floats(t.lse.ptr, b * nl1, nl1), l64, fetch_floats(low_l.ptr, 0, nl1), 1e-5,
                           nowhere);
  EXPECT_TRUE(vl.ok) << vl.text;
}

// Batch element b of flash3's dq and of dk / dv for its last `tail` keys
// against the float64 CPU reference on those keys alone (valid when no query
// sees an earlier key), baseline: the GPU emulation on the same slice.
void check_backward_batch(const Shape& s, const Tensors& t, int64_t b, int64_t tail, cudaStream_t st) {
  SCOPED_TRACE("batch element " + std::to_string(b) + " (dK starts at element " +
               std::to_string(b * s.sk * s.hkv * s.d) + ")");
  const int64_t nq1 = s.sq * s.hq * s.d, nk1 = tail * s.hkv * s.d, nv1 = tail * s.hkv * s.dv;
  const int64_t q_off = b * nq1, o_off = b * s.sq * s.hq * s.dv;
  const int64_t k_off = (b * s.sk + s.sk - tail) * s.hkv * s.d, v_off = (b * s.sk + s.sk - tail) * s.hkv * s.dv;
  flash3::ref::Problem pr;
  pr.batch = 1, pr.seqlen_q = int(s.sq), pr.seqlen_k = int(tail), pr.heads_q = int(s.hq), pr.heads_kv = int(s.hkv);
  pr.head_dim = int(s.d), pr.head_dim_v = int(s.dv);
  flash3::ref::Options ro;
  ro.causal = s.causal, ro.window_left = s.wl;
  std::vector<double> dq64(static_cast<size_t>(nq1)), dk64(static_cast<size_t>(nk1)), dv64(static_cast<size_t>(nv1));
  {
    const std::vector<double> hq = fetch_halves(t.q.ptr, q_off, nq1, s.dt),
                              hk = fetch_halves(t.k.ptr, k_off, nk1, s.dt),
                              hv = fetch_halves(t.v.ptr, v_off, nv1, s.dt),
                              hdo = fetch_halves(t.dout.ptr, o_off, s.sq * s.hq * s.dv, s.dt);
    flash3::ref::backward(pr, ro, hq.data(), hk.data(), hv.data(), hdo.data(), nullptr, dq64.data(), dk64.data(),
                          dv64.data());
  }
  tu::DeviceBuffer lq, lk, lv;
  ASSERT_TRUE(cuda_ok(lq.reserve(size_t(nq1) * 4), "alloc"));
  ASSERT_TRUE(cuda_ok(lk.reserve(size_t(nk1) * 4), "alloc"));
  ASSERT_TRUE(cuda_ok(lv.reserve(size_t(nv1) * 4), "alloc"));
  flash3::gpuref::BwdArgs lb;
  lb.dtype = s.dt, lb.batch = 1, lb.seqlen_q = int(s.sq), lb.seqlen_k = int(tail);
  lb.heads_q = int(s.hq), lb.heads_kv = int(s.hkv), lb.head_dim = int(s.d), lb.head_dim_v = int(s.dv);
  lb.q = strided(t.q.ptr, q_off, s.hq * s.d, s.d);
  lb.k = strided(t.k.ptr, k_off, s.hkv * s.d, s.d);
  lb.v = strided(t.v.ptr, v_off, s.hkv * s.dv, s.dv);
  lb.dout = strided(t.dout.ptr, o_off, s.hq * s.dv, s.dv);
  lb.causal = s.causal, lb.window_left = s.wl;
  lb.dq = lq.as<float>(), lb.dk = lk.as<float>(), lb.dv = lv.as<float>();
  ASSERT_TRUE(cuda_ok(flash3::gpuref::backward(lb, flash3::gpuref::Mode::kLowPrecision, st), "gpuref"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "gpuref"));
  struct G {
    const char* name;
    const void* ours;
    int64_t off, n;
    const std::vector<double>* ref;
    const tu::DeviceBuffer* low;
  };
  const G gs[] = {{"dQ", t.dq.ptr, q_off, nq1, &dq64, &lq},
                  {"dK", t.dk.ptr, k_off, nk1, &dk64, &lk},
                  {"dV", t.dv.ptr, v_off, nv1, &dv64, &lv}};
  for (const G& g : gs) {
    const Verdict vg = judge(g.name, fetch_halves(g.ours, g.off, g.n, s.dt), *g.ref, fetch_floats(g.low->ptr, 0, g.n),
                             grad_eps(*g.ref, s.dt), nowhere);
    EXPECT_TRUE(vg.ok) << vg.text;
  }
}

struct StreamOwner {
  cudaStream_t s = nullptr;
  ~StreamOwner() {
    if (s == nullptr) return;
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};

// Allocates and fills q, k, v (and dout when `bwd`), poisons out / lse (and
// dq / dk / dv with kGuard elements past each), then runs flash3::forward
// (and backward). Fatal failures end the test.
void run_flash3(const Shape& s, bool bwd, Tensors* t, cudaStream_t st) {
  ASSERT_TRUE(cuda_ok(t->q.reserve(size_t(s.n_q()) * 2), "alloc q"));
  ASSERT_TRUE(cuda_ok(t->k.reserve(size_t(s.n_k()) * 2), "alloc k"));
  ASSERT_TRUE(cuda_ok(t->v.reserve(size_t(s.n_v()) * 2), "alloc v"));
  ASSERT_TRUE(cuda_ok(t->out.reserve(size_t(s.n_o() + kGuard) * 2), "alloc out"));
  ASSERT_TRUE(cuda_ok(t->lse.reserve(size_t(s.n_l() + kGuard) * 4), "alloc lse"));
  const uint64_t seed = fnv1a(s.describe());
  ASSERT_TRUE(cuda_ok(fill_normal_device(t->q.ptr, s.n_q(), s.dt, seed + 1, st), "fill q"));
  ASSERT_TRUE(cuda_ok(fill_normal_device(t->k.ptr, s.n_k(), s.dt, seed + 2, st), "fill k"));
  ASSERT_TRUE(cuda_ok(fill_normal_device(t->v.ptr, s.n_v(), s.dt, seed + 3, st), "fill v"));
  ASSERT_TRUE(cuda_ok(cudaMemsetAsync(t->out.ptr, 0xff, t->out.bytes, st), "poison out"));
  ASSERT_TRUE(cuda_ok(cudaMemsetAsync(t->lse.ptr, 0xff, t->lse.bytes, st), "poison lse"));
  flash3::ForwardArgs fa;
  fa.q = s.q(t->q.ptr), fa.k = s.k(t->k.ptr), fa.v = s.v(t->v.ptr), fa.out = s.o(t->out.ptr);
  fa.lse = s.lse(t->lse.ptr);
  fa.opts = s.opts();
  const flash3::Status fs = flash3::forward(fa, st);
  ASSERT_TRUE(fs.ok()) << "flash3::forward: " << fs.message;
  if (bwd) {
    ASSERT_TRUE(cuda_ok(t->dout.reserve(size_t(s.n_o()) * 2), "alloc dout"));
    ASSERT_TRUE(cuda_ok(t->dq.reserve(size_t(s.n_q() + kGuard) * 2), "alloc dq"));
    ASSERT_TRUE(cuda_ok(t->dk.reserve(size_t(s.n_k() + kGuard) * 2), "alloc dk"));
    ASSERT_TRUE(cuda_ok(t->dv.reserve(size_t(s.n_v() + kGuard) * 2), "alloc dv"));
    ASSERT_TRUE(cuda_ok(fill_normal_device(t->dout.ptr, s.n_o(), s.dt, seed + 4, st), "fill dout"));
    for (tu::DeviceBuffer* x : {&t->dq, &t->dk, &t->dv})
      ASSERT_TRUE(cuda_ok(cudaMemsetAsync(x->ptr, 0xff, x->bytes, st), "poison gradients"));
    flash3::BackwardArgs ba;
    ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.out = fa.out, ba.lse = fa.lse;
    ba.dout = s.o(t->dout.ptr);
    ba.dq = s.q(t->dq.ptr), ba.dk = s.k(t->dk.ptr), ba.dv = s.v(t->dv.ptr);
    ba.opts = s.opts();
    const flash3::Status bs = flash3::backward(ba, st);
    ASSERT_TRUE(bs.ok()) << "flash3::backward: " << bs.message;
  }
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "flash3"));
  EXPECT_EQ(guard_written(t->out.ptr, s.n_o(), kGuard, 2), 0) << "written past the end of out";
  EXPECT_EQ(guard_written(t->lse.ptr, s.n_l(), kGuard, 4), 0) << "written past the end of lse";
  if (bwd) {
    EXPECT_EQ(guard_written(t->dq.ptr, s.n_q(), kGuard, 2), 0) << "written past the end of dq";
    EXPECT_EQ(guard_written(t->dk.ptr, s.n_k(), kGuard, 2), 0) << "written past the end of dk";
    EXPECT_EQ(guard_written(t->dv.ptr, s.n_v(), kGuard, 2), 0) << "written past the end of dv";
  }
}

// ===========================================================================
// Large64.
// ===========================================================================
constexpr int64_t kLargeBatch = 32, kLargeHeadsQ = 64, kLargeHeadsKv = 8;
constexpr int64_t kLargeChecked[] = {0, 16, 31};

// Keys per batch element: K has 32 * sk * 8 * d = 2^32 elements.
int64_t large_seqlen_k(int d) { return (int64_t(1) << 24) / d; }

TEST(Large64, ForwardBeyond2To31Elements) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Shape s;
  HeadDims hd;
  if (!pick(false, &s.dt, &hd)) GTEST_SKIP() << "not built: no forward kernel in this build";
  s.batch = kLargeBatch, s.sq = 4, s.sk = large_seqlen_k(hd.d), s.hq = kLargeHeadsQ, s.hkv = kLargeHeadsKv;
  s.d = hd.d, s.dv = hd.dv;
  ASSERT_GT(s.n_k(), int64_t(std::numeric_limits<int32_t>::max()));
  std::string why;
  if (!memory_for(size_t(s.n_q() + s.n_k() + s.n_v() + s.n_o()) * 2 + size_t(s.n_l()) * 4, &why)) GTEST_SKIP() << why;
  SCOPED_TRACE(s.describe());
  StreamOwner st;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking), "stream"));
  Tensors t;
  run_flash3(s, false, &t, st.s);
  if (HasFatalFailure()) return;
  for (int64_t b : kLargeChecked) {
    check_forward_batch(s, t, b, st.s);
    if (HasFatalFailure()) return;
  }
}

TEST(Large64, BackwardBeyond2To31Elements) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Shape s;
  HeadDims hd;
  if (!pick(true, &s.dt, &hd)) GTEST_SKIP() << "not built: no forward + backward kernel pair in this build";
  s.batch = kLargeBatch, s.sq = 16, s.sk = large_seqlen_k(hd.d), s.hq = kLargeHeadsQ, s.hkv = kLargeHeadsKv;
  s.d = hd.d, s.dv = hd.dv;
  s.causal = true, s.wl = 63;
  constexpr int64_t kTail = 128;  // holds every key a query sees: sq + wl = 79
  ASSERT_GT(s.n_k(), int64_t(std::numeric_limits<int32_t>::max()));
  std::string why;
  if (!memory_for(size_t(2 * (s.n_q() + s.n_k() + s.n_v() + s.n_o())) * 2 + size_t(s.n_l()) * 4, &why))
    GTEST_SKIP() << why;
  SCOPED_TRACE(s.describe());
  StreamOwner st;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking), "stream"));
  Tensors t;
  run_flash3(s, true, &t, st.s);
  if (HasFatalFailure()) return;

  // Keys no query sees: dK = dV = 0 exactly, every batch element.
  ASSERT_TRUE(cuda_ok(t.counts.reserve(size_t(s.batch) * 2 * 8), "alloc counters"));
  ASSERT_TRUE(cuda_ok(cudaMemsetAsync(t.counts.ptr, 0, t.counts.bytes, st.s), "zero counters"));
  auto* c = t.counts.as<unsigned long long>();
  for (int64_t b = 0; b < s.batch; ++b) {
    ASSERT_TRUE(cuda_ok(count_nonzero16(t.dk.as<uint16_t>() + b * s.sk * s.hkv * s.d, (s.sk - kTail) * s.hkv * s.d,
                                        c + 2 * b, st.s), "count dk"));
    ASSERT_TRUE(cuda_ok(count_nonzero16(t.dv.as<uint16_t>() + b * s.sk * s.hkv * s.dv,
                                        (s.sk - kTail) * s.hkv * s.dv, c + 2 * b + 1, st.s), "count dv"));
  }
  std::vector<unsigned long long> hc(size_t(s.batch) * 2);
  ASSERT_TRUE(cuda_ok(cudaMemcpyAsync(hc.data(), c, hc.size() * 8, cudaMemcpyDeviceToHost, st.s), "counters"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st.s), "counters"));
  for (int64_t b = 0; b < s.batch; ++b) {
    EXPECT_EQ(hc[size_t(2 * b)], 0u) << "batch element " << b << ": dK of keys no query sees is not 0 (or NaN) in "
                                     << hc[size_t(2 * b)] << " elements";
    EXPECT_EQ(hc[size_t(2 * b + 1)], 0u) << "batch element " << b
                                         << ": dV of keys no query sees is not 0 (or NaN) in "
                                         << hc[size_t(2 * b + 1)] << " elements";
  }
  for (int64_t b : kLargeChecked) {
    check_backward_batch(s, t, b, kTail, st.s);
    if (HasFatalFailure()) return;
  }
}

// ===========================================================================
// LargeBatch.
// ===========================================================================
constexpr int64_t kManyBatches = 70000;
constexpr int64_t kBatchChecked[] = {0, 65534, 65535, 65536, kManyBatches - 1};

Shape many_batches(DType dt, HeadDims hd) {
  Shape s;
  s.dt = dt, s.batch = kManyBatches, s.sq = 5, s.sk = 9, s.hq = 2, s.hkv = 1, s.d = hd.d, s.dv = hd.dv;
  s.causal = true;
  return s;
}

// Every element of a 16-bit output was written (none is left NaN, the poison).
void expect_no_nan(const tu::DeviceBuffer& b, int64_t n, DType dt, const char* name, cudaStream_t st) {
  tu::DeviceBuffer count;
  ASSERT_TRUE(cuda_ok(count.reserve(8), "alloc"));
  ASSERT_TRUE(cuda_ok(cudaMemsetAsync(count.ptr, 0, 8, st), "zero"));
  ASSERT_TRUE(cuda_ok(count_nan16(b.ptr, n, dt, count.as<unsigned long long>(), st), "count NaN"));
  unsigned long long h = 0;
  ASSERT_TRUE(cuda_ok(cudaMemcpyAsync(&h, count.ptr, 8, cudaMemcpyDeviceToHost, st), "count"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(st), "count"));
  EXPECT_EQ(h, 0u) << h << " of " << n << " elements of " << name << " are NaN (unwritten)";
}

TEST(LargeBatch, ForwardBeyondTheGridLimit) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  HeadDims hd;
  if (!pick(false, &dt, &hd)) GTEST_SKIP() << "not built: no forward kernel in this build";
  const Shape s = many_batches(dt, hd);
  SCOPED_TRACE(s.describe());
  StreamOwner st;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking), "stream"));
  Tensors t;
  run_flash3(s, false, &t, st.s);
  if (HasFatalFailure()) return;
  expect_no_nan(t.out, s.n_o(), s.dt, "out", st.s);
  std::vector<float> lse(static_cast<size_t>(s.n_l()));
  ASSERT_TRUE(cuda_ok(cudaMemcpy(lse.data(), t.lse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost), "lse"));
  int64_t nan_lse = 0;
  for (float x : lse) nan_lse += std::isnan(x);
  EXPECT_EQ(nan_lse, 0) << nan_lse << " lse values are NaN (unwritten)";
  for (int64_t b : kBatchChecked) {
    check_forward_batch(s, t, b, st.s);
    if (HasFatalFailure()) return;
  }
}

TEST(LargeBatch, BackwardBeyondTheGridLimit) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  HeadDims hd;
  if (!pick(true, &dt, &hd)) GTEST_SKIP() << "not built: no forward + backward kernel pair in this build";
  const Shape s = many_batches(dt, hd);
  SCOPED_TRACE(s.describe());
  StreamOwner st;
  ASSERT_TRUE(cuda_ok(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking), "stream"));
  Tensors t;
  run_flash3(s, true, &t, st.s);
  if (HasFatalFailure()) return;
  expect_no_nan(t.dq, s.n_q(), s.dt, "dq", st.s);
  expect_no_nan(t.dk, s.n_k(), s.dt, "dk", st.s);
  expect_no_nan(t.dv, s.n_v(), s.dt, "dv", st.s);
  for (int64_t b : kBatchChecked) {
    check_backward_batch(s, t, b, s.sk, st.s);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
