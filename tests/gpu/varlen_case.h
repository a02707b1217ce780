// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The variable-length forward's case, memory plan, arguments and runs, the
// checks of a result (per-sequence reference, poison outside the used rows),
// and the builder of its batches (random lengths, seqused), shared by
// test_varlen_gpu.cpp, test_packgqa_gpu.cpp and test_splitkv_gpu.cpp.
//
// Layouts (flash3.h): q (total_q, hq, d), k (total_k, hkv, d), v (total_k, hkv, dv),
// out (total_q, hq, dv), lse (hq, total_q) fp32. Sequence b owns rows
// [cu[b], cu[b+1]); seqused[b] (clamped to [0, cu[b+1] - cu[b]]) of them are real.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "fwd_case.h"
#include "gpu_case.h"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"

namespace flash3::gputest {

struct VCase {
  DType dtype = DType::kBFloat16;
  int d = 128, dv = 128;
  int hq = 4, hkv = 4;
  bool causal = false;
  int wl = -1, wr = -1;
  float scale = flash3::gpuref::kDefaultScale;  // NaN: 1/sqrt(d)
  float softcap = 0.f;                          // opts.softcap; 0: off
  int pack_gqa = -1;                            // opts.pack_gqa; -1 (the API's default): the launch decides
  std::vector<int> len_q, len_k;    // rows of each sequence (cu_seqlens differences)
  std::vector<int> used_q, used_k;  // seqused_q / seqused_k; empty: not passed
  int max_pad = 0;                  // max_seqlen_* = longest sequence + max_pad (overstated when > 0)
  Layout layout = Layout::kContiguous;  // kContiguous or kPadded (strided rows / heads, padded lse rows)
  // > 0: out, and each head's lse rows, followed by this many rows of poison
  // (lse: in place of kPadded's padding).
  int gap_rows = 0;
  bool store_lse = true;
  // Backward only: layout of dq / dk / dv (kContiguous or kPadded), a random
  // dlse, opts.deterministic.
  Layout grad_layout = Layout::kContiguous;
  bool with_dlse = false;
  bool deterministic = false;
  uint64_t seed = 1;
  std::string name;

  int n() const { return int(len_q.size()); }
  // Real lengths (seqused clamped to [0, len], as the API specifies).
  int eff_q(int b) const { return used_q.empty() ? len_q[b] : std::clamp(used_q[b], 0, len_q[b]); }
  int eff_k(int b) const { return used_k.empty() ? len_k[b] : std::clamp(used_k[b], 0, len_k[b]); }
  int64_t total_q() const {
    int64_t t = 0;
    for (int x : len_q) t += x;
    return t;
  }
  int64_t total_k() const {
    int64_t t = 0;
    for (int x : len_k) t += x;
    return t;
  }
  int max_q() const {
    int m = 0;
    for (int x : len_q) m = std::max(m, x);
    return std::max(m, 1) + max_pad;
  }
  int max_k() const {
    int m = 0;
    for (int x : len_k) m = std::max(m, x);
    return std::max(m, 1) + max_pad;
  }

