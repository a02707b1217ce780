// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The FP8 (e4m3) forward against the CPU references, under the FP8 tolerance
// rule (docs/design.md, "FP8 reference"):
//     max|ours - ref| <= 2 * max|plain_fp8 - ref| + eps,  no NaN,
// for O and the LSE, where ref is the float64 attention of the de-quantized
// inputs (q8 * q_descale, ...) and plain_fp8 the straightforward FP8
// implementation (ref::forward_fp8_plain: S from e4m3 products in fp32, P
// rounded to e4m3 after the 2^8 max offset, O accumulated in fp32), its O
// rounded to bf16 as ours is (the LSE's eps also covers the tensor cores'
// FP8 accumulation, see below). Inputs: N(0, 1) quantized with one descale per
// (batch, KV head), or with block scales (one per 128 tokens of each head;
// the inputs then get a random power-of-two magnitude per block: v's differ
// by up to 2^8 between blocks, exercising O's move between V blocks'
// descales; q's and k's by up to 2^3 only, because the tensor cores' FP8
// accumulation error grows with |q| |k| (see the LSE's eps below) and the
// O bound has no such term); out / lse poisoned before the call, and the
// poison after the views must survive.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "reference/fp8_ref.h"
#include "reference/reference.h"

namespace {

using flash3::DType;
using flash3::TensorView;
using namespace flash3::testutil;
namespace ref = flash3::ref;

enum class Mask { kNone, kCausal, kWindow };
enum class Scale { kHead, kBlock };  // (batch, heads_kv) or (batch, heads, ceil(seqlen / 128))

struct Fp8Case {
  int d = 128;
  int b = 2, sq = 256, sk = 256, hq = 4, hkv = 4;
  Mask mask = Mask::kNone;
  bool descales = true;    // false: no descale tensors (1), inputs quantized per tensor with descale 1
  Scale scale_q = Scale::kHead, scale_kv = Scale::kHead;
  int head_pad = 0;        // extra elements between heads of q / k / v (strided inputs; multiple of 16)
  uint64_t seed = 1;
  std::string name() const {
    std::ostringstream os;
    os << "fp8 d" << d << " b" << b << " sq" << sq << " sk" << sk << " h" << hq << ":" << hkv << " mask"
       << int(mask) << (descales ? "" : " nodescale") << (scale_q == Scale::kBlock ? " qblock" : "")
       << (scale_kv == Scale::kBlock ? " kvblock" : "") << (head_pad ? " padded" : "") << " seed" << seed;
    return os.str();
  }
};

constexpr int kGuard = 4096;  // poisoned elements after each output
constexpr double kEps = 1e-5;

// (b, s, h, d) with heads head_pad elements apart beyond d.
struct Layout4 {
  int64_t sb, sr, sh;
  int64_t elems;
};
Layout4 layout_of(int b, int s, int h, int d, int pad) {
  Layout4 l;
  l.sh = d + pad;
  l.sr = h * l.sh;
  l.sb = int64_t(s) * l.sr;
  l.elems = int64_t(b) * l.sb;
  return l;
}

void run_case(const Fp8Case& c) {
  SCOPED_TRACE(c.name());
  if (!flash3::forward_is_built(DType::kFloat8E4M3, c.d, c.d)) GTEST_SKIP() << "not built: fp8 forward d" << c.d;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto randn = [&](int s, int h) {
    std::vector<double> x(size_t(c.b) * s * h * c.d);
    for (auto& v : x) v = nd(rng);
    return x;
  };
  const int g = c.hq / c.hkv;
  std::vector<double> xq = randn(c.sq, c.hq), xk = randn(c.sk, c.hkv), xv = randn(c.sk, c.hkv);
  // Block-scaled tensors: 2^u, u uniform in [lo, hi], per (batch, head, block).
  auto vary = [&](std::vector<double>& x, int s, int h, int lo, int hi) {
    std::uniform_int_distribution<int> pow2(lo, hi);
    const int blocks = (s + flash3::kFp8ScaleBlock - 1) / flash3::kFp8ScaleBlock;
    std::vector<double> f(size_t(c.b) * h * blocks);
    for (auto& v : f) v = std::ldexp(1.0, pow2(rng));
    for (int bi = 0; bi < c.b; ++bi)
      for (int r = 0; r < s; ++r)
        for (int hi = 0; hi < h; ++hi)
          for (int e = 0; e < c.d; ++e)
            x[((size_t(bi) * s + r) * h + hi) * c.d + e] *=
                f[(size_t(bi) * h + hi) * blocks + r / flash3::kFp8ScaleBlock];
  };
  if (c.scale_q == Scale::kBlock) vary(xq, c.sq, c.hq, -2, 1);
  if (c.scale_kv == Scale::kBlock) vary(xk, c.sk, c.hkv, -2, 1), vary(xv, c.sk, c.hkv, -4, 4);
  // Per (batch, KV head) descales (q: the g query heads of a KV head share one),
  // per block of 128 tokens of each head, or none: values already in e4m3's
  // range, descale 1.
  auto quant = [&](const std::vector<double>& x, int s, int h, int hps, Scale scale) {
    if (c.descales && scale == Scale::kBlock)
      return ref::quantize_e4m3(x.data(), c.b, s, h, c.d, ref::Fp8Scaling::kPerBlock, 1, flash3::kFp8ScaleBlock);
    if (c.descales) return ref::quantize_e4m3(x.data(), c.b, s, h, c.d, ref::Fp8Scaling::kPerHead, hps);
    ref::Fp8Tensor t;
    t.batch = c.b, t.seqlen = s, t.heads = h, t.d = c.d;
    t.scaling = ref::Fp8Scaling::kPerTensor;
    t.x8.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) t.x8[i] = ref::round_e4m3(x[i]);
    t.descale = {1.0};
    return t;
  };
  const ref::Fp8Tensor q8 = quant(xq, c.sq, c.hq, g, c.scale_q), k8 = quant(xk, c.sk, c.hkv, 1, c.scale_kv),
                       v8 = quant(xv, c.sk, c.hkv, 1, c.scale_kv);

