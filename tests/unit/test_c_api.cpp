// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests of the C ABI (include/flash3/flash3_c.h): defaults, status codes,
// flash3_last_error(), NULL handling and agreement with the C++ API. Uses fake,
// aligned device addresses with the device checks off (nothing is launched).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

#include "skip_device_check.h"
#include "flash3/flash3.h"
#include "flash3/flash3_c.h"
#include "launch/dispatch.h"  // the softcap units (the manifest's feature axis)

namespace {


flash3_tensor tensor(uintptr_t addr, int32_t dtype, int32_t ndim, std::initializer_list<int64_t> shape) {
  flash3_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = reinterpret_cast<void*>(addr);
  t.dtype = dtype;
  t.ndim = ndim;
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t running = 1;
  for (int j = ndim - 1; j >= 0; --j) {
    t.stride[j] = running;
    running *= t.shape[j] > 0 ? t.shape[j] : 1;
  }
  return t;
}

// (b, sq, sk, hq, hkv, d) = (2, 128, 256, 8, 2, 64), bf16.
struct Fwd {
  flash3_tensor q = tensor(0x1000000, FLASH3_BF16, 4, {2, 128, 8, 64});
  flash3_tensor k = tensor(0x2000000, FLASH3_BF16, 4, {2, 256, 2, 64});
  flash3_tensor v = tensor(0x3000000, FLASH3_BF16, 4, {2, 256, 2, 64});
  flash3_tensor out = tensor(0x4000000, FLASH3_BF16, 4, {2, 128, 8, 64});
  flash3_tensor lse = tensor(0x5000000, FLASH3_FP32, 3, {2, 8, 128});
  flash3_options opts = flash3_default_options();

  flash3_status validate(bool with_lse = true) const {
    return flash3_validate_forward(&q, &k, &v, &out, with_lse ? &lse : nullptr, &opts);
  }
  flash3_status forward() const { return flash3_forward(&q, &k, &v, &out, &lse, &opts, nullptr); }
};

struct Bwd {
  Fwd f;
  flash3_tensor dout = tensor(0x6000000, FLASH3_BF16, 4, {2, 128, 8, 64});
  flash3_tensor dq = tensor(0x7000000, FLASH3_BF16, 4, {2, 128, 8, 64});
  flash3_tensor dk = tensor(0x8000000, FLASH3_BF16, 4, {2, 256, 2, 64});
  flash3_tensor dv = tensor(0x9000000, FLASH3_BF16, 4, {2, 256, 2, 64});

