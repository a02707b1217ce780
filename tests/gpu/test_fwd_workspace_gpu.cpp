// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Caller-provided forward workspace (ForwardArgs::workspace, forward_workspace_size())
// on a Hopper GPU, bf16 d = 128:
//   (a) causal fixed length, seqlen 1024: the persistent causal kernel's tile
//       counter (256 bytes);
//   (b) unmasked fixed length: no workspace needed (0 bytes);
//   (c) causal varlen, 3 sequences, GQA 8:2, pack_gqa 1 and 0: the per-sequence
//       tensor maps and the tile map.
// Each case runs with workspace NULL (flash3 allocates), checked against the
// fp32 GPU reference under the tolerance rule, then twice in a caller workspace
// of exactly forward_workspace_size() bytes that starts as 0xff garbage: O and
// LSE must be bitwise equal to the NULL run's and nothing past the workspace
// may be written. A workspace one byte too small, or 16 bytes off 256-byte
// alignment, is kInvalidArgument naming "workspace", with out / lse left as
// poisoned before the call. CUDA graphs: a forward captured with a caller
// workspace contains no allocation node and replays twice (the workspace
// poisoned before each replay) to the eager result.
//
// Self-contained: gpu_helpers.cuh, gpu_test_util.h and the references only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "graph_capture.h"
#include "reference/reference.h"

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
namespace gr = flash3::gpuref;
namespace gputest = flash3::gputest;

constexpr size_t kTileCounterBytes = 256;  // kFwdTileCounterBytes (src/launch/dispatch.h)
constexpr size_t kWsGuard = 4096;          // poisoned bytes after the workspace
constexpr uint8_t kPoison = 0xff;          // NaN in bf16 and fp32, -1 as int32
constexpr double kEpsO = 1e-5;
constexpr double kEpsLse = 1e-5;

enum class Need { kNone, kTileCounter, kSome };

struct Case {
  std::string name;
  bool varlen = false;
  int batch = 1;                   // fixed length
  std::vector<int> len_q, len_k;   // fixed length: one entry each (sq, sk)
  int hq = 8, hkv = 8, d = 128, dv = 128;
  bool causal = false;
  int pack_gqa = -1;
  DType dt = DType::kBFloat16;
  Need need = Need::kNone;

  int sequences() const { return varlen ? int(len_q.size()) : batch; }
  int lq(int b) const { return varlen ? len_q[b] : len_q[0]; }
  int lk(int b) const { return varlen ? len_k[b] : len_k[0]; }
  int64_t off_q(int b) const {  // first row of sequence / batch element b
    int64_t o = 0;
    for (int i = 0; i < b; ++i) o += lq(i);
    return o;
  }
  int64_t off_k(int b) const {
    int64_t o = 0;
    for (int i = 0; i < b; ++i) o += lk(i);
    return o;
  }
  int64_t total_q() const { return off_q(sequences()); }
  int64_t total_k() const { return off_k(sequences()); }
  std::string describe() const {
    return name + " (" + tu::short_dtype(dt) + " d=" + std::to_string(d) + " hq=" + std::to_string(hq) +
           " hkv=" + std::to_string(hkv) + " causal=" + std::to_string(causal) +
           " pack_gqa=" + std::to_string(pack_gqa) + ")";
  }
};

Case causal_fixed() {
  Case c;
  c.name = "causal_fixed";
  c.batch = 2;
  c.len_q = {1024};
  c.len_k = {1024};
  c.causal = true;
  c.need = Need::kTileCounter;
  return c;
}

Case unmasked_fixed() {
  Case c = causal_fixed();
  c.name = "unmasked_fixed";
  c.causal = false;
  c.need = Need::kNone;
  return c;
}

Case causal_varlen(int pack_gqa) {
  Case c;
  c.name = "causal_varlen_gqa8x2_pack" + std::to_string(pack_gqa);
  c.varlen = true;
  c.len_q = {300, 1, 700};
  c.len_k = {500, 64, 1000};
  c.hq = 8;
  c.hkv = 2;
  c.causal = true;
  c.pack_gqa = pack_gqa;
  c.need = Need::kSome;
  return c;
}

