// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// GPU tests of the KV-cache append + rotary kernel (launch_append_kv in
// src/kvcache/append_kv.h), bit-exact against the CPU reference
// (src/reference/kvcache_ref.h), which evaluates the same fp32 formula.
//
// Every buffer the kernel may write (both caches, q_out, padding included) is
// poisoned (0xffff: NaN in both dtypes) first and compared whole, element bits
// against the reference scattered into the poison: rows outside the appended
// range, rows past the cache's end, other cache entries and the padding
// between heads / rows / batches must keep the poison. Inputs' padding holds
// the poison too, so reading it would show up as NaN in a written element.
// Covered: bf16 / fp16; (d, dv) in {64, 128, 256, 128x64, 64x128, 192x128};
// rotary off, interleaved and half-split with rotary_dim d, 32 and 24 (24:
// the half-split partner is not one 16-byte chunk away; interleaved chunks
// straddle rotary_dim); seqlen_new 1 and 17; cache_seqlens 0, inside, partly
// or wholly past the cache's end, negative; a permuted cache_batch_idx (and
// none); rotary_seqlens (negative, past seqlen_ro); tables shorter than the
// positions (identity there) with padded row strides; q rotated with and
// without advancing positions; padded layouts (16-byte path) and odd
// strides / misaligned bases (scalar path); out-of-range entry clamping;
// nothing to do; element offsets past 2^31.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "kvcache/append_kv.h"
#include "reference/kvcache_ref.h"

namespace {

using flash3::AppendKVParams;
using flash3::DType;
using flash3::Status;
using flash3::ref::LowPrecision;
namespace ref = flash3::ref;
namespace tu = flash3::testutil;

constexpr uint16_t kPoison = 0xffff;

struct Case {
  DType dt = DType::kBFloat16;
  int batch = 4, seqlen_new = 1, heads_kv = 2, d = 64, dv = 64;
  int cache_batches = 6, cache_rows = 40;
  int rotary_dim = 0;
  bool interleaved = true;
  int seqlen_ro = 48;
  bool with_q = true;  // q_out written (when rotary_dim > 0)
  int seqlen_q = 3, heads_q = 4;
  bool advance = false;
  bool batch_idx = true;       // permuted cache_batch_idx; false: null
  bool rotary_seqlens = false;
  int pad = 0;       // elements added to every head / row / batch stride of the tensors
  int misalign = 0;  // elements the base pointers are moved by
  uint64_t seed = 1;
  std::string name() const {
    return std::string(tu::short_dtype(dt)) + "_b" + std::to_string(batch) + "_sn" + std::to_string(seqlen_new) +
           "_d" + std::to_string(d) + "x" + std::to_string(dv) + "_rd" + std::to_string(rotary_dim) +
           (interleaved ? "i" : "h") + "_ro" + std::to_string(seqlen_ro) + (advance ? "_adv" : "") +
           (batch_idx ? "_idx" : "") + (rotary_seqlens ? "_rs" : "") + "_pad" + std::to_string(pad) + "_mis" +
           std::to_string(misalign) + "_seed" + std::to_string(seed);
  }
};

LowPrecision lowp(DType dt) { return dt == DType::kBFloat16 ? LowPrecision::kBFloat16 : LowPrecision::kFloat16; }

// A (n0, n1, n2, n3) tensor in a buffer: each stride padded by `pad`, the base
// `misalign` elements in.
struct Layout {
  int64_t n[4] = {};
  int64_t sb = 0, sr = 0, sh = 0, base = 0, span = 0;
  Layout(int64_t n0, int64_t n1, int64_t n2, int64_t n3, int pad, int misalign) : n{n0, n1, n2, n3} {
    sh = n3 + pad;
    sr = n2 * sh + pad;
    sb = n1 * sr + pad;
    base = misalign;
    span = base + n0 * sb;
  }
  int64_t dense_size() const { return n[0] * n[1] * n[2] * n[3]; }
  // Buffer offset of dense index i.
  int64_t offset(int64_t i) const {
    const int64_t k = i % n[3], h = (i / n[3]) % n[2], r = (i / n[3] / n[2]) % n[1], b = i / n[3] / n[2] / n[1];
    return base + b * sb + r * sr + h * sh + k;
  }
};

std::vector<double> randn_t(LowPrecision t, size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) {
    do e = ref::round_to(t, dist(gen));
    while (e == 0.0);
  }
  return x;
}

