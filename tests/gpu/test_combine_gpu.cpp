// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU correctness tests of the split-KV combine (flash3::combine and, for
// varlen row maps, launch_combine in src/combine/combine.h) against a float64
// CPU reference written here independently of the kernel:
//   lse = m + log(sum_{s: lse_s > -inf} exp(lse_s - m)),  m = max_s lse_s,
//   out = sum_{s: lse_s > -inf} exp(lse_s - lse) * out_s,
// out = 0 and lse = -inf for a row whose splits are all -inf.
//
// Inputs: random fp32 partials; per row one of five LSE patterns (all finite,
// some splits at -inf, all at -inf, a single finite split, magnitudes near
// +-80 that overflow exp() without the max shift). The partial output of a
// split at -inf is NaN: the kernel must not read it. Layouts: contiguous, and
// strided (padded heads / rows / splits, lse_partial stored (splits, b, h, s),
// lse as FlashAttention-3's (b, s, h) view of (b, h, s), out with a head
// stride that defeats the vector store). out and lse are poisoned (NaN)
// before every call: everything outside the views must keep the poison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "api/validate.h"
#include "combine/combine.h"
#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "plan/lower.h"

namespace {

using flash3::CombineArgs;
using flash3::DType;
using flash3::Status;
using flash3::TensorView;
namespace tu = flash3::testutil;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Case {
  int splits = 2, b = 2, s = 3, h = 5, d = 64;
  DType out_dt = DType::kBFloat16;
  bool strided = false;
  bool with_lse = true;
  uint64_t seed = 1;
  std::string name() const {
    return "splits" + std::to_string(splits) + "_b" + std::to_string(b) + "_s" + std::to_string(s) + "_h" +
           std::to_string(h) + "_d" + std::to_string(d) + "_" + tu::short_dtype(out_dt) +
           (strided ? "_strided" : "_contiguous") + (with_lse ? "" : "_nolse");
  }
};

// A strided view over a host buffer of `span` elements (indices in elements).
struct Layout {
  int ndim = 0;
  int64_t shape[5] = {}, stride[5] = {};
  int64_t span = 0;  // elements the buffer needs
  int64_t offset(const int64_t* idx) const {
    int64_t o = 0;
    for (int i = 0; i < ndim; ++i) o += idx[i] * stride[i];
    return o;
  }
};

// Row-major over `order` (outermost first), each dim padded by pad[dim] elements.
Layout make_layout(std::vector<int64_t> shape, std::vector<int> order, std::vector<int64_t> pad) {
  Layout l;
  l.ndim = int(shape.size());
  int64_t running = 1;
  for (int k = l.ndim - 1; k >= 0; --k) {
    const int dim = order[k];
    l.shape[dim] = shape[dim];
    l.stride[dim] = running;
    running *= shape[dim] + pad[dim];
  }
  l.span = running;
  return l;
}

TensorView view_of(void* p, DType dt, const Layout& l) {
  TensorView t;
  t.data = p;
  t.dtype = dt;
  t.ndim = l.ndim;
  for (int i = 0; i < l.ndim; ++i) t.shape[i] = l.shape[i], t.stride[i] = l.stride[i];
  return t;
}

struct Layouts {
  Layout op, lp, out, lse;
};

Layouts layouts_for(const Case& c) {
  Layouts L;
  const int64_t S = c.splits, B = c.b, Q = c.s, H = c.h, D = c.d;
  if (!c.strided) {
    L.op = make_layout({S, B, Q, H, D}, {0, 1, 2, 3, 4}, {0, 0, 0, 0, 0});
    L.lp = make_layout({S, B, Q, H}, {0, 1, 2, 3}, {0, 0, 0, 0});
    L.out = make_layout({B, Q, H, D}, {0, 1, 2, 3}, {0, 0, 0, 0});
    L.lse = make_layout({B, Q, H}, {0, 1, 2}, {0, 0, 0});
  } else {
    // Paddings keep out_partial's strides multiples of 4 (the float4 reads);
    // out's head padding of 2 makes 4-element groups start at odd multiples of
    // 2 elements: the kernel's scalar-store path.
    L.op = make_layout({S, B, Q, H, D}, {0, 1, 2, 3, 4}, {1, 0, 1, 0, 4});
    L.lp = make_layout({S, B, Q, H}, {0, 1, 3, 2}, {0, 1, 3, 0});  // (splits, b, h, s) storage
    L.out = make_layout({B, Q, H, D}, {0, 1, 2, 3}, {0, 1, 0, 2});
    L.lse = make_layout({B, Q, H}, {0, 2, 1}, {0, 0, 0});  // (b, h, s) storage
  }
  return L;
}

// Host inputs and the float64 reference.
struct Problem {
  Case c;
  Layouts L;
  std::vector<float> op, lp;       // over L.op.span / L.lp.span (padding: 0)
  std::vector<double> ref_out;     // (b, s, h, d) dense
  std::vector<double> ref_lse;     // (b, s, h) dense
};

Problem make_problem(const Case& c) {
  Problem p;
  p.c = c;
  p.L = layouts_for(c);
  p.op.assign(p.L.op.span, 0.f);
  p.lp.assign(p.L.lp.span, 0.f);
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uni(-6.f, 6.f);
  const int64_t rows = int64_t(c.b) * c.s * c.h;
  p.ref_out.assign(rows * c.d, 0.0);
  p.ref_lse.assign(rows, 0.0);
  std::vector<float> lse_s(c.splits);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t hh = row % c.h, ss = (row / c.h) % c.s, bb = row / c.h / c.s;
    const int pattern = int(row % 5);
    const int only = int(rng() % c.splits);
    for (int sp = 0; sp < c.splits; ++sp) {
      float v = uni(rng);
      if (pattern == 1 && rng() % 2 == 0) v = kNegInf;
      if (pattern == 2) v = kNegInf;
      if (pattern == 3 && sp != only) v = kNegInf;
      if (pattern == 4) v = (sp % 2 ? 80.f : -80.f) + uni(rng);
      lse_s[sp] = v;
      const int64_t li[4] = {sp, bb, ss, hh};
      p.lp[p.L.lp.offset(li)] = v;
      for (int k = 0; k < c.d; ++k) {
        const int64_t oi[5] = {sp, bb, ss, hh, k};
        // A split at -inf is never read: NaN there must not reach out.
        p.op[p.L.op.offset(oi)] = v == kNegInf ? std::numeric_limits<float>::quiet_NaN() : normal(rng);
      }
    }
    double m = -std::numeric_limits<double>::infinity();
    for (float v : lse_s) m = std::max(m, double(v));
    if (m == -std::numeric_limits<double>::infinity()) {
      p.ref_lse[row] = m;  // out stays 0
      continue;
    }
    double sum = 0.0;
    for (float v : lse_s)
      if (v != kNegInf) sum += std::exp(double(v) - m);
    const double lse = m + std::log(sum);
    p.ref_lse[row] = lse;
    for (int sp = 0; sp < c.splits; ++sp) {
      if (lse_s[sp] == kNegInf) continue;
      const double w = std::exp(double(lse_s[sp]) - lse);
      for (int k = 0; k < c.d; ++k) {
        const int64_t oi[5] = {sp, bb, ss, hh, k};
        p.ref_out[row * c.d + k] += w * double(p.op[p.L.op.offset(oi)]);
      }
    }
  }
  return p;
}

