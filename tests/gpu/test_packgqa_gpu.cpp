// GPU correctness tests of PackGQA (AttentionOptions::pack_gqa): the forward
// that packs the g = hq / hkv query heads of a KV head into one query tile's
// rows (packed row r of kv head hk -> query row r / g, query head hk * g + r % g),
// so each K/V tile is read once per group. Only speed may differ from the
// unpacked kernel, so every result is judged like test_fwd_gpu.cpp's: against
// the fp32 GPU reference under the FlashAttention tolerance rule
// (flash3::ref::check_close)
//     max|ours - ref_fp32| <= 2 * max|plain_lowp - ref_fp32| + eps,  no NaN,
// O and LSE separately (eps 1e-5 each); LSE is stored and checked in every case.
//
// The packed kernel runs only where (a) variants.txt lists the forward's
// "packgqa" unit of the (dtype, head dims), (b) hq != hkv, (c) softcap = 0 and
// (d) pack_gqa = 1 (or the heuristic picks it); elsewhere the unpacked kernel
// runs and a "packed" case would pass without testing the packed kernel. So
// the packed suites run only where the unit is listed, assert (b) to (d) for
// every case, and check fwd_pack_gqa() (launch/dispatch.h) on every call.
//
// Suites:
//   PackGqa/PackGqaFwd       pack_gqa = 1, every head dim (bf16 all 56 cases, then
//                            fp16 an eighth of them): 5 masks x 6 head ratios (MQA,
//                            g = 4, 5, 6, 8, 16) over 28 seqlen pairs from 1 x 1 to
//                            1000 x 2048 (sq > sk and sq < sk), batch 1-3, padded q / out
//   PackGqa/PackGqaFwdModes  pack_gqa = 0 and -1 on inputs of PackGqaFwd and
//                            PackGqaVarlen (the same seeds)
//   PackGqa/PackGqaVarlen    varlen batches of 1-9 sequences, lengths 0..600 (0 and 1
//                            included), seqused_q / seqused_k, GQA 8:2 and 16:2
//   PackGqaGpu.*             packed against unpacked on the same inputs, stores
//                            outside the problem, the fallback where no packed
//                            unit runs, rejected values
// FLASH3_GPU_TESTS_QUICK=1 keeps about a third of the fixed-length cases and
// half of the first dtype's varlen batches.
//
// out and lse are poisoned (NaN) before every call; everything outside the
// views (padding, the guard after each tensor, and for varlen the rows beyond
// seqused) must still hold the poison afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"
#include "gpu_case.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "reference/reference.h"

// Internal: the launch's PackGQA decision on lowered params.
#include "common/params.h"
#include "launch/dispatch.h"

namespace {

using flash3::DType;
using flash3::TensorView;
namespace tu = flash3::testutil;
using namespace flash3::gputest;

constexpr double kEpsO = 1e-5;
constexpr double kEpsLse = 1e-5;
constexpr uint32_t kPoison32 = 0xffffffffu;  // NaN in fp32
constexpr float kNaN = flash3::gpuref::kDefaultScale;
// Rows of poison after each batch element's out / lse rows (and after varlen's
// last row) in the cases that look for stores outside the problem: a packed
// tile past the last query row covers fewer than tile_m (<= 192) query rows.
constexpr int kGapRows = 192;

// ---------------------------------------------------------------------------
// The decision the launch must take.
// ---------------------------------------------------------------------------
// Whether launch_forward must pack (the contract of fwd_pack_gqa): never for
// pack_gqa = 0, MHA, softcap or without the packed unit; always for 1; for -1
// (the heuristic) always for varlen, unknown here for fixed length.
std::optional<bool> expected_pack(DType dt, HeadDims h, int hq, int hkv, float softcap, int pack, bool varlen) {
  if (pack == 0 || hq == hkv || softcap > 0.f || !packgqa_built(dt, h)) return false;
  if (pack == 1 || varlen) return true;
  return std::nullopt;
}

// fwd_pack_gqa() on the params of `a` is `expected` (where the contract fixes it).
void expect_pack_decision(const flash3::ForwardArgs& a, std::optional<bool> expected, const std::string& what) {
  if (expected.has_value()) {
    EXPECT_EQ(flash3::fwd_pack_gqa(flash3::make_fwd_params(a)), *expected)
        << what << ": fwd_pack_gqa() with opts.pack_gqa = " << a.opts.pack_gqa;
  }
}

const char* pack_name(int pack) { return pack == 1 ? "_pack1" : (pack == 0 ? "_pack0" : "_packauto"); }

// ---------------------------------------------------------------------------
// Device state shared by all tests of the process (buffers only grow).
// ---------------------------------------------------------------------------
struct DeviceState {
  cudaStream_t stream = nullptr;
  tu::DeviceBuffer in, out, lse, meta, ref_o, ref_lse, low_o, low_lse;
};

DeviceState& dev() {
  static DeviceState* s = [] {
    auto* st = new DeviceState;  // intentionally leaked: no CUDA calls during static destruction
    if (cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking) != cudaSuccess) st->stream = nullptr;
    return st;
  }();
  return *s;
}

