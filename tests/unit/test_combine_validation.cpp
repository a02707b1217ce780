// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests of the split-KV combine's host layer: validate_combine() (every
// bad argument rejected with a message naming it and the value seen), the
// empty-problem fast path, make_combine_params() lowering, the C ABI's
// flash3_combine (split dimension passed apart) and the 5-d TensorView.
//
// Tensors use fake, suitably aligned device addresses; nothing is dereferenced
// or launched (every call below fails validation or is empty).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "api/validate.h"
#include "combine/combine.h"
#include "flash3/flash3.h"
#include "flash3/flash3_c.h"
#include "plan/lower.h"
#include "skip_device_check.h"
#include "status_matchers.h"

namespace {

using flash3::unittest::IsError;
using flash3::unittest::IsOk;

using flash3::CombineArgs;
using flash3::DType;
using flash3::Status;
using flash3::StatusCode;
using flash3::TensorView;

void* fake(uintptr_t addr) { return reinterpret_cast<void*>(addr); }

struct Dims {
  int64_t splits = 3, b = 2, s = 5, h = 4, d = 64;
  DType out_dt = DType::kBFloat16;
};

TensorView contiguous(void* p, DType dt, std::initializer_list<int64_t> shape) {
  int64_t sh[flash3::kMaxTensorDims] = {};
  int n = 0;
  for (int64_t x : shape) sh[n++] = x;
  return TensorView::contiguous(p, dt, n, sh);
}

CombineArgs make_args(const Dims& p = {}, bool with_lse = true) {
  CombineArgs a;
  a.out_partial = contiguous(fake(0x10000000), DType::kFloat32, {p.splits, p.b, p.s, p.h, p.d});
  a.lse_partial = contiguous(fake(0x20000000), DType::kFloat32, {p.splits, p.b, p.s, p.h});
  a.out = contiguous(fake(0x30000000), p.out_dt, {p.b, p.s, p.h, p.d});
  if (with_lse) a.lse = contiguous(fake(0x40000000), DType::kFloat32, {p.b, p.s, p.h});
  return a;
}

// validate_combine and combine both reject `a` before launching anything.
void expect_rejected(const CombineArgs& a, std::initializer_list<std::string> subs) {
  EXPECT_TRUE(IsError(flash3::validate_combine(a), StatusCode::kInvalidArgument, subs));
  EXPECT_TRUE(IsError(flash3::combine(a, nullptr), StatusCode::kInvalidArgument, subs));
}

class CombineValidation : public flash3::testutil::SkipDeviceCheckTest {};

TEST(TensorView, FiveDims) {
  const int64_t shape[5] = {3, 2, 5, 4, 8};
  const TensorView t = TensorView::contiguous(fake(0x1000), DType::kFloat32, 5, shape);
  EXPECT_EQ(t.ndim, 5);
  const int64_t want[5] = {320, 160, 32, 8, 1};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t.shape[i], shape[i]) << i;
    EXPECT_EQ(t.stride[i], want[i]) << i;
  }
  EXPECT_EQ(t.numel(), 960);
  // make4d / make3d leave the fifth entry 0.
  const TensorView m = TensorView::make4d(fake(0x1000), DType::kBFloat16, 1, 2, 3, 4, 24, 12, 4, 1);
  EXPECT_EQ(m.shape[4], 0);
  EXPECT_EQ(m.stride[4], 0);
  EXPECT_EQ(m.numel(), 24);
  // An out-of-range ndim is kept for validation to report.
  const TensorView bad = TensorView::contiguous(fake(0x1000), DType::kFloat32, 6, shape);
  EXPECT_EQ(bad.ndim, 6);
}