double decode(DType dt, const std::vector<uint8_t>& buf, int64_t i) {
  if (dt == DType::kFloat32) {
    float f;
    std::memcpy(&f, buf.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return tu::half_bits_to_float(dt, h);
}

// Relative tolerance of the output dtype's rounding (plus fp32 accumulation).
double out_rtol(DType dt) {
  switch (dt) {
    case DType::kBFloat16: return 1.0 / 128;
    case DType::kFloat16: return 1.0 / 1024;
    default: return 1e-4;
  }
}

// Device buffers of a problem: inputs uploaded, outputs poisoned (0xff: NaN).
struct Buffers {
  tu::DeviceBuffer op, lp, out, lse;
  size_t out_bytes = 0, lse_bytes = 0;
};

void upload(const Problem& p, Buffers* b) {
  const int es = flash3::dtype_size(p.c.out_dt);
  b->out_bytes = size_t(p.L.out.span) * es;
  b->lse_bytes = size_t(p.L.lse.span) * 4;
  FLASH3_CUDA_OK(b->op.reserve(p.op.size() * 4));
  FLASH3_CUDA_OK(b->lp.reserve(p.lp.size() * 4));
  FLASH3_CUDA_OK(b->out.reserve(b->out_bytes));
  FLASH3_CUDA_OK(b->lse.reserve(b->lse_bytes));
  FLASH3_CUDA_OK(cudaMemcpy(b->op.ptr, p.op.data(), p.op.size() * 4, cudaMemcpyHostToDevice));
  FLASH3_CUDA_OK(cudaMemcpy(b->lp.ptr, p.lp.data(), p.lp.size() * 4, cudaMemcpyHostToDevice));
  FLASH3_CUDA_OK(cudaMemset(b->out.ptr, 0xff, b->out_bytes));
  FLASH3_CUDA_OK(cudaMemset(b->lse.ptr, 0xff, b->lse_bytes));
}

CombineArgs args_of(const Problem& p, const Buffers& b) {
  CombineArgs a;
  a.out_partial = view_of(b.op.ptr, DType::kFloat32, p.L.op);
  a.lse_partial = view_of(b.lp.ptr, DType::kFloat32, p.L.lp);
  a.out = view_of(b.out.ptr, p.c.out_dt, p.L.out);
  if (p.c.with_lse) a.lse = view_of(b.lse.ptr, DType::kFloat32, p.L.lse);
  return a;
}

bool is_poison(DType dt, const std::vector<uint8_t>& buf, int64_t i) {
  const int es = flash3::dtype_size(dt);
  for (int k = 0; k < es; ++k)
    if (buf[size_t(i) * es + k] != 0xff) return false;
  return true;
}

// Compares the outputs with the reference; rows with row_used[row] false (or
// everything outside the views) must hold the poison.
void check_outputs(const Problem& p, const Buffers& b, const std::vector<bool>& row_used) {
  const Case& c = p.c;
  std::vector<uint8_t> out(b.out_bytes), lse(b.lse_bytes);
  FLASH3_CUDA_OK(cudaMemcpy(out.data(), b.out.ptr, b.out_bytes, cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(lse.data(), b.lse.ptr, b.lse_bytes, cudaMemcpyDeviceToHost));
  std::vector<bool> out_in_view(p.L.out.span, false), lse_in_view(p.L.lse.span, false);
  const double rtol = out_rtol(c.out_dt), atol = 1e-5;
  int64_t bad = 0;
  std::string first;
  auto fail = [&](const std::string& what) {
    if (bad++ == 0) first = what;
  };
  const int64_t rows = int64_t(c.b) * c.s * c.h;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t hh = row % c.h, ss = (row / c.h) % c.s, bb = row / c.h / c.s;
    const int64_t li[3] = {bb, ss, hh};
    const int64_t lo = p.L.lse.offset(li);
    lse_in_view[lo] = true;
    const std::string where = "row (b " + std::to_string(bb) + ", s " + std::to_string(ss) + ", h " +
                              std::to_string(hh) + ")";
    if (c.with_lse) {
      if (!row_used[row]) {
        if (!is_poison(DType::kFloat32, lse, lo)) fail("lse of unused " + where + " was written");
      } else {
        const double got = decode(DType::kFloat32, lse, lo), want = p.ref_lse[row];
        const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0) : std::fabs(got - want) <= 1e-4 * (1 + std::fabs(want));
        if (!ok) fail("lse at " + where + ": got " + std::to_string(got) + ", want " + std::to_string(want));
      }
    }
    for (int k = 0; k < c.d; ++k) {
      const int64_t oi[4] = {bb, ss, hh, k};
      const int64_t o = p.L.out.offset(oi);
      out_in_view[o] = true;
      if (!row_used[row]) {
        if (!is_poison(c.out_dt, out, o)) fail("out of unused " + where + " was written");
        continue;
      }
      const double got = decode(c.out_dt, out, o), want = p.ref_out[row * c.d + k];
      if (!(std::fabs(got - want) <= atol + rtol * std::fabs(want)))  // NaN fails
        fail("out at " + where + ", dim " + std::to_string(k) + ": got " + std::to_string(got) + ", want " +
             std::to_string(want));
    }
  }
  for (int64_t i = 0; i < p.L.out.span; ++i)
    if (!out_in_view[i] && !is_poison(c.out_dt, out, i)) fail("out element " + std::to_string(i) + " outside the view was written");
  for (int64_t i = 0; i < p.L.lse.span; ++i)
    if ((!lse_in_view[i] || !c.with_lse) && !is_poison(DType::kFloat32, lse, i))
      fail("lse element " + std::to_string(i) + " outside the view (or not requested) was written");
  EXPECT_EQ(bad, 0) << c.name() << ": " << bad << " mismatches, first: " << first;
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const Problem p = make_problem(c);
  Buffers b;
  upload(p, &b);
  if (::testing::Test::HasFatalFailure()) return;
  const Status s = flash3::combine(args_of(p, b), nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  check_outputs(p, b, std::vector<bool>(size_t(c.b) * c.s * c.h, true));
}

TEST(CombineGpu, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  uint64_t seed = 1;
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32})
    for (int splits : {1, 2, 7, 256})
      for (int d : {64, 128, 256, 36})
        for (bool strided : {false, true}) {
          Case c;
          c.out_dt = dt;
          c.splits = splits;
          c.d = d;
          c.strided = strided;
          c.seed = seed++;
          if (splits == 256) c.h = 2;  // keep the reference quick
          run_case(c);
          if (HasFatalFailure()) return;
        }
}

