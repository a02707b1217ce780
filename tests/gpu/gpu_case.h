// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Shared vocabulary of the GPU test matrices (test_fwd_gpu.cpp, test_bwd_gpu.cpp):
// the mask / layout / shape parameters and their printing, strided (b, s, h, d)
// memory views with dense, padded and packed-QKV layouts, host extraction, the
// tolerance-rule verdict with a readable report, and the per-file device state.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "flash3/flash3.h"
#include "gpu_helpers.cuh"
#include "gpu_reference.cuh"
#include "gpu_test_util.h"
#include "reference/reference.h"

namespace flash3::gputest {

namespace tu = flash3::testutil;

constexpr uint16_t kPoison16 = 0xffff;       // NaN in bf16 and fp16
constexpr uint32_t kPoison32 = 0xffffffffu;  // NaN in fp32
constexpr int64_t kGuard = 256;              // poisoned elements after every output tensor

enum class Mask { kNone, kCausal, kWindow128_0, kWindow256_256 };
enum class Layout { kContiguous, kPackedQKV, kPadded };

struct HeadDims {
  int d, dv;
};
// Every (head_dim, head_dim_v) pair the library has kernels for (tools/manifest.py,
// through the generated head_dims.inc).
inline constexpr HeadDims kAllHeadDims[] = {
#define FLASH3_HEAD_DIM(D, DV) {D, DV},
#include "head_dims.inc"
#undef FLASH3_HEAD_DIM
};
struct Seqlens {
  int sq, sk;
};
struct Heads {
  int hq, hkv;
};

inline const char* mask_name(Mask m) {
  switch (m) {
    case Mask::kNone: return "nomask";
    case Mask::kCausal: return "causal";
    case Mask::kWindow128_0: return "window128x0";
    case Mask::kWindow256_256: return "window256x256";
  }
  return "?";
}
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kPackedQKV: return "packed_qkv";
    case Layout::kPadded: return "padded";
  }
  return "?";
}
inline std::string heads_name(Heads h) {
  const char* kind = h.hq == h.hkv ? "mha" : (h.hkv == 1 ? "mqa" : "gqa");
  return std::string(kind) + std::to_string(h.hq) + "x" + std::to_string(h.hkv);
}

// Readable parameter values in gtest output (found by argument-dependent lookup).
inline void PrintTo(Mask m, std::ostream* os) { *os << mask_name(m); }
inline void PrintTo(const HeadDims& h, std::ostream* os) { *os << "d=" << h.d << " dv=" << h.dv; }
inline void PrintTo(const Seqlens& s, std::ostream* os) { *os << "sq=" << s.sq << " sk=" << s.sk; }
inline void PrintTo(const Heads& h, std::ostream* os) { *os << heads_name(h); }

// Stable per-case seed from the case name.
inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// What a fixed-length case of the forward and backward suites holds (FwdCase
// in fwd_case.h, test_bwd_gpu.cpp's Case); each adds its own fields.
struct FixedCase {
  DType dtype = DType::kBFloat16;
  int d = 128, dv = 128;
  int sq = 128, sk = 128;
  int hq = 2, hkv = 2;
  int batch = 1;
  bool causal = false;
  int wl = -1, wr = -1;
  float scale = flash3::gpuref::kDefaultScale;  // softmax_scale; NaN: 1/sqrt(d)
  float softcap = 0.f;                          // opts.softcap; 0: off
  Layout layout = Layout::kContiguous;          // q, k, v (and the geometry of out)
  uint64_t seed = 1;
  std::string name;

  // "name [dtype d dv b sq sk hq hkv causal window scale softcap": the start of
  // a description, to which the derived case appends its fields and "]".
  void describe_problem(std::ostream& os) const {
    os << name << " [" << tu::short_dtype(dtype) << " d=" << d << " dv=" << dv << " b=" << batch << " sq=" << sq
       << " sk=" << sk << " hq=" << hq << " hkv=" << hkv << " causal=" << causal << " window=(" << wl << "," << wr
       << ") scale=" << scale;
    if (softcap > 0.f) os << " softcap=" << softcap;
  }
};