TEST_F(CombineValidation, ValidArgumentsPass) {
  EXPECT_TRUE(IsOk(flash3::validate_combine(make_args())));
  EXPECT_TRUE(IsOk(flash3::validate_combine(make_args({}, /*with_lse=*/false))));
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32})
    for (int64_t splits : {1, 2, 7, 256})
      for (int64_t d : {4, 36, 64, 128, 256}) {
        Dims p;
        p.out_dt = dt;
        p.splits = splits;
        p.d = d;
        EXPECT_TRUE(IsOk(flash3::validate_combine(make_args(p)))) << splits << " " << d;
      }
  // FlashAttention-3's softmax_lse: a (b, s, h) view of a (b, h, s) tensor.
  CombineArgs a = make_args();
  a.lse = TensorView::make3d(fake(0x40000000), DType::kFloat32, 2, 5, 4, 20, 1, 5);
  EXPECT_TRUE(IsOk(flash3::validate_combine(a)));
  // lse_partial with any strides (FlashAttention-3's (splits, b, h, s) storage).
  a.lse_partial = TensorView{};
  a.lse_partial.data = fake(0x20000000);
  a.lse_partial.dtype = DType::kFloat32;
  a.lse_partial.ndim = 4;
  const int64_t lp_shape[4] = {3, 2, 5, 4}, lp_stride[4] = {40, 20, 1, 5};
  for (int i = 0; i < 4; ++i) a.lse_partial.shape[i] = lp_shape[i], a.lse_partial.stride[i] = lp_stride[i];
  EXPECT_TRUE(IsOk(flash3::validate_combine(a)));
  // Strided out (every other head) and strided partials (row stride padded).
  CombineArgs s = make_args();
  s.out.stride[2] = 128;
  s.out.stride[1] = 4 * 128;
  s.out.stride[0] = 5 * 4 * 128;
  s.out_partial.stride[3] = 68;
  s.out_partial.stride[2] = 4 * 68;
  s.out_partial.stride[1] = 5 * 4 * 68;
  s.out_partial.stride[0] = 2 * 5 * 4 * 68;
  EXPECT_TRUE(IsOk(flash3::validate_combine(s)));
}

TEST_F(CombineValidation, EmptyProblemsLaunchNothing) {
  for (int which : {1, 2, 3}) {
    Dims p;
    if (which == 1) p.b = 0;
    if (which == 2) p.s = 0;
    if (which == 3) p.h = 0;
    CombineArgs a = make_args(p);
    a.out_partial.data = a.lse_partial.data = a.out.data = a.lse.data = nullptr;  // empty: no data needed
    EXPECT_TRUE(IsOk(flash3::validate_combine(a))) << which;
    EXPECT_TRUE(IsOk(flash3::combine(a, nullptr))) << which;  // nothing launched (no GPU here)
  }
}

TEST_F(CombineValidation, Missing) {
  CombineArgs a = make_args();
  a.out_partial = TensorView{};
  expect_rejected(a, {"out_partial is missing", "(num_splits, batch, seqlen, heads, head_dim)"});
  a = make_args();
  a.lse_partial = TensorView{};
  expect_rejected(a, {"lse_partial is missing", "(num_splits, batch, seqlen, heads)"});
  a = make_args();
  a.out = TensorView{};
  expect_rejected(a, {"out is missing", "(batch, seqlen, heads, head_dim)"});
  // A shape without data is an error, not "absent".
  a = make_args();
  a.lse.data = nullptr;
  expect_rejected(a, {"lse.data is null"});
}

TEST_F(CombineValidation, Ndim) {
  CombineArgs a = make_args();
  a.out_partial.ndim = 4;
  expect_rejected(a, {"out_partial.ndim is 4; expected 5"});
  a = make_args();
  a.lse_partial.ndim = 5;
  expect_rejected(a, {"lse_partial.ndim is 5; expected 4"});
  a = make_args();
  a.out.ndim = 3;
  expect_rejected(a, {"out.ndim is 3; expected 4"});
  a = make_args();
  a.lse.ndim = 2;
  expect_rejected(a, {"lse.ndim is 2; expected 3"});
  a = make_args();
  a.out_partial.ndim = 6;
  expect_rejected(a, {"out_partial.ndim is 6"});
}

TEST_F(CombineValidation, Sizes) {
  CombineArgs a = make_args();
  a.out_partial.shape[2] = -1;
  expect_rejected(a, {"out_partial.shape[2] (seqlen) is -1; expected >= 0"});
  a = make_args();
  a.out.shape[1] = int64_t(1) << 31;
  expect_rejected(a, {"out.shape[1] (seqlen) is 2147483648", "INT32_MAX"});
  a = make_args();
  a.out_partial.data = nullptr;
  expect_rejected(a, {"out_partial.data is null"});
}

TEST_F(CombineValidation, Dtypes) {
  CombineArgs a = make_args();
  a.out_partial.dtype = DType::kBFloat16;
  expect_rejected(a, {"out_partial.dtype is bf16; expected fp32"});
  a = make_args();
  a.lse_partial.dtype = DType::kFloat16;
  expect_rejected(a, {"lse_partial.dtype is fp16; expected fp32"});
  a = make_args();
  a.out.dtype = DType::kFloat8E4M3;
  expect_rejected(a, {"out.dtype is fp8_e4m3; expected bf16, fp16 or fp32"});
  a = make_args();
  a.out.dtype = static_cast<DType>(42);
  expect_rejected(a, {"out.dtype is unknown (42)"});
  a = make_args();
  a.lse.dtype = DType::kBFloat16;
  expect_rejected(a, {"lse.dtype is bf16; expected fp32"});
}

