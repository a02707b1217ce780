// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU correctness tests of the variable-length (varlen) flash3::forward and
// flash3::backward (AttentionOptions::cu_seqlens_q / cu_seqlens_k / seqused_q /
// seqused_k). The backward tests (suites VarlenBwd*: gtest filter '*VarlenBwd*')
// are described at "BACKWARD" below; this header describes the forward ones.
//
// Layouts (flash3.h): q (total_q, hq, d), k (total_k, hkv, d), v (total_k, hkv, dv),
// out (total_q, hq, dv), lse (hq, total_q) fp32. Sequence b owns rows
// [cu[b], cu[b+1]); seqused[b] (clamped to [0, cu[b+1] - cu[b]]) of them are real.
//
// The reference does not share the kernels' index arithmetic: each sequence is
// cut out on the host (a dense copy of its used q rows and used k / v rows) and
// computed as its own fixed-length problem (batch 1, seqused_q_b x seqused_k_b,
// bottom-right mask of that problem) by the existing references:
//   * small sequences: the float64 CPU reference and its plain-bf16/fp16
//     emulation (src/reference),
//   * larger ones: the fp32 GPU reference and its GPU emulation (gpu_reference.cuh).
// Each sequence's O and LSE are judged separately with the FlashAttention rule
// (flash3::ref::check_close): max|ours - ref| <= 2 * max|plain_lowp - ref| + eps.
// out / lse are poisoned (NaN) before every call; rows beyond seqused, the
// padding of strided layouts and the guards after both tensors must still hold
// the poison afterwards.
//
// Every test first skips without a Hopper GPU, and a case whose (dtype, head_dim,
// head_dim_v) forward kernel is not built skips with "not built: ...".
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
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "reference/reference.h"
#include "varlen_case.h"

namespace flash3 {
// Internal linkage: only for this file's parameter printing.
static void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace flash3

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

// Sequences whose reference work (sq * sk * hq * (d + dv)) is at most this run on
// the float64 CPU reference, the others on the fp32 GPU reference.
constexpr double kCpuRefWork = 8e6;

// ---------------------------------------------------------------------------
// Device state shared by all tests of the process (buffers only grow): the
// varlen forward's (varlen_case.h) and more.
// ---------------------------------------------------------------------------
struct DeviceState : VarlenDevice {
  tu::DeviceBuffer out2, lse2;  // a second out / lse, like out / lse
  tu::DeviceBuffer seq_in;      // per-sequence GPU reference: a dense copy of the sequence's inputs
  // Backward: dout, dlse, two gradient allocations (dq, dk, dv in each), and the
  // per-sequence GPU reference backward (inputs, fp32 / emulated dq, dk, dv, scratch).
  tu::DeviceBuffer dout, dlse, grad, grad2;
  tu::DeviceBuffer seq_bwd, seq_dlse, ref_g[3], low_g[3], scratch;
};

DeviceState& dev() { return device_state<DeviceState>(); }

// Plans, reserves the buffers (out2 / lse2 like out / lse), fills q/k/v with
// fresh random normals (seeded by the case), uploads.
::testing::AssertionResult upload_inputs(const VCase& c, VBuffers* b) {
  DeviceState& d = dev();
  const ::testing::AssertionResult r = upload_varlen_inputs(d, c, b);
  if (!r) return r;
  return reserve_all({{&d.out2, size_t(b->plan.out_elems) * 2}, {&d.lse2, size_t(b->plan.lse_elems) * 4}});
}

// ---------------------------------------------------------------------------
// Per-sequence reference: sequence s cut out of host_in as its own fixed-length
// problem (batch 1, eff_q x eff_k).
// ---------------------------------------------------------------------------
enum class RefPath { kAuto, kCpu, kGpu };

// o: (sq, hq, dv); lse: (hq, sq).
struct SeqRef : RefOutputs {
  bool gpu = false;
};

// Dense copies of sequence s's used rows: q (sq, hq, d), k (sk, hkv, d), v (sk, hkv, dv).
void cut_sequence(const VCase& c, const VBuffers& b, int s, std::vector<uint16_t>* q, std::vector<uint16_t>* k,
                  std::vector<uint16_t>* v) {
  const VPlan& p = b.plan;
  const int sq = c.eff_q(s), sk = c.eff_k(s);
  const int64_t q0 = p.cu_q[s], k0 = p.cu_k[s];
  q->resize(size_t(sq) * c.hq * c.d);
  k->resize(size_t(sk) * c.hkv * c.d);
  v->resize(size_t(sk) * c.hkv * c.dv);
  for (int i = 0; i < sq; ++i)
    for (int h = 0; h < c.hq; ++h)
      std::memcpy(q->data() + (size_t(i) * c.hq + h) * c.d, b.host_in.data() + p.q.at(0, q0 + i, h, 0), size_t(c.d) * 2);
  for (int j = 0; j < sk; ++j)
    for (int h = 0; h < c.hkv; ++h) {
      std::memcpy(k->data() + (size_t(j) * c.hkv + h) * c.d, b.host_in.data() + p.k.at(0, k0 + j, h, 0),
                  size_t(c.d) * 2);
      std::memcpy(v->data() + (size_t(j) * c.hkv + h) * c.dv, b.host_in.data() + p.v.at(0, k0 + j, h, 0),
                  size_t(c.dv) * 2);
    }
}

std::vector<double> to_double16(const std::vector<uint16_t>& x, DType dt) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = tu::half_bits_to_float(dt, x[i]);
  return out;
}