uint64_t seed_of(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

::testing::AssertionResult cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
}

struct Outputs {
  std::vector<uint16_t> out;
  std::vector<uint32_t> lse;  // fp32 bit patterns
};

// The device side of one case: inputs, outputs, prefix sums, a stream.
struct Problem {
  const Case& c;
  cudaStream_t stream = nullptr;
  tu::DeviceBuffer q, k, v, out, lse, cu_q, cu_k;
  int64_t q_elems = 0, k_elems = 0, v_elems = 0, o_elems = 0, lse_elems = 0;

  explicit Problem(const Case& cs) : c(cs) {}
  ~Problem() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }

  ::testing::AssertionResult setup() {
    auto r = cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    if (!r) return r;
    q_elems = c.total_q() * c.hq * c.d;
    k_elems = c.total_k() * c.hkv * c.d;
    v_elems = c.total_k() * c.hkv * c.dv;
    o_elems = c.total_q() * c.hq * c.dv;
    lse_elems = c.total_q() * c.hq;
    for (auto [buf, bytes] : {std::pair{&q, q_elems * 2}, std::pair{&k, k_elems * 2}, std::pair{&v, v_elems * 2},
                              std::pair{&out, o_elems * 2}, std::pair{&lse, lse_elems * 4},
                              std::pair{&cu_q, int64_t(c.sequences() + 1) * 4},
                              std::pair{&cu_k, int64_t(c.sequences() + 1) * 4}})
      if (!(r = cuda_ok(buf->reserve(size_t(bytes)), "cudaMalloc"))) return r;
    const uint64_t seed = seed_of(c.name);
    if (!(r = cuda_ok(gputest::fill_normal_device(q.ptr, q_elems, c.dt, seed + 1, stream), "fill q"))) return r;
    if (!(r = cuda_ok(gputest::fill_normal_device(k.ptr, k_elems, c.dt, seed + 2, stream), "fill k"))) return r;
    if (!(r = cuda_ok(gputest::fill_normal_device(v.ptr, v_elems, c.dt, seed + 3, stream), "fill v"))) return r;
    if (c.varlen) {
      std::vector<int32_t> hq_cu(c.sequences() + 1), hk_cu(c.sequences() + 1);
      for (int b = 0; b <= c.sequences(); ++b) hq_cu[b] = int32_t(c.off_q(b)), hk_cu[b] = int32_t(c.off_k(b));
      if (!(r = cuda_ok(cudaMemcpyAsync(cu_q.ptr, hq_cu.data(), hq_cu.size() * 4, cudaMemcpyHostToDevice, stream),
                        "upload cu_seqlens_q")))
        return r;
      if (!(r = cuda_ok(cudaMemcpyAsync(cu_k.ptr, hk_cu.data(), hk_cu.size() * 4, cudaMemcpyHostToDevice, stream),
                        "upload cu_seqlens_k")))
        return r;
    }
    return cuda_ok(cudaStreamSynchronize(stream), "setup");
  }

  flash3::ForwardArgs args(void* workspace, size_t workspace_bytes) const {
    flash3::ForwardArgs a;
    if (c.varlen) {
      const int64_t tq = c.total_q(), tk = c.total_k();
      a.q = TensorView::make3d(q.ptr, c.dt, tq, c.hq, c.d, int64_t(c.hq) * c.d, c.d, 1);
      a.k = TensorView::make3d(k.ptr, c.dt, tk, c.hkv, c.d, int64_t(c.hkv) * c.d, c.d, 1);
      a.v = TensorView::make3d(v.ptr, c.dt, tk, c.hkv, c.dv, int64_t(c.hkv) * c.dv, c.dv, 1);
      a.out = TensorView::make3d(out.ptr, c.dt, tq, c.hq, c.dv, int64_t(c.hq) * c.dv, c.dv, 1);
      const int64_t l[2] = {c.hq, tq};
      a.lse = TensorView::contiguous(lse.ptr, DType::kFloat32, 2, l);
      a.opts.cu_seqlens_q = cu_q.as<int>();
      a.opts.cu_seqlens_k = cu_k.as<int>();
      a.opts.num_sequences = c.sequences();
      a.opts.max_seqlen_q = *std::max_element(c.len_q.begin(), c.len_q.end());
      a.opts.max_seqlen_k = *std::max_element(c.len_k.begin(), c.len_k.end());
    } else {
      const int64_t b = c.batch, sq = c.len_q[0], sk = c.len_k[0];
      a.q = TensorView::make4d(q.ptr, c.dt, b, sq, c.hq, c.d, sq * c.hq * c.d, int64_t(c.hq) * c.d, c.d, 1);
      a.k = TensorView::make4d(k.ptr, c.dt, b, sk, c.hkv, c.d, sk * c.hkv * c.d, int64_t(c.hkv) * c.d, c.d, 1);
      a.v = TensorView::make4d(v.ptr, c.dt, b, sk, c.hkv, c.dv, sk * c.hkv * c.dv, int64_t(c.hkv) * c.dv, c.dv, 1);
      a.out = TensorView::make4d(out.ptr, c.dt, b, sq, c.hq, c.dv, sq * c.hq * c.dv, int64_t(c.hq) * c.dv, c.dv, 1);
      a.lse = TensorView::make3d(lse.ptr, DType::kFloat32, b, c.hq, sq, c.hq * sq, sq, 1);
    }
    a.opts.causal = c.causal;
    a.opts.pack_gqa = c.pack_gqa;
    a.workspace = workspace;
    a.workspace_bytes = workspace_bytes;
    return a;
  }

  cudaError_t poison_outputs(cudaStream_t s) const {
    cudaError_t e = cudaMemsetAsync(out.ptr, kPoison, size_t(o_elems) * 2, s);
    return e == cudaSuccess ? cudaMemsetAsync(lse.ptr, kPoison, size_t(lse_elems) * 4, s) : e;
  }

  // Bytes of out and lse that are not the poison (read after the stream drained).
  int64_t unpoisoned() const {
    int64_t a = -1, b = -1;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return -1;
    if (gputest::count_bytes_not(out.ptr, size_t(o_elems) * 2, kPoison, &a) != cudaSuccess) return -1;
    if (gputest::count_bytes_not(lse.ptr, size_t(lse_elems) * 4, kPoison, &b) != cudaSuccess) return -1;
    return a + b;
  }

  ::testing::AssertionResult download(Outputs* o) const {
    auto r = cuda_ok(cudaStreamSynchronize(stream), "sync");
    if (!r) return r;
    o->out.resize(size_t(o_elems));
    o->lse.resize(size_t(lse_elems));
    if (!(r = cuda_ok(cudaMemcpy(o->out.data(), out.ptr, o->out.size() * 2, cudaMemcpyDeviceToHost), "fetch out")))
      return r;
    return cuda_ok(cudaMemcpy(o->lse.data(), lse.ptr, o->lse.size() * 4, cudaMemcpyDeviceToHost), "fetch lse");
  }

  // Poisons out / lse, runs the forward on the stream and downloads the results.
  flash3::Status run(void* workspace, size_t workspace_bytes, Outputs* o) const {
    if (poison_outputs(stream) != cudaSuccess) return flash3::Status::Cuda("poison");
    flash3::Status s = flash3::forward(args(workspace, workspace_bytes), stream);
    if (s.ok() && !download(o)) return flash3::Status::Cuda("download");
    return s;
  }
};