  flash3_status run(const flash3_tensor* dout_p, const flash3_tensor* lse_p) const {
    return flash3_backward(&f.q, &f.k, &f.v, &f.out, dout_p, lse_p, nullptr, &dq, &dk, &dv, &f.opts, nullptr, 0, nullptr);
  }
};

std::string last_error() { return flash3_last_error(); }

bool contains(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

// A valid request is OK when its kernel is built here, NOT_SUPPORTED otherwise.
flash3_status expected_for_valid_bf16_64() {
  return flash3_forward_is_built(FLASH3_BF16, 64, 64) ? FLASH3_OK : FLASH3_NOT_SUPPORTED;
}

class CApi : public flash3::testutil::SkipDeviceCheckTest {};

TEST_F(CApi, DefaultOptions) {
  const flash3_options o = flash3_default_options();
  EXPECT_EQ(o.struct_size, sizeof(flash3_options));
  EXPECT_TRUE(std::isnan(o.softmax_scale));
  EXPECT_EQ(o.causal, 0);
  EXPECT_EQ(o.window_left, -1);
  EXPECT_EQ(o.window_right, -1);
  EXPECT_EQ(o.softcap, 0.f);
  EXPECT_EQ(o.deterministic, 0);
  EXPECT_EQ(o.cu_seqlens_q, nullptr);
  EXPECT_EQ(o.cu_seqlens_k, nullptr);
  EXPECT_EQ(o.max_seqlen_q, 0);
  EXPECT_EQ(o.max_seqlen_k, 0);
  EXPECT_EQ(o.num_sequences, 0);
  EXPECT_EQ(o.seqused_q, nullptr);
  EXPECT_EQ(o.seqused_k, nullptr);
  EXPECT_EQ(o.pack_gqa, -1);
  EXPECT_EQ(o.num_splits, 1);
  EXPECT_EQ(o.reserved0, 0);
  // The C defaults are the C++ defaults.
  const flash3::AttentionOptions cpp;
  EXPECT_EQ(o.num_sequences, cpp.num_sequences);
  EXPECT_EQ(o.seqused_q, cpp.seqused_q);
  EXPECT_EQ(o.seqused_k, cpp.seqused_k);
  EXPECT_EQ(o.pack_gqa, cpp.pack_gqa);
  EXPECT_EQ(o.num_splits, cpp.num_splits);
  EXPECT_EQ(o.window_left, cpp.window_left);
  EXPECT_EQ(o.window_right, cpp.window_right);
  EXPECT_EQ(o.softcap, cpp.softcap);
  EXPECT_TRUE(std::isnan(cpp.softmax_scale));
}

TEST_F(CApi, OptionsNeedTheirSize) {
  Fwd f;
  flash3_options zeroed;
  std::memset(&zeroed, 0, sizeof(zeroed));  // a caller that skipped flash3_default_options()
  EXPECT_EQ(flash3_validate_forward(&f.q, &f.k, &f.v, &f.out, &f.lse, &zeroed), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts->struct_size is 0")) << last_error();
  EXPECT_TRUE(contains(last_error(), "flash3_default_options()")) << last_error();
  zeroed.struct_size = sizeof(flash3_options) + 8;  // a newer header than this library
  EXPECT_EQ(flash3_validate_forward(&f.q, &f.k, &f.v, &f.out, &f.lse, &zeroed), FLASH3_INVALID_ARGUMENT);
  EXPECT_EQ(flash3_backward_workspace_size(&f.q, &f.k, &f.v, &zeroed), 0u);
}

TEST_F(CApi, VarlenFieldsAreAppended) {
  // New fields go at the end: the first layout's offsets are unchanged.
  EXPECT_EQ(offsetof(flash3_options, max_seqlen_k) + sizeof(int32_t), offsetof(flash3_options, num_sequences));
  EXPECT_LT(offsetof(flash3_options, num_sequences), offsetof(flash3_options, seqused_q));
  EXPECT_LT(offsetof(flash3_options, seqused_q), offsetof(flash3_options, seqused_k));
  // The first layout was replaced before any release: the size of the struct
  // without the varlen fields is rejected.
  Fwd f;
  f.opts.struct_size = static_cast<uint32_t>(offsetof(flash3_options, num_sequences));
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  const std::string want = "opts->struct_size is " + std::to_string(offsetof(flash3_options, num_sequences)) + ";";
  EXPECT_TRUE(contains(last_error(), want.c_str())) << last_error();
}

// Variable length through the C ABI: (total, h, d) tensors, (hq, total_q) lse.
struct VarlenFwd : Fwd {
  VarlenFwd() {
    q = tensor(0x1000000, FLASH3_BF16, 3, {300, 8, 64});
    k = tensor(0x2000000, FLASH3_BF16, 3, {500, 2, 64});
    v = tensor(0x3000000, FLASH3_BF16, 3, {500, 2, 64});
    out = tensor(0x4000000, FLASH3_BF16, 3, {300, 8, 64});
    lse = tensor(0x5000000, FLASH3_FP32, 2, {8, 300});
    opts.cu_seqlens_q = reinterpret_cast<const int32_t*>(0xA000000);
    opts.cu_seqlens_k = reinterpret_cast<const int32_t*>(0xB000000);
    opts.max_seqlen_q = 200;
    opts.max_seqlen_k = 300;
    opts.num_sequences = 3;
  }
};

TEST_F(CApi, VarlenFieldsArePassedThrough) {
  VarlenFwd f;
  EXPECT_EQ(f.validate(), expected_for_valid_bf16_64()) << last_error();
  f.opts.seqused_q = reinterpret_cast<const int32_t*>(0xC000000);
  f.opts.seqused_k = reinterpret_cast<const int32_t*>(0xD000000);
  EXPECT_EQ(f.validate(), expected_for_valid_bf16_64()) << last_error();
  // num_sequences reaches the C++ options.
  f.opts.num_sequences = -1;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.num_sequences is -1; expected >= 0")) << last_error();
  EXPECT_EQ(f.forward(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "flash3_forward: opts.num_sequences is -1")) << last_error();
  // seqused_q / seqused_k reach the C++ options.
  f.opts.num_sequences = 3;
  f.opts.seqused_q = reinterpret_cast<const int32_t*>(0xC000002);
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.seqused_q (0xc000002) is not 4-byte aligned")) << last_error();
  f.opts.seqused_q = nullptr;
  f.opts.seqused_k = reinterpret_cast<const int32_t*>(0xD000001);
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.seqused_k (0xd000001) is not 4-byte aligned")) << last_error();
  // seqused without cu_seqlens.
  Fwd fixed;
  fixed.opts.seqused_k = reinterpret_cast<const int32_t*>(0xD000000);
  EXPECT_EQ(fixed.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.seqused_k needs opts.cu_seqlens_k")) << last_error();
}

TEST_F(CApi, PackGqaIsAppended) {
  EXPECT_EQ(offsetof(flash3_options, seqused_k) + sizeof(const int32_t*), offsetof(flash3_options, pack_gqa));
  EXPECT_GE(sizeof(flash3_options), offsetof(flash3_options, pack_gqa) + sizeof(int32_t));
  // A caller built against the layout before pack_gqa (ending at seqused_k) is
  // accepted and gets the default, -1: the field past its struct_size is not
  // read (an invalid value there would be rejected).
  const uint32_t older = static_cast<uint32_t>(offsetof(flash3_options, seqused_k) + sizeof(const int32_t*));
  Fwd f;
  f.opts.pack_gqa = 7;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.pack_gqa is 7")) << last_error();
  f.opts.struct_size = older;
  EXPECT_EQ(f.validate(), expected_for_valid_bf16_64()) << last_error();
  VarlenFwd v;
  v.opts.struct_size = older;
  v.opts.pack_gqa = 7;
  EXPECT_EQ(v.validate(), expected_for_valid_bf16_64()) << last_error();
  // The older layout's fields are still read.
  v.opts.num_sequences = -1;
  EXPECT_EQ(v.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.num_sequences is -1")) << last_error();
  // Other sizes stay rejected.
  f.opts.struct_size = older + 4;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts->struct_size is")) << last_error();
}

TEST_F(CApi, PackGqaIsValidated) {
  // -1 (heuristic), 0, 1 valid on every shape (MHA and softcap run the unpacked
  // kernel); anything else INVALID_ARGUMENT naming opts.pack_gqa, forward and
  // backward (the backward otherwise ignores it).
  for (int32_t ok : {-1, 0, 1}) {
    Fwd f;
    f.opts.pack_gqa = ok;
    EXPECT_EQ(f.validate(), expected_for_valid_bf16_64()) << ok << " " << last_error();
    VarlenFwd v;
    v.opts.pack_gqa = ok;
    EXPECT_EQ(v.validate(), expected_for_valid_bf16_64()) << ok << " " << last_error();
    Fwd mha;
    mha.k = tensor(0x2000000, FLASH3_BF16, 4, {2, 256, 8, 64});
    mha.v = tensor(0x3000000, FLASH3_BF16, 4, {2, 256, 8, 64});
    mha.opts.pack_gqa = ok;
    EXPECT_EQ(mha.validate(), expected_for_valid_bf16_64()) << ok << " " << last_error();
  }
  for (int32_t bad : {-2, 2}) {
    const std::string want = "opts.pack_gqa is " + std::to_string(bad) + "; expected -1 (heuristic), 0 (off) or 1 (on)";
    Fwd f;
    f.opts.pack_gqa = bad;
    EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(last_error(), want.c_str())) << last_error();
    EXPECT_EQ(f.forward(), FLASH3_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(last_error(), ("flash3_forward: " + want).c_str())) << last_error();
    Bwd b;
    b.f.opts.pack_gqa = bad;
    EXPECT_EQ(b.run(&b.dout, &b.f.lse), FLASH3_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(last_error(), ("flash3_backward: " + want).c_str())) << last_error();
  }
}

TEST_F(CApi, VarlenWithoutSequencesIsOk) {
  VarlenFwd f;
  f.opts.num_sequences = 0;  // nothing to compute: Ok without a kernel or a launch
  EXPECT_EQ(f.forward(), FLASH3_OK) << last_error();
  EXPECT_EQ(f.validate(), FLASH3_OK) << last_error();
}

TEST_F(CApi, VarlenBackwardEmptyIsOk) {
  VarlenFwd f;
  const flash3_tensor dout = tensor(0x6000000, FLASH3_BF16, 3, {300, 8, 64});
  const flash3_tensor dq = tensor(0x7000000, FLASH3_BF16, 3, {300, 8, 64});
  const flash3_tensor dk = tensor(0x8000000, FLASH3_BF16, 3, {500, 2, 64});
  const flash3_tensor dv = tensor(0x9000000, FLASH3_BF16, 3, {500, 2, 64});
  EXPECT_GT(flash3_backward_workspace_size(&f.q, &f.k, &f.v, &f.opts), 0u);
  f.opts.num_sequences = 0;  // empty: no kernel needed, the same answer on every build
  EXPECT_EQ(flash3_backward(&f.q, &f.k, &f.v, &f.out, &dout, &f.lse, nullptr, &dq, &dk, &dv, &f.opts, nullptr, 0,
                            nullptr),
            FLASH3_OK)
      << last_error();
  EXPECT_EQ(flash3_backward_workspace_size(&f.q, &f.k, &f.v, &f.opts), 0u);
}

TEST_F(CApi, VersionString) {
  ASSERT_NE(flash3_version(), nullptr);
  EXPECT_STREQ(flash3_version(), FLASH3_VERSION_STRING);
  EXPECT_STREQ(flash3_version(), flash3::version());
}

TEST_F(CApi, EnumsMatchCpp) {
  EXPECT_EQ(FLASH3_INVALID_ARGUMENT, static_cast<int>(flash3::StatusCode::kInvalidArgument));
  EXPECT_EQ(FLASH3_NOT_SUPPORTED, static_cast<int>(flash3::StatusCode::kNotSupported));
  EXPECT_EQ(FLASH3_CUDA_ERROR, static_cast<int>(flash3::StatusCode::kCudaError));
  EXPECT_EQ(FLASH3_BF16, static_cast<int>(flash3::DType::kBFloat16));
  EXPECT_EQ(FLASH3_FP8_E4M3, static_cast<int>(flash3::DType::kFloat8E4M3));
}

TEST_F(CApi, ValidForwardArguments) {
  Fwd f;
  EXPECT_EQ(f.validate(), expected_for_valid_bf16_64()) << last_error();
  EXPECT_EQ(f.validate(/*with_lse=*/false), expected_for_valid_bf16_64()) << last_error();
}

TEST_F(CApi, InvalidArgumentSetsLastError) {
  Fwd f;
  f.k.dtype = FLASH3_FP16;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  const std::string msg = last_error();
  EXPECT_TRUE(contains(msg, "k.dtype")) << msg;
  EXPECT_TRUE(contains(msg, "fp16")) << msg;
  EXPECT_EQ(f.forward(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "flash3_forward")) << last_error();
}

TEST_F(CApi, NullTensorPointers) {
  Fwd f;
  EXPECT_EQ(flash3_validate_forward(nullptr, &f.k, &f.v, &f.out, nullptr, &f.opts), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "q is missing")) << last_error();
  EXPECT_EQ(flash3_forward(&f.q, &f.k, &f.v, nullptr, nullptr, nullptr, nullptr), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "out is missing")) << last_error();
  EXPECT_EQ(flash3_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), FLASH3_INVALID_ARGUMENT);
}

TEST_F(CApi, NullOptionsMeanDefaults) {
  Fwd f;
  EXPECT_EQ(flash3_validate_forward(&f.q, &f.k, &f.v, &f.out, &f.lse, nullptr), expected_for_valid_bf16_64())
      << last_error();
}

TEST_F(CApi, OptionsAreForwarded) {
  Fwd f;
  f.opts.softmax_scale = -1.f;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.softmax_scale is -1")) << last_error();
  f.opts = flash3_default_options();
  f.opts.causal = 1;
  f.opts.window_right = 3;  // FlashAttention-3's rule: causal overrides the right side
  EXPECT_EQ(f.validate(), expected_for_valid_bf16_64()) << last_error();
  f.opts = flash3_default_options();
  f.opts.softcap = -2.f;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "opts.softcap")) << last_error();
}

