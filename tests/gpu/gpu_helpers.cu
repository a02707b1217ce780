// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Device-side test helpers; see gpu_helpers.cuh for the contracts.
#include "gpu_helpers.cuh"

#include <algorithm>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace flash3::gputest {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Grid-stride loops cover any n with a bounded grid.
int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(std::clamp<int64_t>(blocks, 1, 132 * 32));
}

template <bool kBf16>
__global__ void fill_normal_kernel(uint16_t* dst, int64_t n, uint64_t key) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r1 = mix64(key + 2 * uint64_t(i)), r2 = mix64(key + 2 * uint64_t(i) + 1);
    const float u1 = (float(r1 >> 40) + 1.f) * (1.f / 16777216.f);  // (0, 1]
    const float u2 = float(r2 >> 40) * (1.f / 16777216.f);
    float x = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if (fabsf(x) < 1e-3f) x = x < 0.f ? -1e-3f : 1e-3f;
    if (kBf16) dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    else dst[i] = __half_as_ushort(__float2half_rn(x));
  }
}

template <class T>
__global__ void count_mismatches_kernel(const T* a, const T* b, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(count, local);
}

__global__ void count_nonzero16_kernel(const uint16_t* p, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    local += (p[i] & 0x7fffu) != 0;
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(count, local);
}

// NaN: all exponent bits set and a non-zero mantissa; `exp_mask` is the
// dtype's exponent field (0x7f80 bf16, 0x7c00 fp16).
__global__ void count_nan16_kernel(const uint16_t* p, int64_t n, uint16_t exp_mask, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    local += (p[i] & 0x7fffu) > exp_mask;
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(count, local);
}

__global__ void empty_kernel() {}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until flags[0] != 0 (written by the host through the mapping) or the
// timeout passes; then records which one happened in flags[1].
__global__ void gate_kernel(volatile int* flags, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (flags[0] == 0) {
    if (global_ns() - start > timeout_ns) {
      flags[1] = 1;
      return;
    }
    __nanosleep(1000);
  }
}

}  // namespace

cudaError_t fill_normal_device(void* dst, int64_t n, DType dtype, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return cudaErrorInvalidValue;
  const uint64_t key = seed * 0x2545f4914f6cdd1dull ^ 0x5eedf1a5ull;
  const int grid = grid_for(n, 256);
  if (dtype == DType::kBFloat16)
    fill_normal_kernel<true><<<grid, 256, 0, stream>>>(static_cast<uint16_t*>(dst), n, key);
  else
    fill_normal_kernel<false><<<grid, 256, 0, stream>>>(static_cast<uint16_t*>(dst), n, key);
  return cudaGetLastError();
}

cudaError_t count_mismatches(const void* a, const void* b, int64_t n, int elem_bytes, unsigned long long* count,
                             cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int grid = grid_for(n, 256);
  if (elem_bytes == 2)
    count_mismatches_kernel<uint16_t><<<grid, 256, 0, stream>>>(static_cast<const uint16_t*>(a),
                                                                static_cast<const uint16_t*>(b), n, count);
  else if (elem_bytes == 4)
    count_mismatches_kernel<uint32_t><<<grid, 256, 0, stream>>>(static_cast<const uint32_t*>(a),
                                                                static_cast<const uint32_t*>(b), n, count);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t count_nonzero16(const void* p, int64_t n, unsigned long long* count, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  count_nonzero16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const uint16_t*>(p), n, count);
  return cudaGetLastError();
}

cudaError_t count_nan16(const void* p, int64_t n, DType dtype, unsigned long long* count, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return cudaErrorInvalidValue;
  const uint16_t exp_mask = dtype == DType::kBFloat16 ? 0x7f80u : 0x7c00u;
  count_nan16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const uint16_t*>(p), n, exp_mask, count);
  return cudaGetLastError();
}

cudaError_t leave_pending_launch_error() {
  empty_kernel<<<1, 4096>>>();  // more than 1024 threads per block: invalid configuration
  return cudaPeekAtLastError();
}

cudaError_t count_bytes_not(const void* p, size_t bytes, uint8_t value, int64_t* count) {
  *count = 0;
  if (bytes == 0) return cudaSuccess;
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return e;
  std::vector<uint8_t> h(bytes);
  e = cudaMemcpyAsync(h.data(), p, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  if (e != cudaSuccess) return e;
  for (uint8_t x : h) *count += x != value;
  return cudaSuccess;
}

StreamGate::StreamGate(cudaStream_t stream, double timeout_s) : stream_(stream) {
  err_ = cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped);
  if (err_ != cudaSuccess) {
    flags_ = nullptr;
    return;
  }
  flags_[0] = flags_[1] = 0;
  int* dev_flags = nullptr;
  err_ = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_flags), flags_, 0);
  if (err_ != cudaSuccess) return;
  gate_kernel<<<1, 1, 0, stream_>>>(dev_flags, uint64_t(timeout_s * 1e9));
  err_ = cudaGetLastError();
}

void StreamGate::open() {
  if (flags_ != nullptr) reinterpret_cast<volatile int*>(flags_)[0] = 1;
}

bool StreamGate::timed_out() const {
  return flags_ != nullptr && reinterpret_cast<volatile int*>(flags_)[1] != 0;
}

StreamGate::~StreamGate() {
  open();
  cudaStreamSynchronize(stream_);
  if (flags_ != nullptr) cudaFreeHost(flags_);
}

}  // namespace flash3::gputest