::testing::AssertionResult reserve_all(std::initializer_list<std::pair<tu::DeviceBuffer*, size_t>> bufs) {
  for (auto [buf, bytes] : bufs) {
    const cudaError_t e = buf->reserve(bytes);
    if (e != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMalloc(" << bytes << " bytes): " << cudaGetErrorString(e);
  }
  return ::testing::AssertionSuccess();
}

uint16_t* elem16(void* base, int64_t offset) { return static_cast<uint16_t*>(base) + offset; }

// ===========================================================================
// Fixed length.
// ===========================================================================
struct Case {
  DType dtype = DType::kBFloat16;
  int d = 128, dv = 128;
  int sq = 128, sk = 128;
  int hq = 8, hkv = 2;
  int batch = 1;
  bool causal = false;
  int wl = -1, wr = -1;
  float scale = kNaN;    // softmax_scale; NaN: 1/sqrt(d)
  float softcap = 0.f;   // opts.softcap; 0: off
  int pack = 1;          // opts.pack_gqa
  Layout layout = Layout::kContiguous;  // kContiguous or kPadded (q, k, v and out)
  int gap_rows = 0;      // > 0: out padded with this many rows of poison after each batch element, lse likewise
  uint64_t seed = 1;
  std::string name;

  std::string describe() const {
    std::ostringstream os;
    os << name << " [" << tu::short_dtype(dtype) << " d=" << d << " dv=" << dv << " b=" << batch << " sq=" << sq
       << " sk=" << sk << " hq=" << hq << " hkv=" << hkv << " causal=" << causal << " window=(" << wl << "," << wr
       << ") scale=" << scale;
    if (softcap > 0.f) os << " softcap=" << softcap;
    os << " pack_gqa=" << pack << " layout=" << layout_name(layout);
    if (gap_rows > 0) os << " gap_rows=" << gap_rows;
    os << " seed=" << seed << "]";
    return os.str();
  }
};

// q / k / v in one allocation; out (b, sq, hq, dv) and lse (b, hq, sq) in their
// own, each followed by at least kGuard poisoned elements.
struct Plan {
  View q, k, v, o;
  int64_t in_elems = 0, out_elems = 0;
  int64_t lse_sh = 0, lse_sb = 0, lse_elems = 0;  // lse head / batch strides, allocation (floats)
};

Plan make_plan(const Case& c) {
  Plan p;
  const QKV in = make_qkv(c.layout, c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.dv);
  p.q = in.q, p.k = in.k, p.v = in.v;
  p.in_elems = in.elems;
  const int64_t sq1 = std::max(c.sq, 1);
  if (c.gap_rows > 0) {
    p.o = padded_view(0, c.batch, c.sq, c.hq, c.dv);
    p.o.sb = (sq1 + c.gap_rows) * p.o.sr;
  } else {
    p.o = c.layout == Layout::kPadded ? padded_view(0, c.batch, c.sq, c.hq, c.dv)
                                      : dense_view(0, c.batch, c.sq, c.hq, c.dv);
  }
  p.out_elems = p.o.span() + std::max<int64_t>(kGuard, int64_t(c.gap_rows) * p.o.sr);
  p.lse_sh = sq1 + c.gap_rows;
  p.lse_sb = c.hq * p.lse_sh;
  p.lse_elems = c.batch * p.lse_sb + std::max<int64_t>(kGuard, c.gap_rows);
  return p;
}

flash3::ForwardArgs make_args(const Case& c, const Plan& p, void* in, void* out, float* lse) {
  flash3::ForwardArgs a;
  auto view4 = [&](void* base, const View& v) {
    return TensorView::make4d(elem16(base, v.offset), c.dtype, v.b, v.s, v.h, v.d, v.sb, v.sr, v.sh, 1);
  };
  a.q = view4(in, p.q);
  a.k = view4(in, p.k);
  a.v = view4(in, p.v);
  a.out = view4(out, p.o);
  a.lse = TensorView::make3d(lse, DType::kFloat32, c.batch, c.hq, c.sq, p.lse_sb, p.lse_sh, 1);
  a.opts.causal = c.causal;
  a.opts.window_left = c.wl;
  a.opts.window_right = c.wr;
  a.opts.softmax_scale = c.scale;
  a.opts.softcap = c.softcap;
  a.opts.pack_gqa = c.pack;
  return a;
}

flash3::gpuref::Args make_ref_args(const Case& c, const Plan& p, const void* in, float* out, float* lse) {
  flash3::gpuref::Args r;
  r.dtype = c.dtype;
  r.batch = c.batch;
  r.seqlen_q = c.sq;
  r.seqlen_k = c.sk;
  r.heads_q = c.hq;
  r.heads_kv = c.hkv;
  r.head_dim = c.d;
  r.head_dim_v = c.dv;
  auto s16 = [&](const View& v) {
    flash3::gpuref::Strided16 t;
    t.data = static_cast<const uint16_t*>(in) + v.offset;
    t.batch_stride = v.sb;
    t.row_stride = v.sr;
    t.head_stride = v.sh;
    return t;
  };
  r.q = s16(p.q);
  r.k = s16(p.k);
  r.v = s16(p.v);
  r.causal = c.causal;
  r.window_left = c.wl;
  r.window_right = c.wr;
  r.softmax_scale = c.scale;
  r.softcap = c.softcap;
  r.out = out;
  r.lse = lse;
  return r;
}

std::string where_o(const Case& c, size_t i) {
  const int64_t dv = c.dv, hq = c.hq, sq = c.sq;
  std::ostringstream os;
  os << "(b=" << int64_t(i) / (dv * hq * sq) << ", s=" << (int64_t(i) / (dv * hq)) % sq
     << ", h=" << (int64_t(i) / dv) % hq << ", c=" << int64_t(i) % dv << ")";
  return os.str();
}
std::string where_lse(const Case& c, size_t i) {
  std::ostringstream os;
  os << "(b=" << int64_t(i) / (int64_t(c.hq) * c.sq) << ", h=" << (int64_t(i) / c.sq) % c.hq
     << ", s=" << int64_t(i) % c.sq << ")";
  return os.str();
}

// A checked result, dense (o (b, sq, hq, dv), lse (b, hq, sq)), with the
// tolerance baselines, for comparing two flash3 results of the same inputs.
struct Outcome {
  std::vector<double> o, lse;
  double o_base = 0, lse_base = 0;
};

// Full check of one case: inputs from the case's seed, out / lse poisoned,
// flash3::forward, the launch's packing decision, nothing written outside the
// views, O and LSE against the fp32 GPU reference (baseline: its emulation of
// a plain bf16 / fp16 implementation).
void check_case(const Case& c, Outcome* outcome = nullptr) {
  SCOPED_TRACE(c.describe());
  const Plan p = make_plan(c);
  DeviceState& d = dev();
  const size_t n_o = size_t(c.batch) * c.sq * c.hq * c.dv;
  const size_t n_lse = size_t(c.batch) * c.hq * c.sq;
  const size_t ref_o_bytes = std::max<size_t>(n_o, 1) * 4, ref_lse_bytes = std::max<size_t>(n_lse, 1) * 4;
  ASSERT_TRUE(reserve_all({{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2},
                       {&d.lse, size_t(p.lse_elems) * 4}, {&d.ref_o, ref_o_bytes}, {&d.low_o, ref_o_bytes},
                       {&d.ref_lse, ref_lse_bytes}, {&d.low_lse, ref_lse_bytes}}));
  std::vector<uint16_t> host_in(size_t(p.in_elems));
  tu::fill_normal(host_in.data(), host_in.size(), c.dtype, c.seed);
  FLASH3_CUDA_OK(cudaMemcpyAsync(d.in.ptr, host_in.data(), host_in.size() * 2, cudaMemcpyHostToDevice, d.stream));
  FLASH3_CUDA_OK(cudaMemsetAsync(d.out.ptr, 0xff, size_t(p.out_elems) * 2, d.stream));
  FLASH3_CUDA_OK(cudaMemsetAsync(d.lse.ptr, 0xff, size_t(p.lse_elems) * 4, d.stream));

  const flash3::ForwardArgs args = make_args(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>());
  expect_pack_decision(args, expected_pack(c.dtype, {c.d, c.dv}, c.hq, c.hkv, c.softcap, c.pack, false),
                       c.describe());
  const flash3::Status st = flash3::forward(args, d.stream);
  ASSERT_TRUE(st.ok()) << c.describe() << ": flash3::forward failed: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
  FLASH3_CUDA_OK(cudaGetLastError());

  const auto ref_args = make_ref_args(c, p, d.in.ptr, d.ref_o.as<float>(), d.ref_lse.as<float>());
  FLASH3_CUDA_OK(flash3::gpuref::forward(ref_args, flash3::gpuref::Mode::kFloat32, d.stream));
  const auto low_args = make_ref_args(c, p, d.in.ptr, d.low_o.as<float>(), d.low_lse.as<float>());
  FLASH3_CUDA_OK(flash3::gpuref::forward(low_args, flash3::gpuref::Mode::kLowPrecision, d.stream));

  std::vector<uint16_t> h_out(size_t(p.out_elems));
  std::vector<uint32_t> h_lse(size_t(p.lse_elems));
  std::vector<float> h_ref_o(n_o), h_low_o(n_o), h_ref_lse(n_lse), h_low_lse(n_lse);
  FLASH3_CUDA_OK(cudaMemcpyAsync(h_out.data(), d.out.ptr, h_out.size() * 2, cudaMemcpyDeviceToHost, d.stream));
  FLASH3_CUDA_OK(cudaMemcpyAsync(h_lse.data(), d.lse.ptr, h_lse.size() * 4, cudaMemcpyDeviceToHost, d.stream));
  FLASH3_CUDA_OK(cudaMemcpyAsync(h_ref_o.data(), d.ref_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream));
  FLASH3_CUDA_OK(cudaMemcpyAsync(h_low_o.data(), d.low_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream));
  FLASH3_CUDA_OK(cudaMemcpyAsync(h_ref_lse.data(), d.ref_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream));
  FLASH3_CUDA_OK(cudaMemcpyAsync(h_low_lse.data(), d.low_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream));
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));

  // Nothing written outside out's view (padding, gaps, guard) or lse's.
  const int64_t clobbered = count_clobbered(h_out, {&p.o});
  EXPECT_EQ(clobbered, 0) << c.describe() << ": flash3 wrote " << clobbered
                          << " elements of the out allocation outside the (b, sq, hq, dv) view";
  std::vector<double> lse(n_lse);
  std::vector<uint8_t> inside(h_lse.size(), 0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t s = 0; s < c.sq; ++s) {
        const size_t at = size_t(b * p.lse_sb + h * p.lse_sh + s);
        inside[at] = 1;
        lse[size_t((b * c.hq + h) * c.sq + s)] = tu::bits_f32(h_lse[at]);
      }
  int64_t lse_outside = 0;
  for (size_t i = 0; i < h_lse.size(); ++i) lse_outside += !inside[i] && h_lse[i] != kPoison32;
  EXPECT_EQ(lse_outside, 0) << c.describe() << ": flash3 wrote " << lse_outside
                            << " floats of the lse allocation outside the (b, hq, sq) view";

  const std::vector<double> o = extract(h_out, p.o, c.dtype);
  const Verdict vo = judge("O", o, to_double(h_ref_o), to_double(h_low_o), kEpsO,
                           [&](size_t i) { return where_o(c, i); }, tol_factor(c));
  EXPECT_TRUE(vo.ok) << c.describe() << "\n  " << vo.text;
  const Verdict vl = judge("LSE", lse, to_double(h_ref_lse), to_double(h_low_lse), kEpsLse,
                           [&](size_t i) { return where_lse(c, i); }, tol_factor(c));
  EXPECT_TRUE(vl.ok) << c.describe() << "\n  " << vl.text;
  if (outcome != nullptr) {
    outcome->o = o;
    outcome->lse = std::move(lse);
    outcome->o_base = vo.r.base_err;
    outcome->lse_base = vl.r.base_err;
  }
}