TEST_F(CApi, BadDtypeEnum) {
  Fwd f;
  f.q.dtype = 9;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "q.dtype is 9")) << last_error();
}

TEST_F(CApi, BadNdim) {
  Fwd f;
  f.v.ndim = 7;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "v.ndim is 7")) << last_error();
}

TEST_F(CApi, Fp8DescalesAreChecked) {
  Fwd f;
  f.q.dtype = f.k.dtype = f.v.dtype = FLASH3_FP8_E4M3;
  const flash3_tensor bad = tensor(0xC000000, FLASH3_FP32, 2, {2, 8});  // heads_q instead of heads_kv
  EXPECT_EQ(flash3_forward_fp8(&f.q, &f.k, &f.v, &f.out, &f.lse, nullptr, &bad, nullptr, &f.opts, nullptr, 0, nullptr),
            FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "flash3_forward_fp8")) << last_error();
  EXPECT_TRUE(contains(last_error(), "k_descale has shape")) << last_error();
}

TEST_F(CApi, QuantizeFp8IsChecked) {
  const flash3_tensor x = tensor(0x1000000, FLASH3_BF16, 4, {2, 300, 4, 128});
  const flash3_tensor out = tensor(0x4000000, FLASH3_FP8_E4M3, 4, {2, 300, 4, 128});
  const flash3_tensor bad = tensor(0x6000000, FLASH3_FP32, 3, {2, 4, 2});  // ceil(300 / 128) = 3 blocks
  EXPECT_EQ(flash3_quantize_fp8(&x, &out, &bad, 1, /*block_scales=*/1, 0, 0, nullptr), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "flash3_quantize_fp8")) << last_error();
  EXPECT_TRUE(contains(last_error(), "descale has shape (2, 4, 2)")) << last_error();
  EXPECT_EQ(flash3_quantize_fp8(nullptr, &out, &bad, 1, 1, 0, 0, nullptr), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "x")) << last_error();
}

