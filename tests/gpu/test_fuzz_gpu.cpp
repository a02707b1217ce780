// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU half of the bad-input fuzz (issue 39, "no input crashes the process";
// the CPU half is tests/unit/test_fuzz_inputs.cpp): every entry point called
// with real device buffers and seeded bad arguments that a CPU test cannot
// make: pointers offset 1..15 bytes into larger allocations, outputs aliasing
// inputs, new KV rows that are a view of the cache they are appended to,
// k_cache == v_cache with an append, int32 arrays and descales inside an
// output, host (pageable and pinned) pointers, caller workspaces misaligned,
// too small or overlapping an input, bad scalars (NaN / inf / negative /
// subnormal scale and softcap, out-of-range num_splits / pack_gqa).
//
// All buffers of a test live in one device allocation (the arena). Before each
// bad call the outputs and the workspace are filled with a poison pattern and
// the whole arena is copied to the host; the call must be rejected
// (InvalidArgument / NotSupported, a message naming the argument), leave no
// CUDA error pending, and leave every byte of the arena (inputs, caches,
// outputs, workspace) as it was. Every few bad calls a valid call runs and must
// reproduce, bit for bit, the first valid call's outputs and caches (same
// inputs; the backward runs deterministic). A silently accepted call is
// reported and the arena restored, so one failure does not cascade.
//
// Small problems: the suite runs in seconds and under
//   compute-sanitizer --tool memcheck build/tests/flash3_gpu_tests --gtest_filter='FuzzGpu.*'
// (every view stays inside the arena, so memcheck sees only what the library
// itself reads or writes out of bounds). Each test skips without a Hopper GPU
// or without the kernels it needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_test_util.h"

namespace {

using flash3::BackwardArgs;
using flash3::CombineArgs;
using flash3::DType;
using flash3::ForwardArgs;
using flash3::KVCacheArgs;
using flash3::QuantizeFp8Args;
using flash3::Status;
using flash3::StatusCode;
using flash3::TensorView;
namespace tu = flash3::testutil;

constexpr uint64_t kSeed = 0x39f022e5eedull;
constexpr uint8_t kPoison = 0xA5;
constexpr int kBadCalls = 60;   // per test
constexpr int kValidEvery = 6;  // a valid call after every few bad ones
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void* offset(const void* p, int64_t bytes) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes));
}

TensorView dense(void* p, DType dt, std::initializer_list<int64_t> shape) {
  int64_t sh[flash3::kMaxTensorDims] = {};
  int n = 0;
  for (int64_t x : shape) sh[n++] = x;
  return TensorView::contiguous(p, dt, n, sh);
}

std::string fstr(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", double(x));
  return buf;
}

std::string code_name(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kCudaError: return "CudaError";
    case StatusCode::kInternal: return "Internal";
  }
  return "?";
}

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `name` occurs in `msg` as a whole word.
bool names_arg(const std::string& msg, const std::string& name) {
  for (size_t pos = msg.find(name); pos != std::string::npos; pos = msg.find(name, pos + 1)) {
    const size_t end = pos + name.size();
    if ((pos == 0 || !is_ident(msg[pos - 1])) && (end >= msg.size() || !is_ident(msg[end]))) return true;
  }
  return false;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_); }
  template <class T>
  T pick(std::initializer_list<T> v) {
    return *(v.begin() + range(0, static_cast<int64_t>(v.size()) - 1));
  }
  // A byte offset in [1, 15] that is not a multiple of `align`.
  int64_t misalign(int64_t align) {
    for (;;) {
      const int64_t o = range(1, 15);
      if (o % align != 0) return o;
    }
  }

 private:
  std::mt19937_64 g_;
};

// ---------------------------------------------------------------------------
// The arena: every buffer of a test in one allocation, snapshots of all of it.
// ---------------------------------------------------------------------------
enum class Role {
  kInput,    // read by the calls
  kState,    // a cache: written by valid calls (the same bits each time), never by bad ones
  kOutput,   // poisoned before every call
  kScratch,  // a caller workspace: poisoned; its contents after a valid call are not compared
};

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (base_ != nullptr) cudaFree(base_);
  }

  // Regions start 256-byte aligned with 512 bytes of slack after each (views
  // offset by a few bytes stay inside the arena); 1 MiB of tail for views that
  // run past their region.
  void add(const std::string& name, size_t bytes, Role role) {
    regions_.push_back({name, size_, bytes, role});
    size_ += (bytes + 512 + 255) / 256 * 256;
  }
  cudaError_t allocate() {
    size_ += size_t(1) << 20;
    const cudaError_t e = cudaMalloc(&base_, size_);
    if (e == cudaSuccess) return cudaMemset(base_, 0, size_);
    return e;
  }
  void* operator[](const std::string& name) const {
    for (const Region& r : regions_)
      if (r.name == name) return static_cast<char*>(base_) + r.off;
    ADD_FAILURE() << "no region " << name;
    return nullptr;
  }
  size_t bytes(const std::string& name) const {
    for (const Region& r : regions_)
      if (r.name == name) return r.bytes;
    return 0;
  }
  cudaError_t poison() const {
    for (const Region& r : regions_)
      if (r.role == Role::kOutput || r.role == Role::kScratch) {
        const cudaError_t e = cudaMemset(static_cast<char*>(base_) + r.off, kPoison, r.bytes);
        if (e != cudaSuccess) return e;
      }
    return cudaDeviceSynchronize();
  }
  cudaError_t snapshot(std::vector<uint8_t>* img) const {
    img->resize(size_);
    return cudaMemcpy(img->data(), base_, size_, cudaMemcpyDeviceToHost);
  }
  cudaError_t restore(const std::vector<uint8_t>& img) const {
    return cudaMemcpy(base_, img.data(), size_, cudaMemcpyHostToDevice);
  }
  // The regions whose bytes differ between two snapshots, and "slack after <region>" for
  // the bytes between regions (regions are laid out in order).
  std::string changed(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, bool with_scratch) const {
    std::string out;
    for (size_t i = 0; i < regions_.size(); ++i) {
      const Region& r = regions_[i];
      const size_t end = r.off + r.bytes, next = i + 1 < regions_.size() ? regions_[i + 1].off : size_;
      if ((r.role != Role::kScratch || with_scratch) && std::memcmp(a.data() + r.off, b.data() + r.off, r.bytes) != 0)
        out += (out.empty() ? "" : ", ") + r.name;
      if (std::memcmp(a.data() + end, b.data() + end, next - end) != 0)
        out += (out.empty() ? "" : ", ") + std::string("the slack after ") + r.name;
    }
    return out;
  }
  // Whether every output region was written by the call (differs from the poison somewhere).
  std::string unwritten_outputs(const std::vector<uint8_t>& img) const {
    std::string out;
    for (const Region& r : regions_) {
      if (r.role != Role::kOutput) continue;
      bool written = false;
      for (size_t i = r.off; i < r.off + r.bytes && !written; ++i) written = img[i] != kPoison;
      if (!written) out += (out.empty() ? "" : ", ") + r.name;
    }
    return out;
  }

 private:
  struct Region {
    std::string name;
    size_t off, bytes;
    Role role;
  };
  void* base_ = nullptr;
  size_t size_ = 0;
  std::vector<Region> regions_;
};