  // Device inputs.
  const Layout4 lq = layout_of(c.b, c.sq, c.hq, c.d, c.head_pad), lk = layout_of(c.b, c.sk, c.hkv, c.d, c.head_pad);
  auto bytes_of = [&](const ref::Fp8Tensor& t, const Layout4& l, int s, int h) {
    std::vector<uint8_t> out(size_t(std::max<int64_t>(l.elems, 1)), 0x7f);  // padding: NaN codes, never read
    for (int bi = 0; bi < c.b; ++bi)
      for (int r = 0; r < s; ++r)
        for (int hi = 0; hi < h; ++hi)
          for (int e = 0; e < c.d; ++e)
            out[size_t(bi * l.sb + r * l.sr + hi * l.sh + e)] =
                ref::e4m3_bits(t.x8[((size_t(bi) * s + r) * h + hi) * c.d + e]);
    return out;
  };
  const std::vector<uint8_t> hq8 = bytes_of(q8, lq, c.sq, c.hq), hk8 = bytes_of(k8, lk, c.sk, c.hkv),
                             hv8 = bytes_of(v8, lk, c.sk, c.hkv);
  DeviceBuffer dq, dk, dv, dout, dlse, ddesc;
  FLASH3_CUDA_OK(dq.reserve(hq8.size()));
  FLASH3_CUDA_OK(dk.reserve(hk8.size()));
  FLASH3_CUDA_OK(dv.reserve(hv8.size()));
  FLASH3_CUDA_OK(cudaMemcpy(dq.ptr, hq8.data(), hq8.size(), cudaMemcpyHostToDevice));
  FLASH3_CUDA_OK(cudaMemcpy(dk.ptr, hk8.data(), hk8.size(), cudaMemcpyHostToDevice));
  FLASH3_CUDA_OK(cudaMemcpy(dv.ptr, hv8.data(), hv8.size(), cudaMemcpyHostToDevice));
  // q's, k's and v's descales back to back, each as the reference laid them out.
  std::vector<float> hdesc;
  for (const ref::Fp8Tensor* t : {&q8, &k8, &v8})
    for (double x : t->descale) hdesc.push_back(float(x));
  FLASH3_CUDA_OK(ddesc.reserve(hdesc.size() * 4));
  FLASH3_CUDA_OK(cudaMemcpy(ddesc.ptr, hdesc.data(), hdesc.size() * 4, cudaMemcpyHostToDevice));