TEST_F(CApi, QuantizeFp8RotaryIsChecked) {
  const flash3_tensor x = tensor(0x1000000, FLASH3_BF16, 4, {2, 300, 4, 128});
  const flash3_tensor out = tensor(0x4000000, FLASH3_FP8_E4M3, 4, {2, 300, 4, 128});
  const flash3_tensor descale = tensor(0x6000000, FLASH3_FP32, 2, {2, 4});
  const flash3_tensor cos = tensor(0x7000000, FLASH3_BF16, 2, {300, 32});
  const flash3_tensor cos_fp16 = tensor(0x7000000, FLASH3_FP16, 2, {300, 32});
  const flash3_tensor cos_short = tensor(0x7000000, FLASH3_BF16, 2, {299, 32});
  const flash3_tensor sin = tensor(0x7800000, FLASH3_BF16, 2, {300, 32});
  // Only one table: the missing one is named.
  EXPECT_EQ(flash3_quantize_fp8_rotary(&x, &out, &descale, 1, 0, 0, 0, &cos, nullptr, 1, nullptr),
            FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "flash3_quantize_fp8_rotary")) << last_error();
  EXPECT_TRUE(contains(last_error(), "rotary_sin is missing")) << last_error();
  // Fewer rows than tokens; a dtype other than x's.
  EXPECT_EQ(flash3_quantize_fp8_rotary(&x, &out, &descale, 1, 0, 0, 0, &cos_short, &sin, 0, nullptr),
            FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "rotary_cos has 299 rows")) << last_error();
  EXPECT_EQ(flash3_quantize_fp8_rotary(&x, &out, &descale, 1, 0, 0, 0, &cos_fp16, &sin, 1, nullptr),
            FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "rotary_cos")) << last_error();
}