// O and LSE against the fp32 GPU reference (per sequence for varlen) under
// the tolerance rule: max|ours - ref| <= 2 max|plain bf16 - ref| + eps.
void check_reference(const Problem& p, const Outputs& got) {
  const Case& c = p.c;
  const int64_t tq = c.total_q();
  tu::DeviceBuffer ref_o, low_o, ref_l, low_l;
  for (tu::DeviceBuffer* b : {&ref_o, &low_o}) FLASH3_CUDA_OK(b->reserve(size_t(p.o_elems) * 4));
  for (tu::DeviceBuffer* b : {&ref_l, &low_l}) FLASH3_CUDA_OK(b->reserve(size_t(p.lse_elems) * 4));
  // Fixed length: one call over the batch (the dense layouts are ours). Varlen:
  // one batch-1 call per sequence; its out rows land where ours are, its LSE
  // block (hq, len) at offset off_q * hq.
  const int calls = c.varlen ? c.sequences() : 1;
  for (int i = 0; i < calls; ++i) {
    if (c.varlen && c.lq(i) == 0) continue;
    const int64_t oq = c.varlen ? c.off_q(i) : 0, ok = c.varlen ? c.off_k(i) : 0;
    gr::Args r;
    r.dtype = c.dt;
    r.batch = c.varlen ? 1 : c.batch;
    r.seqlen_q = c.lq(i);
    r.seqlen_k = c.lk(i);
    r.heads_q = c.hq;
    r.heads_kv = c.hkv;
    r.head_dim = c.d;
    r.head_dim_v = c.dv;
    r.q = {p.q.as<uint16_t>() + oq * c.hq * c.d, int64_t(r.seqlen_q) * c.hq * c.d, int64_t(c.hq) * c.d, c.d};
    r.k = {p.k.as<uint16_t>() + ok * c.hkv * c.d, int64_t(r.seqlen_k) * c.hkv * c.d, int64_t(c.hkv) * c.d, c.d};
    r.v = {p.v.as<uint16_t>() + ok * c.hkv * c.dv, int64_t(r.seqlen_k) * c.hkv * c.dv, int64_t(c.hkv) * c.dv, c.dv};
    r.causal = c.causal;
    for (gr::Mode m : {gr::Mode::kFloat32, gr::Mode::kLowPrecision}) {
      const bool f32 = m == gr::Mode::kFloat32;
      r.out = (f32 ? ref_o : low_o).as<float>() + oq * c.hq * c.dv;
      r.lse = (f32 ? ref_l : low_l).as<float>() + oq * c.hq;
      FLASH3_CUDA_OK(gr::forward(r, m, p.stream));
    }
  }
  FLASH3_CUDA_OK(cudaStreamSynchronize(p.stream));
  auto fetch = [](const tu::DeviceBuffer& b, int64_t n) {
    std::vector<float> h(static_cast<size_t>(n));
    cudaMemcpy(h.data(), b.ptr, h.size() * 4, cudaMemcpyDeviceToHost);
    return std::vector<double>(h.begin(), h.end());
  };
  const std::vector<double> ro = fetch(ref_o, p.o_elems), lo = fetch(low_o, p.o_elems);
  const std::vector<double> rl_raw = fetch(ref_l, p.lse_elems), ll_raw = fetch(low_l, p.lse_elems);
  std::vector<double> oo(got.out.size()), ol(got.lse.size()), rl(got.lse.size()), ll(got.lse.size());
  for (size_t i = 0; i < oo.size(); ++i) oo[i] = tu::half_bits_to_float(c.dt, got.out[i]);
  for (size_t i = 0; i < ol.size(); ++i) ol[i] = tu::bits_f32(got.lse[i]);
  if (c.varlen) {  // the reference's per-sequence (hq, len) blocks -> our (hq, total_q)
    for (int s = 0; s < c.sequences(); ++s)
      for (int h = 0; h < c.hq; ++h)
        for (int r = 0; r < c.lq(s); ++r) {
          const size_t from = size_t(c.off_q(s) * c.hq + int64_t(h) * c.lq(s) + r);
          const size_t to = size_t(int64_t(h) * tq + c.off_q(s) + r);
          rl[to] = rl_raw[from];
          ll[to] = ll_raw[from];
        }
  } else {
    rl = rl_raw;
    ll = ll_raw;
  }
  const auto co = flash3::ref::check_close(oo.data(), ro.data(), lo.data(), oo.size(), kEpsO);
  EXPECT_TRUE(co.ok) << c.describe() << ": O error " << co.err << " > bound " << co.bound << " (plain bf16 "
                     << co.base_err << ", " << co.nan_count << " NaN)";
  const auto cl = flash3::ref::check_close(ol.data(), rl.data(), ll.data(), ol.size(), kEpsLse);
  EXPECT_TRUE(cl.ok) << c.describe() << ": LSE error " << cl.err << " > bound " << cl.bound << " (plain bf16 "
                     << cl.base_err << ", " << cl.nan_count << " NaN)";
}

