// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// flash3::forward_kvcache (flash_attn_with_kvcache) against the CPU
// references: the append + rotary (reference/kvcache_ref.h, bit-exact on the
// whole cache, untouched rows included) and the attention of each sequence
// over its cache rows [leftpad, cache_seqlens + seqlen_new) (float64
// reference, FlashAttention tolerance rule on out and lse). The case matrix
// is the sampled with a fixed seed (half of it with a paged cache),
// plus corners.
//
// Paged caches (KVCase::page_size > 0): the test keeps a logical cache (b,
// capacity, hkv, d), capacity = max_pages * page_size, and scatters it into a
// pool of b * max_pages + 3 pages through a random page table; the 3 pages no
// table entry names hold NaN (reading one poisons the output). The reference
// runs on the logical cache exactly as for a contiguous one; afterwards the
// pool is gathered back through the table and compared bit for bit, and the
// unreferenced pages must still hold their NaN bits.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_case.h"
#include "gpu_test_util.h"
#include "reference/kvcache_ref.h"
#include "reference/reference.h"

namespace {

using flash3::DType;
using flash3::TensorView;
using namespace flash3::testutil;
using flash3::gputest::HeadDims;

// kFixed: sequence i holds KCase::fills[i % fills.size()] rows (capped like the others).
enum class Fill { kEmpty, kOne, k1023, kRandom, kFixed };
enum class Rotary { kNone, kInterleaved, kHalf };
enum class MaskKind { kNone, kCausal, kWindow };

struct KCase {
  DType dtype = DType::kBFloat16;
  int d = 128, dv = 128;
  int hq = 4, hkv = 4;
  int b = 3, sq = 1;
  int sn = 0;  // appended rows (0: no k_new / v_new)
  Rotary rotary = Rotary::kNone;
  bool partial_rotary = false;  // rotary_dim = d / 2 instead of d
  MaskKind mask = MaskKind::kNone;
  bool batch_idx = false, leftpad = false, rotary_seqlens = false;
  Fill fill = Fill::kRandom;
  int num_splits = 1;
  int pack_gqa = -1;
  bool store_lse = true;
  uint64_t seed = 1;
  int page_size = 0;       // 0: contiguous cache; else a paged one (with batch_idx / leftpad: FLASH3_SERVING_WIP)
  int table_pad = 0;       // paged: page_table_batch_stride = max_pages + table_pad (pad entries name a NaN page)
  int rows = 0;            // cache rows asked for (0: the fill's default)
  std::vector<int> fills;  // Fill::kFixed
  // Variable-length queries / new rows (FLASH3_SERVING_WIP): b entries each,
  // packed (cu_seqlens_q / cu_seqlens_k_new); empty: sq / sn rows each.
  std::vector<int> q_lens, new_lens;

