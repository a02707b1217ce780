// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests of the host API layer (src/api): argument validation of forward and
// backward, the empty-problem fast path, kernel availability, the device checks
// on a machine without a GPU, and make_fwd_params() normalisation.
//
// Tensors use fake, suitably aligned device addresses; nothing is dereferenced.
// The fixtures turn the device checks off (except ValidationDevice).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "api/validate.h"
#include "common/params.h"
#include "flash3/flash3.h"
#include "launch/dispatch.h"
#include "plan/lower.h"
#include "skip_device_check.h"
#include "status_matchers.h"

namespace {

using flash3::unittest::IsError;
using flash3::unittest::IsOk;
using flash3::unittest::code_name;

using flash3::BackwardArgs;
using flash3::DType;
using flash3::ForwardArgs;
using flash3::FwdParams;
using flash3::Status;
using flash3::StatusCode;
using flash3::TensorView;


void* fake(uintptr_t addr) { return reinterpret_cast<void*>(addr); }

// Status has `code` and every substring of `subs` appears in its message.


// A (b, s, h, d) contiguous view.
TensorView bshd(void* p, DType dt, int64_t b, int64_t s, int64_t h, int64_t d) {
  const int64_t shape[4] = {b, s, h, d};
  return TensorView::contiguous(p, dt, 4, shape);
}

struct Dims {
  int64_t b = 2, sq = 128, sk = 256, hq = 8, hkv = 2, d = 64, dv = 64;
  DType dt = DType::kBFloat16;
};

ForwardArgs make_fwd(const Dims& p = {}, bool with_lse = true) {
  ForwardArgs a;
  a.q = bshd(fake(0x1000000), p.dt, p.b, p.sq, p.hq, p.d);
  a.k = bshd(fake(0x2000000), p.dt, p.b, p.sk, p.hkv, p.d);
  a.v = bshd(fake(0x3000000), p.dt, p.b, p.sk, p.hkv, p.dv);
  a.out = bshd(fake(0x4000000), p.dt, p.b, p.sq, p.hq, p.dv);
  if (with_lse) {
    const int64_t shape[3] = {p.b, p.hq, p.sq};
    a.lse = TensorView::contiguous(fake(0x5000000), DType::kFloat32, 3, shape);
  }
  return a;
}

BackwardArgs make_bwd(const Dims& p = {}) {
  const ForwardArgs f = make_fwd(p, true);
  BackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = f.lse;
  a.dout = bshd(fake(0x6000000), p.dt, p.b, p.sq, p.hq, p.dv);
  a.dq = bshd(fake(0x7000000), p.dt, p.b, p.sq, p.hq, p.d);
  a.dk = bshd(fake(0x8000000), p.dt, p.b, p.sk, p.hkv, p.d);
  a.dv = bshd(fake(0x9000000), p.dt, p.b, p.sk, p.hkv, p.dv);
  return a;
}

// Structural validation passes and the full validation is Ok when the kernel
// is built in this library, NotSupported (naming it) when it is not.
void expect_valid_forward(const ForwardArgs& a) {
  EXPECT_TRUE(IsOk(flash3::check_forward_structure(a)));
  const int last = a.q.ndim - 1;
  const Status s = flash3::validate_forward(a);
  if (flash3::forward_is_built(a.q.dtype, int(a.q.shape[last]), int(a.v.shape[last]))) {
    EXPECT_TRUE(IsOk(s));
  } else {
    EXPECT_TRUE(IsError(s, StatusCode::kNotSupported, {"not built"}));
  }
}

// Whether the softcap unit (the manifest's "softcap" feature, FLASH3_FEATURES)
// of a pass is built for (dt, d, dv).
bool softcap_built(bool forward_pass, DType dt, int d, int dv) {
  return forward_pass ? flash3::fwd_kernel_built(dt, d, dv, flash3::ScoreModKind::kSoftcap)
                      : flash3::bwd_kernel_built(dt, d, dv, flash3::ScoreModKind::kSoftcap);
}

// The kernel check's answer (validate_forward / validate_backward) for a
// request that is otherwise valid: the plain kernel not built -> the plain
// "... is not built" NotSupported, whatever softcap is (checked first);
// softcap > 0 without its unit -> NotSupported naming opts.softcap and
// FLASH3_FEATURES; Ok otherwise.
::testing::AssertionResult IsKernelCheckAnswer(const Status& s, bool forward_pass, DType dt, int d, int dv,
                                               float softcap) {
  const bool plain = forward_pass ? flash3::forward_is_built(dt, d, dv) : flash3::backward_is_built(dt, d, dv);
  if (!plain) {
    ::testing::AssertionResult r =
        IsError(s, StatusCode::kNotSupported, {forward_pass ? "forward kernel" : "backward kernel", "not built"});
    if (!r) return r;
    if (s.message.find("opts.softcap") != std::string::npos)
      return ::testing::AssertionFailure() << "the plain kernel's answer comes first, got \"" << s.message << "\"";
    return ::testing::AssertionSuccess();
  }
  if (softcap > 0.f && !softcap_built(forward_pass, dt, d, dv))
    return IsError(s, StatusCode::kNotSupported,
                   {"opts.softcap", forward_pass ? "forward" : "backward", "not built", "FLASH3_FEATURES"});
  return IsOk(s);
}

class ValidationForward : public ::testing::Test {
 protected:
  flash3::testutil::DeviceChecks checks_{false};
};

class ValidationBackward : public ValidationForward {};
class ValidationParams : public ValidationForward {};

// ----------------------------------------------------------------------------
// Valid arguments.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, ValidArgumentsPass) {
  expect_valid_forward(make_fwd());
  expect_valid_forward(make_fwd({}, /*with_lse=*/false));
  Dims p;
  p.dt = DType::kFloat16;
  p.d = 192;
  p.dv = 128;
  p.hkv = 8;
  expect_valid_forward(make_fwd(p));
}

TEST_F(ValidationForward, PackedQkvStridesPass) {
  // q, k, v are slices of one (b, s, 3, h, d) buffer: row stride 3*h*d.
  const int64_t b = 2, s = 64, h = 4, d = 128;
  const int64_t st[4] = {s * 3 * h * d, 3 * h * d, d, 1};
  const uintptr_t base = 0x10000000;
  ForwardArgs a;
  a.q = TensorView::make4d(fake(base), DType::kBFloat16, b, s, h, d, st[0], st[1], st[2], st[3]);
  a.k = TensorView::make4d(fake(base + 2 * h * d), DType::kBFloat16, b, s, h, d, st[0], st[1], st[2], st[3]);
  a.v = TensorView::make4d(fake(base + 4 * h * d), DType::kBFloat16, b, s, h, d, st[0], st[1], st[2], st[3]);
  a.out = bshd(fake(0x20000000), DType::kBFloat16, b, s, h, d);
  expect_valid_forward(a);
}

TEST_F(ValidationForward, SeqlenKZeroIsValid) {
  Dims p;
  p.sk = 0;
  ForwardArgs a = make_fwd(p);
  a.k.data = nullptr;  // empty tensors may have no storage
  a.v.data = nullptr;
  expect_valid_forward(a);
}

TEST_F(ValidationForward, TensorsBeyond2To31ElementsPass) {
  // A KV cache of 32 x 128k tokens x 8 heads x 128: 2^32 elements per tensor
  // (element offsets are 64-bit). Fake addresses 64 GB apart: no overlap.
  ForwardArgs a;
  a.q = bshd(fake(uintptr_t(1) << 36), DType::kBFloat16, 32, 4, 64, 128);
  a.k = bshd(fake(uintptr_t(2) << 36), DType::kBFloat16, 32, 131072, 8, 128);
  a.v = bshd(fake(uintptr_t(3) << 36), DType::kBFloat16, 32, 131072, 8, 128);
  a.out = bshd(fake(uintptr_t(4) << 36), DType::kBFloat16, 32, 4, 64, 128);
  EXPECT_GT(a.k.numel(), int64_t(1) << 31);
  EXPECT_TRUE(IsOk(flash3::check_forward_structure(a)));
}

// ----------------------------------------------------------------------------
// dtypes.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, QDtypeFp32Rejected) {
  Dims p;
  p.dt = DType::kFloat32;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"q.dtype is fp32; expected fp16, bf16 or fp8_e4m3"}));
}

TEST_F(ValidationForward, KDtypeMismatch) {
  ForwardArgs a = make_fwd();
  a.k.dtype = DType::kFloat16;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k.dtype", "fp16", "bf16"}));
}

TEST_F(ValidationForward, OutDtypeMismatch) {
  ForwardArgs a = make_fwd();
  a.out.dtype = DType::kFloat32;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out.dtype", "fp32", "bf16"}));
}

// FP8: q / k / v fp8_e4m3, out bf16, optional (b, hkv) fp32 descales.
ForwardArgs make_fp8(const Dims& d = {}) {
  Dims p = d;
  p.dt = DType::kFloat8E4M3;
  ForwardArgs a = make_fwd(p);
  a.out.dtype = DType::kBFloat16;
  const int64_t shape[2] = {p.b, p.hkv};
  a.q_descale = TensorView::contiguous(fake(0xC000000), DType::kFloat32, 2, shape);
  a.k_descale = TensorView::contiguous(fake(0xC100000), DType::kFloat32, 2, shape);
  a.v_descale = TensorView::contiguous(fake(0xC200000), DType::kFloat32, 2, shape);
  return a;
}

TEST_F(ValidationForward, Fp8Accepted) {
  expect_valid_forward(make_fp8());
  ForwardArgs a = make_fp8();
  a.q_descale = a.k_descale = a.v_descale = TensorView{};  // descales of 1
  expect_valid_forward(a);
}

