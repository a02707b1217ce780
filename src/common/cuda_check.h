// Checked CUDA calls: every runtime call and launch goes through these so a
// failure becomes a Status that names the call, never a silent wrong answer.
#pragma once
#include <string>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3 {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Cuda(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// After a kernel launch: reports launch-configuration errors (too much smem,
// bad grid) without synchronising.
inline Status check_last_launch(const char* what) { return cuda_status(cudaGetLastError(), what); }

#define FLASH3_CUDA_TRY(expr)                                              \
  do {                                                                     \
    ::flash3::Status _s = ::flash3::cuda_status((expr), #expr);            \
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