  const int64_t o_elems = int64_t(c.b) * c.sq * c.hq * c.d, l_elems = int64_t(c.b) * c.hq * c.sq;
  FLASH3_CUDA_OK(dout.reserve(size_t(o_elems + kGuard) * 2));
  FLASH3_CUDA_OK(dlse.reserve(size_t(l_elems + kGuard) * 4));
  FLASH3_CUDA_OK(cudaMemset(dout.ptr, 0xff, size_t(o_elems + kGuard) * 2));  // NaN poison
  FLASH3_CUDA_OK(cudaMemset(dlse.ptr, 0xff, size_t(l_elems + kGuard) * 4));

  flash3::ForwardArgs a;
  auto view = [&](void* p, DType t, int s, int h, const Layout4& l) {
    return TensorView::make4d(p, t, c.b, s, h, c.d, l.sb, l.sr, l.sh, 1);
  };
  a.q = view(dq.ptr, DType::kFloat8E4M3, c.sq, c.hq, lq);
  a.k = view(dk.ptr, DType::kFloat8E4M3, c.sk, c.hkv, lk);
  a.v = view(dv.ptr, DType::kFloat8E4M3, c.sk, c.hkv, lk);
  a.out = view(dout.ptr, DType::kBFloat16, c.sq, c.hq, layout_of(c.b, c.sq, c.hq, c.d, 0));
  const int64_t lse_shape[3] = {c.b, c.hq, c.sq};
  a.lse = TensorView::contiguous(dlse.ptr, DType::kFloat32, 3, lse_shape);
  if (c.descales) {
    float* base = ddesc.as<float>();
    auto desc_view = [&](float* p, Scale scale, int s, int h) {
      const int64_t blocks = (s + flash3::kFp8ScaleBlock - 1) / flash3::kFp8ScaleBlock;
      const int64_t per_head[2] = {c.b, c.hkv}, per_block[3] = {c.b, h, blocks};
      return scale == Scale::kBlock ? TensorView::contiguous(p, DType::kFloat32, 3, per_block)
                                    : TensorView::contiguous(p, DType::kFloat32, 2, per_head);
    };
    a.q_descale = desc_view(base, c.scale_q, c.sq, c.hq);
    a.k_descale = desc_view(base + q8.descale.size(), c.scale_kv, c.sk, c.hkv);
    a.v_descale = desc_view(base + q8.descale.size() + k8.descale.size(), c.scale_kv, c.sk, c.hkv);
  }
  ref::Options o;
  if (c.mask == Mask::kCausal) {
    a.opts.causal = true;
    o.causal = true;
  } else if (c.mask == Mask::kWindow) {
    a.opts.window_left = o.window_left = 97;
    a.opts.window_right = o.window_right = 33;
  }
  const flash3::Status st = flash3::forward(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> hout(size_t(o_elems + kGuard));
  std::vector<float> hlse(size_t(l_elems + kGuard));
  FLASH3_CUDA_OK(cudaMemcpy(hout.data(), dout.ptr, hout.size() * 2, cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(hlse.data(), dlse.ptr, hlse.size() * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < kGuard; ++i) {
    ASSERT_EQ(hout[size_t(o_elems + i)], 0xffff) << "out guard element " << i << " written";
    ASSERT_EQ(f32_bits(hlse[size_t(l_elems + i)]), 0xffffffffu) << "lse guard element " << i << " written";
  }

  // References.
  ref::Problem p;
  p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.heads_q = c.hq, p.heads_kv = c.hkv;
  p.head_dim = p.head_dim_v = c.d;
  const size_t no = static_cast<size_t>(o_elems), nl = static_cast<size_t>(l_elems);
  std::vector<double> ref_o(no), ref_l(nl), plain_o(no), plain_l(nl);
  const std::vector<double> q = q8.dequantized(), k = k8.dequantized(), v = v8.dequantized();
  ref::forward(p, o, q.data(), k.data(), v.data(), ref_o.data(), ref_l.data());
  ref::forward_fp8_plain(p, o, q8, k8, v8, plain_o.data(), plain_l.data());
  for (auto& x : plain_o) x = ref::round_bf16(x);  // the plain implementation writes bf16 too
  std::vector<double> ours_o(no), ours_l(nl);
  for (int64_t i = 0; i < o_elems; ++i) ours_o[size_t(i)] = bf16_to_float(hout[size_t(i)]);
  for (int64_t i = 0; i < l_elems; ++i) ours_l[size_t(i)] = hlse[size_t(i)];
  const ref::CloseResult ro = ref::check_close(ours_o.data(), ref_o.data(), plain_o.data(), ours_o.size(), kEps);
  // The LSE's eps adds the FP8 WGMMA's accumulation error, which the plain
  // implementation's exact fp32 sums do not make: the tensor cores add e4m3
  // products with a shorter mantissa than fp32 (about 2^-14 relative to the
  // sum of |products| measured here: LSE errors of 6e-5 .. 5e-4 against 1e-6
  // for fp32 sums, O unaffected at bf16 output precision), so a score's error
  // is below 2^-13 * |q| |k| * scale (Cauchy-Schwarz bound, dequantized rows).
  auto max_norm = [&](const std::vector<double>& x) {
    double m = 0;
    for (size_t i = 0; i < x.size(); i += size_t(c.d)) {
      double n = 0;
      for (int e = 0; e < c.d; ++e) n += x[i + size_t(e)] * x[i + size_t(e)];
      m = std::max(m, std::sqrt(n));
    }
    return m;
  };
  const double acc_eps = std::ldexp(max_norm(q) * max_norm(k) / std::sqrt(double(c.d)), -13);
  const ref::CloseResult rl =
      ref::check_close(ours_l.data(), ref_l.data(), plain_l.data(), ours_l.size(), kEps + acc_eps);
  EXPECT_TRUE(ro.ok) << "out: err " << ro.err << " plain " << ro.base_err << " bound " << ro.bound << " NaN "
                     << ro.nan_count;
  EXPECT_TRUE(rl.ok) << "lse: err " << rl.err << " plain " << rl.base_err << " bound " << rl.bound << " NaN "
                     << rl.nan_count;
}

class Fp8Gpu : public testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8Gpu, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  run_case(GetParam());
}

std::vector<Fp8Case> cases() {
  std::vector<Fp8Case> out;
  uint64_t seed = 100;
  for (int d : {64, 96, 128, 192, 256}) {
    for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kWindow}) {
      Fp8Case c;
      c.d = d;
      c.mask = m;
      c.seed = ++seed;
      out.push_back(c);  // square, MHA
      c.sq = 77, c.sk = 1000, c.hq = 6, c.hkv = 2, c.seed = ++seed;  // GQA, seqlen_q != seqlen_k, partial tiles
      out.push_back(c);
      c.sq = 513, c.sk = 300, c.hq = 4, c.hkv = 1, c.b = 1, c.seed = ++seed;  // MQA, more queries than keys
      out.push_back(c);
    }
    Fp8Case c;
    c.d = d;
    c.sq = 1, c.sk = 333, c.hq = 8, c.hkv = 2, c.b = 3, c.seed = ++seed;  // decode row
    out.push_back(c);
    c.sq = 200, c.sk = 129, c.head_pad = 32, c.descales = false, c.mask = Mask::kCausal, c.seed = ++seed;
    out.push_back(c);
    // Block scales: every mask, GQA, partial last blocks; and mixed with per-head q.
    for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kWindow}) {
      Fp8Case bc;
      bc.d = d, bc.mask = m, bc.scale_q = bc.scale_kv = Scale::kBlock;
      bc.b = 2, bc.sq = 300, bc.sk = 700, bc.hq = 4, bc.hkv = 2, bc.seed = ++seed;
      out.push_back(bc);
    }
    Fp8Case mc;
    mc.d = d, mc.scale_kv = Scale::kBlock, mc.mask = Mask::kCausal;
    mc.b = 1, mc.sq = 640, mc.sk = 640, mc.hq = 2, mc.hkv = 2, mc.seed = ++seed;
    out.push_back(mc);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, Fp8Gpu, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Fp8Case>& i) { return "case" + std::to_string(i.index); });

}  // namespace