TEST_F(ValidationForward, Fp8MixedDtypes) {
  ForwardArgs a = make_fp8();
  a.k.dtype = DType::kBFloat16;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k.dtype is bf16", "fp8_e4m3"}));
  a = make_fp8();
  a.q.dtype = DType::kBFloat16;  // bf16 q with fp8 k
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k.dtype is fp8_e4m3", "bf16"}));
}

TEST_F(ValidationForward, Fp8OutputIsBf16) {
  for (DType dt : {DType::kFloat8E4M3, DType::kFloat16, DType::kFloat32}) {
    ForwardArgs a = make_fp8();
    a.out.dtype = dt;
    EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out.dtype", "expected bf16"}));
  }
}

TEST_F(ValidationForward, Fp8Descales) {
  ForwardArgs a = make_fp8();
  a.k_descale.dtype = DType::kBFloat16;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k_descale.dtype is bf16", "fp32"}));
  a = make_fp8();
  a.v_descale.shape[1] = 8;  // heads_q instead of heads_kv
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"v_descale has shape", "(batch, heads_kv) = (2, 2)"}));
  a = make_fp8();
  a.q_descale.ndim = 1;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"q_descale has shape"}));
  a = make_fp8();
  a.q_descale.data = fake(0xC000002);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"q_descale.data", "4-byte"}));
  a = make_fp8();
  a.k_descale.data = nullptr;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k_descale.data is null"}));
  // Descales with 16-bit inputs.
  ForwardArgs b = make_fwd();
  b.q_descale = a.q_descale;
  EXPECT_TRUE(IsError(flash3::validate_forward(b), StatusCode::kInvalidArgument, {"q_descale is given", "bf16"}));
}

// Block scales: q (b, hq, ceil(sq / 128)), k / v (b, hkv, ceil(sk / 128)),
// mixing freely with the (b, hkv) form.
TEST_F(ValidationForward, Fp8BlockDescales) {
  Dims d;
  d.sq = 300, d.sk = 129;
  ForwardArgs a = make_fp8(d);
  const int64_t qs[3] = {d.b, d.hq, 3}, ks[3] = {d.b, d.hkv, 2};
  a.q_descale = TensorView::contiguous(fake(0xC000000), DType::kFloat32, 3, qs);
  a.k_descale = TensorView::contiguous(fake(0xC100000), DType::kFloat32, 3, ks);
  expect_valid_forward(a);  // v per (batch, KV head)
  a.v_descale = TensorView::contiguous(fake(0xC200000), DType::kFloat32, 3, ks);
  expect_valid_forward(a);
  ForwardArgs bad = a;
  bad.q_descale.shape[2] = 2;  // ceil(300 / 128) = 3
  EXPECT_TRUE(IsError(flash3::validate_forward(bad), StatusCode::kInvalidArgument,
                      {"q_descale has shape (2, 8, 2)", "(batch, heads_q, ceil(seqlen_q / 128)) = (2, 8, 3)"}));
  bad = a;
  bad.k_descale.shape[1] = d.hq;  // heads_q instead of heads_kv
  EXPECT_TRUE(IsError(flash3::validate_forward(bad), StatusCode::kInvalidArgument,
                      {"k_descale has shape", "(batch, heads_kv, ceil(seqlen_k / 128)) = (2, 2, 2)"}));
  bad = a;
  bad.v_descale.stride[2] = -1;
  EXPECT_TRUE(IsError(flash3::validate_forward(bad), StatusCode::kInvalidArgument,
                      {"v_descale has stride[2] = -1", "non-negative"}));
}

TEST_F(ValidationForward, Fp8StridesAre16Bytes) {
  ForwardArgs a = make_fp8();
  a.k.stride[2] = 72;  // 72 bytes between heads of d = 64: not a multiple of 16
  a.k.stride[1] = 144;
  a.k.stride[0] = 144 * 256;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"k", "stride", "expected a multiple of 16 elements"}));
}

TEST_F(ValidationForward, Fp8ElsewhereNotSupported) {
  Dims p;
  p.dt = DType::kFloat8E4M3;
  EXPECT_TRUE(IsError(flash3::validate_backward(make_bwd(p)), StatusCode::kNotSupported, {"fp8", "backward"}));
}

// ----------------------------------------------------------------------------
// Head dims.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, HeadDimNotMultipleOf8) {
  Dims p;
  p.d = 100;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"unsupported head dim", "q.shape[3]", "100"}));
}

TEST_F(ValidationForward, HeadDimTooLarge) {
  Dims p;
  p.d = 264;
  p.dv = 264;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"unsupported head dim", "264", "256"}));
}

TEST_F(ValidationForward, HeadDimVUnsupported) {
  Dims p;
  p.dv = 4;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"unsupported head dim", "v.shape[3] (head_dim_v) is 4"}));
}

TEST_F(ValidationForward, HeadDimMismatchQK) {
  ForwardArgs a = make_fwd();
  a.k = bshd(a.k.data, a.k.dtype, 2, 256, 2, 128);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"k.shape[3] (head_dim) is 128; expected 64 to match q"}));
}

TEST_F(ValidationForward, HeadDimVMismatchOut) {
  ForwardArgs a = make_fwd();
  a.out = bshd(a.out.data, a.out.dtype, 2, 128, 8, 128);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"out.shape[3] (head_dim_v) is 128; expected 64 to match v"}));
}

TEST_F(ValidationForward, KernelNotBuiltIsNotSupported) {
  // head_dim 32 is valid but never in the manifest.
  if (flash3::forward_is_built(DType::kFloat16, 32, 32)) GTEST_SKIP() << "fp16 32x32 is built here";
  Dims p;
  p.dt = DType::kFloat16;
  p.d = 32;
  p.dv = 32;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kNotSupported,
                      {"not supported yet", "fp16", "head_dim 32", "head_dim_v 32", "not built"}));
  EXPECT_TRUE(IsError(flash3::forward(make_fwd(p), nullptr), StatusCode::kNotSupported, {"head_dim 32"}));
}

// ----------------------------------------------------------------------------
// Shapes.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, BatchMismatch) {
  ForwardArgs a = make_fwd();
  a.k = bshd(a.k.data, a.k.dtype, 3, 256, 2, 64);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"k.shape[0] (batch) is 3; expected 2 to match q"}));
}

TEST_F(ValidationForward, SeqlenKMismatchKV) {
  ForwardArgs a = make_fwd();
  a.v = bshd(a.v.data, a.v.dtype, 2, 200, 2, 64);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"v.shape[1] (seqlen_k) is 200; expected 256 to match k"}));
}

TEST_F(ValidationForward, KVHeadsMismatch) {
  ForwardArgs a = make_fwd();
  a.v = bshd(a.v.data, a.v.dtype, 2, 256, 4, 64);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"v.shape[2] (num_heads_kv) is 4; expected 2 to match k"}));
}

TEST_F(ValidationForward, HeadsQNotMultipleOfHeadsKV) {
  Dims p;
  p.hq = 6;
  p.hkv = 4;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"num_heads_q", "num_heads_kv", "6", "4"}));
}

TEST_F(ValidationForward, OutShapeMismatch) {
  ForwardArgs a = make_fwd();
  a.out = bshd(a.out.data, a.out.dtype, 2, 127, 8, 64);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"out.shape[1] (seqlen_q) is 127; expected 128", "(2, 128, 8, 64)"}));
}

TEST_F(ValidationForward, NullQData) {
  ForwardArgs a = make_fwd();
  a.q.data = nullptr;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"q.data is null"}));
}

TEST_F(ValidationForward, MissingOut) {
  ForwardArgs a = make_fwd();
  a.out = TensorView{};
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out is missing"}));
}

TEST_F(ValidationForward, WrongNdim) {
  ForwardArgs a = make_fwd();
  a.q.ndim = 3;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"q.ndim is 3; expected 4"}));
}

TEST_F(ValidationForward, NegativeDim) {
  ForwardArgs a = make_fwd();
  a.q.shape[1] = -1;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"q.shape[1] (seqlen_q) is -1; expected >= 0"}));
}

TEST_F(ValidationForward, ZeroKVHeadsRejected) {
  Dims p;
  p.hkv = 0;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"k.shape[2] (num_heads_kv) is 0"}));
}

// ----------------------------------------------------------------------------
// Strides, alignment, 32-bit offsets.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, MisalignedPointer) {
  ForwardArgs a = make_fwd();
  a.v.data = fake(0x3000008);  // 8-byte aligned only
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"v.data", "16-byte aligned"}));
}

TEST_F(ValidationForward, StrideNotMultipleOf8) {
  ForwardArgs a = make_fwd();
  a.k.stride[1] = 132;  // 2 heads * 64 + 4 padding elements
  a.k.stride[0] = 132 * 256;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"k.stride[1] (seqlen_k) is 132", "multiple of 8"}));
}

TEST_F(ValidationForward, NonUnitLastStride) {
  ForwardArgs a = make_fwd();
  a.q = TensorView::make4d(a.q.data, a.q.dtype, 2, 128, 8, 64, 128 * 8 * 128, 8 * 128, 128, 2);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"q.stride[3] (head_dim) is 2; expected 1"}));
}

TEST_F(ValidationForward, NegativeStride) {
  ForwardArgs a = make_fwd();
  a.k.stride[0] = -a.k.stride[0];
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k.stride[0] (batch)", ">= 0"}));
}

TEST_F(ValidationForward, ZeroStrideOnWrittenTensor) {
  ForwardArgs a = make_fwd();
  a.out.stride[1] = 0;  // all query rows would write the same memory
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out.stride[1]", "non-zero"}));
}

TEST_F(ValidationForward, OffsetBeyondInt64) {
  ForwardArgs a = make_fwd();
  a.lse.stride[0] = int64_t(1) << 62;  // (b - 1) * stride * 4 bytes overflows int64
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse: the byte offset", "int64"}));
}