  int wanted_rows() const { return rows > 0 ? rows : (fill == Fill::k1023 ? 1023 + 32 : 160); }
  // Paged: pages per sequence, enough for wanted_rows().
  int max_pages() const { return page_size > 0 ? (wanted_rows() + page_size - 1) / page_size : 0; }
  // Rows of a sequence's cache: s_cache, or the paged capacity max_pages * page_size.
  int cache_rows() const { return page_size > 0 ? max_pages() * page_size : wanted_rows(); }
  int cache_batches() const { return batch_idx ? b + 2 : b; }
  int rotary_dim() const { return rotary == Rotary::kNone ? 0 : (partial_rotary ? d / 2 : d); }
  std::string name() const {
    std::ostringstream os;
    os << flash3::dtype_name(dtype) << " d" << d << "x" << dv << " h" << hq << ":" << hkv << " b" << b << " sq" << sq
       << " new" << sn << " rot" << int(rotary) << (partial_rotary ? "p" : "") << " mask" << int(mask)
       << (batch_idx ? " idx" : "") << (leftpad ? " lpad" : "") << (rotary_seqlens ? " rseq" : "") << " fill"
       << int(fill) << " splits" << num_splits << " pack" << pack_gqa;
    if (fill == Fill::kFixed) {
      os << " fills";
      for (int f : fills) os << (f == INT_MAX ? std::string(":full") : ":" + std::to_string(f));
    }
    if (rows > 0) os << " rows" << rows;
    for (const auto& [tag, lens] : {std::pair<const char*, const std::vector<int>*>{" qlens", &q_lens},
                                    {" newlens", &new_lens}}) {
      if (lens->empty()) continue;
      os << tag;
      for (int n : *lens) os << ":" << n;
    }
    if (page_size > 0) os << " page" << page_size << "x" << max_pages() << (table_pad ? " tpad" : "");
    if (!store_lse) os << " nolse";
    os << " seed" << seed;
    return os.str();
  }
};

flash3::ref::LowPrecision lowp(DType t) {
  return t == DType::kBFloat16 ? flash3::ref::LowPrecision::kBFloat16 : flash3::ref::LowPrecision::kFloat16;
}

std::vector<uint16_t> to_bits(DType t, const std::vector<double>& x) {
  std::vector<uint16_t> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = float_to_half_bits(t, float(x[i]));
  return r;
}

// Normal values rounded to the dtype.
std::vector<double> random_values(DType t, size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = flash3::ref::round_to(lowp(t), nd(rng));
  return v;
}

template <class T>
void upload(DeviceBuffer& buf, const std::vector<T>& host) {
  ASSERT_EQ(buf.reserve(host.size() * sizeof(T) + 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(buf.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

TensorView view4(void* p, DType t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return TensorView::make4d(p, t, a, b, c, d, b * c * d, c * d, d, 1);
}

// A paged cache's page table and pool, built by the test from the logical
// cache: plain loops, no index arithmetic shared with the library.
struct Paging {
  int page_size = 0, max_pages = 0, num_pages = 0;
  int64_t batch_stride = 0;
  std::vector<int> table;       // (b, batch_stride); entries past max_pages name an unreferenced page
  std::vector<char> referenced;  // per pool page
  // Pool row (page * page_size + row in page) of logical row r of sequence i.
  size_t pool_row(int i, int r) const {
    const int page = table[size_t(i) * size_t(batch_stride) + size_t(r / page_size)];
    return size_t(page) * size_t(page_size) + size_t(r % page_size);
  }
};

constexpr uint16_t kPageNaN = 0x7FFF;  // a NaN in bf16 and in fp16

Paging make_paging(const KCase& c) {
  Paging pg;
  pg.page_size = c.page_size;
  pg.max_pages = c.max_pages();
  const int entries = c.cache_batches();  // one table row per cache entry
  pg.num_pages = entries * pg.max_pages + 3;  // + 3 pages no entry uses
  pg.batch_stride = pg.max_pages + c.table_pad;
  std::mt19937_64 prng(c.seed ^ 0x9a6ed0cafe5eedull);
  std::vector<int> order(size_t(pg.num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), prng);
  pg.table.assign(size_t(entries) * size_t(pg.batch_stride), 0);
  pg.referenced.assign(size_t(pg.num_pages), 0);
  for (int i = 0; i < entries; ++i) {
    for (int j = 0; j < pg.max_pages; ++j) {
      const int page = order[size_t(i) * pg.max_pages + j];
      pg.table[size_t(i) * size_t(pg.batch_stride) + j] = page;
      pg.referenced[size_t(page)] = 1;
    }
    // Padding between table rows: never part of a sequence's table; it names
    // an unreferenced (NaN) page, so reading it poisons the output.
    for (int j = pg.max_pages; j < pg.batch_stride; ++j)
      pg.table[size_t(i) * size_t(pg.batch_stride) + j] = order[size_t(entries) * pg.max_pages + size_t(j % 3)];
  }
  return pg;
}

// The pool of a logical cache (b, capacity, hkv, w) of dtype bits: referenced
// pages hold the logical rows, the others NaN.
std::vector<uint16_t> scatter_to_pool(const Paging& pg, int b, int capacity, int row_elems,
                                      const std::vector<uint16_t>& logical) {
  std::vector<uint16_t> pool(size_t(pg.num_pages) * pg.page_size * row_elems, kPageNaN);
  for (int i = 0; i < b; ++i)
    for (int r = 0; r < capacity; ++r)
      std::copy_n(&logical[(size_t(i) * capacity + r) * row_elems], size_t(row_elems),
                  &pool[pg.pool_row(i, r) * row_elems]);
  return pool;
}

// The logical cache (b, capacity, hkv, w) read out of a pool through the table.
std::vector<uint16_t> gather_from_pool(const Paging& pg, int b, int capacity, int row_elems,
                                       const std::vector<uint16_t>& pool) {
  std::vector<uint16_t> logical(size_t(b) * capacity * row_elems);
  for (int i = 0; i < b; ++i)
    for (int r = 0; r < capacity; ++r)
      std::copy_n(&pool[pg.pool_row(i, r) * row_elems], size_t(row_elems),
                  &logical[(size_t(i) * capacity + r) * row_elems]);
  return logical;
}

// Cases run and cases skipped because the build lacks the forward's packgqa
// unit (which the paged path needs).
struct Tally {
  int ran = 0, skipped = 0;
  std::string why;
};

bool is_packgqa_not_built(const flash3::Status& st) {
  return st.code == flash3::StatusCode::kNotSupported && st.message.find("packgqa") != std::string::npos;
}

// One case end to end (gtest failures on mismatch); a paged case the build
// cannot run (packgqa unit not built) counts in tally.skipped.
void run_case(const KCase& c, Tally& tally) {
  SCOPED_TRACE(c.name());
  const bool paged = c.page_size > 0;
  const bool var_q = !c.q_lens.empty(), var_new = !c.new_lens.empty();
  const bool wip = (paged && (c.batch_idx || c.leftpad)) || var_q || var_new;
  ASSERT_TRUE(!wip || flash3::serving_wip_built()) << "test bug: a FLASH3_SERVING_WIP case in a build without it";
  ASSERT_TRUE(c.fill != Fill::kFixed || !c.fills.empty()) << "test bug: Fill::kFixed without fills";
  ASSERT_TRUE(!var_q || int(c.q_lens.size()) == c.b) << "test bug: q_lens needs b entries";
  ASSERT_TRUE(!var_new || int(c.new_lens.size()) == c.b) << "test bug: new_lens needs b entries";
  std::mt19937_64 rng(c.seed);
  const DType t = c.dtype;
  const int b = c.b, sq = c.sq, hq = c.hq, hkv = c.hkv, d = c.d, dv = c.dv, sn = c.sn;
  // Sequence i: sqs[i] query rows from row qoff[i] of q, sns[i] new rows from
  // row noff[i] of k_new / v_new (fixed length: sq / sn each, packed).
  std::vector<int> sqs(b), sns(b), qoff(b + 1, 0), noff(b + 1, 0);
  for (int i = 0; i < b; ++i) {
    sqs[i] = var_q ? c.q_lens[size_t(i)] : sq;
    sns[i] = var_new ? c.new_lens[size_t(i)] : sn;
    qoff[i + 1] = qoff[i] + sqs[i];
    noff[i + 1] = noff[i] + sns[i];
  }
  const int total_new = noff[b];
  // q / out rows: varlen adds 3 rows no sequence covers (out / lse there must
  // keep their poison).
  const int q_rows = qoff[b] + (var_q ? 3 : 0);
  const bool has_new = var_new ? total_new > 0 : sn > 0;
  // sc: rows of a sequence's (logical) cache; for a paged cache its capacity.
  const int bc = c.cache_batches(), sc = c.cache_rows(), rd = c.rotary_dim();
  std::vector<double> q = random_values(t, size_t(q_rows) * hq * d, rng);
  std::vector<double> kc = random_values(t, size_t(bc) * sc * hkv * d, rng);
  std::vector<double> vc = random_values(t, size_t(bc) * sc * hkv * dv, rng);
  std::vector<double> kn = random_values(t, size_t(total_new) * hkv * d, rng);
  std::vector<double> vn = random_values(t, size_t(total_new) * hkv * dv, rng);
  // Tables: angle pos * 10000^(-2j / rd), rounded to the dtype.
  const int seqlen_ro = sc;
  std::vector<double> cos_t(size_t(seqlen_ro) * std::max(rd / 2, 1)), sin_t(cos_t.size());
  for (int p = 0; p < seqlen_ro; ++p)
    for (int j = 0; j < rd / 2; ++j) {
      const double a = p * std::pow(10000.0, -2.0 * j / rd);
      cos_t[size_t(p) * (rd / 2) + j] = flash3::ref::round_to(lowp(t), std::cos(a));
      sin_t[size_t(p) * (rd / 2) + j] = flash3::ref::round_to(lowp(t), std::sin(a));
    }
  // Sequences: fill, entry, leftpad, rotary base.
  std::vector<int> seqlens(b), idx(b), lpad(b, 0), rseq(b);
  std::vector<int> perm(bc);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < b; ++i) {
    const int room = sc - sns[i];
    switch (c.fill) {
      case Fill::kEmpty: seqlens[i] = 0; break;
      case Fill::kOne: seqlens[i] = 1; break;
      case Fill::k1023: seqlens[i] = 1023; break;
      case Fill::kRandom: seqlens[i] = int(rng() % uint64_t(room + 1)); break;
      case Fill::kFixed: seqlens[i] = c.fills[size_t(i) % c.fills.size()]; break;
    }
    seqlens[i] = std::min(seqlens[i], room);
    idx[i] = c.batch_idx ? perm[i] : i;
    if (c.leftpad) lpad[i] = int(rng() % uint64_t(seqlens[i] + 1));
    rseq[i] = int(rng() % uint64_t(sc - sns[i] + 1));
  }
  const Paging pg = paged ? make_paging(c) : Paging{};

  // Device.
  DeviceBuffer dq, dkc, dvc, dkn, dvn, dcos, dsin, dout, dlse, dseq, didx, dlpad, drseq, dtable, dcuq, dcun;
  upload(dq, to_bits(t, q));
  // The k / v initial bits as uploaded: the logical cache, or its pool.
  const std::vector<uint16_t> kc0 = paged ? scatter_to_pool(pg, bc, sc, hkv * d, to_bits(t, kc)) : to_bits(t, kc);
  const std::vector<uint16_t> vc0 = paged ? scatter_to_pool(pg, bc, sc, hkv * dv, to_bits(t, vc)) : to_bits(t, vc);
  upload(dkc, kc0);
  upload(dvc, vc0);
  if (has_new) {
    upload(dkn, to_bits(t, kn));
    upload(dvn, to_bits(t, vn));
  }
  if (rd > 0) {
    upload(dcos, to_bits(t, cos_t));
    upload(dsin, to_bits(t, sin_t));
  }
  upload(dseq, seqlens);
  upload(didx, idx);
  upload(dlpad, lpad);
  upload(drseq, rseq);
  if (paged) upload(dtable, pg.table);
  if (var_q) upload(dcuq, qoff);
  if (var_new) upload(dcun, noff);
  const size_t o_elems = size_t(q_rows) * hq * dv, lse_elems = size_t(q_rows) * hq;
  ASSERT_EQ(dout.reserve(o_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout.ptr, 0xff, o_elems * 2), cudaSuccess);  // NaN poison
  ASSERT_EQ(dlse.reserve(lse_elems * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse.ptr, 0xff, lse_elems * 4), cudaSuccess);

  flash3::KVCacheArgs a;
  if (var_q) {
    a.q = TensorView::make3d(dq.ptr, t, q_rows, hq, d, int64_t(hq) * d, d, 1);
    a.opts.cu_seqlens_q = dcuq.as<int>();
    a.opts.max_seqlen_q = *std::max_element(sqs.begin(), sqs.end());
    a.opts.num_sequences = b;
  } else {
    a.q = view4(dq.ptr, t, b, sq, hq, d);
  }
  if (paged) {
    a.k_cache = view4(dkc.ptr, t, pg.num_pages, pg.page_size, hkv, d);
    a.v_cache = view4(dvc.ptr, t, pg.num_pages, pg.page_size, hkv, dv);
    a.page_table = dtable.as<int>();
    a.page_table_batch_stride = pg.batch_stride;
    a.page_table_max_pages = pg.max_pages;
    if (c.batch_idx) a.page_table_rows = bc;  // a row per cache entry, picked by cache_batch_idx
  } else {
    a.k_cache = view4(dkc.ptr, t, bc, sc, hkv, d);
    a.v_cache = view4(dvc.ptr, t, bc, sc, hkv, dv);
  }
  if (var_new && has_new) {
    a.k_new = TensorView::make3d(dkn.ptr, t, total_new, hkv, d, int64_t(hkv) * d, d, 1);
    a.v_new = TensorView::make3d(dvn.ptr, t, total_new, hkv, dv, int64_t(hkv) * dv, dv, 1);
    a.cu_seqlens_k_new = dcun.as<int>();
  } else if (has_new) {
    a.k_new = view4(dkn.ptr, t, b, sn, hkv, d);
    a.v_new = view4(dvn.ptr, t, b, sn, hkv, dv);
  }
  if (rd > 0) {
    const int64_t sh[2] = {seqlen_ro, rd / 2};
    a.rotary_cos = TensorView::contiguous(dcos.ptr, t, 2, sh);
    a.rotary_sin = TensorView::contiguous(dsin.ptr, t, 2, sh);
    a.rotary_interleaved = c.rotary == Rotary::kInterleaved;
    if (c.rotary_seqlens) a.rotary_seqlens = drseq.as<int>();
  }
  a.cache_seqlens = dseq.as<int>();
  if (c.batch_idx) a.cache_batch_idx = didx.as<int>();
  if (c.leftpad) a.cache_leftpad = dlpad.as<int>();
  if (var_q) {
    a.out = TensorView::make3d(dout.ptr, t, q_rows, hq, dv, int64_t(hq) * dv, dv, 1);
    if (c.store_lse) {  // (hq, total_q)
      const int64_t sh[2] = {hq, q_rows};
      a.lse = TensorView::contiguous(dlse.ptr, DType::kFloat32, 2, sh);
    }
  } else {
    a.out = view4(dout.ptr, t, b, sq, hq, dv);
    if (c.store_lse) {
      // (b, hq, sq) view of an (hq, b, sq) buffer.
      a.lse = TensorView::make4d(dlse.ptr, DType::kFloat32, b, hq, sq, 1, sq, int64_t(b) * sq, 1, 1);
      a.lse.ndim = 3;
    }
  }
  a.opts.causal = c.mask == MaskKind::kCausal;
  if (c.mask == MaskKind::kWindow) {
    a.opts.window_left = 37;
    a.opts.window_right = 3;
  }
  a.opts.num_splits = c.num_splits;
  a.opts.pack_gqa = c.pack_gqa;
  const flash3::Status st = flash3::forward_kvcache(a, nullptr);
  if ((paged || wip) && is_packgqa_not_built(st)) {
    ++tally.skipped;
    tally.why = st.message;
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ++tally.ran;

  // Reference: append (+ rotary), rotated q, on the logical cache.
  flash3::ref::AppendKVShape s;
  s.batch = b;
  s.seqlen_new = sn;
  s.heads_kv = hkv;
  s.head_dim = d;
  s.head_dim_v = dv;
  s.cache_batches = bc;
  s.cache_rows = sc;
  s.rotary_dim = rd;
  s.interleaved = c.rotary == Rotary::kInterleaved;
  s.seqlen_ro = seqlen_ro;
  const int* rs = (rd > 0 && c.rotary_seqlens) ? rseq.data() : nullptr;
  std::vector<double> qr = q;
  if (!var_q && !var_new) {
    if (sn > 0)
      flash3::ref::append_kv(lowp(t), s, kn.data(), vn.data(), seqlens.data(), c.batch_idx ? idx.data() : nullptr, rs,
                             cos_t.data(), sin_t.data(), kc.data(), vc.data());
    if (rd > 0)
      flash3::ref::rotary_q(lowp(t), s, sq, hq, q.data(), seqlens.data(), rs, c.mask != MaskKind::kNone, cos_t.data(),
                            sin_t.data(), qr.data());
  } else {
    // Variable lengths: the same references one sequence at a time, on its
    // own rows and its own cache entry.
    for (int i = 0; i < b; ++i) {
      flash3::ref::AppendKVShape s1 = s;
      s1.batch = 1;
      s1.seqlen_new = sns[i];
      s1.cache_batches = 1;
      const int* rs1 = rs ? &rseq[size_t(i)] : nullptr;
      const size_t e = size_t(idx[i]);
      if (sns[i] > 0)
        flash3::ref::append_kv(lowp(t), s1, &kn[size_t(noff[i]) * hkv * d], &vn[size_t(noff[i]) * hkv * dv],
                               &seqlens[size_t(i)], nullptr, rs1, cos_t.data(), sin_t.data(), &kc[e * sc * hkv * d],
                               &vc[e * sc * hkv * dv]);
      if (rd > 0 && sqs[i] > 0)
        flash3::ref::rotary_q(lowp(t), s1, sqs[i], hq, &q[size_t(qoff[i]) * hq * d], &seqlens[size_t(i)], rs1,
                              c.mask != MaskKind::kNone, cos_t.data(), sin_t.data(), &qr[size_t(qoff[i]) * hq * d]);
    }
  }

  // The caches, bit for bit (paged: the pool read back in logical order, and
  // the unreferenced pages untouched).
  for (int which = 0; which < 2; ++which) {
    const char* name = which ? "v_cache" : "k_cache";
    const int row_elems = hkv * (which ? dv : d);
    const std::vector<uint16_t>& init = which ? vc0 : kc0;
    const std::vector<uint16_t> want = to_bits(t, which ? vc : kc);
    std::vector<uint16_t> raw(init.size());
    ASSERT_EQ(cudaMemcpy(raw.data(), which ? dvc.ptr : dkc.ptr, raw.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    const std::vector<uint16_t> got = paged ? gather_from_pool(pg, bc, sc, row_elems, raw) : raw;
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << name << ": " << bad << " elements differ, first at " << first << " (sequence "
                       << first / (size_t(sc) * row_elems) << ", row " << first / row_elems % size_t(sc) << ")";
    if (paged) {
      const size_t page_elems = size_t(pg.page_size) * row_elems;
      size_t bad_pool = 0, first_pool = 0;
      for (int p = 0; p < pg.num_pages; ++p) {
        if (pg.referenced[size_t(p)]) continue;
        for (size_t e = size_t(p) * page_elems; e < size_t(p + 1) * page_elems; ++e)
          if (raw[e] != init[e] && bad_pool++ == 0) first_pool = e;
      }
      EXPECT_EQ(bad_pool, 0u) << name << ": " << bad_pool << " elements of unreferenced pages changed, first in page "
                              << first_pool / page_elems;
    }
  }

  // Attention per sequence over its rows of the updated (logical) cache.
  std::vector<uint16_t> out_bits(o_elems);
  std::vector<float> lse_got(lse_elems);
  ASSERT_EQ(cudaMemcpy(out_bits.data(), dout.ptr, o_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse_got.data(), dlse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<double> o_all, o_ref, o_low, l_all, l_ref, l_low;
  for (int i = 0; i < b; ++i) {
    const int e = idx[i], lo = lpad[i], hi = seqlens[i] + sns[i], sk = hi - lo, sq1 = sqs[i];
    if (sq1 == 0) continue;
    flash3::ref::Problem p;
    p.batch = 1;
    p.seqlen_q = sq1;
    p.seqlen_k = sk;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.head_dim_v = dv;
    std::vector<double> k1(size_t(sk) * hkv * d), v1(size_t(sk) * hkv * dv);
    for (int r = 0; r < sk; ++r) {
      std::copy_n(&kc[(size_t(e) * sc + lo + r) * hkv * d], size_t(hkv) * d, &k1[size_t(r) * hkv * d]);
      std::copy_n(&vc[(size_t(e) * sc + lo + r) * hkv * dv], size_t(hkv) * dv, &v1[size_t(r) * hkv * dv]);
    }
    const double* q1 = &qr[size_t(qoff[i]) * hq * d];
    flash3::ref::Options o;
    o.causal = a.opts.causal;
    o.window_left = a.opts.window_left;
    o.window_right = a.opts.window_right;
    std::vector<double> out(size_t(sq1) * hq * dv), lse(size_t(hq) * sq1), outl(out.size()), lsel(lse.size());
    flash3::ref::forward(p, o, q1, k1.data(), v1.data(), out.data(), lse.data());
    flash3::ref::forward_lowp(lowp(t), p, o, q1, k1.data(), v1.data(), outl.data(), lsel.data());
    for (size_t j = 0; j < out.size(); ++j) {
      o_all.push_back(half_bits_to_float(t, out_bits[size_t(qoff[i]) * hq * dv + j]));
      o_ref.push_back(out[j]);
      o_low.push_back(outl[j]);
    }
    for (int h = 0; h < hq; ++h)
      for (int r = 0; r < sq1; ++r) {
        // lse buffer (hq, q_rows): fixed length (hq, b, sq); the reference's (1, hq, sq1).
        l_all.push_back(lse_got[size_t(h) * q_rows + qoff[i] + r]);
        l_ref.push_back(lse[size_t(h) * sq1 + r]);
        l_low.push_back(lsel[size_t(h) * sq1 + r]);
      }
  }
  // Varlen: the rows no sequence covers keep their poison.
  for (int r = qoff[b]; r < q_rows; ++r) {
    for (size_t j = 0; j < size_t(hq) * dv; ++j)
      ASSERT_EQ(out_bits[size_t(r) * hq * dv + j], 0xffffu) << "out row " << r << " (past cu_seqlens_q[b]) written";
    for (int h = 0; h < hq && c.store_lse; ++h) {
      uint32_t bits;
      std::memcpy(&bits, &lse_got[size_t(h) * q_rows + r], 4);
      ASSERT_EQ(bits, 0xffffffffu) << "lse row " << r << " (past cu_seqlens_q[b]) written";
    }
  }
  const auto co = flash3::ref::check_close(o_all.data(), o_ref.data(), o_low.data(), o_all.size(), 1e-5);
  EXPECT_TRUE(co.ok) << "out: err " << co.err << " bound " << co.bound << " nan " << co.nan_count;
  if (c.store_lse) {
    // -inf rows (no visible key) must match exactly; check_close treats equal infinities as equal.
    const auto cl = flash3::ref::check_close(l_all.data(), l_ref.data(), l_low.data(), l_all.size(), 1e-5);
    EXPECT_TRUE(cl.ok) << "lse: err " << cl.err << " bound " << cl.bound << " nan " << cl.nan_count;
  }
}

std::vector<HeadDims> kv_head_dims() {
  std::vector<HeadDims> r;
  for (HeadDims h : {HeadDims{64, 64}, HeadDims{128, 128}, HeadDims{256, 256}}) r.push_back(h);
  return r;
}

bool built(DType t, HeadDims h) { return flash3::forward_is_built(t, h.d, h.dv); }

constexpr int kPageSizes[4] = {1, 16, 64, 256};

// The matrix, sampled with a fixed seed: every value of every axis
// appears, combined at random. Odd-numbered cases (120 of 240) use a paged
// cache: page size drawn from kPageSizes, no batch_idx / leftpad (not
// supported with pages), a quarter of them with padded page-table rows. The
// sample does not depend on the build: cases without a kernel are skipped
// afterwards.
std::vector<KCase> sampled_cases() {
  std::mt19937_64 rng(20261202);
  std::vector<KCase> cases;
  const auto hds = kv_head_dims();
  for (int n = 0; n < 240; ++n) {
    KCase c;
    c.dtype = (rng() & 1) ? DType::kBFloat16 : DType::kFloat16;
    const HeadDims h = hds[rng() % hds.size()];
    c.d = h.d;
    c.dv = h.dv;
    const int heads[3][2] = {{4, 4}, {16, 2}, {8, 1}};
    const int hi = int(rng() % 3);
    c.hq = heads[hi][0];
    c.hkv = heads[hi][1];
    const int sqs[3] = {1, 4, 128};
    c.sq = sqs[rng() % 3];
    const int sns[3] = {0, 1, 17};
    c.sn = sns[rng() % 3];
    c.rotary = c.sn > 0 ? Rotary(rng() % 3) : Rotary::kNone;
    c.partial_rotary = (rng() % 3) == 0;
    c.mask = MaskKind(rng() % 3);
    c.batch_idx = rng() & 1;
    c.leftpad = rng() & 1;
    c.rotary_seqlens = (rng() % 4) == 0;
    c.fill = Fill(rng() % 4);
    if (c.fill == Fill::k1023 && c.sq == 128) c.fill = Fill::kRandom;  // keeps the CPU reference quick
    const int splits[4] = {1, 0, 3, 17};
    c.num_splits = splits[rng() % 4];
    c.pack_gqa = int(rng() % 3) - 1;
    c.store_lse = (rng() % 5) != 0;
    if (n % 2 == 1) {
      c.page_size = kPageSizes[rng() % 4];
      c.table_pad = (rng() % 4) == 0 ? 3 : 0;
      c.batch_idx = c.leftpad = false;
    }
    c.seed = rng();
    cases.push_back(c);
  }
  return cases;
}

TEST(KVCacheGpu, SampledMatrix) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Tally tally;
  for (const KCase& c : sampled_cases()) {
    if (!built(c.dtype, {c.d, c.dv})) continue;
    run_case(c, tally);
    if (HasFailure()) return;
  }
  if (tally.skipped > 0)
    std::cout << "[   NOTE   ] " << tally.skipped << " paged cases skipped (" << tally.ran << " ran): " << tally.why
              << "\n";
  if (tally.ran == 0) {
    if (tally.skipped > 0) GTEST_SKIP() << "every case skipped: " << tally.why;
    GTEST_SKIP() << "not built: no d = 64 / 128 / 256 forward kernel";
  }
}

// Corners: empty caches with and without new rows, every sequence's keys cut
// by the leftpad, the split count larger than the KV blocks, causal with
// more queries than keys (rows that see nothing: out 0, lse -inf).
TEST(KVCacheGpu, Corners) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  Tally tally;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    if (!built(t, {128, 128})) continue;
    KCase c;
    c.dtype = t;
    c.fill = Fill::kEmpty;
    c.sn = 0;
    run_case(c, tally);  // no keys at all
    c.sn = 17;
    c.rotary = Rotary::kHalf;
    c.mask = MaskKind::kCausal;
    c.sq = 128;  // more queries than keys: the first rows see nothing
    c.num_splits = 17;
    run_case(c, tally);
    c = KCase{};
    c.dtype = t;
    c.hq = 16;
    c.hkv = 2;
    c.fill = Fill::k1023;
    c.leftpad = true;
    c.batch_idx = true;
    c.sn = 1;
    c.rotary = Rotary::kInterleaved;
    c.num_splits = 0;
    run_case(c, tally);
  }
  if (tally.ran == 0) GTEST_SKIP() << "not built: no d = 128 forward kernel";
}

// Paged corners, bf16 d 128 GQA 8:1, 3 sequences of 512 rows (rounded up to
// whole pages): page sizes 1, 3 (not a power of two), 64 and 256, each with
// 1, 3 and 17 splits. 17 new rows crossing a page boundary; empty caches with
// and without new rows; fills ending exactly at a page boundary (one at the
// full capacity); new rows starting exactly at a page boundary; 128 causal
// queries over few keys (the first rows see nothing) with padded table rows.
TEST(KVCacheGpu, PagedCorners) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  if (!built(DType::kBFloat16, {128, 128})) GTEST_SKIP() << "not built: bf16 d = 128 forward kernel";
  Tally tally;
  for (int ps : {1, 3, 64, 256}) {
    const int boundary = ps * ((100 + ps - 1) / ps);        // the first page boundary at or past row 100
    const int cross = boundary - std::clamp(ps - 1, 1, 5);  // 17 rows appended from here cross it
    for (int ns : {1, 3, 17}) {
      const auto base = [&](int k) {
        KCase c;
        c.dtype = DType::kBFloat16;
        c.d = c.dv = 128;
        c.hq = 8;
        c.hkv = 1;
        c.b = 3;
        c.page_size = ps;
        c.rows = 512;
        c.num_splits = ns;
        c.fill = Fill::kFixed;
        c.seed = uint64_t(ps) * 1000 + uint64_t(ns) * 10 + uint64_t(k);
        return c;
      };
      KCase c = base(0);  // 17 new rows across a page boundary (from fill 0: across several when ps < 17)
      c.fills = {cross, boundary - 1, 0};
      c.sn = 17;
      c.rotary = Rotary::kHalf;
      run_case(c, tally);
      c = base(1);  // empty caches, no new rows: no keys at all (out 0, lse -inf)
      c.fills = {0};
      c.sq = 4;
      run_case(c, tally);
      c = base(2);  // empty caches, 17 new rows
      c.fills = {0};
      c.sn = 17;
      c.sq = 4;
      c.mask = MaskKind::kCausal;
      c.rotary = Rotary::kInterleaved;
      run_case(c, tally);
      c = base(3);  // caches ending exactly at a page boundary, the last one full (fill == capacity)
      c.fills = {boundary, 2 * boundary, INT_MAX};
      c.table_pad = ns == 3 ? 1 : 0;  // an entry read past the full sequence's table row: a NaN page
      run_case(c, tally);
      c = base(4);  // new rows starting exactly at a page boundary
      c.fills = {boundary, ps, 0};
      c.sn = 17;
      c.mask = MaskKind::kWindow;
      c.rotary = Rotary::kHalf;
      c.partial_rotary = true;
      run_case(c, tally);
      c = base(5);  // 128 causal queries: the first rows of the short sequences see nothing
      c.fills = {cross, boundary, 0};
      c.sn = 17;
      c.sq = 128;
      c.mask = MaskKind::kCausal;
      c.rotary = Rotary::kInterleaved;
      c.table_pad = 2;
      run_case(c, tally);
      if (HasFailure()) return;
    }
  }
  if (tally.ran == 0) GTEST_SKIP() << "every case skipped: " << tally.why;
  if (tally.skipped > 0)
    std::cout << "[   NOTE   ] " << tally.skipped << " cases skipped (" << tally.ran << " ran): " << tally.why << "\n";
}

// FLASH3_SERVING_WIP: variable-length queries and new rows (the call vLLM and
// SGLang make: a batch mixing prefill chunks and decode tokens, each
// sequence's new rows its own queries' keys), on contiguous and paged caches,
// and paged caches with cache_batch_idx / cache_leftpad. 16:2 heads: 130
// query rows are 1040 packed rows, several tiles of one sequence (the prep
// kernel's tile map with gathered K/V). Skipped in builds without it.
TEST(KVCacheGpu, ServingWip) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  if (!flash3::serving_wip_built()) GTEST_SKIP() << "built without FLASH3_SERVING_WIP";
  Tally tally;
  uint64_t seed = 4000;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (HeadDims h : kv_head_dims()) {
      if (!built(t, h)) continue;
      for (int ps : {0, 1, 16, 64}) {
        for (int variant = 0; variant < 6; ++variant) {
          KCase c;
          c.dtype = t;
          c.d = h.d;
          c.dv = h.dv;
          c.hq = 16;
          c.hkv = 2;
          c.b = 5;
          c.page_size = ps;
          c.rows = 400;
          c.seed = seed++;
          // Padded table rows name a NaN page: a read past an entry's row shows.
          c.table_pad = ps > 0 && variant % 2 == 0 ? 2 : 0;
          switch (variant) {
            case 0:  // prefill chunks and decode tokens, causal, rotary, split heuristic
              c.q_lens = {1, 7, 0, 130, 1};
              c.new_lens = c.q_lens;
              c.mask = MaskKind::kCausal;
              c.rotary = Rotary::kHalf;
              c.num_splits = 0;
              break;
            case 1:  // decode only in the varlen layout, 3 splits
              c.q_lens = {1, 1, 1, 1, 1};
              c.new_lens = c.q_lens;
              c.mask = MaskKind::kCausal;
              c.rotary = Rotary::kInterleaved;
              c.num_splits = 3;
              break;
            case 2:  // varlen q, fixed new rows, window, leftpad, cache index
              c.q_lens = {3, 0, 64, 2, 9};
              c.sn = 2;
              c.mask = MaskKind::kWindow;
              c.leftpad = true;
              c.batch_idx = true;
              break;
            case 3:  // fixed q, varlen new rows (some sequences none), rotary positions given
              c.sq = 4;
              c.new_lens = {0, 1, 17, 3, 0};
              c.mask = MaskKind::kCausal;
              c.rotary = Rotary::kHalf;
              c.rotary_seqlens = true;
              c.batch_idx = true;
              break;
            case 4:  // no query rows at all (max_seqlen_q 0): the append only
              c.q_lens = {0, 0, 0, 0, 0};
              c.new_lens = {2, 0, 5, 1, 3};
              break;
            case 5:  // fixed lengths with cache index and leftpad (paged: the WIP row map)
              c.sq = 2;
              c.sn = 1;
              c.leftpad = true;
              c.batch_idx = true;
              c.pack_gqa = 0;
              c.mask = MaskKind::kCausal;
              c.rotary = Rotary::kInterleaved;
              break;
          }
          run_case(c, tally);
          if (HasFailure()) return;
        }
      }
    }
  }
  if (tally.ran == 0) GTEST_SKIP() << (tally.skipped > 0 ? "every case skipped: " + tally.why : "no kernel built");
  if (tally.skipped > 0)
    std::cout << "[   NOTE   ] " << tally.skipped << " cases skipped (" << tally.ran << " ran): " << tally.why << "\n";
}

// One call run directly, then captured in a CUDA graph and replayed: the same
// output. page_size 0: a contiguous cache; else a paged one (random table).
// *skip: why a paged call cannot run in this build ("" when it ran).
void graph_replay_case(int page_size, std::string* skip) {
  SCOPED_TRACE(page_size > 0 ? "paged, page size " + std::to_string(page_size) : std::string("contiguous"));
  const int b = 2, sq = 1, hq = 16, hkv = 2, d = 128, sc = 512;
  std::mt19937_64 rng(7);
  auto qv = to_bits(DType::kBFloat16, random_values(DType::kBFloat16, size_t(b) * sq * hq * d, rng));
  auto kv = to_bits(DType::kBFloat16, random_values(DType::kBFloat16, size_t(b) * sc * hkv * d, rng));
  std::vector<int> seqlens = {300, 511};
  KCase layout;  // the paging of a (b, sc) cache
  layout.b = b;
  layout.rows = sc;
  layout.page_size = page_size;
  layout.seed = 7;
  const Paging pg = page_size > 0 ? make_paging(layout) : Paging{};
  DeviceBuffer dq, dk, dv, dseq, dout, dws, dtable;
  upload(dq, qv);
  if (page_size > 0) {
    const std::vector<uint16_t> pool = scatter_to_pool(pg, b, sc, hkv * d, kv);
    upload(dk, pool);
    upload(dv, pool);
    upload(dtable, pg.table);
  } else {
    upload(dk, kv);
    upload(dv, kv);
  }
  upload(dseq, seqlens);
  ASSERT_EQ(dout.reserve(size_t(b) * sq * hq * d * 2), cudaSuccess);
  flash3::KVCacheArgs a;
  a.q = view4(dq.ptr, DType::kBFloat16, b, sq, hq, d);
  if (page_size > 0) {
    a.k_cache = view4(dk.ptr, DType::kBFloat16, pg.num_pages, page_size, hkv, d);
    a.v_cache = view4(dv.ptr, DType::kBFloat16, pg.num_pages, page_size, hkv, d);
    a.page_table = dtable.as<int>();
    a.page_table_batch_stride = pg.batch_stride;
    a.page_table_max_pages = pg.max_pages;
  } else {
    a.k_cache = view4(dk.ptr, DType::kBFloat16, b, sc, hkv, d);
    a.v_cache = view4(dv.ptr, DType::kBFloat16, b, sc, hkv, d);
  }
  a.cache_seqlens = dseq.as<int>();
  a.out = view4(dout.ptr, DType::kBFloat16, b, sq, hq, d);
  a.opts.num_splits = 0;
  const size_t ws = flash3::kvcache_workspace_size(a);
  ASSERT_EQ(dws.reserve(ws), cudaSuccess);
  a.workspace = dws.ptr;
  a.workspace_bytes = ws;
  const flash3::Status direct_st = flash3::forward_kvcache(a, nullptr);
  if (page_size > 0 && is_packgqa_not_built(direct_st)) {
    *skip = direct_st.message;
    return;
  }
  ASSERT_TRUE(direct_st.ok()) << direct_st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> direct(size_t(b) * sq * hq * d), replay(direct.size());
  ASSERT_EQ(cudaMemcpy(direct.data(), dout.ptr, direct.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint16_t x : direct) ASSERT_FALSE(std::isnan(half_bits_to_float(DType::kBFloat16, x))) << "NaN in out";
  ASSERT_EQ(cudaMemset(dout.ptr, 0xff, direct.size() * 2), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const flash3::Status st = flash3::forward_kvcache(a, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(replay.data(), dout.ptr, replay.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(direct.data(), replay.data(), direct.size() * 2), 0);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// The same call captured in a CUDA graph and replayed gives the same result
// (no host work depends on device data), with a contiguous and a paged cache.
TEST(KVCacheGpu, GraphReplayMatchesDirect) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  if (!built(DType::kBFloat16, {128, 128})) GTEST_SKIP() << "not built: bf16 d = 128";
  std::string skip;
  graph_replay_case(0, &skip);
  if (HasFailure()) return;
  graph_replay_case(64, &skip);
  if (!skip.empty()) std::cout << "[   NOTE   ] the paged replay was skipped: " << skip << "\n";
}

}  // namespace
