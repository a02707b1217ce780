// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU correctness tests of flash3::backward.
//
// Each case: fresh random q, k, v, dout (and dlse when asked for), flash3::forward
// for out and lse (which the backward consumes), dq / dk / dv poisoned with NaN,
// flash3::backward, then dq, dk and dv compared with the fp32 GPU reference
// backward (gpu_reference.cuh, which recomputes everything from q, k, v) under the
// FlashAttention tolerance rule (flash3::ref::check_close):
//     max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// where plain_lowp is the GPU emulation of a plain bf16/fp16 implementation on the
// same inputs and eps the FlashAttention tests' atol for gradients: twice the
// largest rounding error of the input dtype near the reference values,
// max |((r + 0.3) - 0.3) - r| with every step rounded to bf16/fp16 (at least
// 1e-5 * max(1, max|ref|)). Without it, rows whose gradient is a difference of
// two nearly equal terms (e.g. a causal row that sees two keys) fail at random
// by a fraction of one bf16 ulp.
// Also: gradients of fully masked query rows (dq) and of keys no query sees
// (dk, dv) are exactly 0, and nothing is written outside the dq / dk / dv views.
// The fp32 GPU reference backward itself is checked against the float64 CPU
// reference (src/reference) on small shapes.
//
// Every test first skips without a Hopper GPU, and a case whose (dtype, head_dim,
// head_dim_v) forward or backward kernel is not built skips with "not built: ...".
// FLASH3_GPU_TESTS_QUICK=1 leaves out the (4096, 4096) matrix cases.
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
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "bwd/workspace.h"
#include "config/tile_size.h"
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


constexpr int kDeterministicRuns = 5;

// ---------------------------------------------------------------------------
// Case description.
// ---------------------------------------------------------------------------
// FixedCase (gpu_case.h): the problem, q / k / v layout (and the geometry of
// out and dout), seed and name.
struct Case : FixedCase {
  Layout grad_layout = Layout::kContiguous;  // dq, dk, dv
  bool with_dlse = false;
  bool deterministic = false;

  std::string describe() const {
    std::ostringstream os;
    describe_problem(os);
    os << " layout=" << layout_name(layout) << " grad_layout=" << layout_name(grad_layout)
       << " dlse=" << with_dlse << " deterministic=" << deterministic << " seed=" << seed << "]";
    return os.str();
  }
};

bool packable(const Case& c) { return c.hq == c.hkv && c.d == c.dv && c.sq == c.sk; }

struct Plan {
  QKV in;             // q, k, v
  QKV grad;           // dq, dk, dv
  View o;             // out (its own allocation, + kGuard) and dout (its own allocation)
  int64_t out_elems = 0, dout_elems = 0, grad_elems = 0;
};

Plan make_plan(const Case& c) {
  Plan p;
  p.in = make_qkv(c.layout, c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.dv);
  p.grad = make_qkv(c.grad_layout, c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.dv);
  p.o = c.layout == Layout::kPadded ? padded_view(0, c.batch, c.sq, c.hq, c.dv) : dense_view(0, c.batch, c.sq, c.hq, c.dv);
  p.out_elems = p.o.span() + kGuard;
  p.dout_elems = std::max<int64_t>(p.o.span(), 8);
  p.grad_elems = p.grad.elems + kGuard;
  return p;
}

// ---------------------------------------------------------------------------
// Masks: visible key range [lo, hi) of query i (bottom-right aligned).
// ---------------------------------------------------------------------------
void key_range(const Case& c, int i, int* lo, int* hi) {
  const int wl = c.wl, wr = c.causal ? 0 : c.wr;
  const int64_t diag = int64_t(i) + c.sk - c.sq;
  int64_t l = 0, h = c.sk;
  if (wl >= 0) l = std::max<int64_t>(l, diag - wl);
  if (wr >= 0) h = std::min<int64_t>(h, diag + wr + 1);
  *lo = int(std::min<int64_t>(l, c.sk));
  *hi = int(std::max<int64_t>(std::min<int64_t>(h, c.sk), *lo));
}

// empty_rows[i]: query i sees no key. unseen_keys[j]: no query sees key j.
void mask_coverage(const Case& c, std::vector<char>* empty_rows, std::vector<char>* unseen_keys) {
  empty_rows->assign(size_t(c.sq), 0);
  std::vector<int64_t> cover(size_t(c.sk) + 1, 0);
  for (int i = 0; i < c.sq; ++i) {
    int lo, hi;
    key_range(c, i, &lo, &hi);
    if (hi <= lo) {
      (*empty_rows)[size_t(i)] = 1;
      continue;
    }
    ++cover[size_t(lo)];
    --cover[size_t(hi)];
  }
  unseen_keys->assign(size_t(c.sk), 0);
  int64_t run = 0;
  for (int j = 0; j < c.sk; ++j) {
    run += cover[size_t(j)];
    (*unseen_keys)[size_t(j)] = run == 0;
  }
}

// ---------------------------------------------------------------------------
// Device state shared by all tests of the process (buffers only grow).
// ---------------------------------------------------------------------------
struct DeviceState {
  cudaStream_t stream = nullptr;
  tu::DeviceBuffer in, out, lse, dout, dlse, grad, grad2, scratch;
  tu::DeviceBuffer ref_dq, ref_dk, ref_dv, low_dq, low_dk, low_dv;
};

DeviceState& dev() { return device_state<DeviceState>(); }

struct Buffers {
  Plan plan;
  std::vector<uint16_t> host_in, host_dout;
  std::vector<float> host_dlse;
};

size_t n_lse(const Case& c) { return size_t(c.batch) * c.hq * c.sq; }
size_t n_dq(const Case& c) { return size_t(c.batch) * c.sq * c.hq * c.d; }
size_t n_dk(const Case& c) { return size_t(c.batch) * c.sk * c.hkv * c.d; }
size_t n_dv(const Case& c) { return size_t(c.batch) * c.sk * c.hkv * c.dv; }

::testing::AssertionResult cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
}