TEST_F(CApi, Fp8WritesBf16) {
  Fwd f;
  f.q.dtype = f.k.dtype = f.v.dtype = f.out.dtype = FLASH3_FP8_E4M3;
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "expected bf16")) << last_error();
}

TEST_F(CApi, MisalignedLse) {
  Fwd f;
  f.lse.data = reinterpret_cast<void*>(0x5000001);
  EXPECT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "lse.data")) << last_error();
}

TEST_F(CApi, EmptyForwardIsOk) {
  Fwd f;
  f.q = tensor(0, FLASH3_BF16, 4, {2, 0, 8, 64});
  f.out = tensor(0, FLASH3_BF16, 4, {2, 0, 8, 64});
  f.lse = tensor(0, FLASH3_FP32, 3, {2, 8, 0});
  EXPECT_EQ(f.forward(), FLASH3_OK) << last_error();
}

TEST_F(CApi, IsBuiltMatchesCpp) {
  for (int32_t dt : {FLASH3_FP16, FLASH3_BF16})
    for (int d : {64, 96, 128, 192, 256}) {
      EXPECT_EQ(flash3_forward_is_built(dt, d, d) != 0, flash3::forward_is_built(static_cast<flash3::DType>(dt), d, d));
      EXPECT_EQ(flash3_backward_is_built(dt, d, d) != 0,
                flash3::backward_is_built(static_cast<flash3::DType>(dt), d, d));
    }
  EXPECT_EQ(flash3_forward_is_built(FLASH3_FP16, 32, 32), 0);  // never in the manifest
  EXPECT_EQ(flash3_forward_is_built(FLASH3_FP32, 64, 64), 0);
  EXPECT_EQ(flash3_forward_is_built(42, 64, 64), 0);
  EXPECT_EQ(flash3_backward_is_built(-1, 64, 64), 0);
}

TEST_F(CApi, BackwardMissingDoutAndLse) {
  Bwd b;
  EXPECT_EQ(b.run(nullptr, &b.f.lse), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "dout is missing")) << last_error();
  EXPECT_EQ(b.run(&b.dout, nullptr), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "lse is missing")) << last_error();
}