cudaError_t upload16(void* dst, size_t n, DType dt, uint64_t seed) {
  std::vector<uint16_t> h(n);
  tu::fill_normal(h.data(), n, dt, seed);
  return cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice);
}

cudaError_t upload_f32(void* dst, size_t n, float lo, float hi, uint64_t seed) {
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> h(n);
  for (float& x : h) x = u(g);
  return cudaMemcpy(dst, h.data(), n * 4, cudaMemcpyHostToDevice);
}

// e4m3 values of magnitude below 2 (no NaN: 0x7f / 0xff).
cudaError_t upload_fp8(void* dst, size_t n, uint64_t seed) {
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::vector<uint8_t> h(n);
  for (uint8_t& x : h) x = static_cast<uint8_t>((g() & 0x80u) | (g() % 0x40u));
  return cudaMemcpy(dst, h.data(), n, cudaMemcpyHostToDevice);
}

cudaError_t upload_i32(void* dst, const std::vector<int32_t>& v) {
  return cudaMemcpy(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
}

// Host memory for the "host pointer" cases: pageable and page-locked.
struct HostBuffers {
  std::vector<uint8_t> pageable = std::vector<uint8_t>(size_t(8) << 20);
  void* pinned = nullptr;
  HostBuffers() {
    if (cudaMallocHost(&pinned, size_t(8) << 20) != cudaSuccess) pinned = nullptr;
  }
  ~HostBuffers() {
    if (pinned != nullptr) cudaFreeHost(pinned);
  }
  // 256-byte aligned host address (pageable or pinned).
  void* pick(Rng& r) {
    if (pinned != nullptr && r.range(0, 1) == 1) return pinned;
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(pageable.data()) + 255) / 256 * 256);
  }
};

// ---------------------------------------------------------------------------
// The fuzz loop.
// ---------------------------------------------------------------------------
struct Failure {
  int count = 0;
  std::string example;
};

struct Tally {
  explicit Tally(std::string e) : entry(std::move(e)) {}
  std::string entry;
  int bad = 0, valid = 0;
  std::map<std::string, Failure> failures;
  void fail(const std::string& kind, const std::string& example) {
    Failure& f = failures[kind];
    if (f.count++ == 0) f.example = example;
  }
  void report() const {
    int n = 0;
    for (const auto& [k, f] : failures) n += f.count;
    std::printf("[fuzz gpu] %s: %d bad calls, %d valid calls, failures %d (%zu kinds)\n", entry.c_str(), bad, valid, n,
                failures.size());
    std::fflush(stdout);
    for (const auto& [k, f] : failures)
      ADD_FAILURE() << entry << ": " << k << " (" << f.count << " case" << (f.count > 1 ? "s" : "") << "), e.g. "
                    << f.example;
  }
};

// One bad argument set: edit() corrupts a copy of the valid arguments (false:
// not applicable here); it runs after the poisoning and may prepare device
// memory (the arena is restored after every bad call). The message must name
// one of `names` (empty: any).
template <class A>
struct Bad {
  std::string kind;
  std::vector<std::string> names;
  std::function<bool(A&, Rng&, std::string*)> edit;
};