// Dense values scattered into a poisoned buffer (NaN values stay poison).
std::vector<uint16_t> scatter(DType dt, const Layout& l, const std::vector<double>& dense) {
  std::vector<uint16_t> buf(size_t(l.span), kPoison);
  for (int64_t i = 0; i < l.dense_size(); ++i)
    if (!std::isnan(dense[size_t(i)])) buf[size_t(l.offset(i))] = tu::float_to_half_bits(dt, float(dense[size_t(i)]));
  return buf;
}

template <class T>
void upload(tu::DeviceBuffer* d, const std::vector<T>& h) {
  FLASH3_CUDA_OK(d->reserve(h.size() * sizeof(T)));
  FLASH3_CUDA_OK(cudaMemcpy(d->ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Device buffers, reused (grown) across cases.
struct Buffers {
  tu::DeviceBuffer kn, vn, kc, vc, q, qo, cos, sin, seqlens, idx, rseqlens;
};

// Element bits of the device buffer equal `want`; reports the first mismatch.
void expect_bits(const char* what, DType dt, const tu::DeviceBuffer& d, const std::vector<uint16_t>& want) {
  std::vector<uint16_t> got(want.size());
  FLASH3_CUDA_OK(cudaMemcpy(got.data(), d.ptr, want.size() * 2, cudaMemcpyDeviceToHost));
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      if (bad++ == 0) first = int64_t(i);
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements differ; first at buffer element "
                    << first << ": got " << (first >= 0 ? tu::half_bits_to_float(dt, got[size_t(first)]) : 0.f)
                    << " (0x" << std::hex << (first >= 0 ? got[size_t(first)] : 0) << "), want "
                    << (first >= 0 ? tu::half_bits_to_float(dt, want[size_t(first)]) : 0.f) << " (0x"
                    << (first >= 0 ? want[size_t(first)] : 0) << ")" << std::dec;
}

// cache_seqlens: empty, inside, partly past the end, wholly past it, negative.
std::vector<int> make_cache_seqlens(const Case& c, std::mt19937_64& gen) {
  std::vector<int> s(size_t(c.batch));
  for (int b = 0; b < c.batch; ++b) {
    switch ((c.seed + b) % 6) {
      case 0: s[b] = 0; break;
      case 1: s[b] = int(gen() % uint64_t(std::max(c.cache_rows - c.seqlen_new, 1))); break;
      case 2: s[b] = c.cache_rows - (c.seqlen_new + 1) / 2; break;  // the last rows dropped (all when seqlen_new 1)
      case 3: s[b] = c.cache_rows; break;
      case 4: s[b] = -3; break;
      default: s[b] = c.cache_rows - c.seqlen_new; break;  // ends exactly at the cache's end
    }
  }
  return s;
}

void run_case(const Case& c, Buffers* B) {
  SCOPED_TRACE(c.name());
  const LowPrecision t = lowp(c.dt);
  std::mt19937_64 gen(c.seed * 7919 + 13);
  const int rd = c.rotary_dim, half = rd / 2;

  const Layout lkn(c.batch, c.seqlen_new, c.heads_kv, c.d, c.pad, c.misalign);
  const Layout lvn(c.batch, c.seqlen_new, c.heads_kv, c.dv, c.pad, c.misalign);
  const Layout lkc(c.cache_batches, c.cache_rows, c.heads_kv, c.d, c.pad, c.misalign);
  const Layout lvc(c.cache_batches, c.cache_rows, c.heads_kv, c.dv, c.pad, c.misalign);
  const Layout lq(c.batch, c.seqlen_q, c.heads_q, c.d, c.pad, c.misalign);
  const Layout lqo(c.batch, c.seqlen_q, c.heads_q, c.d, c.pad + 8, c.misalign);  // q_out's own strides

  const std::vector<double> kn = randn_t(t, size_t(lkn.dense_size()), c.seed * 4 + 0);
  const std::vector<double> vn = randn_t(t, size_t(lvn.dense_size()), c.seed * 4 + 1);
  const std::vector<double> q = randn_t(t, size_t(lq.dense_size()), c.seed * 4 + 2);

  // Tables (seqlen_ro, rd / 2), dense for the reference; padded row strides
  // (cos 3, sin 5 elements) on the device.
  const int64_t cos_stride = half + 3, sin_stride = half + 5;
  std::vector<double> cos_t(size_t(c.seqlen_ro) * half), sin_t(cos_t.size());
  std::vector<uint16_t> cos_d(size_t(c.seqlen_ro * cos_stride + 1), kPoison),
      sin_d(size_t(c.seqlen_ro * sin_stride + 1), kPoison);
  for (int p = 0; p < c.seqlen_ro; ++p)
    for (int j = 0; j < half; ++j) {
      const double a = (p + 0.5) * std::pow(10000.0, -2.0 * j / std::max(rd, 1));
      const size_t i = size_t(p) * half + j;
      cos_t[i] = ref::round_to(t, std::cos(a));
      sin_t[i] = ref::round_to(t, std::sin(a));
      cos_d[size_t(p * cos_stride + j)] = tu::float_to_half_bits(c.dt, float(cos_t[i]));
      sin_d[size_t(p * sin_stride + j)] = tu::float_to_half_bits(c.dt, float(sin_t[i]));
    }

  const std::vector<int> cache_seqlens = make_cache_seqlens(c, gen);
  std::vector<int> perm(size_t(c.cache_batches));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  const std::vector<int> batch_idx(perm.begin(), perm.begin() + c.batch);  // distinct entries: no two writers
  std::vector<int> rseqlens(size_t(c.batch));
  for (int b = 0; b < c.batch; ++b) {
    const int choices[4] = {0, c.seqlen_ro - 2, c.seqlen_ro + 5, -4};  // crossing the end, past it, crossing 0
    rseqlens[b] = choices[(c.seed + b) % 4];
  }
  const int* idx_h = c.batch_idx ? batch_idx.data() : nullptr;
  const int* rs_h = c.rotary_seqlens ? rseqlens.data() : nullptr;

  // Reference: caches start as NaN (= the poison once scattered).
  ref::AppendKVShape s;
  s.batch = c.batch;
  s.seqlen_new = c.seqlen_new;
  s.heads_kv = c.heads_kv;
  s.head_dim = c.d;
  s.head_dim_v = c.dv;
  s.cache_batches = c.cache_batches;
  s.cache_rows = c.cache_rows;
  s.rotary_dim = rd;
  s.interleaved = c.interleaved;
  s.seqlen_ro = c.seqlen_ro;
  std::vector<double> kc(size_t(lkc.dense_size()), NAN), vc(size_t(lvc.dense_size()), NAN);
  ref::append_kv(t, s, kn.data(), vn.data(), cache_seqlens.data(), idx_h, rs_h, cos_t.data(), sin_t.data(),
                 kc.data(), vc.data());
  const bool q_work = rd > 0 && c.with_q;
  std::vector<double> qo(size_t(lqo.dense_size()), NAN);
  if (q_work)
    ref::rotary_q(t, s, c.seqlen_q, c.heads_q, q.data(), cache_seqlens.data(), rs_h, c.advance, cos_t.data(),
                  sin_t.data(), qo.data());

  // Device.
  upload(&B->kn, scatter(c.dt, lkn, kn));
  upload(&B->vn, scatter(c.dt, lvn, vn));
  upload(&B->q, scatter(c.dt, lq, q));
  upload(&B->kc, std::vector<uint16_t>(size_t(lkc.span), kPoison));
  upload(&B->vc, std::vector<uint16_t>(size_t(lvc.span), kPoison));
  upload(&B->qo, std::vector<uint16_t>(size_t(lqo.span), kPoison));
  upload(&B->cos, cos_d);
  upload(&B->sin, sin_d);
  upload(&B->seqlens, cache_seqlens);
  upload(&B->idx, batch_idx);
  upload(&B->rseqlens, rseqlens);
  if (::testing::Test::HasFatalFailure()) return;

  auto at = [](const tu::DeviceBuffer& d, const Layout& l) { return d.as<uint16_t>() + l.base; };
  AppendKVParams p;
  p.dtype = c.dt;
  p.batch = c.batch;
  p.seqlen_new = c.seqlen_new;
  p.heads_kv = c.heads_kv;
  p.head_dim = c.d;
  p.head_dim_v = c.dv;
  p.k_new = at(B->kn, lkn);
  p.v_new = at(B->vn, lvn);
  p.kn_batch_stride = lkn.sb, p.kn_row_stride = lkn.sr, p.kn_head_stride = lkn.sh;
  p.vn_batch_stride = lvn.sb, p.vn_row_stride = lvn.sr, p.vn_head_stride = lvn.sh;
  p.k_cache = at(B->kc, lkc);
  p.v_cache = at(B->vc, lvc);
  p.kc_batch_stride = lkc.sb, p.kc_row_stride = lkc.sr, p.kc_head_stride = lkc.sh;
  p.vc_batch_stride = lvc.sb, p.vc_row_stride = lvc.sr, p.vc_head_stride = lvc.sh;
  p.cache_batches = c.cache_batches;
  p.cache_rows = c.cache_rows;
  p.cache_seqlens = B->seqlens.as<int>();
  p.cache_batch_idx = c.batch_idx ? B->idx.as<int>() : nullptr;
  p.rotary_dim = rd;
  p.rotary_interleaved = c.interleaved;
  if (rd > 0) {
    p.rotary_cos = B->cos.ptr;
    p.rotary_sin = B->sin.ptr;
    p.cos_row_stride = cos_stride;
    p.sin_row_stride = sin_stride;
    p.seqlen_ro = c.seqlen_ro;
  }
  p.rotary_seqlens = c.rotary_seqlens ? B->rseqlens.as<int>() : nullptr;
  if (c.with_q) {
    p.q = at(B->q, lq);
    p.q_out = at(B->qo, lqo);
    p.seqlen_q = c.seqlen_q;
    p.heads_q = c.heads_q;
    p.q_batch_stride = lq.sb, p.q_row_stride = lq.sr, p.q_head_stride = lq.sh;
    p.qo_batch_stride = lqo.sb, p.qo_row_stride = lqo.sr, p.qo_head_stride = lqo.sh;
    p.q_positions_advance = c.advance;
  }
  const Status st = flash3::launch_append_kv(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FLASH3_CUDA_OK(cudaDeviceSynchronize());

  expect_bits("k_cache", c.dt, B->kc, scatter(c.dt, lkc, kc));
  expect_bits("v_cache", c.dt, B->vc, scatter(c.dt, lvc, vc));
  expect_bits("q_out", c.dt, B->qo, scatter(c.dt, lqo, qo));
}

TEST(AppendKVGpu, MatchesReferenceBitExact) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Buffers B;
  uint64_t seed = 1;
  const std::pair<int, int> dims[] = {{64, 64}, {128, 128}, {256, 256}, {128, 64}, {64, 128}, {192, 128}};
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (auto [d, dv] : dims)
      for (int rd : {0, d, 32, 24})
        for (bool interleaved : {true, false}) {
          if (rd == 0 && !interleaved) continue;
          for (int sn : {1, 17}) {
            Case c;
            c.dt = dt;
            c.d = d;
            c.dv = dv;
            c.rotary_dim = rd;
            c.interleaved = interleaved;
            c.seqlen_new = sn;
            c.seed = seed++;
            c.advance = c.seed % 2 == 0;
            c.rotary_seqlens = c.seed % 3 == 0;
            c.batch_idx = c.seed % 4 != 3;
            c.seqlen_ro = c.seed % 2 ? c.cache_rows + 8 : c.cache_rows / 2 + 3;
            c.pad = c.seed % 5 == 0 ? 8 : 0;
            run_case(c, &B);
            if (HasFatalFailure()) return;
          }
        }
}

// Strides that are not multiples of 8 elements or bases off 16 bytes (outside
// validation's contract): the kernel falls back to scalar accesses. Also
// rotary_dim 10 (one interleaved chunk straddles it) and a batch of one.
TEST(AppendKVGpu, ScalarPathAndOddShapes) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Buffers B;
  uint64_t seed = 1000;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (auto [pad, misalign] : {std::pair{2, 0}, std::pair{0, 1}, std::pair{8, 8}, std::pair{16, 0}})
      for (int rd : {128, 10, 0})
        for (bool interleaved : {true, false}) {
          Case c;
          c.dt = dt;
          c.d = 128;
          c.dv = 64;
          c.rotary_dim = rd;
          c.interleaved = interleaved;
          c.seqlen_new = 5;
          c.pad = pad;
          c.misalign = misalign;
          c.seed = seed++;
          c.advance = !interleaved;
          c.batch = c.seed % 2 ? 1 : 3;
          run_case(c, &B);
          if (HasFatalFailure()) return;
        }
}

// q alone (seqlen_new 0, rotary on): only q_out is written.
TEST(AppendKVGpu, RotatedQueryWithoutAppend) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Buffers B;
  for (bool advance : {false, true}) {
    Case c;
    c.seqlen_new = 0;
    c.rotary_dim = 64;
    c.d = c.dv = 64;
    c.interleaved = false;
    c.advance = advance;
    c.seqlen_q = 9;
    c.seed = 77 + advance;
    run_case(c, &B);
    if (HasFatalFailure()) return;
  }
}

// cache_batch_idx out of range: clamped to the first / last entry.
TEST(AppendKVGpu, ClampsTheEntryIndex) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const DType dt = DType::kBFloat16;
  const int batch = 2, sn = 3, hkv = 1, d = 64, cache_batches = 4, cache_rows = 8;
  const Layout lk(batch, sn, hkv, d, 0, 0), lc(cache_batches, cache_rows, hkv, d, 0, 0);
  const std::vector<double> kn = randn_t(LowPrecision::kBFloat16, size_t(lk.dense_size()), 5);
  const std::vector<int> seqlens = {1, 2}, idx = {-4, 99};
  Buffers B;
  upload(&B.kn, scatter(dt, lk, kn));
  upload(&B.kc, std::vector<uint16_t>(size_t(lc.span), kPoison));
  upload(&B.vc, std::vector<uint16_t>(size_t(lc.span), kPoison));
  upload(&B.seqlens, seqlens);
  upload(&B.idx, idx);
  if (HasFatalFailure()) return;
  AppendKVParams p;
  p.dtype = dt;
  p.batch = batch;
  p.seqlen_new = sn;
  p.heads_kv = hkv;
  p.head_dim = p.head_dim_v = d;
  p.k_new = p.v_new = B.kn.ptr;  // V = K: both caches get the same rows
  p.kn_batch_stride = p.vn_batch_stride = lk.sb;
  p.kn_row_stride = p.vn_row_stride = lk.sr;
  p.kn_head_stride = p.vn_head_stride = lk.sh;
  p.k_cache = B.kc.ptr;
  p.v_cache = B.vc.ptr;
  p.kc_batch_stride = p.vc_batch_stride = lc.sb;
  p.kc_row_stride = p.vc_row_stride = lc.sr;
  p.kc_head_stride = p.vc_head_stride = lc.sh;
  p.cache_batches = cache_batches;
  p.cache_rows = cache_rows;
  p.cache_seqlens = B.seqlens.as<int>();
  p.cache_batch_idx = B.idx.as<int>();
  const Status st = flash3::launch_append_kv(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> want(size_t(lc.dense_size()), NAN);
  const int entry[2] = {0, cache_batches - 1};
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < sn; ++i)
      for (int k = 0; k < d; ++k)
        want[size_t((entry[b] * cache_rows + seqlens[b] + i) * d + k)] = kn[size_t((b * sn + i) * d + k)];
  expect_bits("k_cache", dt, B.kc, scatter(dt, lc, want));
  expect_bits("v_cache", dt, B.vc, scatter(dt, lc, want));
}