TEST_F(ValidationForward, TmaStrideLimit) {
  ForwardArgs a = make_fwd();
  a.k.stride[0] = int64_t(1) << 40;  // 2^41 bytes
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"k.stride[0] (batch)", "2^40 bytes"}));
}

TEST_F(ValidationForward, StrideOfSizeOneDimIsIgnored) {
  Dims p;
  p.b = 1;
  p.sq = 1;
  ForwardArgs a = make_fwd(p);
  for (TensorView* t : {&a.q, &a.out}) {
    t->stride[0] = 3;   // neither a multiple of 8 nor >= 0 matters for a dimension of size 1
    t->stride[1] = -5;
  }
  a.lse.stride[2] = 7;
  ASSERT_TRUE(IsOk(flash3::check_forward_structure(a)));
  const FwdParams f = flash3::make_fwd_params(a);
  // Lowered to a valid TMA stride (a multiple of 16 bytes past the view's span).
  for (int64_t st : {f.q_batch_stride, f.q_row_stride, f.o_batch_stride, f.o_row_stride}) {
    EXPECT_GT(st, 0);
    EXPECT_EQ(st % 8, 0);
  }
}

TEST_F(ValidationForward, LimitsOfTheInt32Kernels) {
  Dims p;
  p.hq = 65536;
  p.hkv = 1;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(p)), StatusCode::kInvalidArgument,
                      {"q.shape[2] (num_heads_q) is 65536", "<= 65535"}));
  Dims big;
  big.b = 1;
  big.sq = big.sk = 1200000000;
  EXPECT_TRUE(IsError(flash3::validate_forward(make_fwd(big)), StatusCode::kInvalidArgument,
                      {"seqlen_q", "+", "seqlen_k"}));
}

TEST(BatchPerLaunch, GridAndTileLimits) {
  // Small problems: the grids' z limit.
  EXPECT_EQ(flash3::batch_per_launch(1, 1, 1, 1), 65535);
  EXPECT_EQ(flash3::batch_per_launch(128, 128, 8, 8), 65535);
  // Tile counts stay within int32: 64-row tiles x heads x batch.
  const int64_t b = flash3::batch_per_launch(131072, 131072, 64, 8);
  EXPECT_GE(b, 1);
  EXPECT_LE(b * (131072 / 64) * 64, int64_t(INT32_MAX) / 2);
  EXPECT_GT((b + 1) * (131072 / 64) * 64, int64_t(INT32_MAX) / 2);
  EXPECT_EQ(flash3::batch_per_launch(int64_t(1) << 30, 1, 65535, 1), 0);
}

// ----------------------------------------------------------------------------
// lse.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, LseWrongDtype) {
  ForwardArgs a = make_fwd();
  a.lse.dtype = DType::kBFloat16;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse.dtype is bf16; expected fp32"}));
}

TEST_F(ValidationForward, LseWrongShape) {
  ForwardArgs a = make_fwd();
  const int64_t shape[3] = {2, 128, 8};  // (b, sq, hq) instead of (b, hq, sq)
  a.lse = TensorView::contiguous(a.lse.data, DType::kFloat32, 3, shape);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"lse.shape[1] (num_heads_q) is 128; expected 8"}));
}

TEST_F(ValidationForward, LseWrongNdim) {
  ForwardArgs a = make_fwd();
  a.lse.ndim = 2;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse.ndim is 2; expected 3"}));
}

TEST_F(ValidationForward, LseNonUnitLastStride) {
  ForwardArgs a = make_fwd();
  a.lse = TensorView::make3d(a.lse.data, DType::kFloat32, 2, 8, 128, 8 * 256, 256, 2);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse.stride[2]", "expected 1"}));
}

TEST_F(ValidationForward, LseMisaligned) {
  ForwardArgs a = make_fwd();
  a.lse.data = fake(0x5000002);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse.data", "4-byte aligned"}));
}

// ----------------------------------------------------------------------------
// Options.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, AnyWindowIsValid) {
  ForwardArgs a = make_fwd();
  for (bool causal : {false, true})
    for (int wl : {-1, -2, 0, 16, INT32_MAX, INT32_MIN})
      for (int wr : {-1, -7, 0, 4, INT32_MAX}) {
        a.opts.causal = causal;
        a.opts.window_left = wl;
        a.opts.window_right = wr;
        EXPECT_TRUE(IsOk(flash3::check_forward_structure(a))) << causal << " " << wl << " " << wr;
      }
}

TEST_F(ValidationForward, BadSoftcap) {
  ForwardArgs a = make_fwd();
  a.opts.softcap = -1.f;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"opts.softcap is -1"}));
  a.opts.softcap = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"opts.softcap"}));
  a.opts.softcap = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"opts.softcap is inf"}));
}

TEST_F(ValidationForward, SoftmaxScale) {
  ForwardArgs a = make_fwd();
  a.opts.softmax_scale = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"opts.softmax_scale is inf"}));
  a.opts.softmax_scale = -3.f;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.softmax_scale is -3", "negative scale is not supported"}));
  for (float ok : {std::numeric_limits<float>::quiet_NaN(), 0.f, 1e-30f, 0.3f, 100.f}) {
    a.opts.softmax_scale = ok;
    EXPECT_TRUE(IsOk(flash3::check_forward_structure(a))) << ok;
  }
}

TEST_F(ValidationForward, LseWithShapeButNoDataIsAnError) {
  ForwardArgs a = make_fwd();
  a.lse.data = nullptr;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse.data is null"}));
  BackwardArgs b = make_bwd();
  b.dlse = b.lse;
  b.dlse.data = nullptr;
  EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {"dlse.data is null"}));
}

// ----------------------------------------------------------------------------
// Outputs overlapping inputs, each other or themselves.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, OutAliasingAnInputIsAnError) {
  Dims p;
  p.sk = p.sq;
  p.hkv = p.hq;
  ForwardArgs a = make_fwd(p);
  a.out.data = a.k.data;  // same shape as k
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out", "overlaps k"}));
  a = make_fwd(p);
  a.out.data = static_cast<char*>(a.q.data) + 4096;  // partly over q
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out", "overlaps q"}));
  a = make_fwd(p);
  a.lse.data = static_cast<char*>(a.out.data) + 64;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse", "overlaps out"}));
}

TEST_F(ValidationForward, OutOverlappingItselfIsAnError) {
  ForwardArgs a = make_fwd();
  a.out.stride[2] = 32;  // heads 32 elements apart, each 64 wide
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"out has shape", "overlap"}));
  a = make_fwd();
  a.lse.stride[1] = 100;  // (b, hq, sq = 128): rows of consecutive heads overlap
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"lse has shape", "overlap"}));
}

TEST_F(ValidationBackward, GradientsAliasingIsAnError) {
  Dims p;
  p.sk = p.sq;
  p.hkv = p.hq;
  BackwardArgs a = make_bwd(p);
  a.dk.data = a.dq.data;
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dq", "overlaps dk"}));
  a = make_bwd(p);
  a.dq.data = a.q.data;
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dq", "overlaps q", "is read"}));
  a = make_bwd(p);
  a.dv.data = a.dout.data;
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dv", "overlaps dout"}));
}

TEST_F(ValidationBackward, PackedGradientsPass) {
  // dq, dk, dv interleaved in one (b, s, 3, h, d) buffer, like a packed QKV.
  Dims p;
  p.sk = p.sq;
  p.hkv = p.hq;
  BackwardArgs a = make_bwd(p);
  const int64_t hd = p.hq * p.d;
  const uintptr_t base = 0x40000000;
  for (int i = 0; i < 3; ++i) {
    TensorView* g = i == 0 ? &a.dq : i == 1 ? &a.dk : &a.dv;
    *g = TensorView::make4d(fake(base + uintptr_t(i) * hd * 2), p.dt, p.b, p.sq, p.hq, p.d, p.sq * 3 * hd, 3 * hd, p.d, 1);
  }
  EXPECT_TRUE(IsOk(flash3::check_backward_structure(a)));
  a.dk.data = fake(base + 64);  // now dk's heads land inside dq's rows
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dq", "overlaps dk"}));
}

TEST_F(ValidationForward, CuSeqlensOnlyOneSide) {
  ForwardArgs a = make_fwd();
  a.opts.cu_seqlens_q = static_cast<const int*>(fake(0xA000000));
  a.opts.max_seqlen_q = a.opts.max_seqlen_k = 128;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.cu_seqlens_k is null", "both or neither"}));
  a.opts.cu_seqlens_q = nullptr;
  a.opts.cu_seqlens_k = static_cast<const int*>(fake(0xA000000));
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.cu_seqlens_q is null", "both or neither"}));
}

// Variable length: (total, h, d) tensors and (hq, total_q) lse, 3 sequences.
ForwardArgs make_varlen(int64_t total_q = 300, int64_t total_k = 500) {
  ForwardArgs a;
  const int64_t q[3] = {total_q, 8, 64}, k[3] = {total_k, 2, 64}, l[2] = {8, total_q};
  a.q = TensorView::contiguous(fake(0x1000000), DType::kBFloat16, 3, q);
  a.k = TensorView::contiguous(fake(0x2000000), DType::kBFloat16, 3, k);
  a.v = TensorView::contiguous(fake(0x3000000), DType::kBFloat16, 3, k);
  a.out = TensorView::contiguous(fake(0x4000000), DType::kBFloat16, 3, q);
  a.lse = TensorView::contiguous(fake(0x5000000), DType::kFloat32, 2, l);
  a.opts.cu_seqlens_q = static_cast<const int*>(fake(0xA000000));
  a.opts.cu_seqlens_k = static_cast<const int*>(fake(0xB000000));
  a.opts.max_seqlen_q = 200;
  a.opts.max_seqlen_k = 300;
  a.opts.num_sequences = 3;
  return a;
}