  std::string describe() const {
    std::ostringstream os;
    os << name << " [" << tu::short_dtype(dtype) << " d=" << d << " dv=" << dv << " hq=" << hq << " hkv=" << hkv
       << " causal=" << causal << " window=(" << wl << "," << wr << ") scale=" << scale;
    if (softcap > 0.f) os << " softcap=" << softcap;
    if (pack_gqa != -1) os << " pack_gqa=" << pack_gqa;
    os << " layout=" << layout_name(layout);
    if (gap_rows > 0) os << " gap_rows=" << gap_rows;
    os << " lse=" << (store_lse ? "yes" : "no") << " grad_layout=" << layout_name(grad_layout)
       << " dlse=" << with_dlse << " deterministic=" << deterministic << " max_seqlen=(" << max_q() << ","
       << max_k() << ") seed=" << seed << "; (len_q[/used_q], len_k[/used_k]):";
    for (int b = 0; b < n(); ++b) {
      os << " (" << len_q[b];
      if (!used_q.empty()) os << "/" << used_q[b];
      os << "," << len_k[b];
      if (!used_k.empty()) os << "/" << used_k[b];
      os << ")";
    }
    os << "]";
    return os.str();
  }
};

// ---------------------------------------------------------------------------
// Memory plan: q / k / v / out are (1, total, h, d) views of gpu_case.h (rows
// strided like the fixed-length tests' layouts); lse is (hq, total_q) with row
// stride lse_stride; cu_seqlens / seqused live in one int32 device buffer.
// ---------------------------------------------------------------------------
struct VPlan {
  View q, k, v, o;
  int64_t in_elems = 0;   // one allocation holds q, k and v
  int64_t out_elems = 0;  // o, then the gap rows, then kGuard poisoned elements
  int64_t lse_stride = 0;
  int64_t lse_elems = 0;  // hq * lse_stride + kGuard
  std::vector<int> cu_q, cu_k;
  // Offsets (in ints) of the arrays in the metadata buffer.
  int64_t m_cu_q = 0, m_cu_k = 0, m_used_q = 0, m_used_k = 0, meta_ints = 0;
  std::vector<int> meta;  // host copy of the metadata buffer
};

inline VPlan make_vplan(const VCase& c) {
  VPlan p;
  const int64_t tq = c.total_q(), tk = c.total_k();
  const QKV in = make_qkv(c.layout, 1, tq, tk, c.hq, c.hkv, c.d, c.dv);
  p.q = in.q, p.k = in.k, p.v = in.v;
  p.in_elems = in.elems;
  p.o = c.layout == Layout::kPadded ? padded_view(0, 1, tq, c.hq, c.dv) : dense_view(0, 1, tq, c.hq, c.dv);
  p.out_elems = p.o.span() + std::max<int64_t>(kGuard, int64_t(c.gap_rows) * p.o.sr);
  const int64_t lse_pad = c.gap_rows > 0 ? c.gap_rows : (c.layout == Layout::kPadded ? 16 : 0);
  p.lse_stride = std::max<int64_t>(tq, 1) + lse_pad;
  p.lse_elems = int64_t(c.hq) * p.lse_stride + kGuard;
  p.cu_q.assign(size_t(c.n()) + 1, 0);
  p.cu_k.assign(size_t(c.n()) + 1, 0);
  for (int b = 0; b < c.n(); ++b) {
    p.cu_q[b + 1] = p.cu_q[b] + c.len_q[b];
    p.cu_k[b + 1] = p.cu_k[b] + c.len_k[b];
  }
  // Each array 16-byte aligned.
  const int64_t n1 = round_up(c.n() + 1, 4), n0 = round_up(std::max(c.n(), 1), 4);
  p.m_cu_q = 0;
  p.m_cu_k = n1;
  p.m_used_q = 2 * n1;
  p.m_used_k = 2 * n1 + n0;
  p.meta_ints = 2 * n1 + 2 * n0;
  p.meta.assign(size_t(p.meta_ints), 0);
  std::copy(p.cu_q.begin(), p.cu_q.end(), p.meta.begin() + p.m_cu_q);
  std::copy(p.cu_k.begin(), p.cu_k.end(), p.meta.begin() + p.m_cu_k);
  std::copy(c.used_q.begin(), c.used_q.end(), p.meta.begin() + p.m_used_q);
  std::copy(c.used_k.begin(), c.used_k.end(), p.meta.begin() + p.m_used_k);
  return p;
}

// ---------------------------------------------------------------------------
// Arguments.
// ---------------------------------------------------------------------------
inline TensorView view3(void* base, DType dt, const View& v) {
  return TensorView::make3d(elem16(base, v.offset), dt, v.s, v.h, v.d, v.sr, v.sh, 1);
}

// (hq, total_q) fp32, rows `row_stride` apart: lse, or the backward's dlse.
inline TensorView lse_view(float* data, const VCase& c, int64_t row_stride) {
  TensorView t;
  t.data = data;
  t.dtype = DType::kFloat32;
  t.ndim = 2;
  t.shape[0] = c.hq;
  t.shape[1] = c.total_q();
  t.stride[0] = row_stride;
  t.stride[1] = 1;
  return t;
}

// The options of the forward and the backward; `meta` is the device copy of p.meta.
inline void set_varlen_opts(const VCase& c, const VPlan& p, void* meta, flash3::AttentionOptions* o) {
  const int* m = static_cast<const int*>(meta);
  set_mask_and_scale(c, o);
  o->pack_gqa = c.pack_gqa;
  o->cu_seqlens_q = m + p.m_cu_q;
  o->cu_seqlens_k = m + p.m_cu_k;
  o->seqused_q = c.used_q.empty() ? nullptr : m + p.m_used_q;
  o->seqused_k = c.used_k.empty() ? nullptr : m + p.m_used_k;
  o->max_seqlen_q = c.max_q();
  o->max_seqlen_k = c.max_k();
  o->num_sequences = c.n();
}

inline flash3::ForwardArgs make_args(const VCase& c, const VPlan& p, void* in, void* out, float* lse, void* meta) {
  flash3::ForwardArgs a;
  a.q = view3(in, c.dtype, p.q);
  a.k = view3(in, c.dtype, p.k);
  a.v = view3(in, c.dtype, p.v);
  a.out = view3(out, c.dtype, p.o);
  if (c.store_lse) a.lse = lse_view(lse, c, p.lse_stride);
  set_varlen_opts(c, p, meta, &a.opts);
  return a;
}

// ---------------------------------------------------------------------------
// Runs.
// ---------------------------------------------------------------------------
// The buffers of a varlen forward run: fwd_case.h's, and the metadata.
struct VarlenDevice : FwdDevice {
  tu::DeviceBuffer meta;
};

struct VBuffers {
  VPlan plan;
  std::vector<uint16_t> host_in;  // what the device input buffer holds (the reference reads this)
};

// Copies b.host_in and the metadata to the device (synchronously).
inline ::testing::AssertionResult upload_varlen_host(VarlenDevice& d, const VBuffers& b) {
  cudaError_t e = cudaMemcpyAsync(d.in.ptr, b.host_in.data(), b.host_in.size() * 2, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d.meta.ptr, b.plan.meta.data(), b.plan.meta.size() * 4, cudaMemcpyHostToDevice, d.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "upload: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Plans, reserves in / out / lse / meta, fills q / k / v with fresh random
// normals (seeded by the case), uploads.
inline ::testing::AssertionResult upload_varlen_inputs(VarlenDevice& d, const VCase& c, VBuffers* b) {
  b->plan = make_vplan(c);
  const VPlan& p = b->plan;
  b->host_in.assign(size_t(p.in_elems), 0);
  tu::fill_normal(b->host_in.data(), b->host_in.size(), c.dtype, c.seed);
  const ::testing::AssertionResult r =
      reserve_all({{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2},
                   {&d.lse, size_t(p.lse_elems) * 4}, {&d.meta, size_t(p.meta_ints) * 4}});
  if (!r) return r;
  return upload_varlen_host(d, *b);
}

inline void poison_outputs(const VPlan& p, void* out, float* lse, cudaStream_t s) {
  cudaMemsetAsync(out, 0xff, size_t(p.out_elems) * 2, s);
  cudaMemsetAsync(lse, 0xff, size_t(p.lse_elems) * 4, s);
}

// Poisons out / lse (+ gaps and guards), runs flash3::forward on them (through
// `call` if given: ForwardCall, fwd_case.h). Returns the status.
inline flash3::Status run_varlen(VarlenDevice& d, const VCase& c, const VPlan& p, void* out, float* lse,
                                 const ForwardCall& call = {}) {
  poison_outputs(p, out, lse, d.stream);
  const flash3::ForwardArgs args = make_args(c, p, d.in.ptr, out, lse, d.meta.ptr);
  if (!call) return flash3::forward(args, d.stream);
  cudaStreamSynchronize(d.stream);
  return call(args);
}

// ---------------------------------------------------------------------------
// Reading a result.
// ---------------------------------------------------------------------------
struct Downloaded {
  std::vector<uint16_t> out;
  std::vector<uint32_t> lse;  // bits
};

// Waits for d.stream, copies the whole out and lse allocations.
inline ::testing::AssertionResult download(VarlenDevice& d, const VPlan& p, const void* out, const float* lse,
                                           Downloaded* h) {
  h->out.assign(size_t(p.out_elems), 0);
  h->lse.assign(size_t(p.lse_elems), 0);
  cudaError_t e = cudaStreamSynchronize(d.stream);
  if (e == cudaSuccess) e = cudaMemcpy(h->out.data(), out, h->out.size() * 2, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(h->lse.data(), lse, h->lse.size() * 4, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "download: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Sequence s's used rows of flash3's result, dense: o (sq, hq, dv), lse (hq, sq).
inline std::vector<double> ours_o(const VCase& c, const VPlan& p, const Downloaded& h, int s) {
  const int sq = c.eff_q(s);
  std::vector<double> o(size_t(sq) * c.hq * c.dv);
  for (int i = 0; i < sq; ++i)
    for (int hh = 0; hh < c.hq; ++hh) {
      const uint16_t* src = h.out.data() + p.o.at(0, p.cu_q[s] + i, hh, 0);
      double* dst = o.data() + (size_t(i) * c.hq + hh) * c.dv;
      for (int x = 0; x < c.dv; ++x) dst[x] = tu::half_bits_to_float(c.dtype, src[x]);
    }
  return o;
}
inline std::vector<double> ours_lse(const VCase& c, const VPlan& p, const Downloaded& h, int s) {
  const int sq = c.eff_q(s);
  std::vector<double> l(size_t(sq) * c.hq);
  for (int hh = 0; hh < c.hq; ++hh)
    for (int i = 0; i < sq; ++i)
      l[size_t(hh) * sq + i] = tu::bits_f32(h.lse[size_t(hh * p.lse_stride + p.cu_q[s] + i)]);
  return l;
}

// Dense index i of sequence s's o (sq, hq, dv) / lse (hq, sq) as coordinates.
inline std::string where_seq_o(const VCase& c, int s, size_t i) {
  std::ostringstream os;
  os << "(seq=" << s << ", row=" << int64_t(i) / (int64_t(c.dv) * c.hq) << ", h=" << (int64_t(i) / c.dv) % c.hq
     << ", c=" << int64_t(i) % c.dv << ")";
  return os.str();
}
inline std::string where_seq_lse(int s, int sq, size_t i) {
  std::ostringstream os;
  os << "(seq=" << s << ", h=" << int64_t(i) / sq << ", row=" << int64_t(i) % sq << ")";
  return os.str();
}

// ---------------------------------------------------------------------------
// Checks of one downloaded result.
// ---------------------------------------------------------------------------
// Sequence s as its own fixed-length problem (batch 1, eff_q x eff_k, its
// bottom-right mask) on the fp32 GPU reference, reading its used rows of d.in
// in place (offsets computed here, not by the kernels).
inline ::testing::AssertionResult sequence_reference(VarlenDevice& d, const VCase& c, const VPlan& p, int s,
                                                     RefOutputs* r) {
  const int sq = c.eff_q(s), sk = c.eff_k(s);
  if (sk == 0) {  // no key: out = 0, lse = -inf
    r->o.assign(size_t(sq) * c.hq * c.dv, 0.0);
    r->low_o = r->o;
    r->lse.assign(size_t(sq) * c.hq, -std::numeric_limits<double>::infinity());
    r->low_lse = r->lse;
    return ::testing::AssertionSuccess();
  }
  auto rows = [&](const View& v, int64_t row0, int64_t n) {
    flash3::gpuref::Strided16 t;
    t.data = d.in.as<const uint16_t>() + v.at(0, row0, 0, 0);
    t.batch_stride = std::max<int64_t>(n, 1) * v.sr;
    t.row_stride = v.sr;
    t.head_stride = v.sh;
    return t;
  };
  flash3::gpuref::Args ra;
  ra.dtype = c.dtype;
  ra.batch = 1, ra.seqlen_q = sq, ra.seqlen_k = sk, ra.heads_q = c.hq, ra.heads_kv = c.hkv;
  ra.head_dim = c.d, ra.head_dim_v = c.dv;
  ra.q = rows(p.q, p.cu_q[s], sq);
  ra.k = rows(p.k, p.cu_k[s], sk);
  ra.v = rows(p.v, p.cu_k[s], sk);
  set_mask_and_scale(c, &ra);
  return run_gpu_reference(ra, d, r);
}

// The poison outside the used rows still there: rows beyond seqused_q,
// padding, the rows after the tensor (out) and after each head's rows (lse),
// the guards.
inline void expect_only_used_rows_written(const VCase& c, const VPlan& p, const Downloaded& h) {
  const int64_t tq = c.total_q();
  std::vector<uint8_t> used_out(h.out.size(), 0), used_lse(h.lse.size(), 0);
  for (int s = 0; s < c.n(); ++s)
    for (int64_t i = 0; i < c.eff_q(s); ++i)
      for (int hh = 0; hh < c.hq; ++hh) {
        std::memset(&used_out[size_t(p.o.at(0, p.cu_q[s] + i, hh, 0))], 1, size_t(c.dv));
        used_lse[size_t(hh * p.lse_stride + p.cu_q[s] + i)] = 1;
      }
  int64_t stray_o = 0, stray_lse = 0, first_stray_row = -1;
  for (size_t i = 0; i < h.out.size(); ++i)
    if (!used_out[i] && h.out[i] != kPoison16) {
      if (stray_o++ == 0 && int64_t(i) >= p.o.offset) first_stray_row = (int64_t(i) - p.o.offset) / p.o.sr;
    }
  for (size_t i = 0; i < h.lse.size(); ++i) stray_lse += !used_lse[i] && h.lse[i] != kPoison32;
  EXPECT_EQ(stray_o, 0) << c.describe() << ": flash3 wrote " << stray_o
                        << " out elements outside the used rows (first in row " << first_stray_row << " of " << tq
                        << "; rows beyond seqused_q, padding or the rows after the tensor)";
  EXPECT_EQ(stray_lse, 0) << c.describe() << ": flash3 wrote " << stray_lse
                          << " lse values outside the used rows (beyond seqused_q or past total_q)";
}

// "sequence s (rows cu_q+sq, keys cu_k+sk)", for failure messages.
inline std::string sequence_desc(const VCase& c, const VPlan& p, int s) {
  std::ostringstream seq;
  seq << "sequence " << s << " (rows " << p.cu_q[s] << "+" << c.eff_q(s) << ", keys " << p.cu_k[s] << "+"
      << c.eff_k(s) << ")";
  return seq.str();
}

// Sequence s's o (sq, hq, dv) and lse (hq, sq) against its reference.
inline void expect_sequence_close(const VCase& c, int s, const std::string& seq, const std::vector<double>& o,
                                  const std::vector<double>& l, const RefOutputs& ref) {
  const int sq = c.eff_q(s);
  const Verdict vo =
      judge("O", o, ref.o, ref.low_o, kEpsO, [&](size_t i) { return where_seq_o(c, s, i); }, tol_factor(c));
  EXPECT_TRUE(vo.ok) << c.describe() << "\n  " << seq << "\n  " << vo.text;
  const Verdict vl =
      judge("LSE", l, ref.lse, ref.low_lse, kEpsLse, [&](size_t i) { return where_seq_lse(s, sq, i); }, tol_factor(c));
  EXPECT_TRUE(vl.ok) << c.describe() << "\n  " << seq << "\n  " << vl.text;
}

// ---------------------------------------------------------------------------
// Batches: random lengths and seqused, reproducible from the case's seed.
// ---------------------------------------------------------------------------
struct Rng {
  uint64_t s;
  uint64_t next() { return s = tu::splitmix64(s); }
  int uniform(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]
};

struct LenPair {
  int q, k;
};

// n sequences: the forced (q, k) pairs, then pairs of draw_len(g) (an int of an
// Rng&), in a random order; g is seeded by the case. Returns g, for the case's
// further draws.
template <class DrawLen>
Rng fill_lengths(VCase* c, int n, const std::vector<LenPair>& forced, DrawLen&& draw_len) {
  Rng g{c->seed ^ 0x1e11};
  std::vector<LenPair> all(forced.begin(), forced.begin() + std::min<size_t>(forced.size(), size_t(n)));
  while (int(all.size()) < n) {
    const int q = draw_len(g), k = draw_len(g);
    all.push_back({q, k});
  }
  for (int i = n - 1; i > 0; --i) std::swap(all[size_t(i)], all[g.next() % uint64_t(i + 1)]);
  c->len_q.clear(), c->len_k.clear();
  for (const LenPair& p : all) c->len_q.push_back(p.q), c->len_k.push_back(p.k);
  return g;
}

// seqused values exercising every clamp: half, all, none, more than allocated
// (clamped to the length), negative (clamped to 0), random.
inline std::vector<int> draw_used(const std::vector<int>& len, int shift, uint64_t seed) {
  Rng g{seed};
  std::vector<int> u(len.size());
  for (size_t b = 0; b < len.size(); ++b) {
    switch ((b + size_t(shift)) % 6) {
      case 0: u[b] = len[b] / 2; break;
      case 1: u[b] = len[b]; break;
      case 2: u[b] = 0; break;
      case 3: u[b] = len[b] + 7; break;
      case 4: u[b] = -3; break;
      default: u[b] = g.uniform(0, std::max(len[b], 0)); break;
    }
  }
  return u;
}

// Uniform in [0, max_len], with 0 and 1 a tenth of the time each.
inline int draw_len_with_ends(Rng& g, int max_len) {
  const int r = int(g.next() % 10);
  if (r == 0) return 0;
  if (r == 1) return 1;
  return g.uniform(0, max_len);
}

// The varlen case of the tests for stores outside the problem: GQA 16:2
// packed, causal, kGapRows rows of poison after the tensor, five sequences
// with keys len_k, every one shortened by seqused_q (the last ending the
// tensor mid-tile); named prefix + dtype + head dims (the seed).
inline VCase stores_vcase(const char* prefix, DType dt, HeadDims h, std::vector<int> len_k, Layout layout) {
  VCase v;
  v.dtype = dt, v.d = h.d, v.dv = h.dv, v.hq = 16, v.hkv = 2;
  v.pack_gqa = 1;
  v.gap_rows = kGapRows;
  v.layout = layout;
  v.len_q = {17, 3, 100, 1, 41};
  v.len_k = std::move(len_k);
  v.used_q = {10, 3, 51, 0, 33};
  v.causal = true;
  v.name = std::string(prefix) + tu::short_dtype(dt) + "_" + head_dims_name(h);
  v.seed = fnv1a(v.name);
  return v;
}

// The mask of a batch spec; the windows are drawn from the batch's lengths.
enum class VMask { kNone, kCausal, kLocal, kCausalLocal, kLeftOnly };

// One batch of a suite's varlen cases.
struct VSpec {
  const char* tag;
  int n;  // sequences
  Heads heads;
  VMask mask;
  bool seqused_q, seqused_k;
  Layout layout;
  std::vector<LenPair> forced;  // placed first, then random lengths, then shuffled
  int pack = 1, max_pad = 0;
};

// The case of spec sp in (dt, h), named prefix + dtype + head dims + tag (the
// seed): lengths from fill_lengths with `draw_len`, seqused where asked, the
// mask's window drawn after the lengths, kGapRows rows of poison after the
// tensor.
template <class DrawLen>
VCase spec_vcase(const VSpec& sp, const char* prefix, DType dt, HeadDims h, DrawLen&& draw_len) {
  VCase c;
  c.dtype = dt, c.d = h.d, c.dv = h.dv, c.hq = sp.heads.hq, c.hkv = sp.heads.hkv;
  c.layout = sp.layout;
  c.pack_gqa = sp.pack;
  c.max_pad = sp.max_pad;
  c.gap_rows = kGapRows;
  c.name = std::string(prefix) + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + sp.tag;
  c.seed = fnv1a(c.name);
  Rng g = fill_lengths(&c, sp.n, sp.forced, draw_len);
  if (sp.seqused_q) c.used_q = draw_used(c.len_q, 0, c.seed ^ 0x05ed);
  if (sp.seqused_k) c.used_k = draw_used(c.len_k, 3, c.seed ^ 0x5eed);
  const int max_k = c.max_k();
  switch (sp.mask) {
    case VMask::kNone: break;
    case VMask::kCausal: c.causal = true; break;
    case VMask::kLocal: c.wl = g.uniform(0, max_k - 1), c.wr = g.uniform(0, max_k - 1); break;
    case VMask::kCausalLocal: c.causal = true, c.wl = g.uniform(0, max_k - 1); break;
    case VMask::kLeftOnly: c.wl = g.uniform(0, max_k - 1); break;
  }
  return c;
}

}  // namespace flash3::gputest