TEST(CombineGpu, WithoutLseAndOddShapes) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Case c;
  c.with_lse = false;
  run_case(c);
  // d = 4 (one float4 per row, most lanes idle); many rows (grid-stride loop
  // not needed but several blocks); h = 1; d = 252 (lanes wrap unevenly).
  for (auto [b, s, h, d, splits] : {std::tuple{1, 1, 1, 4, 3}, std::tuple{3, 257, 3, 128, 5},
                                    std::tuple{1, 9, 1, 252, 33}, std::tuple{2, 1, 7, 8, 1}}) {
    Case o;
    o.b = b;
    o.s = s;
    o.h = h;
    o.d = d;
    o.splits = splits;
    o.strided = (s % 2) == 1;
    o.seed = 100 + s;
    run_case(o);
  }
}

// Varlen row maps (launch_combine's seqs): batch 1, the rows of the packed
// sequences; rows outside every sequence or past its seqlen_q stay untouched.
TEST(CombineGpu, VarlenRowsLeftUntouched) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
    Case c;
    c.b = 1;
    c.s = 40;
    c.h = 3;
    c.d = 128;
    c.splits = 5;
    c.out_dt = dt;
    c.strided = dt == DType::kFloat32;
    SCOPED_TRACE(c.name());
    const Problem p = make_problem(c);
    Buffers b;
    upload(p, &b);
    if (HasFatalFailure()) return;
    // SeqlenInfo (common/seqlen.h) is four ints: offset_q, seqlen_q, offset_k,
    // seqlen_k. Sequences: rows [2, 7) with 3 used, an empty one at 7, [7, 20)
    // fully used, another empty one at 20, [20, 33) with 13 used; rows 0-1 and
    // 33-39 belong to none (row 7 starts both the empty sequence and the next).
    const std::vector<int> seqs = {2, 3, 0, 0,  7, 0, 0, 0,  7, 13, 0, 0,  20, 0, 0, 0,  20, 13, 0, 0};
    const int num_seqs = int(seqs.size() / 4);
    tu::DeviceBuffer dseqs;
    FLASH3_CUDA_OK(dseqs.reserve(seqs.size() * sizeof(int)));
    FLASH3_CUDA_OK(cudaMemcpy(dseqs.ptr, seqs.data(), seqs.size() * sizeof(int), cudaMemcpyHostToDevice));
    const CombineArgs a = args_of(p, b);
    ASSERT_TRUE(flash3::validate_combine(a).ok());
    flash3::CombineParams params = flash3::make_combine_params(a);
    params.seqs = static_cast<const flash3::SeqlenInfo*>(dseqs.ptr);
    params.num_seqs = num_seqs;
    const Status s = flash3::launch_combine(params, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
    FLASH3_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bool> used(size_t(c.s) * c.h, false);
    for (int r = 0; r < c.s; ++r) {
      const bool u = (r >= 2 && r < 5) || (r >= 7 && r < 20) || (r >= 20 && r < 33);
      for (int hh = 0; hh < c.h; ++hh) used[size_t(r) * c.h + hh] = u;
    }
    check_outputs(p, b, used);
  }
}