// The mask and score fields of a call's options from a case (any struct with
// causal, wl, wr, scale and softcap). Opts: flash3::AttentionOptions, or a
// reference's gpuref::Args / BwdArgs / ref::Options (the same field names).
template <class Case, class Opts>
void set_mask_and_scale(const Case& c, Opts* o) {
  o->causal = c.causal;
  o->window_left = c.wl;
  o->window_right = c.wr;
  o->softmax_scale = c.scale;
  o->softcap = c.softcap;
}

// Case: any struct with causal, wl, wr.
template <class Case>
void apply_mask(Case* c, Mask m) {
  c->causal = m == Mask::kCausal;
  c->wl = c->wr = -1;
  if (m == Mask::kWindow128_0) c->wl = 128, c->wr = 0;
  if (m == Mask::kWindow256_256) c->wl = 256, c->wr = 256;
}

// ---------------------------------------------------------------------------
// The issue matrix, shared by the forward and backward suites: 2 dtypes x 6
// head-dim pairs x 4 masks x 7 seqlen pairs x 3 head configs x 2 batches = 2016.
// ---------------------------------------------------------------------------
using MatrixParam = std::tuple<DType, HeadDims, Mask, Seqlens, Heads, int>;

inline auto issue_matrix() {
  return ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                            ::testing::ValuesIn(kAllHeadDims),
                            ::testing::Values(Mask::kNone, Mask::kCausal, Mask::kWindow128_0, Mask::kWindow256_256),
                            ::testing::Values(Seqlens{1, 1}, Seqlens{17, 17}, Seqlens{128, 128}, Seqlens{1000, 1000},
                                              Seqlens{4096, 4096}, Seqlens{113, 1023}, Seqlens{1023, 113}),
                            ::testing::Values(Heads{2, 2}, Heads{8, 2}, Heads{4, 1}), ::testing::Values(1, 3));
}

// Fills the matrix fields of a Case (any struct with the fields used here).
// Strides are exercised: q/k/v as slices of a packed (b, s, 3, h, d) buffer
// where that layout exists (MHA, sq == sk, d == dv); padded strides for the
// other batch-3 cases. The name (prefix + parameters) seeds the inputs.
template <class Case>
void fill_matrix_case(Case* c, const MatrixParam& mp, const char* prefix) {
  const auto& [dtype, hd, mask, sl, heads, batch] = mp;
  c->dtype = dtype;
  c->d = hd.d, c->dv = hd.dv;
  apply_mask(c, mask);
  c->sq = sl.sq, c->sk = sl.sk;
  c->hq = heads.hq, c->hkv = heads.hkv;
  c->batch = batch;
  if (c->hq == c->hkv && c->sq == c->sk && c->d == c->dv) c->layout = Layout::kPackedQKV;
  else if (c->batch == 3) c->layout = Layout::kPadded;
  else c->layout = Layout::kContiguous;
  std::ostringstream os;
  os << prefix << tu::short_dtype(dtype) << "_d" << hd.d << "x" << hd.dv << "_" << mask_name(mask) << "_sq" << sl.sq
     << "_sk" << sl.sk << "_" << heads_name(heads) << "_b" << batch;
  c->name = os.str();
  c->seed = fnv1a(c->name);
}

// ---------------------------------------------------------------------------
// Windows beyond the sequence and the causal / window interplay (FlashAttention's
// rules): a negative side is unbounded; window_left >= sk - 1 and window_right >=
// sq - 1 never cut a key; causal forces window_right = 0 and keeps window_left.
// Shared by the forward and backward suites; the references evaluate each case
// from the definition (int64 per element).
// ---------------------------------------------------------------------------
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr int kIntMin = std::numeric_limits<int>::min();

struct WindowSpec {
  const char* name;
  int sq, sk;
  bool causal;
  int wl, wr;
};