TEST_F(ValidationForward, Fp8VarlenNotSupported) {
  ForwardArgs a = make_varlen();
  for (TensorView* t : {&a.q, &a.k, &a.v}) t->dtype = DType::kFloat8E4M3;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kNotSupported, {"fp8", "cu_seqlens_q"}));
}

// The varlen backward arguments of make_varlen()'s forward.
BackwardArgs make_varlen_bwd(int64_t total_q = 300, int64_t total_k = 500) {
  const ForwardArgs f = make_varlen(total_q, total_k);
  BackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = f.lse;
  a.opts = f.opts;
  a.dout = f.out;
  a.dout.data = fake(0x6000000);
  a.dq = f.q;
  a.dq.data = fake(0x7000000);
  a.dk = f.k;
  a.dk.data = fake(0x8000000);
  a.dv = f.v;
  a.dv.data = fake(0x9000000);
  return a;
}

TEST_F(ValidationForward, VarlenLayoutValid) {
  ForwardArgs a = make_varlen();
  expect_valid_forward(a);
  a.opts.seqused_q = static_cast<const int*>(fake(0xC000000));
  a.opts.seqused_k = static_cast<const int*>(fake(0xD000000));
  expect_valid_forward(a);
  // The tile maps are sized in int32 rows: total + 256 rows per sequence.
  const int64_t total = std::max(a.q.shape[0], a.k.shape[0]);
  a.opts.num_sequences = static_cast<int>((2147482623 - total) / 256);
  expect_valid_forward(a);
  a.opts.num_sequences += 1;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"256 * opts.num_sequences", "tile maps are sized in int32 rows"}));
}

TEST_F(ValidationForward, VarlenRejectsFixedLengthLayout) {
  ForwardArgs a = make_fwd();
  a.opts = make_varlen().opts;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"q.ndim is 4; expected 3", "cu_seqlens_q"}));
}

TEST_F(ValidationForward, VarlenMaxSeqlenZeroIsTheEmptyBatch) {
  // FlashAttention-3 takes max_seqlen 0 (every sequence empty): only the
  // window normalisation reads it; negative values stay errors.
  ForwardArgs a = make_varlen();
  a.opts.max_seqlen_q = 0;
  a.opts.max_seqlen_k = 0;
  EXPECT_TRUE(IsOk(flash3::check_forward_structure(a)));
  a.opts.max_seqlen_q = -1;
  EXPECT_TRUE(IsError(flash3::check_forward_structure(a), StatusCode::kInvalidArgument, {"opts.max_seqlen_q is -1"}));
  a.opts.max_seqlen_q = 0;
  a.opts.max_seqlen_k = -2;
  EXPECT_TRUE(IsError(flash3::check_forward_structure(a), StatusCode::kInvalidArgument, {"opts.max_seqlen_k is -2"}));
}

TEST_F(ValidationForward, VarlenLseShape) {
  ForwardArgs a = make_varlen();
  a.lse.shape[1] = 299;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"lse.shape[1] (total_q) is 299; expected 300"}));
}

TEST_F(ValidationForward, NegativeNumSequences) {
  ForwardArgs a = make_varlen();
  a.opts.num_sequences = -1;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.num_sequences is -1; expected >= 0"}));
  EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"opts.num_sequences is -1"}));
  // A negative count is wrong whether or not cu_seqlens is set.
  ForwardArgs f = make_fwd();
  f.opts.num_sequences = -7;
  EXPECT_TRUE(IsError(flash3::validate_forward(f), StatusCode::kInvalidArgument, {"opts.num_sequences is -7"}));
  BackwardArgs b = make_varlen_bwd();
  b.opts.num_sequences = -2;
  EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {"opts.num_sequences is -2"}));
}

TEST_F(ValidationForward, TooManySequences) {
  ForwardArgs a = make_varlen();
  a.opts.num_sequences = (1 << 30) + 1;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.num_sequences is 1073741825", "expected <= 1073741824", "int32"}));
  a.opts.num_sequences = std::numeric_limits<int>::max();
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"opts.num_sequences is 2147483647"}));
}

TEST_F(ValidationForward, SequsedNeedsCuSeqlens) {
  ForwardArgs a = make_fwd();
  a.opts.seqused_q = static_cast<const int*>(fake(0xC000000));
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.seqused_q is set (0xc000000)", "opts.cu_seqlens_q is null",
                       "opts.seqused_q needs opts.cu_seqlens_q"}));
  a.opts.seqused_q = nullptr;
  a.opts.seqused_k = static_cast<const int*>(fake(0xD000000));
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.seqused_k is set (0xd000000)", "opts.seqused_k needs opts.cu_seqlens_k"}));
  EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"opts.seqused_k"}));
  BackwardArgs b = make_bwd();
  b.opts.seqused_q = static_cast<const int*>(fake(0xC000000));
  EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {"opts.seqused_q needs"}));
}

TEST_F(ValidationForward, VarlenArraysMisaligned) {
  ForwardArgs a = make_varlen();
  a.opts.cu_seqlens_k = static_cast<const int*>(fake(0xB000002));
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.cu_seqlens_k (0xb000002) is not 4-byte aligned"}));
  a = make_varlen();
  a.opts.seqused_q = static_cast<const int*>(fake(0xC000001));
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.seqused_q (0xc000001) is not 4-byte aligned", "int32"}));
  a = make_varlen();
  a.opts.seqused_k = static_cast<const int*>(fake(0xD000006));
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"opts.seqused_k (0xd000006) is not 4-byte aligned"}));
}

TEST_F(ValidationForward, VarlenSeqlenSumLimit) {
  // total_q + total_k fits the fixed-length rule; adding the longest sequence
  // (the window's reach) does not.
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max() - 1024;
  const int64_t total_q = 1000000000, total_k = 1000000000;
  ForwardArgs a = make_varlen(total_q, total_k);
  int i = 1;  // 1 TB apart: the tensors do not overlap
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse}) t->data = fake(uintptr_t(i++) << 40);
  a.opts.max_seqlen_q = 1000;
  a.opts.max_seqlen_k = static_cast<int>(kLimit - total_q - total_k);  // exactly at the limit
  EXPECT_TRUE(IsOk(flash3::check_forward_structure(a)));
  a.opts.max_seqlen_k += 1;
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument,
                      {"q.shape[0] (total_q) + k.shape[0] (total_k) + max(opts.max_seqlen_q, opts.max_seqlen_k)",
                       "= 2147482624", "expected <= 2147482623", "int32"}));
  // The larger of the two maxima counts.
  std::swap(a.opts.max_seqlen_q, a.opts.max_seqlen_k);
  EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"max(opts.max_seqlen_q"}));
  BackwardArgs b = make_varlen_bwd(total_q, total_k);
  b.opts.max_seqlen_q = a.opts.max_seqlen_q;
  EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {"max(opts.max_seqlen_q"}));
  // The fixed-length rule still applies first.
  ForwardArgs big = make_varlen(1200000000, 1200000000);
  EXPECT_TRUE(IsError(flash3::validate_forward(big), StatusCode::kInvalidArgument,
                      {"q.shape[0] (total_q) + k.shape[0] (total_k) is 2400000000"}));
}

TEST_F(ValidationForward, VarlenEmptyReturnsOkWithoutLaunch) {
  // d = 32 is never built: Ok proves forward() returned before any dispatch.
  ForwardArgs a = make_varlen();
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) {
    t->shape[2] = 32;
    t->stride[0] = t->shape[1] * 32;
    t->stride[1] = 32;
  }
  a.opts.num_sequences = 0;  // no sequences (cu_seqlens has one entry)
  EXPECT_TRUE(flash3::forward_is_empty(a));
  EXPECT_TRUE(IsOk(flash3::validate_forward(a)));
  EXPECT_TRUE(IsOk(flash3::forward(a, nullptr)));
  // No query rows.
  ForwardArgs z = make_varlen(/*total_q=*/0);
  z.q.data = nullptr;
  z.out.data = nullptr;
  z.lse.data = nullptr;
  EXPECT_TRUE(flash3::forward_is_empty(z));
  EXPECT_TRUE(IsOk(flash3::forward(z, nullptr)));
  // Empty, but still validated.
  a.opts.seqused_q = static_cast<const int*>(fake(0xC000002));
  EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"opts.seqused_q"}));
  EXPECT_FALSE(flash3::forward_is_empty(make_varlen()));
}

TEST_F(ValidationForward, VarlenForwardIsSupported) {
  // The old "not supported yet: varlen" / "not supported yet: softcap" answers
  // are gone: a varlen request with softcap passes wherever its units are built.
  for (float softcap : {0.f, 5.f, 30.f}) {
    ForwardArgs a = make_varlen();
    a.opts.softcap = softcap;
    a.opts.causal = softcap == 5.f;
    EXPECT_TRUE(IsOk(flash3::check_forward_structure(a))) << softcap;
    const Status s = flash3::validate_forward(a);
    EXPECT_TRUE(IsKernelCheckAnswer(s, true, DType::kBFloat16, 64, 64, softcap)) << softcap;
    EXPECT_EQ(s.message.find("not supported yet: softcap"), std::string::npos) << s.message;
    EXPECT_EQ(s.message.find("varlen"), std::string::npos) << s.message;
    // forward() gives the same answer where it is an error (nothing launched).
    if (!s.ok()) {
      EXPECT_TRUE(IsError(flash3::forward(a, nullptr), s.code, {s.message.c_str()})) << softcap;
    }
  }
}