// Allocates, fills q/k/v, dout (and dlse) with fresh random normals seeded by the
// case, and copies them up.
::testing::AssertionResult upload_inputs(const Case& c, Buffers* b) {
  if (c.grad_layout == Layout::kPackedQKV || c.layout == Layout::kPackedQKV) {
    if (!packable(c)) return ::testing::AssertionFailure() << "packed q/k/v needs hq == hkv, d == dv, sq == sk";
  }
  b->plan = make_plan(c);
  const Plan& p = b->plan;
  DeviceState& d = dev();
  b->host_in.assign(size_t(p.in.elems), 0);
  tu::fill_normal(b->host_in.data(), b->host_in.size(), c.dtype, c.seed);
  b->host_dout.assign(size_t(p.dout_elems), 0);
  tu::fill_normal(b->host_dout.data(), b->host_dout.size(), c.dtype, c.seed ^ 0xd0d0d0d0ull);
  b->host_dlse.assign(c.with_dlse ? std::max<size_t>(n_lse(c), 1) : 0, 0.f);
  if (c.with_dlse) {
    std::vector<uint16_t> tmp(b->host_dlse.size());
    tu::fill_normal(tmp.data(), tmp.size(), DType::kBFloat16, c.seed ^ 0x15e15e15ull);
    for (size_t i = 0; i < tmp.size(); ++i) b->host_dlse[i] = tu::bf16_to_float(tmp[i]);
  }
  const size_t lse_bytes = (n_lse(c) + kGuard) * 4;
  const size_t grad_bytes = size_t(p.grad_elems) * 2;
  for (auto [buf, bytes] :
       {std::pair{&d.in, size_t(p.in.elems) * 2}, std::pair{&d.out, size_t(p.out_elems) * 2},
        std::pair{&d.dout, size_t(p.dout_elems) * 2}, std::pair{&d.lse, lse_bytes}, std::pair{&d.dlse, lse_bytes},
        std::pair{&d.grad, grad_bytes}, std::pair{&d.grad2, grad_bytes},
        std::pair{&d.ref_dq, std::max<size_t>(n_dq(c), 1) * 4}, std::pair{&d.low_dq, std::max<size_t>(n_dq(c), 1) * 4},
        std::pair{&d.ref_dk, std::max<size_t>(n_dk(c), 1) * 4}, std::pair{&d.low_dk, std::max<size_t>(n_dk(c), 1) * 4},
        std::pair{&d.ref_dv, std::max<size_t>(n_dv(c), 1) * 4}, std::pair{&d.low_dv, std::max<size_t>(n_dv(c), 1) * 4}}) {
    const cudaError_t e = buf->reserve(bytes);
    if (e != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMalloc(" << bytes << " bytes): " << cudaGetErrorString(e);
  }
  cudaError_t e = cudaMemcpyAsync(d.in.ptr, b->host_in.data(), b->host_in.size() * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d.dout.ptr, b->host_dout.data(), b->host_dout.size() * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess && c.with_dlse)
    e = cudaMemcpyAsync(d.dlse.ptr, b->host_dlse.data(), b->host_dlse.size() * 4, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "upload: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

TensorView view4(const Case& c, void* base, const View& v) {
  return TensorView::make4d(elem16(base, v.offset), c.dtype, v.b, v.s, v.h, v.d, v.sb, v.sr, v.sh, 1);
}
TensorView lse_view(const Case& c, void* base) {
  const int64_t sq1 = std::max<int64_t>(c.sq, 1);
  return TensorView::make3d(base, DType::kFloat32, c.batch, c.hq, c.sq, c.hq * sq1, sq1, 1);
}

void set_opts(const Case& c, flash3::AttentionOptions* o) {
  set_mask_and_scale(c, o);
  o->deterministic = c.deterministic;
}

flash3::ForwardArgs make_fwd_args(const Case& c, const Plan& p) {
  DeviceState& d = dev();
  flash3::ForwardArgs a;
  a.q = view4(c, d.in.ptr, p.in.q);
  a.k = view4(c, d.in.ptr, p.in.k);
  a.v = view4(c, d.in.ptr, p.in.v);
  a.out = view4(c, d.out.ptr, p.o);
  a.lse = lse_view(c, d.lse.ptr);
  set_opts(c, &a.opts);
  return a;
}

flash3::BackwardArgs make_bwd_args(const Case& c, const Plan& p, void* grad) {
  DeviceState& d = dev();
  flash3::BackwardArgs a;
  a.q = view4(c, d.in.ptr, p.in.q);
  a.k = view4(c, d.in.ptr, p.in.k);
  a.v = view4(c, d.in.ptr, p.in.v);
  a.out = view4(c, d.out.ptr, p.o);
  a.dout = view4(c, d.dout.ptr, p.o);
  a.lse = lse_view(c, d.lse.ptr);
  if (c.with_dlse) a.dlse = lse_view(c, d.dlse.ptr);
  a.dq = view4(c, grad, p.grad.q);
  a.dk = view4(c, grad, p.grad.k);
  a.dv = view4(c, grad, p.grad.v);
  set_opts(c, &a.opts);
  return a;
}

// Poisons out/lse and runs flash3::forward (out and lse are the backward's inputs).
flash3::Status run_forward(const Case& c, const Plan& p) {
  DeviceState& d = dev();
  cudaMemsetAsync(d.out.ptr, 0xff, size_t(p.out_elems) * 2, d.stream);
  cudaMemsetAsync(d.lse.ptr, 0xff, (n_lse(c) + kGuard) * 4, d.stream);
  return flash3::forward(make_fwd_args(c, p), d.stream);
}

// How a test calls flash3::backward on prepared arguments. Empty: on the test
// stream. Otherwise the call may use any stream, but must leave no work of its
// own pending on a stream other than the test stream when it returns.
using BackwardCall = std::function<flash3::Status(const flash3::BackwardArgs&)>;

// Poisons the gradient allocation `grad` and runs flash3::backward into it.
flash3::Status run_backward(const Case& c, const Plan& p, void* grad, void* workspace = nullptr,
                            size_t workspace_bytes = 0, const BackwardCall& call = {}) {
  DeviceState& d = dev();
  cudaMemsetAsync(grad, 0xff, size_t(p.grad_elems) * 2, d.stream);
  flash3::BackwardArgs a = make_bwd_args(c, p, grad);
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  if (!call) return flash3::backward(a, d.stream);
  cudaStreamSynchronize(d.stream);  // out, lse and the poison are in place whatever stream `call` uses
  return call(a);
}

flash3::gpuref::BwdArgs make_ref_args(const Case& c, const Plan& p, float* dq, float* dk, float* dv) {
  DeviceState& d = dev();
  flash3::gpuref::BwdArgs r;
  set_ref_problem(c, &r);
  r.q = strided16(d.in.ptr, p.in.q);
  r.k = strided16(d.in.ptr, p.in.k);
  r.v = strided16(d.in.ptr, p.in.v);
  r.dout = strided16(d.dout.ptr, p.o);
  r.dlse = c.with_dlse ? d.dlse.as<float>() : nullptr;
  r.dq = dq;
  r.dk = dk;
  r.dv = dv;
  return r;
}

// Runs both reference modes into ref_* (fp32) and low_* (emulation).
::testing::AssertionResult run_references(const Case& c, const Plan& p) {
  DeviceState& d = dev();
  auto ra = make_ref_args(c, p, d.ref_dq.as<float>(), d.ref_dk.as<float>(), d.ref_dv.as<float>());
  auto la = make_ref_args(c, p, d.low_dq.as<float>(), d.low_dk.as<float>(), d.low_dv.as<float>());
  const size_t scratch = flash3::gpuref::backward_scratch_bytes(ra);
  if (scratch > 0) {
    auto ok = cuda_ok(d.scratch.reserve(scratch), "reference scratch");
    if (!ok) return ok;
  }
  ra.scratch = la.scratch = d.scratch.ptr;
  ra.scratch_bytes = la.scratch_bytes = d.scratch.bytes;
  auto ok = cuda_ok(flash3::gpuref::backward(ra, flash3::gpuref::Mode::kFloat32, d.stream), "gpuref::backward fp32");
  if (!ok) return ok;
  return cuda_ok(flash3::gpuref::backward(la, flash3::gpuref::Mode::kLowPrecision, d.stream),
                 "gpuref::backward low precision");
}

std::vector<float> fetch_f32(const tu::DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  if (n > 0) cudaMemcpy(h.data(), b.ptr, n * 4, cudaMemcpyDeviceToHost);
  return h;
}
std::vector<uint16_t> fetch_grad(const Plan& p, const void* grad) {
  std::vector<uint16_t> h(size_t(p.grad_elems));
  cudaMemcpy(h.data(), grad, h.size() * 2, cudaMemcpyDeviceToHost);
  return h;
}

// Dense (b, s, h, x) index -> text.
std::string where_bshx(size_t i, int64_t s, int64_t h, int64_t x) {
  std::ostringstream os;
  os << "(b=" << int64_t(i) / (x * h * s) << ", s=" << (int64_t(i) / (x * h)) % s << ", h=" << (int64_t(i) / x) % h
     << ", c=" << int64_t(i) % x << ")";
  return os.str();
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double y : x)
    if (std::isfinite(y)) m = std::max(m, std::fabs(y));
  return m;
}

// Number of elements of rows (b, s, h, :) with skip_row[s] set that are not exactly 0.
int64_t nonzero_in_rows(const std::vector<double>& x, const std::vector<char>& rows, int64_t b, int64_t s, int64_t h,
                        int64_t w, int64_t* first) {
  int64_t n = 0;
  *first = -1;
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t is = 0; is < s; ++is) {
      if (!rows[size_t(is)]) continue;
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t c = 0; c < w; ++c) {
          const int64_t i = ((ib * s + is) * h + ih) * w + c;
          if (!(x[size_t(i)] == 0.0)) {  // NaN counts
            if (*first < 0) *first = i;
            ++n;
          }
        }
    }
  return n;
}

// Compares the flash3 gradients (host copy of the gradient allocation) with the
// references (run_references() must have been enqueued), plus masked-row zeros and
// clobbering.
void check_gradients(const Case& c, const Plan& p, const std::vector<uint16_t>& h_grad) {
  DeviceState& d = dev();
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(d.stream), "sync"));
  const int64_t clobbered = count_clobbered(h_grad, {&p.grad.q, &p.grad.k, &p.grad.v});
  EXPECT_EQ(clobbered, 0) << c.describe() << ": flash3 wrote " << clobbered
                          << " elements of the gradient allocation outside the dq / dk / dv views";
  std::vector<char> empty_rows, unseen_keys;
  mask_coverage(c, &empty_rows, &unseen_keys);

  struct G {
    const char* name;
    const View* view;
    const tu::DeviceBuffer* ref;
    const tu::DeviceBuffer* low;
    int64_t s, h, w;
    const std::vector<char>* zero_rows;
  };
  const G gs[] = {{"dQ", &p.grad.q, &d.ref_dq, &d.low_dq, c.sq, c.hq, c.d, &empty_rows},
                  {"dK", &p.grad.k, &d.ref_dk, &d.low_dk, c.sk, c.hkv, c.d, &unseen_keys},
                  {"dV", &p.grad.v, &d.ref_dv, &d.low_dv, c.sk, c.hkv, c.dv, &unseen_keys}};
  for (const G& g : gs) {
    const size_t n = size_t(c.batch) * g.s * g.h * g.w;
    if (n == 0) continue;
    const std::vector<double> ours = extract(h_grad, *g.view, c.dtype);
    const std::vector<double> ref = to_double(fetch_f32(*g.ref, n));
    const std::vector<double> low = to_double(fetch_f32(*g.low, n));
    const double eps = grad_eps(ref, c.dtype);
    const Verdict v =
        judge(g.name, ours, ref, low, eps, [&](size_t i) { return where_bshx(i, g.s, g.h, g.w); }, tol_factor(c));
    const std::string lower = g.name[1] == 'Q' ? "dq" : (g.name[1] == 'K' ? "dk" : "dv");
    ::testing::Test::RecordProperty(lower + "_err", std::to_string(v.r.err));
    ::testing::Test::RecordProperty(lower + "_baseline", std::to_string(v.r.base_err));
    EXPECT_TRUE(v.ok) << c.describe() << "\n  " << v.text;
    int64_t first = -1;
    const int64_t nz = nonzero_in_rows(ours, *g.zero_rows, c.batch, g.s, g.h, g.w, &first);
    EXPECT_EQ(nz, 0) << c.describe() << ": " << g.name << " has " << nz << " non-zero (or NaN) elements in "
                     << (g.name[1] == 'Q' ? "fully masked query rows" : "keys no query sees") << "; first at "
                     << where_bshx(size_t(std::max<int64_t>(first, 0)), g.s, g.h, g.w)
                     << " = " << (first >= 0 ? ours[size_t(first)] : 0.0);
  }
}

// Full check of one case: flash3 forward + backward vs the fp32 GPU reference.
void check_case(const Case& c, const BackwardCall& call = {}) {
  SCOPED_TRACE(c.describe());
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& d = dev();
  const Plan& p = b.plan;
  const flash3::Status fs = run_forward(c, p);
  ASSERT_TRUE(fs.ok()) << c.describe() << ": flash3::forward failed: " << fs.message;
  const flash3::Status bs = run_backward(c, p, d.grad.ptr, nullptr, 0, call);
  ASSERT_TRUE(bs.ok()) << c.describe() << ": flash3::backward failed: " << bs.message;
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(d.stream), "flash3 forward + backward"));
  ASSERT_TRUE(cuda_ok(cudaGetLastError(), "flash3 forward + backward"));
  ASSERT_TRUE(run_references(c, p));
  check_gradients(c, p, fetch_grad(p, d.grad.ptr));
}