// A case that runs the packed kernel once its unit is built: the suites of
// forced packing check this before the case itself.
::testing::AssertionResult takes_packed_path(int hq, int hkv, float softcap, int pack) {
  if (pack == 1 && hq != hkv && softcap == 0.f) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "not a packed case (pack_gqa=" << pack << " hq=" << hq << " hkv=" << hkv
                                       << " softcap=" << softcap << "): the unpacked kernel would run";
}

void check_packed_case(const Case& c) {
  ASSERT_TRUE(takes_packed_path(c.hq, c.hkv, c.softcap, c.pack)) << c.describe();
  check_case(c);
}

// ---------------------------------------------------------------------------
// The fixed-length cases.
// ---------------------------------------------------------------------------
struct PackMask {
  const char* name;
  bool causal;
  int wl, wr;
};
constexpr PackMask kPackMasks[] = {{"nomask", false, -1, -1},
                                   {"causal", true, -1, -1},
                                   {"local128x0", false, 128, 0},
                                   {"local37x5", false, 37, 5},
                                   {"left100", false, 100, -1}};
constexpr int kNumPackMasks = int(sizeof(kPackMasks) / sizeof(kPackMasks[0]));
// g = 4, MQA (g = 8), 5, 6, 8 and 16: packed tiles of whole and of split
// groups (128 and 192 rows are no multiples of 5, 6 or 12 x 16).
constexpr Heads kPackHeads[] = {{8, 2}, {8, 1}, {10, 2}, {12, 2}, {16, 2}, {32, 2}};
constexpr int kNumPackHeads = int(sizeof(kPackHeads) / sizeof(kPackHeads[0]));
// Decode-like (1, 2, 3 queries), a few tiles' worth of packed rows, tile
// edges and long problems; 1 or 7 keys under 1000 queries (rows with no
// visible key under causal / windows), and the reverse.
constexpr Seqlens kPackSeqlens[] = {
    {1, 1},      {1, 7},      {1, 128},    {1, 500},    {1, 2048},   {2, 1},      {2, 128},
    {2, 2048},   {3, 7},      {3, 500},    {3, 2048},   {16, 1},     {16, 128},   {16, 2048},
    {64, 7},     {64, 500},   {64, 2048},  {100, 7},    {100, 128},  {100, 2048}, {128, 128},
    {128, 500},  {200, 7},    {200, 500},  {200, 2048}, {1000, 1},   {1000, 128}, {1000, 2048}};
constexpr int kNumPackSeqlens = int(sizeof(kPackSeqlens) / sizeof(kPackSeqlens[0]));

// Every fixed-length case of one (dtype, head dims), numbered: each seqlen pair
// i with masks i and i + 2 (mod 5), which gives every (mask, head ratio) pair
// and both sq > sk and sq < sk under every mask. Batch 1-3 (1 where sq * hq is
// large), every fourth case padded. The name (without the pack_gqa setting)
// seeds the inputs, so the same case with another pack_gqa reads the same ones.
std::vector<Case> all_pack_cases(DType dt, HeadDims h, int pack) {
  std::vector<Case> out;
  for (int i = 0; i < kNumPackSeqlens; ++i)
    for (int j : {i % kNumPackMasks, (i + 2) % kNumPackMasks}) {
      const int k = int(out.size());
      const Seqlens sl = kPackSeqlens[i];
      const Heads heads = kPackHeads[(i + j) % kNumPackHeads];
      const PackMask& m = kPackMasks[j];
      Case c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv;
      c.sq = sl.sq, c.sk = sl.sk;
      c.hq = heads.hq, c.hkv = heads.hkv;
      c.batch = int64_t(sl.sq) * heads.hq > 8000 ? 1 : 1 + k % 3;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.layout = k % 4 == 1 ? Layout::kPadded : Layout::kContiguous;
      c.pack = pack;
      c.name = std::string("packgqa_") + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + m.name + "_sq" +
               std::to_string(sl.sq) + "_sk" + std::to_string(sl.sk) + "_" + heads_name(heads) + "_b" +
               std::to_string(c.batch) + (c.layout == Layout::kPadded ? "_padded" : "");
      c.seed = fnv1a(c.name);
      c.name += pack_name(pack);
      out.push_back(c);
    }
  return out;
}