// Nothing to write: no launch, and no pointer is dereferenced (all null).
TEST(AppendKVGpu, NothingToDo) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  AppendKVParams p;
  p.batch = 3;
  p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 64;
  EXPECT_TRUE(flash3::launch_append_kv(p, nullptr).ok());  // seqlen_new 0, no q_out
  p.rotary_dim = 64;  // rotary on but no q_out
  EXPECT_TRUE(flash3::launch_append_kv(p, nullptr).ok());
  p.batch = 0;  // an empty batch with everything requested
  p.seqlen_new = 4;
  EXPECT_TRUE(flash3::launch_append_kv(p, nullptr).ok());
  FLASH3_CUDA_OK(cudaDeviceSynchronize());
  FLASH3_CUDA_OK(cudaGetLastError());
}

// Element offsets past 2^31: the key cache's second entry starts at element
// 2^31 + 64 (4.3 GB bf16); the sequence writes there, rotated. Only the
// written entry's rows are copied back. Skips when the device lacks the memory.
TEST(AppendKVGpu, OffsetsPast2To31) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const DType dt = DType::kBFloat16;
  const LowPrecision t = LowPrecision::kBFloat16;
  const int sn = 4, hkv = 2, d = 128, rd = 64, cache_rows = 16, seqlen_ro = 32;
  const int64_t batch_stride = (int64_t(1) << 31) + 64;
  const int64_t row_stride = int64_t(hkv) * d, entry_elems = int64_t(cache_rows) * row_stride;
  const size_t bytes = size_t(batch_stride + entry_elems) * 2;
  size_t free_b = 0, total_b = 0;
  FLASH3_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < bytes + (size_t(1) << 30)) GTEST_SKIP() << "needs " << bytes << " bytes of device memory";
  tu::DeviceBuffer kc, kn, vc, tabs, seqlens, idx;
  FLASH3_CUDA_OK(kc.reserve(bytes));
  FLASH3_CUDA_OK(cudaMemset(static_cast<char*>(kc.ptr) + batch_stride * 2, 0xff, size_t(entry_elems) * 2));

  const std::vector<double> knd = randn_t(t, size_t(sn) * hkv * d, 9);
  std::vector<double> cos_t(size_t(seqlen_ro) * rd / 2), sin_t(cos_t.size());
  std::vector<uint16_t> tab_d(2 * cos_t.size());
  for (size_t i = 0; i < cos_t.size(); ++i) {
    cos_t[i] = ref::round_to(t, std::cos(0.1 * double(i)));
    sin_t[i] = ref::round_to(t, std::sin(0.1 * double(i)));
    tab_d[i] = tu::float_to_half_bits(dt, float(cos_t[i]));
    tab_d[cos_t.size() + i] = tu::float_to_half_bits(dt, float(sin_t[i]));
  }
  std::vector<uint16_t> kn_h(knd.size());
  for (size_t i = 0; i < knd.size(); ++i) kn_h[i] = tu::float_to_half_bits(dt, float(knd[i]));
  const std::vector<int> seqlens_h = {cache_rows - sn - 3}, idx_h = {1};
  upload(&kn, kn_h);
  upload(&tabs, tab_d);
  upload(&seqlens, seqlens_h);
  upload(&idx, idx_h);
  FLASH3_CUDA_OK(vc.reserve(size_t(2 * entry_elems) * 2));
  if (HasFatalFailure()) return;

  AppendKVParams p;
  p.dtype = dt;
  p.batch = 1;
  p.seqlen_new = sn;
  p.heads_kv = hkv;
  p.head_dim = p.head_dim_v = d;
  p.k_new = p.v_new = kn.ptr;
  p.kn_batch_stride = p.vn_batch_stride = int64_t(sn) * row_stride;
  p.kn_row_stride = p.vn_row_stride = row_stride;
  p.kn_head_stride = p.vn_head_stride = d;
  p.k_cache = kc.ptr;
  p.kc_batch_stride = batch_stride;
  p.kc_row_stride = row_stride;
  p.kc_head_stride = d;
  p.v_cache = vc.ptr;
  p.vc_batch_stride = entry_elems;
  p.vc_row_stride = row_stride;
  p.vc_head_stride = d;
  p.cache_batches = 2;
  p.cache_rows = cache_rows;
  p.cache_seqlens = seqlens.as<int>();
  p.cache_batch_idx = idx.as<int>();
  p.rotary_dim = rd;
  p.rotary_interleaved = false;
  p.rotary_cos = tabs.as<uint16_t>();
  p.rotary_sin = tabs.as<uint16_t>() + cos_t.size();
  p.cos_row_stride = p.sin_row_stride = rd / 2;
  p.seqlen_ro = seqlen_ro;
  const Status st = flash3::launch_append_kv(p, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  FLASH3_CUDA_OK(cudaDeviceSynchronize());

  ref::AppendKVShape s;
  s.batch = 1;
  s.seqlen_new = sn;
  s.heads_kv = hkv;
  s.head_dim = s.head_dim_v = d;
  s.cache_batches = 1;  // the reference holds entry 1 alone
  s.cache_rows = cache_rows;
  s.rotary_dim = rd;
  s.interleaved = false;
  s.seqlen_ro = seqlen_ro;
  std::vector<double> want(size_t(entry_elems), NAN), v_unused(size_t(entry_elems), NAN);
  const std::vector<int> idx0 = {0};
  ref::append_kv(t, s, knd.data(), knd.data(), seqlens_h.data(), idx0.data(), nullptr, cos_t.data(), sin_t.data(),
                 want.data(), v_unused.data());
  std::vector<uint16_t> want_bits(want.size(), kPoison), got(want.size());
  for (size_t i = 0; i < want.size(); ++i)
    if (!std::isnan(want[i])) want_bits[i] = tu::float_to_half_bits(dt, float(want[i]));
  FLASH3_CUDA_OK(cudaMemcpy(got.data(), static_cast<char*>(kc.ptr) + batch_stride * 2, want.size() * 2,
                            cudaMemcpyDeviceToHost));
  EXPECT_TRUE(got == want_bits) << "the key cache's entry 1 (at element 2^31 + 64) differs from the reference";
}

}  // namespace