::testing::AssertionResult sequence_reference(const VCase& c, const VBuffers& b, int s, RefPath path, SeqRef* r) {
  const int sq = c.eff_q(s), sk = c.eff_k(s);
  const size_t n_o = size_t(sq) * c.hq * c.dv, n_lse = size_t(sq) * c.hq;
  r->gpu = false;
  if (sq == 0) {
    r->o.clear(), r->lse.clear(), r->low_o.clear(), r->low_lse.clear();
    return ::testing::AssertionSuccess();
  }
  if (sk == 0 && path == RefPath::kAuto) {  // no key: out = 0, lse = -inf
    r->o.assign(n_o, 0.0);
    r->low_o.assign(n_o, 0.0);
    r->lse.assign(n_lse, -std::numeric_limits<double>::infinity());
    r->low_lse = r->lse;
    return ::testing::AssertionSuccess();
  }
  std::vector<uint16_t> q16, k16, v16;
  cut_sequence(c, b, s, &q16, &k16, &v16);
  const double work = double(sq) * sk * c.hq * (c.d + c.dv);
  const bool cpu = path == RefPath::kCpu || (path == RefPath::kAuto && work <= kCpuRefWork);
  if (cpu) {
    flash3::ref::Problem pr;
    pr.batch = 1, pr.seqlen_q = sq, pr.seqlen_k = sk, pr.heads_q = c.hq, pr.heads_kv = c.hkv;
    pr.head_dim = c.d, pr.head_dim_v = c.dv;
    flash3::ref::Options opt;
    opt.softmax_scale = c.scale;
    opt.softcap = c.softcap;
    opt.causal = c.causal, opt.window_left = c.wl, opt.window_right = c.wr;
    const std::vector<double> q = to_double16(q16, c.dtype), k = to_double16(k16, c.dtype),
                              v = to_double16(v16, c.dtype);
    r->o.assign(n_o, 0.0), r->low_o.assign(n_o, 0.0), r->lse.assign(n_lse, 0.0), r->low_lse.assign(n_lse, 0.0);
    flash3::ref::forward(pr, opt, q.data(), k.data(), v.data(), r->o.data(), r->lse.data());
    const auto lp =
        c.dtype == DType::kBFloat16 ? flash3::ref::LowPrecision::kBFloat16 : flash3::ref::LowPrecision::kFloat16;
    flash3::ref::forward_lowp(lp, pr, opt, q.data(), k.data(), v.data(), r->low_o.data(), r->low_lse.data());
    return ::testing::AssertionSuccess();
  }
  // fp32 GPU reference on a dense device copy of the sequence.
  r->gpu = true;
  DeviceState& d = dev();
  const size_t nq = q16.size(), nk = k16.size(), nv = v16.size();
  const size_t k_off = round_up(int64_t(nq), 128), v_off = k_off + round_up(int64_t(nk), 128);
  cudaError_t e = d.seq_in.reserve((v_off + nv + 8) * 2);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "reference buffers: " << cudaGetErrorString(e);
  uint16_t* base = d.seq_in.as<uint16_t>();
  e = cudaMemcpyAsync(base, q16.data(), nq * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess && nk) e = cudaMemcpyAsync(base + k_off, k16.data(), nk * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess && nv) e = cudaMemcpyAsync(base + v_off, v16.data(), nv * 2, cudaMemcpyHostToDevice, d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "reference upload: " << cudaGetErrorString(e);
  flash3::gpuref::Args ra;
  ra.dtype = c.dtype;
  ra.batch = 1, ra.seqlen_q = sq, ra.seqlen_k = sk, ra.heads_q = c.hq, ra.heads_kv = c.hkv;
  ra.head_dim = c.d, ra.head_dim_v = c.dv;
  auto dense = [](const uint16_t* p, int64_t rows, int64_t h, int64_t dd) {
    flash3::gpuref::Strided16 t;
    t.data = p;
    t.batch_stride = std::max<int64_t>(rows, 1) * h * dd;
    t.row_stride = h * dd;
    t.head_stride = dd;
    return t;
  };
  ra.q = dense(base, sq, c.hq, c.d);
  ra.k = dense(base + k_off, sk, c.hkv, c.d);
  ra.v = dense(base + v_off, sk, c.hkv, c.dv);
  set_mask_and_scale(c, &ra);
  return run_gpu_reference(ra, d, r);
}

// ---------------------------------------------------------------------------
// Checking flash3's out / lse.
// ---------------------------------------------------------------------------
// Per case: the largest tolerance baselines over its sequences (for comparisons
// between two flash3 results of the same problem).
struct CheckSummary {
  double o_base = 0, lse_base = 0;
};

// Checks a downloaded flash3 result of case c (inputs b.host_in) against the
// per-sequence references; everything outside the used rows must be poison.
void check_result(const VCase& c, const VBuffers& b, const Downloaded& h, CheckSummary* sum = nullptr) {
  const VPlan& p = b.plan;
  const int64_t tq = c.total_q();
  // Which (row) of q belongs to which sequence, and whether it is used.
  std::vector<int> row_seq(size_t(tq), -1);
  for (int s = 0; s < c.n(); ++s)
    for (int64_t r = p.cu_q[s]; r < p.cu_q[s + 1]; ++r) row_seq[size_t(r)] = s;

  // out: rows beyond seqused untouched; padding and guard untouched.
  std::vector<uint8_t> inside(h.out.size(), 0);
  int64_t unused_o = 0, first_unused_row = -1;
  for (int64_t r = 0; r < tq; ++r) {
    const int s = row_seq[size_t(r)];
    const bool used = r - p.cu_q[s] < c.eff_q(s);
    for (int hh = 0; hh < c.hq; ++hh) {
      const int64_t at = p.o.at(0, r, hh, 0);
      std::memset(&inside[size_t(at)], 1, size_t(c.dv));
      if (!used)
        for (int x = 0; x < c.dv; ++x)
          if (h.out[size_t(at + x)] != kPoison16) {
            ++unused_o;
            if (first_unused_row < 0) first_unused_row = r;
          }
    }
  }
  int64_t outside_o = 0;
  for (size_t i = 0; i < h.out.size(); ++i) outside_o += !inside[i] && h.out[i] != kPoison16;
  EXPECT_EQ(unused_o, 0) << c.describe() << ": flash3 wrote " << unused_o
                         << " out elements in rows beyond seqused_q (first in row " << first_unused_row
                         << " = sequence " << (first_unused_row >= 0 ? row_seq[size_t(first_unused_row)] : -1)
                         << ", local row " << (first_unused_row >= 0 ? first_unused_row - p.cu_q[row_seq[size_t(first_unused_row)]] : -1)
                         << ")";
  EXPECT_EQ(outside_o, 0) << c.describe() << ": flash3 wrote " << outside_o
                          << " elements of the out allocation outside the (total_q, hq, dv) view (padding / guard)";
  // lse: the same for rows beyond seqused, the padded row ends and the guard; all of it without lse.
  int64_t unused_l = 0, outside_l = 0;
  for (int64_t hh = 0; hh < c.hq; ++hh)
    for (int64_t r = 0; r < p.lse_stride; ++r) {
      const bool poison = h.lse[size_t(hh * p.lse_stride + r)] == kPoison32;
      if (r >= tq || !c.store_lse) outside_l += !poison;
      else {
        const int s = row_seq[size_t(r)];
        if (r - p.cu_q[s] >= c.eff_q(s)) unused_l += !poison;
      }
    }
  for (int64_t i = int64_t(c.hq) * p.lse_stride; i < p.lse_elems; ++i) outside_l += h.lse[size_t(i)] != kPoison32;
  EXPECT_EQ(unused_l, 0) << c.describe() << ": flash3 wrote " << unused_l << " lse values of rows beyond seqused_q";
  EXPECT_EQ(outside_l, 0) << c.describe() << ": flash3 wrote " << outside_l
                          << " floats of the lse allocation outside the (hq, total_q) view";

  // Each sequence against its own reference.
  for (int s = 0; s < c.n(); ++s) {
    const int sq = c.eff_q(s), sk = c.eff_k(s);
    if (sq == 0) continue;
    SeqRef ref;
    ASSERT_TRUE(sequence_reference(c, b, s, RefPath::kAuto, &ref)) << c.describe() << ", sequence " << s;
    std::ostringstream seq;
    seq << "sequence " << s << " (rows " << p.cu_q[s] << "+" << sq << ", keys " << p.cu_k[s] << "+" << sk << ", "
        << (ref.gpu ? "fp32 GPU" : "float64 CPU") << " reference)";
    const std::vector<double> o = ours_o(c, p, h, s);
    const Verdict vo =
        judge("O", o, ref.o, ref.low_o, kEpsO, [&](size_t i) { return where_seq_o(c, s, i); }, tol_factor(c));
    EXPECT_TRUE(vo.ok) << c.describe() << "\n  " << seq.str() << "\n  " << vo.text;
    std::vector<double> l;
    if (c.store_lse) {
      l = ours_lse(c, p, h, s);
      const Verdict vl = judge(
          "LSE", l, ref.lse, ref.low_lse, kEpsLse, [&](size_t i) { return where_seq_lse(s, sq, i); }, tol_factor(c));
      EXPECT_TRUE(vl.ok) << c.describe() << "\n  " << seq.str() << "\n  " << vl.text;
      if (sum) sum->lse_base = std::max(sum->lse_base, vl.r.base_err);
    }
    if (sum) sum->o_base = std::max(sum->o_base, vo.r.base_err);
    if (sk == 0) {  // q rows but no key: exactly out = 0 and lse = -inf
      int64_t bad_o = 0, bad_l = 0;
      for (double x : o) bad_o += !(x == 0.0);
      for (double x : l) bad_l += !(std::isinf(x) && x < 0);
      EXPECT_EQ(bad_o, 0) << c.describe() << "\n  " << seq.str() << ": no keys, but " << bad_o
                          << " out elements are not 0";
      EXPECT_EQ(bad_l, 0) << c.describe() << "\n  " << seq.str() << ": no keys, but " << bad_l
                          << " lse values are not -inf";
    }
  }
}

// Full check of one case: upload, poison, run, check.
void check_vcase(const VCase& c, const ForwardCall& call = {}, CheckSummary* sum = nullptr) {
  SCOPED_TRACE(c.describe());
  VBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& d = dev();
  const flash3::Status st = run_varlen(d, c, b.plan, d.out.ptr, d.lse.as<float>(), call);
  ASSERT_TRUE(st.ok()) << c.describe() << ": flash3::forward failed: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  Downloaded h;
  ASSERT_TRUE(download(d, b.plan, d.out.ptr, d.lse.as<float>(), &h));
  check_result(c, b, h, sum);
}

#define FLASH3_SKIP_UNLESS_BUILT(dt, d, dv)                                                                 \
  do {                                                                                                      \
    if (!flash3::forward_is_built((dt), (d), (dv)))                                                        \
      GTEST_SKIP() << "not built: forward kernel " << tu::short_dtype(dt) << " " << (d) << "x" << (dv)     \
                   << " is not in this build (FLASH3_DTYPES / FLASH3_HDIMS)";                               \
  } while (0)

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

// The dtype a head-dim pair runs in: `prefer` when built, else the other one.
bool pick_dtype(HeadDims h, DType prefer, DType* dt) {
  const DType other = prefer == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
  for (DType t : {prefer, other})
    if (flash3::forward_is_built(t, h.d, h.dv)) {
      *dt = t;
      return true;
    }
  return false;
}

// ---------------------------------------------------------------------------
// Random lengths (fill_lengths, draw_used: varlen_case.h).
// ---------------------------------------------------------------------------
// Tile boundaries of the kernels' blocks (64 / 128 / 176 / 192 rows or keys) and the smallest lengths.
constexpr int kSpecialLens[] = {0, 1, 63, 64, 65, 127, 128, 129, 176, 192};
constexpr int kMaxLen = 4224;

int draw_len(Rng& g) {
  const int r = int(g.next() % 100);
  if (r < 30) return kSpecialLens[g.next() % (sizeof(kSpecialLens) / sizeof(int))];
  if (r < 75) return g.uniform(0, 300);
  if (r < 95) return g.uniform(300, 1200);
  return g.uniform(1200, kMaxLen);
}

int uniform_below(uint64_t seed, uint64_t salt, int n) { return int(tu::splitmix64(seed ^ salt) % uint64_t(std::max(n, 1))); }

// ===========================================================================
// The matrix: every head-dim pair x both dtypes, seven batches each (all masks,
// MHA / GQA / MQA, seqused, strided layouts, lse absent).
// ===========================================================================
std::vector<VCase> matrix_cases(HeadDims h, DType t) {
  std::vector<VCase> out;
  const std::string prefix = std::string("varlen_") + tu::short_dtype(t) + "_" + head_dims_name(h) + "_";
  auto base = [&](const std::string& tag, int hq, int hkv, Layout layout) {
    VCase c;
    c.dtype = t, c.d = h.d, c.dv = h.dv, c.hq = hq, c.hkv = hkv, c.layout = layout;
    c.name = prefix + tag;
    c.seed = fnv1a(c.name);
    return c;
  };
  {  // No mask, MHA, 9 sequences; empty q, empty k, 1x1, tile edges; max_seqlen overstated.
    VCase c = base("nomask_mha4_b9", 4, 4, Layout::kContiguous);
    fill_lengths(&c, 9, {{0, 5}, {1, 1}, {63, 64}, {64, 63}, {65, 200}, {3, 0}}, draw_len);
    c.max_pad = 37;
    out.push_back(c);
  }
  {  // Causal, GQA 8:2, strided; q longer than k (fully masked rows) and the reverse.
    VCase c = base("causal_gqa8x2_b7", 8, 2, Layout::kPadded);
    fill_lengths(&c, 7, {{127, 128}, {128, 127}, {129, 129}, {176, 1}, {1, 176}, {2000, 700}}, draw_len);
    c.causal = true;
    out.push_back(c);
  }
  {  // Local window (both sides random in [0, max_seqlen_k)), MQA, one long sequence.
    VCase c = base("local_mqa4x1_b5", 4, 1, Layout::kContiguous);
    fill_lengths(&c, 5, {{192, 192}, {0, 0}, {kMaxLen, 3000}}, draw_len);
    c.wl = uniform_below(c.seed, 0x1ef7, c.max_k());
    c.wr = uniform_below(c.seed, 0x7197, c.max_k());
    out.push_back(c);
  }
  {  // Causal + local (window_right drawn too: causal ignores it), seqused_q and seqused_k with every clamp.
    VCase c = base("causal_local_seqused_gqa6x2_b6", 6, 2, Layout::kPadded);
    fill_lengths(&c, 6, {{64, 64}, {129, 65}, {1000, 1000}, {300, 257}}, draw_len);
    c.causal = true;
    c.wl = uniform_below(c.seed, 0x1ef7, c.max_k());
    c.wr = uniform_below(c.seed, 0x7197, c.max_k());
    c.used_q = draw_used(c.len_q, 0, c.seed ^ 0x05ed);
    c.used_k = draw_used(c.len_k, 3, c.seed ^ 0x5eed);
    out.push_back(c);
  }
  {  // One side unbounded, the other random; decode-like and prefill-like extremes.
    VCase c = base("one_sided_mha2_b3", 2, 2, Layout::kContiguous);
    fill_lengths(&c, 3, {{1, kMaxLen}, {kMaxLen, 1}, {176, 192}}, draw_len);
    const int side = uniform_below(c.seed, 0x7197, c.max_k());
    if (c.seed & 1) c.wl = -1, c.wr = side;
    else c.wl = side, c.wr = -1;
    out.push_back(c);
  }
  {  // A window at / beyond max_seqlen (cuts nothing: unbounded), seqused_k only.
    VCase c = base("window_beyond_max_gqa8x2_b4", 8, 2, Layout::kContiguous);
    fill_lengths(&c, 4, {{65, 129}, {500, 300}}, draw_len);
    switch (c.seed % 3) {
      case 0: c.wl = c.max_k() + 1 + uniform_below(c.seed, 1, 1000), c.wr = kIntMax; break;
      case 1: c.wl = kIntMax, c.wr = c.max_q() + uniform_below(c.seed, 2, 1000); break;
      default: c.wl = c.max_k() - 1, c.wr = c.max_q() - 1; break;
    }
    c.used_k = draw_used(c.len_k, 1, c.seed ^ 0x5eed);
    out.push_back(c);
  }
  {  // One sequence, no lse.
    VCase c = base("single_nolse_gqa4x2_b1", 4, 2, Layout::kPadded);
    Rng g{c.seed};
    c.len_q = {g.uniform(1, kMaxLen)};
    c.len_k = {g.uniform(1, kMaxLen)};
    c.store_lse = false;
    out.push_back(c);
  }
  return out;
}

using MatrixP = std::tuple<HeadDims, DType>;

class VarlenMatrix : public ::testing::TestWithParam<MatrixP> {};

TEST_P(VarlenMatrix, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const auto& [h, t] = GetParam();
  FLASH3_SKIP_UNLESS_BUILT(t, h.d, h.dv);
  for (const VCase& c : matrix_cases(h, t)) {
    check_vcase(c);
    if (HasFatalFailure()) return;
  }
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixP>& info) {
  const auto& [h, t] = info.param;
  return head_dims_name(h) + "_" + tu::short_dtype(t);
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenMatrix,
                         ::testing::Combine(::testing::ValuesIn(kAllHeadDims),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         matrix_name);

// Every forward and backward variant of the build's variants file is one of the
// matrices' head-dim pairs (so none is left out of the varlen forward matrix or
// the varlen backward matrix, VarlenBwdMatrix), and is built.
TEST(VarlenGpu, MatrixCoversEveryBuiltVariant) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  bool found = false;
  const std::vector<tu::Variant> vars = tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), &found);
  ASSERT_TRUE(found) << "cannot read " << tu::variants_path(FLASH3_VARIANTS_FILE) << " (set FLASH3_VARIANTS_FILE)";
  for (const tu::Variant& v : vars) {
    if (v.pass != "fwd" && v.pass != "bwd") continue;
    bool listed = false;
    for (const HeadDims& h : kAllHeadDims) listed |= h.d == v.d && h.dv == v.dv;
    EXPECT_TRUE(listed) << v.pass << " " << v.dtype << " " << v.d << "x" << v.dv
                        << " is built but not in the varlen matrices (kAllHeadDims)";
    const DType t = v.dtype == "fp16" ? DType::kFloat16 : DType::kBFloat16;
    const bool built = v.pass == "fwd" ? flash3::forward_is_built(t, v.d, v.dv) : flash3::backward_is_built(t, v.d, v.dv);
    EXPECT_TRUE(built) << v.pass << " " << v.dtype << " " << v.d << "x" << v.dv;
  }
}

// ===========================================================================
// The harness's per-sequence reference agrees with itself across paths (fp32
// GPU vs float64 CPU) and with the CPU reference's own varlen mode. Needs no
// flash3 kernel.
// ===========================================================================
TEST(VarlenGpu, PerSequenceReferenceIsConsistent) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    VCase c;
    c.dtype = t, c.d = 64, c.dv = 64, c.hq = 4, c.hkv = 2;
    c.causal = t == DType::kFloat16;
    c.wl = t == DType::kFloat16 ? 40 : -1;
    c.len_q = {37, 0, 65, 1, 100};
    c.len_k = {53, 9, 0, 30, 64};
    c.layout = Layout::kPadded;
    c.name = std::string("refcheck_") + tu::short_dtype(t);
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());
    VBuffers b;
    ASSERT_TRUE(upload_inputs(c, &b));
    // The CPU reference in its own varlen mode on dense copies of all rows.
    flash3::ref::Problem pr;
    pr.batch = c.n(), pr.heads_q = c.hq, pr.heads_kv = c.hkv, pr.head_dim = c.d, pr.head_dim_v = c.dv;
    pr.cu_seqlens_q = b.plan.cu_q, pr.cu_seqlens_k = b.plan.cu_k;
    flash3::ref::Options opt;
    opt.causal = c.causal, opt.window_left = c.wl, opt.window_right = c.wr;
    opt.softmax_scale = c.scale;
    opt.softcap = c.softcap;
    const std::vector<double> q = extract(b.host_in, b.plan.q, t), k = extract(b.host_in, b.plan.k, t),
                              v = extract(b.host_in, b.plan.v, t);
    std::vector<double> o(pr.o_elems()), l(pr.lse_elems());
    flash3::ref::forward(pr, opt, q.data(), k.data(), v.data(), o.data(), l.data());
    for (int s = 0; s < c.n(); ++s) {
      const int sq = c.eff_q(s);
      if (sq == 0) continue;
      SeqRef cpu, gpu;
      ASSERT_TRUE(sequence_reference(c, b, s, RefPath::kCpu, &cpu));
      ASSERT_TRUE(sequence_reference(c, b, s, RefPath::kGpu, &gpu));
      ASSERT_EQ(cpu.o.size(), size_t(sq) * c.hq * c.dv);
      ASSERT_EQ(gpu.o.size(), cpu.o.size());
      double e_var = 0, e_gpu_o = 0, e_gpu_l = 0;
      for (int i = 0; i < sq; ++i)
        for (int hh = 0; hh < c.hq; ++hh) {
          for (int x = 0; x < c.dv; ++x) {
            const size_t local = (size_t(i) * c.hq + hh) * c.dv + x;
            const size_t global = (size_t(b.plan.cu_q[s] + i) * c.hq + hh) * c.dv + x;
            e_var = std::max(e_var, std::fabs(cpu.o[local] - o[global]));
            e_gpu_o = std::max(e_gpu_o, std::fabs(cpu.o[local] - gpu.o[local]));
          }
          const double lc = cpu.lse[size_t(hh) * sq + i], lg = gpu.lse[size_t(hh) * sq + i];
          const double lv = l[size_t(flash3::ref::lse_index(pr, s, hh, i))];
          const bool inf = std::isinf(lc);
          e_var = std::max(e_var, inf ? (lv == lc ? 0.0 : 1.0) : std::fabs(lc - lv));
          e_gpu_l = std::max(e_gpu_l, inf ? (lg == lc ? 0.0 : 1.0) : std::fabs(lc - lg) / std::max(1.0, std::fabs(lc)));
        }
      EXPECT_LE(e_var, 1e-12) << "sequence " << s << ": per-sequence CPU reference differs from ref's varlen mode";
      EXPECT_LE(e_gpu_o, 1e-5) << "sequence " << s << ": GPU fp32 reference O differs from the float64 one";
      EXPECT_LE(e_gpu_l, 1e-5) << "sequence " << s << ": GPU fp32 reference LSE differs from the float64 one";
    }
  }
}

// ===========================================================================
// Degenerate batches: num_sequences = 0 (nothing launched, nothing written),
// every q empty, every k empty (out = 0, lse = -inf), one 1 x 1 sequence.
// ===========================================================================
TEST(VarlenGpu, DegenerateBatches) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  struct S {
    const char* name;
    std::vector<int> q, k;
    bool causal;
  };
  const S shapes[] = {{"all_q_empty", {0, 0, 0}, {5, 64, 0}, false},
                      {"all_k_empty", {1, 64, 65}, {0, 0, 0}, false},
                      {"all_k_empty_causal", {1, 64, 65}, {0, 0, 0}, true},
                      {"one_1x1", {1}, {1}, false},
                      {"one_1x1_causal", {1}, {1}, true}};
  for (const S& s : shapes) {
    VCase c;
    c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
    c.len_q = s.q, c.len_k = s.k, c.causal = s.causal;
    c.name = std::string("degenerate_") + s.name;
    c.seed = fnv1a(c.name);
    check_vcase(c);
    if (HasFatalFailure()) return;
  }
  // num_sequences = 0 with tensors and prefix sums of a real batch: valid, nothing written.
  VCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
  c.len_q = {10, 20}, c.len_k = {30, 5};
  c.name = "degenerate_num_sequences_0";
  c.seed = fnv1a(c.name);
  SCOPED_TRACE(c.describe());
  VBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const flash3::Status st =
      run_varlen(ds, c, b.plan, ds.out.ptr, ds.lse.as<float>(), [&](const flash3::ForwardArgs& a0) {
        flash3::ForwardArgs a = a0;
        a.opts.num_sequences = 0;
        return flash3::forward(a, ds.stream);
      });
  EXPECT_TRUE(st.ok()) << "num_sequences = 0: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  Downloaded h;
  ASSERT_TRUE(download(ds, b.plan, ds.out.ptr, ds.lse.as<float>(), &h));
  int64_t written = 0;
  for (uint16_t x : h.out) written += x != kPoison16;
  for (uint32_t x : h.lse) written += x != kPoison32;
  EXPECT_EQ(written, 0) << "num_sequences = 0 wrote " << written << " elements of out / lse";
}