// The cases whose number is `rem` mod `mod`.
std::vector<Case> every(const std::vector<Case>& all, int mod, int rem) {
  std::vector<Case> out;
  for (size_t k = 0; k < all.size(); ++k)
    if (int(k) % mod == rem) out.push_back(all[k]);
  return out;
}

// Forced packing: all 56 (quick: every third), or the reduced set of the
// second dtype, every eighth (every mask; quick: every 24th).
std::vector<Case> forced_cases(DType dt, HeadDims h, bool full) {
  const std::vector<Case> all = all_pack_cases(dt, h, 1);
  if (full) return quick_mode() ? every(all, 3, 0) : all;
  return quick_mode() ? every(all, 24, 0) : every(all, 8, 0);
}

// pack_gqa = 0 / -1: every eighth case (quick: every 24th), not those of the
// reduced forced set.
std::vector<Case> mode_cases(DType dt, HeadDims h, int pack) {
  const std::vector<Case> all = all_pack_cases(dt, h, pack);
  return quick_mode() ? every(all, 24, 2) : every(all, 8, 2);
}

// The dtype a head-dim pair runs in: the first of bf16, fp16 with the packed
// unit, else (with `unpacked_ok`) the first with the plain kernel.
bool pick_pack_dtype(HeadDims h, bool unpacked_ok, DType* dt) {
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    if (packgqa_built(t, h)) {
      *dt = t;
      return true;
    }
  if (!unpacked_ok) return false;
  for (DType t : {DType::kBFloat16, DType::kFloat16})
    if (flash3::forward_is_built(t, h.d, h.dv)) {
      *dt = t;
      return true;
    }
  return false;
}

// ===========================================================================
// Forced packing, every head dim: bf16 with every case, then fp16 (where its
// unit is built) with the reduced set.
// ===========================================================================
class PackGqaFwd : public ::testing::TestWithParam<HeadDims> {};

TEST_P(PackGqaFwd, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return packgqa_built(dt, h); },
                                [&](DType dt, bool full) { return forced_cases(dt, h, full); },
                                [](const Case& c) { check_packed_case(c); });
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure())
    GTEST_SKIP() << "not built: no forward packgqa unit " << head_dims_name(h)
                 << " (FLASH3_FEATURES / FLASH3_HDIMS / FLASH3_DTYPES)";
}

INSTANTIATE_TEST_SUITE_P(PackGqa, PackGqaFwd, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Packed and unpacked on the same inputs: each against the reference, the
// launch's decision for each (true / false), and the two results within the
// rule's bound of each other (2 * the larger baseline + eps; not required
// bitwise: the tiles hold other rows, so the accumulation differs in order).
// ===========================================================================
TEST(PackGqaGpu, PackedAndUnpackedAgree) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  struct S {
    int b, sq, sk;
    Heads heads;
    int mask;  // index into kPackMasks
    Layout layout;
  };
  const S shapes[] = {{2, 1, 2048, {32, 2}, 0, Layout::kContiguous},
                      {1, 100, 500, {10, 2}, 1, Layout::kPadded},
                      {3, 64, 128, {8, 1}, 3, Layout::kContiguous},
                      {1, 1000, 2048, {16, 2}, 4, Layout::kContiguous},
                      {2, 3, 7, {12, 2}, 2, Layout::kPadded}};
  int ran = 0;
  int64_t total_diff_o = 0, total_diff_lse = 0;
  for (const HeadDims& h : kAllHeadDims) {
    DType dt;
    if (!pick_pack_dtype(h, false, &dt)) continue;
    for (const S& s : shapes) {
      const PackMask& m = kPackMasks[s.mask];
      Case c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv;
      c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.heads.hq, c.hkv = s.heads.hkv;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.layout = s.layout;
      const std::string base = std::string("packed_vs_unpacked_") + tu::short_dtype(dt) + "_" + head_dims_name(h) +
                               "_" + m.name + "_sq" + std::to_string(s.sq) + "_sk" + std::to_string(s.sk) + "_" +
                               heads_name(s.heads);
      c.seed = fnv1a(base);
      Outcome packed, unpacked;
      c.pack = 1, c.name = base + pack_name(1);
      ASSERT_TRUE(takes_packed_path(c.hq, c.hkv, c.softcap, c.pack));
      check_case(c, &packed);
      if (HasFatalFailure()) return;
      c.pack = 0, c.name = base + pack_name(0);
      check_case(c, &unpacked);
      if (HasFatalFailure()) return;
      ++ran;
      auto compare = [&](const char* what, const std::vector<double>& x, const std::vector<double>& y, double bound,
                         int64_t* bitwise) {
        ASSERT_EQ(x.size(), y.size());
        double err = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          const bool same = x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]));
          *bitwise += !same;
          if (same) continue;
          const double e = std::fabs(x[i] - y[i]);
          err = std::max(err, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
        }
        EXPECT_LE(err, bound) << base << ": packed and unpacked " << what << " differ by " << err << " (bound "
                              << bound << ")";
      };
      compare("out", packed.o, unpacked.o, 2 * std::max(packed.o_base, unpacked.o_base) + kEpsO, &total_diff_o);
      compare("lse", packed.lse, unpacked.lse, 2 * std::max(packed.lse_base, unpacked.lse_base) + kEpsLse,
              &total_diff_lse);
    }
  }
  RecordProperty("bitwise_diff_o", std::to_string(total_diff_o));
  RecordProperty("bitwise_diff_lse", std::to_string(total_diff_lse));
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward packgqa unit in this build";
}

// ===========================================================================
// pack_gqa = 1 where no packed kernel runs (MHA, softcap, a head dim or dtype
// without the packed unit): the unpacked kernel, the same results, no error.
// ===========================================================================
TEST(PackGqaGpu, ForcedWithoutPackedUnitRunsUnpacked) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  int ran = 0;
  for (const HeadDims& h : kAllHeadDims)
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      if (!flash3::forward_is_built(dt, h.d, h.dv)) continue;
      std::vector<Case> cases;
      auto add = [&](const char* tag, Heads heads, float softcap, bool causal) {
        Case c;
        c.dtype = dt, c.d = h.d, c.dv = h.dv;
        c.batch = 2, c.sq = 77, c.sk = 300, c.hq = heads.hq, c.hkv = heads.hkv;
        c.causal = causal;
        c.softcap = softcap;
        c.pack = 1;
        c.name = std::string("forced_fallback_") + tag + "_" + tu::short_dtype(dt) + "_" + head_dims_name(h);
        c.seed = fnv1a(c.name);
        cases.push_back(c);
      };
      add("mha4x4", {4, 4}, 0.f, true);
      if (softcap_built(dt, h, false)) add("softcap5_gqa8x2", {8, 2}, 5.f, false);
      if (!packgqa_built(dt, h)) add("unit_not_built_gqa8x2", {8, 2}, 0.f, true);
      for (const Case& c : cases) {
        check_case(c);
        if (HasFatalFailure()) return;
        ++ran;
      }
    }
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward kernel in this build";
}