template <class A>
void run_fuzz(Tally& t, const Arena& arena, const A& valid, const std::function<Status(const A&)>& call,
              const std::vector<Bad<A>>& bads, uint64_t seed) {
  Rng r(seed);
  std::vector<uint8_t> golden, before, after;
  // The reference: the first valid call.
  ASSERT_EQ(arena.poison(), cudaSuccess);
  const Status first = call(valid);
  ASSERT_TRUE(first.ok()) << t.entry << ": the valid call fails: " << first.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << t.entry << ": the valid call";
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(arena.snapshot(&golden), cudaSuccess);
  ++t.valid;
  const std::string unwritten = arena.unwritten_outputs(golden);
  ASSERT_TRUE(unwritten.empty()) << t.entry << ": the valid call left " << unwritten << " unwritten";

  auto valid_again = [&](const std::string& after_kind) {
    ASSERT_EQ(arena.poison(), cudaSuccess);
    const Status s = call(valid);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << t.entry << ": a valid call after " << after_kind;
    ++t.valid;
    if (!s.ok()) t.fail("a valid call fails after bad calls", after_kind + ": " + s.message);
    ASSERT_EQ(arena.snapshot(&after), cudaSuccess);
    const std::string diff = arena.changed(golden, after, /*with_scratch=*/false);
    if (!diff.empty()) t.fail("a valid call differs from the first one in " + diff, "after " + after_kind);
    ASSERT_EQ(arena.restore(golden), cudaSuccess);
  };

  for (int i = 0; i < kBadCalls; ++i) {
    const Bad<A>& b = bads[size_t(i) % bads.size()];
    A a = valid;
    std::string detail;
    ASSERT_EQ(arena.poison(), cudaSuccess);
    if (!b.edit(a, r, &detail)) continue;
    ASSERT_EQ(arena.snapshot(&before), cudaSuccess);
    ++t.bad;
    const Status s = call(a);
    const cudaError_t sync = cudaDeviceSynchronize();
    ASSERT_EQ(sync, cudaSuccess) << t.entry << ": " << b.kind << " (" << detail << "): " << cudaGetErrorName(sync)
                                 << ", status " << code_name(s.code) << " \"" << s.message << "\"";
    const cudaError_t pending = cudaGetLastError();
    const std::string ex = detail + " -> " + code_name(s.code) + " \"" + s.message + "\"";
    if (pending != cudaSuccess) t.fail(b.kind + ": CUDA error left pending (" + cudaGetErrorName(pending) + ")", ex);
    ASSERT_EQ(arena.snapshot(&after), cudaSuccess);
    const std::string diff = arena.changed(before, after, /*with_scratch=*/true);
    if (s.ok()) {
      t.fail(b.kind + ": accepted", ex);
    } else if (s.code != StatusCode::kInvalidArgument && s.code != StatusCode::kNotSupported) {
      t.fail(b.kind + ": status " + code_name(s.code), ex);
    } else if (s.message.empty()) {
      t.fail(b.kind + ": empty message", ex);
    } else if (!b.names.empty()) {
      bool named = false;
      for (const std::string& n : b.names) named = named || names_arg(s.message, n);
      if (!named) {
        std::string want;
        for (const std::string& n : b.names) want += (want.empty() ? "" : " / ") + n;
        t.fail(b.kind + ": message does not name " + want, ex);
      }
    }
    if (!diff.empty()) t.fail(b.kind + ": modified " + diff, ex);
    ASSERT_EQ(arena.restore(golden), cudaSuccess);
    if ((t.bad % kValidEvery) == 0) {
      valid_again(b.kind);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  valid_again("the last bad call");
}

// A bf16 head dim with the kernels needed (forward, and backward when asked).
int pick_head_dim(DType dt, bool backward) {
  for (int d : {128, 64, 96, 192, 256})
    if (flash3::forward_is_built(dt, d, d) && (!backward || flash3::backward_is_built(dt, d, d))) return d;
  return 0;
}

// Bad scalars shared by the attention entry points (opts of ForwardArgs,
// BackwardArgs, KVCacheArgs).
template <class A>
void add_scalar_bads(std::vector<Bad<A>>* v) {
  v->push_back({"softmax_scale negative / infinite", {"opts.softmax_scale"}, [](A& a, Rng& r, std::string* d) {
                  a.opts.softmax_scale = r.pick({-1.f, -1e-30f, kInf, -kInf});
                  *d = "softmax_scale = " + fstr(a.opts.softmax_scale);
                  return true;
                }});
  v->push_back({"softmax_scale subnormal / huge", {"opts.softmax_scale"}, [](A& a, Rng& r, std::string* d) {
                  a.opts.softmax_scale = r.pick({1e-40f, 1e-39f, std::numeric_limits<float>::denorm_min(), 3e38f});
                  *d = "softmax_scale = " + fstr(a.opts.softmax_scale);
                  return true;
                }});
  v->push_back({"softcap negative / NaN / infinite", {"opts.softcap"}, [](A& a, Rng& r, std::string* d) {
                  a.opts.softcap = r.pick({-1.f, kNaN, kInf, -kInf});
                  *d = "softcap = " + fstr(a.opts.softcap);
                  return true;
                }});
  v->push_back({"softcap subnormal / so large that scale / softcap is subnormal",
                {"opts.softcap"},
                [](A& a, Rng& r, std::string* d) {
                  a.opts.softcap = r.pick({1e-40f, std::numeric_limits<float>::denorm_min(), 1e38f, 3e38f});
                  *d = "softcap = " + fstr(a.opts.softcap);
                  return true;
                }});
  v->push_back({"num_splits out of range", {"opts.num_splits"}, [](A& a, Rng& r, std::string* d) {
                  a.opts.num_splits = r.pick({-1, 257, 1000000});
                  *d = "num_splits = " + std::to_string(a.opts.num_splits);
                  return true;
                }});
  v->push_back({"pack_gqa out of range", {"opts.pack_gqa"}, [](A& a, Rng& r, std::string* d) {
                  a.opts.pack_gqa = r.pick({-2, 2, 7});
                  *d = "pack_gqa = " + std::to_string(a.opts.pack_gqa);
                  return true;
                }});
}

// data + 1..15 bytes (not a multiple of align) of the view `field`.
template <class A>
Bad<A> misaligned(const std::string& name, TensorView A::*field, int64_t align) {
  return {name + " misaligned", {name}, [=](A& a, Rng& r, std::string* d) {
            const int64_t o = r.misalign(align);
            (a.*field).data = offset((a.*field).data, o);
            *d = name + ".data + " + std::to_string(o) + " bytes";
            return true;
          }};
}

// `moved` placed inside `target` (at a 16-byte multiple): an output aliasing an input or another output.
template <class A>
Bad<A> alias(const std::string& moved, TensorView A::*mf, const std::string& target, TensorView A::*tf,
             const std::vector<std::string>& names) {
  return {moved + " inside " + target, names, [=](A& a, Rng& r, std::string* d) {
            const TensorView& t = a.*tf;
            int64_t span = 0;
            for (int i = 0; i < t.ndim; ++i) span += (t.shape[i] - 1) * t.stride[i];
            span = (span + 1) * flash3::dtype_size(t.dtype);
            const int64_t off = 16 * r.range(0, std::max<int64_t>(span / 16 - 1, 0));
            (a.*mf).data = offset(t.data, off);
            *d = moved + ".data = " + target + ".data + " + std::to_string(off);
            return true;
          }};
}

// The caller's workspace: misaligned, too small (where the call needs one), overlapping an input.
template <class A>
void add_workspace_bads(std::vector<Bad<A>>* v, size_t need, void* overlap_with, const std::string& overlap_name) {
  v->push_back({"workspace misaligned", {"workspace"}, [](A& a, Rng& r, std::string* d) {
                  const int64_t o = r.range(1, 255);
                  a.workspace = offset(a.workspace, o);
                  *d = "workspace + " + std::to_string(o) + " bytes";
                  return true;
                }});
  if (need == 0) return;
  v->push_back({"workspace too small", {"workspace"}, [need](A& a, Rng& r, std::string* d) {
                  a.workspace_bytes = size_t(r.range(1, int64_t(need) - 1));
                  *d = "workspace_bytes = " + std::to_string(a.workspace_bytes) + " (needs " + std::to_string(need) +
                       ")";
                  return true;
                }});
  v->push_back({"workspace overlapping " + overlap_name, {"workspace"}, [=](A& a, Rng&, std::string* d) {
                  a.workspace = overlap_with;
                  *d = "workspace = " + overlap_name + ".data (" + std::to_string(need) + " bytes written)";
                  return true;
                }});
}

template <class A>
Bad<A> host_pointer(const std::string& name, TensorView A::*field, HostBuffers* host) {
  return {name + " in host memory", {name, name + ".data"}, [=](A& a, Rng& r, std::string* d) {
            (a.*field).data = host->pick(r);
            *d = name + ".data = a host pointer";
            return true;
          }};
}

template <class A>
Bad<A> zero_stride(const std::string& name, TensorView A::*field, int dim) {
  return {name + " zero stride (written)", {name}, [=](A& a, Rng&, std::string* d) {
            (a.*field).stride[dim] = 0;
            *d = name + ".stride[" + std::to_string(dim) + "] = 0";
            return true;
          }};
}

template <class A>
Bad<A> null_data(const std::string& name, TensorView A::*field) {
  return {name + " null data", {name}, [=](A& a, Rng&, std::string* d) {
            (a.*field).data = nullptr;
            *d = name + ".data = null, shape non-empty";
            return true;
          }};
}

// ---------------------------------------------------------------------------
// forward (16-bit, with split-KV and a caller workspace).
// ---------------------------------------------------------------------------
TEST(FuzzGpu, Forward) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const DType dt = DType::kBFloat16;
  const int d = pick_head_dim(dt, false);
  if (d == 0) GTEST_SKIP() << "not built: no bf16 forward kernel";
  const int64_t b = 2, sq = 64, sk = 1024, hq = 4, hkv = 2;
  Arena arena;
  arena.add("q", b * sq * hq * d * 2, Role::kInput);
  arena.add("q_big", b * sq * hq * (d + 8) * 2, Role::kInput);
  arena.add("k", b * sk * hkv * d * 2, Role::kInput);
  arena.add("v", b * sk * hkv * d * 2, Role::kInput);
  arena.add("out", b * sq * hq * d * 2, Role::kOutput);
  arena.add("lse", b * hq * sq * 4, Role::kOutput);
  ForwardArgs a;
  a.opts.num_splits = 4;
  a.opts.causal = true;
  const auto views = [&](ForwardArgs& x) {
    x.q = dense(arena["q"], dt, {b, sq, hq, d});
    x.k = dense(arena["k"], dt, {b, sk, hkv, d});
    x.v = dense(arena["v"], dt, {b, sk, hkv, d});
    x.out = dense(arena["out"], dt, {b, sq, hq, d});
    x.lse = dense(arena["lse"], DType::kFloat32, {b, hq, sq});
  };
  // Sized before allocation from the shapes (pointers do not matter).
  ForwardArgs sizing;
  sizing.q = dense(nullptr, dt, {b, sq, hq, d});
  sizing.k = dense(nullptr, dt, {b, sk, hkv, d});
  sizing.v = dense(nullptr, dt, {b, sk, hkv, d});
  sizing.opts = a.opts;
  const size_t need = flash3::forward_workspace_size(sizing);
  arena.add("workspace", std::max<size_t>(need, 256), Role::kScratch);
  ASSERT_EQ(arena.allocate(), cudaSuccess);
  ASSERT_EQ(upload16(arena["q"], size_t(b * sq * hq * d), dt, 1), cudaSuccess);
  ASSERT_EQ(upload16(arena["q_big"], size_t(b * sq * hq * (d + 8)), dt, 2), cudaSuccess);
  ASSERT_EQ(upload16(arena["k"], size_t(b * sk * hkv * d), dt, 3), cudaSuccess);
  ASSERT_EQ(upload16(arena["v"], size_t(b * sk * hkv * d), dt, 4), cudaSuccess);
  views(a);
  a.workspace = arena["workspace"];
  a.workspace_bytes = arena.bytes("workspace");
  HostBuffers host;

  using A = ForwardArgs;
  std::vector<Bad<A>> bads = {
      // The repro: q a slice [..., 1:d+1] of a (b, sq, hq, d + 8) tensor, 2 bytes off.
      {"q a misaligned slice of a larger tensor",
       {"q"},
       [&](A& x, Rng&, std::string* what) {
         x.q =
             TensorView::make4d(offset(arena["q_big"], 2), dt, b, sq, hq, d, sq * hq * (d + 8), hq * (d + 8), d + 8, 1);
         *what = "q = q_big[..., 1:" + std::to_string(d + 1) + "]";
         return true;
       }},
      misaligned<A>("q", &A::q, 16),
      misaligned<A>("k", &A::k, 16),
      misaligned<A>("v", &A::v, 16),
      misaligned<A>("out", &A::out, 16),
      misaligned<A>("lse", &A::lse, 4),
      alias<A>("out", &A::out, "q", &A::q, {"out"}),
      alias<A>("out", &A::out, "k", &A::k, {"out"}),
      alias<A>("lse", &A::lse, "out", &A::out, {"lse"}),
      alias<A>("lse", &A::lse, "v", &A::v, {"lse"}),
      alias<A>("out", &A::out, "lse", &A::lse, {"out"}),
      zero_stride<A>("out", &A::out, 1),
      null_data<A>("k", &A::k),
      host_pointer<A>("q", &A::q, &host),
      host_pointer<A>("out", &A::out, &host),
      {"k dtype mismatch",
       {"k", "q"},
       [](A& x, Rng&, std::string* what) {
         x.k.dtype = DType::kFloat16;
         *what = "k.dtype = fp16";
         return true;
       }},
      {"q stride not a multiple of 16 bytes",
       {"q"},
       [](A& x, Rng& r, std::string* what) {
         x.q.stride[1] += r.range(1, 7);
         *what = "q.stride[1] = " + std::to_string(x.q.stride[1]);
         return true;
       }},
  };
  add_scalar_bads(&bads);
  add_workspace_bads(&bads, need, arena["q"], "q");
  Tally t{"forward"};
  run_fuzz<A>(
      t, arena, a, [](const A& x) { return flash3::forward(x, nullptr); }, bads, kSeed ^ 1);
  t.report();
}

// ---------------------------------------------------------------------------
// FP8 forward (descales).
// ---------------------------------------------------------------------------
TEST(FuzzGpu, ForwardFp8) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const DType dt = DType::kFloat8E4M3;
  const int d = pick_head_dim(dt, false);
  if (d == 0) GTEST_SKIP() << "not built: no fp8_e4m3 forward kernel";
  const int64_t b = 2, sq = 128, sk = 256, hq = 4, hkv = 2;
  Arena arena;
  arena.add("q", b * sq * hq * d, Role::kInput);
  arena.add("k", b * sk * hkv * d, Role::kInput);
  arena.add("v", b * sk * hkv * d, Role::kInput);
  arena.add("q_descale", b * hkv * 4, Role::kInput);
  arena.add("k_descale", b * hkv * 4, Role::kInput);
  arena.add("v_descale", b * hkv * 4, Role::kInput);
  arena.add("out", b * sq * hq * d * 2, Role::kOutput);
  arena.add("lse", b * hq * sq * 4, Role::kOutput);
  ASSERT_EQ(arena.allocate(), cudaSuccess);
  ASSERT_EQ(upload_fp8(arena["q"], size_t(b * sq * hq * d), 11), cudaSuccess);
  ASSERT_EQ(upload_fp8(arena["k"], size_t(b * sk * hkv * d), 12), cudaSuccess);
  ASSERT_EQ(upload_fp8(arena["v"], size_t(b * sk * hkv * d), 13), cudaSuccess);
  for (const char* n : {"q_descale", "k_descale", "v_descale"})
    ASSERT_EQ(upload_f32(arena[n], size_t(b * hkv), 0.5f, 1.5f, 14), cudaSuccess);
  ForwardArgs a;
  a.q = dense(arena["q"], dt, {b, sq, hq, d});
  a.k = dense(arena["k"], dt, {b, sk, hkv, d});
  a.v = dense(arena["v"], dt, {b, sk, hkv, d});
  a.out = dense(arena["out"], DType::kBFloat16, {b, sq, hq, d});
  a.lse = dense(arena["lse"], DType::kFloat32, {b, hq, sq});
  a.q_descale = dense(arena["q_descale"], DType::kFloat32, {b, hkv});
  a.k_descale = dense(arena["k_descale"], DType::kFloat32, {b, hkv});
  a.v_descale = dense(arena["v_descale"], DType::kFloat32, {b, hkv});
  HostBuffers host;
  using A = ForwardArgs;
  std::vector<Bad<A>> bads = {
      misaligned<A>("q", &A::q, 16),
      misaligned<A>("v", &A::v, 16),
      misaligned<A>("out", &A::out, 16),
      misaligned<A>("q_descale", &A::q_descale, 4),
      misaligned<A>("k_descale", &A::k_descale, 4),
      alias<A>("out", &A::out, "q", &A::q, {"out"}),
      alias<A>("q_descale", &A::q_descale, "out", &A::out, {"q_descale", "out"}),
      alias<A>("v_descale", &A::v_descale, "lse", &A::lse, {"v_descale", "lse"}),
      host_pointer<A>("k_descale", &A::k_descale, &host),
      {"out not bf16",
       {"out"},
       [](A& x, Rng&, std::string* what) {
         x.out.dtype = DType::kFloat16;
         *what = "out.dtype = fp16";
         return true;
       }},
      {"softcap with FP8 inputs",
       {"opts.softcap"},
       [](A& x, Rng&, std::string* what) {
         x.opts.softcap = 5.f;
         *what = "softcap = 5";
         return true;
       }},
  };
  add_scalar_bads(&bads);
  Tally t{"forward fp8"};
  run_fuzz<A>(
      t, arena, a, [](const A& x) { return flash3::forward(x, nullptr); }, bads, kSeed ^ 2);
  t.report();
}