inline std::vector<WindowSpec> large_window_specs() {
  return {
      {"right_intmax", 1024, 1024, false, -1, kIntMax},
      {"left_intmax", 1024, 1024, false, kIntMax, -1},
      {"left_intmax_right0_sq2048_sk512", 2048, 512, false, kIntMax, 0},
      {"left_intmax_right0_sq512_sk2048", 512, 2048, false, kIntMax, 0},
      {"both_intmax_sq1000_sk3000", 1000, 3000, false, kIntMax, kIntMax},
      {"left100_right_intmax", 1024, 1024, false, 100, kIntMax},
      {"left_intmax_right100_sq700_sk300", 700, 300, false, kIntMax, 100},
      {"negative_sides_intmin_m2", 700, 900, false, kIntMin, -2},
      // Boundaries of the unbounded rule: sk - 1 / sq - 1 cut nothing, one less
      // cuts one key of one row.
      {"left_sk_minus_1_sq300_sk1000", 300, 1000, false, 999, 0},
      {"left_sk_minus_2_sq300_sk1000", 300, 1000, false, 998, 0},
      {"right_sq_minus_1_sq1000_sk300", 1000, 300, false, 0, 999},
      {"right_sq_minus_2_sq1000_sk300", 1000, 300, false, 0, 998},
      // Causal: window_right is ignored (any value), window_left is kept (local).
      {"causal_right7", 1000, 1000, true, -1, 7},
      {"causal_right_intmax_sq700_sk1300", 700, 1300, true, -1, kIntMax},
      {"causal_left100", 1000, 1000, true, 100, -1},
      {"causal_left100_right50_sq300_sk1000", 300, 1000, true, 100, 50},
      {"causal_left37_sq1000_sk300", 1000, 300, true, 37, -1},
      {"causal_left_intmax_right_intmax", 1024, 1024, true, kIntMax, kIntMax},
  };
}

// Random windows as FlashAttention's tests draw them: left and right uniform in
// [0, sk), per case (seeded by the case name), in four kinds.
enum class WindowKind { kLocal, kCausalLocal, kBeyondSequence, kOneSided };
inline const char* window_kind_name(WindowKind k) {
  switch (k) {
    case WindowKind::kLocal: return "local";
    case WindowKind::kCausalLocal: return "causal_local";
    case WindowKind::kBeyondSequence: return "beyond_sequence";
    case WindowKind::kOneSided: return "one_sided";
  }
  return "?";
}
inline constexpr WindowKind kWindowKinds[] = {WindowKind::kLocal, WindowKind::kCausalLocal,
                                               WindowKind::kBeyondSequence, WindowKind::kOneSided};

// Case: any struct with causal, wl, wr.
template <class Case>
void draw_window(Case* c, WindowKind kind, int sq, int sk, uint64_t seed) {
  auto uniform = [&](uint64_t salt, int64_t n) {  // [0, n)
    return int(tu::splitmix64(seed ^ salt) % uint64_t(std::max<int64_t>(n, 1)));
  };
  const int left = uniform(0x1ef7, sk), right = uniform(0x7197, sk);
  c->causal = false;
  switch (kind) {
    case WindowKind::kLocal:
      c->wl = left, c->wr = right;
      break;
    case WindowKind::kCausalLocal:  // right is drawn too: causal must ignore it
      c->causal = true;
      c->wl = left, c->wr = right;
      break;
    case WindowKind::kBeyondSequence: {  // one side past the sequence (up to 2^31 - 1), the other drawn
      const int far_left = seed % 3 == 0 ? kIntMax : sk + uniform(0xb1, 4 * int64_t(sk) + 1);
      const int far_right = seed % 3 == 1 ? kIntMax : sq + uniform(0xb2, 4 * int64_t(sq) + 1);
      if (seed & 2) c->wl = far_left, c->wr = right;
      else c->wl = left, c->wr = far_right;
      break;
    }
    case WindowKind::kOneSided:
      c->wl = (seed & 1) ? left : -1;
      c->wr = (seed & 1) ? -1 : right;
      break;
  }
}

// FlashAttention's seqlen pairs for the random windows: decode-like (one and
// three keys, and the reverse), odd unequal lengths, and long ones.
inline constexpr Seqlens kRandomWindowSeqlens[] = {{239, 1},    {799, 3},     {3, 799},     {113, 203},
                                                  {384, 256},  {640, 128},   {1023, 1024}, {4224, 4224}};

