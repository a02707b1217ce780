// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Checked CUDA calls: every runtime call and launch goes through these so a
// failure becomes a Status that names the call, never a silent wrong answer.
#pragma once
#include <string>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3 {

// gridDim.y / gridDim.z limit.
constexpr int kMaxGridYZ = 65535;

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Cuda(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// A runtime call's own result as a Status. Only the call's return value is
// looked at, never cudaGetLastError(), which would also report an error left
// pending by the caller's earlier work. A failed call has set the runtime's
// last-error state too: it is consumed, so that flash3 leaves no error of its
// own pending (a sticky error stays, as it must).
inline Status cuda_call(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return cuda_status(e, what);
}

#define FLASH3_CUDA_TRY(expr)                                              \
  do {                                                                     \
    ::flash3::Status _s = ::flash3::cuda_call((expr), #expr);              \
    if (!_s.ok()) return _s;                                               \
  } while (0)

#define FLASH3_RETURN_IF_ERROR(expr)      \
  do {                                    \
    ::flash3::Status _st = (expr);        \
    if (!_st.ok()) return _st;            \
  } while (0)

// SMs of the current device (the persistent forward grid, the backward's tail
// group size).
inline Status current_sm_count(int* num_sms) {
  int device = 0;
  FLASH3_CUDA_TRY(cudaGetDevice(&device));
  FLASH3_CUDA_TRY(cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device));
  return Status::Ok();
}

}  // namespace flash3
