// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Device-side helpers of the GPU tests that are not a reference: a stream gate
// (a kernel that holds a stream until the host opens it), a counter-based
// random fill for tensors too large to fill from the host, bitwise comparison
// and zero counting on the device, and a pending launch error.
//
// This header is plain C++ (no device code) so it can be included from .cpp files.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3::gputest {

// Fills n 16-bit elements with standard normal values rounded to `dtype`
// (kFloat16 / kBFloat16), never zero (|x| >= 1e-3); element i depends only on
// (seed, i), so any slice can be regenerated or copied back and compared.
cudaError_t fill_normal_device(void* dst, int64_t n, DType dtype, uint64_t seed, cudaStream_t stream);

// *count += number of i < n with a[i] != b[i] (bit patterns of 2- or 4-byte
// elements). `count` is a device pointer.
cudaError_t count_mismatches(const void* a, const void* b, int64_t n, int elem_bytes, unsigned long long* count,
                             cudaStream_t stream);

// *count += number of 16-bit elements of p[0, n) that are neither +0 nor -0
// (NaN counts). `count` is a device pointer.
cudaError_t count_nonzero16(const void* p, int64_t n, unsigned long long* count, cudaStream_t stream);

// *count += number of NaN elements of the 16-bit `dtype` array p[0, n) (the
// 0xff poison is NaN in both 16-bit dtypes). `count` is a device pointer.
cudaError_t count_nan16(const void* p, int64_t n, DType dtype, unsigned long long* count, cudaStream_t stream);

// Launches a kernel with an invalid block size and returns cudaPeekAtLastError()
// (cudaErrorInvalidValue with the CUDA 13 runtime): the error is left pending for the next
// cudaGetLastError() of this thread, as a caller's unrelated failed launch would.
cudaError_t leave_pending_launch_error();

// Number of bytes of device memory [p, p + bytes) that differ from `value`,
// read on a private non-blocking stream (so the read waits for no other
// stream, in particular not for a gated one).
cudaError_t count_bytes_not(const void* p, size_t bytes, uint8_t value, int64_t* count);

// Holds a stream: the constructor enqueues a kernel that spins until open() (or
// the destructor) sets a flag in host-mapped pinned memory, so work enqueued on
// the stream after it cannot start before then while other streams run freely.
// The kernel gives up after `timeout_s` (timed_out() then says so), so a test
// that loses track of the gate cannot hang; the destructor opens the gate and
// waits for the stream, on every exit path.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream, double timeout_s = 20.0);
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  cudaError_t status() const { return err_; }  // of setting up the gate
  void open();
  // Valid once the stream has drained past the gate.
  bool timed_out() const;

 private:
  cudaStream_t stream_;
  int* flags_ = nullptr;  // host-mapped: [0] open (host writes), [1] timed out (device writes)
  cudaError_t err_ = cudaSuccess;
};

}  // namespace flash3::gputest