// ---------------------------------------------------------------------------
// Built variants from the manifest's list (FLASH3_VARIANTS_FILE).
// ---------------------------------------------------------------------------
// The distinct (head_dim, head_dim_v) pairs with a `pass` ("fwd" / "bwd") kernel
// in this build, in the file's order; *found tells whether the file was read.
inline std::vector<HeadDims> built_head_dims(const char* pass, bool* found = nullptr) {
  const std::vector<tu::Variant> vars = tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), found);
  std::vector<HeadDims> out;
  for (const tu::Variant& v : vars) {
    if (v.pass != pass) continue;
    bool seen = false;
    for (const HeadDims& h : out) seen |= h.d == v.d && h.dv == v.dv;
    if (!seen) out.push_back({v.d, v.dv});
  }
  return out;
}

inline std::string head_dims_name(HeadDims h) { return "d" + std::to_string(h.d) + "x" + std::to_string(h.dv); }

// Whether variants.txt lists the (pass, dtype, head dims) unit of `feature`.
inline bool variant_listed(const char* pass, DType dt, HeadDims h, const char* feature) {
  for (const tu::Variant& v : tu::read_variants(tu::variants_path(FLASH3_VARIANTS_FILE), nullptr, feature))
    if (v.pass == pass && v.dtype == tu::short_dtype(dt) && v.d == h.d && v.dv == h.dv) return true;
  return false;
}
// The softcap units of a forward (and, with backward, of the backward too) are built.
inline bool softcap_built(DType dt, HeadDims h, bool backward) {
  if (!flash3::forward_is_built(dt, h.d, h.dv) || !variant_listed("fwd", dt, h, "softcap")) return false;
  return !backward || (flash3::backward_is_built(dt, h.d, h.dv) && variant_listed("bwd", dt, h, "softcap"));
}

// The PackGQA forward unit of (dtype, head dims) is built, next to the plain
// kernel (test_packgqa_gpu.cpp). Without it opts.pack_gqa = 1 runs the
// unpacked kernel, so a packed suite must not run there.
inline bool packgqa_built(DType dt, HeadDims h) {
  return flash3::forward_is_built(dt, h.d, h.dv) && variant_listed("fwd", dt, h, "packgqa");
}

