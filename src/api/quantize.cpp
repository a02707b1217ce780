// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// flash3::quantize_fp8 (flash3.h): validation and lowering; the kernels are
// in src/quant/quantize_fp8.cu (quantize_fp8_raw.cu where FLASH3_QUANTIZE_RAW=1).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "api/overlap.h"
#include "api/validate.h"
#include "common/cuda_check.h"
#include "quant/quantize_fp8.h"

namespace flash3 {
namespace {

// x / out: 4-d (b, s, h, d), unit stride in d, strides >= 0 and 16-byte
// aligned rows (the kernels read and write each row in vectors), as the FP8
// forward asks of its inputs.
Status check_bshd(const char* name, const TensorView& t, int64_t elem_bytes) {
  if (t.ndim != 4)
    return Status::Invalid(std::string(name) + ".ndim is " + std::to_string(t.ndim) +
                           "; expected 4: (batch, seqlen, heads, head_dim)");
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > INT32_MAX)
      return Status::Invalid(std::string(name) + ".shape[" + std::to_string(i) + "] is " +
                             std::to_string(t.shape[i]) + "; expected 0 to 2147483647");
    if (t.stride[i] < 0)
      return Status::Invalid(std::string(name) + ".stride[" + std::to_string(i) + "] is " +
                             std::to_string(t.stride[i]) + "; expected >= 0");
  }
  if (t.shape[3] > 1 && t.stride[3] != 1)
    return Status::Invalid(std::string(name) + ".stride[3] (head_dim) is " + std::to_string(t.stride[3]) +
                           "; expected 1");
  if (t.data == nullptr && t.numel() > 0)
    return Status::Invalid(std::string(name) + ".data is null; expected a device pointer (shape " + shape_str(t) +
                           ")");
  for (int i = 0; i < 3; ++i)
    if (t.shape[i] > 1 && (t.stride[i] * elem_bytes) % 16 != 0)
      return Status::Invalid(std::string(name) + ".stride[" + std::to_string(i) + "] is " +
                             std::to_string(t.stride[i]) + " elements (" + std::to_string(t.stride[i] * elem_bytes) +
                             " bytes); expected a multiple of 16 bytes");
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return Status::Invalid(std::string(name) + ".data is not 16-byte aligned; expected 16-byte aligned rows");
  return Status::Ok();
}

// rotary_cos / rotary_sin: both or neither, x's dtype, 2-d (seqlen_ro >=
// seqlen, rotary_dim / 2), unit last stride, 16-byte rows; rotary_dim a
// multiple of 16 up to d (a lane's 8 elements rotate together), a power of two
// for half-split pairs (the partner lane is an xor away).
Status check_rotary(const QuantizeFp8Args& a) {
  const TensorView &c = a.rotary_cos, &sn = a.rotary_sin;
  if (!c.defined() && !sn.defined()) return Status::Ok();
  if (c.defined() != sn.defined())
    return Status::Invalid(std::string(c.defined() ? "rotary_sin" : "rotary_cos") + " is missing; expected both " +
                           "rotary_cos and rotary_sin or neither");
  const int64_t d = a.x.shape[3], seqlen = a.x.shape[1];
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"rotary_cos", &c}, {"rotary_sin", &sn}}) {
    if (t->dtype != a.x.dtype)
      return Status::Invalid(std::string(name) + ".dtype is " + dtype_name(t->dtype) + "; expected " +
                             dtype_name(a.x.dtype) + " (x's)");
    if (t->ndim != 2 || t->shape[0] < 0 || t->shape[1] < 0 || t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX)
      return Status::Invalid(std::string(name) + " has shape " + shape_str(*t) +
                             "; expected 2-d (seqlen_ro, rotary_dim / 2), each below 2^31");
    if (t->shape[0] < seqlen)
      return Status::Invalid(std::string(name) + " has " + std::to_string(t->shape[0]) + " rows; expected at least " +
                             "seqlen = " + std::to_string(seqlen) + " (token s uses row s)");
    if (t->shape[1] > 1 && t->stride[1] != 1)
      return Status::Invalid(std::string(name) + ".stride[1] is " + std::to_string(t->stride[1]) + "; expected 1");
    if (t->shape[0] > 1 && (t->stride[0] < 0 || (t->stride[0] * 2) % 16 != 0))
      return Status::Invalid(std::string(name) + ".stride[0] is " + std::to_string(t->stride[0]) +
                             " elements; expected a non-negative multiple of 8 (16-byte rows)");
    if (t->data == nullptr || reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
      return Status::Invalid(std::string(name) + ".data is null or not 16-byte aligned; expected 16-byte aligned rows");
    FLASH3_RETURN_IF_ERROR(check_tensor_span(name, *t));
  }
  if (c.shape[1] != sn.shape[1])
    return Status::Invalid("rotary_sin has shape " + shape_str(sn) + "; expected rotary_cos's " + shape_str(c));
  const int64_t rd = 2 * c.shape[1];
  if (rd == 0 || rd > d || rd % 16 != 0)
    return Status::Invalid("rotary_dim (2 * rotary_cos.shape[1]) is " + std::to_string(rd) +
                           "; expected a multiple of 16 in [16, head_dim = " + std::to_string(d) + "]");
  if (!a.rotary_interleaved && (rd & (rd - 1)) != 0)
    return Status::Invalid("rotary_dim (2 * rotary_cos.shape[1]) is " + std::to_string(rd) +
                           " with rotary_interleaved = false; expected a power of two");
  return Status::Ok();
}

}  // namespace

