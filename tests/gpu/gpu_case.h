// Shared vocabulary of the GPU test matrices (test_fwd_gpu.cpp, test_bwd_gpu.cpp):
// the mask / layout / shape parameters and their printing, strided (b, s, h, d)
// memory views with dense, padded and packed-QKV layouts, host extraction and
// the tolerance-rule verdict with a readable report.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "reference/reference.h"

namespace flash3::gputest {

namespace tu = flash3::testutil;

constexpr uint16_t kPoison16 = 0xffff;  // NaN in bf16 and fp16
constexpr int64_t kGuard = 256;         // poisoned elements after every output tensor

enum class Mask { kNone, kCausal, kWindow128_0, kWindow256_256 };
enum class Layout { kContiguous, kPackedQKV, kPadded };

struct HeadDims {
  int d, dv;
};
// Every (head_dim, head_dim_v) pair the library has kernels for (tools/manifest.py).
inline constexpr HeadDims kAllHeadDims[] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};
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

// `where(i)` describes dense index i.
template <class Where>
Verdict judge(const char* what, const std::vector<double>& ours, const std::vector<double>& ref,
              const std::vector<double>& low, double eps, Where where) {
  Verdict v;
  v.r = flash3::ref::check_close(ours.data(), ref.data(), low.data(), ours.size(), eps);
  v.ok = v.r.ok;
  std::ostringstream os;
  os.precision(6);
  os << what << ": err=" << v.r.err << " baseline=" << v.r.base_err << " bound=" << v.r.bound << " (2*baseline+"
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

}  // namespace flash3::gputest