TEST_F(ValidationForward, NumSplits) {
  // 0 (heuristic), 1 (no split, the default), n in [2, 256]; anything else is
  // rejected, forward and backward (shared options; the backward ignores it).
  EXPECT_EQ(flash3::AttentionOptions{}.num_splits, 1);
  for (int bad : {-1, 257, INT32_MIN, INT32_MAX}) {
    const std::string want = "opts.num_splits is " + std::to_string(bad) + "; expected 0 (heuristic), 1 (no split)";
    ForwardArgs a = make_fwd();
    a.opts.num_splits = bad;
    EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {want.c_str()}));
    EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {want.c_str()}));
    ForwardArgs v = make_varlen();
    v.opts.num_splits = bad;
    EXPECT_TRUE(IsError(flash3::validate_forward(v), StatusCode::kInvalidArgument, {want.c_str()}));
    BackwardArgs b = make_bwd();
    b.opts.num_splits = bad;
    EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {want.c_str()}));
  }
  // Valid values get the same answer as the default (the kernel check does not
  // depend on it: softcap runs the unsplit kernel).
  for (int ok : {0, 1, 2, 3, 255, 256}) {
    ForwardArgs a = make_fwd();
    a.opts.num_splits = ok;
    expect_valid_forward(a);
    BackwardArgs b = make_bwd();
    b.opts.num_splits = ok;
    EXPECT_TRUE(IsOk(flash3::check_backward_structure(b))) << ok;
    ForwardArgs v = make_varlen();
    v.opts.num_splits = ok;
    EXPECT_TRUE(IsOk(flash3::check_forward_structure(v))) << ok;
    ForwardArgs c = make_fwd();
    c.opts.softcap = 30.f;
    c.opts.num_splits = ok;
    EXPECT_TRUE(IsKernelCheckAnswer(flash3::validate_forward(c), true, DType::kBFloat16, 64, 64, 30.f)) << ok;
  }
}

TEST_F(ValidationForward, PackGqa) {
  // -1 (heuristic), 0 (off), 1 (on); anything else is rejected, forward and
  // backward (shared options; the backward otherwise ignores it).
  for (int bad : {-2, 2, INT32_MIN, INT32_MAX}) {
    const std::string want = "opts.pack_gqa is " + std::to_string(bad) + "; expected -1 (heuristic), 0 (off) or 1 (on)";
    ForwardArgs a = make_fwd();
    a.opts.pack_gqa = bad;
    EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {want.c_str()}));
    ForwardArgs v = make_varlen();
    v.opts.pack_gqa = bad;
    EXPECT_TRUE(IsError(flash3::validate_forward(v), StatusCode::kInvalidArgument, {want.c_str()}));
    BackwardArgs b = make_bwd();
    b.opts.pack_gqa = bad;
    EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {want.c_str()}));
  }
  // Valid values on GQA, MQA and MHA (no packed kernel: the unpacked one runs)
  // get the same answer as the default: the kernel check does not depend on it.
  for (int64_t hkv : {2, 1, 8}) {
    Dims p;
    p.hkv = hkv;
    for (int ok : {-1, 0, 1}) {
      ForwardArgs a = make_fwd(p);
      a.opts.pack_gqa = ok;
      expect_valid_forward(a);
      BackwardArgs b = make_bwd(p);
      b.opts.pack_gqa = ok;
      EXPECT_TRUE(IsOk(flash3::check_backward_structure(b))) << hkv << " " << ok;
    }
  }
  for (int ok : {-1, 0, 1}) {
    ForwardArgs v = make_varlen();
    v.opts.pack_gqa = ok;
    EXPECT_TRUE(IsOk(flash3::check_forward_structure(v))) << ok;
    EXPECT_TRUE(IsKernelCheckAnswer(flash3::validate_forward(v), true, DType::kBFloat16, 64, 64, 0.f)) << ok;
    // softcap has no packed units: pack_gqa = 1 runs the unpacked softcap one.
    ForwardArgs c = make_fwd();
    c.opts.softcap = 30.f;
    c.opts.pack_gqa = ok;
    EXPECT_TRUE(IsKernelCheckAnswer(flash3::validate_forward(c), true, DType::kBFloat16, 64, 64, 30.f)) << ok;
  }
}

TEST_F(ValidationBackward, VarlenBackwardValidatesAndSizesScratch) {
  BackwardArgs a = make_varlen_bwd();
  EXPECT_TRUE(IsOk(flash3::check_backward_structure(a)));
  const Status s = flash3::backward(a, nullptr);
  if (!flash3::backward_is_built(DType::kBFloat16, 64, 64)) {
    EXPECT_TRUE(IsError(s, StatusCode::kNotSupported, {"backward kernel", "not built"}));
  }
  // An empty varlen backward needs no kernel: Ok on every build, nothing launched.
  a.opts.num_sequences = 0;
  EXPECT_TRUE(IsOk(flash3::validate_backward(a)));
  EXPECT_TRUE(IsOk(flash3::backward(a, nullptr)));
  // Validation first.
  a.dq.dtype = DType::kFloat16;
  EXPECT_TRUE(IsError(flash3::backward(a, nullptr), StatusCode::kInvalidArgument, {"dq.dtype"}));
  // softcap: valid wherever its backward unit is built; the plain "not built"
  // answer first. backward() checks the workspace after validation, so a
  // too-small one proves a built softcap request gets past the kernel check
  // (nothing launched).
  {
    BackwardArgs c = make_varlen_bwd();
    c.opts.softcap = 30.f;
    const Status s = flash3::validate_backward(c);
    EXPECT_TRUE(IsKernelCheckAnswer(s, false, DType::kBFloat16, 64, 64, 30.f));
    c.workspace = fake(0xE000000);
    c.workspace_bytes = flash3::backward_workspace_size(c) - 1;
    if (s.ok()) {
      EXPECT_TRUE(IsError(flash3::backward(c, nullptr), StatusCode::kInvalidArgument, {"workspace", "needed"}));
    } else {
      EXPECT_TRUE(IsError(flash3::backward(c, nullptr), s.code, {s.message.c_str()}));
    }
  }
  // Scratch: the per-query-block arrays of total_q / tile_m + sequences blocks
  // plus the prep kernel's maps; more sequences need more.
  const size_t ws = flash3::backward_workspace_size(make_varlen_bwd());
  EXPECT_GT(ws, 0u);
  BackwardArgs more = make_varlen_bwd();
  more.opts.num_sequences *= 4;
  EXPECT_GT(flash3::backward_workspace_size(more), ws);
  BackwardArgs none = make_varlen_bwd();
  none.opts.num_sequences = 0;
  EXPECT_EQ(flash3::backward_workspace_size(none), 0u);
}

// ----------------------------------------------------------------------------
// forward(): empty problems and unimplemented features.
// ----------------------------------------------------------------------------
TEST_F(ValidationForward, EmptySeqlenQReturnsOkWithoutLaunch) {
  // Kernel-less builds would answer NotSupported from the launcher; Ok proves
  // forward() returned before dispatch.
  Dims p;
  p.sq = 0;
  ForwardArgs a = make_fwd(p);
  a.q.data = nullptr;
  a.out.data = nullptr;
  EXPECT_TRUE(IsOk(flash3::forward(a, nullptr)));
  EXPECT_TRUE(IsOk(flash3::validate_forward(a)));
}

TEST_F(ValidationForward, EmptyBatchReturnsOk) {
  Dims p;
  p.b = 0;
  p.d = 32;  // not even a built head dim: no kernel is needed
  p.dv = 32;
  EXPECT_TRUE(IsOk(flash3::forward(make_fwd(p), nullptr)));
}

TEST_F(ValidationForward, EmptyProblemStillValidated) {
  Dims p;
  p.sq = 0;
  ForwardArgs a = make_fwd(p);
  a.k.dtype = DType::kFloat16;
  EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"k.dtype"}));
}

TEST_F(ValidationForward, SoftcapIsValidWhereBuilt) {
  // Every mask, GQA / MHA, both dtypes, a d != dv pair, softmax_scale 0 and
  // explicit: valid arguments; the kernel check decides (IsKernelCheckAnswer).
  struct Case {
    DType dt;
    int64_t d, dv, hkv;
  };
  const Case cases[] = {{DType::kBFloat16, 64, 64, 2},
                        {DType::kBFloat16, 128, 128, 2},
                        {DType::kFloat16, 128, 128, 8},
                        {DType::kBFloat16, 192, 128, 1},
                        {DType::kFloat16, 256, 256, 2}};
  for (const Case& c : cases)
    for (float softcap : {0.f, 1.f, 5.f, 30.f})
      for (int mask = 0; mask < 3; ++mask) {
        Dims p;
        p.dt = c.dt;
        p.d = c.d;
        p.dv = c.dv;
        p.hkv = c.hkv;
        ForwardArgs a = make_fwd(p);
        a.opts.softcap = softcap;
        a.opts.causal = mask == 1;
        if (mask == 2) {
          a.opts.window_left = 32;
          a.opts.window_right = 0;
          a.opts.softmax_scale = 0.f;
        }
        const std::string what = "d " + std::to_string(c.d) + " dv " + std::to_string(c.dv) + " softcap " +
                                 std::to_string(softcap) + " mask " + std::to_string(mask);
        EXPECT_TRUE(IsOk(flash3::check_forward_structure(a))) << what;
        const Status s = flash3::validate_forward(a);
        EXPECT_TRUE(IsKernelCheckAnswer(s, true, c.dt, int(c.d), int(c.dv), softcap)) << what;
        EXPECT_EQ(s.message.find("not supported yet: softcap"), std::string::npos) << s.message;
        // forward() gives the same answer where it is an error (nothing launched).
        if (!s.ok()) {
          EXPECT_TRUE(IsError(flash3::forward(a, nullptr), s.code, {s.message.c_str()})) << what;
        }

        BackwardArgs b = make_bwd(p);
        b.opts = a.opts;
        EXPECT_TRUE(IsOk(flash3::check_backward_structure(b))) << what;
        const Status sb = flash3::validate_backward(b);
        EXPECT_TRUE(IsKernelCheckAnswer(sb, false, c.dt, int(c.d), int(c.dv), softcap)) << what;
        if (!sb.ok()) {
          EXPECT_TRUE(IsError(flash3::backward(b, nullptr), sb.code, {sb.message.c_str()})) << what;
        }
      }
}