TEST_F(CombineValidation, NumSplitsAndHeadDim) {
  for (int64_t bad : {0, 257, 1000}) {
    Dims p;
    p.splits = bad;
    expect_rejected(make_args(p), {"out_partial.shape[0] (num_splits) is " + std::to_string(bad) + "; expected 1 to 256"});
  }
  for (int64_t bad : {0, 2, 6, 65, 516, 1024}) {
    Dims p;
    p.d = bad;
    expect_rejected(make_args(p), {"unsupported head dim", "out_partial.shape[4] (head_dim) is " + std::to_string(bad),
                                   "multiple of 4 in [4, 512]"});
  }
  // Up to FlashAttention-3's MLA value dim (512).
  for (int64_t good : {4, 260, 384, 512}) {
    Dims p;
    p.d = good;
    EXPECT_TRUE(IsOk(flash3::check_combine_structure(make_args(p)))) << good;
  }
}

TEST_F(CombineValidation, ShapeMismatch) {
  CombineArgs a = make_args();
  a.lse_partial.shape[0] = 2;
  expect_rejected(a, {"lse_partial.shape[0] (num_splits) is 2; expected 3 to match out_partial.shape[0]"});
  a = make_args();
  a.lse_partial.shape[3] = 5;
  expect_rejected(a, {"lse_partial.shape[3] (heads) is 5; expected 4"});
  a = make_args();
  a.out.shape[0] = 3;
  expect_rejected(a, {"out.shape[0] (batch) is 3; expected 2 to match out_partial.shape[1]"});
  a = make_args();
  a.out.shape[3] = 32;
  expect_rejected(a, {"out.shape[3] (head_dim) is 32; expected 64 to match out_partial.shape[4]"});
  a = make_args();
  a.lse.shape[2] = 8;
  expect_rejected(a, {"lse.shape[2] (heads) is 8; expected 4 to match out_partial.shape[3]"});
}

TEST_F(CombineValidation, StridesAndAlignment) {
  CombineArgs a = make_args();
  a.out_partial.stride[4] = 2;
  expect_rejected(a, {"out_partial.stride[4] (head_dim) is 2; expected 1"});
  a = make_args();
  a.out.stride[3] = 2;
  expect_rejected(a, {"out.stride[3] (head_dim) is 2; expected 1"});
  a = make_args();
  a.out_partial.stride[2] = 4 * 64 + 2;
  expect_rejected(a, {"out_partial.stride[2] (seqlen) is 258; expected a multiple of 4 elements"});
  a = make_args();
  a.out_partial.stride[0] = 6;
  expect_rejected(a, {"out_partial.stride[0] (num_splits) is 6; expected a multiple of 4"});
  a = make_args();
  a.out_partial.data = fake(0x10000008);
  expect_rejected(a, {"out_partial.data (0x10000008) is not 16-byte aligned"});
  a = make_args();
  a.out.data = fake(0x30000001);
  expect_rejected(a, {"out.data (0x30000001) is not 2-byte aligned"});
  a = make_args();
  a.lse_partial.data = fake(0x20000002);
  expect_rejected(a, {"lse_partial.data (0x20000002) is not 4-byte aligned"});
  a = make_args();
  a.lse_partial.stride[1] = -1;
  expect_rejected(a, {"lse_partial.stride[1] (batch) is -1; expected >= 0"});
  // Written tensors: no zero strides, no self overlap. Inputs may broadcast.
  a = make_args();
  a.out.stride[2] = 0;
  expect_rejected(a, {"out.stride[2] (heads) is 0 while out.shape[2] (heads) is 4", "non-zero stride"});
  a = make_args();
  a.out.stride[1] = 64;  // rows overlap heads
  expect_rejected(a, {"out has shape (2, 5, 4, 64)", "overlap"});
  a = make_args();
  a.lse.stride[0] = 0;
  expect_rejected(a, {"lse.stride[0] (batch) is 0"});
  a = make_args();
  a.lse_partial.stride[0] = 0;  // read only: broadcast over splits is fine
  EXPECT_TRUE(IsOk(flash3::validate_combine(a)));
  // A dimension of size 1 may carry any stride.
  Dims p;
  p.splits = 1;
  a = make_args(p);
  a.out_partial.stride[0] = 3;
  a.lse_partial.stride[0] = -7;
  EXPECT_TRUE(IsOk(flash3::validate_combine(a)));
}

