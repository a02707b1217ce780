// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// flash3::quantize_fp8 against the CPU reference (reference/fp8_ref.h): the
// descales (amax / 448 per (batch, head group) or per 128-token block of each
// head, after the optional Hadamard rotation) to fp32 precision, and every
// output byte a correct e4m3 rounding of x / descale (the descale the kernel
// wrote, the quotient in fp32): within half an e4m3 step of it, equal to its
// e4m3 rounding (all bytes; 99.9% with the rotation), NaN never. Strided x / out
// (padding between heads) with poisoned padding that must stay untouched.
// Both kernel sets: quantize_fp8.cu (the default) and quantize_fp8_raw.cu
// (FLASH3_QUANTIZE_RAW=1), until one replaces the other.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "reference/fp8_ref.h"
#include "reference/kvcache_ref.h"

namespace {

using flash3::DType;
using flash3::TensorView;
using namespace flash3::testutil;
namespace ref = flash3::ref;

struct QCase {
  DType dtype = DType::kBFloat16;
  int b = 2, s = 300, h = 4, d = 128, hps = 1, pad = 0;
  bool hadamard = false, block = false;
  int rotary_dim = 0;  // > 0: rotary tables of rotary_dim / 2 columns (8 spare rows)
  bool interleaved = true;
  double scale = 1.0;  // every value multiplied by this (extreme descales)
  uint64_t seed = 1;
};

// Half of the e4m3 step at |v| (2^-9 below the smallest normal 2^-6).
double half_step(double v) {
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);
  return std::ldexp(1.0, int(std::floor(std::log2(a))) - 4);
}