TEST_F(ValidationForward, BadSoftcapBeforeTheKernelCheck) {
  // A bad value is InvalidArgument on every build, even for a head dim that
  // has no kernel (the structural checks come before the kernel check).
  Dims p;
  p.dt = DType::kFloat16;
  p.d = 32;
  p.dv = 32;
  for (float bad : {-1.f, -std::numeric_limits<float>::min(), std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    ForwardArgs a = make_fwd(p);
    a.opts.softcap = bad;
    EXPECT_TRUE(IsError(flash3::validate_forward(a), StatusCode::kInvalidArgument, {"opts.softcap"})) << bad;
    EXPECT_TRUE(IsError(flash3::forward(a, nullptr), StatusCode::kInvalidArgument, {"opts.softcap"})) << bad;
    BackwardArgs b = make_bwd(p);
    b.opts.softcap = bad;
    EXPECT_TRUE(IsError(flash3::validate_backward(b), StatusCode::kInvalidArgument, {"opts.softcap"})) << bad;
    EXPECT_TRUE(IsError(flash3::backward(b, nullptr), StatusCode::kInvalidArgument, {"opts.softcap"})) << bad;
  }
}

// The kernel check's feature axis, directly: for every manifest (dtype, d, dv)
// and a pair never built, softcap 0 is the plain answer and softcap > 0 needs
// the softcap unit; the public *_is_built() report the plain kernels.
TEST(KernelCheck, SoftcapFeatureAxis) {
  const std::pair<int, int> dims[] = {  // every manifest pair (head_dims.inc) and one never built
#define FLASH3_HEAD_DIM(D, DV) {D, DV},
#include "head_dims.inc"
#undef FLASH3_HEAD_DIM
      {32, 32}};
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (const auto& [d, dv] : dims)
      for (bool fwd : {true, false}) {
        const std::string what = std::string(fwd ? "fwd " : "bwd ") + std::to_string(int(dt)) + " " +
                                 std::to_string(d) + "x" + std::to_string(dv);
        EXPECT_EQ(fwd ? flash3::forward_is_built(dt, d, dv) : flash3::backward_is_built(dt, d, dv),
                  fwd ? flash3::fwd_kernel_built(dt, d, dv) : flash3::bwd_kernel_built(dt, d, dv))
            << what;
        for (float softcap : {0.f, 5.f, 30.f})
          EXPECT_TRUE(IsKernelCheckAnswer(flash3::check_kernel_built(fwd, dt, d, dv, softcap), fwd, dt, d, dv, softcap))
              << what << " softcap " << softcap;
        EXPECT_TRUE(IsKernelCheckAnswer(flash3::check_kernel_built(fwd, dt, d, dv), fwd, dt, d, dv, 0.f)) << what;
      }
  // Never built: head_dim 32.
  EXPECT_FALSE(softcap_built(true, DType::kFloat16, 32, 32));
  EXPECT_FALSE(softcap_built(false, DType::kBFloat16, 32, 32));
}

TEST_F(ValidationForward, BuiltListNamesKernelsOrNone) {
  const std::string list = flash3::built_kernels_list(true);
  EXPECT_FALSE(list.empty());
  if (flash3::forward_is_built(DType::kBFloat16, 128, 128)) {
    EXPECT_NE(list.find("bf16 128x128"), std::string::npos) << list;
  } else if (!flash3::forward_is_built(DType::kFloat16, 128, 128) && !flash3::forward_is_built(DType::kBFloat16, 64, 64)) {
    EXPECT_EQ(list, "none");
  }
}

// ----------------------------------------------------------------------------
// Backward.
// ----------------------------------------------------------------------------
TEST_F(ValidationBackward, ValidArgumentsPassStructure) {
  const BackwardArgs a = make_bwd();
  EXPECT_TRUE(IsOk(flash3::check_backward_structure(a)));
  const Status s = flash3::validate_backward(a);
  if (flash3::backward_is_built(DType::kBFloat16, 64, 64)) {
    EXPECT_TRUE(IsOk(s));
  } else {
    EXPECT_TRUE(IsError(s, StatusCode::kNotSupported, {"backward kernel", "not built"}));
  }
}

TEST_F(ValidationBackward, WorkspaceSizeSoftcapAndTooSmallWorkspace) {
  BackwardArgs a = make_bwd();
  // b=2, sq=128, hq=8, d=64 with 64-row query blocks: LSE_log2 and D (8 KB each),
  // the fp32 dQ accumulator (512 KB) and the per-block counters (one 256-byte line).
  const size_t ws = flash3::backward_workspace_size(a);
  EXPECT_EQ(ws, 2 * 8192u + 524288u + 256u);
  BackwardArgs no_q = a;
  no_q.q = TensorView{};
  EXPECT_EQ(flash3::backward_workspace_size(no_q), 0u);
  // softcap changes no scratch (the same tiles and arrays).
  BackwardArgs capped = a;
  capped.opts.softcap = 30.f;
  EXPECT_EQ(flash3::backward_workspace_size(capped), ws);
  if (!flash3::backward_is_built(DType::kBFloat16, 64, 64)) GTEST_SKIP() << "not built: backward bf16 64x64";
  // A too-small workspace is reported after validation: with softcap too where
  // its unit is built (the kernel check lets it through; nothing launched).
  capped.workspace = a.q.data;
  capped.workspace_bytes = ws - 1;
  if (softcap_built(false, DType::kBFloat16, 64, 64)) {
    EXPECT_TRUE(IsError(flash3::backward(capped, nullptr), StatusCode::kInvalidArgument, {"workspace", "needed"}));
  } else {
    EXPECT_TRUE(IsError(flash3::backward(capped, nullptr), StatusCode::kNotSupported,
                        {"opts.softcap", "FLASH3_FEATURES"}));
  }
  BackwardArgs small = a;
  small.workspace = a.q.data;  // any device-looking pointer: rejected before use
  small.workspace_bytes = ws - 1;
  EXPECT_TRUE(IsError(flash3::backward(small, nullptr), StatusCode::kInvalidArgument, {"workspace", "needed"}));
}

TEST_F(ValidationBackward, MissingDout) {
  BackwardArgs a = make_bwd();
  a.dout = TensorView{};
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dout is missing"}));
  EXPECT_TRUE(IsError(flash3::backward(a, nullptr), StatusCode::kInvalidArgument, {"dout"}));
}

TEST_F(ValidationBackward, MissingLse) {
  BackwardArgs a = make_bwd();
  a.lse = TensorView{};
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"lse is missing"}));
}

TEST_F(ValidationBackward, DqShapeMismatch) {
  BackwardArgs a = make_bwd();
  a.dq = bshd(a.dq.data, a.dq.dtype, 2, 64, 8, 64);
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument,
                      {"dq.shape[1] (seqlen_q) is 64; expected 128 to match q"}));
}

TEST_F(ValidationBackward, DkDtypeMismatch) {
  BackwardArgs a = make_bwd();
  a.dk.dtype = DType::kFloat16;
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dk.dtype is fp16; expected bf16"}));
}

TEST_F(ValidationBackward, DvStrideNotMultipleOf8) {
  BackwardArgs a = make_bwd();
  a.dv.stride[2] = 68;
  a.dv.stride[1] = 136;
  a.dv.stride[0] = 136 * 256;
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dv.stride[2]", "multiple of 8"}));
}

TEST_F(ValidationBackward, DoutShapeMismatch) {
  BackwardArgs a = make_bwd();
  a.dout = bshd(a.dout.data, a.dout.dtype, 2, 128, 4, 64);
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument,
                      {"dout.shape[2] (num_heads_q) is 4; expected 8 to match out"}));
}

TEST_F(ValidationBackward, DlseOptionalButChecked) {
  BackwardArgs a = make_bwd();
  EXPECT_TRUE(IsOk(flash3::check_backward_structure(a)));  // no dlse
  a.dlse = a.lse;
  a.dlse.data = fake(0xC000000);
  EXPECT_TRUE(IsOk(flash3::check_backward_structure(a)));
  a.dlse.dtype = DType::kFloat16;
  EXPECT_TRUE(IsError(flash3::validate_backward(a), StatusCode::kInvalidArgument, {"dlse.dtype is fp16; expected fp32"}));
}

// ----------------------------------------------------------------------------
// make_fwd_params.
// ----------------------------------------------------------------------------
TEST_F(ValidationParams, DefaultScale) {
  ForwardArgs a = make_fwd();
  FwdParams p = flash3::make_fwd_params(a);
  EXPECT_FLOAT_EQ(p.softmax_scale, 0.125f);  // 1/sqrt(64)
  EXPECT_FLOAT_EQ(p.softmax_scale_log2, 0.125f * 1.4426950408889634f);
  a.opts.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FLOAT_EQ(flash3::make_fwd_params(a).softmax_scale, 0.125f);
  a.opts.softmax_scale = 0.5f;
  p = flash3::make_fwd_params(a);
  EXPECT_FLOAT_EQ(p.softmax_scale, 0.5f);
  EXPECT_FLOAT_EQ(p.softmax_scale_log2, 0.5f * 1.4426950408889634f);
}

TEST_F(ValidationParams, NoMaskByDefault) {
  const FwdParams p = flash3::make_fwd_params(make_fwd());
  EXPECT_FALSE(p.is_causal);
  EXPECT_FALSE(p.is_local);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
}

TEST_F(ValidationParams, ZeroScaleIsExactWithAFiniteExponentScale) {
  ForwardArgs a = make_fwd();
  a.opts.softmax_scale = 0.f;
  const FwdParams p = flash3::make_fwd_params(a);
  EXPECT_EQ(p.softmax_scale, 0.f);
  // -inf * 0 would be NaN for masked scores: the exponent uses FLT_MIN.
  EXPECT_EQ(p.softmax_scale_log2, std::numeric_limits<float>::min());
}

