// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// The few PTX operations CuTe has no wrapper for: the TMA bulk reduce-add that
// accumulates dQ into global fp32 (seed 7.6), the bulk-group completion wait,
// and the acquire/release pair of the deterministic-mode semaphores.
#pragma once
#include <cstdint>

#include <cute/arch/util.hpp>
#include <cutlass/cutlass.h>

namespace flash3 {

// gmem[i] += smem[i] for bytes/4 floats, performed by the TMA unit near L2; the
// issuing thread's involvement ends at issue. Both addresses 16-byte aligned.
CUTLASS_DEVICE void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  const uint32_t s = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :
               : "l"(gmem), "r"(s), "r"(bytes)
               : "memory");
}

CUTLASS_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// At most N bulk groups pending, counting only their shared-memory reads: the
// staging buffer may be overwritten once this returns.
template <int N>
CUTLASS_DEVICE void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// At most N bulk groups pending, counting their global writes as well.
template <int N>
CUTLASS_DEVICE void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

CUTLASS_DEVICE int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

CUTLASS_DEVICE void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace flash3