bool kernels_built(DType dt, int d, int dv) {
  return flash3::forward_is_built(dt, d, dv) && flash3::backward_is_built(dt, d, dv);
}

// First built (forward and backward) variant, preferring d = 128.
bool pick_built(DType* dt, int* d, int* dv, DType prefer = DType::kBFloat16) {
  const HeadDims prefs[] = {{128, 128}, {64, 64}, {256, 256}, {96, 96}, {192, 192}, {192, 128}};
  const DType other = prefer == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
  for (DType t : {prefer, other})
    for (const HeadDims& h : prefs)
      if (kernels_built(t, h.d, h.dv)) {
        *dt = t, *d = h.d, *dv = h.dv;
        return true;
      }
  return false;
}

#define FLASH3_SKIP_UNLESS_BWD_BUILT(c)                                                                       \
  do {                                                                                                        \
    if (!flash3::backward_is_built((c).dtype, (c).d, (c).dv))                                                \
      GTEST_SKIP() << "not built: backward kernel " << tu::short_dtype((c).dtype) << " " << (c).d << "x"    \
                   << (c).dv << " is not in this build (FLASH3_PASSES / FLASH3_DTYPES / FLASH3_HDIMS)";      \
    if (!flash3::forward_is_built((c).dtype, (c).d, (c).dv))                                                 \
      GTEST_SKIP() << "not built: forward kernel " << tu::short_dtype((c).dtype) << " " << (c).d << "x"     \
                   << (c).dv << " (needed for out / lse) is not in this build";                              \
  } while (0)

// The dtype a head-dim pair runs in: `prefer` when its forward and backward
// kernels are built, else the other one.
bool pick_dtype(HeadDims h, DType prefer, DType* dt) {
  const DType other = prefer == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
  for (DType t : {prefer, other})
    if (kernels_built(t, h.d, h.dv)) {
      *dt = t;
      return true;
    }
  return false;
}

// Every head-dim pair with a backward kernel in this build (the manifest's
// variants file) whose forward is built too.
std::vector<HeadDims> built_bwd_head_dims() {
  std::vector<HeadDims> out;
  for (HeadDims h : built_head_dims("bwd")) {
    DType dt;
    if (pick_dtype(h, DType::kBFloat16, &dt)) out.push_back(h);
  }
  return out;
}

// ===========================================================================
// The matrix (the forward issue's).
// ===========================================================================
Case matrix_case(const MatrixParam& mp) {
  Case c;
  fill_matrix_case(&c, mp, "bwd_");
  c.grad_layout = c.layout;
  return c;
}

class BwdMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(BwdMatrix, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const Case c = matrix_case(GetParam());
  FLASH3_SKIP_UNLESS_BWD_BUILT(c);
  if (quick_mode() && c.sq == 4096) GTEST_SKIP() << "quick mode (FLASH3_GPU_TESTS_QUICK=1): seqlen 4096 left out";
  check_case(c);
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  return matrix_case(info.param).name.substr(4);  // without "bwd_" (the suite says it)
}

// The 2016-case issue matrix (gpu_case.h); cases whose kernels are not built skip. The
// largest (d=256, b=3, hq=8, 4096^2, no mask) is ~2.5 TFLOP of reference work (6 GEMMs of 2*4096^2*256 per head, two modes):
// well under a second on an H200.
INSTANTIATE_TEST_SUITE_P(Bwd, BwdMatrix, issue_matrix(), matrix_name);

// ===========================================================================
// Gradient through LSE, every built head-dim pair.
// ===========================================================================
TEST(BwdGpu, DlseGradient) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  struct S {
    DType dt;
    int b, sq, sk, hq, hkv;
    Mask m;
    int wl, wr;  // used when m == kNone and wl >= 0
  };
  const S shapes[] = {
      {DType::kBFloat16, 2, 1000, 1000, 8, 2, Mask::kCausal, -1, -1},
      {DType::kFloat16, 1, 300, 128, 4, 1, Mask::kNone, 32, 0},      // rows 0..171 fully masked (bottom-right)
      {DType::kBFloat16, 3, 113, 1023, 2, 2, Mask::kNone, -1, -1},
      {DType::kFloat16, 1, 1023, 113, 8, 2, Mask::kCausal, -1, -1},  // fully masked rows, GQA
  };
  int ran = 0;
  for (const HeadDims& h : built_bwd_head_dims())
    for (const S& s : shapes) {
      DType dt;
      if (!pick_dtype(h, s.dt, &dt)) continue;
      Case c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv, c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
      apply_mask(&c, s.m);
      if (s.m == Mask::kNone && s.wl >= 0) c.wl = s.wl, c.wr = s.wr;
      c.with_dlse = true;
      c.layout = c.grad_layout = Layout::kPadded;
      c.name = "dlse_" + head_dims_name(h) + "_b" + std::to_string(s.b) + "_sq" + std::to_string(s.sq) + "_sk" +
               std::to_string(s.sk) + "_" + heads_name({s.hq, s.hkv});
      c.seed = fnv1a(c.name);
      check_case(c);
      ++ran;
      if (HasFatalFailure()) return;
    }
  if (ran == 0) GTEST_SKIP() << "not built: no forward + backward kernel pair in this build";
}

// Deterministic mode on one case: `runs` backward calls after one forward must
// give bitwise identical dq / dk / dv (and guards), and the result must pass the
// tolerance rule.
void check_deterministic(const Case& c, int runs) {
  SCOPED_TRACE(c.describe());
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const Plan& p = b.plan;
  const flash3::Status fs = run_forward(c, p);
  ASSERT_TRUE(fs.ok()) << fs.message;
  std::vector<uint16_t> first;
  for (int run = 0; run < runs; ++run) {
    const flash3::Status st = run_backward(c, p, ds.grad.ptr);
    ASSERT_TRUE(st.ok()) << "run " << run << ": " << st.message;
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
    std::vector<uint16_t> h = fetch_grad(p, ds.grad.ptr);
    if (run == 0) {
      first = std::move(h);
      continue;
    }
    if (std::memcmp(first.data(), h.data(), h.size() * 2) != 0) {
      int64_t diff = 0, at = -1;
      for (size_t i = 0; i < h.size(); ++i)
        if (h[i] != first[i]) {
          if (at < 0) at = int64_t(i);
          ++diff;
        }
      const char* which = "guard";
      if (at >= p.grad.q.offset && at < p.grad.q.span()) which = "dq";
      if (at >= p.grad.k.offset && at < p.grad.k.span()) which = "dk";
      if (at >= p.grad.v.offset && at < p.grad.v.span()) which = "dv";
      ADD_FAILURE() << c.describe() << ": deterministic run " << run << " differs from run 0 in " << diff
                    << " gradient elements (first at allocation index " << at << ", in " << which
                    << " for the non-packed layout)";
    }
  }
  ASSERT_TRUE(run_references(c, p));
  check_gradients(c, p, first);
}

// ===========================================================================
// Deterministic mode: bitwise identical dq / dk / dv over 5 runs (causal GQA 4:1,
// seqlen 4096; MQA, window and an unmasked launch whose last wave is split),
// and the result passes the tolerance rule. Every built head-dim pair.
// ===========================================================================
TEST(BwdGpu, DeterministicBitwise) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const std::vector<HeadDims> dims = built_bwd_head_dims();
  if (dims.empty()) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  struct S {
    int b, sq, sk, hq, hkv;
    Mask m;
  };
  const S shapes[] = {{2, 4096, 4096, 8, 2, Mask::kCausal},  // the issue's case
                      {1, 1000, 1000, 4, 1, Mask::kNone},    // MQA
                      {3, 113, 1023, 8, 2, Mask::kWindow256_256},
                      {1, 2048, 2048, 17, 17, Mask::kNone}};  // a partial last wave of whole and split blocks
  int num_sms = 0;
  ASSERT_TRUE(cuda_ok(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), "SM count"));
  int split_shapes = 0;  // unmasked shapes whose last wave runs in pieces (BwdSplitPlan): their sum order is fixed too
  for (const HeadDims& hd : dims) {
    DType dt;
    pick_dtype(hd, DType::kBFloat16, &dt);
    const int d = hd.d, dv = hd.dv;
    for (const S& s : shapes) {
      if (s.m == Mask::kNone) {
        const flash3::BwdTileConfig cfg = flash3::bwd_tile_config(d, dv, false, flash3::bwd_short_tile(d, s.sq));
        const int tiles = (s.sk + cfg.tile_n - 1) / cfg.tile_n * s.hkv * s.b;
        split_shapes += flash3::bwd_split_plan(tiles, num_sms, (s.sq + cfg.tile_m - 1) / cfg.tile_m, s.hq / s.hkv)
                            .pieces > 1;
      }
      Case c;
      c.dtype = dt, c.d = d, c.dv = dv, c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
      apply_mask(&c, s.m);
      c.deterministic = true;
      c.name = "deterministic_" + head_dims_name(hd) + "_sq" + std::to_string(s.sq) + "_sk" + std::to_string(s.sk) +
               "_" + heads_name({s.hq, s.hkv});
      c.seed = fnv1a(c.name);
      check_deterministic(c, kDeterministicRuns);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GE(split_shapes, 1) << "no shape exercises the split last wave on this device";
}

// ===========================================================================
// Empty sequences.
// ===========================================================================
TEST(BwdGpu, EmptySeqlenKGivesZeroDq) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  for (Mask m : {Mask::kNone, Mask::kCausal}) {
    Case c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 70, c.sk = 0, c.hq = 4, c.hkv = 2;
    apply_mask(&c, m);
    c.layout = c.grad_layout = Layout::kPadded;
    c.name = std::string("bwd_empty_k_") + mask_name(m);
    c.seed = 7;
    SCOPED_TRACE(c.describe());
    Buffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const flash3::Status fs = run_forward(c, b.plan);
    ASSERT_TRUE(fs.ok()) << "forward, seqlen_k = 0: " << fs.message;
    const flash3::Status st = run_backward(c, b.plan, ds.grad.ptr);
    ASSERT_TRUE(st.ok()) << "backward, seqlen_k = 0: " << st.message;
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
    ASSERT_TRUE(cuda_ok(cudaGetLastError(), "backward"));
    const std::vector<uint16_t> h = fetch_grad(b.plan, ds.grad.ptr);
    const std::vector<double> dq = extract(h, b.plan.grad.q, c.dtype);
    int64_t bad = 0;
    for (double x : dq) bad += !(x == 0.0);
    EXPECT_EQ(bad, 0) << "seqlen_k = 0: " << bad << " of " << dq.size() << " dq elements are not 0";
    EXPECT_EQ(count_clobbered(h, {&b.plan.grad.q, &b.plan.grad.k, &b.plan.grad.v}), 0);
  }
}