TEST_F(CApi, ForwardSoftcapIsValidWhereBuilt) {
  // No "not supported yet: softcap" any more: a softcap request is valid where
  // the plain kernel and its softcap unit are built; the plain "not built"
  // answer comes first.
  const bool plain = flash3_forward_is_built(FLASH3_BF16, 64, 64) != 0;
  const bool capped = flash3::fwd_kernel_built(flash3::DType::kBFloat16, 64, 64, flash3::ScoreModKind::kSoftcap);
  for (float softcap : {1.f, 5.f, 30.f}) {
    Fwd f;
    f.opts.softcap = softcap;
    f.opts.causal = softcap == 5.f;
    const flash3_status s = f.validate();
    if (!plain) {
      EXPECT_EQ(s, FLASH3_NOT_SUPPORTED);
      EXPECT_TRUE(contains(last_error(), "forward kernel") && contains(last_error(), "not built")) << last_error();
      EXPECT_FALSE(contains(last_error(), "opts.softcap")) << last_error();
    } else if (!capped) {
      EXPECT_EQ(s, FLASH3_NOT_SUPPORTED);
      EXPECT_TRUE(contains(last_error(), "opts.softcap") && contains(last_error(), "FLASH3_FEATURES")) << last_error();
    } else {
      EXPECT_EQ(s, FLASH3_OK) << last_error();
    }
    VarlenFwd v;
    v.opts.softcap = softcap;
    EXPECT_EQ(v.validate(), s) << last_error();
  }
}

TEST_F(CApi, BackwardSoftcap) {
  Bwd b;
  // A bad value is INVALID_ARGUMENT on every build.
  b.f.opts.softcap = -1.f;
  EXPECT_EQ(b.run(&b.dout, &b.f.lse), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "flash3_backward: opts.softcap is -1")) << last_error();
  b.f.opts.softcap = 30.f;
  EXPECT_EQ(flash3_backward_workspace_size(&b.f.q, &b.f.k, &b.f.v, &b.f.opts),
            flash3_backward_workspace_size(&b.f.q, &b.f.k, &b.f.v, nullptr));
  if (!flash3_backward_is_built(FLASH3_BF16, 64, 64)) {
    EXPECT_EQ(b.run(&b.dout, &b.f.lse), FLASH3_NOT_SUPPORTED);
    EXPECT_TRUE(contains(last_error(), "backward kernel") && contains(last_error(), "not built")) << last_error();
    EXPECT_FALSE(contains(last_error(), "opts.softcap")) << last_error();
    return;
  }
  // Built: a too-small workspace is reported after validation, so reaching it
  // proves the softcap request got through the kernel check (nothing launched).
  const size_t need = flash3_backward_workspace_size(&b.f.q, &b.f.k, &b.f.v, &b.f.opts);
  ASSERT_GT(need, 0u);
  const flash3_status s = flash3_backward(&b.f.q, &b.f.k, &b.f.v, &b.f.out, &b.dout, &b.f.lse, nullptr, &b.dq, &b.dk,
                                          &b.dv, &b.f.opts, reinterpret_cast<void*>(0xE000000), need - 1, nullptr);
  if (flash3::bwd_kernel_built(flash3::DType::kBFloat16, 64, 64, flash3::ScoreModKind::kSoftcap)) {
    EXPECT_EQ(s, FLASH3_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(last_error(), "workspace")) << last_error();
  } else {
    EXPECT_EQ(s, FLASH3_NOT_SUPPORTED);
    EXPECT_TRUE(contains(last_error(), "opts.softcap") && contains(last_error(), "FLASH3_FEATURES")) << last_error();
  }
}

TEST_F(CApi, WorkspaceSize) {
  Fwd f;
  EXPECT_GT(flash3_backward_workspace_size(&f.q, &f.k, &f.v, &f.opts), 0u);
  EXPECT_EQ(flash3_backward_workspace_size(nullptr, nullptr, nullptr, nullptr), 0u);
}

// flash3_kvcache_args: b sequences of sq 1, hq 8, hkv 2, d 64, bf16, over a cache of 2 x 256 rows
// (a pool of 2 pages of 256 rows when page_table is set); cache_seqlens set.
struct KVCache {
  flash3_tensor q, k_cache, v_cache, out;
  flash3_kvcache_args args = flash3_default_kvcache_args();

  explicit KVCache(int64_t b = 2)
      : q(tensor(0x1000000, FLASH3_BF16, 4, {b, 1, 8, 64})),
        k_cache(tensor(0x2000000, FLASH3_BF16, 4, {2, 256, 2, 64})),
        v_cache(tensor(0x3000000, FLASH3_BF16, 4, {2, 256, 2, 64})),
        out(tensor(0x4000000, FLASH3_BF16, 4, {b, 1, 8, 64})) {
    args.q = &q;
    args.k_cache = &k_cache;
    args.v_cache = &v_cache;
    args.out = &out;
    args.cache_seqlens = reinterpret_cast<const int32_t*>(0x6000000);
  }
  KVCache(const KVCache&) = delete;  // args points into it
  KVCache& operator=(const KVCache&) = delete;