Status validate_quantize_fp8(const QuantizeFp8Args& a) {
  FLASH3_RETURN_IF_ERROR(check_bshd("x", a.x, 2));
  if (a.x.dtype != DType::kBFloat16 && a.x.dtype != DType::kFloat16)
    return Status::Invalid(std::string("x.dtype is ") + dtype_name(a.x.dtype) + "; expected fp16 or bf16");
  FLASH3_RETURN_IF_ERROR(check_bshd("out", a.out, 1));
  if (a.out.dtype != DType::kFloat8E4M3)
    return Status::Invalid(std::string("out.dtype is ") + dtype_name(a.out.dtype) + "; expected fp8_e4m3");
  for (int i = 0; i < 4; ++i)
    if (a.out.shape[i] != a.x.shape[i])
      return Status::Invalid("out has shape " + shape_str(a.out) + "; expected " + shape_str(a.x) + " (x's)");
  const int64_t b = a.x.shape[0], h = a.x.shape[2], d = a.x.shape[3];
  if (a.heads_per_scale < 1 || (h > 0 && h % a.heads_per_scale != 0))
    return Status::Invalid("heads_per_scale is " + std::to_string(a.heads_per_scale) + "; expected a divisor of " +
                           "x.shape[2] (heads) " + std::to_string(h));
  if (d > 256 || d % 8 != 0)
    return Status::Invalid("x.shape[3] (head_dim) is " + std::to_string(d) + "; expected a multiple of 8 up to 256");
  if (a.hadamard && (d < 32 || (d & (d - 1)) != 0))
    return Status::Invalid("x.shape[3] (head_dim) is " + std::to_string(d) +
                           " with hadamard; expected a power of two in [32, 256]");
  if (a.block_scales && a.heads_per_scale != 1)
    return Status::Invalid("heads_per_scale is " + std::to_string(a.heads_per_scale) +
                           " with block_scales; expected 1 (block scales are per head)");
  const int64_t groups = h / a.heads_per_scale;
  const int64_t blocks = (a.x.shape[1] + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const TensorView& s = a.descale;
  if (s.dtype != DType::kFloat32)
    return Status::Invalid(std::string("descale.dtype is ") + dtype_name(s.dtype) + "; expected fp32");
  if (a.block_scales) {
    if (s.ndim != 3 || s.shape[0] != b || s.shape[1] != h || s.shape[2] != blocks)
      return Status::Invalid("descale has shape " + shape_str(s) + "; expected (batch, heads, ceil(seqlen / " +
                             std::to_string(kFp8ScaleBlock) + ")) = (" + std::to_string(b) + ", " +
                             std::to_string(h) + ", " + std::to_string(blocks) + ") with block_scales");
  } else if (s.ndim != 2 || s.shape[0] != b || s.shape[1] != groups) {
    return Status::Invalid("descale has shape " + shape_str(s) + "; expected (batch, heads / heads_per_scale) = (" +
                           std::to_string(b) + ", " + std::to_string(groups) + ")");
  }
  int64_t dense = 1;  // contiguity: each stride the product of the sizes after it
  for (int i = s.ndim - 1; i >= 0; --i) {
    if (s.shape[i] > 1 && s.stride[i] != dense)
      return Status::Invalid("descale.stride[" + std::to_string(i) + "] is " + std::to_string(s.stride[i]) +
                             "; expected a contiguous tensor (stride " + std::to_string(dense) + ")");
    dense *= s.shape[i];
  }
  if (s.data == nullptr && s.numel() > 0) return Status::Invalid("descale.data is null; expected a device pointer");
  if (reinterpret_cast<uintptr_t>(s.data) % 4 != 0) return Status::Invalid("descale.data is not 4-byte aligned");
  FLASH3_RETURN_IF_ERROR(check_rotary(a));
  FLASH3_RETURN_IF_ERROR(check_tensor_span("x", a.x));
  FLASH3_RETURN_IF_ERROR(check_tensor_span("out", a.out));
  FLASH3_RETURN_IF_ERROR(check_written_tensor("out", a.out));
  if (views_overlap(a.out, a.x) || views_overlap(a.descale, a.x) || views_overlap(a.descale, a.out))
    return Status::Invalid("out, descale and x overlap; expected each to have memory of its own");
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"rotary_cos", &a.rotary_cos},
                                {"rotary_sin", &a.rotary_sin}})
    if (views_overlap(a.out, *t) || views_overlap(a.descale, *t))
      return Status::Invalid(std::string("out or descale overlaps ") + name +
                             "; expected the outputs to have memory of their own (" + name + " is read)");
  if (!device_check_skipped() && b * h > 0) {
    FLASH3_RETURN_IF_ERROR(check_device_pointer("x.data", a.x.data));
    FLASH3_RETURN_IF_ERROR(check_device_pointer("out.data", a.out.data));
    FLASH3_RETURN_IF_ERROR(check_device_pointer("descale.data", a.descale.data));
    if (a.rotary_cos.defined()) {
      FLASH3_RETURN_IF_ERROR(check_device_pointer("rotary_cos.data", a.rotary_cos.data));
      FLASH3_RETURN_IF_ERROR(check_device_pointer("rotary_sin.data", a.rotary_sin.data));
    }
    FLASH3_RETURN_IF_ERROR(check_current_device());
  }
  return Status::Ok();
}

