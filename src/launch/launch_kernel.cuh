// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Kernel launches and TMA descriptors as Statuses (used by the launch templates).
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "common/cuda_check.h"

namespace flash3 {

// kernel<<<grid, block, smem, stream>>>(args...), with this launch's own
// error: cudaLaunchKernelEx returns it directly, so an error left pending by
// the caller's earlier work is neither reported as ours nor consumed
// (cuda_call consumes only a failure of this launch).
template <class... KernelArgs, class... Args>
Status launch_kernel(const char* what, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  return cuda_call(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

// kKernel<<<grid, block, smem, stream>>>(args...) for a kernel whose dynamic
// shared memory may exceed the default 48 KB. The limit is raised with
// cudaFuncSetAttribute once per kernel and device rather than before every
// launch: a successful cudaFuncSetAttribute also resets the runtime's pending
// error (measured with the CUDA 13 runtime on the H200), which would clear an
// error the caller left pending, and it costs a runtime call per launch.
template <auto kKernel, class... Args>
Status launch_kernel_smem(const char* what, dim3 grid, dim3 block, int smem, cudaStream_t stream, Args&&... args) {
  static std::atomic<uint64_t> set_on_device{0};  // bit d: done on device d (d < 64)
  int device = 0;
  FLASH3_CUDA_TRY(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || !(set_on_device.load(std::memory_order_acquire) & bit)) {
    FLASH3_CUDA_TRY(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    set_on_device.fetch_or(bit, std::memory_order_acq_rel);
  }
  return launch_kernel(what, kKernel, grid, block, size_t(smem), stream, std::forward<Args>(args)...);
}

// CuTe's make_tma_copy reports a failed cuTensorMapEncodeTiled only on stderr
// (and an assert compiled out of release builds), leaving the descriptor
// zero-filled. Validation enforces TMA's rules beforehand; this catches what
// it could not foresee before anything is launched.
template <class TmaCopy>
Status check_tma_descriptor(TmaCopy const& tma, const char* tensor) {
  const auto* desc = tma.get_tma_descriptor();
  unsigned char bytes[sizeof(*desc)];
  std::memcpy(bytes, desc, sizeof(bytes));
  for (unsigned char b : bytes)
    if (b != 0) return Status::Ok();
  return {StatusCode::kInternal, std::string("the TMA descriptor of ") + tensor +
                                     " could not be built (cuTensorMapEncodeTiled failed; its arguments are printed "
                                     "on stderr)"};
}

}  // namespace flash3