  // A (b, 4) page table, rows 4 entries apart.
  void page() {
    args.page_table = reinterpret_cast<const int32_t*>(0x6000200);
    args.page_table_batch_stride = 4;
    args.page_table_max_pages = 4;
  }
  flash3_status run() const { return flash3_forward_kvcache(&args, nullptr, nullptr, 0, nullptr); }
};

const int32_t* fake_int32(uintptr_t addr) { return reinterpret_cast<const int32_t*>(addr); }

// The layout before the paged-KV fields, which ended at rotary_seqlens.
constexpr uint32_t kPrePagedKVCacheArgsSize = static_cast<uint32_t>(offsetof(flash3_kvcache_args, page_table));
// The layout ending at page_table_max_pages (before page_table_rows / cu_seqlens_k_new).
constexpr uint32_t kPagedKVCacheArgsSize = static_cast<uint32_t>(offsetof(flash3_kvcache_args, cu_seqlens_k_new));

TEST_F(CApi, KVCachePagedFieldsAreAppended) {
  EXPECT_EQ(offsetof(flash3_kvcache_args, rotary_seqlens) + sizeof(const int32_t*),
            offsetof(flash3_kvcache_args, page_table));
  EXPECT_LT(offsetof(flash3_kvcache_args, page_table_max_pages), sizeof(flash3_kvcache_args));
  // The older layout's sizeof: it ended at a pointer (no trailing padding).
  EXPECT_EQ(kPrePagedKVCacheArgsSize % alignof(const int32_t*), 0u);
  const flash3_kvcache_args d = flash3_default_kvcache_args();
  EXPECT_EQ(d.struct_size, sizeof(flash3_kvcache_args));
  EXPECT_EQ(d.page_table, nullptr);
  EXPECT_EQ(d.page_table_batch_stride, 0);
  EXPECT_EQ(d.page_table_max_pages, 0);
}

TEST_F(CApi, KVCacheOlderStructSizeIsAccepted) {
  // An empty batch: validated, nothing to launch on any build.
  KVCache e(0);
  e.args.cache_batch_idx = fake_int32(0x6000100);
  EXPECT_EQ(e.run(), FLASH3_OK) << last_error();
  e.page();  // a page table of no columns: invalid, from this header's struct
  e.args.page_table_max_pages = 0;
  EXPECT_NE(e.run(), FLASH3_OK);
  EXPECT_TRUE(contains(last_error(), "page_table")) << last_error();
  // A caller built against the older header: the bytes past its struct_size (here the same
  // page_table) are not read, so the call is a contiguous one again.
  e.args.struct_size = kPrePagedKVCacheArgsSize;
  EXPECT_EQ(e.run(), FLASH3_OK) << last_error();

  // A full batch from the older struct: validated as a contiguous cache (an error elsewhere
  // keeps anything from being launched), page_table never mentioned.
  KVCache f;
  f.page();
  f.args.page_table_max_pages = 0;
  f.args.struct_size = kPrePagedKVCacheArgsSize;
  f.out.dtype = FLASH3_FP16;
  EXPECT_EQ(f.run(), FLASH3_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "out.dtype")) << last_error();
  EXPECT_FALSE(contains(last_error(), "page_table")) << last_error();
  EXPECT_FALSE(contains(last_error(), "struct_size")) << last_error();

  // The workspace query reads the same fields: the older struct gets the contiguous answer.
  KVCache w;
  const size_t contiguous = flash3_kvcache_workspace_size(&w.args, nullptr);
  EXPECT_GT(contiguous, 0u);  // the per-sequence maps of the lowered varlen attention
  w.page();
  w.args.page_table_max_pages = 0;
  EXPECT_EQ(flash3_kvcache_workspace_size(&w.args, nullptr), 0u);  // a page table of no columns: malformed
  w.args.struct_size = kPrePagedKVCacheArgsSize;
  EXPECT_EQ(flash3_kvcache_workspace_size(&w.args, nullptr), contiguous);

  // The layout ending at page_table_max_pages (before page_table_rows and
  // cu_seqlens_k_new): its paged fields are read, the later ones are not (a
  // page_table_rows the caller never wrote would be an error).
  KVCache g(0);
  g.page();
  g.args.page_table_rows = -7;
  EXPECT_NE(g.run(), FLASH3_OK);
  EXPECT_TRUE(contains(last_error(), "page_table_rows")) << last_error();
  g.args.struct_size = kPagedKVCacheArgsSize;
  EXPECT_EQ(g.run(), FLASH3_OK) << last_error();

  // Other sizes stay rejected, naming the accepted ones.
  for (uint32_t bad : {0u, 8u, kPrePagedKVCacheArgsSize - 8, kPrePagedKVCacheArgsSize + 4, kPagedKVCacheArgsSize + 4,
                       static_cast<uint32_t>(sizeof(flash3_kvcache_args)) + 8}) {
    KVCache b(0);
    b.args.struct_size = bad;
    EXPECT_EQ(b.run(), FLASH3_INVALID_ARGUMENT) << bad;
    const std::string want = "args->struct_size is " + std::to_string(bad) + "; expected " +
                             std::to_string(sizeof(flash3_kvcache_args));
    EXPECT_TRUE(contains(last_error(), want.c_str())) << last_error();
    EXPECT_TRUE(contains(last_error(), std::to_string(kPrePagedKVCacheArgsSize).c_str())) << last_error();
    EXPECT_EQ(flash3_kvcache_workspace_size(&b.args, nullptr), 0u) << bad;
  }
}