// Values other than -1, 0 and 1 are rejected, naming the option.
TEST(PackGqaGpu, OtherValuesAreRejected) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  DType dt = DType::kBFloat16;
  HeadDims h{128, 128};
  for (const HeadDims& x : kAllHeadDims)
    if (pick_pack_dtype(x, true, &dt)) {
      h = x;
      break;
    }
  Case c;
  c.dtype = dt, c.d = h.d, c.dv = h.dv, c.batch = 1, c.sq = 64, c.sk = 64, c.hq = 8, c.hkv = 2;
  const Plan p = make_plan(c);
  DeviceState& d = dev();
  ASSERT_TRUE(reserve_all({{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2},
                       {&d.lse, size_t(p.lse_elems) * 4}}));
  for (int bad : {2, -2, 100, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    flash3::ForwardArgs a = make_args(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>());
    a.opts.pack_gqa = bad;
    const flash3::Status st = flash3::forward(a, d.stream);
    EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument) << "pack_gqa " << bad << ": " << st.message;
    EXPECT_NE(st.message.find("opts.pack_gqa"), std::string::npos) << "pack_gqa " << bad << ": " << st.message;
  }
  EXPECT_EQ(cudaStreamSynchronize(d.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ===========================================================================
// Variable length.
// ===========================================================================
struct VCase {
  DType dtype = DType::kBFloat16;
  int d = 128, dv = 128;
  int hq = 8, hkv = 2;
  bool causal = false;
  int wl = -1, wr = -1;
  float scale = kNaN;
  float softcap = 0.f;
  int pack = 1;
  std::vector<int> len_q, len_k;    // rows of each sequence (cu_seqlens differences)
  std::vector<int> used_q, used_k;  // seqused_q / seqused_k; empty: not passed
  Layout layout = Layout::kContiguous;
  uint64_t seed = 1;
  std::string name;

  int n() const { return int(len_q.size()); }
  // Real lengths (seqused clamped to [0, len], as the API specifies).
  int eff_q(int b) const { return used_q.empty() ? len_q[b] : std::clamp(used_q[b], 0, len_q[b]); }
  int eff_k(int b) const { return used_k.empty() ? len_k[b] : std::clamp(used_k[b], 0, len_k[b]); }
  static int64_t sum(const std::vector<int>& x) {
    int64_t t = 0;
    for (int v : x) t += v;
    return t;
  }
  static int longest(const std::vector<int>& x) { return std::max(1, *std::max_element(x.begin(), x.end())); }
  int64_t total_q() const { return sum(len_q); }
  int64_t total_k() const { return sum(len_k); }

  std::string describe() const {
    std::ostringstream os;
    os << name << " [" << tu::short_dtype(dtype) << " d=" << d << " dv=" << dv << " hq=" << hq << " hkv=" << hkv
       << " causal=" << causal << " window=(" << wl << "," << wr << ") pack_gqa=" << pack
       << " layout=" << layout_name(layout) << " seed=" << seed << "; (len_q[/used_q], len_k[/used_k]):";
    for (int b = 0; b < n(); ++b) {
      os << " (" << len_q[b];
      if (!used_q.empty()) os << "/" << used_q[b];
      os << "," << len_k[b];
      if (!used_k.empty()) os << "/" << used_k[b];
      os << ")";
    }
    os << "]";
    return os.str();
  }
};

// q / k / v / out as (1, total, h, d) views; lse (hq, total_q) with kGapRows
// of poison after each head's rows; out followed by kGapRows rows of poison;
// cu_seqlens / seqused in one int32 buffer (each array 16-byte aligned).
struct VPlan {
  View q, k, v, o;
  int64_t in_elems = 0, out_elems = 0;
  int64_t lse_stride = 0, lse_elems = 0;
  std::vector<int> cu_q, cu_k;
  int64_t m_cu_q = 0, m_cu_k = 0, m_used_q = 0, m_used_k = 0;
  std::vector<int> meta;
};

VPlan make_vplan(const VCase& c) {
  VPlan p;
  const int64_t tq = c.total_q(), tk = c.total_k();
  const QKV in = make_qkv(c.layout, 1, tq, tk, c.hq, c.hkv, c.d, c.dv);
  p.q = in.q, p.k = in.k, p.v = in.v;
  p.in_elems = in.elems;
  p.o = c.layout == Layout::kPadded ? padded_view(0, 1, tq, c.hq, c.dv) : dense_view(0, 1, tq, c.hq, c.dv);
  p.out_elems = p.o.span() + std::max<int64_t>(kGuard, int64_t(kGapRows) * p.o.sr);
  p.lse_stride = std::max<int64_t>(tq, 1) + kGapRows;
  p.lse_elems = int64_t(c.hq) * p.lse_stride + kGuard;
  p.cu_q.assign(size_t(c.n()) + 1, 0);
  p.cu_k.assign(size_t(c.n()) + 1, 0);
  for (int b = 0; b < c.n(); ++b) {
    p.cu_q[b + 1] = p.cu_q[b] + c.len_q[b];
    p.cu_k[b + 1] = p.cu_k[b] + c.len_k[b];
  }
  const int64_t n1 = round_up(c.n() + 1, 4), n0 = round_up(std::max(c.n(), 1), 4);
  p.m_cu_q = 0, p.m_cu_k = n1, p.m_used_q = 2 * n1, p.m_used_k = 2 * n1 + n0;
  p.meta.assign(size_t(2 * n1 + 2 * n0), 0);
  std::copy(p.cu_q.begin(), p.cu_q.end(), p.meta.begin() + p.m_cu_q);
  std::copy(p.cu_k.begin(), p.cu_k.end(), p.meta.begin() + p.m_cu_k);
  std::copy(c.used_q.begin(), c.used_q.end(), p.meta.begin() + p.m_used_q);
  std::copy(c.used_k.begin(), c.used_k.end(), p.meta.begin() + p.m_used_k);
  return p;
}

flash3::ForwardArgs make_vargs(const VCase& c, const VPlan& p, void* in, void* out, float* lse, void* meta) {
  auto view3 = [&](void* base, const View& v) {
    return TensorView::make3d(elem16(base, v.offset), c.dtype, v.s, v.h, v.d, v.sr, v.sh, 1);
  };
  flash3::ForwardArgs a;
  a.q = view3(in, p.q);
  a.k = view3(in, p.k);
  a.v = view3(in, p.v);
  a.out = view3(out, p.o);
  a.lse.data = lse;
  a.lse.dtype = DType::kFloat32;
  a.lse.ndim = 2;
  a.lse.shape[0] = c.hq;
  a.lse.shape[1] = c.total_q();
  a.lse.stride[0] = p.lse_stride;
  a.lse.stride[1] = 1;
  const int* m = static_cast<const int*>(meta);
  flash3::AttentionOptions& o = a.opts;
  o.causal = c.causal;
  o.window_left = c.wl;
  o.window_right = c.wr;
  o.softmax_scale = c.scale;
  o.softcap = c.softcap;
  o.pack_gqa = c.pack;
  o.cu_seqlens_q = m + p.m_cu_q;
  o.cu_seqlens_k = m + p.m_cu_k;
  o.seqused_q = c.used_q.empty() ? nullptr : m + p.m_used_q;
  o.seqused_k = c.used_k.empty() ? nullptr : m + p.m_used_k;
  o.max_seqlen_q = VCase::longest(c.len_q);
  o.max_seqlen_k = VCase::longest(c.len_k);
  o.num_sequences = c.n();
  return a;
}

struct SeqRef {
  std::vector<double> o, lse, low_o, low_lse;  // o: (sq, hq, dv); lse: (hq, sq)
};

// Sequence s as its own fixed-length problem (batch 1, eff_q x eff_k, its
// bottom-right mask) on the fp32 GPU reference, reading its used rows in
// place (offsets computed here, not by the kernels).
::testing::AssertionResult sequence_reference(const VCase& c, const VPlan& p, int s, SeqRef* r) {
  const int sq = c.eff_q(s), sk = c.eff_k(s);
  const size_t n_o = size_t(sq) * c.hq * c.dv, n_lse = size_t(sq) * c.hq;
  if (sk == 0) {  // no key: out = 0, lse = -inf
    r->o.assign(n_o, 0.0);
    r->low_o = r->o;
    r->lse.assign(n_lse, -std::numeric_limits<double>::infinity());
    r->low_lse = r->lse;
    return ::testing::AssertionSuccess();
  }
  DeviceState& d = dev();
  const ::testing::AssertionResult rs =
      reserve_all({{&d.ref_o, n_o * 4}, {&d.low_o, n_o * 4}, {&d.ref_lse, n_lse * 4}, {&d.low_lse, n_lse * 4}});
  if (!rs) return rs;
  auto rows = [&](const View& v, int64_t row0, int64_t n) {
    flash3::gpuref::Strided16 t;
    t.data = d.in.as<const uint16_t>() + v.at(0, row0, 0, 0);
    t.batch_stride = std::max<int64_t>(n, 1) * v.sr;
    t.row_stride = v.sr;
    t.head_stride = v.sh;
    return t;
  };
  flash3::gpuref::Args ra;
  ra.dtype = c.dtype;
  ra.batch = 1, ra.seqlen_q = sq, ra.seqlen_k = sk, ra.heads_q = c.hq, ra.heads_kv = c.hkv;
  ra.head_dim = c.d, ra.head_dim_v = c.dv;
  ra.q = rows(p.q, p.cu_q[s], sq);
  ra.k = rows(p.k, p.cu_k[s], sk);
  ra.v = rows(p.v, p.cu_k[s], sk);
  ra.softmax_scale = c.scale;
  ra.softcap = c.softcap;
  ra.causal = c.causal, ra.window_left = c.wl, ra.window_right = c.wr;
  flash3::gpuref::Args la = ra;
  ra.out = d.ref_o.as<float>(), ra.lse = d.ref_lse.as<float>();
  la.out = d.low_o.as<float>(), la.lse = d.low_lse.as<float>();
  cudaError_t e = flash3::gpuref::forward(ra, flash3::gpuref::Mode::kFloat32, d.stream);
  if (e == cudaSuccess) e = flash3::gpuref::forward(la, flash3::gpuref::Mode::kLowPrecision, d.stream);
  std::vector<float> fo(n_o), fl(n_lse), lo(n_o), ll(n_lse);
  if (e == cudaSuccess) e = cudaMemcpyAsync(fo.data(), d.ref_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(lo.data(), d.low_o.ptr, n_o * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(fl.data(), d.ref_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(ll.data(), d.low_lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost, d.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(d.stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "GPU reference: " << cudaGetErrorString(e);
  r->o = to_double(fo), r->low_o = to_double(lo), r->lse = to_double(fl), r->low_lse = to_double(ll);
  return ::testing::AssertionSuccess();
}

// Full check of one varlen case: upload, poison, run, then the poison outside
// the used rows and each sequence against its own reference.
void check_vcase(const VCase& c) {
  SCOPED_TRACE(c.describe());
  const VPlan p = make_vplan(c);
  DeviceState& d = dev();
  ASSERT_TRUE(reserve_all({{&d.in, size_t(p.in_elems) * 2}, {&d.out, size_t(p.out_elems) * 2},
                       {&d.lse, size_t(p.lse_elems) * 4}, {&d.meta, p.meta.size() * 4}}));
  std::vector<uint16_t> host_in(size_t(p.in_elems));
  tu::fill_normal(host_in.data(), host_in.size(), c.dtype, c.seed);
  FLASH3_CUDA_OK(cudaMemcpyAsync(d.in.ptr, host_in.data(), host_in.size() * 2, cudaMemcpyHostToDevice, d.stream));
  FLASH3_CUDA_OK(cudaMemcpyAsync(d.meta.ptr, p.meta.data(), p.meta.size() * 4, cudaMemcpyHostToDevice, d.stream));
  FLASH3_CUDA_OK(cudaMemsetAsync(d.out.ptr, 0xff, size_t(p.out_elems) * 2, d.stream));
  FLASH3_CUDA_OK(cudaMemsetAsync(d.lse.ptr, 0xff, size_t(p.lse_elems) * 4, d.stream));

  const flash3::ForwardArgs args = make_vargs(c, p, d.in.ptr, d.out.ptr, d.lse.as<float>(), d.meta.ptr);
  expect_pack_decision(args, expected_pack(c.dtype, {c.d, c.dv}, c.hq, c.hkv, c.softcap, c.pack, true),
                       c.describe());
  const flash3::Status st = flash3::forward(args, d.stream);
  ASSERT_TRUE(st.ok()) << c.describe() << ": flash3::forward failed: " << st.message;
  FLASH3_CUDA_OK(cudaStreamSynchronize(d.stream));
  FLASH3_CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> h_out(size_t(p.out_elems));
  std::vector<uint32_t> h_lse(size_t(p.lse_elems));
  FLASH3_CUDA_OK(cudaMemcpy(h_out.data(), d.out.ptr, h_out.size() * 2, cudaMemcpyDeviceToHost));
  FLASH3_CUDA_OK(cudaMemcpy(h_lse.data(), d.lse.ptr, h_lse.size() * 4, cudaMemcpyDeviceToHost));

  // Poison outside the used rows: rows beyond seqused, padding, the rows after
  // the tensor (out) and after each head's rows (lse), the guards.
  const int64_t tq = c.total_q();
  std::vector<uint8_t> used_out(h_out.size(), 0), used_lse(h_lse.size(), 0);
  for (int s = 0; s < c.n(); ++s)
    for (int64_t i = 0; i < c.eff_q(s); ++i)
      for (int h = 0; h < c.hq; ++h) {
        std::memset(&used_out[size_t(p.o.at(0, p.cu_q[s] + i, h, 0))], 1, size_t(c.dv));
        used_lse[size_t(h * p.lse_stride + p.cu_q[s] + i)] = 1;
      }
  int64_t stray_o = 0, stray_lse = 0, first_stray_row = -1;
  for (size_t i = 0; i < h_out.size(); ++i)
    if (!used_out[i] && h_out[i] != kPoison16) {
      if (stray_o++ == 0 && int64_t(i) >= p.o.offset) first_stray_row = (int64_t(i) - p.o.offset) / p.o.sr;
    }
  for (size_t i = 0; i < h_lse.size(); ++i) stray_lse += !used_lse[i] && h_lse[i] != kPoison32;
  EXPECT_EQ(stray_o, 0) << c.describe() << ": flash3 wrote " << stray_o
                        << " out elements outside the used rows (first in row " << first_stray_row << " of " << tq
                        << "; rows beyond seqused_q, padding or the rows after the tensor)";
  EXPECT_EQ(stray_lse, 0) << c.describe() << ": flash3 wrote " << stray_lse
                          << " lse values outside the used rows (beyond seqused_q or past total_q)";

  for (int s = 0; s < c.n(); ++s) {
    const int sq = c.eff_q(s), sk = c.eff_k(s);
    if (sq == 0) continue;
    SeqRef ref;
    ASSERT_TRUE(sequence_reference(c, p, s, &ref)) << "sequence " << s;
    std::vector<double> o(size_t(sq) * c.hq * c.dv), l(size_t(sq) * c.hq);
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < c.hq; ++h) {
        const uint16_t* src = h_out.data() + p.o.at(0, p.cu_q[s] + i, h, 0);
        double* dst = o.data() + (size_t(i) * c.hq + h) * c.dv;
        for (int x = 0; x < c.dv; ++x) dst[x] = tu::half_bits_to_float(c.dtype, src[x]);
        l[size_t(h) * sq + i] = tu::bits_f32(h_lse[size_t(h * p.lse_stride + p.cu_q[s] + i)]);
      }
    std::ostringstream seq;
    seq << "sequence " << s << " (rows " << p.cu_q[s] << "+" << sq << ", keys " << p.cu_k[s] << "+" << sk << ")";
    const Verdict vo = judge(
        "O", o, ref.o, ref.low_o, kEpsO,
        [&](size_t i) {
          std::ostringstream os;
          os << "(seq=" << s << ", row=" << int64_t(i) / (int64_t(c.dv) * c.hq) << ", h=" << (int64_t(i) / c.dv) % c.hq
             << ", c=" << int64_t(i) % c.dv << ")";
          return os.str();
        },
        tol_factor(c));
    EXPECT_TRUE(vo.ok) << c.describe() << "\n  " << seq.str() << "\n  " << vo.text;
    const Verdict vl = judge(
        "LSE", l, ref.lse, ref.low_lse, kEpsLse,
        [&](size_t i) {
          std::ostringstream os;
          os << "(seq=" << s << ", h=" << int64_t(i) / sq << ", row=" << int64_t(i) % sq << ")";
          return os.str();
        },
        tol_factor(c));
    EXPECT_TRUE(vl.ok) << c.describe() << "\n  " << seq.str() << "\n  " << vl.text;
  }
}

// ---------------------------------------------------------------------------
// The varlen cases.
// ---------------------------------------------------------------------------
struct Rng {
  uint64_t s;
  uint64_t next() { return s = tu::splitmix64(s); }
  int uniform(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]
};

constexpr int kVarlenMaxLen = 600;

// Uniform in [0, 600], with 0 and 1 a tenth of the time each.
int draw_len(Rng& g) {
  const int r = int(g.next() % 10);
  if (r == 0) return 0;
  if (r == 1) return 1;
  return g.uniform(0, kVarlenMaxLen);
}

// seqused values: half, all, none, more than allocated (clamped to the
// length), negative (clamped to 0), random.
std::vector<int> draw_used(const std::vector<int>& len, int shift, uint64_t seed) {
  Rng g{seed};
  std::vector<int> u(len.size());
  for (size_t b = 0; b < len.size(); ++b) {
    switch ((b + size_t(shift)) % 6) {
      case 0: u[b] = len[b] / 2; break;
      case 1: u[b] = len[b]; break;
      case 2: u[b] = 0; break;
      case 3: u[b] = len[b] + 7; break;
      case 4: u[b] = -3; break;
      default: u[b] = g.uniform(0, std::max(len[b], 0)); break;
    }
  }
  return u;
}

enum class VMask { kNone, kCausal, kLocal, kCausalLocal, kLeftOnly };

struct LenPair {
  int q, k;
};

struct VSpec {
  const char* tag;
  int n;  // sequences
  Heads heads;
  VMask mask;
  bool seqused_q, seqused_k;
  Layout layout;
  std::vector<LenPair> forced;  // placed first, then random lengths, then shuffled
};

// The varlen cases of one (dtype, head dims): all eight (quick: every other),
// or the reduced set of the second dtype (every third).
std::vector<VCase> varlen_cases(DType dt, HeadDims h, bool full) {
  const VSpec specs[] = {
      {"nomask_gqa8x2_b9", 9, {8, 2}, VMask::kNone, false, false, Layout::kContiguous,
       {{0, 37}, {1, 1}, {1, 600}, {600, 1}, {129, 0}}},
      {"causal_gqa16x2_b7", 7, {16, 2}, VMask::kCausal, false, false, Layout::kPadded,
       {{1, 0}, {200, 100}, {100, 200}, {0, 0}}},
      {"local_seqused_gqa8x2_b5", 5, {8, 2}, VMask::kLocal, true, true, Layout::kContiguous, {{1, 7}, {300, 300}}},
      {"causal_local_seqused_q_gqa16x2_b6", 6, {16, 2}, VMask::kCausalLocal, true, false, Layout::kPadded,
       {{0, 5}, {64, 64}}},
      {"nomask_gqa16x2_b1", 1, {16, 2}, VMask::kNone, false, false, Layout::kContiguous, {{511, 577}}},
      {"left_seqused_k_gqa8x2_b4", 4, {8, 2}, VMask::kLeftOnly, false, true, Layout::kContiguous, {{1, 600}}},
      {"causal_seqused_gqa8x2_b3", 3, {8, 2}, VMask::kCausal, true, true, Layout::kPadded, {{17, 3}}},
      {"nomask_seqused_q_gqa16x2_b2", 2, {16, 2}, VMask::kNone, true, false, Layout::kContiguous,
       {{5, 0}, {450, 333}}},
  };
  std::vector<VCase> out;
  const int n_specs = int(sizeof(specs) / sizeof(specs[0]));
  for (int i = 0; i < n_specs; ++i) {
    if (full ? (quick_mode() && i % 2 != 0) : i % 3 != 0) continue;
    const VSpec& sp = specs[i];
    VCase c;
    c.dtype = dt, c.d = h.d, c.dv = h.dv, c.hq = sp.heads.hq, c.hkv = sp.heads.hkv;
    c.layout = sp.layout;
    c.pack = 1;
    c.name = std::string("packgqa_varlen_") + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + sp.tag;
    c.seed = fnv1a(c.name);
    Rng g{c.seed ^ 0x1e11};
    std::vector<LenPair> lens(sp.forced.begin(), sp.forced.begin() + std::min<size_t>(sp.forced.size(), size_t(sp.n)));
    while (int(lens.size()) < sp.n) {
      const int q = draw_len(g), k = draw_len(g);
      lens.push_back({q, k});
    }
    for (int b = sp.n - 1; b > 0; --b) std::swap(lens[size_t(b)], lens[g.next() % uint64_t(b + 1)]);
    for (const LenPair& lp : lens) c.len_q.push_back(lp.q), c.len_k.push_back(lp.k);
    if (sp.seqused_q) c.used_q = draw_used(c.len_q, 0, c.seed ^ 0x05ed);
    if (sp.seqused_k) c.used_k = draw_used(c.len_k, 3, c.seed ^ 0x5eed);
    const int max_k = VCase::longest(c.len_k);
    switch (sp.mask) {
      case VMask::kNone: break;
      case VMask::kCausal: c.causal = true; break;
      case VMask::kLocal: c.wl = g.uniform(0, max_k - 1), c.wr = g.uniform(0, max_k - 1); break;
      case VMask::kCausalLocal: c.causal = true, c.wl = g.uniform(0, max_k - 1); break;
      case VMask::kLeftOnly: c.wl = g.uniform(0, max_k - 1); break;
    }
    out.push_back(c);
  }
  return out;
}

void check_packed_vcase(const VCase& c) {
  ASSERT_TRUE(takes_packed_path(c.hq, c.hkv, c.softcap, c.pack)) << c.describe();
  check_vcase(c);
}

class PackGqaVarlen : public ::testing::TestWithParam<HeadDims> {};

TEST_P(PackGqaVarlen, MatchesReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  const int ran = run_per_dtype([&](DType dt) { return packgqa_built(dt, h); },
                                [&](DType dt, bool full) { return varlen_cases(dt, h, full); },
                                [](const VCase& c) { check_packed_vcase(c); });
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure())
    GTEST_SKIP() << "not built: no forward packgqa unit " << head_dims_name(h)
                 << " (FLASH3_FEATURES / FLASH3_HDIMS / FLASH3_DTYPES)";
}

INSTANTIATE_TEST_SUITE_P(PackGqa, PackGqaVarlen, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// pack_gqa = 0 (never) and -1 (the heuristic) on inputs of the forced suites
// (fixed length and varlen, the same seeds): the same results under the same
// rule. Runs wherever the plain kernel is built (packing or not is then the
// launch's choice; varlen with -1 must pack where the unit is built).
// ===========================================================================
class PackGqaFwdModes : public ::testing::TestWithParam<HeadDims> {};

TEST_P(PackGqaFwdModes, MatchReference) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  const HeadDims h = GetParam();
  DType dt;
  if (!pick_pack_dtype(h, true, &dt)) GTEST_SKIP() << "not built: no forward kernel " << head_dims_name(h);
  int ran = 0;
  for (int pack : {0, -1}) {
    for (const Case& c : mode_cases(dt, h, pack)) {
      check_case(c);
      if (HasFatalFailure()) return;
      ++ran;
    }
    for (VCase c : varlen_cases(dt, h, false)) {
      c.pack = pack;
      c.name += pack_name(pack);
      check_vcase(c);
      if (HasFatalFailure()) return;
      ++ran;
    }
  }
  RecordProperty("cases", std::to_string(ran));
}

INSTANTIATE_TEST_SUITE_P(PackGqa, PackGqaFwdModes, ::testing::ValuesIn(kAllHeadDims), head_dims_param_name);

// ===========================================================================
// Stores outside the problem. A packed tile's rows past sq * g stand for query
// rows >= sq (past the end of a batch element, or of a sequence), and its
// epilogue must drop them: here each batch element's out and lse rows are
// followed by kGapRows rows of poison (more than a tile's worth of query rows),
// with sq * g not a multiple of any tile height; for varlen, rows beyond
// seqused_q and the kGapRows rows after the tensor must keep their poison.
// ===========================================================================
TEST(PackGqaGpu, NoStoresOutsideTheProblem) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  struct S {
    int b, sq, sk;
    Heads heads;
    int mask;  // index into kPackMasks
  };
  // Packed rows: 15, 272 (17 x 16), 600, 32 and 1600 (200 x 8).
  const S shapes[] = {{2, 3, 500, {10, 2}, 0},
                      {3, 17, 128, {32, 2}, 1},
                      {1, 100, 7, {12, 2}, 3},
                      {2, 1, 2048, {32, 2}, 2},
                      {1, 200, 1000, {8, 1}, 4}};
  int ran = 0;
  for (const HeadDims& h : kAllHeadDims) {
    DType dt;
    if (!pick_pack_dtype(h, false, &dt)) continue;
    for (const S& s : shapes) {
      const PackMask& m = kPackMasks[s.mask];
      Case c;
      c.dtype = dt, c.d = h.d, c.dv = h.dv;
      c.batch = s.b, c.sq = s.sq, c.sk = s.sk, c.hq = s.heads.hq, c.hkv = s.heads.hkv;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr;
      c.layout = Layout::kPadded;
      c.gap_rows = kGapRows;
      c.name = std::string("packgqa_stores_") + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_" + m.name + "_sq" +
               std::to_string(s.sq) + "_sk" + std::to_string(s.sk) + "_" + heads_name(s.heads);
      c.seed = fnv1a(c.name);
      check_packed_case(c);
      if (HasFatalFailure()) return;
      ++ran;
    }
    // Varlen: every sequence shortened by seqused_q, the last one ending the
    // tensor mid-tile.
    VCase v;
    v.dtype = dt, v.d = h.d, v.dv = h.dv, v.hq = 16, v.hkv = 2;
    v.len_q = {17, 3, 100, 1, 41};
    v.len_k = {300, 64, 129, 7, 250};
    v.used_q = {10, 3, 51, 0, 33};
    v.causal = true;
    v.name = std::string("packgqa_stores_varlen_") + tu::short_dtype(dt) + "_" + head_dims_name(h);
    v.seed = fnv1a(v.name);
    check_packed_vcase(v);
    if (HasFatalFailure()) return;
    ++ran;
  }
  RecordProperty("cases", std::to_string(ran));
  if (ran == 0 && !HasFatalFailure()) GTEST_SKIP() << "not built: no forward packgqa unit in this build";
}

// ===========================================================================
// The variant list and the library agree on which packed units are built.
// ===========================================================================
TEST(PackGqaGpu, VariantsFileMatchesPackKernelBuilt) {
  FLASH3_SKIP_WITHOUT_HOPPER();
  bool found = false;
  tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), &found);
  ASSERT_TRUE(found) << "cannot read " << tu::variants_path(FLASH3_VARIANTS_FILE) << " (set FLASH3_VARIANTS_FILE)";
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (const HeadDims& h : kAllHeadDims)
      EXPECT_EQ(variant_listed("fwd", dt, h, "packgqa"), flash3::fwd_pack_kernel_built(dt, h.d, h.dv))
          << tu::short_dtype(dt) << " " << head_dims_name(h)
          << ": variants.txt and fwd_pack_kernel_built() disagree on the packgqa unit";
}

}  // namespace