TEST(BwdGpu, EmptySeqlenQGivesZeroDkDv) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  for (Heads h : {Heads{2, 2}, Heads{8, 2}}) {
    Case c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 0, c.sk = 64, c.hq = h.hq, c.hkv = h.hkv;
    c.layout = c.grad_layout = Layout::kPadded;
    c.name = "bwd_empty_q_" + heads_name(h);
    c.seed = 8;
    SCOPED_TRACE(c.describe());
    Buffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const flash3::Status fs = run_forward(c, b.plan);
    ASSERT_TRUE(fs.ok()) << "forward, seqlen_q = 0: " << fs.message;
    const flash3::Status st = run_backward(c, b.plan, ds.grad.ptr);
    ASSERT_TRUE(st.ok()) << "backward, seqlen_q = 0: " << st.message;
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
    ASSERT_TRUE(cuda_ok(cudaGetLastError(), "backward"));
    const std::vector<uint16_t> hg = fetch_grad(b.plan, ds.grad.ptr);
    for (const View* v : {&b.plan.grad.k, &b.plan.grad.v}) {
      const std::vector<double> g = extract(hg, *v, c.dtype);
      int64_t bad = 0;
      for (double x : g) bad += !(x == 0.0);
      EXPECT_EQ(bad, 0) << "seqlen_q = 0: " << bad << " of " << g.size() << (v == &b.plan.grad.k ? " dk" : " dv")
                        << " elements are not 0 (no query sees any key: the gradients are 0)";
    }
    EXPECT_EQ(count_clobbered(hg, {&b.plan.grad.q, &b.plan.grad.k, &b.plan.grad.v}), 0);
  }
  // batch = 0: nothing to do, still Ok.
  Case c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 0, c.sq = 16, c.sk = 16, c.hq = 2, c.hkv = 2;
  c.name = "bwd_empty_batch";
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  const flash3::Status st = run_backward(c, b.plan, dev().grad.ptr);
  EXPECT_TRUE(st.ok()) << "batch = 0: " << st.message;
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(dev().stream), "backward"));
}

// ===========================================================================
// Caller-provided workspace of exactly backward_workspace_size() bytes (causal,
// and unmasked with its last wave split: partial slots and counters in the
// workspace too), every built head-dim pair; sized from q alone (no k), it is
// at least as large.
// ===========================================================================
TEST(BwdGpu, CallerWorkspace) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const std::vector<HeadDims> dims = built_bwd_head_dims();
  if (dims.empty()) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  constexpr size_t kWsGuard = 4096;
  // NaN as fp32 (and -1 as int32): a value flash3 reads without writing it
  // first shows up in the gradients (0xa5 bytes were a float of about -3e-16,
  // lost below the tolerance).
  constexpr uint8_t kWsPoison = 0xff;
  constexpr int kRuns = 6;
  for (int k = 0; k < kRuns * int(dims.size()); ++k) {  // every built head-dim pair, kRuns runs each
    const HeadDims hd = dims[size_t(k / kRuns)];
    const int run = k % kRuns;
    DType dt;
    pick_dtype(hd, DType::kBFloat16, &dt);
    const int d = hd.d, dv = hd.dv;
    // Runs 4 and 5: causal with more queries than keys, so the top query
    // blocks see no key at all and no KV block adds into their dQ
    // accumulator: their dQ must still come out zero (the reference's), not
    // whatever the workspace held.
    const bool short_k = run >= 4;
    const bool det = run % 2 == 0, causal = run < 2 || short_k;
    Case c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 1000, c.sk = short_k ? 300 : 1000, c.hq = 8, c.hkv = 2;
    c.causal = causal;
    c.deterministic = det;
    c.name = "workspace_" + head_dims_name(hd) + (det ? "_deterministic" : "_default") +
             (causal ? "_causal" : "_nomask") + (short_k ? "_sk300" : "");
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());
    Buffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const Plan& p = b.plan;
    const flash3::Status fs = run_forward(c, p);
    ASSERT_TRUE(fs.ok()) << fs.message;

    const size_t ws_bytes = flash3::backward_workspace_size(make_bwd_args(c, p, ds.grad.ptr));
    ::testing::Test::RecordProperty(c.name + "_bytes", std::to_string(ws_bytes));
    flash3::BackwardArgs q_only = make_bwd_args(c, p, ds.grad.ptr);
    q_only.k = flash3::TensorView{};
    EXPECT_GE(flash3::backward_workspace_size(q_only), ws_bytes) << "sized from q alone";
    tu::DeviceBuffer ws;
    ASSERT_TRUE(cuda_ok(ws.reserve(ws_bytes + kWsGuard), "workspace"));
    // Garbage in the workspace: flash3 must initialise what it needs. On the
    // test stream: it is non-blocking, so a legacy-stream memset is not ordered
    // before the backward's own initialisation of the workspace.
    ASSERT_TRUE(cuda_ok(cudaMemsetAsync(ws.ptr, kWsPoison, ws_bytes + kWsGuard, ds.stream), "workspace poison"));

    // Internal allocation.
    const flash3::Status s1 = run_backward(c, p, ds.grad.ptr);
    ASSERT_TRUE(s1.ok()) << "internal workspace: " << s1.message;
    // Caller's workspace (twice: the second run sees what the first left in it).
    const flash3::Status s2 = run_backward(c, p, ds.grad2.ptr, ws.ptr, ws_bytes);
    ASSERT_TRUE(s2.ok()) << "caller workspace of " << ws_bytes << " bytes: " << s2.message;
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
    const std::vector<uint16_t> g1 = fetch_grad(p, ds.grad.ptr), g2 = fetch_grad(p, ds.grad2.ptr);
    const flash3::Status s3 = run_backward(c, p, ds.grad2.ptr, ws.ptr, ws_bytes);
    ASSERT_TRUE(s3.ok()) << "caller workspace, second run: " << s3.message;
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
    const std::vector<uint16_t> g3 = fetch_grad(p, ds.grad2.ptr);

    std::vector<uint8_t> guard(kWsGuard);
    ASSERT_TRUE(cuda_ok(cudaMemcpy(guard.data(), ws.as<char>() + ws_bytes, kWsGuard, cudaMemcpyDeviceToHost), "guard"));
    int64_t guard_bad = 0;
    for (uint8_t x : guard) guard_bad += x != kWsPoison;
    EXPECT_EQ(guard_bad, 0) << c.describe() << ": flash3 wrote " << guard_bad << " bytes past the end of a "
                            << ws_bytes << "-byte workspace (backward_workspace_size())";
    if (det) {
      EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * 2), 0)
          << c.describe() << ": caller workspace and internal allocation give different gradients";
      EXPECT_EQ(std::memcmp(g2.data(), g3.data(), g2.size() * 2), 0)
          << c.describe() << ": a second run in the same caller workspace gives different gradients";
    }
    ASSERT_TRUE(run_references(c, p));
    check_gradients(c, p, g2);          // caller workspace, first run
    check_gradients(c, p, g3);          // caller workspace, second run
    if (!det) check_gradients(c, p, g1);  // internal allocation

    // Too small a workspace is an error, not an overrun.
    if (ws_bytes > 0) {
      flash3::BackwardArgs a = make_bwd_args(c, p, ds.grad2.ptr);
      a.workspace = ws.ptr;
      a.workspace_bytes = ws_bytes - 1;
      const flash3::Status st = flash3::backward(a, ds.stream);
      EXPECT_FALSE(st.ok()) << c.describe() << ": a workspace of " << ws_bytes - 1 << " bytes (< "
                            << ws_bytes << " = backward_workspace_size()) was accepted";
      EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
    }
    if (HasFatalFailure()) return;
  }
}

// ===========================================================================
// Gradient layouts: dq / dk / dv written into a packed dqkv buffer, and strides
// that differ from those of q / k / v. Every built head-dim pair.
// ===========================================================================
TEST(BwdGpu, PackedAndStridedGradients) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const std::vector<HeadDims> dims = built_bwd_head_dims();
  if (dims.empty()) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  struct S {
    int b, sq, sk, hq, hkv;
    Mask m;
    Layout in, grad;
  };
  const S shapes[] = {
      {2, 1000, 1000, 4, 4, Mask::kCausal, Layout::kPackedQKV, Layout::kPackedQKV},   // packed qkv -> packed dqkv
      {1, 777, 777, 2, 2, Mask::kNone, Layout::kContiguous, Layout::kPackedQKV},     // separate q/k/v -> packed dqkv
      {2, 513, 513, 4, 4, Mask::kWindow128_0, Layout::kPackedQKV, Layout::kPadded},   // packed qkv -> padded grads
      {3, 300, 700, 8, 2, Mask::kWindow256_256, Layout::kContiguous, Layout::kPadded},
      {2, 700, 300, 4, 1, Mask::kCausal, Layout::kPadded, Layout::kContiguous},
  };
  for (const HeadDims& h : dims) {
    DType dt;
    pick_dtype(h, DType::kBFloat16, &dt);
    for (const S& s : shapes) {
      const bool packed = s.in == Layout::kPackedQKV || s.grad == Layout::kPackedQKV;
      if (packed && h.d != h.dv) continue;  // packed needs d == dv
      Case c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv, c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
      apply_mask(&c, s.m);
      c.layout = s.in;
      c.grad_layout = s.grad;
      c.name = "layout_" + head_dims_name(h) + "_" + layout_name(s.in) + "_to_" + layout_name(s.grad) + "_sq" +
               std::to_string(s.sq) + "_sk" + std::to_string(s.sk);
      c.seed = fnv1a(c.name);
      check_case(c);
      if (HasFatalFailure()) return;
    }
  }
}

