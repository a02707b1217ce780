// flash3::forward_kvcache (flash_attn_with_kvcache) against the CPU
// references: the append + rotary (reference/kvcache_ref.h, bit-exact on the
// whole cache, untouched rows included) and the attention of each sequence
// over its cache rows [leftpad, cache_seqlens + seqlen_new) (float64
// reference, FlashAttention tolerance rule on out and lse). The case matrix
// is the (contiguous cache) sampled with a fixed seed, plus corners.
#include <algorithm>
#include <cmath>
#include <cstring>
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

enum class Fill { kEmpty, kOne, k1023, kRandom };
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

  int cache_rows() const { return fill == Fill::k1023 ? 1023 + 32 : 160; }
  int cache_batches() const { return batch_idx ? b + 2 : b; }
  int rotary_dim() const { return rotary == Rotary::kNone ? 0 : (partial_rotary ? d / 2 : d); }
  std::string name() const {
    std::ostringstream os;
    os << flash3::dtype_name(dtype) << " d" << d << "x" << dv << " h" << hq << ":" << hkv << " b" << b << " sq" << sq
       << " new" << sn << " rot" << int(rotary) << (partial_rotary ? "p" : "") << " mask" << int(mask)
       << (batch_idx ? " idx" : "") << (leftpad ? " lpad" : "") << (rotary_seqlens ? " rseq" : "") << " fill"
       << int(fill) << " splits" << num_splits << " pack" << pack_gqa;
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

// One case end to end; returns a failure description or "".
void run_case(const KCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(c.seed);
  const DType t = c.dtype;
  const int b = c.b, sq = c.sq, hq = c.hq, hkv = c.hkv, d = c.d, dv = c.dv, sn = c.sn;
  const int bc = c.cache_batches(), sc = c.cache_rows(), rd = c.rotary_dim();
  std::vector<double> q = random_values(t, size_t(b) * sq * hq * d, rng);
  std::vector<double> kc = random_values(t, size_t(bc) * sc * hkv * d, rng);
  std::vector<double> vc = random_values(t, size_t(bc) * sc * hkv * dv, rng);
  std::vector<double> kn = random_values(t, size_t(b) * sn * hkv * d, rng);
  std::vector<double> vn = random_values(t, size_t(b) * sn * hkv * dv, rng);
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
    const int room = sc - sn;
    switch (c.fill) {
      case Fill::kEmpty: seqlens[i] = 0; break;
      case Fill::kOne: seqlens[i] = 1; break;
      case Fill::k1023: seqlens[i] = 1023; break;
      case Fill::kRandom: seqlens[i] = int(rng() % uint64_t(room + 1)); break;
    }
    seqlens[i] = std::min(seqlens[i], room);
    idx[i] = c.batch_idx ? perm[i] : i;
    if (c.leftpad) lpad[i] = int(rng() % uint64_t(seqlens[i] + 1));
    rseq[i] = int(rng() % uint64_t(sc - sn + 1));
  }

  // Device.
  DeviceBuffer dq, dkc, dvc, dkn, dvn, dcos, dsin, dout, dlse, dseq, didx, dlpad, drseq;
  upload(dq, to_bits(t, q));
  upload(dkc, to_bits(t, kc));
  upload(dvc, to_bits(t, vc));
  if (sn > 0) {
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
  const size_t o_elems = size_t(b) * sq * hq * dv, lse_elems = size_t(b) * hq * sq;
  ASSERT_EQ(dout.reserve(o_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout.ptr, 0xff, o_elems * 2), cudaSuccess);  // NaN poison
  ASSERT_EQ(dlse.reserve(lse_elems * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dlse.ptr, 0xff, lse_elems * 4), cudaSuccess);

  flash3::KVCacheArgs a;
  a.q = view4(dq.ptr, t, b, sq, hq, d);
  a.k_cache = view4(dkc.ptr, t, bc, sc, hkv, d);
  a.v_cache = view4(dvc.ptr, t, bc, sc, hkv, dv);
  if (sn > 0) {
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
  a.out = view4(dout.ptr, t, b, sq, hq, dv);
  if (c.store_lse) {
    // (b, hq, sq) view of an (hq, b, sq) buffer.
    a.lse = TensorView::make4d(dlse.ptr, DType::kFloat32, b, hq, sq, 1, sq, int64_t(b) * sq, 1, 1);
    a.lse.ndim = 3;
  }
  a.opts.causal = c.mask == MaskKind::kCausal;
  if (c.mask == MaskKind::kWindow) {
    a.opts.window_left = 37;
    a.opts.window_right = 3;
  }
  a.opts.num_splits = c.num_splits;
  a.opts.pack_gqa = c.pack_gqa;
  const flash3::Status st = flash3::forward_kvcache(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Reference: append (+ rotary), rotated q.
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
  if (sn > 0)
    flash3::ref::append_kv(lowp(t), s, kn.data(), vn.data(), seqlens.data(), c.batch_idx ? idx.data() : nullptr, rs,
                           cos_t.data(), sin_t.data(), kc.data(), vc.data());
  std::vector<double> qr = q;
  if (rd > 0)
    flash3::ref::rotary_q(lowp(t), s, sq, hq, q.data(), seqlens.data(), rs, c.mask != MaskKind::kNone, cos_t.data(),
                          sin_t.data(), qr.data());

  // The caches, bit for bit.
  for (int which = 0; which < 2; ++which) {
    const std::vector<double>& ref = which ? vc : kc;
    std::vector<uint16_t> want = to_bits(t, ref), got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), which ? dvc.ptr : dkc.ptr, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << (which ? "v_cache" : "k_cache") << ": " << bad << " elements differ, first at " << first;
  }

  // Attention per sequence over its rows of the updated cache.
  std::vector<uint16_t> out_bits(o_elems);
  std::vector<float> lse_got(lse_elems);
  ASSERT_EQ(cudaMemcpy(out_bits.data(), dout.ptr, o_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse_got.data(), dlse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<double> o_all, o_ref, o_low, l_all, l_ref, l_low;
  for (int i = 0; i < b; ++i) {
    const int e = idx[i], lo = lpad[i], hi = seqlens[i] + sn, sk = hi - lo;
    flash3::ref::Problem p;
    p.batch = 1;
    p.seqlen_q = sq;
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
    const double* q1 = &qr[size_t(i) * sq * hq * d];
    flash3::ref::Options o;
    o.causal = a.opts.causal;
    o.window_left = a.opts.window_left;
    o.window_right = a.opts.window_right;
    std::vector<double> out(size_t(sq) * hq * dv), lse(size_t(hq) * sq), outl(out.size()), lsel(lse.size());
    flash3::ref::forward(p, o, q1, k1.data(), v1.data(), out.data(), lse.data());
    flash3::ref::forward_lowp(lowp(t), p, o, q1, k1.data(), v1.data(), outl.data(), lsel.data());
    for (size_t j = 0; j < out.size(); ++j) {
      o_all.push_back(half_bits_to_float(t, out_bits[size_t(i) * sq * hq * dv + j]));
      o_ref.push_back(out[j]);
      o_low.push_back(outl[j]);
    }
    for (int h = 0; h < hq; ++h)
      for (int r = 0; r < sq; ++r) {
        // lse buffer (hq, b, sq); the reference's (1, hq, sq).
        l_all.push_back(lse_got[(size_t(h) * b + i) * sq + r]);
        l_ref.push_back(lse[size_t(h) * sq + r]);
        l_low.push_back(lsel[size_t(h) * sq + r]);
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

// The matrix, sampled: every value of every axis appears, combined at random.
TEST(KVCacheGpu, SampledMatrix) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  std::mt19937_64 rng(20261202);
  int ran = 0;
  for (int n = 0; n < 160; ++n) {
    KCase c;
    c.dtype = (rng() & 1) ? DType::kBFloat16 : DType::kFloat16;
    const auto hds = kv_head_dims();
    const HeadDims h = hds[rng() % hds.size()];
    if (!built(c.dtype, h)) continue;
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
    c.seed = rng();
    run_case(c);
    ++ran;
    if (HasFailure()) return;
  }
  if (ran == 0) GTEST_SKIP() << "not built: no d = 64 / 128 / 256 forward kernel";
}

// Corners: empty caches with and without new rows, every sequence's keys cut
// by the leftpad, the split count larger than the KV blocks, causal with
// more queries than keys (rows that see nothing: out 0, lse -inf).
TEST(KVCacheGpu, Corners) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    if (!built(t, {128, 128})) continue;
    ++ran;
    KCase c;
    c.dtype = t;
    c.fill = Fill::kEmpty;
    c.sn = 0;
    run_case(c);  // no keys at all
    c.sn = 17;
    c.rotary = Rotary::kHalf;
    c.mask = MaskKind::kCausal;
    c.sq = 128;  // more queries than keys: the first rows see nothing
    c.num_splits = 17;
    run_case(c);
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
    run_case(c);
  }
  if (ran == 0) GTEST_SKIP() << "not built: no d = 128 forward kernel";
}

// The same call captured in a CUDA graph and replayed gives the same result
// (no host work depends on device data).
TEST(KVCacheGpu, GraphReplayMatchesDirect) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  if (!built(DType::kBFloat16, {128, 128})) GTEST_SKIP() << "not built: bf16 d = 128";
  const int b = 2, sq = 1, hq = 16, hkv = 2, d = 128, sc = 512;
  std::mt19937_64 rng(7);
  auto qv = to_bits(DType::kBFloat16, random_values(DType::kBFloat16, size_t(b) * sq * hq * d, rng));
  auto kv = to_bits(DType::kBFloat16, random_values(DType::kBFloat16, size_t(b) * sc * hkv * d, rng));
  std::vector<int> seqlens = {300, 511};
  DeviceBuffer dq, dk, dv, dseq, dout, dws;
  upload(dq, qv);
  upload(dk, kv);
  upload(dv, kv);
  upload(dseq, seqlens);
  ASSERT_EQ(dout.reserve(size_t(b) * sq * hq * d * 2), cudaSuccess);
  flash3::KVCacheArgs a;
  a.q = view4(dq.ptr, DType::kBFloat16, b, sq, hq, d);
  a.k_cache = view4(dk.ptr, DType::kBFloat16, b, sc, hkv, d);
  a.v_cache = view4(dv.ptr, DType::kBFloat16, b, sc, hkv, d);
  a.cache_seqlens = dseq.as<int>();
  a.out = view4(dout.ptr, DType::kBFloat16, b, sq, hq, d);
  a.opts.num_splits = 0;
  const size_t ws = flash3::kvcache_workspace_size(a);
  ASSERT_EQ(dws.reserve(ws), cudaSuccess);
  a.workspace = dws.ptr;
  a.workspace_bytes = ws;
  ASSERT_TRUE(flash3::forward_kvcache(a, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> direct(size_t(b) * sq * hq * d), replay(direct.size());
  ASSERT_EQ(cudaMemcpy(direct.data(), dout.ptr, direct.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
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

}  // namespace