TEST_F(CApi, KVCachePageTableReachesValidation) {
  // The three paged fields reach flash3::forward_kvcache's checks (each call below is invalid,
  // so nothing is launched on any build).
  {
    KVCache f;
    f.page();
    f.args.page_table_rows = -1;
    EXPECT_NE(f.run(), FLASH3_OK);
    EXPECT_TRUE(contains(last_error(), "page_table_rows")) << last_error();
    EXPECT_TRUE(contains(last_error(), "flash3_forward_kvcache")) << last_error();
  }
  {
    KVCache f;  // page_table_rows without a page table
    f.args.page_table_rows = 3;
    EXPECT_NE(f.run(), FLASH3_OK);
    EXPECT_TRUE(contains(last_error(), "page_table_rows") && contains(last_error(), "page_table is null"))
        << last_error();
  }
  {
    KVCache f;
    f.page();
    f.args.page_table_max_pages = 0;  // no room at all
    EXPECT_NE(f.run(), FLASH3_OK);
    EXPECT_TRUE(contains(last_error(), "page_table")) << last_error();
  }
  {
    KVCache f;
    f.page();
    f.args.page_table_batch_stride = 1;  // rows of the table overlapping, with 2 sequences
    EXPECT_NE(f.run(), FLASH3_OK);
    EXPECT_TRUE(contains(last_error(), "page_table")) << last_error();
  }
  {
    KVCache f;
    f.page();
    flash3_options o = flash3_default_options();
    o.softcap = 5.f;
    EXPECT_NE(flash3_forward_kvcache(&f.args, &o, nullptr, 0, nullptr), FLASH3_OK);
    EXPECT_TRUE(contains(last_error(), "page_table")) << last_error();
  }
}

TEST_F(CApi, LastErrorIsThreadLocalAndKept) {
  Fwd f;
  f.k.dtype = FLASH3_FP16;
  ASSERT_EQ(f.validate(), FLASH3_INVALID_ARGUMENT);
  const std::string mine = last_error();
  ASSERT_FALSE(mine.empty());
  std::string other_before = "unset", other_after;
  std::thread t([&] {
    other_before = flash3_last_error();
    Fwd g;
    g.out.ndim = 2;
    (void)g.validate();
    other_after = flash3_last_error();
  });
  t.join();
  EXPECT_EQ(other_before, "");
  EXPECT_TRUE(contains(other_after, "out.ndim is 2")) << other_after;
  EXPECT_EQ(last_error(), mine);  // untouched by the other thread
  // A successful call leaves the last failure in place.
  Fwd ok;
  ok.q = tensor(0, FLASH3_BF16, 4, {0, 128, 8, 64});
  ok.out = tensor(0, FLASH3_BF16, 4, {0, 128, 8, 64});
  ok.k = tensor(0, FLASH3_BF16, 4, {0, 256, 2, 64});
  ok.v = tensor(0, FLASH3_BF16, 4, {0, 256, 2, 64});
  ASSERT_EQ(flash3_forward(&ok.q, &ok.k, &ok.v, &ok.out, nullptr, nullptr, nullptr), FLASH3_OK);
  EXPECT_EQ(last_error(), mine);
}

TEST_F(CApi, DeviceIsSupportedNeverCrashes) {
  const int r = flash3_device_is_supported();
  EXPECT_TRUE(r == 0 || r == 1);
  EXPECT_EQ(r != 0, flash3::device_is_supported());
  if (r == 0) {
    EXPECT_FALSE(last_error().empty());
  }
}

TEST_F(CApi, ForwardWithoutSkipFailsCleanly) {
  device_checks_.set(true);
  Fwd f;
  const flash3_status s = f.forward();
  EXPECT_TRUE(s == FLASH3_CUDA_ERROR || s == FLASH3_INVALID_ARGUMENT || s == FLASH3_NOT_SUPPORTED)
      << s << ": " << last_error();
  EXPECT_FALSE(last_error().empty());
}

}  // namespace