TEST_F(CombineValidation, Aliasing) {
  CombineArgs a = make_args();
  a.out.data = a.out_partial.data;
  a.out.dtype = DType::kFloat32;
  expect_rejected(a, {"out (data 0x10000000", "overlaps out_partial", "is read"});
  a = make_args();
  a.lse.data = a.lse_partial.data;
  expect_rejected(a, {"lse (data 0x20000000", "overlaps lse_partial"});
  a = make_args();
  a.lse.data = fake(0x30000000 + 64);  // inside out
  expect_rejected(a, {"lse (data 0x30000040", "overlaps out", "is written too"});
  a = make_args();
  a.out.data = fake(0x20000000);  // out over lse_partial
  expect_rejected(a, {"out (data 0x20000000", "overlaps lse_partial"});
}

TEST_F(CombineValidation, LowersStrides) {
  CombineArgs a = make_args();
  a.lse = TensorView::make3d(fake(0x40000000), DType::kFloat32, 2, 5, 4, 20, 1, 5);
  const flash3::CombineParams p = flash3::make_combine_params(a);
  EXPECT_EQ(p.num_splits, 3);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen, 5);
  EXPECT_EQ(p.heads, 4);
  EXPECT_EQ(p.head_dim, 64);
  EXPECT_EQ(p.out_dtype, DType::kBFloat16);
  EXPECT_EQ(p.op_split_stride, 2 * 5 * 4 * 64);
  EXPECT_EQ(p.op_batch_stride, 5 * 4 * 64);
  EXPECT_EQ(p.op_row_stride, 4 * 64);
  EXPECT_EQ(p.op_head_stride, 64);
  EXPECT_EQ(p.lp_split_stride, 40);
  EXPECT_EQ(p.lp_batch_stride, 20);
  EXPECT_EQ(p.lp_row_stride, 4);
  EXPECT_EQ(p.lp_head_stride, 1);
  EXPECT_EQ(p.o_batch_stride, 5 * 4 * 64);
  EXPECT_EQ(p.o_row_stride, 4 * 64);
  EXPECT_EQ(p.o_head_stride, 64);
  EXPECT_EQ(p.lse_batch_stride, 20);
  EXPECT_EQ(p.lse_row_stride, 1);
  EXPECT_EQ(p.lse_head_stride, 5);
  EXPECT_EQ(p.seqs, nullptr);
  // Dimensions of size 1: stride 0 (the caller's stride there is never used
  // and must not break the kernel's alignment).
  Dims one;
  one.splits = 1;
  one.b = 1;
  CombineArgs b = make_args(one, /*with_lse=*/false);
  b.out_partial.stride[0] = 3;
  b.out_partial.stride[1] = 5;
  const flash3::CombineParams q = flash3::make_combine_params(b);
  EXPECT_EQ(q.op_split_stride, 0);
  EXPECT_EQ(q.op_batch_stride, 0);
  EXPECT_EQ(q.lse, nullptr);
}