// The dtype a head-dim pair runs in: the first of bf16, fp16 with the packed
// unit, else (with `unpacked_ok`) the first with the plain kernel.
inline bool pick_pack_dtype(HeadDims h, bool unpacked_ok, DType* dt) {
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

// The softcap suites' values and masks (test_fwd_gpu.cpp, test_bwd_gpu.cpp).
inline constexpr float kSoftcaps[] = {1.f, 5.f, 30.f};
struct SoftcapMask {
  const char* name;
  bool causal;
  int wl, wr;
};
inline constexpr SoftcapMask kSoftcapMasks[] = {
    {"nomask", false, -1, -1}, {"causal", true, -1, -1}, {"local64x16", false, 64, 16}};
// A float as a short case-name token (5, 0.3).
inline std::string num_name(float x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// check(c) for every case of cases(dtype, full), bf16 then fp16, over the
// dtypes built(dtype) admits: the first one with full = true, the next with
// the reduced set (full = false). Returns the number of cases run (0: nothing
// built); stops at a fatal failure.
template <class Built, class Cases, class Check>
int run_per_dtype(Built&& built, Cases&& cases, Check&& check) {
  int ran = 0;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    if (!built(dt)) continue;
    for (const auto& c : cases(dt, ran == 0)) {
      check(c);
      if (::testing::Test::HasFatalFailure()) return ran;
      ++ran;
    }
  }
  return ran;
}

inline std::string head_dims_param_name(const ::testing::TestParamInfo<HeadDims>& info) {
  return head_dims_name(info.param);
}

using RandomWindowParam = std::tuple<HeadDims, Seqlens>;

// Case: any struct of the forward / backward suites. Batch 9 (strided) where the
// problem is small, 1 from 1023 x 1024 on.
template <class Case>
std::vector<Case> random_window_cases(const RandomWindowParam& rp, DType dt, const char* prefix) {
  const auto& [h, sl] = rp;
  std::vector<Case> out;
  for (WindowKind kind : kWindowKinds) {
    Case c;
    c.dtype = dt, c.d = h.d, c.dv = h.dv, c.sq = sl.sq, c.sk = sl.sk;
    const bool big = int64_t(sl.sq) * sl.sk > (int64_t(1) << 18);
    c.batch = big ? 1 : 9;
    c.hq = big ? 4 : 6, c.hkv = 2;
    c.layout = big ? Layout::kContiguous : Layout::kPadded;
    c.name = std::string(prefix) + tu::short_dtype(dt) + "_" + head_dims_name(h) + "_sq" + std::to_string(sl.sq) +
             "_sk" + std::to_string(sl.sk) + "_" + window_kind_name(kind);
    c.seed = fnv1a(c.name);
    draw_window(&c, kind, c.sq, c.sk, c.seed);
    out.push_back(c);
  }
  return out;
}

// bf16 for even seqlen pairs, fp16 for odd ones (the other where not built).
inline DType random_window_dtype(Seqlens sl) {
  int i = 0;
  for (const Seqlens& x : kRandomWindowSeqlens) {
    if (x.sq == sl.sq && x.sk == sl.sk) break;
    ++i;
  }
  return i % 2 == 0 ? DType::kBFloat16 : DType::kFloat16;
}

inline std::string random_window_name(const ::testing::TestParamInfo<RandomWindowParam>& info) {
  const auto& [h, sl] = info.param;
  return head_dims_name(h) + "_sq" + std::to_string(sl.sq) + "_sk" + std::to_string(sl.sk);
}

// FLASH3_GPU_TESTS_QUICK=1: the matrices leave out their (4096, 4096) cases.
inline bool quick_mode() {
  const char* q = std::getenv("FLASH3_GPU_TESTS_QUICK");
  return q != nullptr && std::string(q) == "1";
}

// ---------------------------------------------------------------------------
// Memory layout of the (b, s, h, d) tensors, in elements.
// ---------------------------------------------------------------------------
struct View {
  int64_t offset = 0;  // of element (0, 0, 0, 0) in its allocation
  int64_t sb = 0, sr = 0, sh = 0;
  int64_t b = 0, s = 0, h = 0, d = 0;
  int64_t span() const {  // elements touched, counted from the allocation start
    if (b == 0 || s == 0 || h == 0 || d == 0) return offset;
    return offset + (b - 1) * sb + (s - 1) * sr + (h - 1) * sh + d;
  }
  int64_t at(int64_t ib, int64_t is, int64_t ih, int64_t ic) const {
    return offset + ib * sb + is * sr + ih * sh + ic;
  }
  int64_t numel() const { return b * s * h * d; }
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Element `offset` of a 16-bit allocation.
inline uint16_t* elem16(void* base, int64_t offset) { return static_cast<uint16_t*>(base) + offset; }

// View v of the 16-bit allocation `base` as a reference operand.
inline flash3::gpuref::Strided16 strided16(const void* base, const View& v) {
  flash3::gpuref::Strided16 t;
  t.data = static_cast<const uint16_t*>(base) + v.offset;
  t.batch_stride = v.sb;
  t.row_stride = v.sr;
  t.head_stride = v.sh;
  return t;
}

// The problem of a reference call (R: gpuref::Args or BwdArgs) from a
// fixed-length case: dtype, shapes, mask and scores.
template <class R>
void set_ref_problem(const FixedCase& c, R* r) {
  r->dtype = c.dtype;
  r->batch = c.batch;
  r->seqlen_q = c.sq;
  r->seqlen_k = c.sk;
  r->heads_q = c.hq;
  r->heads_kv = c.hkv;
  r->head_dim = c.d;
  r->head_dim_v = c.dv;
  set_mask_and_scale(c, r);
}

inline View dense_view(int64_t offset, int64_t b, int64_t s, int64_t h, int64_t d) {
  View v;
  v.offset = offset;
  v.b = b, v.s = s, v.h = h, v.d = d;
  v.sh = d;
  v.sr = h * d;
  v.sb = std::max<int64_t>(s, 1) * v.sr;
  return v;
}

// Padding between heads, rows and batches (multiples of 8 elements: 16 bytes).
inline View padded_view(int64_t offset, int64_t b, int64_t s, int64_t h, int64_t d) {
  View v;
  v.offset = offset;
  v.b = b, v.s = s, v.h = h, v.d = d;
  v.sh = d + 8;
  v.sr = h * v.sh + 16;
  v.sb = std::max<int64_t>(s, 1) * v.sr + 64;
  return v;
}

// q, k, v (or dq, dk, dv) in one allocation of `elems` elements. kPackedQKV
// needs hq == hkv, d == dv and sq == sk (slices of one (b, s, 3, h, d) tensor).
struct QKV {
  View q, k, v;
  int64_t elems = 0;
};

inline QKV make_qkv(Layout layout, int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d,
                    int64_t dv) {
  QKV r;
  if (layout == Layout::kPackedQKV) {
    const int64_t h = hq, s = sq;
    for (View* v : {&r.q, &r.k, &r.v}) {
      v->b = batch, v->s = s, v->h = h, v->d = d;
      v->sh = d;
      v->sr = 3 * h * d;
      v->sb = std::max<int64_t>(s, 1) * v->sr;
    }
    r.q.offset = 0;
    r.k.offset = h * d;
    r.v.offset = 2 * h * d;
    r.elems = std::max<int64_t>(batch * std::max<int64_t>(s, 1) * 3 * h * d, 8);
  } else {
    auto mk = layout == Layout::kPadded ? padded_view : dense_view;
    int64_t off = 0;
    r.q = mk(off, batch, sq, hq, d);
    off = round_up(std::max(r.q.span(), off + 1), 128);
    r.k = mk(off, batch, sk, hkv, d);
    off = round_up(std::max(r.k.span(), off + 1), 128);
    r.v = mk(off, batch, sk, hkv, dv);
    r.elems = round_up(std::max(r.v.span(), off + 1), 128);
  }
  return r;
}

// Dense (b, s, h, d) doubles from a strided 16-bit host buffer.
inline std::vector<double> extract(const std::vector<uint16_t>& buf, const View& v, DType dt) {
  std::vector<double> out(size_t(v.numel()));
  const int64_t rows = v.b * v.s * v.h;
  tu::parallel_for(size_t(rows), [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const int64_t ih = int64_t(r) % v.h, is = (int64_t(r) / v.h) % v.s, ib = int64_t(r) / (v.h * v.s);
      const uint16_t* src = buf.data() + v.at(ib, is, ih, 0);
      double* dst = out.data() + r * v.d;
      for (int64_t c = 0; c < v.d; ++c) dst[c] = tu::half_bits_to_float(dt, src[c]);
    }
  });
  return out;
}

inline std::vector<double> to_double(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  tu::parallel_for(x.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) out[i] = x[i];
  });
  return out;
}