// ===========================================================================
// Extra shapes outside the matrix: decode-like, odd lengths, other head counts.
// ===========================================================================
TEST(BwdGpu, ExtraShapes) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  struct S {
    int b, sq, sk, hq, hkv;
    Mask m;
  };
  const S shapes[] = {{2, 1, 4096, 8, 1, Mask::kNone},   {1, 7, 3000, 16, 2, Mask::kCausal},
                      {4, 63, 65, 4, 4, Mask::kCausal},  {1, 257, 4095, 2, 1, Mask::kWindow256_256},
                      {2, 4096, 1, 2, 2, Mask::kCausal}, {1, 129, 127, 6, 3, Mask::kWindow128_0},
                      {1, 2048, 2048, 16, 1, Mask::kCausal}};
  for (const S& s : shapes) {
    Case c;
    c.dtype = dt, c.d = d, c.dv = dv;
    c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
    apply_mask(&c, s.m);
    c.layout = c.grad_layout = Layout::kPadded;
    c.name = "bwd_extra_b" + std::to_string(s.b) + "_sq" + std::to_string(s.sq) + "_sk" + std::to_string(s.sk) + "_" +
             heads_name({s.hq, s.hkv}) + "_" + mask_name(s.m);
    c.seed = fnv1a(c.name);
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

// ===========================================================================
// Windows: 2^31 - 1 and other windows past the sequence are unbounded, negative
// sides too; causal ignores window_right and keeps window_left (gpu_case.h).
// Every built head-dim pair (bf16 where built), each spec against the reference.
// ===========================================================================
class BwdLargeWindows : public ::testing::TestWithParam<HeadDims> {};

TEST_P(BwdLargeWindows, MatchReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  DType dt;
  if (!pick_dtype(h, DType::kBFloat16, &dt))
    GTEST_SKIP() << "not built: no forward + backward kernel pair " << head_dims_name(h);
  for (const WindowSpec& w : large_window_specs()) {
    Case c;
    c.dtype = dt, c.d = h.d, c.dv = h.dv;
    c.batch = 2, c.sq = w.sq, c.sk = w.sk, c.hq = 4, c.hkv = 2;
    c.causal = w.causal, c.wl = w.wl, c.wr = w.wr;
    c.name = std::string("bwd_large_window_") + w.name + "_" + head_dims_name(h);
    c.seed = fnv1a(c.name);
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Bwd, BwdLargeWindows, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// Causal with any window_right, or with a window_left past the keys, is plain
// causal: in deterministic mode, bitwise the same dq / dk / dv.
TEST(BwdGpu, CausalIgnoresWindowRightBitwise) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  struct W {
    int wl, wr;
  };
  const W windows[] = {{-1, 7}, {-1, kIntMax}, {kIntMax, -1}, {-5, -5}};
  for (Seqlens sl : {Seqlens{1000, 1000}, Seqlens{700, 1300}, Seqlens{1300, 700}}) {
    Case c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = sl.sq, c.sk = sl.sk, c.hq = 4, c.hkv = 2;
    c.causal = true;
    c.deterministic = true;
    c.name = "bwd_causal_bitwise_sq" + std::to_string(sl.sq) + "_sk" + std::to_string(sl.sk);
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());
    Buffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const Plan& p = b.plan;
    const flash3::Status fs = run_forward(c, p);
    ASSERT_TRUE(fs.ok()) << fs.message;
    const flash3::Status s0 = run_backward(c, p, ds.grad.ptr);
    ASSERT_TRUE(s0.ok()) << s0.message;
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
    const std::vector<uint16_t> g0 = fetch_grad(p, ds.grad.ptr);
    for (const W& w : windows) {
      Case cw = c;
      cw.wl = w.wl, cw.wr = w.wr;
      const flash3::Status st = run_backward(cw, p, ds.grad2.ptr);
      ASSERT_TRUE(st.ok()) << cw.describe() << ": " << st.message;
      ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "backward"));
      const std::vector<uint16_t> g1 = fetch_grad(p, ds.grad2.ptr);
      EXPECT_EQ(std::memcmp(g0.data(), g1.data(), g0.size() * 2), 0)
          << cw.describe() << ": gradients differ from plain causal (window (" << w.wl << ", " << w.wr << "))";
    }
    ASSERT_TRUE(run_references(c, p));
    check_gradients(c, p, g0);
    if (HasFatalFailure()) return;
  }
}

// ===========================================================================
// Random windows (FlashAttention's draw: left, right uniform in [0, sk)), per
// built head-dim pair and seqlen pair, in four kinds (gpu_case.h).
// ===========================================================================
class BwdRandomWindows : public ::testing::TestWithParam<RandomWindowParam> {};

TEST_P(BwdRandomWindows, MatchReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const auto& [h, sl] = GetParam();
  DType dt;
  if (!pick_dtype(h, random_window_dtype(sl), &dt))
    GTEST_SKIP() << "not built: no forward + backward kernel pair " << head_dims_name(h);
  if (quick_mode() && sl.sq >= 4096) GTEST_SKIP() << "quick mode (FLASH3_GPU_TESTS_QUICK=1): seqlen 4224 left out";
  for (Case c : random_window_cases<Case>(GetParam(), dt, "bwd_random_window_")) {
    c.grad_layout = c.layout;
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Bwd, BwdRandomWindows,
                         ::testing::Combine(::testing::ValuesIn(kAllHeadDims),
                                            ::testing::ValuesIn(kRandomWindowSeqlens)),
                         random_window_name);

// ===========================================================================
// softmax_scale is used exactly as given: 0.3 and 0 (uniform P, dq = dk = 0),
// unmasked and causal (with dlse), every built head-dim pair.
// ===========================================================================
TEST(BwdGpu, SoftmaxScaleIsUsedAsGiven) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const std::vector<HeadDims> dims = built_bwd_head_dims();
  if (dims.empty()) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  int i = 0;
  for (const HeadDims& h : dims)
    for (float scale : {0.3f, 0.f})
      for (Mask m : {Mask::kNone, Mask::kCausal}) {
        DType dt;
        pick_dtype(h, (i++ % 2) == 0 ? DType::kBFloat16 : DType::kFloat16, &dt);
        Case c;
        c.dtype = dt, c.d = h.d, c.dv = h.dv;
        c.batch = 2, c.sq = 300, c.sk = 517, c.hq = 4, c.hkv = 2;
        c.scale = scale;
        apply_mask(&c, m);
        c.with_dlse = m == Mask::kCausal;
        c.name = "bwd_scale" + std::string(scale == 0.f ? "0" : "0.3") + "_" +
                 tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + mask_name(m);
        c.seed = fnv1a(c.name);
        check_case(c);
        if (HasFatalFailure()) return;
      }
}