// ---------------------------------------------------------------------------
// backward (deterministic: bitwise reproducible).
// ---------------------------------------------------------------------------
TEST(FuzzGpu, Backward) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const DType dt = DType::kBFloat16;
  const int d = pick_head_dim(dt, true);
  if (d == 0) GTEST_SKIP() << "not built: no bf16 forward + backward kernel";
  const int64_t b = 2, sq = 128, sk = 192, hq = 4, hkv = 2;
  Arena arena;
  for (const char* n : {"q", "out", "dout"}) arena.add(n, b * sq * hq * d * 2, Role::kInput);
  for (const char* n : {"k", "v"}) arena.add(n, b * sk * hkv * d * 2, Role::kInput);
  arena.add("lse", b * hq * sq * 4, Role::kInput);
  arena.add("dq", b * sq * hq * d * 2, Role::kOutput);
  for (const char* n : {"dk", "dv"}) arena.add(n, b * sk * hkv * d * 2, Role::kOutput);
  BackwardArgs a;
  a.opts.deterministic = true;
  a.q = dense(nullptr, dt, {b, sq, hq, d});
  a.k = dense(nullptr, dt, {b, sk, hkv, d});
  a.v = dense(nullptr, dt, {b, sk, hkv, d});
  const size_t need = flash3::backward_workspace_size(a);
  arena.add("workspace", std::max<size_t>(need, 256), Role::kScratch);
  ASSERT_EQ(arena.allocate(), cudaSuccess);
  ASSERT_EQ(upload16(arena["q"], size_t(b * sq * hq * d), dt, 21), cudaSuccess);
  ASSERT_EQ(upload16(arena["k"], size_t(b * sk * hkv * d), dt, 22), cudaSuccess);
  ASSERT_EQ(upload16(arena["v"], size_t(b * sk * hkv * d), dt, 23), cudaSuccess);
  ASSERT_EQ(upload16(arena["dout"], size_t(b * sq * hq * d), dt, 24), cudaSuccess);
  a.q = dense(arena["q"], dt, {b, sq, hq, d});
  a.k = dense(arena["k"], dt, {b, sk, hkv, d});
  a.v = dense(arena["v"], dt, {b, sk, hkv, d});
  a.out = dense(arena["out"], dt, {b, sq, hq, d});
  a.dout = dense(arena["dout"], dt, {b, sq, hq, d});
  a.lse = dense(arena["lse"], DType::kFloat32, {b, hq, sq});
  a.dq = dense(arena["dq"], dt, {b, sq, hq, d});
  a.dk = dense(arena["dk"], dt, {b, sk, hkv, d});
  a.dv = dense(arena["dv"], dt, {b, sk, hkv, d});
  a.workspace = arena["workspace"];
  a.workspace_bytes = arena.bytes("workspace");
  {  // out and lse of a forward of these inputs
    ForwardArgs f;
    f.q = a.q, f.k = a.k, f.v = a.v, f.out = a.out, f.lse = a.lse;
    const Status s = flash3::forward(f, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  HostBuffers host;
  using A = BackwardArgs;
  std::vector<Bad<A>> bads = {
      misaligned<A>("dq", &A::dq, 16),
      misaligned<A>("dk", &A::dk, 16),
      misaligned<A>("dv", &A::dv, 16),
      misaligned<A>("dout", &A::dout, 16),
      misaligned<A>("q", &A::q, 16),
      misaligned<A>("lse", &A::lse, 4),
      alias<A>("dq", &A::dq, "q", &A::q, {"dq"}),
      alias<A>("dk", &A::dk, "dv", &A::dv, {"dk", "dv"}),
      alias<A>("dv", &A::dv, "dout", &A::dout, {"dv"}),
      alias<A>("dq", &A::dq, "lse", &A::lse, {"dq"}),
      alias<A>("dk", &A::dk, "out", &A::out, {"dk"}),
      zero_stride<A>("dk", &A::dk, 1),
      null_data<A>("dout", &A::dout),
      host_pointer<A>("dout", &A::dout, &host),
      host_pointer<A>("dq", &A::dq, &host),
  };
  add_scalar_bads(&bads);
  add_workspace_bads(&bads, need, arena["dout"], "dout");
  Tally t{"backward"};
  run_fuzz<A>(
      t, arena, a, [](const A& x) { return flash3::backward(x, nullptr); }, bads, kSeed ^ 3);
  t.report();
}

// ---------------------------------------------------------------------------
// forward_kvcache: contiguous caches with an append and rotary, and paged caches.
// ---------------------------------------------------------------------------
struct KvSetup {
  int64_t b = 2, sq = 2, hq = 4, hkv = 2, d = 0, s_new = 3, rot_half = 16;
  int64_t b_cache = 2, s_cache = 256;                 // contiguous
  int64_t pages = 12, page_size = 16, max_pages = 4;  // paged
};

void kvcache_fuzz(bool paged, uint64_t seed) {
  const DType dt = DType::kBFloat16;
  KvSetup k;
  k.d = pick_head_dim(dt, false);
  if (k.d == 0) GTEST_SKIP() << "not built: no bf16 forward kernel";
  const int64_t rows0 = paged ? k.pages : k.b_cache, rows1 = paged ? k.page_size : k.s_cache;
  const int64_t capacity = paged ? k.max_pages * k.page_size : k.s_cache;
  Arena arena;
  arena.add("q", k.b * k.sq * k.hq * k.d * 2, Role::kInput);
  arena.add("k_cache", rows0 * rows1 * k.hkv * k.d * 2, Role::kState);
  arena.add("v_cache", rows0 * rows1 * k.hkv * k.d * 2, Role::kState);
  arena.add("k_new", k.b * k.s_new * k.hkv * k.d * 2, Role::kInput);
  arena.add("v_new", k.b * k.s_new * k.hkv * k.d * 2, Role::kInput);
  arena.add("rotary_cos", capacity * k.rot_half * 2, Role::kInput);
  arena.add("rotary_sin", capacity * k.rot_half * 2, Role::kInput);
  arena.add("cache_seqlens", k.b * 4, Role::kInput);
  arena.add("page_table", k.b * k.max_pages * 4, Role::kInput);
  arena.add("out", k.b * k.sq * k.hq * k.d * 2, Role::kOutput);
  arena.add("lse", k.hq * k.b * k.sq * 4, Role::kOutput);
  KVCacheArgs a;
  a.opts.causal = true;
  a.opts.num_splits = 0;  // the heuristic, as flash_attn_with_kvcache
  a.q = dense(nullptr, dt, {k.b, k.sq, k.hq, k.d});
  a.k_cache = dense(nullptr, dt, {rows0, rows1, k.hkv, k.d});
  a.v_cache = dense(nullptr, dt, {rows0, rows1, k.hkv, k.d});
  a.k_new = dense(nullptr, dt, {k.b, k.s_new, k.hkv, k.d});
  a.v_new = dense(nullptr, dt, {k.b, k.s_new, k.hkv, k.d});
  a.rotary_cos = dense(nullptr, dt, {capacity, k.rot_half});
  a.rotary_sin = dense(nullptr, dt, {capacity, k.rot_half});
  a.out = dense(nullptr, dt, {k.b, k.sq, k.hq, k.d});
  a.lse = TensorView::make3d(nullptr, DType::kFloat32, k.b, k.hq, k.sq, k.sq, k.b * k.sq, 1);
  if (paged) {
    a.page_table_batch_stride = k.max_pages;
    a.page_table_max_pages = int(k.max_pages);
  }
  // kvcache_workspace_size() checks the arguments, pointers included: sized below, once they exist.
  constexpr size_t kWorkspaceRegion = size_t(4) << 20;
  arena.add("workspace", kWorkspaceRegion, Role::kScratch);
  ASSERT_EQ(arena.allocate(), cudaSuccess);
  ASSERT_EQ(upload16(arena["q"], size_t(k.b * k.sq * k.hq * k.d), dt, seed + 1), cudaSuccess);
  ASSERT_EQ(upload16(arena["k_cache"], size_t(rows0 * rows1 * k.hkv * k.d), dt, seed + 2), cudaSuccess);
  ASSERT_EQ(upload16(arena["v_cache"], size_t(rows0 * rows1 * k.hkv * k.d), dt, seed + 3), cudaSuccess);
  ASSERT_EQ(upload16(arena["k_new"], size_t(k.b * k.s_new * k.hkv * k.d), dt, seed + 4), cudaSuccess);
  ASSERT_EQ(upload16(arena["v_new"], size_t(k.b * k.s_new * k.hkv * k.d), dt, seed + 5), cudaSuccess);
  ASSERT_EQ(upload16(arena["rotary_cos"], size_t(capacity * k.rot_half), dt, seed + 6), cudaSuccess);
  ASSERT_EQ(upload16(arena["rotary_sin"], size_t(capacity * k.rot_half), dt, seed + 7), cudaSuccess);
  ASSERT_EQ(upload_i32(arena["cache_seqlens"], paged ? std::vector<int32_t>{20, 45} : std::vector<int32_t>{100, 37}),
            cudaSuccess);
  ASSERT_EQ(upload_i32(arena["page_table"], {3, 0, 7, 5, 1, 2, 4, 6}), cudaSuccess);
  a.q.data = arena["q"];
  a.k_cache.data = arena["k_cache"];
  a.v_cache.data = arena["v_cache"];
  a.k_new.data = arena["k_new"];
  a.v_new.data = arena["v_new"];
  a.rotary_cos.data = arena["rotary_cos"];
  a.rotary_sin.data = arena["rotary_sin"];
  a.out.data = arena["out"];
  a.lse.data = arena["lse"];
  a.cache_seqlens = static_cast<const int*>(arena["cache_seqlens"]);
  if (paged) a.page_table = static_cast<const int*>(arena["page_table"]);
  {
    const Status s = flash3::validate_kvcache(a);
    if (s.code == StatusCode::kNotSupported) GTEST_SKIP() << "not built: " << s.message;
  }
  const size_t need = flash3::kvcache_workspace_size(a);
  ASSERT_GT(need, 0u) << "rotary needs scratch for the rotated q";
  ASSERT_LE(need, kWorkspaceRegion);
  a.workspace = arena["workspace"];
  a.workspace_bytes = need;
  HostBuffers host;
  using A = KVCacheArgs;
  std::vector<Bad<A>> bads = {
      // The repros: the new rows a view of the cache they are appended to; k_cache is
      // v_cache with an append.
      {"k_new a view of k_cache",
       {"k_cache", "k_new"},
       [&](A& x, Rng& r, std::string* what) {
         const int64_t row = r.range(0, rows1 - 1);
         x.k_new = TensorView::make4d(offset(x.k_cache.data, row * x.k_cache.stride[1] * 2), dt, k.b, 1, k.hkv, k.d,
                                      x.k_cache.stride[0], x.k_cache.stride[1], x.k_cache.stride[2], 1);
         x.v_new.shape[1] = 1;
         *what = "k_new = k_cache[:, " + std::to_string(row) + ":" + std::to_string(row + 1) + "]";
         return true;
       }},
      {"v_new a view of v_cache",
       {"v_cache", "v_new"},
       [&](A& x, Rng& r, std::string* what) {
         const int64_t row = r.range(0, rows1 - k.s_new);
         x.v_new = TensorView::make4d(offset(x.v_cache.data, row * x.v_cache.stride[1] * 2), dt, k.b, k.s_new, k.hkv,
                                      k.d, x.v_cache.stride[0], x.v_cache.stride[1], x.v_cache.stride[2], 1);
         *what = "v_new = v_cache[:, " + std::to_string(row) + ":]";
         return true;
       }},
      {"k_cache is v_cache with an append",
       {"k_cache", "v_cache"},
       [](A& x, Rng&, std::string* what) {
         x.v_cache = x.k_cache;
         *what = "v_cache = k_cache";
         return true;
       }},
      misaligned<A>("q", &A::q, 16),
      misaligned<A>("k_cache", &A::k_cache, 16),
      misaligned<A>("v_cache", &A::v_cache, 16),
      misaligned<A>("k_new", &A::k_new, 16),
      misaligned<A>("v_new", &A::v_new, 16),
      misaligned<A>("out", &A::out, 16),
      misaligned<A>("lse", &A::lse, 4),
      misaligned<A>("rotary_cos", &A::rotary_cos, 2),
      {"cache_seqlens misaligned",
       {"cache_seqlens"},
       [](A& x, Rng& r, std::string* what) {
         const int64_t o = r.range(1, 3);
         x.cache_seqlens = static_cast<const int*>(offset(x.cache_seqlens, o));
         *what = "cache_seqlens + " + std::to_string(o) + " bytes";
         return true;
       }},
      // Inside an output, holding the valid values (the device clamps them anyway).
      {"cache_seqlens inside out",
       {"cache_seqlens", "out"},
       [&](A& x, Rng&, std::string* what) {
         if (cudaMemcpy(x.out.data, arena["cache_seqlens"], k.b * 4, cudaMemcpyDeviceToDevice) != cudaSuccess)
           return false;
         x.cache_seqlens = static_cast<const int*>(x.out.data);
         *what = "cache_seqlens = out.data (holding the valid values)";
         return true;
       }},
      {"cache_seqlens in host memory",
       {"cache_seqlens"},
       [&](A& x, Rng& r, std::string* what) {
         x.cache_seqlens = static_cast<const int*>(host.pick(r));
         *what = "cache_seqlens = a host pointer";
         return true;
       }},
      alias<A>("out", &A::out, "q", &A::q, {"out"}),
      alias<A>("out", &A::out, "k_cache", &A::k_cache, {"out"}),
      alias<A>("lse", &A::lse, "out", &A::out, {"lse"}),
      alias<A>("rotary_sin", &A::rotary_sin, "out", &A::out, {"rotary_sin", "out"}),
      alias<A>("q", &A::q, "v_cache", &A::v_cache, {"q", "v_cache"}),
      {"more new rows than the cache holds",
       {"k_new"},
       [&](A& x, Rng&, std::string* what) {
         x.k_new.shape[1] = x.v_new.shape[1] = capacity + 1;
         *what = "k_new / v_new.shape[1] = " + std::to_string(capacity + 1);
         return true;
       }},
      host_pointer<A>("k_new", &A::k_new, &host),
  };
  if (paged) {
    bads.push_back({"page_table misaligned", {"page_table"}, [](A& x, Rng& r, std::string* what) {
                      const int64_t o = r.range(1, 3);
                      x.page_table = static_cast<const int*>(offset(x.page_table, o));
                      *what = "page_table + " + std::to_string(o) + " bytes";
                      return true;
                    }});
    // A copy of the table inside k_cache, which the append writes, in a page no sequence
    // uses (the table's entries are not checked: inside a poisoned output they would send
    // an accepting library out of bounds).
    bads.push_back({"page_table inside k_cache", {"page_table", "k_cache"}, [&](A& x, Rng&, std::string* what) {
                      void* dst = offset(x.k_cache.data, (k.pages - 2) * x.k_cache.stride[0] * 2);
                      if (cudaMemcpy(dst, arena["page_table"], k.b * k.max_pages * 4, cudaMemcpyDeviceToDevice) !=
                          cudaSuccess)
                        return false;
                      x.page_table = static_cast<const int*>(dst);
                      *what = "page_table = a copy in k_cache page " + std::to_string(k.pages - 2);
                      return true;
                    }});
    bads.push_back({"page_table in host memory", {"page_table"}, [&](A& x, Rng& r, std::string* what) {
                      x.page_table = static_cast<const int*>(host.pick(r));
                      *what = "page_table = a host pointer";
                      return true;
                    }});
    bads.push_back({"page_table rows overlapping", {"page_table_batch_stride"}, [](A& x, Rng& r, std::string* what) {
                      x.page_table_batch_stride = r.pick<int64_t>({0, 3, -1});
                      *what = "page_table_batch_stride = " + std::to_string(x.page_table_batch_stride);
                      return true;
                    }});
    bads.push_back({"page_table_max_pages < 1", {"page_table_max_pages"}, [](A& x, Rng& r, std::string* what) {
                      x.page_table_max_pages = r.pick({0, -1});
                      *what = "page_table_max_pages = " + std::to_string(x.page_table_max_pages);
                      return true;
                    }});
  }
  add_scalar_bads(&bads);
  add_workspace_bads(&bads, need, arena["k_new"], "k_new");
  Tally t{paged ? "forward_kvcache paged" : "forward_kvcache"};
  run_fuzz<A>(
      t, arena, a, [](const A& x) { return flash3::forward_kvcache(x, nullptr); }, bads, seed);
  t.report();
}

TEST(FuzzGpu, KVCache) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  kvcache_fuzz(false, kSeed ^ 4);
}