// Bad inputs are rejected before anything is launched, naming the argument;
// the outputs keep their poison.
TEST(CombineGpu, ErrorsLeaveOutputsUntouched) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Case c;
  const Problem p = make_problem(c);
  Buffers b;
  upload(p, &b);
  if (HasFatalFailure()) return;
  auto expect_untouched = [&](const char* what) {
    std::vector<uint8_t> out(b.out_bytes), lse(b.lse_bytes);
    FLASH3_CUDA_OK(cudaDeviceSynchronize());
    FLASH3_CUDA_OK(cudaMemcpy(out.data(), b.out.ptr, b.out_bytes, cudaMemcpyDeviceToHost));
    FLASH3_CUDA_OK(cudaMemcpy(lse.data(), b.lse.ptr, b.lse_bytes, cudaMemcpyDeviceToHost));
    for (uint8_t x : out) ASSERT_EQ(x, 0xff) << what << ": out was written";
    for (uint8_t x : lse) ASSERT_EQ(x, 0xff) << what << ": lse was written";
  };
  struct Bad {
    const char* what;
    std::function<void(CombineArgs*)> edit;
    const char* sub;
  };
  alignas(16) static float host_out[2 * 3 * 5 * 64];
  const Bad bad[] = {
      {"lse_partial splits", [](CombineArgs* a) { a->lse_partial.shape[0] = 1; }, "lse_partial.shape[0] (num_splits)"},
      {"out dtype", [](CombineArgs* a) { a->out.dtype = DType::kFloat8E4M3; }, "out.dtype is fp8_e4m3"},
      {"head dim", [](CombineArgs* a) { a->out_partial.shape[4] = a->out.shape[3] = 62; }, "out_partial.shape[4] (head_dim) is 62"},
      {"misaligned", [](CombineArgs* a) { a->out_partial.data = static_cast<char*>(a->out_partial.data) + 4; }, "not 16-byte aligned"},
      {"alias", [](CombineArgs* a) { a->lse.data = a->lse_partial.data; }, "lse (data"},
      {"host out", [](CombineArgs* a) { a->out.data = host_out; }, "out.data is a host pointer"},
  };
  for (const Bad& x : bad) {
    CombineArgs a = args_of(p, b);
    x.edit(&a);
    const Status s = flash3::combine(a, nullptr);
    EXPECT_FALSE(s.ok()) << x.what;
    EXPECT_NE(s.message.find(x.sub), std::string::npos) << x.what << ": " << s.message;
    expect_untouched(x.what);
  }
  // And the valid call then works.
  ASSERT_TRUE(flash3::combine(args_of(p, b), nullptr).ok());
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  check_outputs(p, b, std::vector<bool>(size_t(c.b) * c.s * c.h, true));
}

}  // namespace