TEST(BwdGpu, NegativeOrInfiniteSoftmaxScaleIsRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  int d = 128, dv = 128;
  pick_built(&dt, &d, &dv);
  Case c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "bwd_bad_scale";
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  for (float scale : {-1.f, -1e-30f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()}) {
    flash3::BackwardArgs a = make_bwd_args(c, b.plan, ds.grad.ptr);
    a.opts.softmax_scale = scale;
    const flash3::Status st = flash3::backward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "softmax_scale " << scale << ": " << st.message;
    EXPECT_NE(st.message.find("softmax_scale"), std::string::npos) << "softmax_scale " << scale << ": " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ===========================================================================
// The caller's stream: all of the backward (preprocess, main kernel, dQ
// conversion, workspace) runs on the stream it is given: out, dout and lse are
// NaN until the held stream restores them, and dq / dk / dv must stay poisoned
// while it is held (run_behind_gate in gpu_case.h); the result is right once
// the stream runs. Internal and caller workspace, default and deterministic.
// ===========================================================================
TEST(BwdGpu, RunsOnTheCallersStream) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  for (int run = 0; run < 3; ++run) {
    const bool caller_ws = run == 1, det = run == 2;
    Case c;
    c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 1000, c.sk = 1000, c.hq = 8, c.hkv = 2;
    c.causal = run != 1;
    c.deterministic = det;
    c.name = std::string("bwd_callers_stream") + (caller_ws ? "_caller_workspace" : "") + (det ? "_deterministic" : "");
    c.seed = fnv1a(c.name);
    const Plan p = make_plan(c);
    DeviceState& ds = dev();
    tu::DeviceBuffer ws;
    check_case(c, [&](const flash3::BackwardArgs& args) {
      flash3::BackwardArgs a = args;
      if (caller_ws) {
        const size_t bytes = flash3::backward_workspace_size(a);
        EXPECT_EQ(ws.reserve(bytes), cudaSuccess);
        a.workspace = ws.ptr;
        a.workspace_bytes = bytes;
      }
      return run_behind_gate(
          ds.stream, [&](cudaStream_t s) { return flash3::backward(a, s); },
          {{ds.out.ptr, size_t(p.out_elems) * 2, "out"},
           {ds.dout.ptr, size_t(p.dout_elems) * 2, "dout"},
           {ds.lse.ptr, n_lse(c) * 4, "lse"}},
          {{ds.grad.ptr, size_t(p.grad_elems) * 2, "dq / dk / dv"}});
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
TEST(BwdGpu, PendingCudaErrorDoesNotFailTheCall) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  Case c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 300, c.sk = 400, c.hq = 4, c.hkv = 2;
  c.causal = true;
  c.name = "bwd_pending_cuda_error";
  c.seed = fnv1a(c.name);
  check_case(c, [](const flash3::BackwardArgs& a) {
    return call_with_pending_error([&] { return flash3::backward(a, dev().stream); }, dev().stream);
  });
}

// lse / dlse with a shape but no data are mistakes, not "absent".
TEST(BwdGpu, LseOrDlseWithShapeButNoDataIsAnError) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  Case c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "bwd_lse_null_data";
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  {
    flash3::BackwardArgs a = make_bwd_args(c, b.plan, ds.grad.ptr);
    a.lse.data = nullptr;
    const flash3::Status st = flash3::backward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "lse (2, 2, 64) with data = null: " << st.message;
  }
  {
    flash3::BackwardArgs a = make_bwd_args(c, b.plan, ds.grad.ptr);
    a.dlse = lse_view(c, nullptr);
    const flash3::Status st = flash3::backward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "dlse (2, 2, 64) with data = null: " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A stream of another device cannot order work on this one.
TEST(BwdGpu, StreamOfAnotherDeviceIsRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int n = 0;
  ASSERT_TRUE(cuda_ok(cudaGetDeviceCount(&n), "device count"));
  if (n < 2) GTEST_SKIP() << "one GPU: a stream of another device needs two";
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  Case c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 2, c.hkv = 2;
  c.name = "bwd_other_device_stream";
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  ASSERT_TRUE(run_forward(c, b.plan).ok());
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "forward"));
  const flash3::BackwardArgs a = make_bwd_args(c, b.plan, ds.grad.ptr);
  expect_other_device_stream_rejected([&](cudaStream_t s) { return flash3::backward(a, s); });
}

// Gradients that alias each other or an input are rejected before any launch;
// disjoint views into one packed (b, s, 3, h, d) buffer are fine
// (PackedAndStridedGradients).
TEST(BwdGpu, GradientAliasingIsRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  if (d != dv) GTEST_SKIP() << "needs a built d == dv variant (dq, dk, dv of one shape)";
  Case c;
  c.dtype = dt, c.d = d, c.dv = dv, c.batch = 2, c.sq = 128, c.sk = 128, c.hq = 4, c.hkv = 4;
  c.name = "bwd_aliasing";
  Buffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  struct Alias {
    const char* what;
    void (*mutate)(flash3::BackwardArgs&);
  };
  const Alias aliases[] = {
      {"dq == dk", [](flash3::BackwardArgs& a) { a.dq.data = a.dk.data; }},
      {"dv == dk", [](flash3::BackwardArgs& a) { a.dv.data = a.dk.data; }},
      {"dk overlaps dq (one row on)", [](flash3::BackwardArgs& a) {
         a.dk.data = static_cast<uint16_t*>(a.dq.data) + a.dq.stride[1];
       }},
      {"dq == q", [](flash3::BackwardArgs& a) { a.dq.data = a.q.data; }},
      {"dk == k", [](flash3::BackwardArgs& a) { a.dk.data = a.k.data; }},
      {"dv == dout", [](flash3::BackwardArgs& a) { a.dv.data = a.dout.data; }},
  };
  for (const Alias& al : aliases) {
    flash3::BackwardArgs a = make_bwd_args(c, b.plan, ds.grad.ptr);
    al.mutate(a);
    const flash3::Status st = flash3::backward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << al.what << ": " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ===========================================================================
// The GPU reference backward itself, against the float64 CPU reference, and its
// low-precision mode against a CPU emulation of the same plain implementation.
// ===========================================================================

// CPU emulation of the plain bf16/fp16 backward (the GPU kLowPrecision mode's
// contract), accumulating in double. Dense layouts as in src/reference.
void cpu_backward_lowp(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, const std::vector<double>& dout, const float* dlse,
                       std::vector<double>* dq, std::vector<double>* dk, std::vector<double>* dv) {
  const auto tp = c.dtype == DType::kBFloat16 ? flash3::ref::LowPrecision::kBFloat16 : flash3::ref::LowPrecision::kFloat16;
  auto rt = [tp](double x) { return flash3::ref::round_to(tp, x); };
  const int sq = c.sq, sk = c.sk, hq = c.hq, hkv = c.hkv, d = c.d, dvd = c.dv, group = hq / hkv;
  const float scale = std::isnan(c.scale) ? 1.f / std::sqrt(float(d)) : c.scale;
  const float cap = c.softcap;
  dq->assign(n_dq(c), 0.0);
  dk->assign(n_dk(c), 0.0);
  dv->assign(n_dv(c), 0.0);
  auto qrow = [&](int b, int h, int i) { return &q[((size_t(b) * sq + i) * hq + h) * d]; };
  auto krow = [&](int b, int h, int j) { return &k[((size_t(b) * sk + j) * hkv + h) * d]; };
  auto vrow = [&](int b, int h, int j) { return &v[((size_t(b) * sk + j) * hkv + h) * dvd]; };
  auto orow = [&](int b, int h, int i) { return &dout[((size_t(b) * sq + i) * hq + h) * dvd]; };
  std::vector<double> S(size_t(sq) * sk), P(size_t(sq) * sk), O(size_t(sq) * dvd), D(static_cast<size_t>(sq));
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < hq; ++h) {
      const int kh = h / group;
      for (int i = 0; i < sq; ++i) {
        int lo, hi;
        key_range(c, i, &lo, &hi);
        for (int j = 0; j < sk; ++j) {
          double& s = S[size_t(i) * sk + j];
          if (j < lo || j >= hi) {
            s = -std::numeric_limits<double>::infinity();
            continue;
          }
          double acc = 0;
          for (int x = 0; x < d; ++x) acc += qrow(b, h, i)[x] * krow(b, kh, j)[x];
          s = rt(float(acc) * scale);
          if (cap > 0) s = rt(cap * std::tanh(float(s) / cap));
        }
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < sk; ++j) m = std::max(m, S[size_t(i) * sk + j]);
        double l = 0;
        if (std::isfinite(m))
          for (int j = 0; j < sk; ++j)
            if (std::isfinite(S[size_t(i) * sk + j])) l += std::exp(S[size_t(i) * sk + j] - m);
        for (int j = 0; j < sk; ++j) {
          const double s = S[size_t(i) * sk + j];
          P[size_t(i) * sk + j] = (!std::isfinite(m) || !std::isfinite(s)) ? 0.0 : rt(std::exp(s - m) / l);
        }
        double dsum = 0;
        for (int x = 0; x < dvd; ++x) {
          double acc = 0;
          for (int j = 0; j < sk; ++j) acc += P[size_t(i) * sk + j] * vrow(b, kh, j)[x];
          O[size_t(i) * dvd + x] = rt(acc);
          dsum += orow(b, h, i)[x] * O[size_t(i) * dvd + x];
        }
        D[size_t(i)] = dsum - (dlse ? double(dlse[(size_t(b) * hq + h) * sq + i]) : 0.0);
        // dS over S.
        for (int j = 0; j < sk; ++j) {
          double& s = S[size_t(i) * sk + j];
          if (!std::isfinite(s)) {
            s = 0;
            continue;
          }
          double dp = 0;
          for (int x = 0; x < dvd; ++x) dp += orow(b, h, i)[x] * vrow(b, kh, j)[x];
          dp = rt(dp);
          double ds = P[size_t(i) * sk + j] * (dp - D[size_t(i)]);
          if (cap > 0) ds *= 1.0 - (s / cap) * (s / cap);
          s = rt(ds);
        }
        double* dqi = &(*dq)[((size_t(b) * sq + i) * hq + h) * d];
        for (int x = 0; x < d; ++x) {
          double acc = 0;
          for (int j = 0; j < sk; ++j) acc += S[size_t(i) * sk + j] * krow(b, kh, j)[x];
          dqi[x] = rt(acc * scale);
        }
      }
      for (int j = 0; j < sk; ++j) {
        double* dkj = &(*dk)[((size_t(b) * sk + j) * hkv + kh) * d];
        double* dvj = &(*dv)[((size_t(b) * sk + j) * hkv + kh) * dvd];
        for (int i = 0; i < sq; ++i) {
          const double ds = S[size_t(i) * sk + j], pij = P[size_t(i) * sk + j];
          for (int x = 0; x < d; ++x) dkj[x] += ds * qrow(b, h, i)[x] * scale;
          for (int x = 0; x < dvd; ++x) dvj[x] += pij * orow(b, h, i)[x];
        }
      }
    }
  for (double& x : *dk) x = rt(x);
  for (double& x : *dv) x = rt(x);
}

TEST(GpuReference, BackwardMatchesCpuFloat64) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  struct S {
    DType dt;
    int b, sq, sk, hq, hkv, d, dv;
    bool causal;
    int wl, wr;
    Layout layout;
    bool dlse;
    float softcap;
    float scale = flash3::gpuref::kDefaultScale;
    const char* tag = "";  // name suffix (the name seeds the inputs)
  };
  constexpr float kNaN = flash3::gpuref::kDefaultScale;
  const S shapes[] = {
      {DType::kBFloat16, 2, 37, 53, 4, 2, 64, 64, true, -1, -1, Layout::kPadded, false, 0.f},      // causal, GQA
      {DType::kFloat16, 1, 65, 65, 2, 2, 128, 128, false, 16, 8, Layout::kPackedQKV, true, 0.f},   // window, dlse
      {DType::kBFloat16, 2, 100, 30, 6, 1, 192, 128, false, 32, 0, Layout::kContiguous, true, 0.f},  // masked rows
      {DType::kFloat16, 1, 1, 300, 3, 3, 256, 256, false, -1, -1, Layout::kContiguous, false, 0.f},  // one query
      {DType::kBFloat16, 1, 70, 70, 2, 2, 96, 96, true, -1, -1, Layout::kPackedQKV, false, 5.f},     // softcap
      {DType::kFloat16, 3, 129, 129, 8, 2, 40, 24, false, 64, 64, Layout::kPadded, false, 0.f},      // odd dims
      {DType::kBFloat16, 1, 200, 1, 4, 1, 64, 64, true, -1, -1, Layout::kContiguous, true, 0.f},     // one key
      // Windows of 2^31 - 1 (unbounded by the arithmetic); causal keeps only the left side.
      {DType::kBFloat16, 2, 37, 53, 4, 2, 64, 64, false, kIntMax, kIntMax, Layout::kContiguous, false, 0.f, kNaN,
       "_intmax"},
      {DType::kFloat16, 1, 90, 40, 2, 1, 64, 64, false, kIntMax, 0, Layout::kContiguous, true, 0.f, kNaN, "_intmax0"},
      {DType::kBFloat16, 1, 77, 77, 2, 2, 64, 64, true, 10, kIntMax, Layout::kPadded, false, 0.f, kNaN,
       "_causal_local"},
      // softmax_scale used as given, 0 included (dq = dk = 0, uniform P).
      {DType::kBFloat16, 2, 50, 61, 2, 1, 128, 128, true, -1, -1, Layout::kContiguous, true, 0.f, 0.3f, "_scale0.3"},
      {DType::kFloat16, 1, 33, 70, 2, 2, 64, 64, false, 20, 5, Layout::kContiguous, false, 0.f, 0.f, "_scale0"},
  };
  for (const S& s : shapes) {
    Case c;
    c.dtype = s.dt, c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv, c.d = s.d, c.dv = s.dv;
    c.causal = s.causal, c.wl = s.wl, c.wr = s.wr;
    c.layout = c.grad_layout = s.layout;
    c.with_dlse = s.dlse;
    c.softcap = s.softcap;
    c.scale = s.scale;
    c.name = "bwdref_" + std::string(tu::short_dtype(s.dt)) + "_b" + std::to_string(s.b) + "_sq" +
             std::to_string(c.sq) + "_sk" + std::to_string(c.sk) + "_d" + std::to_string(s.d) + "x" +
             std::to_string(s.dv) + s.tag;
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());

    Buffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    DeviceState& ds = dev();
    const Plan& p = b.plan;
    ASSERT_TRUE(run_references(c, p));
    // Also the recomputed forward (out / lse outputs) and a one-head-per-chunk scratch.
    const size_t no = size_t(c.batch) * c.sq * c.hq * c.dv, nl = n_lse(c);
    tu::DeviceBuffer g_out, g_lse, small_scratch, c_dq, c_dk, c_dv;
    ASSERT_TRUE(cuda_ok(g_out.reserve(std::max<size_t>(no, 1) * 4), "alloc"));
    ASSERT_TRUE(cuda_ok(g_lse.reserve(std::max<size_t>(nl, 1) * 4), "alloc"));
    ASSERT_TRUE(cuda_ok(c_dq.reserve(std::max<size_t>(n_dq(c), 1) * 4), "alloc"));
    ASSERT_TRUE(cuda_ok(c_dk.reserve(std::max<size_t>(n_dk(c), 1) * 4), "alloc"));
    ASSERT_TRUE(cuda_ok(c_dv.reserve(std::max<size_t>(n_dv(c), 1) * 4), "alloc"));
    auto ca = make_ref_args(c, p, c_dq.as<float>(), c_dk.as<float>(), c_dv.as<float>());
    ca.out = g_out.as<float>();
    ca.lse = g_lse.as<float>();
    const size_t one_head = flash3::gpuref::backward_scratch_bytes(ca) / size_t(c.hq / c.hkv) + 1024;
    ASSERT_TRUE(cuda_ok(small_scratch.reserve(one_head), "alloc"));
    ca.scratch = small_scratch.ptr;
    ca.scratch_bytes = one_head;
    ASSERT_TRUE(cuda_ok(flash3::gpuref::backward(ca, flash3::gpuref::Mode::kFloat32, ds.stream), "gpuref (chunked)"));
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "sync"));

    const std::vector<float> g_dq = fetch_f32(ds.ref_dq, n_dq(c)), g_dk = fetch_f32(ds.ref_dk, n_dk(c)),
                             g_dv = fetch_f32(ds.ref_dv, n_dv(c));
    const std::vector<float> l_dq = fetch_f32(ds.low_dq, n_dq(c)), l_dk = fetch_f32(ds.low_dk, n_dk(c)),
                             l_dv = fetch_f32(ds.low_dv, n_dv(c));
    const std::vector<float> h_out = fetch_f32(g_out, no), h_lse = fetch_f32(g_lse, nl);
    // Chunking (heads per launch) changes nothing: bitwise equal.
    auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
    };
    EXPECT_TRUE(same_bits(fetch_f32(c_dq, n_dq(c)), g_dq)) << c.describe() << ": dq depends on the scratch size";
    EXPECT_TRUE(same_bits(fetch_f32(c_dk, n_dk(c)), g_dk)) << c.describe() << ": dk depends on the scratch size";
    EXPECT_TRUE(same_bits(fetch_f32(c_dv, n_dv(c)), g_dv)) << c.describe() << ": dv depends on the scratch size";

    flash3::ref::Problem pr;
    pr.batch = c.batch, pr.seqlen_q = c.sq, pr.seqlen_k = c.sk, pr.heads_q = c.hq, pr.heads_kv = c.hkv;
    pr.head_dim = c.d, pr.head_dim_v = c.dv;
    flash3::ref::Options opt;
    opt.causal = c.causal, opt.window_left = c.wl, opt.window_right = c.wr, opt.softcap = c.softcap;
    opt.softmax_scale = c.scale;
    const std::vector<double> q = extract(b.host_in, p.in.q, c.dtype), k = extract(b.host_in, p.in.k, c.dtype),
                              v = extract(b.host_in, p.in.v, c.dtype), dout = extract(b.host_dout, p.o, c.dtype);
    std::vector<double> dlse64;
    for (float x : b.host_dlse) dlse64.push_back(x);
    std::vector<double> dq64(n_dq(c)), dk64(n_dk(c)), dv64(n_dv(c)), o64(no), lse64(nl);
    flash3::ref::backward(pr, opt, q.data(), k.data(), v.data(), dout.data(), c.with_dlse ? dlse64.data() : nullptr,
                          dq64.data(), dk64.data(), dv64.data());
    flash3::ref::forward(pr, opt, q.data(), k.data(), v.data(), o64.data(), lse64.data());
    std::vector<double> cdq, cdk, cdv;
    cpu_backward_lowp(c, q, k, v, dout, c.with_dlse ? b.host_dlse.data() : nullptr, &cdq, &cdk, &cdv);

    // fp32 GPU reference == float64 CPU reference within 1e-4 relative to max(1, |x|).
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
    auto err_vs = [](const std::vector<double>& a, const std::vector<double>& r) {
      double m = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (!std::isinf(r[i])) m = std::max(m, std::fabs(a[i] - r[i]));
      return m;
    };
    struct T {
      const char* name;
      const std::vector<float>* gpu;
      const std::vector<float>* low;
      const std::vector<double>* f64;
      const std::vector<double>* cpu_low;
      int64_t s, h, w;
    };
    const T ts[] = {{"dQ", &g_dq, &l_dq, &dq64, &cdq, c.sq, c.hq, c.d},
                    {"dK", &g_dk, &l_dk, &dk64, &cdk, c.sk, c.hkv, c.d},
                    {"dV", &g_dv, &l_dv, &dv64, &cdv, c.sk, c.hkv, c.dv}};
    for (const T& t : ts) {
      size_t at = 0;
      const double e = max_err(*t.gpu, *t.f64, &at);
      EXPECT_LE(e, 1e-4) << c.describe() << ": GPU fp32 reference " << t.name << " differs from the float64 reference by "
                         << e << " at " << where_bshx(at, t.s, t.h, t.w) << " (gpu=" << (*t.gpu)[at]
                         << " cpu=" << (*t.f64)[at] << ")";
      // The emulation's error against float64 is of the size of the CPU emulation's
      // (fp32-vs-double ties may flip a few roundings: a factor of 2 either way).
      const double gl = err_vs(to_double(*t.low), *t.f64), cl = err_vs(*t.cpu_low, *t.f64);
      if (max_abs(*t.f64) > 0.0) {  // (softmax_scale 0: dq = dk = 0 exactly)
        EXPECT_GT(cl, 0.0) << c.describe() << ": CPU " << t.name << " emulation has no error at all";
      }
      EXPECT_GE(gl, 0.5 * cl) << c.describe() << ": " << t.name << " emulation error gpu=" << gl << " cpu=" << cl;
      EXPECT_LE(gl, 2.0 * cl + 1e-6) << c.describe() << ": " << t.name << " emulation error gpu=" << gl << " cpu=" << cl;
    }
    size_t at = 0;
    EXPECT_LE(max_err(h_out, o64, &at), 1e-5) << c.describe() << ": recomputed out at " << at;
    EXPECT_LE(max_err(h_lse, lse64, &at), 1e-5) << c.describe() << ": recomputed lse at " << at;
    // Fully masked rows / unseen keys: exactly zero in both modes.
    std::vector<char> empty_rows, unseen_keys;
    mask_coverage(c, &empty_rows, &unseen_keys);
    int64_t first = -1;
    EXPECT_EQ(nonzero_in_rows(to_double(g_dq), empty_rows, c.batch, c.sq, c.hq, c.d, &first), 0) << "fp32 dq";
    EXPECT_EQ(nonzero_in_rows(to_double(l_dq), empty_rows, c.batch, c.sq, c.hq, c.d, &first), 0) << "lowp dq";
    EXPECT_EQ(nonzero_in_rows(to_double(g_dk), unseen_keys, c.batch, c.sk, c.hkv, c.d, &first), 0) << "fp32 dk";
    EXPECT_EQ(nonzero_in_rows(to_double(l_dv), unseen_keys, c.batch, c.sk, c.hkv, c.dv, &first), 0) << "lowp dv";
  }
}