Status quantize_fp8(const QuantizeFp8Args& a, cudaStream_t stream) {
  try {
    FLASH3_RETURN_IF_ERROR(validate_quantize_fp8(a));
    if (a.x.shape[0] == 0 || a.x.shape[2] == 0) return Status::Ok();  // no descale to write
    if (!device_check_skipped()) FLASH3_RETURN_IF_ERROR(check_stream_device(stream));
    QuantizeFp8Params p;
    p.x = a.x.data;
    p.x_dtype = a.x.dtype;
    p.out = static_cast<uint8_t*>(a.out.data);
    p.descale = static_cast<float*>(a.descale.data);
    p.batch = int(a.x.shape[0]);
    p.seqlen = int(a.x.shape[1]);
    p.heads = int(a.x.shape[2]);
    p.d = int(a.x.shape[3]);
    p.heads_per_scale = a.heads_per_scale;
    p.block_scales = a.block_scales;
    p.x_batch_stride = a.x.stride[0];
    p.x_row_stride = a.x.stride[1];
    p.x_head_stride = a.x.stride[2];
    p.o_batch_stride = a.out.stride[0];
    p.o_row_stride = a.out.stride[1];
    p.o_head_stride = a.out.stride[2];
    p.hadamard = a.hadamard;
    if (a.hadamard) hadamard_sign_bits(p.d, a.hadamard_seed, p.sign_bits);
    if (a.rotary_cos.defined()) {
      p.rotary_cos = a.rotary_cos.data;
      p.rotary_sin = a.rotary_sin.data;
      p.cos_row_stride = a.rotary_cos.stride[0];
      p.sin_row_stride = a.rotary_sin.stride[0];
      p.rotary_dim = int(2 * a.rotary_cos.shape[1]);
      p.rotary_interleaved = a.rotary_interleaved;
    }
    const char* raw = std::getenv("FLASH3_QUANTIZE_RAW");
    if (raw != nullptr && std::string(raw) == "1") return launch_quantize_fp8_raw(p, stream);
    return launch_quantize_fp8(p, stream);
  } catch (...) {
    return Status{StatusCode::kInternal, "flash3::quantize_fp8: unexpected exception"};
  }
}

}  // namespace flash3