// The checks of the header for one case.
void check_caller_workspace(const Case& c) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  if (!flash3::forward_is_built(c.dt, c.d, c.dv))
    GTEST_SKIP() << "not built: forward " << tu::short_dtype(c.dt) << " " << c.d << "x" << c.dv;
  SCOPED_TRACE(c.describe());
  Problem p(c);
  ASSERT_TRUE(p.setup());

  const size_t need = flash3::forward_workspace_size(p.args(nullptr, 0));
  ::testing::Test::RecordProperty(c.name + "_bytes", std::to_string(need));
  switch (c.need) {
    case Need::kNone: EXPECT_EQ(need, 0u) << "an unmasked fixed-length forward needs no workspace"; break;
    case Need::kTileCounter: EXPECT_EQ(need, kTileCounterBytes) << "the persistent causal kernel's tile counter"; break;
    case Need::kSome: EXPECT_GT(need, 0u) << "a varlen forward needs its per-sequence maps"; break;
  }

  // NULL: flash3 allocates.
  Outputs ref;
  {
    const flash3::Status s = p.run(nullptr, 0, &ref);
    ASSERT_TRUE(s.ok()) << "workspace NULL: " << s.message;
  }
  check_reference(p, ref);
  if (::testing::Test::HasFatalFailure()) return;

  // Exactly forward_workspace_size() bytes of garbage, a poisoned guard after it.
  tu::DeviceBuffer ws;
  FLASH3_CUDA_OK(ws.reserve(need + kWsGuard));
  FLASH3_CUDA_OK(cudaMemsetAsync(ws.ptr, kPoison, need + kWsGuard, p.stream));
  auto guard_written = [&] {
    int64_t n = -1;
    EXPECT_EQ(cudaStreamSynchronize(p.stream), cudaSuccess);
    EXPECT_EQ(gputest::count_bytes_not(ws.as<char>() + need, kWsGuard, kPoison, &n), cudaSuccess);
    return n;
  };
  for (const char* run : {"first run", "second run (the first run's workspace contents)"}) {
    SCOPED_TRACE(run);
    Outputs got;
    const flash3::Status s = p.run(ws.ptr, need, &got);
    ASSERT_TRUE(s.ok()) << "caller workspace of " << need << " bytes: " << s.message;
    EXPECT_TRUE(got.out == ref.out) << "O differs bitwise from the NULL-workspace run";
    EXPECT_TRUE(got.lse == ref.lse) << "LSE differs bitwise from the NULL-workspace run";
    EXPECT_EQ(guard_written(), 0) << "written past the end of a " << need << "-byte workspace";
  }

  // Rejected before anything runs: out / lse keep their poison.
  auto expect_rejected = [&](void* w, size_t bytes, const char* what, const char* sub) {
    SCOPED_TRACE(what);
    FLASH3_CUDA_OK(p.poison_outputs(p.stream));
    FLASH3_CUDA_OK(cudaStreamSynchronize(p.stream));
    const flash3::Status s = flash3::forward(p.args(w, bytes), p.stream);
    EXPECT_EQ(s.code, flash3::StatusCode::kInvalidArgument) << s.message;
    EXPECT_NE(s.message.find("workspace"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find(sub), std::string::npos) << s.message;
    EXPECT_EQ(p.unpoisoned(), 0) << "a rejected call wrote out / lse";
    EXPECT_EQ(guard_written(), 0) << "a rejected call wrote past the workspace";
    FLASH3_CUDA_OK(cudaGetLastError());
  };
  if (need > 0) expect_rejected(ws.ptr, need - 1, "one byte too small", "needed");
  expect_rejected(ws.as<char>() + 16, need, "16 bytes off alignment", "256-byte aligned");
  FLASH3_CUDA_OK(cudaGetLastError());
}