// Elements of a 16-bit allocation outside all `views` that are not the poison value.
inline int64_t count_clobbered(const std::vector<uint16_t>& buf, std::initializer_list<const View*> views) {
  std::vector<uint8_t> inside(buf.size(), 0);
  for (const View* v : views)
    for (int64_t ib = 0; ib < v->b; ++ib)
      for (int64_t is = 0; is < v->s; ++is)
        for (int64_t ih = 0; ih < v->h; ++ih) std::memset(&inside[size_t(v->at(ib, is, ih, 0))], 1, size_t(v->d));
  int64_t n = 0;
  for (size_t i = 0; i < buf.size(); ++i) n += (!inside[i] && buf[i] != kPoison16);
  return n;
}

// Comparison of one output with the tolerance rule, with a readable report.
struct Verdict {
  bool ok = false;
  std::string text;
  flash3::ref::CloseResult r;
};

// The tolerance rule's factor for a case (any struct with softcap): 2, or
// FlashAttention-3's softcap factor (ref::kSoftcapTolFactor) when capped.
template <class Case>
double tol_factor(const Case& c) {
  return c.softcap > 0.f ? flash3::ref::kSoftcapTolFactor : 2.0;
}

// `where(i)` describes dense index i.
template <class Where>
Verdict judge(const char* what, const std::vector<double>& ours, const std::vector<double>& ref,
              const std::vector<double>& low, double eps, Where where, double factor = 2.0) {
  Verdict v;
  v.r = flash3::ref::check_close(ours.data(), ref.data(), low.data(), ours.size(), eps, factor);
  v.ok = v.r.ok;
  std::ostringstream os;
  os.precision(6);
  os << what << ": err=" << v.r.err << " baseline=" << v.r.base_err << " bound=" << v.r.bound << " (" << factor << "*baseline+"
     << eps << ") nan=" << v.r.nan_count << " n=" << ours.size();
  // Worst element (NaN counts as worst).
  size_t worst = ours.size();
  double worst_e = -1;
  for (size_t i = 0; i < ours.size(); ++i) {
    double e;
    if (std::isnan(ours[i])) e = std::numeric_limits<double>::infinity();
    else if (std::isinf(ref[i])) e = ours[i] == ref[i] ? 0.0 : std::numeric_limits<double>::infinity();
    else e = std::fabs(ours[i] - ref[i]);
    if (e > worst_e) worst_e = e, worst = i;
  }
  if (worst < ours.size())
    os << "; worst at " << where(worst) << ": ours=" << ours[worst] << " ref=" << ref[worst] << " lowp=" << low[worst];
  v.text = os.str();
  return v;
}