TEST_F(ValidationParams, WindowsFollowFlashAttention3) {
  // Dims: seqlen_q 128, seqlen_k 256.
  ForwardArgs a = make_fwd();
  struct Case {
    bool causal;
    int wl, wr;
    bool is_causal, is_local;
    int want_l, want_r;
  };
  const Case cases[] = {
      {false, INT32_MAX, -1, false, false, -1, -1},  // cuts nothing
      {false, -1, INT32_MAX, false, false, -1, -1},
      {false, INT32_MAX, 0, true, false, -1, 0},      // the causal mask
      {false, 255, 3, false, true, -1, 3},            // left >= seqlen_k - 1: unbounded
      {false, 254, 3, false, true, 254, 3},
      {false, 10, 127, false, true, 10, -1},          // right >= seqlen_q - 1: unbounded
      {false, 10, 126, false, true, 10, 126},
      {false, -5, -9, false, false, -1, -1},          // any negative side is unbounded
      {true, -1, 5, true, false, -1, 0},              // causal forces right = 0
      {true, 16, INT32_MAX, false, true, 16, 0},      // causal + finite left: local
      {true, INT32_MAX, 7, true, false, -1, 0},
  };
  for (const Case& c : cases) {
    a.opts.causal = c.causal;
    a.opts.window_left = c.wl;
    a.opts.window_right = c.wr;
    const FwdParams p = flash3::make_fwd_params(a);
    SCOPED_TRACE(testing::Message() << "causal " << c.causal << " window (" << c.wl << ", " << c.wr << ")");
    EXPECT_EQ(p.is_causal, c.is_causal);
    EXPECT_EQ(p.is_local, c.is_local);
    EXPECT_EQ(p.window_left, c.want_l);
    EXPECT_EQ(p.window_right, c.want_r);
  }
}

TEST_F(ValidationParams, CausalNormalisedToWindow) {
  ForwardArgs a = make_fwd();
  a.opts.causal = true;
  FwdParams p = flash3::make_fwd_params(a);
  EXPECT_TRUE(p.is_causal);
  EXPECT_FALSE(p.is_local);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, 0);
  // causal with a left window is a local mask with right = 0
  a.opts.window_left = 16;
  p = flash3::make_fwd_params(a);
  EXPECT_FALSE(p.is_causal);
  EXPECT_TRUE(p.is_local);
  EXPECT_EQ(p.window_left, 16);
  EXPECT_EQ(p.window_right, 0);
}

TEST_F(ValidationParams, SlidingWindowIsLocal) {
  ForwardArgs a = make_fwd();
  a.opts.window_left = 32;
  a.opts.window_right = 8;
  FwdParams p = flash3::make_fwd_params(a);
  EXPECT_TRUE(p.is_local);
  EXPECT_FALSE(p.is_causal);
  EXPECT_EQ(p.window_left, 32);
  EXPECT_EQ(p.window_right, 8);
  a.opts.window_left = -1;  // only a right bound
  a.opts.window_right = 4;
  p = flash3::make_fwd_params(a);
  EXPECT_TRUE(p.is_local);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, 4);
}

TEST_F(ValidationParams, StridesDimsAndPointersCopied) {
  const int64_t b = 2, s = 64, h = 4, d = 128;
  ForwardArgs a;
  const uintptr_t base = 0x10000000;
  a.q = TensorView::make4d(fake(base), DType::kFloat16, b, s, h, d, s * 3 * h * d, 3 * h * d, d, 1);
  a.k = TensorView::make4d(fake(base + 1024), DType::kFloat16, b, 2 * s, h / 2, d, 2 * s * h * d, h * d, 2 * d, 1);
  a.v = bshd(fake(0x30000000), DType::kFloat16, b, 2 * s, h / 2, d);
  a.out = bshd(fake(0x40000000), DType::kFloat16, b, s, h, d);
  a.lse = TensorView::make3d(fake(0x50000000), DType::kFloat32, b, h, s, h * 72, 72, 1);
  ASSERT_TRUE(IsOk(flash3::check_forward_structure(a)));
  const FwdParams p = flash3::make_fwd_params(a);
  EXPECT_EQ(p.q, a.q.data);
  EXPECT_EQ(p.k, a.k.data);
  EXPECT_EQ(p.v, a.v.data);
  EXPECT_EQ(p.o, a.out.data);
  EXPECT_EQ(static_cast<void*>(p.lse), a.lse.data);
  EXPECT_EQ(p.dtype, DType::kFloat16);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen_q, 64);
  EXPECT_EQ(p.seqlen_k, 128);
  EXPECT_EQ(p.heads_q, 4);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.head_dim_v, 128);
  EXPECT_EQ(p.q_batch_stride, s * 3 * h * d);
  EXPECT_EQ(p.q_row_stride, 3 * h * d);
  EXPECT_EQ(p.q_head_stride, d);
  EXPECT_EQ(p.k_batch_stride, 2 * s * h * d);
  EXPECT_EQ(p.k_row_stride, h * d);
  EXPECT_EQ(p.k_head_stride, 2 * d);
  EXPECT_EQ(p.v_batch_stride, 2 * s * (h / 2) * d);
  EXPECT_EQ(p.v_row_stride, (h / 2) * d);
  EXPECT_EQ(p.v_head_stride, d);
  EXPECT_EQ(p.o_batch_stride, s * h * d);
  EXPECT_EQ(p.o_row_stride, h * d);
  EXPECT_EQ(p.o_head_stride, d);
  EXPECT_EQ(p.lse_batch_stride, h * 72);
  EXPECT_EQ(p.lse_head_stride, 72);
}

TEST_F(ValidationParams, FixedLengthIsNotVarlen) {
  const FwdParams p = flash3::make_fwd_params(make_fwd());
  EXPECT_FALSE(p.varlen);
  EXPECT_EQ(p.cu_seqlens_q, nullptr);
  EXPECT_EQ(p.cu_seqlens_k, nullptr);
  EXPECT_EQ(p.seqused_q, nullptr);
  EXPECT_EQ(p.seqused_k, nullptr);
  EXPECT_EQ(p.max_seqlen_q, 0);
  EXPECT_EQ(p.max_seqlen_k, 0);
}

TEST_F(ValidationParams, VarlenLowering) {
  const int64_t tq = 300, tk = 500, hq = 8, hkv = 2, d = 64, dv = 128;
  ForwardArgs a = make_varlen(tq, tk);
  // q rows of a packed (total, 3, hq, d) QKV; k / v heads interleaved; lse rows padded.
  a.q = TensorView::make3d(fake(0x10000000), DType::kBFloat16, tq, hq, d, 3 * hq * d, d, 1);
  a.k = TensorView::make3d(fake(0x20000000), DType::kBFloat16, tk, hkv, d, 2 * hkv * d, 2 * d, 1);
  a.v = TensorView::make3d(fake(0x30000000), DType::kBFloat16, tk, hkv, dv, hkv * dv, dv, 1);
  a.out = TensorView::make3d(fake(0x40000000), DType::kBFloat16, tq, hq, dv, hq * dv, dv, 1);
  a.lse = TensorView{};
  a.lse.data = fake(0x50000000);
  a.lse.dtype = DType::kFloat32;
  a.lse.ndim = 2;
  a.lse.shape[0] = hq;
  a.lse.shape[1] = tq;
  a.lse.stride[0] = 304;
  a.lse.stride[1] = 1;
  a.opts.num_sequences = 7;
  a.opts.seqused_q = static_cast<const int*>(fake(0xC000000));
  a.opts.seqused_k = static_cast<const int*>(fake(0xD000000));
  ASSERT_TRUE(IsOk(flash3::check_forward_structure(a)));
  const FwdParams p = flash3::make_fwd_params(a);
  EXPECT_TRUE(p.varlen);
  EXPECT_EQ(p.cu_seqlens_q, a.opts.cu_seqlens_q);
  EXPECT_EQ(p.cu_seqlens_k, a.opts.cu_seqlens_k);
  EXPECT_EQ(p.seqused_q, a.opts.seqused_q);
  EXPECT_EQ(p.seqused_k, a.opts.seqused_k);
  EXPECT_EQ(p.max_seqlen_q, 200);
  EXPECT_EQ(p.max_seqlen_k, 300);
  EXPECT_EQ(p.q, a.q.data);
  EXPECT_EQ(p.k, a.k.data);
  EXPECT_EQ(p.v, a.v.data);
  EXPECT_EQ(p.o, a.out.data);
  EXPECT_EQ(static_cast<void*>(p.lse), a.lse.data);
  // batch = sequences, seqlen = total rows.
  EXPECT_EQ(p.batch, 7);
  EXPECT_EQ(p.seqlen_q, tq);
  EXPECT_EQ(p.seqlen_k, tk);
  EXPECT_EQ(p.heads_q, hq);
  EXPECT_EQ(p.heads_kv, hkv);
  EXPECT_EQ(p.head_dim, d);
  EXPECT_EQ(p.head_dim_v, dv);
  // Row = stride[0], head = stride[1], no batch stride.
  EXPECT_EQ(p.q_batch_stride, 0);
  EXPECT_EQ(p.q_row_stride, 3 * hq * d);
  EXPECT_EQ(p.q_head_stride, d);
  EXPECT_EQ(p.k_batch_stride, 0);
  EXPECT_EQ(p.k_row_stride, 2 * hkv * d);
  EXPECT_EQ(p.k_head_stride, 2 * d);
  EXPECT_EQ(p.v_batch_stride, 0);
  EXPECT_EQ(p.v_row_stride, hkv * dv);
  EXPECT_EQ(p.v_head_stride, dv);
  EXPECT_EQ(p.o_batch_stride, 0);
  EXPECT_EQ(p.o_row_stride, hq * dv);
  EXPECT_EQ(p.o_head_stride, dv);
  // lse (hq, total_q).
  EXPECT_EQ(p.lse_batch_stride, 0);
  EXPECT_EQ(p.lse_head_stride, 304);
  EXPECT_FALSE(p.is_causal);
  EXPECT_FALSE(p.is_local);
}