// A forward captured with a caller workspace: no allocation node; two replays
// (outputs and workspace poisoned before each) give the eager result bitwise.
void check_graph(const Case& c) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  if (!flash3::forward_is_built(c.dt, c.d, c.dv))
    GTEST_SKIP() << "not built: forward " << tu::short_dtype(c.dt) << " " << c.d << "x" << c.dv;
  SCOPED_TRACE(c.describe());
  Problem p(c);
  ASSERT_TRUE(p.setup());
  const size_t need = flash3::forward_workspace_size(p.args(nullptr, 0));
  ASSERT_GT(need, 0u);
  tu::DeviceBuffer ws;
  FLASH3_CUDA_OK(ws.reserve(need));
  // Eager run, also the warm-up (first launches set the kernels' attributes).
  Outputs eager;
  {
    const flash3::Status s = p.run(ws.ptr, need, &eager);
    ASSERT_TRUE(s.ok()) << "eager run: " << s.message;
  }
  check_reference(p, eager);
  if (::testing::Test::HasFatalFailure()) return;

  FLASH3_CUDA_OK(p.poison_outputs(p.stream));
  FLASH3_CUDA_OK(cudaMemsetAsync(ws.ptr, kPoison, need, p.stream));
  FLASH3_CUDA_OK(cudaStreamSynchronize(p.stream));
  gputest::CapturedForward g;
  gputest::capture_forward(p.args(ws.ptr, need), p.stream, &g);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(p.unpoisoned(), 0) << "capturing the forward ran it";
  for (int replay = 1; replay <= 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    FLASH3_CUDA_OK(p.poison_outputs(p.stream));
    FLASH3_CUDA_OK(cudaMemsetAsync(ws.ptr, kPoison, need, p.stream));
    FLASH3_CUDA_OK(cudaGraphLaunch(g.exec, p.stream));
    Outputs got;
    ASSERT_TRUE(p.download(&got));
    FLASH3_CUDA_OK(cudaGetLastError());
    EXPECT_TRUE(got.out == eager.out) << "O of the replay differs bitwise from the eager run";
    EXPECT_TRUE(got.lse == eager.lse) << "LSE of the replay differs bitwise from the eager run";
  }
}

TEST(FwdWorkspaceGpu, CausalFixedLengthTileCounter) { check_caller_workspace(causal_fixed()); }
TEST(FwdWorkspaceGpu, UnmaskedFixedLengthNeedsNone) { check_caller_workspace(unmasked_fixed()); }
TEST(FwdWorkspaceGpu, VarlenGqaPacked) { check_caller_workspace(causal_varlen(1)); }
TEST(FwdWorkspaceGpu, VarlenGqaUnpacked) { check_caller_workspace(causal_varlen(0)); }

TEST(FwdWorkspaceGpu, CudaGraphVarlenPacked) { check_graph(causal_varlen(1)); }
TEST(FwdWorkspaceGpu, CudaGraphVarlenUnpacked) { check_graph(causal_varlen(0)); }
TEST(FwdWorkspaceGpu, CudaGraphCausalFixedLength) { check_graph(causal_fixed()); }

}  // namespace