// The reference handles empty problems like the library must.
TEST(GpuReference, BackwardEmpty) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DeviceState& ds = dev();
  for (int which = 0; which < 2; ++which) {
    Case c;
    c.batch = 2, c.hq = 4, c.hkv = 2, c.d = 64, c.dv = 64;
    c.sq = which == 0 ? 0 : 50;
    c.sk = which == 0 ? 50 : 0;
    c.name = which == 0 ? "bwdref_empty_q" : "bwdref_empty_k";
    SCOPED_TRACE(c.describe());
    Buffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    for (tu::DeviceBuffer* x : {&ds.ref_dq, &ds.ref_dk, &ds.ref_dv, &ds.low_dq, &ds.low_dk, &ds.low_dv})
      // On the (non-blocking) test stream, ordered before the references' zeroing
      // (a legacy-stream cudaMemset would race with it).
      ASSERT_TRUE(cuda_ok(cudaMemsetAsync(x->ptr, 0xff, x->bytes, ds.stream), "poison"));
    ASSERT_TRUE(run_references(c, b.plan));
    ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(ds.stream), "sync"));
    for (auto [buf, n] : {std::pair{&ds.ref_dq, n_dq(c)}, std::pair{&ds.ref_dk, n_dk(c)},
                          std::pair{&ds.ref_dv, n_dv(c)}, std::pair{&ds.low_dq, n_dq(c)}}) {
      const std::vector<float> h = fetch_f32(*buf, n);
      int64_t bad = 0;
      for (float x : h) bad += !(x == 0.f);
      EXPECT_EQ(bad, 0);
    }
  }
}