TEST_F(ValidationParams, VarlenWindowNormalisedWithMaxSeqlen) {
  // max_seqlen_q = 200, max_seqlen_k = 300 while the totals are 300 and 500:
  // the window is normalised with the maxima, not the totals.
  ForwardArgs a = make_varlen(300, 500);
  a.opts.window_left = 299;   // >= max_seqlen_k - 1: cuts nothing
  a.opts.window_right = 199;  // >= max_seqlen_q - 1: cuts nothing
  FwdParams p = flash3::make_fwd_params(a);
  EXPECT_FALSE(p.is_local);
  EXPECT_FALSE(p.is_causal);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  a.opts.window_left = 298;
  a.opts.window_right = 198;
  p = flash3::make_fwd_params(a);
  EXPECT_TRUE(p.is_local);
  EXPECT_EQ(p.window_left, 298);
  EXPECT_EQ(p.window_right, 198);
  // Causal: right = 0; a left side that cuts nothing in the longest sequence leaves plain causal.
  a.opts.causal = true;
  a.opts.window_left = 400;
  p = flash3::make_fwd_params(a);
  EXPECT_TRUE(p.is_causal);
  EXPECT_FALSE(p.is_local);
  EXPECT_EQ(p.window_right, 0);
  a.opts.window_left = 64;
  p = flash3::make_fwd_params(a);
  EXPECT_FALSE(p.is_causal);
  EXPECT_TRUE(p.is_local);
  EXPECT_EQ(p.window_left, 64);
  EXPECT_EQ(p.window_right, 0);
  // The lengths in the params stay the totals.
  EXPECT_EQ(p.seqlen_q, 300);
  EXPECT_EQ(p.seqlen_k, 500);
}

TEST_F(ValidationParams, PackGqaCopied) {
  ForwardArgs a = make_fwd();
  EXPECT_EQ(flash3::make_fwd_params(a).pack_gqa, -1);  // the default: heuristic
  for (int v : {-1, 0, 1}) {
    a.opts.pack_gqa = v;
    EXPECT_EQ(flash3::make_fwd_params(a).pack_gqa, v);
    ForwardArgs l = make_varlen();
    l.opts.pack_gqa = v;
    EXPECT_EQ(flash3::make_fwd_params(l).pack_gqa, v);
  }
}

TEST_F(ValidationParams, NumSplitsCopied) {
  ForwardArgs a = make_fwd();
  EXPECT_EQ(flash3::make_fwd_params(a).num_splits, 1);  // the default: no split
  for (int v : {0, 1, 2, 7, 256}) {
    a.opts.num_splits = v;
    EXPECT_EQ(flash3::make_fwd_params(a).num_splits, v);
    ForwardArgs l = make_varlen();
    l.opts.num_splits = v;
    EXPECT_EQ(flash3::make_fwd_params(l).num_splits, v);
  }
}

TEST_F(ValidationParams, NoLseGivesNullPointer) {
  const FwdParams p = flash3::make_fwd_params(make_fwd({}, /*with_lse=*/false));
  EXPECT_EQ(p.lse, nullptr);
}

// ----------------------------------------------------------------------------
// TensorView helpers.
// ----------------------------------------------------------------------------
TEST(ValidationTensorView, ContiguousStridesAndNumel) {
  const int64_t shape[4] = {2, 3, 4, 8};
  const TensorView t = TensorView::contiguous(fake(0x1000), DType::kFloat16, 4, shape);
  EXPECT_EQ(t.ndim, 4);
  EXPECT_EQ(t.stride[0], 96);
  EXPECT_EQ(t.stride[1], 32);
  EXPECT_EQ(t.stride[2], 8);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.numel(), 192);
  EXPECT_FALSE(TensorView{}.defined());
  EXPECT_EQ(TensorView{}.numel(), 0);
  EXPECT_STREQ(flash3::dtype_name(DType::kBFloat16), "bf16");
  EXPECT_EQ(flash3::dtype_size(DType::kFloat32), 4);
  EXPECT_EQ(flash3::dtype_size(DType::kFloat8E4M3), 1);
  EXPECT_STREQ(flash3::version(), FLASH3_VERSION_STRING);
}

// ----------------------------------------------------------------------------
// Device checks on whatever machine runs the tests (CPU-only here): errors,
// never crashes.
// ----------------------------------------------------------------------------
class ValidationDevice : public ::testing::Test {
 protected:
  flash3::testutil::DeviceChecks checks_{true};
};

TEST_F(ValidationDevice, ForwardWithoutSkipFailsCleanly) {
  ASSERT_FALSE(flash3::device_check_skipped());
  // Fake addresses are never valid device memory: whatever the machine, forward()
  // must refuse them (no CUDA -> CudaError; a GPU -> InvalidArgument; no kernel
  // for the request -> NotSupported).
  const Status s = flash3::forward(make_fwd(), nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code == StatusCode::kCudaError || s.code == StatusCode::kInvalidArgument ||
              s.code == StatusCode::kNotSupported)
      << code_name(s.code) << ": " << s.message;
  EXPECT_FALSE(s.message.empty());
  // The device checks themselves: CudaError without a GPU, host pointer with one.
  const Status d = flash3::check_forward_device(make_fwd());
  EXPECT_TRUE(d.code == StatusCode::kCudaError || d.code == StatusCode::kInvalidArgument) << code_name(d.code) << ": " << d.message;
  if (d.code == StatusCode::kInvalidArgument) {
    EXPECT_NE(d.message.find("q.data"), std::string::npos) << d.message;
  }
}

TEST_F(ValidationDevice, HostPointerRejected) {
  alignas(16) static uint16_t host[64];
  const Status s = flash3::check_device_pointer("q.data", host);
  if (s.code == StatusCode::kCudaError) {
    EXPECT_NE(s.message.find("cuda"), std::string::npos) << s.message;  // names the CUDA call / error
  } else {
    EXPECT_TRUE(IsError(s, StatusCode::kInvalidArgument, {"q.data is a host pointer", "expected device memory on device"}));
  }
}

TEST_F(ValidationDevice, VarlenArraysMustBeDeviceMemory) {
  // Host arrays: CudaError without a GPU, InvalidArgument naming the option with one.
  alignas(16) static int host[8];
  for (const char* name : {"opts.cu_seqlens_q", "opts.cu_seqlens_k", "opts.seqused_q", "opts.seqused_k"}) {
    const Status s = flash3::check_device_pointer(name, host);
    if (s.code == StatusCode::kCudaError) {
      // No usable driver: every runtime call (cudaGetLastError() too) reports it.
      EXPECT_NE(s.message.find("cuda"), std::string::npos) << s.message;
    } else {
      EXPECT_TRUE(IsError(s, StatusCode::kInvalidArgument, {name, "is a host pointer", "expected device memory"}));
      // With a GPU: the check leaves no error of its own pending.
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    }
  }
  // The device checks of a call cover the arrays (no tensors here: the arrays are checked first).
  ForwardArgs a;
  a.opts.cu_seqlens_q = host;
  a.opts.cu_seqlens_k = host;
  a.opts.seqused_k = host + 1;
  const Status d = flash3::check_forward_device(a);
  EXPECT_TRUE(d.code == StatusCode::kCudaError || d.code == StatusCode::kInvalidArgument) << code_name(d.code) << ": " << d.message;
  if (d.code == StatusCode::kInvalidArgument) {
    EXPECT_NE(d.message.find("opts.cu_seqlens_q is a host pointer"), std::string::npos) << d.message;
  }
  a.opts.cu_seqlens_q = a.opts.cu_seqlens_k = nullptr;
  BackwardArgs b;
  b.opts.seqused_q = host;
  const Status e = flash3::check_backward_device(b);
  EXPECT_TRUE(e.code == StatusCode::kCudaError || e.code == StatusCode::kInvalidArgument) << code_name(e.code) << ": " << e.message;
  if (e.code == StatusCode::kInvalidArgument) {
    EXPECT_NE(e.message.find("opts.seqused_q is a host pointer"), std::string::npos) << e.message;
  }
}

TEST_F(ValidationDevice, VarlenHostArraysPassWhenDeviceCheckSkipped) {
  // The skip rule covers the varlen arrays like the tensors.
  alignas(16) static int host[8];
  ForwardArgs a = make_varlen();
  a.opts.cu_seqlens_q = a.opts.cu_seqlens_k = host;
  a.opts.seqused_q = a.opts.seqused_k = host;
  const Status unchecked = flash3::validate_forward(a);
  EXPECT_FALSE(unchecked.ok());  // fake tensors / no GPU / not built
  checks_.set(false);
  expect_valid_forward(a);
}

TEST_F(ValidationDevice, DeviceChecksSwitch) {
  EXPECT_FALSE(flash3::device_check_skipped());
  checks_.set(false);
  EXPECT_TRUE(flash3::device_check_skipped());
  checks_.set(true);
  EXPECT_FALSE(flash3::device_check_skipped());
}

TEST_F(ValidationDevice, DeviceIsSupportedExplains) {
  std::string why = "unchanged";
  const bool ok = flash3::device_is_supported(&why);
  if (ok) {
    EXPECT_TRUE(why.empty());
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_TRUE(why.find("no CUDA device") != std::string::npos || why.find("sm_90") != std::string::npos ||
                why.find("device") != std::string::npos)
        << why;
  }
  EXPECT_EQ(flash3::device_is_supported(nullptr), ok);
}

}  // namespace
