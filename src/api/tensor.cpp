// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// TensorView helpers, dtype names/sizes and the library version.
#include <algorithm>
#include <cstdint>

#include "common/build_options.h"
#include "flash3/flash3.h"

namespace flash3 {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kFloat8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

int dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat8E4M3: return 1;
  }
  return 0;
}

TensorView TensorView::contiguous(void* data, DType dtype, int ndim, const int64_t* shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;  // kept as given (even out of range) so validation can report it
  const int n = std::clamp(ndim, 0, kMaxTensorDims);
  int64_t running = 1;
  for (int i = n - 1; i >= 0; --i) {
    t.shape[i] = shape ? shape[i] : 0;
    t.stride[i] = running;
    running *= std::max<int64_t>(t.shape[i], 1);
  }
  return t;
}

TensorView TensorView::make4d(void* data, DType dtype, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                              int64_t st0, int64_t st1, int64_t st2, int64_t st3) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  t.shape[0] = s0; t.shape[1] = s1; t.shape[2] = s2; t.shape[3] = s3;
  t.stride[0] = st0; t.stride[1] = st1; t.stride[2] = st2; t.stride[3] = st3;
  return t;
}

TensorView TensorView::make3d(void* data, DType dtype, int64_t s0, int64_t s1, int64_t s2,
                              int64_t st0, int64_t st1, int64_t st2) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = 3;
  t.shape[0] = s0; t.shape[1] = s1; t.shape[2] = s2;
  t.stride[0] = st0; t.stride[1] = st1; t.stride[2] = st2;
  return t;
}

// Number of elements; 0 for an undefined view or when any dim is negative;
// saturates at INT64_MAX.
int64_t TensorView::numel() const {
  if (ndim <= 0) return data != nullptr && ndim == 0 ? 1 : 0;
  const int n = std::min(ndim, kMaxTensorDims);
  for (int i = 0; i < n; ++i)
    if (shape[i] <= 0) return 0;
  int64_t total = 1;
  for (int i = 0; i < n; ++i)
    if (__builtin_mul_overflow(total, shape[i], &total)) return INT64_MAX;  // saturate
  return total;
}

const char* version() { return FLASH3_VERSION_STRING; }

bool serving_wip_built() { return FLASH3_SERVING_WIP != 0; }

}  // namespace flash3