// ===========================================================================
// Sequence isolation: the result of a sequence does not depend on anything
// outside its own used rows. Everything else in q / k / v (the other sequences,
// its own rows beyond seqused, the layout's padding) is set to zero, then to
// the dtype's largest finite values (alternating sign), then to NaN; the
// sequence's out / lse rows must be bitwise the same in the three runs (the
// zero run is also checked against the reference). Huge values pass when keys
// past a sequence's end are masked before the softmax; NaN passes only if no
// such row reaches the P V product either (masking alone gives 0 * NaN = NaN),
// i.e. the kernel never reads across a sequence boundary.
// ===========================================================================
class VarlenIsolation : public ::testing::TestWithParam<HeadDims> {};

TEST_P(VarlenIsolation, NeighboursDoNotLeak) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims hd = GetParam();
  DType dt;
  if (!pick_dtype(hd, DType::kBFloat16, &dt)) GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(hd);
  const uint16_t huge = dt == DType::kBFloat16 ? 0x7f7f : 0x7bff;  // largest finite value
  struct Mk {
    const char* name;
    bool causal;
    int wl, wr;
  };
  const Mk masks[] = {{"nomask", false, -1, -1}, {"causal", true, -1, -1}, {"local20x5", false, 20, 5}};
  for (bool seqused : {false, true})
    for (const Mk& m : masks) {
      VCase c;
      c.dtype = dt, c.d = hd.d, c.dv = hd.dv, c.hq = 4, c.hkv = 2;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.len_q = {63, 65, 1, 130, 200, 17};
      c.len_k = {129, 64, 200, 1, 63, 300};
      if (seqused) {
        c.used_q = {60, 65, 1, 130, 199, 17};
        c.used_k = {129, 50, 200, 1, 63, 250};
      }
      c.layout = seqused ? Layout::kPadded : Layout::kContiguous;
      c.name = std::string("isolation_") + head_dims_name(hd) + "_" + m.name + (seqused ? "_seqused" : "");
      c.seed = fnv1a(c.name);
      SCOPED_TRACE(c.describe());
      VBuffers b;
      ASSERT_TRUE(upload_inputs(c, &b));
      const std::vector<uint16_t> original = b.host_in;
      const VPlan& p = b.plan;
      DeviceState& ds = dev();
      for (int s = 0; s < c.n(); ++s) {
        const int sq = c.eff_q(s), sk = c.eff_k(s);
        if (sq == 0) continue;
        // Elements of the input allocation that belong to sequence s's used rows.
        std::vector<uint8_t> mine(original.size(), 0);
        for (int i = 0; i < sq; ++i)
          for (int hh = 0; hh < c.hq; ++hh) std::memset(&mine[size_t(p.q.at(0, p.cu_q[s] + i, hh, 0))], 1, size_t(c.d));
        for (int j = 0; j < sk; ++j)
          for (int hh = 0; hh < c.hkv; ++hh) {
            std::memset(&mine[size_t(p.k.at(0, p.cu_k[s] + j, hh, 0))], 1, size_t(c.d));
            std::memset(&mine[size_t(p.v.at(0, p.cu_k[s] + j, hh, 0))], 1, size_t(c.dv));
          }
        std::vector<uint16_t> base_o;
        std::vector<uint32_t> base_l;
        const char* fills[] = {"zero", "huge", "NaN"};
        for (int f = 0; f < 3; ++f) {
          SCOPED_TRACE(std::string("sequence ") + std::to_string(s) + ", everything else " + fills[f]);
          b.host_in = original;
          for (size_t i = 0; i < b.host_in.size(); ++i)
            if (!mine[i]) b.host_in[i] = f == 0 ? 0 : (f == 1 ? uint16_t(huge | ((i & 1) << 15)) : kPoison16);
          ASSERT_TRUE(upload_varlen_host(ds, b));
          const flash3::Status st = run_varlen(ds, c, p, ds.out.ptr, ds.lse.as<float>());
          ASSERT_TRUE(st.ok()) << st.message;
          FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
          Downloaded h;
          ASSERT_TRUE(download(ds, p, ds.out.ptr, ds.lse.as<float>(), &h));
          std::vector<uint16_t> o;
          std::vector<uint32_t> l;
          for (int i = 0; i < sq; ++i)
            for (int hh = 0; hh < c.hq; ++hh) {
              const uint16_t* src = h.out.data() + p.o.at(0, p.cu_q[s] + i, hh, 0);
              o.insert(o.end(), src, src + c.dv);
            }
          for (int hh = 0; hh < c.hq; ++hh)
            for (int i = 0; i < sq; ++i) l.push_back(h.lse[size_t(hh * p.lse_stride + p.cu_q[s] + i)]);
          if (f == 0) {
            check_result(c, b, h);  // neighbours are zero: every sequence still matches its reference
            if (HasFatalFailure()) return;
            base_o = o, base_l = l;
            continue;
          }
          int64_t diff_o = 0, diff_l = 0;
          for (size_t i = 0; i < o.size(); ++i) diff_o += o[i] != base_o[i];
          for (size_t i = 0; i < l.size(); ++i) diff_l += l[i] != base_l[i];
          EXPECT_EQ(diff_o, 0) << c.describe() << ": sequence " << s << ": " << diff_o << " of " << o.size()
                               << " out elements change when everything outside its used rows is " << fills[f]
                               << " instead of zero" << (f == 2 ? " (the kernel reads across the sequence boundary)" : "");
          EXPECT_EQ(diff_l, 0) << c.describe() << ": sequence " << s << ": " << diff_l << " of " << l.size()
                               << " lse values change when everything outside its used rows is " << fills[f]
                               << " instead of zero";
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenIsolation, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Equal lengths: n sequences of length L through the varlen path equal the
// fixed-length forward of batch n on the same memory WITHIN TOLERANCE (not
// required bitwise: the varlen kernels may tile / schedule differently):
//   max|varlen - fixed| <= 2 * baseline + eps,
// baseline = the largest max|plain_lowp - ref| over the sequences (O and LSE
// separately). The varlen result is also checked against the reference, and the
// number of bitwise-different elements is recorded (property
// bitwise_diff_o / bitwise_diff_lse).
// ===========================================================================
TEST(VarlenGpu, EqualLengthsMatchFixedLength) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  struct Mk {
    const char* name;
    bool causal;
    int wl, wr;
  };
  const Mk masks[] = {{"nomask", false, -1, -1}, {"causal", true, -1, -1}, {"local100x30", false, 100, 30}};
  int64_t total_diff_o = 0, total_diff_l = 0;
  for (int L : {128, 333, 1000})
    for (const Mk& m : masks) {
      const int n = 4;
      VCase c;
      c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.len_q.assign(n, L), c.len_k.assign(n, L);
      c.layout = L == 333 ? Layout::kPadded : Layout::kContiguous;
      c.name = "equal_lengths_L" + std::to_string(L) + "_" + m.name;
      c.seed = fnv1a(c.name);
      SCOPED_TRACE(c.describe());
      VBuffers b;
      ASSERT_TRUE(upload_inputs(c, &b));
      DeviceState& ds = dev();
      const VPlan& p = b.plan;
      const flash3::Status st = run_varlen(ds, c, p, ds.out.ptr, ds.lse.as<float>());
      ASSERT_TRUE(st.ok()) << st.message;
      Downloaded hv;
      ASSERT_TRUE(download(ds, p, ds.out.ptr, ds.lse.as<float>(), &hv));
      CheckSummary sum;
      check_result(c, b, hv, &sum);
      if (HasFatalFailure()) return;

      // Fixed length on the same memory: (n, L, h, d) views of the (n * L, h, d) rows.
      flash3::ForwardArgs a;
      auto view4 = [&](void* base, const View& v) {
        return TensorView::make4d(elem16(base, v.offset), dt, n, L, v.h, v.d, L * v.sr, v.sr, v.sh, 1);
      };
      a.q = view4(ds.in.ptr, p.q);
      a.k = view4(ds.in.ptr, p.k);
      a.v = view4(ds.in.ptr, p.v);
      a.out = view4(ds.out2.ptr, p.o);
      a.lse = TensorView::make3d(ds.lse2.ptr, DType::kFloat32, n, c.hq, L, int64_t(c.hq) * L, L, 1);
      a.opts.causal = c.causal, a.opts.window_left = c.wl, a.opts.window_right = c.wr;
      a.opts.softmax_scale = c.scale, a.opts.softcap = c.softcap;
      poison_outputs(p, ds.out2.ptr, ds.lse2.as<float>(), ds.stream);
      const flash3::Status sf = flash3::forward(a, ds.stream);
      ASSERT_TRUE(sf.ok()) << "fixed-length forward: " << sf.message;
      Downloaded hf;
      ASSERT_TRUE(download(ds, p, ds.out2.ptr, ds.lse2.as<float>(), &hf));
      double err_o = 0, err_l = 0;
      int64_t diff_o = 0, diff_l = 0;
      for (int s = 0; s < n; ++s)
        for (int i = 0; i < L; ++i)
          for (int hh = 0; hh < c.hq; ++hh) {
            const int64_t at = p.o.at(0, int64_t(s) * L + i, hh, 0);
            for (int x = 0; x < c.dv; ++x) {
              const uint16_t u = hv.out[size_t(at + x)], w = hf.out[size_t(at + x)];
              diff_o += u != w;
              const double e = std::fabs(double(tu::half_bits_to_float(dt, u)) - tu::half_bits_to_float(dt, w));
              err_o = std::max(err_o, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
            }
            const uint32_t u = hv.lse[size_t(hh * p.lse_stride + int64_t(s) * L + i)];
            const uint32_t w = hf.lse[size_t((int64_t(s) * c.hq + hh) * L + i)];
            diff_l += u != w;
            const float fu = tu::bits_f32(u), fw = tu::bits_f32(w);
            const double e = (std::isinf(fu) || std::isinf(fw)) ? (fu == fw ? 0.0 : std::numeric_limits<double>::infinity())
                                                                : std::fabs(double(fu) - fw);
            err_l = std::max(err_l, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
          }
      total_diff_o += diff_o, total_diff_l += diff_l;
      EXPECT_LE(err_o, 2 * sum.o_base + kEpsO)
          << c.describe() << ": varlen and fixed-length out differ by " << err_o << " (" << diff_o
          << " elements differ bitwise); bound 2 * " << sum.o_base << " + " << kEpsO;
      EXPECT_LE(err_l, 2 * sum.lse_base + kEpsLse)
          << c.describe() << ": varlen and fixed-length lse differ by " << err_l << " (" << diff_l
          << " values differ bitwise); bound 2 * " << sum.lse_base << " + " << kEpsLse;
    }
  ::testing::Test::RecordProperty("bitwise_diff_o", std::to_string(total_diff_o));
  ::testing::Test::RecordProperty("bitwise_diff_lse", std::to_string(total_diff_l));
}

// ===========================================================================
// CUDA graphs: the varlen forward captured (global capture mode) and replayed.
// The prefix sums and seqused are read on the device at replay time: after the
// capture they are changed (the same totals and max_seqlen, other lengths) with
// new q / k / v, and the replay must compute the new problem. Two replays of the
// same inputs are bitwise equal.
// ===========================================================================
TEST(VarlenGpu, CudaGraphCaptureAndReplay) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward kernel in this build";
  VCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.hq = 8, c.hkv = 2, c.causal = true;
  c.len_q = {300, 0, 129, 1000, 64};
  c.len_k = {500, 10, 128, 700, 1};
  c.used_k = {500, 10, 100, 700, 1};
  c.name = "graph_capture";
  c.seed = fnv1a(c.name);
  SCOPED_TRACE(c.describe());
  VBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const VPlan& p = b.plan;
  const flash3::ForwardArgs a = make_args(c, p, ds.in.ptr, ds.out.ptr, ds.lse.as<float>(), ds.meta.ptr);
  // Warm-up outside the capture (first launches set the kernels' shared-memory attributes).
  ASSERT_TRUE(flash3::forward(a, ds.stream).ok());
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));

  cudaStream_t s = nullptr;
  FLASH3_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  poison_outputs(p, ds.out.ptr, ds.lse.as<float>(), ds.stream);
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FLASH3_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const flash3::Status st = flash3::forward(a, s);
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  ASSERT_TRUE(st.ok()) << "forward during capture: " << st.message;
  ASSERT_EQ(end, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(end);
  FLASH3_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  FLASH3_CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_GT(nodes, 0u) << "the captured graph is empty";
  {  // Capturing ran nothing.
    Downloaded h;
    ASSERT_TRUE(download(ds, p, ds.out.ptr, ds.lse.as<float>(), &h));
    int64_t written = 0;
    for (uint16_t x : h.out) written += x != kPoison16;
    EXPECT_EQ(written, 0) << "capturing the forward wrote " << written << " out elements";
  }
  auto replay = [&](Downloaded* h) {
    poison_outputs(p, ds.out.ptr, ds.lse.as<float>(), s);
    FLASH3_CUDA_OK(cudaGraphLaunch(exec, s));
    FLASH3_CUDA_OK(cudaStreamSynchronize(s));
    FLASH3_CUDA_OK(cudaGetLastError());
    ASSERT_TRUE(download(ds, p, ds.out.ptr, ds.lse.as<float>(), h));
  };
  Downloaded h1, h2;
  replay(&h1);
  if (HasFatalFailure()) return;
  check_result(c, b, h1);
  replay(&h2);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(h1.out == h2.out && h1.lse == h2.lse) << "two replays of the same graph differ";

  // Other lengths (the same totals and maxima), other seqused, other inputs; same pointers.
  VCase c2 = c;
  c2.len_q = {64, 1000, 129, 0, 300};
  c2.len_k = {1, 700, 128, 10, 500};
  c2.used_k = {1, 650, 128, 0, 499};
  c2.seed = fnv1a("graph_capture_second");
  c2.name = "graph_capture_second";
  ASSERT_EQ(c2.total_q(), c.total_q());
  ASSERT_EQ(c2.total_k(), c.total_k());
  ASSERT_EQ(c2.max_q(), c.max_q());
  ASSERT_EQ(c2.max_k(), c.max_k());
  VBuffers b2;
  const void* in_before = ds.in.ptr;
  const void* meta_before = ds.meta.ptr;
  ASSERT_TRUE(upload_inputs(c2, &b2));
  ASSERT_EQ(ds.in.ptr, in_before);
  ASSERT_EQ(ds.meta.ptr, meta_before);
  Downloaded h3;
  replay(&h3);
  if (HasFatalFailure()) return;
  {
    SCOPED_TRACE("replay after changing cu_seqlens / seqused / q / k / v on the device");
    check_result(c2, b2, h3);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// ===========================================================================
// Errors that need device memory to set up.
// ===========================================================================
// cu_seqlens / seqused must be device memory of the current device, 4-byte
// aligned; host pointers are rejected (kInvalidArgument, the option named) before
// anything is launched.
TEST(VarlenGpu, HostOrMisalignedSeqlensAreRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  int d = 128, dv = 128;
  const bool built = pick_built(&dt, &d, &dv);
  VCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
  c.len_q = {10, 64, 7}, c.len_k = {20, 64, 1};
  c.used_q = {10, 60, 7}, c.used_k = {20, 64, 1};
  c.name = "bad_seqlens";
  c.seed = fnv1a(c.name);
  VBuffers b;
  ASSERT_TRUE(upload_inputs(c, &b));
  DeviceState& ds = dev();
  const VPlan& p = b.plan;
  // Host copies of the metadata (valid values, wrong memory).
  const std::vector<int> host_meta = p.meta;
  const int* hm = host_meta.data();
  struct Bad {
    std::string what, must_name;
    std::function<void(flash3::AttentionOptions&)> mutate;
  };
  const std::vector<Bad> bads = {
      {"cu_seqlens_q is a host pointer", "opts.cu_seqlens_q",
       [&](flash3::AttentionOptions& o) { o.cu_seqlens_q = hm + p.m_cu_q; }},
      {"cu_seqlens_k is a host pointer", "cu_seqlens_k",
       [&](flash3::AttentionOptions& o) { o.cu_seqlens_k = hm + p.m_cu_k; }},
      {"seqused_q is a host pointer", "seqused_q", [&](flash3::AttentionOptions& o) { o.seqused_q = hm + p.m_used_q; }},
      {"seqused_k is a host pointer", "seqused_k", [&](flash3::AttentionOptions& o) { o.seqused_k = hm + p.m_used_k; }},
      {"cu_seqlens_q misaligned by 2 bytes", "cu_seqlens_q",
       [&](flash3::AttentionOptions& o) {
         o.cu_seqlens_q = reinterpret_cast<const int*>(reinterpret_cast<const char*>(o.cu_seqlens_q) + 2);
       }},
      {"num_sequences = -1", "num_sequences", [&](flash3::AttentionOptions& o) { o.num_sequences = -1; }},
  };
  for (const Bad& bad : bads) {
    poison_outputs(p, ds.out.ptr, ds.lse.as<float>(), ds.stream);
    flash3::ForwardArgs a = make_args(c, p, ds.in.ptr, ds.out.ptr, ds.lse.as<float>(), ds.meta.ptr);
    bad.mutate(a.opts);
    const flash3::Status st = flash3::forward(a, ds.stream);
    EXPECT_FALSE(st.ok()) << bad.what << ": flash3::forward returned Ok";
    EXPECT_FALSE(st.message.empty()) << bad.what << ": error without a message";
    if (built) {
      EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << bad.what << ": " << st.message;
      EXPECT_NE(st.message.find(bad.must_name), std::string::npos)
          << bad.what << ": the message does not name " << bad.must_name << ": " << st.message;
    }
    EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess) << bad.what;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << bad.what;
    Downloaded h;
    ASSERT_TRUE(download(ds, p, ds.out.ptr, ds.lse.as<float>(), &h));
    int64_t written = 0;
    for (uint16_t x : h.out) written += x != kPoison16;
    EXPECT_EQ(written, 0) << bad.what << ": a rejected call wrote " << written << " out elements";
  }
  // seqused without cu_seqlens (fixed-length tensors) is rejected too.
  if (built) {
    flash3::ForwardArgs a;
    auto view4 = [&](void* base, const View& v) {
      return TensorView::make4d(elem16(base, v.offset), dt, 1, 64, v.h, v.d, 64 * v.sr, v.sr, v.sh, 1);
    };
    a.q = view4(ds.in.ptr, p.q);
    a.k = view4(ds.in.ptr, p.k);
    a.v = view4(ds.in.ptr, p.v);
    a.out = view4(ds.out.ptr, p.o);
    a.opts.seqused_k = static_cast<const int*>(ds.meta.ptr) + p.m_used_k;
    const flash3::Status st = flash3::forward(a, ds.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "seqused_k without cu_seqlens: " << st.message;
    EXPECT_NE(st.message.find("cu_seqlens"), std::string::npos)
        << "seqused_k without cu_seqlens: the message does not mention cu_seqlens: " << st.message;
  }
  // The host metadata was not written, and a correct call still works.
  EXPECT_EQ(host_meta, p.meta);
  if (built) check_vcase(c);
}

// ===========================================================================
// BACKWARD.
//
// Each case: q / k / v as in the forward tests, a random dout (and on some
// cases a random dlse), flash3::forward for out and lse (poisoned first, so
// their rows beyond seqused_q hold NaN, which the backward must not read), dq /
// dk / dv poisoned with NaN, flash3::backward. Then, per sequence, dq (its used
// q rows), dk and dv (its used k rows) against the fp32 GPU reference backward
// (gpu_reference.cuh) of that sequence cut out on the host as its own batch-1
// fixed-length problem: dense copies of its used rows of q, k, v, dout and
// dlse, bottom-right mask of (seqused_q_b, seqused_k_b). The reference
// recomputes everything from q / k / v (flash3's out / lse are not trusted) and
// shares none of the kernels' index arithmetic. The rule is test_bwd_gpu.cpp's,
// per sequence and gradient:
//   max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// eps = grad_eps(ref) (gpu_case.h: FlashAttention's gradient atol). Also:
//   * dq of fully masked query rows and dk / dv of keys no query of the
//     sequence sees are exactly 0; a sequence with used queries but no used
//     key has dq = 0, one with used keys but no used query dk = dv = 0;
//   * dq rows beyond seqused_q, dk / dv rows beyond seqused_k, the padding of
//     strided layouts and a guard after the three views keep the poison.
// Bitwise comparisons (isolation, graph replays, workspaces) use
// opts.deterministic: the default mode adds dQ (and GQA's dK / dV) partial
// sums with atomics, so two runs of the same inputs may differ in the last bit.
// Every test skips unless the case's forward AND backward kernels are built.
// ===========================================================================
constexpr uint64_t kDoutSalt = 0xd0d0d0d0ull;
constexpr uint64_t kDlseSalt = 0x15e15e15ull;
constexpr int kGrads = 3;  // dq, dk, dv
const char* const kGradNames[kGrads] = {"dQ", "dK", "dV"};

// Memory plan of the backward's own tensors (q / k / v / out / lse: VPlan).
struct BPlan {
  QKV grad;               // dq, dk, dv in one allocation of grad_elems (the views, then kGuard poisoned elements)
  int64_t grad_elems = 0;
  View dout;              // shaped like out (same layout), its own allocation
  int64_t dout_elems = 0;
  int64_t dlse_stride = 0;  // dlse (hq, total_q), row stride dlse_stride (the padding holds NaN)
  int64_t dlse_elems = 0;
  const View& g(int i) const { return i == 0 ? grad.q : (i == 1 ? grad.k : grad.v); }
};

BPlan make_bplan(const VCase& c) {
  BPlan b;
  const int64_t tq = c.total_q(), tk = c.total_k();
  b.grad = make_qkv(c.grad_layout, 1, tq, tk, c.hq, c.hkv, c.d, c.dv);
  b.grad_elems = b.grad.elems + kGuard;
  b.dout = c.layout == Layout::kPadded ? padded_view(0, 1, tq, c.hq, c.dv) : dense_view(0, 1, tq, c.hq, c.dv);
  b.dout_elems = std::max<int64_t>(b.dout.span(), 8);
  b.dlse_stride = std::max<int64_t>(tq, 1) + (c.layout == Layout::kPadded ? 8 : 0);
  b.dlse_elems = int64_t(c.hq) * b.dlse_stride;
  return b;
}

struct BBuffers {
  VBuffers fwd;  // plan and host copy of q / k / v (and the metadata)
  BPlan plan;
  std::vector<uint16_t> host_dout;
  std::vector<float> host_dlse;  // empty without dlse
};

// Copies what b's host vectors hold to the device (synchronously).
::testing::AssertionResult upload_bwd_host(const BBuffers& b) {
  DeviceState& d = dev();
  const ::testing::AssertionResult r = upload_varlen_host(d, b.fwd);
  if (!r) return r;
  cudaError_t e = cudaMemcpyAsync(d.dout.ptr, b.host_dout.data(), b.host_dout.size() * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess && !b.host_dlse.empty())
    e = cudaMemcpyAsync(d.dlse.ptr, b.host_dlse.data(), b.host_dlse.size() * 4, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "upload (backward): " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Plans, fills q / k / v, dout (and dlse) with fresh random normals seeded by
// the case, uploads.
::testing::AssertionResult upload_bwd_inputs(const VCase& c, BBuffers* b) {
  if (!c.store_lse) return ::testing::AssertionFailure() << "a backward case needs lse (store_lse)";
  if (c.grad_layout == Layout::kPackedQKV) return ::testing::AssertionFailure() << "no packed varlen gradients";
  const ::testing::AssertionResult fwd = upload_inputs(c, &b->fwd);  // the plan, q / k / v, the forward's buffers
  if (!fwd) return fwd;
  b->plan = make_bplan(c);
  const BPlan& bp = b->plan;
  b->host_dout.assign(size_t(bp.dout_elems), 0);
  tu::fill_normal(b->host_dout.data(), b->host_dout.size(), c.dtype, c.seed ^ kDoutSalt);
  b->host_dlse.clear();
  if (c.with_dlse) {
    std::vector<uint16_t> tmp(size_t(bp.dlse_elems));
    tu::fill_normal(tmp.data(), tmp.size(), DType::kBFloat16, c.seed ^ kDlseSalt);
    b->host_dlse.assign(tmp.size(), tu::bits_f32(kPoison32));
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t r = 0; r < c.total_q(); ++r)
        b->host_dlse[size_t(h * bp.dlse_stride + r)] = tu::bf16_to_float(tmp[size_t(h * bp.dlse_stride + r)]);
  }
  DeviceState& d = dev();
  const size_t g_bytes = size_t(bp.grad_elems) * 2;
  const ::testing::AssertionResult r =
      reserve_all({{&d.dout, size_t(bp.dout_elems) * 2}, {&d.dlse, size_t(std::max<int64_t>(bp.dlse_elems, 1)) * 4},
                   {&d.grad, g_bytes}, {&d.grad2, g_bytes}});
  if (!r) return r;
  return upload_bwd_host(*b);
}

// Varlen backward arguments on the shared device buffers: out / lse from
// dev().out / dev().lse, gradients into `grad`.
flash3::BackwardArgs make_bwd_args(const VCase& c, const BBuffers& b, void* grad) {
  DeviceState& d = dev();
  const VPlan& p = b.fwd.plan;
  const BPlan& bp = b.plan;
  flash3::BackwardArgs a;
  a.q = view3(d.in.ptr, c.dtype, p.q);
  a.k = view3(d.in.ptr, c.dtype, p.k);
  a.v = view3(d.in.ptr, c.dtype, p.v);
  a.out = view3(d.out.ptr, c.dtype, p.o);
  a.dout = view3(d.dout.ptr, c.dtype, bp.dout);
  a.lse = lse_view(d.lse.as<float>(), c, p.lse_stride);
  if (c.with_dlse) a.dlse = lse_view(d.dlse.as<float>(), c, bp.dlse_stride);
  a.dq = view3(grad, c.dtype, bp.grad.q);
  a.dk = view3(grad, c.dtype, bp.grad.k);
  a.dv = view3(grad, c.dtype, bp.grad.v);
  set_varlen_opts(c, p, d.meta.ptr, &a.opts);
  a.opts.deterministic = c.deterministic;
  return a;
}

// How a test calls flash3::backward on prepared arguments (empty: on the test stream).
using BackwardCall = std::function<flash3::Status(const flash3::BackwardArgs&)>;

// out / lse for the backward: poisoned, then flash3::forward.
flash3::Status run_bwd_forward(const VCase& c, const BBuffers& b) {
  DeviceState& d = dev();
  return run_varlen(d, c, b.fwd.plan, d.out.ptr, d.lse.as<float>());
}

// Poisons the gradient allocation `grad`, runs flash3::backward into it.
flash3::Status run_bwd(const VCase& c, const BBuffers& b, void* grad, void* ws = nullptr, size_t ws_bytes = 0,
                       const BackwardCall& call = {}) {
  DeviceState& d = dev();
  cudaMemsetAsync(grad, 0xff, size_t(b.plan.grad_elems) * 2, d.stream);
  flash3::BackwardArgs a = make_bwd_args(c, b, grad);
  a.workspace = ws;
  a.workspace_bytes = ws_bytes;
  if (!call) return flash3::backward(a, d.stream);
  cudaStreamSynchronize(d.stream);
  return call(a);
}

::testing::AssertionResult fetch_grads(const BPlan& bp, const void* grad, std::vector<uint16_t>* h) {
  h->assign(size_t(bp.grad_elems), 0);
  cudaError_t e = cudaStreamSynchronize(dev().stream);
  if (e == cudaSuccess) e = cudaMemcpy(h->data(), grad, h->size() * 2, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "download (gradients): " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

int64_t count_not_poison(const std::vector<uint16_t>& h) {
  int64_t n = 0;
  for (uint16_t x : h) n += x != kPoison16;
  return n;
}

// ---------------------------------------------------------------------------
// Per-sequence reference gradients.
// ---------------------------------------------------------------------------
struct SeqGradRef {
  // Dense: dq (sq, hq, d), dk (sk, hkv, d), dv (sk, hkv, dv).
  std::vector<double> ref[kGrads], low[kGrads];
};

flash3::gpuref::Strided16 dense16(const uint16_t* p, int64_t rows, int64_t h, int64_t dd) {
  flash3::gpuref::Strided16 t;
  t.data = p;
  t.batch_stride = std::max<int64_t>(rows, 1) * h * dd;
  t.row_stride = h * dd;
  t.head_stride = dd;
  return t;
}

::testing::AssertionResult sequence_grad_reference(const VCase& c, const BBuffers& b, int s, SeqGradRef* r) {
  const int sq = c.eff_q(s), sk = c.eff_k(s);
  const size_t n[kGrads] = {size_t(sq) * c.hq * c.d, size_t(sk) * c.hkv * c.d, size_t(sk) * c.hkv * c.dv};
  if (sq == 0 || sk == 0) {  // no query: dk = dv = 0; no key: every row fully masked, dq = 0
    for (int g = 0; g < kGrads; ++g) r->ref[g].assign(n[g], 0.0), r->low[g].assign(n[g], 0.0);
    return ::testing::AssertionSuccess();
  }
  // Dense copies of the sequence's used rows.
  std::vector<uint16_t> q16, k16, v16;
  cut_sequence(c, b.fwd, s, &q16, &k16, &v16);
  const BPlan& bp = b.plan;
  const int64_t q0 = b.fwd.plan.cu_q[s];
  std::vector<uint16_t> do16(size_t(sq) * c.hq * c.dv);
  for (int i = 0; i < sq; ++i)
    for (int h = 0; h < c.hq; ++h)
      std::memcpy(do16.data() + (size_t(i) * c.hq + h) * c.dv, b.host_dout.data() + bp.dout.at(0, q0 + i, h, 0),
                  size_t(c.dv) * 2);
  std::vector<float> dl;
  if (c.with_dlse) {
    dl.resize(size_t(c.hq) * sq);
    for (int h = 0; h < c.hq; ++h)
      for (int i = 0; i < sq; ++i) dl[size_t(h) * sq + i] = b.host_dlse[size_t(h * bp.dlse_stride + q0 + i)];
  }
  DeviceState& d = dev();
  const size_t nq = q16.size(), nk = k16.size(), nv = v16.size(), ndo = do16.size();
  const size_t k_off = round_up(int64_t(nq), 128), v_off = k_off + round_up(int64_t(nk), 128),
               o_off = v_off + round_up(int64_t(nv), 128);
  cudaError_t e = d.seq_bwd.reserve((o_off + ndo + 8) * 2);
  if (e == cudaSuccess) e = d.seq_dlse.reserve(std::max<size_t>(dl.size(), 1) * 4);
  for (int g = 0; g < kGrads; ++g) {
    if (e == cudaSuccess) e = d.ref_g[g].reserve(n[g] * 4);
    if (e == cudaSuccess) e = d.low_g[g].reserve(n[g] * 4);
  }
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "reference buffers: " << cudaGetErrorString(e);
  uint16_t* base = d.seq_bwd.as<uint16_t>();
  e = cudaMemcpyAsync(base, q16.data(), nq * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(base + k_off, k16.data(), nk * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(base + v_off, v16.data(), nv * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(base + o_off, do16.data(), ndo * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess && !dl.empty())
    e = cudaMemcpyAsync(d.seq_dlse.ptr, dl.data(), dl.size() * 4, cudaMemcpyHostToDevice, d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "reference upload: " << cudaGetErrorString(e);
  flash3::gpuref::BwdArgs ra;
  ra.dtype = c.dtype;
  ra.batch = 1, ra.seqlen_q = sq, ra.seqlen_k = sk, ra.heads_q = c.hq, ra.heads_kv = c.hkv;
  ra.head_dim = c.d, ra.head_dim_v = c.dv;
  ra.q = dense16(base, sq, c.hq, c.d);
  ra.k = dense16(base + k_off, sk, c.hkv, c.d);
  ra.v = dense16(base + v_off, sk, c.hkv, c.dv);
  ra.dout = dense16(base + o_off, sq, c.hq, c.dv);
  ra.dlse = c.with_dlse ? d.seq_dlse.as<float>() : nullptr;
  ra.softmax_scale = c.scale;
  ra.softcap = c.softcap;
  ra.causal = c.causal, ra.window_left = c.wl, ra.window_right = c.wr;
  ra.dq = d.ref_g[0].as<float>(), ra.dk = d.ref_g[1].as<float>(), ra.dv = d.ref_g[2].as<float>();
  const size_t need = flash3::gpuref::backward_scratch_bytes(ra);
  if (need > 0) {
    e = d.scratch.reserve(need);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "reference scratch: " << cudaGetErrorString(e);
    ra.scratch = d.scratch.ptr;
    ra.scratch_bytes = d.scratch.bytes;
  }
  flash3::gpuref::BwdArgs la = ra;
  la.dq = d.low_g[0].as<float>(), la.dk = d.low_g[1].as<float>(), la.dv = d.low_g[2].as<float>();
  e = flash3::gpuref::backward(ra, flash3::gpuref::Mode::kFloat32, d.stream);
  if (e == cudaSuccess) e = flash3::gpuref::backward(la, flash3::gpuref::Mode::kLowPrecision, d.stream);
  std::vector<float> f[2][kGrads];
  for (int g = 0; g < kGrads && e == cudaSuccess; ++g) {
    f[0][g].resize(n[g]), f[1][g].resize(n[g]);
    e = cudaMemcpyAsync(f[0][g].data(), d.ref_g[g].ptr, n[g] * 4, cudaMemcpyDeviceToHost, d.stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(f[1][g].data(), d.low_g[g].ptr, n[g] * 4, cudaMemcpyDeviceToHost, d.stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "GPU reference backward: " << cudaGetErrorString(e);
  for (int g = 0; g < kGrads; ++g) r->ref[g] = to_double(f[0][g]), r->low[g] = to_double(f[1][g]);
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// Checking flash3's dq / dk / dv.
// ---------------------------------------------------------------------------
// Rows [row0, row0 + rows) of a (1, total, h, w) view, dense (rows, h, w).
std::vector<double> view_rows(const std::vector<uint16_t>& buf, const View& v, int64_t row0, int rows, DType dt) {
  std::vector<double> out(size_t(rows) * v.h * v.d);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t hh = 0; hh < v.h; ++hh) {
      const uint16_t* src = buf.data() + v.at(0, row0 + i, hh, 0);
      double* dst = out.data() + (size_t(i) * v.h + hh) * v.d;
      for (int64_t x = 0; x < v.d; ++x) dst[x] = tu::half_bits_to_float(dt, src[x]);
    }
  return out;
}
std::vector<uint16_t> view_rows_bits(const std::vector<uint16_t>& buf, const View& v, int64_t row0, int rows) {
  std::vector<uint16_t> out;
  out.reserve(size_t(rows) * v.h * v.d);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t hh = 0; hh < v.h; ++hh) {
      const uint16_t* src = buf.data() + v.at(0, row0 + i, hh, 0);
      out.insert(out.end(), src, src + v.d);
    }
  return out;
}

// Visible keys [lo, hi) of query i of an (sq, sk) sequence: the bottom-right
// aligned mask of that sequence, in int64 (any window value).
void seq_key_range(const VCase& c, int sq, int sk, int i, int* lo, int* hi) {
  const int64_t wl = c.wl, wr = c.causal ? 0 : c.wr;
  const int64_t diag = int64_t(i) + sk - sq;
  int64_t l = 0, h = sk;
  if (wl >= 0) l = std::max<int64_t>(l, diag - wl);
  if (wr >= 0) h = std::min<int64_t>(h, diag + wr + 1);
  *lo = int(std::min<int64_t>(l, sk));
  *hi = int(std::max<int64_t>(std::min<int64_t>(h, sk), *lo));
}

// empty_rows[i]: query i sees no key; unseen_keys[j]: no query sees key j.
void seq_zero_rows(const VCase& c, int sq, int sk, std::vector<char>* empty_rows, std::vector<char>* unseen_keys) {
  empty_rows->assign(size_t(sq), 0);
  std::vector<int64_t> cover(size_t(sk) + 1, 0);
  for (int i = 0; i < sq; ++i) {
    int lo, hi;
    seq_key_range(c, sq, sk, i, &lo, &hi);
    if (hi <= lo) {
      (*empty_rows)[size_t(i)] = 1;
      continue;
    }
    ++cover[size_t(lo)];
    --cover[size_t(hi)];
  }
  unseen_keys->assign(size_t(sk), 0);
  int64_t run = 0;
  for (int j = 0; j < sk; ++j) {
    run += cover[size_t(j)];
    (*unseen_keys)[size_t(j)] = run == 0;
  }
}

// Per case: the largest baseline and eps over its sequences, per gradient (for
// comparisons between two flash3 results of the same problem).
struct GradSummary {
  double base[kGrads] = {0, 0, 0};
  double eps[kGrads] = {0, 0, 0};
};

// Checks a downloaded gradient allocation of case c (inputs: b's host vectors):
// poison outside the used rows, then each sequence (only `only_seq` when >= 0)
// against its own reference.
void check_grads(const VCase& c, const BBuffers& b, const std::vector<uint16_t>& h, GradSummary* sum = nullptr,
                 int only_seq = -1) {
  const VPlan& p = b.fwd.plan;
  const BPlan& bp = b.plan;
  ASSERT_EQ(h.size(), size_t(bp.grad_elems));
  const int64_t outside = count_clobbered(h, {&bp.grad.q, &bp.grad.k, &bp.grad.v});
  EXPECT_EQ(outside, 0) << c.describe() << ": flash3 wrote " << outside
                        << " elements of the gradient allocation outside the dq / dk / dv views (padding / guard)";
  // Rows beyond seqused: dq (q rows), dk / dv (k rows).
  for (int g = 0; g < kGrads; ++g) {
    const View& v = bp.g(g);
    const std::vector<int>& cu = g == 0 ? p.cu_q : p.cu_k;
    int64_t written = 0, first_row = -1;
    int first_seq = -1;
    for (int s = 0; s < c.n(); ++s) {
      const int used = g == 0 ? c.eff_q(s) : c.eff_k(s);
      for (int64_t r = cu[s] + used; r < cu[s + 1]; ++r)
        for (int64_t hh = 0; hh < v.h; ++hh)
          for (int64_t x = 0; x < v.d; ++x)
            if (h[size_t(v.at(0, r, hh, x))] != kPoison16) {
              ++written;
              if (first_row < 0) first_row = r, first_seq = s;
            }
    }
    EXPECT_EQ(written, 0) << c.describe() << ": flash3 wrote " << written << " " << kGradNames[g]
                          << " elements in rows beyond seqused_" << (g == 0 ? "q" : "k") << " (first in row "
                          << first_row << " = sequence " << first_seq << ", local row "
                          << (first_seq >= 0 ? first_row - cu[first_seq] : -1) << ")";
  }
  // Each sequence against its own reference.
  for (int s = 0; s < c.n(); ++s) {
    if (only_seq >= 0 && s != only_seq) continue;
    const int sq = c.eff_q(s), sk = c.eff_k(s);
    if (sq == 0 && sk == 0) continue;
    const int64_t row0[kGrads] = {p.cu_q[s], p.cu_k[s], p.cu_k[s]};
    const int rows[kGrads] = {sq, sk, sk};
    std::vector<double> ours[kGrads];
    for (int g = 0; g < kGrads; ++g) ours[g] = view_rows(h, bp.g(g), row0[g], rows[g], c.dtype);
    std::ostringstream seq;
    seq << "sequence " << s << " (q rows " << p.cu_q[s] << "+" << sq << ", k rows " << p.cu_k[s] << "+" << sk << ")";
    if (sq == 0 || sk == 0) {
      // No used query: dk = dv = 0 for its used keys. No used key: dq = 0 for its used rows.
      for (int g = sq == 0 ? 1 : 0; g < (sq == 0 ? kGrads : 1); ++g) {
        int64_t bad = 0;
        for (double x : ours[g]) bad += !(x == 0.0);  // NaN counts
        EXPECT_EQ(bad, 0) << c.describe() << "\n  " << seq.str() << ": " << (sq == 0 ? "no used query" : "no used key")
                          << ", but " << bad << " of " << ours[g].size() << " " << kGradNames[g]
                          << " elements are not 0";
      }
      continue;
    }
    SeqGradRef ref;
    ASSERT_TRUE(sequence_grad_reference(c, b, s, &ref)) << c.describe() << ", " << seq.str();
    std::vector<char> empty_rows, unseen_keys;
    seq_zero_rows(c, sq, sk, &empty_rows, &unseen_keys);
    for (int g = 0; g < kGrads; ++g) {
      const int64_t nh = bp.g(g).h, w = bp.g(g).d;
      const auto where = [&](size_t i) {
        std::ostringstream os;
        os << "(seq=" << s << ", row=" << int64_t(i) / (w * nh) << ", h=" << (int64_t(i) / w) % nh
           << ", c=" << int64_t(i) % w << ")";
        return os.str();
      };
      const double eps = grad_eps(ref.ref[g], c.dtype);
      const Verdict vd = judge(kGradNames[g], ours[g], ref.ref[g], ref.low[g], eps, where, tol_factor(c));
      EXPECT_TRUE(vd.ok) << c.describe() << "\n  " << seq.str() << "\n  " << vd.text;
      if (sum) {
        sum->base[g] = std::max(sum->base[g], vd.r.base_err);
        sum->eps[g] = std::max(sum->eps[g], eps);
      }
      // Exactly 0: dq of fully masked rows, dk / dv of keys no query sees.
      const std::vector<char>& zero = g == 0 ? empty_rows : unseen_keys;
      int64_t nz = 0, first = -1;
      for (int i = 0; i < rows[g]; ++i) {
        if (!zero[size_t(i)]) continue;
        for (int64_t e = int64_t(i) * nh * w; e < (int64_t(i) + 1) * nh * w; ++e)
          if (!(ours[g][size_t(e)] == 0.0)) {
            if (first < 0) first = e;
            ++nz;
          }
      }
      EXPECT_EQ(nz, 0) << c.describe() << "\n  " << seq.str() << ": " << kGradNames[g] << " has " << nz
                       << " non-zero (or NaN) elements in " << (g == 0 ? "fully masked query rows" : "keys no query sees")
                       << "; first at " << where(size_t(std::max<int64_t>(first, 0))) << " = "
                       << (first >= 0 ? ours[g][size_t(first)] : 0.0);
    }
  }
}

// Full check of one case: upload, forward, poison, backward, check.
void check_bwd_case(const VCase& c, GradSummary* sum = nullptr, const BackwardCall& call = {}) {
  SCOPED_TRACE(c.describe());
  BBuffers b;
  ASSERT_TRUE(upload_bwd_inputs(c, &b));
  DeviceState& d = dev();
  const flash3::Status fs = run_bwd_forward(c, b);
  ASSERT_TRUE(fs.ok()) << c.describe() << ": flash3::forward failed: " << fs.message;
  const flash3::Status bs = run_bwd(c, b, d.grad.ptr, nullptr, 0, call);
  ASSERT_TRUE(bs.ok()) << c.describe() << ": flash3::backward failed: " << bs.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> h;
  ASSERT_TRUE(fetch_grads(b.plan, d.grad.ptr, &h));
  check_grads(c, b, h, sum);
}

// ---------------------------------------------------------------------------
// What is built (the backward needs the forward for out / lse).
// ---------------------------------------------------------------------------
bool bwd_built(DType t, int d, int dv) { return flash3::forward_is_built(t, d, dv) && flash3::backward_is_built(t, d, dv); }

#define FLASH3_SKIP_UNLESS_BWD_BUILT(dt, d, dv)                                                                \
  do {                                                                                                         \
    if (!flash3::backward_is_built((dt), (d), (dv)))                                                          \
      GTEST_SKIP() << "not built: backward kernel " << tu::short_dtype(dt) << " " << (d) << "x" << (dv)       \
                   << " is not in this build (FLASH3_PASSES / FLASH3_DTYPES / FLASH3_HDIMS)";                  \
    if (!flash3::forward_is_built((dt), (d), (dv)))                                                           \
      GTEST_SKIP() << "not built: forward kernel " << tu::short_dtype(dt) << " " << (d) << "x" << (dv)        \
                   << " (needed for out / lse) is not in this build";                                         \
  } while (0)

// First built forward + backward variant, preferring the common ones.
bool pick_bwd_built(DType* dt, int* d, int* dv) {
  const HeadDims prefs[] = {{128, 128}, {64, 64}, {256, 256}, {96, 96}, {192, 192}, {192, 128}};
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    for (const HeadDims& h : prefs)
      if (bwd_built(t, h.d, h.dv)) {
        *dt = t, *d = h.d, *dv = h.dv;
        return true;
      }
  return false;
}

bool pick_bwd_dtype(HeadDims h, DType prefer, DType* dt) {
  const DType other = prefer == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
  for (DType t : {prefer, other})
    if (bwd_built(t, h.d, h.dv)) {
      *dt = t;
      return true;
    }
  return false;
}

// Every head-dim pair with a backward kernel in the build's variants file
// (as test_bwd_gpu.cpp decides) whose forward is built too.
std::vector<HeadDims> built_bwd_head_dims() {
  std::vector<HeadDims> out;
  for (HeadDims h : built_head_dims("bwd")) {
    DType dt;
    if (pick_bwd_dtype(h, DType::kBFloat16, &dt)) out.push_back(h);
  }
  return out;
}

// ===========================================================================
// The backward matrix: every head-dim pair x both dtypes (skipped unless the
// forward and backward kernels are built), the forward matrix's batches (the
// same lengths, masks, seqused and inputs: random lengths 0..4224 with 0, 1 and
// tile edges forced in, none / causal / local / one-sided / window >=
// max_seqlen, MHA / GQA / MQA, seqused with every clamp, strided layouts)
// except its single no-lse batch, plus: a random dlse on three batches,
// strided gradients on two (one with contiguous inputs), deterministic mode
// on two.
// ===========================================================================
std::vector<VCase> bwd_matrix_cases(HeadDims h, DType t) {
  std::vector<VCase> out;
  for (VCase c : matrix_cases(h, t)) {
    if (!c.store_lse) continue;  // the backward needs lse
    c.name = "bwd_" + c.name;    // the seed is kept: the forward matrix's inputs
    const size_t i = out.size();
    c.with_dlse = i % 2 == 0;                                              // nomask, local, one_sided
    c.grad_layout = i % 3 == 0 ? Layout::kPadded : Layout::kContiguous;   // nomask, causal_local_seqused
    c.deterministic = i == 3 || i == 5;                                    // causal_local_seqused, window_beyond_max
    out.push_back(c);
  }
  return out;
}

class VarlenBwdMatrix : public ::testing::TestWithParam<MatrixP> {};

TEST_P(VarlenBwdMatrix, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const auto& [h, t] = GetParam();
  FLASH3_SKIP_UNLESS_BWD_BUILT(t, h.d, h.dv);
  for (const VCase& c : bwd_matrix_cases(h, t)) {
    check_bwd_case(c);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenBwdMatrix,
                         ::testing::Combine(::testing::ValuesIn(kAllHeadDims),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         matrix_name);

// ===========================================================================
// Backward isolation: a sequence's dq / dk / dv do not depend on anything
// outside its own used rows. Everything else in q / k / v, dout, out, lse and
// dlse (the other sequences, its own rows beyond seqused, the layouts' padding)
// is set to zero, then to the largest finite values (alternating sign), then to
// NaN; the sequence's gradient rows must be bitwise the same in the three runs
// (deterministic mode), and the zero run matches the reference. out / lse of
// the sequence itself come from one forward of the original inputs.
// ===========================================================================
class VarlenBwdIsolation : public ::testing::TestWithParam<HeadDims> {};

TEST_P(VarlenBwdIsolation, NeighboursDoNotLeak) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims hd = GetParam();
  DType dt;
  if (!pick_bwd_dtype(hd, DType::kBFloat16, &dt))
    GTEST_SKIP() << "not built: no forward + backward kernel pair " << head_dims_name(hd);
  const uint16_t huge16 = dt == DType::kBFloat16 ? 0x7f7f : 0x7bff;  // largest finite value
  constexpr uint32_t kHuge32 = 0x7f7fffffu;                          // FLT_MAX
  struct Cfg {
    const char* name;
    bool causal;
    int wl, wr;
    bool seqused, dlse;
  };
  const Cfg cfgs[] = {{"nomask", false, -1, -1, false, true},
                      {"causal_seqused", true, -1, -1, true, false},
                      {"local20x5_seqused", false, 20, 5, true, true}};
  for (const Cfg& cfg : cfgs) {
    VCase c;
    c.dtype = dt, c.d = hd.d, c.dv = hd.dv, c.hq = 4, c.hkv = 2;
    c.causal = cfg.causal, c.wl = cfg.wl, c.wr = cfg.wr;
    c.len_q = {63, 65, 1, 130, 200, 17};
    c.len_k = {129, 64, 200, 1, 63, 300};
    if (cfg.seqused) {
      c.used_q = {60, 65, 1, 130, 199, 17};
      c.used_k = {129, 50, 200, 1, 63, 250};
    }
    c.layout = cfg.seqused ? Layout::kPadded : Layout::kContiguous;
    c.grad_layout = cfg.seqused ? Layout::kContiguous : Layout::kPadded;
    c.with_dlse = cfg.dlse;
    c.deterministic = true;
    c.name = std::string("bwd_isolation_") + head_dims_name(hd) + "_" + cfg.name;
    c.seed = fnv1a(c.name);
    SCOPED_TRACE(c.describe());
    BBuffers b;
    ASSERT_TRUE(upload_bwd_inputs(c, &b));
    DeviceState& ds = dev();
    const VPlan& p = b.fwd.plan;
    const BPlan& bp = b.plan;
    const flash3::Status fs = run_bwd_forward(c, b);
    ASSERT_TRUE(fs.ok()) << fs.message;
    Downloaded fwd;
    ASSERT_TRUE(download(ds, p, ds.out.ptr, ds.lse.as<float>(), &fwd));
    const std::vector<uint16_t> in0 = b.fwd.host_in, dout0 = b.host_dout;
    const std::vector<float> dlse0 = b.host_dlse;
    for (int s = 0; s < c.n(); ++s) {
      const int sq = c.eff_q(s), sk = c.eff_k(s);
      if (sq == 0 && sk == 0) continue;
      // Elements that belong to sequence s's used rows, per allocation.
      std::vector<uint8_t> mine_in(in0.size(), 0), mine_o(fwd.out.size(), 0), mine_do(dout0.size(), 0);
      std::vector<uint8_t> mine_l(fwd.lse.size(), 0), mine_dl(dlse0.size(), 0);
      for (int i = 0; i < sq; ++i) {
        const int64_t r = p.cu_q[s] + i;
        for (int hh = 0; hh < c.hq; ++hh) {
          std::memset(&mine_in[size_t(p.q.at(0, r, hh, 0))], 1, size_t(c.d));
          std::memset(&mine_o[size_t(p.o.at(0, r, hh, 0))], 1, size_t(c.dv));
          std::memset(&mine_do[size_t(bp.dout.at(0, r, hh, 0))], 1, size_t(c.dv));
          mine_l[size_t(hh * p.lse_stride + r)] = 1;
          if (!mine_dl.empty()) mine_dl[size_t(hh * bp.dlse_stride + r)] = 1;
        }
      }
      for (int j = 0; j < sk; ++j)
        for (int hh = 0; hh < c.hkv; ++hh) {
          std::memset(&mine_in[size_t(p.k.at(0, p.cu_k[s] + j, hh, 0))], 1, size_t(c.d));
          std::memset(&mine_in[size_t(p.v.at(0, p.cu_k[s] + j, hh, 0))], 1, size_t(c.dv));
        }
      std::vector<uint16_t> base[kGrads];
      const char* fills[] = {"zero", "huge", "NaN"};
      for (int f = 0; f < 3; ++f) {
        SCOPED_TRACE(std::string("sequence ") + std::to_string(s) + ", everything else " + fills[f]);
        auto fill16 = [&](const std::vector<uint16_t>& src, const std::vector<uint8_t>& mine) {
          std::vector<uint16_t> out = src;
          for (size_t i = 0; i < out.size(); ++i)
            if (!mine[i]) out[i] = f == 0 ? 0 : (f == 1 ? uint16_t(huge16 | ((i & 1) << 15)) : kPoison16);
          return out;
        };
        auto fill32 = [&](const std::vector<uint32_t>& src, const std::vector<uint8_t>& mine) {
          std::vector<uint32_t> out = src;
          for (size_t i = 0; i < out.size(); ++i)
            if (!mine[i]) out[i] = f == 0 ? 0u : (f == 1 ? uint32_t(kHuge32 | (uint32_t(i & 1) << 31)) : kPoison32);
          return out;
        };
        b.fwd.host_in = fill16(in0, mine_in);
        b.host_dout = fill16(dout0, mine_do);
        std::vector<uint32_t> dl_bits(dlse0.size());
        for (size_t i = 0; i < dl_bits.size(); ++i) dl_bits[i] = tu::f32_bits(dlse0[i]);
        dl_bits = fill32(dl_bits, mine_dl);
        for (size_t i = 0; i < dl_bits.size(); ++i) b.host_dlse[i] = tu::bits_f32(dl_bits[i]);
        ASSERT_TRUE(upload_bwd_host(b));
        const std::vector<uint16_t> o = fill16(fwd.out, mine_o);
        const std::vector<uint32_t> l = fill32(fwd.lse, mine_l);
        FLASH3_CUDA_OK(cudaMemcpy(ds.out.ptr, o.data(), o.size() * 2, cudaMemcpyHostToDevice));
        FLASH3_CUDA_OK(cudaMemcpy(ds.lse.ptr, l.data(), l.size() * 4, cudaMemcpyHostToDevice));
        const flash3::Status st = run_bwd(c, b, ds.grad.ptr);
        ASSERT_TRUE(st.ok()) << st.message;
        FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
        FLASH3_CUDA_OK(cudaGetLastError());
        std::vector<uint16_t> h;
        ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &h));
        std::vector<uint16_t> mine[kGrads] = {view_rows_bits(h, bp.grad.q, p.cu_q[s], sq),
                                              view_rows_bits(h, bp.grad.k, p.cu_k[s], sk),
                                              view_rows_bits(h, bp.grad.v, p.cu_k[s], sk)};
        if (f == 0) {
          check_grads(c, b, h, nullptr, s);  // the zero run: sequence s matches its reference
          if (HasFatalFailure()) return;
          for (int g = 0; g < kGrads; ++g) base[g] = std::move(mine[g]);
          continue;
        }
        for (int g = 0; g < kGrads; ++g) {
          int64_t diff = 0;
          for (size_t i = 0; i < mine[g].size(); ++i) diff += mine[g][i] != base[g][i];
          EXPECT_EQ(diff, 0) << c.describe() << ": sequence " << s << ": " << diff << " of " << mine[g].size() << " "
                             << kGradNames[g] << " elements change when everything outside its used rows is "
                             << fills[f] << " instead of zero"
                             << (f == 2 ? " (the kernel reads across the sequence boundary)" : "");
        }
        // Poison outside the used rows in every run (values are not checked here).
        EXPECT_EQ(count_clobbered(h, {&bp.grad.q, &bp.grad.k, &bp.grad.v}), 0) << c.describe();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenBwdIsolation, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Deterministic mode: three varlen backward runs of the same inputs are bitwise
// equal (the whole gradient allocation), and pass the reference check. Causal
// GQA with long sequences (many KV blocks add into one query block's dQ and
// four query heads into one dK / dV), and unmasked MQA with seqused_k. Every
// built head-dim pair.
// ===========================================================================
TEST(VarlenBwdGpu, DeterministicBitwise) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const std::vector<HeadDims> dims = built_bwd_head_dims();
  if (dims.empty()) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  constexpr int kRuns = 3;
  struct S {
    const char* name;
    int hq, hkv;
    bool causal;
    std::vector<int> q, k, uq, uk;
  };
  const S shapes[] = {
      {"causal_gqa8x2", 8, 2, true, {1500, 64, 1100, 2500}, {1500, 1, 2000, 2500}, {1500, 64, 1000, 2500}, {}},
      {"nomask_mqa4x1", 4, 1, false, {1000, 300, 129}, {1000, 2000, 1}, {}, {1000, 1999, 1}},
  };
  for (const HeadDims& hd : dims)
    for (const S& sh : shapes) {
      DType dt;
      pick_bwd_dtype(hd, DType::kBFloat16, &dt);
      VCase c;
      c.dtype = dt, c.d = hd.d, c.dv = hd.dv, c.hq = sh.hq, c.hkv = sh.hkv, c.causal = sh.causal;
      c.len_q = sh.q, c.len_k = sh.k, c.used_q = sh.uq, c.used_k = sh.uk;
      c.with_dlse = sh.causal;
      c.deterministic = true;
      c.name = std::string("bwd_deterministic_") + head_dims_name(hd) + "_" + sh.name;
      c.seed = fnv1a(c.name);
      SCOPED_TRACE(c.describe());
      BBuffers b;
      ASSERT_TRUE(upload_bwd_inputs(c, &b));
      DeviceState& ds = dev();
      const BPlan& bp = b.plan;
      const flash3::Status fs = run_bwd_forward(c, b);
      ASSERT_TRUE(fs.ok()) << fs.message;
      std::vector<uint16_t> first;
      for (int run = 0; run < kRuns; ++run) {
        const flash3::Status st = run_bwd(c, b, ds.grad.ptr);
        ASSERT_TRUE(st.ok()) << "run " << run << ": " << st.message;
        std::vector<uint16_t> h;
        ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &h));
        if (run == 0) {
          first = std::move(h);
          continue;
        }
        int64_t diff = 0, at = -1;
        for (size_t i = 0; i < h.size(); ++i)
          if (h[i] != first[i]) {
            if (at < 0) at = int64_t(i);
            ++diff;
          }
        const char* which = "padding / guard";
        for (int g = 0; g < kGrads; ++g)
          if (at >= bp.g(g).offset && at < bp.g(g).span()) which = kGradNames[g];
        EXPECT_EQ(diff, 0) << c.describe() << ": deterministic run " << run << " differs from run 0 in " << diff
                           << " elements (first at allocation index " << at << ", in " << which << ")";
      }
      check_grads(c, b, first);
      if (HasFatalFailure()) return;
    }
}

// ===========================================================================
// Equal lengths: n sequences of length L through the varlen backward equal the
// fixed-length backward of batch n on the same memory WITHIN TOLERANCE (not
// required bitwise), per gradient:
//   max|varlen - fixed| <= 2 * baseline + eps,
// baseline / eps = the largest over the sequences' reference checks. The
// varlen result is checked against the reference too, and the numbers of
// bitwise-different elements are recorded (bitwise_diff_dq / _dk / _dv).
// Both in deterministic mode (stable counts).
// ===========================================================================
TEST(VarlenBwdGpu, EqualLengthsMatchFixedLength) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_bwd_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  struct Mk {
    const char* name;
    bool causal;
    int wl, wr;
  };
  const Mk masks[] = {{"nomask", false, -1, -1}, {"causal", true, -1, -1}, {"local100x30", false, 100, 30}};
  int64_t total_diff[kGrads] = {0, 0, 0};
  for (int L : {128, 333, 1000})
    for (const Mk& m : masks) {
      const int n = 4;
      VCase c;
      c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.len_q.assign(n, L), c.len_k.assign(n, L);
      c.layout = c.grad_layout = L == 333 ? Layout::kPadded : Layout::kContiguous;
      c.deterministic = true;
      c.name = "bwd_equal_lengths_L" + std::to_string(L) + "_" + m.name;
      c.seed = fnv1a(c.name);
      SCOPED_TRACE(c.describe());
      BBuffers b;
      ASSERT_TRUE(upload_bwd_inputs(c, &b));
      DeviceState& ds = dev();
      const VPlan& p = b.fwd.plan;
      const BPlan& bp = b.plan;
      ASSERT_TRUE(run_bwd_forward(c, b).ok());
      const flash3::Status sv = run_bwd(c, b, ds.grad.ptr);
      ASSERT_TRUE(sv.ok()) << sv.message;
      std::vector<uint16_t> hv;
      ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &hv));
      GradSummary sum;
      check_grads(c, b, hv, &sum);
      if (HasFatalFailure()) return;

      // Fixed length on the same memory: (n, L, h, x) views of the (n * L, h, x) rows;
      // its own forward for out / lse ((n, hq, L) lse).
      auto view4 = [&](void* base, const View& v) {
        return TensorView::make4d(elem16(base, v.offset), dt, n, L, v.h, v.d, L * v.sr, v.sr, v.sh, 1);
      };
      flash3::ForwardArgs fa;
      fa.q = view4(ds.in.ptr, p.q);
      fa.k = view4(ds.in.ptr, p.k);
      fa.v = view4(ds.in.ptr, p.v);
      fa.out = view4(ds.out2.ptr, p.o);
      fa.lse = TensorView::make3d(ds.lse2.ptr, DType::kFloat32, n, c.hq, L, int64_t(c.hq) * L, L, 1);
      fa.opts.causal = c.causal, fa.opts.window_left = c.wl, fa.opts.window_right = c.wr;
      fa.opts.softmax_scale = c.scale, fa.opts.softcap = c.softcap;
      poison_outputs(p, ds.out2.ptr, ds.lse2.as<float>(), ds.stream);
      const flash3::Status sf = flash3::forward(fa, ds.stream);
      ASSERT_TRUE(sf.ok()) << "fixed-length forward: " << sf.message;
      flash3::BackwardArgs ba;
      ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.out = fa.out, ba.lse = fa.lse;
      ba.dout = view4(ds.dout.ptr, bp.dout);
      ba.dq = view4(ds.grad2.ptr, bp.grad.q);
      ba.dk = view4(ds.grad2.ptr, bp.grad.k);
      ba.dv = view4(ds.grad2.ptr, bp.grad.v);
      ba.opts = fa.opts;
      ba.opts.deterministic = true;
      FLASH3_CUDA_OK(cudaMemsetAsync(ds.grad2.ptr, 0xff, size_t(bp.grad_elems) * 2, ds.stream));
      const flash3::Status sb = flash3::backward(ba, ds.stream);
      ASSERT_TRUE(sb.ok()) << "fixed-length backward: " << sb.message;
      std::vector<uint16_t> hf;
      ASSERT_TRUE(fetch_grads(bp, ds.grad2.ptr, &hf));
      for (int g = 0; g < kGrads; ++g) {
        const View& v = bp.g(g);
        double err = 0;
        int64_t diff = 0;
        for (int64_t r = 0; r < int64_t(n) * L; ++r)
          for (int64_t hh = 0; hh < v.h; ++hh) {
            const int64_t at = v.at(0, r, hh, 0);
            for (int64_t x = 0; x < v.d; ++x) {
              const uint16_t u = hv[size_t(at + x)], w = hf[size_t(at + x)];
              diff += u != w;
              const double e = std::fabs(double(tu::half_bits_to_float(dt, u)) - tu::half_bits_to_float(dt, w));
              err = std::max(err, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
            }
          }
        total_diff[g] += diff;
        EXPECT_LE(err, 2 * sum.base[g] + sum.eps[g])
            << c.describe() << ": varlen and fixed-length " << kGradNames[g] << " differ by " << err << " (" << diff
            << " elements differ bitwise); bound 2 * " << sum.base[g] << " + " << sum.eps[g];
      }
    }
  ::testing::Test::RecordProperty("bitwise_diff_dq", std::to_string(total_diff[0]));
  ::testing::Test::RecordProperty("bitwise_diff_dk", std::to_string(total_diff[1]));
  ::testing::Test::RecordProperty("bitwise_diff_dv", std::to_string(total_diff[2]));
}

// ===========================================================================
// Workspace: backward_workspace_size() of a varlen call is > 0; a caller
// workspace of exactly that size (filled with 0xff garbage, a guard after it)
// works, twice in a row, and nothing past it is written; one byte less is
// rejected before anything runs (dq / dk / dv keep their poison). Deterministic
// runs: internal allocation, caller workspace and a second run in it are
// bitwise equal. Causal GQA with seqused, unmasked MHA (default mode), and
// causal with more queries than keys (the top query blocks get no KV block:
// their dQ must come out 0, not whatever the workspace held). Every built
// head-dim pair.
// ===========================================================================
TEST(VarlenBwdGpu, CallerWorkspace) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const std::vector<HeadDims> dims = built_bwd_head_dims();
  if (dims.empty()) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  constexpr size_t kWsGuard = 4096;
  constexpr uint8_t kWsPoison = 0xff;  // NaN as fp32, -1 as int32
  struct S {
    const char* name;
    int hq, hkv;
    bool causal, det;
    std::vector<int> q, k, uq, uk;
  };
  const S shapes[] = {
      {"causal_gqa8x2_seqused_det", 8, 2, true, true, {1000, 0, 300, 129, 700}, {1000, 64, 0, 500, 300},
       {990, 0, 300, 100, 700}, {1000, 64, 0, 450, 299}},
      {"nomask_mha4_default", 4, 4, false, false, {1000, 300, 1}, {700, 1200, 65}, {}, {}},
      {"causal_short_k_det", 8, 2, true, true, {1000, 700, 129}, {300, 100, 1}, {}, {}},
  };
  for (const HeadDims& hd : dims)
    for (const S& sh : shapes) {
      DType dt;
      pick_bwd_dtype(hd, DType::kBFloat16, &dt);
      VCase c;
      c.dtype = dt, c.d = hd.d, c.dv = hd.dv, c.hq = sh.hq, c.hkv = sh.hkv, c.causal = sh.causal;
      c.len_q = sh.q, c.len_k = sh.k, c.used_q = sh.uq, c.used_k = sh.uk;
      c.deterministic = sh.det;
      c.name = std::string("bwd_workspace_") + head_dims_name(hd) + "_" + sh.name;
      c.seed = fnv1a(c.name);
      SCOPED_TRACE(c.describe());
      BBuffers b;
      ASSERT_TRUE(upload_bwd_inputs(c, &b));
      DeviceState& ds = dev();
      const BPlan& bp = b.plan;
      ASSERT_TRUE(run_bwd_forward(c, b).ok());

      const size_t ws_bytes = flash3::backward_workspace_size(make_bwd_args(c, b, ds.grad.ptr));
      ::testing::Test::RecordProperty(c.name + "_bytes", std::to_string(ws_bytes));
      EXPECT_GT(ws_bytes, 0u) << c.describe() << ": backward_workspace_size() of a varlen call is 0";
      tu::DeviceBuffer ws;
      FLASH3_CUDA_OK(ws.reserve(ws_bytes + kWsGuard));
      // On the test stream (non-blocking: a legacy-stream memset would not be ordered before the backward).
      FLASH3_CUDA_OK(cudaMemsetAsync(ws.ptr, kWsPoison, ws_bytes + kWsGuard, ds.stream));

      const flash3::Status s1 = run_bwd(c, b, ds.grad.ptr);
      ASSERT_TRUE(s1.ok()) << "internal workspace: " << s1.message;
      std::vector<uint16_t> g1, g2, g3;
      ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &g1));
      const flash3::Status s2 = run_bwd(c, b, ds.grad.ptr, ws.ptr, ws_bytes);
      ASSERT_TRUE(s2.ok()) << "caller workspace of " << ws_bytes << " bytes: " << s2.message;
      ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &g2));
      const flash3::Status s3 = run_bwd(c, b, ds.grad.ptr, ws.ptr, ws_bytes);
      ASSERT_TRUE(s3.ok()) << "caller workspace, second run: " << s3.message;
      ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &g3));
      FLASH3_CUDA_OK(cudaGetLastError());
      auto guard_bad = [&] {
        std::vector<uint8_t> guard(kWsGuard);
        EXPECT_EQ(cudaMemcpy(guard.data(), ws.as<char>() + ws_bytes, kWsGuard, cudaMemcpyDeviceToHost), cudaSuccess);
        int64_t bad = 0;
        for (uint8_t x : guard) bad += x != kWsPoison;
        return bad;
      };
      EXPECT_EQ(guard_bad(), 0) << c.describe() << ": flash3 wrote past the end of a " << ws_bytes
                                << "-byte workspace (backward_workspace_size())";
      if (c.deterministic) {
        EXPECT_TRUE(g1 == g2) << c.describe() << ": caller workspace and internal allocation give different gradients";
        EXPECT_TRUE(g2 == g3) << c.describe() << ": a second run in the same caller workspace gives different gradients";
      }
      {
        SCOPED_TRACE("caller workspace, first run");
        check_grads(c, b, g2);
      }
      {
        SCOPED_TRACE("caller workspace, second run");
        check_grads(c, b, g3);
      }
      if (!c.deterministic) {
        SCOPED_TRACE("internal workspace");
        check_grads(c, b, g1);
      }
      if (HasFatalFailure()) return;

      // One byte less: an error, before any launch.
      if (ws_bytes > 0) {
        FLASH3_CUDA_OK(cudaMemsetAsync(ds.grad2.ptr, 0xff, size_t(bp.grad_elems) * 2, ds.stream));
        flash3::BackwardArgs a = make_bwd_args(c, b, ds.grad2.ptr);
        a.workspace = ws.ptr;
        a.workspace_bytes = ws_bytes - 1;
        const flash3::Status st = flash3::backward(a, ds.stream);
        EXPECT_FALSE(st.ok()) << c.describe() << ": a workspace of " << ws_bytes - 1 << " bytes (< " << ws_bytes
                              << " = backward_workspace_size()) was accepted";
        EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << st.message;
        EXPECT_FALSE(st.message.empty());
        std::vector<uint16_t> h;
        ASSERT_TRUE(fetch_grads(bp, ds.grad2.ptr, &h));
        EXPECT_EQ(count_not_poison(h), 0) << c.describe() << ": a rejected call wrote gradient elements";
        EXPECT_EQ(guard_bad(), 0) << c.describe() << ": a rejected call wrote past the workspace";
        FLASH3_CUDA_OK(cudaGetLastError());
      }
    }
}

// ===========================================================================
// CUDA graphs: varlen forward + backward captured together (global capture
// mode, internal workspace: stream-ordered allocation inside the graph) and
// replayed. Capturing runs nothing; a replay gives the right gradients; two
// replays are bitwise equal (deterministic mode); after the capture the prefix
// sums, seqused, q / k / v, dout and dlse are changed on the device (the same
// totals and max_seqlen, other lengths) and the replay computes the new problem.
// ===========================================================================
TEST(VarlenBwdGpu, CudaGraphCaptureAndReplay) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_bwd_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  VCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.hq = 8, c.hkv = 2, c.causal = true;
  c.len_q = {300, 0, 129, 1000, 64};
  c.len_k = {500, 10, 128, 700, 1};
  c.used_k = {500, 10, 100, 700, 1};
  c.with_dlse = true;
  c.deterministic = true;
  c.grad_layout = Layout::kPadded;
  c.name = "bwd_graph_capture";
  c.seed = fnv1a(c.name);
  SCOPED_TRACE(c.describe());
  BBuffers b;
  ASSERT_TRUE(upload_bwd_inputs(c, &b));
  DeviceState& ds = dev();
  const VPlan& p = b.fwd.plan;
  const BPlan& bp = b.plan;
  const flash3::ForwardArgs fa = make_args(c, p, ds.in.ptr, ds.out.ptr, ds.lse.as<float>(), ds.meta.ptr);
  const flash3::BackwardArgs ba = make_bwd_args(c, b, ds.grad.ptr);
  // Warm-up outside the capture (first launches set the kernels' shared-memory attributes).
  ASSERT_TRUE(flash3::forward(fa, ds.stream).ok());
  ASSERT_TRUE(flash3::backward(ba, ds.stream).ok());
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));

  cudaStream_t s = nullptr;
  FLASH3_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  poison_outputs(p, ds.out.ptr, ds.lse.as<float>(), ds.stream);
  FLASH3_CUDA_OK(cudaMemsetAsync(ds.grad.ptr, 0xff, size_t(bp.grad_elems) * 2, ds.stream));
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FLASH3_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const flash3::Status fst = flash3::forward(fa, s);
  const flash3::Status bst = flash3::backward(ba, s);
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  ASSERT_TRUE(fst.ok()) << "forward during capture: " << fst.message;
  ASSERT_TRUE(bst.ok()) << "backward during capture: " << bst.message;
  ASSERT_EQ(end, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(end);
  FLASH3_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  FLASH3_CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_GT(nodes, 0u) << "the captured graph is empty";
  {  // Capturing ran nothing.
    std::vector<uint16_t> h;
    ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, &h));
    EXPECT_EQ(count_not_poison(h), 0) << "capturing the backward wrote gradient elements";
  }
  auto replay = [&](std::vector<uint16_t>* h) {
    poison_outputs(p, ds.out.ptr, ds.lse.as<float>(), s);
    FLASH3_CUDA_OK(cudaMemsetAsync(ds.grad.ptr, 0xff, size_t(bp.grad_elems) * 2, s));
    FLASH3_CUDA_OK(cudaGraphLaunch(exec, s));
    FLASH3_CUDA_OK(cudaStreamSynchronize(s));
    FLASH3_CUDA_OK(cudaGetLastError());
    ASSERT_TRUE(fetch_grads(bp, ds.grad.ptr, h));
  };
  std::vector<uint16_t> h1, h2;
  replay(&h1);
  if (HasFatalFailure()) return;
  check_grads(c, b, h1);
  replay(&h2);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(h1 == h2) << "two replays of the same graph differ (deterministic mode)";

  // Other lengths (the same totals and maxima), other seqused, other inputs; same pointers.
  VCase c2 = c;
  c2.len_q = {64, 1000, 129, 0, 300};
  c2.len_k = {1, 700, 128, 10, 500};
  c2.used_k = {1, 650, 128, 0, 499};
  c2.name = "bwd_graph_capture_second";
  c2.seed = fnv1a(c2.name);
  ASSERT_EQ(c2.total_q(), c.total_q());
  ASSERT_EQ(c2.total_k(), c.total_k());
  ASSERT_EQ(c2.max_q(), c.max_q());
  ASSERT_EQ(c2.max_k(), c.max_k());
  const void* before[] = {ds.in.ptr, ds.meta.ptr, ds.dout.ptr, ds.dlse.ptr, ds.grad.ptr, ds.out.ptr, ds.lse.ptr};
  BBuffers b2;
  ASSERT_TRUE(upload_bwd_inputs(c2, &b2));
  const void* after[] = {ds.in.ptr, ds.meta.ptr, ds.dout.ptr, ds.dlse.ptr, ds.grad.ptr, ds.out.ptr, ds.lse.ptr};
  for (size_t i = 0; i < sizeof(before) / sizeof(before[0]); ++i) ASSERT_EQ(before[i], after[i]) << "buffer " << i;
  std::vector<uint16_t> h3;
  replay(&h3);
  if (HasFatalFailure()) return;
  {
    SCOPED_TRACE("replay after changing cu_seqlens / seqused / q / k / v / dout / dlse on the device");
    check_grads(c2, b2, h3);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// ===========================================================================
// Degenerate batches: no query row at all (total_q = 0: dk = dv = 0 for every
// used key), no key at all (dq = 0), every row beyond seqused (nothing
// written), one 1 x 1 sequence, and num_sequences = 0 (Ok, nothing written).
// ===========================================================================
TEST(VarlenBwdGpu, DegenerateBatches) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt;
  int d, dv;
  if (!pick_bwd_built(&dt, &d, &dv)) GTEST_SKIP() << "not built: no forward + backward kernel pair";
  struct S {
    const char* name;
    std::vector<int> q, k, uq, uk;
    bool causal;
  };
  const S shapes[] = {{"all_q_empty", {0, 0, 0}, {5, 64, 0}, {}, {}, false},
                      {"all_q_empty_causal_seqused", {0, 0, 0}, {5, 64, 130}, {}, {5, 30, 129}, true},
                      {"all_k_empty", {1, 64, 65}, {0, 0, 0}, {}, {}, false},
                      {"all_k_empty_causal", {1, 64, 65}, {0, 0, 0}, {}, {}, true},
                      {"all_unused", {10, 20, 64}, {30, 5, 64}, {0, 0, 0}, {0, 0, 0}, false},
                      {"q_unused_k_used", {10, 20}, {30, 5}, {0, 0}, {}, true},
                      {"one_1x1", {1}, {1}, {}, {}, false},
                      {"one_1x1_causal", {1}, {1}, {}, {}, true}};
  int i = 0;
  for (const S& s : shapes) {
    VCase c;
    c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
    c.len_q = s.q, c.len_k = s.k, c.used_q = s.uq, c.used_k = s.uk, c.causal = s.causal;
    c.with_dlse = i++ % 2 == 1;
    c.name = std::string("bwd_degenerate_") + s.name;
    c.seed = fnv1a(c.name);
    check_bwd_case(c);
    if (HasFatalFailure()) return;
  }
  // num_sequences = 0 with tensors and prefix sums of a real batch: valid, nothing written.
  VCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
  c.len_q = {10, 20}, c.len_k = {30, 5};
  c.name = "bwd_degenerate_num_sequences_0";
  c.seed = fnv1a(c.name);
  SCOPED_TRACE(c.describe());
  BBuffers b;
  ASSERT_TRUE(upload_bwd_inputs(c, &b));
  DeviceState& ds = dev();
  ASSERT_TRUE(run_bwd_forward(c, b).ok());
  const flash3::Status st = run_bwd(c, b, ds.grad.ptr, nullptr, 0, [&](const flash3::BackwardArgs& a0) {
    flash3::BackwardArgs a = a0;
    a.opts.num_sequences = 0;
    return flash3::backward(a, ds.stream);
  });
  EXPECT_TRUE(st.ok()) << "num_sequences = 0: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(ds.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> h;
  ASSERT_TRUE(fetch_grads(b.plan, ds.grad.ptr, &h));
  EXPECT_EQ(count_not_poison(h), 0) << "num_sequences = 0 wrote gradient elements";
}

// ===========================================================================
// Backward errors that need device memory: cu_seqlens / seqused as host
// pointers or misaligned, num_sequences < 0, dlse of the wrong shape are
// rejected (kInvalidArgument, naming the option) before any launch; a correct
// call still works afterwards.
// ===========================================================================
TEST(VarlenBwdGpu, HostOrMisalignedSeqlensAreRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  int d = 128, dv = 128;
  const bool built = pick_bwd_built(&dt, &d, &dv);
  VCase c;
  c.dtype = dt, c.d = d, c.dv = dv, c.hq = 4, c.hkv = 2;
  c.len_q = {10, 64, 7}, c.len_k = {20, 64, 1};
  c.used_q = {10, 60, 7}, c.used_k = {20, 64, 1};
  c.with_dlse = true;
  c.name = "bwd_bad_seqlens";
  c.seed = fnv1a(c.name);
  BBuffers b;
  ASSERT_TRUE(upload_bwd_inputs(c, &b));
  DeviceState& ds = dev();
  const VPlan& p = b.fwd.plan;
  // The forward (when built) gives real out / lse; else they stay zero.
  FLASH3_CUDA_OK(cudaMemset(ds.out.ptr, 0, size_t(p.out_elems) * 2));
  FLASH3_CUDA_OK(cudaMemset(ds.lse.ptr, 0, size_t(p.lse_elems) * 4));
  if (built) {
    ASSERT_TRUE(run_bwd_forward(c, b).ok());
  }
  const std::vector<int> host_meta = p.meta;
  const int* hm = host_meta.data();
  struct Bad {
    std::string what, must_name;
    std::function<void(flash3::BackwardArgs&)> mutate;
  };
  const std::vector<Bad> bads = {
      {"cu_seqlens_q is a host pointer", "cu_seqlens_q",
       [&](flash3::BackwardArgs& a) { a.opts.cu_seqlens_q = hm + p.m_cu_q; }},
      {"cu_seqlens_k is a host pointer", "cu_seqlens_k",
       [&](flash3::BackwardArgs& a) { a.opts.cu_seqlens_k = hm + p.m_cu_k; }},
      {"seqused_q is a host pointer", "seqused_q", [&](flash3::BackwardArgs& a) { a.opts.seqused_q = hm + p.m_used_q; }},
      {"seqused_k is a host pointer", "seqused_k", [&](flash3::BackwardArgs& a) { a.opts.seqused_k = hm + p.m_used_k; }},
      {"seqused_k misaligned by 2 bytes", "seqused_k",
       [&](flash3::BackwardArgs& a) {
         a.opts.seqused_k = reinterpret_cast<const int*>(reinterpret_cast<const char*>(a.opts.seqused_k) + 2);
       }},
      {"num_sequences = -1", "num_sequences", [&](flash3::BackwardArgs& a) { a.opts.num_sequences = -1; }},
      {"dlse (hq, total_q + 1)", "dlse", [&](flash3::BackwardArgs& a) { a.dlse.shape[1] += 1; }},
  };
  for (const Bad& bad : bads) {
    flash3::Status st;
    run_bwd(c, b, ds.grad.ptr, nullptr, 0, [&](const flash3::BackwardArgs& a0) {
      flash3::BackwardArgs a = a0;
      bad.mutate(a);
      st = flash3::backward(a, ds.stream);
      return st;
    });
    EXPECT_FALSE(st.ok()) << bad.what << ": flash3::backward returned Ok";
    EXPECT_FALSE(st.message.empty()) << bad.what << ": error without a message";
    if (built) {
      EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << bad.what << ": " << st.message;
      EXPECT_NE(st.message.find(bad.must_name), std::string::npos)
          << bad.what << ": the message does not name " << bad.must_name << ": " << st.message;
    }
    EXPECT_EQ(cudaStreamSynchronize(ds.stream), cudaSuccess) << bad.what;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << bad.what;
    std::vector<uint16_t> h;
    ASSERT_TRUE(fetch_grads(b.plan, ds.grad.ptr, &h));
    EXPECT_EQ(count_not_poison(h), 0) << bad.what << ": a rejected call wrote gradient elements";
  }
  EXPECT_EQ(host_meta, p.meta);
  if (built) check_bwd_case(c);
}

// ===========================================================================
// SOFTCAP (varlen): opts.softcap > 0 caps the scaled scores, s -> softcap *
// tanh(s / softcap), per sequence; forward and backward. A (dtype, head dims)
// pair runs only where variants.txt lists its softcap units (FLASH3_FEATURES:
// "fwd ... softcap" for the forward; that and "bwd ... softcap" for the
// backward) and the plain kernels are built. The per-sequence references
// (float64 CPU for the small sequences, fp32 GPU for the others) apply the
// same cap.
// ===========================================================================
// The softcap batches of one (dtype, head dims) pair (the first two only unless
// full): mixed lengths with empty q, empty k, 1 x 1 and tile edges; no mask,
// causal, local + seqused; MHA / GQA / MQA; caps 1, 5, 30; default and
// explicit softmax_scale. For the backward: dlse on two, strided gradients on
// one, deterministic mode on one.
std::vector<VCase> softcap_vcases(DType t, HeadDims h, bool full, bool backward) {
  std::vector<VCase> out;
  const std::string prefix =
      std::string(backward ? "bwd_" : "") + "varlen_softcap_" + tu::short_dtype(t) + "_" + head_dims_name(h) + "_";
  auto base = [&](const std::string& tag, int hq, int hkv) {
    VCase c;
    c.dtype = t, c.d = h.d, c.dv = h.dv, c.hq = hq, c.hkv = hkv;
    c.name = prefix + tag;
    c.seed = fnv1a(c.name);
    return c;
  };
  {  // No mask, MHA; empty q, 1 x 1, tile edges, q rows with no key (out = 0, lse = -inf; dq = 0).
    VCase c = base("cap5_nomask_mha2x2_b6", 2, 2);
    c.len_q = {0, 1, 63, 130, 200, 3};
    c.len_k = {5, 1, 64, 0, 257, 129};
    c.softcap = 5.f;
    c.with_dlse = backward;
    out.push_back(c);
  }
  {  // Causal, MQA, strided; q longer than k (fully masked rows); peaked scores (scale 1).
    VCase c = base("cap30_causal_mqa4x1_scale1_b5", 4, 1);
    c.len_q = {1, 0, 129, 77, 300};
    c.len_k = {1, 9, 65, 200, 180};
    c.layout = Layout::kPadded;
    c.causal = true;
    c.softcap = 30.f;
    c.scale = 1.f;
    c.deterministic = backward;
    out.push_back(c);
  }
  if (!full) return out;
  {  // Local window, GQA, seqused_q / seqused_k; a saturating cap.
    VCase c = base("cap1_local40x10_gqa4x2_seqused_b4", 4, 2);
    c.len_q = {65, 1, 200, 0};
    c.len_k = {200, 1, 63, 17};
    c.used_q = {60, 1, 200, 0};
    c.used_k = {150, 1, 63, 17};
    c.wl = 40, c.wr = 10;
    c.softcap = 1.f;
    c.grad_layout = Layout::kPadded;
    c.with_dlse = backward;
    out.push_back(c);
  }
  {  // Causal, MHA, explicit scale, a sequence with queries but no key.
    VCase c = base("cap1_causal_mha4x4_scale0.3_b3", 4, 4);
    c.len_q = {17, 255, 1};
    c.len_k = {300, 31, 0};
    c.causal = true;
    c.softcap = 1.f;
    c.scale = 0.3f;
    out.push_back(c);
  }
  return out;
}

// Every head-dim pair: bf16 (fp16 where bf16 has no softcap unit) with every
// batch, then the other dtype, where built, with the first two.
class VarlenSoftcap : public ::testing::TestWithParam<HeadDims> {};

TEST_P(VarlenSoftcap, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return softcap_built(dt, h, false); },
                                [&](DType dt, bool full) { return softcap_vcases(dt, h, full, /*backward=*/false); },
                                [](const VCase& c) { check_vcase(c); });
  if (ran == 0)
    GTEST_SKIP() << "not built: no forward softcap kernel " << head_dims_name(h) << " (FLASH3_FEATURES / FLASH3_HDIMS)";
}

INSTANTIATE_TEST_SUITE_P(Softcap, VarlenSoftcap, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

class VarlenBwdSoftcap : public ::testing::TestWithParam<HeadDims> {};

TEST_P(VarlenBwdSoftcap, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return softcap_built(dt, h, true); },
                                [&](DType dt, bool full) { return softcap_vcases(dt, h, full, /*backward=*/true); },
                                [](const VCase& c) { check_bwd_case(c); });
  if (ran == 0)
    GTEST_SKIP() << "not built: no forward + backward softcap kernel pair " << head_dims_name(h)
                 << " (FLASH3_FEATURES / FLASH3_HDIMS)";
}

INSTANTIATE_TEST_SUITE_P(Softcap, VarlenBwdSoftcap, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

}  // namespace
