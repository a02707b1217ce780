// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests of flash3::validate_quantize_fp8 (the FP8 quantization helper's
// argument checks) and of the rotation's sign draw. Fake device addresses;
// nothing is dereferenced.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flash3/flash3.h"
#include "quant/quantize_fp8.h"
#include "reference/fp8_ref.h"
#include "skip_device_check.h"
#include "status_matchers.h"

namespace {

using flash3::DType;
using flash3::QuantizeFp8Args;
using flash3::StatusCode;
using flash3::TensorView;
using flash3::unittest::IsError;
using flash3::unittest::IsOk;

class QuantizeValidation : public flash3::testutil::SkipDeviceCheckTest {};

QuantizeFp8Args make(int64_t b = 2, int64_t s = 100, int64_t h = 8, int64_t d = 128, int hps = 2) {
  QuantizeFp8Args a;
  const int64_t shape[4] = {b, s, h, d}, ds[2] = {b, h / hps};
  a.x = TensorView::contiguous(reinterpret_cast<void*>(0x1000000), DType::kBFloat16, 4, shape);
  a.out = TensorView::contiguous(reinterpret_cast<void*>(0x4000000), DType::kFloat8E4M3, 4, shape);
  a.descale = TensorView::contiguous(reinterpret_cast<void*>(0x6000000), DType::kFloat32, 2, ds);
  a.heads_per_scale = hps;
  return a;
}

TEST_F(QuantizeValidation, Accepted) {
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(make())));
  QuantizeFp8Args a = make(2, 100, 8, 96, 1);
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(a)));
  a = make();
  a.hadamard = true;
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(a)));
}

TEST_F(QuantizeValidation, Rejected) {
  QuantizeFp8Args a = make();
  a.x.dtype = DType::kFloat32;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"x.dtype", "fp16 or bf16"}));
  a = make();
  a.out.dtype = DType::kBFloat16;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"out.dtype", "fp8_e4m3"}));
  a = make();
  a.out.shape[1] = 99;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"out has shape"}));
  a = make(2, 100, 8, 128, 3);
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"heads_per_scale is 3"}));
  a = make(2, 100, 8, 96, 2);
  a.hadamard = true;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument,
                      {"head_dim) is 96 with hadamard", "power of two"}));
  a = make();
  a.descale.shape[1] = 8;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument,
                      {"descale has shape", "(2, 4)"}));
  a = make();
  a.descale.stride[0] = 8;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"contiguous"}));
  a = make();
  a.x.stride[3] = 2;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"x.stride[3]"}));
  a = make();
  a.out.data = a.x.data;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"overlap"}));
}

TEST_F(QuantizeValidation, BlockScales) {
  QuantizeFp8Args a = make(2, 300, 8, 128, 1);
  a.block_scales = true;
  const int64_t ds[3] = {2, 8, 3};  // ceil(300 / 128) = 3
  a.descale = TensorView::contiguous(reinterpret_cast<void*>(0x6000000), DType::kFloat32, 3, ds);
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(a)));
  QuantizeFp8Args bad = a;
  bad.descale.shape[2] = 2;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument,
                      {"descale has shape (2, 8, 2)", "(2, 8, 3) with block_scales"}));
  bad = a;
  bad.descale.stride[1] = 4;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument,
                      {"descale.stride[1] is 4", "contiguous"}));
  bad = a;
  bad.heads_per_scale = 2;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument,
                      {"heads_per_scale is 2 with block_scales"}));
}

// Rows are read and written as vectors: 16-byte strides and base addresses.
TEST_F(QuantizeValidation, RowsAre16ByteAligned) {
  QuantizeFp8Args a = make();
  a.x.stride[2] = 132;  // 264 bytes between heads
  a.x.stride[1] = 132 * 8;
  a.x.stride[0] = 132 * 8 * 100;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument,
                      {"x.stride[2] is 132 elements (264 bytes)", "multiple of 16 bytes"}));
  a = make();
  a.out.data = reinterpret_cast<void*>(0x4000008);
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(a), StatusCode::kInvalidArgument, {"out.data", "16-byte"}));
}

TEST_F(QuantizeValidation, Rotary) {
  QuantizeFp8Args a = make(2, 100, 8, 128, 1);
  const int64_t ts[2] = {100, 32};  // rotary_dim 64
  a.rotary_cos = TensorView::contiguous(reinterpret_cast<void*>(0x7000000), DType::kBFloat16, 2, ts);
  a.rotary_sin = TensorView::contiguous(reinterpret_cast<void*>(0x7100000), DType::kBFloat16, 2, ts);
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(a)));
  a.rotary_interleaved = false;
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(a)));
  QuantizeFp8Args bad = a;
  bad.rotary_sin = TensorView{};
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument, {"rotary_sin is missing"}));
  bad = a;
  bad.rotary_cos.shape[0] = bad.rotary_sin.shape[0] = 99;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument,
                      {"rotary_cos has 99 rows", "seqlen = 100"}));
  bad = a;
  bad.rotary_cos.dtype = bad.rotary_sin.dtype = DType::kFloat16;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument, {"rotary_cos.dtype is fp16"}));
  bad = a;  // rotary_dim 48: not a power of two for half-split pairs
  bad.rotary_cos.shape[1] = bad.rotary_sin.shape[1] = 24;
  bad.rotary_cos.stride[0] = bad.rotary_sin.stride[0] = 24;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument,
                      {"rotary_dim (2 * rotary_cos.shape[1]) is 48", "power of two"}));
  bad.rotary_interleaved = true;
  EXPECT_TRUE(IsOk(flash3::validate_quantize_fp8(bad)));
  bad.rotary_cos.shape[1] = bad.rotary_sin.shape[1] = 20;  // rotary_dim 40
  bad.rotary_cos.stride[0] = bad.rotary_sin.stride[0] = 24;
  EXPECT_TRUE(IsError(flash3::validate_quantize_fp8(bad), StatusCode::kInvalidArgument, {"multiple of 16"}));
}

// The library's sign draw is the reference's (one splitmix64 draw per column).
TEST(QuantizeSigns, MatchReference) {
  for (int d : {32, 64, 128, 256}) {
    uint32_t bits[8];
    flash3::hadamard_sign_bits(d, 1234 + d, bits);
    const std::vector<int8_t> want = flash3::ref::hadamard_signs(d, 1234 + d);
    for (int j = 0; j < d; ++j) EXPECT_EQ((bits[j / 32] >> (j % 32)) & 1, want[size_t(j)] < 0 ? 1u : 0u) << d << " " << j;
  }
}

}  // namespace