// eps of the tolerance rule for gradients: FlashAttention's gradient atol,
// 2 * max |round(round(round(r) + 0.3) - 0.3) - round(r)| (twice the largest
// rounding error of the dtype near the reference values), at least 1e-5 *
// max(1, max |ref|). Without it, rows whose gradient is a difference of two
// nearly equal terms fail at random by a fraction of one ulp.
inline double grad_eps(const std::vector<double>& ref, DType dt) {
  auto r16 = [dt](double x) { return double(tu::half_bits_to_float(dt, tu::float_to_half_bits(dt, float(x)))); };
  double worst = 0.0, peak = 0.0;
  for (double r : ref) {
    if (!std::isfinite(r)) continue;
    const double x = r16(r);
    worst = std::max(worst, std::fabs(r16(r16(x + 0.3) - 0.3) - x));
    peak = std::max(peak, std::fabs(r));
  }
  return std::max(1e-5 * std::max(1.0, peak), 2.0 * worst);
}

// ---------------------------------------------------------------------------
// Device memory of a test file.
// ---------------------------------------------------------------------------
// The State (a struct with a `stream` and the file's buffers) of one test file,
// shared by all its tests in the process; its buffers only grow. Each file
// passes a State type of its own, so no two files share buffers.
template <class State>
State& device_state() {
  static State* s = [] {
    auto* st = new State;  // intentionally leaked: no CUDA calls during static destruction
    if (cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking) != cudaSuccess) st->stream = nullptr;
    return st;
  }();
  return *s;
}