TEST(FuzzGpu, KVCachePaged) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  kvcache_fuzz(true, kSeed ^ 5);
}

// ---------------------------------------------------------------------------
// combine.
// ---------------------------------------------------------------------------
TEST(FuzzGpu, Combine) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int64_t ns = 3, b = 2, s = 8, h = 4, d = 64;
  Arena arena;
  arena.add("out_partial", ns * b * s * h * d * 4, Role::kInput);
  arena.add("lse_partial", ns * b * s * h * 4, Role::kInput);
  arena.add("out", b * s * h * d * 2, Role::kOutput);
  arena.add("lse", b * s * h * 4, Role::kOutput);
  ASSERT_EQ(arena.allocate(), cudaSuccess);
  ASSERT_EQ(upload_f32(arena["out_partial"], size_t(ns * b * s * h * d), -2.f, 2.f, 31), cudaSuccess);
  ASSERT_EQ(upload_f32(arena["lse_partial"], size_t(ns * b * s * h), -3.f, 3.f, 32), cudaSuccess);
  CombineArgs a;
  a.out_partial = dense(arena["out_partial"], DType::kFloat32, {ns, b, s, h, d});
  a.lse_partial = dense(arena["lse_partial"], DType::kFloat32, {ns, b, s, h});
  a.out = dense(arena["out"], DType::kBFloat16, {b, s, h, d});
  a.lse = dense(arena["lse"], DType::kFloat32, {b, s, h});
  HostBuffers host;
  using A = CombineArgs;
  std::vector<Bad<A>> bads = {
      misaligned<A>("out_partial", &A::out_partial, 16),
      misaligned<A>("lse_partial", &A::lse_partial, 4),
      misaligned<A>("out", &A::out, 2),
      misaligned<A>("lse", &A::lse, 4),
      alias<A>("out", &A::out, "out_partial", &A::out_partial, {"out"}),
      alias<A>("out", &A::out, "lse_partial", &A::lse_partial, {"out"}),
      alias<A>("lse", &A::lse, "out", &A::out, {"lse"}),
      alias<A>("lse", &A::lse, "lse_partial", &A::lse_partial, {"lse"}),
      alias<A>("lse_partial", &A::lse_partial, "out", &A::out, {"lse_partial", "out"}),
      zero_stride<A>("out", &A::out, 1),
      null_data<A>("out_partial", &A::out_partial),
      host_pointer<A>("out", &A::out, &host),
      host_pointer<A>("lse_partial", &A::lse_partial, &host),
      {"num_splits out of range",
       {"out_partial"},
       [](A& x, Rng& r, std::string* what) {
         x.out_partial.shape[0] = x.lse_partial.shape[0] = r.pick<int64_t>({0, 257});
         *what = "num_splits = " + std::to_string(x.out_partial.shape[0]);
         return true;
       }},
      {"head_dim unsupported",
       {"out_partial"},
       [](A& x, Rng& r, std::string* what) {
         x.out_partial.shape[4] = x.out.shape[3] = r.pick<int64_t>({6, 2, 1});
         *what = "head_dim = " + std::to_string(x.out_partial.shape[4]);
         return true;
       }},
      {"out_partial stride not a multiple of 4",
       {"out_partial"},
       [](A& x, Rng& r, std::string* what) {
         x.out_partial.stride[3] += r.range(1, 3);
         *what = "out_partial.stride[3] = " + std::to_string(x.out_partial.stride[3]);
         return true;
       }},
  };
  Tally t{"combine"};
  run_fuzz<A>(
      t, arena, a, [](const A& x) { return flash3::combine(x, nullptr); }, bads, kSeed ^ 6);
  t.report();
}