void run(const QCase& c) {
  std::ostringstream name;
  name << flash3::dtype_name(c.dtype) << " b" << c.b << " s" << c.s << " h" << c.h << " d" << c.d << " hps" << c.hps
       << (c.hadamard ? " hadamard" : "") << (c.block ? " block" : "") << (c.pad ? " padded" : "");
  if (c.rotary_dim > 0) name << " rotary" << c.rotary_dim << (c.interleaved ? " interleaved" : " half-split");
  if (c.scale != 1.0) name << " scale " << c.scale;
  SCOPED_TRACE(name.str());
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t sh = c.d + c.pad, sr = int64_t(c.h) * sh, sb = int64_t(c.s) * sr, n_in = int64_t(c.b) * sb;
  const int64_t n = int64_t(c.b) * c.s * c.h * c.d;
  std::vector<double> x(static_cast<size_t>(n));  // dense (b, s, h, d), values of the dtype
  std::vector<uint16_t> hx(static_cast<size_t>(n_in), 0x7fc0);  // padding: NaN
  for (int64_t i = 0; i < n; ++i) {
    double v = nd(rng) * (rng() % 97 == 0 ? 30.0 : 1.0) * c.scale;  // some outliers
    const uint16_t bits = float_to_half_bits(c.dtype, float(v));
    x[size_t(i)] = half_bits_to_float(c.dtype, bits);
    const int64_t e = i % c.d, hh = (i / c.d) % c.h, ss = (i / (int64_t(c.d) * c.h)) % c.s, bb = i / (int64_t(c.d) * c.h * c.s);
    hx[size_t(bb * sb + ss * sr + hh * sh + e)] = bits;
  }
  std::vector<double> xr = x;
  // Rotary tables: cos / sin of random angles in the dtype; row s for token s.
  const int half = c.rotary_dim / 2, seqlen_ro = c.s + 8;
  std::vector<uint16_t> hcos(size_t(seqlen_ro) * half), hsin(hcos.size());
  std::vector<double> cos_tab(hcos.size()), sin_tab(hcos.size());
  for (size_t i = 0; i < hcos.size(); ++i) {
    const double a = nd(rng) * 3.0;
    hcos[i] = float_to_half_bits(c.dtype, float(std::cos(a)));
    hsin[i] = float_to_half_bits(c.dtype, float(std::sin(a)));
    cos_tab[i] = half_bits_to_float(c.dtype, hcos[i]);
    sin_tab[i] = half_bits_to_float(c.dtype, hsin[i]);
  }
  if (c.rotary_dim > 0) {
    std::vector<int> pos(size_t(n / c.d));
    for (size_t r = 0; r < pos.size(); ++r) pos[r] = int((int64_t(r) / c.h) % c.s);  // rows are (b, s, h)
    const ref::LowPrecision lp = c.dtype == DType::kBFloat16 ? ref::LowPrecision::kBFloat16 : ref::LowPrecision::kFloat16;
    ref::rotary_rows(lp, xr.data(), xr.data(), int(pos.size()), c.d, c.rotary_dim, c.interleaved, cos_tab.data(),
                     sin_tab.data(), seqlen_ro, pos.data(), /*round_out=*/false);
  }
  if (c.hadamard) ref::hadamard_rows(xr.data(), xr.data(), n / c.d, c.d, ref::hadamard_signs(c.d, c.seed * 7));
  const ref::Fp8Tensor want =
      c.block ? ref::quantize_e4m3(xr.data(), c.b, c.s, c.h, c.d, ref::Fp8Scaling::kPerBlock, 1, flash3::kFp8ScaleBlock)
              : ref::quantize_e4m3(xr.data(), c.b, c.s, c.h, c.d, ref::Fp8Scaling::kPerHead, c.hps);

  DeviceBuffer dx, dout, ddesc;
  FLASH3_CUDA_OK(dx.reserve(size_t(n_in) * 2));
  FLASH3_CUDA_OK(dout.reserve(size_t(n_in)));
  const int blocks = (c.s + flash3::kFp8ScaleBlock - 1) / flash3::kFp8ScaleBlock;
  const int groups = c.block ? c.b * c.h * blocks : c.b * (c.h / c.hps);
  FLASH3_CUDA_OK(ddesc.reserve(size_t(groups) * 4));
  FLASH3_CUDA_OK(cudaMemcpy(dx.ptr, hx.data(), size_t(n_in) * 2, cudaMemcpyHostToDevice));
  FLASH3_CUDA_OK(cudaMemset(dout.ptr, 0xA5, size_t(n_in)));
  flash3::QuantizeFp8Args a;
  a.x = TensorView::make4d(dx.ptr, c.dtype, c.b, c.s, c.h, c.d, sb, sr, sh, 1);
  a.out = TensorView::make4d(dout.ptr, DType::kFloat8E4M3, c.b, c.s, c.h, c.d, sb, sr, sh, 1);
  const int64_t ds[2] = {c.b, c.h / c.hps}, dsb[3] = {c.b, c.h, blocks};
  a.descale = c.block ? TensorView::contiguous(ddesc.ptr, DType::kFloat32, 3, dsb)
                      : TensorView::contiguous(ddesc.ptr, DType::kFloat32, 2, ds);
  a.heads_per_scale = c.hps;
  a.block_scales = c.block;
  DeviceBuffer dcos, dsin;
  if (c.rotary_dim > 0) {
    FLASH3_CUDA_OK(dcos.reserve(hcos.size() * 2));
    FLASH3_CUDA_OK(dsin.reserve(hsin.size() * 2));
    FLASH3_CUDA_OK(cudaMemcpy(dcos.ptr, hcos.data(), hcos.size() * 2, cudaMemcpyHostToDevice));
    FLASH3_CUDA_OK(cudaMemcpy(dsin.ptr, hsin.data(), hsin.size() * 2, cudaMemcpyHostToDevice));
    const int64_t ts[2] = {seqlen_ro, half};
    a.rotary_cos = TensorView::contiguous(dcos.ptr, c.dtype, 2, ts);
    a.rotary_sin = TensorView::contiguous(dsin.ptr, c.dtype, 2, ts);
    a.rotary_interleaved = c.interleaved;
  }
  a.hadamard = c.hadamard;
  a.hadamard_seed = c.seed * 7;
  const flash3::Status st = flash3::quantize_fp8(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> out(static_cast<size_t>(n_in));
  std::vector<float> desc(static_cast<size_t>(groups));
  FLASH3_CUDA_OK(cudaMemcpy(out.data(), dout.ptr, out.size(), cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(desc.data(), ddesc.ptr, desc.size() * 4, cudaMemcpyDeviceToHost));
  for (int g = 0; g < groups; ++g)
    ASSERT_NEAR(desc[size_t(g)], want.descale[size_t(g)], 2e-6 * want.descale[size_t(g)]) << "group " << g;
  // The rotations run in fp32 in the kernel and in double here: each of the
  // Hadamard's log2(d) butterfly stages and the rotary step rounds, an
  // absolute error of a few fp32 ulps of the row's scale (its L1 norm over
  // sqrt(d) bounds the rotated magnitudes), which can carry a quotient near a
  // rounding boundary to the neighbouring e4m3 value.
  std::vector<double> row_err(size_t(n / c.d), 0.0);
  if (c.hadamard || c.rotary_dim > 0) {
    const double stages = (c.hadamard ? std::log2(double(c.d)) : 0.0) + (c.rotary_dim > 0 ? 2.0 : 0.0);
    for (int64_t r = 0; r < n / c.d; ++r) {
      double l1 = 0, mx = 0;
      for (int e = 0; e < c.d; ++e) {
        l1 += std::fabs(x[size_t(r * c.d + e)]);
        mx = std::max(mx, std::fabs(x[size_t(r * c.d + e)]));
      }
      row_err[size_t(r)] = stages * std::ldexp(1.0, -23) * (l1 / std::sqrt(double(c.d)) + mx);
    }
  }
  int64_t bad = 0, exact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = i % c.d, hh = (i / c.d) % c.h, ss = (i / (int64_t(c.d) * c.h)) % c.s, bb = i / (int64_t(c.d) * c.h * c.s);
    const uint8_t got = out[size_t(bb * sb + ss * sr + hh * sh + e)];
    // x / the descale the kernel wrote (within 2e-6 of the reference's, checked
    // above), divided in fp32 as the kernel does, as torch's
    // (x.float() / descale).to(float8_e4m3fn) does: x and amax are 8- or 11-bit
    // values, so the exact quotient often lies on an e4m3 tie, and which side a
    // rounded quotient lands on depends on that rounding.
    const float d32 = desc[size_t(want.scale_index(int(bb), int(ss), int(hh)))];
    const double v = double(float(xr[size_t(i)]) / d32);
    const double gv = ref::e4m3_value(got);
    exact += got == ref::e4m3_bits(v);
    const double transform_err = row_err[size_t(i / c.d)] / d32;
    if (std::isnan(gv) || std::fabs(gv - v) > half_step(v) * (1 + 1e-4) + transform_err + 1e-12) {
      if (++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << gv << " for " << v;
    }
  }
  EXPECT_EQ(bad, 0);
  // Without the rotation x / descale is the kernel's quotient exactly; with it,
  // the kernel's fp32 butterflies differ from the reference's double ones in
  // the last bits, which can move a value across a rounding boundary.
  if (c.hadamard || c.rotary_dim > 0) EXPECT_GE(double(exact), 0.999 * double(n)) << "bytes equal to the reference's rounding";
  else EXPECT_EQ(exact, n) << "bytes equal to the reference's rounding";
  for (int64_t i = 0; i < n_in; ++i)
    if (i % sh >= c.d) ASSERT_EQ(out[size_t(i)], 0xA5) << "padding byte " << i << " written";
}

// Selects the kernel set for the calls in its scope.
struct QuantizerKernels {
  explicit QuantizerKernels(bool raw) : trace(__FILE__, __LINE__, raw ? "quantize_fp8_raw.cu" : "quantize_fp8.cu") {
    if (raw) setenv("FLASH3_QUANTIZE_RAW", "1", 1);
    else unsetenv("FLASH3_QUANTIZE_RAW");
  }
  ~QuantizerKernels() { unsetenv("FLASH3_QUANTIZE_RAW"); }
  testing::ScopedTrace trace;
};

TEST(QuantizeFp8Gpu, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  uint64_t seed = 10;
  for (bool raw : {false, true}) {
    const QuantizerKernels kernels(raw);
    for (DType dt : {DType::kBFloat16, DType::kFloat16})
      for (int d : {32, 40, 64, 96, 128, 192, 256})  // (raw kernels' lanes per row: 1, 2, 2, 4, 4, 8, 8)
        for (bool had : {false, true}) {
          if (had && (d & (d - 1))) continue;
          // e4m3 rows must be 16-byte multiples apart (out's strides): d = 40
          // runs with 8 elements of padding per head (QuantizeFp8Gpu.RowsOf16Bytes
          // checks that the unpadded layout is rejected).
          const int pad0 = d % 16 == 0 ? 0 : 16 - d % 16;
          QCase c;
          c.dtype = dt, c.d = d, c.hadamard = had, c.pad = pad0, c.seed = ++seed;
          run(c);
          c.hps = 2, c.pad = pad0 + 16, c.s = 77, c.seed = ++seed;  // GQA groups, strided
          run(c);
          c.hps = 1, c.block = true, c.s = 300, c.seed = ++seed;  // block scales, partial last block, strided
          run(c);
          c.pad = pad0, c.s = 128, c.b = 1, c.seed = ++seed;
          run(c);
          // Rotary first (interleaved and half-split, full and partial), block scales.
          // Raw kernels: half-split pairs lie in lanes rotary_dim / 16 pieces apart,
          // or in one lane 1 or 2 pieces apart (power-of-two d: rotary_dim = d / 2 or d).
          if (d % 32 == 0) {
            for (int rd : {d - 16 * (d / 64), -(d & (d - 1) ? 32 : d / 2), -(d & (d - 1) ? 16 : d)}) {
              c.rotary_dim = rd > 0 ? rd : -rd;
              c.interleaved = rd > 0, c.s = 200, c.pad = 16, c.seed = ++seed;
              run(c);
            }
            c.rotary_dim = 0;
          }
        }
  }
}

TEST(QuantizeFp8Gpu, RowsOf16Bytes) {
  // An e4m3 row of d = 40 is 40 bytes: the quantizer (and the FP8 forward's
  // TMA) needs out's row and head strides to be multiples of 16 bytes, and
  // says so naming the stride, before anything is written.
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int64_t shape[4] = {1, 8, 2, 40}, dshape[2] = {1, 2};
  DeviceBuffer dx, dout, ddesc;
  FLASH3_CUDA_OK(dx.reserve(8 * 2 * 40 * 2));
  FLASH3_CUDA_OK(dout.reserve(8 * 2 * 40));
  FLASH3_CUDA_OK(ddesc.reserve(8));
  FLASH3_CUDA_OK(cudaMemset(dx.ptr, 0, 8 * 2 * 40 * 2));
  FLASH3_CUDA_OK(cudaMemset(dout.ptr, 0xA5, 8 * 2 * 40));
  flash3::QuantizeFp8Args a;
  a.x = TensorView::contiguous(dx.ptr, DType::kBFloat16, 4, shape);
  a.out = TensorView::contiguous(dout.ptr, DType::kFloat8E4M3, 4, shape);
  a.descale = TensorView::contiguous(ddesc.ptr, DType::kFloat32, 2, dshape);
  const flash3::Status st = flash3::quantize_fp8(a, nullptr);
  EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message.find("out.stride"), std::string::npos) << st.message;
  std::vector<uint8_t> out(8 * 2 * 40);
  FLASH3_CUDA_OK(cudaMemcpy(out.data(), dout.ptr, out.size(), cudaMemcpyDeviceToHost));
  for (uint8_t v : out) ASSERT_EQ(v, 0xA5);
}

TEST(QuantizeFp8Gpu, ExtremeDescales) {
  // bf16 values near its smallest normals (descales below fp32's normal
  // range) and near its largest (descales of 2^100 and more): every byte still
  // the e4m3 rounding of the fp32 quotient. (The default kernels flush fp32
  // subnormals, -use_fast_math: only the raw ones take the 1e-38 rows.)
  FLASH3_SKIP_WITHOUT_HOPPER();
  uint64_t seed = 500;
  for (bool raw : {false, true}) {
    const QuantizerKernels kernels(raw);
    for (double scale : {1e-38, 1e-30, 1e30, 1e36}) {
      if (scale < 1e-37 && !raw) continue;
      for (bool block : {false, true}) {
        QCase c;
        c.scale = scale, c.block = block, c.s = 200, c.seed = ++seed;
        run(c);
      }
    }
  }
}

TEST(QuantizeFp8Gpu, RotationKeepsScores) {
  // q and k rotated with one seed: q k^T of the dequantized results equals the
  // unrotated product to FP8 precision (checked on one row pair in double).
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int d = 128, s = 64;
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<uint16_t> hq(size_t(s) * d), hk(size_t(s) * d);
  std::vector<double> q(hq.size()), k(hk.size());
  for (size_t i = 0; i < hq.size(); ++i) {
    hq[i] = float_to_bf16(float(nd(rng)));
    hk[i] = float_to_bf16(float(nd(rng)));
    q[i] = bf16_to_float(hq[i]);
    k[i] = bf16_to_float(hk[i]);
  }
  DeviceBuffer dq, dk, oq, ok, ds;
  FLASH3_CUDA_OK(dq.reserve(hq.size() * 2));
  FLASH3_CUDA_OK(dk.reserve(hk.size() * 2));
  FLASH3_CUDA_OK(oq.reserve(hq.size()));
  FLASH3_CUDA_OK(ok.reserve(hk.size()));
  FLASH3_CUDA_OK(ds.reserve(8));
  FLASH3_CUDA_OK(cudaMemcpy(dq.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  FLASH3_CUDA_OK(cudaMemcpy(dk.ptr, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  const int64_t shape[4] = {1, s, 1, d}, dshape[2] = {1, 1};
  float desc[2];
  for (int t = 0; t < 2; ++t) {
    flash3::QuantizeFp8Args a;
    a.x = TensorView::contiguous(t ? dk.ptr : dq.ptr, DType::kBFloat16, 4, shape);
    a.out = TensorView::contiguous(t ? ok.ptr : oq.ptr, DType::kFloat8E4M3, 4, shape);
    a.descale = TensorView::contiguous(ds.as<float>() + t, DType::kFloat32, 2, dshape);
    a.hadamard = true;
    a.hadamard_seed = 99;
    const flash3::Status st = flash3::quantize_fp8(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
  }
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> q8(hq.size()), k8(hk.size());
  FLASH3_CUDA_OK(cudaMemcpy(q8.data(), oq.ptr, q8.size(), cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(k8.data(), ok.ptr, k8.size(), cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(desc, ds.ptr, 8, cudaMemcpyDeviceToHost));
  double max_err = 0, max_ref = 0;
  for (int i = 0; i < s; ++i)
    for (int j = 0; j < s; ++j) {
      double r = 0, g = 0;
      for (int e = 0; e < d; ++e) {
        r += q[size_t(i * d + e)] * k[size_t(j * d + e)];
        g += ref::e4m3_value(q8[size_t(i * d + e)]) * desc[0] * ref::e4m3_value(k8[size_t(j * d + e)]) * desc[1];
      }
      max_err = std::max(max_err, std::fabs(g - r));
      max_ref = std::max(max_ref, std::fabs(r));
    }
  // e4m3 keeps 3 mantissa bits: a dot product of 128 terms errs by a few percent of its scale.
  EXPECT_LT(max_err, 0.1 * max_ref) << "max |q k^T| " << max_ref;
}

}  // namespace