// ===========================================================================
// The manifest's variant list ("bwd <dtype> <d> <dv>" rows) and backward_is_built() agree.
// ===========================================================================
TEST(BwdGpu, VariantsFileMatchesIsBuilt) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  bool found = false;
  const std::vector<tu::Variant> vars = tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), &found);
  ASSERT_TRUE(found) << "cannot read " << tu::variants_path(FLASH3_VARIANTS_FILE) << " (set FLASH3_VARIANTS_FILE)";
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (HeadDims h : kAllHeadDims) {
      bool listed = false;
      for (const tu::Variant& v : vars)
        listed |= v.pass == "bwd" && v.dtype == tu::short_dtype(dt) && v.d == h.d && v.dv == h.dv;
      EXPECT_EQ(listed, flash3::backward_is_built(dt, h.d, h.dv))
          << tu::short_dtype(dt) << " " << h.d << "x" << h.dv << ": variants.txt and backward_is_built() disagree";
    }
}

// ===========================================================================
// Softcap: opts.softcap > 0 caps the scaled scores, s -> softcap * tanh(s /
// softcap); the backward goes through the tanh (dS_raw = dS * (1 - tanh^2)).
// The forward (out / lse of the capped scores) and the backward run with the
// same cap; the fp32 GPU reference recomputes everything with it. A (dtype,
// head dims) pair runs only where variants.txt lists both its "fwd ... softcap"
// and "bwd ... softcap" units (FLASH3_FEATURES) and the plain kernels are built.
// ===========================================================================
struct SoftcapShape {
  const char* tag;
  int b, sq, sk, hq, hkv;
  Layout layout, grad_layout;  // kPackedQKV falls back to kContiguous where not packable
  float scale;                 // NaN: 1/sqrt(d)
  bool dlse;
};
// sq not a multiple of 64, sk not a multiple of any tile, sq > sk (causal: fully
// masked rows and keys no query sees), decode-like, several KV blocks; MHA, GQA,
// MQA; default and explicit softmax_scale; dlse on two.
constexpr SoftcapShape kSoftcapShapes[] = {
    {"sq128_sk128_mha2x2", 2, 128, 128, 2, 2, Layout::kPackedQKV, Layout::kPackedQKV, flash3::gpuref::kDefaultScale,
     false},
    {"sq113_sk203_mqa4x1", 2, 113, 203, 4, 1, Layout::kPadded, Layout::kContiguous, 0.3f, true},
    {"sq300_sk177_gqa4x2", 1, 300, 177, 4, 2, Layout::kContiguous, Layout::kPadded, flash3::gpuref::kDefaultScale,
     false},
    {"sq1_sk257_mqa4x1", 2, 1, 257, 4, 1, Layout::kContiguous, Layout::kContiguous, 1.f, true},
    {"sq257_sk700_gqa4x2", 1, 257, 700, 4, 2, Layout::kPadded, Layout::kPadded, 1.f, false},
};

// The softcap cases of one (dtype, head dims) pair. full: every mask x shape
// (15; the causal one on the last shape deterministic) plus softmax_scale 0
// (uniform P, dq = dk = 0) with dlse; else the 5 with shape index % 3 == mask
// index. The cap cycles so that every mask sees every cap.
std::vector<Case> softcap_cases(DType dt, HeadDims h, bool full) {
  std::vector<Case> out;
  constexpr int kShapes = int(sizeof(kSoftcapShapes) / sizeof(kSoftcapShapes[0]));
  for (int m = 0; m < 3; ++m)
    for (int si = 0; si < kShapes; ++si) {
      if (!full && si % 3 != m) continue;
      const SoftcapShape& s = kSoftcapShapes[si];
      const SoftcapMask& mk = kSoftcapMasks[m];
      Case c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv;
      c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
      c.causal = mk.causal, c.wl = mk.wl, c.wr = mk.wr;
      const bool pack = packable(c);
      c.layout = s.layout == Layout::kPackedQKV && !pack ? Layout::kContiguous : s.layout;
      c.grad_layout = s.grad_layout == Layout::kPackedQKV && !pack ? Layout::kContiguous : s.grad_layout;
      c.scale = s.scale;
      c.softcap = kSoftcaps[(m + si) % 3];
      c.with_dlse = s.dlse;
      c.deterministic = full && mk.causal && si == kShapes - 1;
      c.name = "bwd_softcap" + num_name(c.softcap) + "_" + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" +
               mk.name + "_" + s.tag + (std::isnan(s.scale) ? "" : "_scale" + num_name(s.scale)) +
               (c.deterministic ? "_deterministic" : "");
      c.seed = fnv1a(c.name);
      out.push_back(c);
    }
  if (full) {  // softmax_scale 0: every capped score is 0 (uniform P), dq = dk = 0
    Case c;
    c.dtype = dt, c.d = h.d, c.dv = h.dv;
    c.batch = 2, c.sq = 300, c.sk = 177, c.hq = 4, c.hkv = 2;
    c.causal = true;
    c.scale = 0.f;
    c.softcap = 5.f;
    c.with_dlse = true;
    c.name = "bwd_softcap5_" + std::string(tu::short_dtype(dt)) + "_" + head_dims_name(h) + "_causal_scale0";
    c.seed = fnv1a(c.name);
    out.push_back(c);
  }
  return out;
}

// Every head-dim pair: bf16 (fp16 where bf16 has no softcap units) with every
// case, then the other dtype, where built, with the reduced set.
class SoftcapBwdHeadDims : public ::testing::TestWithParam<HeadDims> {};

TEST_P(SoftcapBwdHeadDims, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return softcap_built(dt, h, true); },
                                [&](DType dt, bool full) { return softcap_cases(dt, h, full); },
                                [](const Case& c) { check_case(c); });
  if (ran == 0)
    GTEST_SKIP() << "not built: no forward + backward softcap kernel pair " << head_dims_name(h)
                 << " (FLASH3_FEATURES / FLASH3_HDIMS)";
}

INSTANTIATE_TEST_SUITE_P(Softcap, SoftcapBwdHeadDims, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// The first pair with softcap units, preferring bf16 d = 128.
bool pick_softcap_built(DType* dt, HeadDims* hd) {
  const HeadDims prefs[] = {{128, 128}, {64, 64}, {256, 256}, {96, 96}, {192, 192}, {192, 128}};
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (const HeadDims& h : prefs)
      if (softcap_built(t, h, true)) {
        *dt = t, *hd = h;
        return true;
      }
  return false;
}

// Deterministic mode with softcap: bitwise identical dq / dk / dv over 3 runs,
// and the result passes the tolerance rule (causal MQA with dlse; local window
// GQA with a saturating cap and explicit scale).
TEST(SoftcapBwd, DeterministicBitwise) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  HeadDims hd;
  if (!pick_softcap_built(&dt, &hd)) GTEST_SKIP() << "not built: no forward + backward softcap kernel pair";
  struct S {
    const char* tag;
    int b, sq, sk, hq, hkv;
    SoftcapMask m;
    float cap, scale;
    bool dlse;
  };
  const S shapes[] = {{"causal_mqa4x1_cap5", 2, 300, 300, 4, 1, kSoftcapMasks[1], 5.f, flash3::gpuref::kDefaultScale, true},
                      {"local_gqa4x2_cap1", 1, 200, 450, 4, 2, kSoftcapMasks[2], 1.f, 1.f, false}};
  for (const S& s : shapes) {
    Case c;
    c.dtype = dt, c.d = hd.d, c.dv = hd.dv, c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.hq, c.hkv = s.hkv;
    c.causal = s.m.causal, c.wl = s.m.wl, c.wr = s.m.wr;
    c.softcap = s.cap, c.scale = s.scale, c.with_dlse = s.dlse;
    c.deterministic = true;
    c.name = std::string("bwd_softcap_deterministic_") + head_dims_name(hd) + "_" + s.tag;
    c.seed = fnv1a(c.name);
    check_deterministic(c, 3);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