// Grows each buffer to at least its size in bytes.
inline ::testing::AssertionResult reserve_all(std::initializer_list<std::pair<tu::DeviceBuffer*, size_t>> bufs) {
  for (auto [buf, bytes] : bufs) {
    const cudaError_t e = buf->reserve(bytes);
    if (e != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMalloc(" << bytes << " bytes): " << cudaGetErrorString(e);
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// The caller's stream. run_behind_gate() calls launch(S) on a fresh non-blocking
// stream S held by a StreamGate: the `hidden` device ranges (inputs) hold NaN
// until the gate opens and get their values back by copies enqueued on S behind
// it, so work sent to any other stream reads NaN. While S is held it checks that
// the `outputs` (poisoned with 0xff bytes by the caller) are untouched after the
// legacy and per-thread default streams drained and a pause, and that the call
// returned without waiting for S; then it opens the gate and waits for S.
// ---------------------------------------------------------------------------
struct DeviceRange {
  void* ptr;
  size_t bytes;
  const char* name;
};

inline flash3::Status run_behind_gate(cudaStream_t test_stream,
                                      const std::function<flash3::Status(cudaStream_t)>& launch,
                                      const std::vector<DeviceRange>& hidden, const std::vector<DeviceRange>& outputs) {
  constexpr double kGateTimeoutS = 10.0;
  // A first call on the test stream: the first launch of a kernel loads its
  // module (CUDA's lazy loading), which waits for the device to go idle and so
  // would hold the legacy-stream synchronisation below until the gate times
  // out. The outputs are poisoned again afterwards.
  EXPECT_TRUE(launch(test_stream).ok()) << "warm-up call";
  for (const DeviceRange& r : outputs) cudaMemsetAsync(r.ptr, 0xff, r.bytes, test_stream);
  std::vector<tu::DeviceBuffer> staged(hidden.size());
  for (size_t i = 0; i < hidden.size(); ++i) {
    EXPECT_EQ(staged[i].reserve(hidden[i].bytes), cudaSuccess) << "staging " << hidden[i].name;
    cudaMemcpyAsync(staged[i].ptr, hidden[i].ptr, hidden[i].bytes, cudaMemcpyDeviceToDevice, test_stream);
    cudaMemsetAsync(hidden[i].ptr, 0xff, hidden[i].bytes, test_stream);
  }
  EXPECT_EQ(cudaStreamSynchronize(test_stream), cudaSuccess);
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    ADD_FAILURE() << "cudaStreamCreateWithFlags failed";
    return flash3::Status::Cuda("no stream");
  }
  flash3::Status st;
  {
    StreamGate gate(s, kGateTimeoutS);
    EXPECT_EQ(gate.status(), cudaSuccess) << "stream gate: " << cudaGetErrorString(gate.status());
    for (size_t i = 0; i < hidden.size(); ++i)
      cudaMemcpyAsync(hidden[i].ptr, staged[i].ptr, hidden[i].bytes, cudaMemcpyDeviceToDevice, s);
    const auto t0 = std::chrono::steady_clock::now();
    st = launch(s);
    const double call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(call_s, kGateTimeoutS / 2) << "the call took " << call_s
                                         << " s: it waited for its own (held) stream instead of only enqueueing";
    // Work sent to another stream would run now: let it finish, then look.
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the caller's stream drained while the gate was closed";
    for (const DeviceRange& r : outputs) {
      int64_t written = 0;
      EXPECT_EQ(count_bytes_not(r.ptr, r.bytes, 0xff, &written), cudaSuccess) << r.name;
      EXPECT_EQ(written, 0) << written << " bytes of " << r.name
                            << " were written while the caller's stream was held: flash3 ran work on another stream";
    }
    gate.open();
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_FALSE(gate.timed_out()) << "the stream gate gave up before it was opened: the checks above are void";
  }
  cudaStreamDestroy(s);
  return st;
}

// A CUDA error the caller left pending (an unrelated failed launch) is not the
// call's error: `call` (the operation on `stream`) succeeds and the error is
// still pending afterwards. A first call raises the kernels' shared-memory
// limits (cudaFuncSetAttribute, which resets a pending error: flash3.h), so the
// pending error is left after it. Returns the second call's status.
inline flash3::Status call_with_pending_error(const std::function<flash3::Status()>& call, cudaStream_t stream) {
  EXPECT_TRUE(call().ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const cudaError_t pending = leave_pending_launch_error();
  EXPECT_NE(pending, cudaSuccess) << "no pending error to test with";
  const flash3::Status st = call();
  EXPECT_TRUE(st.ok()) << "a pending error of an unrelated launch failed the call: " << st.message;
  // Not the call's to clear either (flash3.h); this also leaves none behind.
  EXPECT_EQ(cudaGetLastError(), pending) << "the caller's pending error was cleared";
  return st;
}

// `launch` on a stream created on another device than the current one (the
// tensors' device) returns kInvalidArgument. Needs two GPUs.
inline void expect_other_device_stream_rejected(const std::function<flash3::Status(cudaStream_t)>& launch) {
  int cur = 0;
  ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
  const int other = cur == 0 ? 1 : 0;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
  const cudaError_t created = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  ASSERT_EQ(cudaSetDevice(cur), cudaSuccess);
  ASSERT_EQ(created, cudaSuccess) << "stream on device " << other;
  const flash3::Status st = launch(s);
  EXPECT_EQ(st.code, flash3::StatusCode::kInvalidArgument)
      << "a stream of device " << other << " for tensors of device " << cur << ": " << st.message;
  ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  ASSERT_EQ(cudaSetDevice(cur), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace flash3::gputest
