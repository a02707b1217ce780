// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Host-side helpers for the GPU tests: 16-bit conversions, deterministic
// parallel random fill, device buffers, and the built-variants list.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3::testutil {

// ---------------------------------------------------------------------------
// 16-bit <-> float (round-to-nearest-even), host only.
// ---------------------------------------------------------------------------
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // subnormal: man * 2^-24
    const float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (au < 0x38800000u) {                                   // below 2^-14: subnormal or zero
    // value = m * 2^-24 with m = round_even(|f| * 2^24)
    const float scaled = bits_f32(au) * 16777216.f;  // exact (power of two)
    const float r = std::nearbyint(scaled);           // default rounding mode: to nearest even
    return uint16_t(sign | uint16_t(r));
  }
  uint32_t exp = (au >> 23) - 112u;  // rebias 127 -> 15
  uint32_t man = au & 0x7fffffu;
  uint32_t h = (exp << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return uint16_t(sign | h);
}

inline float half_bits_to_float(DType t, uint16_t h) {
  return t == DType::kBFloat16 ? bf16_to_float(h) : fp16_to_float(h);
}
inline uint16_t float_to_half_bits(DType t, float f) {
  return t == DType::kBFloat16 ? float_to_bf16(f) : float_to_fp16(f);
}

// ---------------------------------------------------------------------------
// Parallel loops (deterministic results: work is split by index only).
// ---------------------------------------------------------------------------
inline int host_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return int(std::clamp(hw == 0 ? 1u : hw, 1u, 8u));
}

template <class F>
void parallel_for(size_t n, F&& fn) {  // fn(begin, end)
  const int nt = (n < (size_t(1) << 16)) ? 1 : host_threads();
  if (nt == 1) {
    fn(size_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t chunk = (n + nt - 1) / nt;
  for (int t = 0; t < nt; ++t) {
    const size_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

// ---------------------------------------------------------------------------
// Counter-based normal random numbers: value i depends only on (seed, i).
// ---------------------------------------------------------------------------
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Standard normal values rounded to `dtype`, never zero (|x| >= 1e-3 keeps every
// element a real contribution after rounding).
inline void fill_normal(uint16_t* dst, size_t n, DType dtype, uint64_t seed) {
  const uint64_t key = splitmix64(seed ^ 0x5eedf1a5ull);
  parallel_for((n + 1) / 2, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const uint64_t r1 = splitmix64(key + 2 * i), r2 = splitmix64(key + 2 * i + 1);
      const double u1 = (double(r1 >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
      const double u2 = double(r2 >> 11) * (1.0 / 9007199254740992.0);
      const double rad = std::sqrt(-2.0 * std::log(u1));
      const double ang = 6.283185307179586 * u2;
      double z[2] = {rad * std::cos(ang), rad * std::sin(ang)};
      for (int k = 0; k < 2; ++k) {
        const size_t idx = 2 * i + k;
        if (idx >= n) break;
        double x = z[k];
        if (std::fabs(x) < 1e-3) x = x < 0 ? -1e-3 : 1e-3;
        dst[idx] = float_to_half_bits(dtype, float(x));
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Device memory.
// ---------------------------------------------------------------------------
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  // Grows (never shrinks) to at least `n` bytes; the contents are not kept.
  cudaError_t reserve(size_t n) {
    if (n <= bytes && ptr) return cudaSuccess;
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    const size_t want = std::max<size_t>(n, 256);
    cudaError_t e = cudaMalloc(&ptr, want);
    if (e == cudaSuccess) bytes = want;
    return e;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// ---------------------------------------------------------------------------
// Built variants, as listed by the manifest ("fwd bf16 128 128 none" lines:
// pass, dtype, d, dv, feature).
// ---------------------------------------------------------------------------
struct Variant {
  std::string pass, dtype;
  int d = 0, dv = 0;
  std::string feature = "none";
};

// The build's variants.txt; the environment variable FLASH3_VARIANTS_FILE
// overrides the compiled-in path (test binaries run from another checkout).
inline std::string variants_path(const char* compiled_in) {
  const char* env = std::getenv("FLASH3_VARIANTS_FILE");
  return (env != nullptr && *env != '\0') ? std::string(env) : std::string(compiled_in);
}

// The variants of one feature ("none": the plain kernels).
inline std::vector<Variant> read_variants(const std::string& path, bool* found = nullptr,
                                          const std::string& feature = "none") {
  std::vector<Variant> out;
  std::ifstream f(path);
  if (found) *found = bool(f);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    Variant v;
    if (!(is >> v.pass >> v.dtype >> v.d >> v.dv)) continue;
    if (!(is >> v.feature)) v.feature = "none";
    if (v.feature == feature) out.push_back(v);
  }
  return out;
}

inline const char* short_dtype(DType t) {
  switch (t) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kFloat8E4M3: return "fp8";
  }
  return "?";
}

}  // namespace flash3::testutil

#define FLASH3_CUDA_OK(expr)                                                                  \
  do {                                                                                        \
    const cudaError_t _e = (expr);                                                            \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorName(_e) << " ("               \
                               << cudaGetErrorString(_e) << ")";                              \
  } while (0)

// First statement of every GPU test.
#define FLASH3_SKIP_WITHOUT_HOPPER()                             \
  do {                                                           \
    std::string _why;                                            \
    if (!::flash3::device_is_supported(&_why)) {                 \
      GTEST_SKIP() << "no supported GPU: " << _why;              \
    }                                                            \
  } while (0)