// ---------------------------------------------------------------------------
// quantize_fp8.
// ---------------------------------------------------------------------------
TEST(FuzzGpu, QuantizeFp8) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const int64_t b = 2, s = 100, h = 4, d = 64;
  Arena arena;
  arena.add("x", b * s * h * d * 2, Role::kInput);
  arena.add("out", b * s * h * d, Role::kOutput);
  arena.add("descale", b * (h / 2) * 4, Role::kOutput);
  ASSERT_EQ(arena.allocate(), cudaSuccess);
  ASSERT_EQ(upload16(arena["x"], size_t(b * s * h * d), DType::kBFloat16, 41), cudaSuccess);
  QuantizeFp8Args a;
  a.x = dense(arena["x"], DType::kBFloat16, {b, s, h, d});
  a.out = dense(arena["out"], DType::kFloat8E4M3, {b, s, h, d});
  a.descale = dense(arena["descale"], DType::kFloat32, {b, h / 2});
  a.heads_per_scale = 2;
  {
    const Status st = flash3::validate_quantize_fp8(a);
    if (st.code == StatusCode::kNotSupported) GTEST_SKIP() << "not built: " << st.message;
  }
  HostBuffers host;
  using A = QuantizeFp8Args;
  std::vector<Bad<A>> bads = {
      misaligned<A>("x", &A::x, 16),
      misaligned<A>("out", &A::out, 16),
      misaligned<A>("descale", &A::descale, 4),
      alias<A>("out", &A::out, "x", &A::x, {"out"}),
      alias<A>("descale", &A::descale, "out", &A::out, {"descale"}),
      alias<A>("descale", &A::descale, "x", &A::x, {"descale"}),
      zero_stride<A>("out", &A::out, 1),
      {"out self-overlapping",
       {"out"},
       [](A& x, Rng&, std::string* what) {
         x.out.stride[1] = x.out.stride[2];
         *what = "out.stride[1] = out.stride[2]";
         return true;
       }},
      host_pointer<A>("x", &A::x, &host),
      host_pointer<A>("descale", &A::descale, &host),
      {"heads_per_scale not a divisor",
       {"heads_per_scale"},
       [](A& x, Rng& r, std::string* what) {
         x.heads_per_scale = r.pick({3, 0, -1});
         *what = "heads_per_scale = " + std::to_string(x.heads_per_scale);
         return true;
       }},
      {"x stride not a multiple of 16 bytes",
       {"x"},
       [](A& x, Rng& r, std::string* what) {
         x.x.stride[1] += r.range(1, 7);
         *what = "x.stride[1] = " + std::to_string(x.x.stride[1]);
         return true;
       }},
  };
  Tally t{"quantize_fp8"};
  run_fuzz<A>(
      t, arena, a, [](const A& x) { return flash3::quantize_fp8(x, nullptr); }, bads, kSeed ^ 7);
  t.report();
}

}  // namespace