// ---------------------------------------------------------------------------
// C ABI.
// ---------------------------------------------------------------------------
flash3_tensor c_tensor(uintptr_t addr, int32_t dtype, std::initializer_list<int64_t> shape) {
  flash3_tensor t{};
  t.data = reinterpret_cast<void*>(addr);
  t.dtype = dtype;
  t.ndim = int32_t(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t running = 1;
  for (int j = t.ndim - 1; j >= 0; --j) {
    t.stride[j] = running;
    running *= t.shape[j] > 0 ? t.shape[j] : 1;
  }
  return t;
}

struct CCombine {
  // Split 0's views of (3, 2, 5, 4, 64) / (3, 2, 5, 4) partials.
  flash3_tensor op = c_tensor(0x10000000, FLASH3_FP32, {2, 5, 4, 64});
  flash3_tensor lp = c_tensor(0x20000000, FLASH3_FP32, {2, 5, 4});
  flash3_tensor out = c_tensor(0x30000000, FLASH3_BF16, {2, 5, 4, 64});
  flash3_tensor lse = c_tensor(0x40000000, FLASH3_FP32, {2, 5, 4});
  int64_t op_split = 2 * 5 * 4 * 64, lp_split = 2 * 5 * 4;
  int32_t splits = 3;
  flash3_status run(bool with_lse = true) const {
    return flash3_combine(&op, op_split, &lp, lp_split, splits, &out, with_lse ? &lse : nullptr, nullptr);
  }
};

bool contains(const char* s, const std::string& sub) { return std::string(s).find(sub) != std::string::npos; }

TEST_F(CombineValidation, CAbiRejectsBeforeLaunch) {
  CCombine c;
  c.splits = 0;
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "flash3_combine: num_splits is 0; expected 1 to 256")) << flash3_last_error();
  c = CCombine{};
  c.splits = 257;
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "num_splits is 257")) << flash3_last_error();
  c = CCombine{};
  c.op_split = -4;
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "out_partial_split_stride is -4")) << flash3_last_error();
  c = CCombine{};
  c.op_split = 6;  // not a multiple of 4 elements
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "out_partial.stride[0] (num_splits) is 6")) << flash3_last_error();
  c = CCombine{};
  c.op.ndim = 3;
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "out_partial.ndim is 3; expected 4")) << flash3_last_error();
  c = CCombine{};
  c.lp.shape[2] = 5;
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "lse_partial.shape[3] (heads) is 5")) << flash3_last_error();
  c = CCombine{};
  c.out.dtype = 9;
  EXPECT_EQ(c.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "out.dtype is 9")) << flash3_last_error();
  c = CCombine{};
  EXPECT_EQ(flash3_combine(nullptr, 0, &c.lp, c.lp_split, 3, &c.out, nullptr, nullptr), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "out_partial is NULL")) << flash3_last_error();
  // An empty problem is OK and launches nothing (no GPU needed).
  c = CCombine{};
  c.op.shape[0] = c.lp.shape[0] = c.out.shape[0] = c.lse.shape[0] = 0;
  EXPECT_EQ(c.run(), FLASH3_OK) << flash3_last_error();
}

TEST(CombineCApi, OptionsNumSplits) {
  flash3_options o = flash3_default_options();
  EXPECT_EQ(o.num_splits, 1);
  EXPECT_EQ(o.reserved0, 0);
  EXPECT_EQ(offsetof(flash3_options, pack_gqa) + sizeof(int32_t), offsetof(flash3_options, num_splits));
  // The layout ending at pack_gqa had num_splits's bytes as padding: its size
  // must differ from this header's.
  const size_t pack_gqa_layout = (offsetof(flash3_options, pack_gqa) + sizeof(int32_t) + alignof(flash3_options) - 1) /
                                 alignof(flash3_options) * alignof(flash3_options);
  EXPECT_LT(pack_gqa_layout, sizeof(flash3_options));
}

TEST_F(CombineValidation, CAbiNumSplitsOption) {
  // Forward validation through the C ABI: bad num_splits named; a caller of the
  // pack_gqa layout (struct_size without num_splits) keeps the default.
  flash3_tensor q = c_tensor(0x1000000, FLASH3_BF16, {2, 128, 8, 64});
  flash3_tensor k = c_tensor(0x2000000, FLASH3_BF16, {2, 256, 2, 64});
  flash3_tensor v = c_tensor(0x3000000, FLASH3_BF16, {2, 256, 2, 64});
  flash3_tensor out = c_tensor(0x4000000, FLASH3_BF16, {2, 128, 8, 64});
  flash3_options o = flash3_default_options();
  o.num_splits = 300;
  EXPECT_EQ(flash3_validate_forward(&q, &k, &v, &out, nullptr, &o), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "opts.num_splits is 300")) << flash3_last_error();
  o.num_splits = -1;
  EXPECT_EQ(flash3_validate_forward(&q, &k, &v, &out, nullptr, &o), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(flash3_last_error(), "opts.num_splits is -1")) << flash3_last_error();
  const flash3_status valid =
      flash3_forward_is_built(FLASH3_BF16, 64, 64) ? FLASH3_OK : FLASH3_NOT_SUPPORTED;
  o.struct_size = static_cast<uint32_t>((offsetof(flash3_options, pack_gqa) + sizeof(int32_t) + alignof(flash3_options) - 1) /
                                        alignof(flash3_options) * alignof(flash3_options));
  EXPECT_EQ(flash3_validate_forward(&q, &k, &v, &out, nullptr, &o), valid) << flash3_last_error();
  for (int32_t ok : {0, 1, 2, 256}) {
    flash3_options n = flash3_default_options();
    n.num_splits = ok;
    EXPECT_EQ(flash3_validate_forward(&q, &k, &v, &out, nullptr, &n), valid) << ok << ": " << flash3_last_error();
  }
}

}  // namespace
