// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU fuzz of bad inputs (issue 39, "no input crashes the process"): every
// public entry point, C++ and C ABI, called with seeded random corruptions of a
// valid argument set built on fake device addresses (nothing is dereferenced or
// launched).
//
// Corruptions: wrong dtypes and ranks; negative, zero, mismatched and huge
// shapes; negative, zero (written tensors), misaligned, non-unit-last and
// overflowing strides; self-overlapping outputs; data pointers 1..15 bytes off
// their alignment; null data with a non-empty shape; outputs overlapping inputs
// or each other (either moved into the other's memory), int32 arrays inside an
// output; NaN / inf / negative / subnormal / huge softmax_scale and softcap;
// out-of-range pack_gqa, num_splits, num_sequences, max_seqlen, page tables,
// heads_per_scale, rotary dims; C ABI struct_size, dtype, ndim and NULL
// arguments.
//
// The oracle of each call is the structure check (check_*_structure: step 1 of
// validation, which needs no kernel and no device, so it answers alike in every
// build) or, for quantize_fp8 / forward_plan, the entry point itself. Every
// corrupted call must:
//   * be rejected with kInvalidArgument or kNotSupported (never kOk, never a
//     crash), with a non-empty message naming the corrupted argument (word
//     match; for a shape that no longer matches another tensor's, any argument
//     of the call);
//   * get the same status from the public validate_*() (device checks skipped)
//     and from the launching entry point (device checks on: a call the
//     structure check wrongly accepts is then stopped by the device check on a
//     GPU machine, or by the kernel check in a kernel-less build, and never
//     launched on the fake pointers);
//   * through the C ABI: the same code and, where the C arguments carry the
//     same information, the same message behind the function's name in
//     flash3_last_error(); outputs (forward_plan's) untouched.
// The workspace-size functions must not crash and return 0 where documented
// (malformed KV-cache arguments, a bad C struct_size / dtype / ndim).
//
// Failures are grouped by kind (the corrupted argument and the class of value),
// each printed once with a count and one example, so a missing check shows up as
// one line. A per-entry-point count of calls is printed. Named FuzzInputs.*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "c_options.h"
#include "skip_device_check.h"
#include "status_matchers.h"
#include "flash3/flash3.h"
#include "flash3/flash3_c.h"

namespace {

using flash3::AttentionOptions;
using flash3::BackwardArgs;
using flash3::CombineArgs;
using flash3::DType;
using flash3::ForwardArgs;
using flash3::KVCacheArgs;
using flash3::QuantizeFp8Args;
using flash3::Status;
using flash3::StatusCode;
using flash3::TensorView;

constexpr uint64_t kSeed = 0x39f0221e5eedull;
using flash3::unittest::code_name;

// ---------------------------------------------------------------------------
// Small utilities.
// ---------------------------------------------------------------------------
void* fake(uintptr_t addr) { return reinterpret_cast<void*>(addr); }
const int* fake_int(uintptr_t addr) { return reinterpret_cast<const int*>(addr); }
void* byte_offset(const void* p, int64_t off) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(off));
}

TensorView dense(uintptr_t addr, DType dt, std::initializer_list<int64_t> shape) {
  int64_t sh[flash3::kMaxTensorDims] = {};
  int n = 0;
  for (int64_t x : shape) sh[n++] = x;
  return TensorView::contiguous(fake(addr), dt, n, sh);
}

int esize(DType t) { return flash3::dtype_size(t); }

// Bytes from the first to one past the last element of a well-formed view.
int64_t span_bytes(const TensorView& t) {
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1) last += (t.shape[i] - 1) * t.stride[i];
  return (last + 1) * esize(t.dtype);
}

std::string fmt_float(float x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `name` occurs in `msg` as a whole word ("q" in "q.data", "(q's", not in "dq" or "seqused_q").
bool names_arg(const std::string& msg, const std::string& name) {
  for (size_t pos = msg.find(name); pos != std::string::npos; pos = msg.find(name, pos + 1)) {
    const size_t end = pos + name.size();
    if ((pos == 0 || !is_ident(msg[pos - 1])) && (end >= msg.size() || !is_ident(msg[end]))) return true;
  }
  return false;
}

bool names_any(const std::string& msg, const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (names_arg(msg, n)) return true;
  return false;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " / ") + x;
  return s;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_); }
  bool coin() { return range(0, 1) == 1; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))];
  }

 private:
  std::mt19937_64 g_;
};

// Device checks off for the duration of a test (the previous state restored
// afterwards); skip_device_check() switches them within it.
class FuzzInputs : public flash3::testutil::SkipDeviceCheckTest {};

void skip_device_check(bool skip) { flash3::set_device_checks_for_testing(!skip); }

// ---------------------------------------------------------------------------
// Outcome bookkeeping: failures grouped by kind, one example each.
// ---------------------------------------------------------------------------
struct Failure {
  int count = 0;
  std::string example;
};

struct Tally {
  explicit Tally(std::string e) : entry(std::move(e)) {}
  std::string entry;
  std::map<std::string, int> calls;  // per public function
  int cases = 0;
  std::map<std::string, Failure> failures;

  void call(const std::string& fn, int n = 1) { calls[fn] += n; }
  void fail(const std::string& kind, const std::string& example) {
    Failure& f = failures[kind];
    if (f.count++ == 0) f.example = example;
  }
  int total_calls() const {
    int n = 0;
    for (const auto& [fn, c] : calls) n += c;
    return n;
  }
  // Prints the counts; one gtest failure per kind of failure.
  void report() const {
    std::printf("[fuzz] %s: %d corrupted argument sets, %d bad calls:", entry.c_str(), cases, total_calls());
    for (const auto& [fn, c] : calls) std::printf(" %s %d,", fn.c_str(), c);
    int bad = 0;
    for (const auto& [k, f] : failures) bad += f.count;
    std::printf(" failures %d (%zu kinds)\n", bad, failures.size());
    for (const auto& [k, f] : failures)
      ADD_FAILURE() << entry << ": " << k << " (" << f.count << " case" << (f.count > 1 ? "s" : "") << "), e.g. "
                    << f.example;
    std::fflush(stdout);
  }
};

// One corruption of a valid argument set.
struct Mut {
  std::string kind;                // stable label: the argument and the class of value
  std::string detail;              // the values drawn
  std::vector<std::string> names;  // the message must name one of these; empty: any argument of the call
  bool lossy_c = false;            // the C ABI cannot carry it exactly (its message may differ)
};

// The verdict on one oracle status.
bool judge(Tally& t, const Mut& m, const Status& s, const std::vector<std::string>& arg_names, const char* what) {
  const std::string ex = m.detail + " -> " + code_name(s.code) + " \"" + s.message + "\"";
  if (s.ok()) {
    t.fail(m.kind + ": accepted (" + what + " returned Ok)", m.detail);
    return false;
  }
  if (s.code != StatusCode::kInvalidArgument && s.code != StatusCode::kNotSupported) {
    t.fail(m.kind + ": status " + code_name(s.code) + " (expected InvalidArgument or NotSupported)", ex);
    return false;
  }
  if (s.message.empty()) {
    t.fail(m.kind + ": empty message", ex);
    return false;
  }
  if (s.message.find("is not built in this library") != std::string::npos) {
    t.fail(m.kind + ": not rejected by the argument checks (only by the kernel check)", ex);
    return false;
  }
  const std::vector<std::string>& want = m.names.empty() ? arg_names : m.names;
  if (!names_any(s.message, want)) {
    t.fail(m.kind + ": message does not name " + join(want), ex);
    return false;
  }
  return true;
}

// Runs one corrupted argument set: the oracle (device checks skipped), then the
// public validation (skipped) and the launching entry point (device checks on),
// which must answer as the oracle did. Returns the oracle's status.
Status run_case(Tally& t, const Mut& m, const std::vector<std::string>& arg_names, const char* oracle_name,
                const std::function<Status()>& oracle, const char* validate_name,
                const std::function<Status()>& validate, const char* launch_name,
                const std::function<Status()>& launch) {
  ++t.cases;
  skip_device_check(true);
  const Status s = oracle();
  if (validate_name != nullptr && std::strcmp(validate_name, oracle_name) == 0) t.call(validate_name);
  if (!judge(t, m, s, arg_names, oracle_name)) return s;
  auto same = [&](const char* fn, const Status& got) {
    if (got.code != s.code || got.message != s.message)
      t.fail(m.kind + ": " + fn + " answers differently from " + oracle_name,
             m.detail + " -> " + oracle_name + ": " + code_name(s.code) + " \"" + s.message + "\", " + fn + ": " +
                 code_name(got.code) + " \"" + got.message + "\"");
  };
  if (validate && std::strcmp(validate_name, oracle_name) != 0) {
    t.call(validate_name);
    same(validate_name, validate());
  }
  if (launch) {
    skip_device_check(false);
    t.call(launch_name);
    same(launch_name, launch());
    skip_device_check(true);
  }
  return s;
}

// ---------------------------------------------------------------------------
// Tensor slots and their corruptions.
// ---------------------------------------------------------------------------
struct Slot {
  std::string name;
  TensorView* t = nullptr;
  bool written = false;
  int align = 16;                // bytes the data pointer must be aligned to
  int stride_mult = 1;           // elements the non-last strides must be multiples of (1: any)
  bool unit_last = true;         // the last dimension must have stride 1
  bool tma = false;              // strides below 2^40 bytes (TMA)
  int free_dim = -1;             // a dimension that may grow (rotary tables' seqlen_ro)
  std::vector<DType> ok_dtypes;  // dtypes this slot alone may take (empty: its own)
  std::vector<int> ok_ndims;     // ranks this slot may take (empty: its own)
};

Slot slot(const std::string& name, TensorView* t, bool written, int align, int stride_mult, bool unit_last, bool tma) {
  Slot s;
  s.name = name, s.t = t, s.written = written, s.align = align, s.stride_mult = stride_mult;
  s.unit_last = unit_last, s.tma = tma;
  return s;
}

// 16-bit or fp8 attention tensors (TMA): 16-byte aligned, strides multiples of 16 bytes.
Slot tma_slot(const std::string& name, TensorView* t, bool written) {
  return slot(name, t, written, 16, 16 / esize(t->dtype), true, true);
}
Slot lse_slot(const std::string& name, TensorView* t, bool written) {
  return slot(name, t, written, 4, 1, true, false);
}

// An int32 device array (cu_seqlens, cache_seqlens, page_table, ...).
struct ArrayRef {
  std::string name;
  const int** p;
  int64_t bytes;
};

enum class TK {
  kDtype,
  kNdim,
  kShapeNeg,
  kShapeHuge,
  kShapeMismatch,
  kStrideNeg,
  kStrideZeroWritten,
  kStrideMisaligned,
  kStrideLast,
  kStrideOverflow,
  kSelfOverlap,
  kMisaligned,
  kNull,
  kCount
};

bool contains(const std::vector<DType>& v, DType d) { return std::find(v.begin(), v.end(), d) != v.end(); }
bool contains(const std::vector<int>& v, int d) { return std::find(v.begin(), v.end(), d) != v.end(); }

std::vector<int> dims_gt1(const TensorView& t, bool non_last) {
  std::vector<int> d;
  for (int i = 0; i < t.ndim - (non_last ? 1 : 0); ++i)
    if (t.shape[i] > 1) d.push_back(i);
  return d;
}

// One corruption of slot s of kind k; false when k does not apply to s.
bool mutate_slot(Slot& s, TK k, Rng& r, Mut* m) {
  TensorView& t = *s.t;
  const std::string& n = s.name;
  m->names = {n};
  std::ostringstream d;
  switch (k) {
    case TK::kDtype: {
      std::vector<DType> ok = s.ok_dtypes.empty() ? std::vector<DType>{t.dtype} : s.ok_dtypes;
      std::vector<DType> bad;
      for (int v : {0, 1, 2, 3, 4, -1, 99})
        if (!contains(ok, DType(v))) bad.push_back(DType(v));
      const DType dt = r.pick(bad);
      d << n << ".dtype = " << int(dt) << " (was " << int(t.dtype) << ")";
      t.dtype = dt;
      m->kind = n + ": wrong dtype";
      m->lossy_c = int(dt) < 0 || int(dt) > 3;
      break;
    }
    case TK::kNdim: {
      std::vector<int> ok = s.ok_ndims.empty() ? std::vector<int>{t.ndim} : s.ok_ndims;
      std::vector<int> bad;
      for (int v : {0, 1, 2, 3, 4, 5, 6, -1, 100})
        if (!contains(ok, v)) bad.push_back(v);
      const int nd = r.pick(bad);
      d << n << ".ndim = " << nd << " (was " << t.ndim << ")";
      t.ndim = nd;
      m->kind = n + ": wrong ndim";
      m->lossy_c = true;
      break;
    }
    case TK::kShapeNeg: {
      const int i = int(r.range(0, t.ndim - 1));
      const int64_t v = r.pick(std::vector<int64_t>{-1, -2, -(int64_t(1) << 40), INT64_MIN});
      d << n << ".shape[" << i << "] = " << v;
      t.shape[i] = v;
      m->kind = n + ": negative shape";
      break;
    }
    case TK::kShapeHuge: {
      const int i = int(r.range(0, t.ndim - 1));
      const int64_t v = r.pick(std::vector<int64_t>{int64_t(INT32_MAX) + 1, int64_t(1) << 40, INT64_MAX});
      d << n << ".shape[" << i << "] = " << v;
      t.shape[i] = v;
      m->kind = n + ": huge shape";
      break;
    }
    case TK::kShapeMismatch: {
      const int i = int(r.range(0, t.ndim - 1));
      const int64_t cur = t.shape[i];
      int64_t v;
      if (i == s.free_dim) {
        if (cur < 1) return false;
        v = r.range(0, cur - 1);  // may grow, not shrink
      } else {
        std::vector<int64_t> c;
        for (int64_t x : {int64_t(0), cur + 1, cur - 1, 2 * cur, cur + 8})
          if (x != cur && x >= 0) c.push_back(x);
        v = r.pick(c);
      }
      d << n << ".shape[" << i << "] = " << v << " (was " << cur << ")";
      t.shape[i] = v;
      m->kind = n + ": mismatched shape";
      m->names = {};  // the other tensor's check may speak first: any argument
      break;
    }
    case TK::kStrideNeg: {
      const std::vector<int> ds = dims_gt1(t, false);
      if (ds.empty()) return false;
      const int i = r.pick(ds);
      std::vector<int64_t> c = {-1, -16, INT64_MIN};
      if (t.stride[i] > 0) c.push_back(-t.stride[i]);
      const int64_t v = r.pick(c);
      d << n << ".stride[" << i << "] = " << v;
      t.stride[i] = v;
      m->kind = n + ": negative stride";
      break;
    }
    case TK::kStrideZeroWritten: {
      if (!s.written) return false;
      const std::vector<int> ds = dims_gt1(t, false);
      if (ds.empty()) return false;
      const int i = r.pick(ds);
      d << n << ".stride[" << i << "] = 0 (written)";
      t.stride[i] = 0;
      m->kind = n + ": zero stride on a written tensor";
      break;
    }
    case TK::kStrideMisaligned: {
      if (s.stride_mult <= 1) return false;
      const std::vector<int> ds = dims_gt1(t, s.unit_last);
      if (ds.empty()) return false;
      const int i = r.pick(ds);
      const int64_t add = r.range(1, s.stride_mult - 1);
      d << n << ".stride[" << i << "] = " << t.stride[i] + add << " (not a multiple of " << s.stride_mult << ")";
      t.stride[i] += add;
      m->kind = n + ": stride not a multiple of 16 bytes";
      break;
    }
    case TK::kStrideLast: {
      const int last = t.ndim - 1;
      if (!s.unit_last || t.shape[last] <= 1) return false;
      const int64_t v = r.pick(std::vector<int64_t>{0, 2, 3, 8});
      d << n << ".stride[" << last << "] = " << v;
      t.stride[last] = v;
      m->kind = n + ": last dimension not contiguous";
      break;
    }
    case TK::kStrideOverflow: {
      // A stride whose span (shape - 1) * stride * element size passes INT64_MAX,
      // or, for TMA tensors, reaches 2^40 bytes.
      std::vector<int> ds;
      for (int i : dims_gt1(t, s.unit_last))
        if ((t.shape[i] - 1) * esize(t.dtype) >= 2) ds.push_back(i);
      if (ds.empty()) return false;
      const int i = r.pick(ds);
      const int64_t mult = std::max(1, s.stride_mult);
      const int64_t per = (t.shape[i] - 1) * esize(t.dtype);
      std::vector<int64_t> c = {(INT64_MAX / per + 1 + mult - 1) / mult * mult,
                                INT64_MAX / esize(t.dtype) / mult * mult};
      if (s.tma) c.push_back(((int64_t(1) << 40) / esize(t.dtype) + mult - 1) / mult * mult);
      const int64_t v = r.pick(c);
      d << n << ".stride[" << i << "] = " << v << " (shape " << t.shape[i] << ")";
      t.stride[i] = v;
      m->kind = n + ": overflowing stride";
      break;
    }
    case TK::kSelfOverlap: {
      if (!s.written) return false;
      const std::vector<int> ds = dims_gt1(t, false);
      if (ds.size() < 2) return false;
      const int i = r.pick(ds);
      int j = r.pick(ds);
      if (i == j) j = ds[(std::find(ds.begin(), ds.end(), i) - ds.begin() + 1) % ds.size()];
      d << n << ".stride[" << i << "] = stride[" << j << "] = " << t.stride[j] << " (elements overlap)";
      t.stride[i] = t.stride[j];
      m->kind = n + ": self-overlapping written tensor";
      break;
    }
    case TK::kMisaligned: {
      if (s.align <= 1) return false;
      std::vector<int64_t> c;
      for (int64_t o = 1; o <= 15; ++o)
        if (o % s.align != 0) c.push_back(o);
      const int64_t o = r.pick(c);
      d << n << ".data + " << o << " bytes (needs " << s.align << ")";
      t.data = byte_offset(t.data, o);
      m->kind = n + ": data misaligned";
      break;
    }
    case TK::kNull: {
      d << n << ".data = null, shape non-empty";
      t.data = nullptr;
      m->kind = n + ": null data";
      break;
    }
    case TK::kCount: return false;
  }
  m->detail = d.str();
  return true;
}

bool mutate_random_slot(std::vector<Slot>& slots, Rng& r, Mut* m) {
  for (int tries = 0; tries < 100; ++tries) {
    Slot& s = slots[size_t(r.range(0, int64_t(slots.size()) - 1))];
    if (s.t->data == nullptr && s.t->ndim == 0) continue;
    const TK k = TK(r.range(0, int(TK::kCount) - 1));
    if (mutate_slot(s, k, r, m)) return true;
  }
  return false;
}

// A written tensor W and another argument share memory: W moved into the other
// tensor, the other tensor moved into W, or an int32 array placed inside W.
bool mutate_alias(std::vector<Slot>& slots, std::vector<ArrayRef>& arrays, Rng& r, Mut* m) {
  std::vector<Slot*> written, present;
  for (Slot& s : slots) {
    if (s.t->data == nullptr) continue;
    present.push_back(&s);
    if (s.written) written.push_back(&s);
  }
  if (written.empty()) return false;
  Slot& w = *r.pick(written);
  auto offset_in = [&](const TensorView& t) { return 16 * r.range(0, std::max<int64_t>(span_bytes(t) / 16 - 1, 0)); };
  const int choice = int(r.range(0, arrays.empty() ? 1 : 2));
  std::ostringstream d;
  if (choice == 2) {
    ArrayRef& a = arrays[size_t(r.range(0, int64_t(arrays.size()) - 1))];
    const int64_t off = offset_in(*w.t);
    *a.p = static_cast<const int*>(byte_offset(w.t->data, off));
    d << a.name << " = " << w.name << ".data + " << off << " (" << a.bytes << " bytes read while " << w.name
      << " is written)";
    m->kind = a.name + " inside a written tensor";
    m->names = {a.name, w.name};
  } else {
    std::vector<Slot*> others;
    for (Slot* s : present)
      if (s != &w) others.push_back(s);
    if (others.empty()) return false;
    Slot& o = *r.pick(others);
    Slot& moved = choice == 0 ? w : o;
    Slot& target = choice == 0 ? o : w;
    const int64_t off = offset_in(*target.t);
    moved.t->data = byte_offset(target.t->data, off);
    d << moved.name << ".data = " << target.name << ".data + " << off;
    // One kind per pair, whichever of the two moved: "<written> overlaps <other>".
    m->kind = o.written && o.name < w.name ? o.name + " overlaps " + w.name : w.name + " overlaps " + o.name;
    m->names = {moved.name};
  }
  m->detail = d.str();
  return true;
}

// ---------------------------------------------------------------------------
// Option corruptions.
// ---------------------------------------------------------------------------
struct OptCtx {
  bool varlen = false;
  bool kvcache = false;
  bool fp8 = false;
  bool plan = false;  // forward_plan: options only, no head dim known to the ratio check
};

template <class T>
T pick_class(Rng& r, const std::vector<std::pair<std::string, std::vector<T>>>& classes, std::string* cls) {
  const auto& c = classes[size_t(r.range(0, int64_t(classes.size()) - 1))];
  *cls = c.first;
  return r.pick(c.second);
}

bool mutate_options(AttentionOptions& o, const OptCtx& ctx, Rng& r, Mut* m) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<int> kinds = {0, 1, 2, 3, 4};
  if (!ctx.varlen && !ctx.kvcache) kinds.insert(kinds.end(), {5, 6, 7});
  if (ctx.kvcache) kinds.insert(kinds.end(), {8, 9});
  if (ctx.varlen) kinds.insert(kinds.end(), {10, 11, 12, 13, 14, 15});
  if (ctx.fp8) kinds.push_back(16);
  std::ostringstream d;
  std::string cls;
  switch (r.pick(kinds)) {
    case 0: {
      const float v = pick_class<float>(r,
                                        {{"negative", {-1.f, -1e-30f, -FLT_MIN}},
                                         {"infinite", {inf, -inf}},
                                         {"subnormal", {1e-40f, tiny, 1e-39f, -1e-40f}},
                                         {"huge", {3e38f, FLT_MAX}}},
                                        &cls);
      o.softmax_scale = v;
      d << "opts.softmax_scale = " << fmt_float(v);
      m->kind = "opts.softmax_scale " + cls;
      m->names = {"opts.softmax_scale", "softmax_scale"};
      break;
    }
    case 1: {
      std::vector<std::pair<std::string, std::vector<float>>> classes = {{"negative", {-1.f, -1e-30f}},
                                                                         {"NaN", {nan}},
                                                                         {"infinite", {inf, -inf}},
                                                                         {"subnormal", {1e-40f, tiny, 1e-39f}},
                                                                         {"huge", {3e38f, FLT_MAX}}};
      if (!ctx.plan) classes.push_back({"so large that scale / softcap is subnormal", {1e38f, 5e37f}});
      const float v = pick_class<float>(r, classes, &cls);
      o.softcap = v;
      d << "opts.softcap = " << fmt_float(v);
      m->kind = "opts.softcap " + cls;
      m->names = {"opts.softcap", "softcap"};
      break;
    }
    case 2: {
      const int v = r.pick(std::vector<int>{-2, 2, 3, INT_MIN, INT_MAX});
      o.pack_gqa = v;
      d << "opts.pack_gqa = " << v;
      m->kind = "opts.pack_gqa out of range";
      m->names = {"opts.pack_gqa", "pack_gqa"};
      break;
    }
    case 3: {
      const int v = pick_class<int>(r, {{"negative", {-1, INT_MIN}}, {"above 256", {257, 1000000, INT_MAX}}}, &cls);
      o.num_splits = v;
      d << "opts.num_splits = " << v;
      m->kind = "opts.num_splits " + cls;
      m->names = {"opts.num_splits", "num_splits"};
      break;
    }
    case 4: {
      const int v = r.pick(std::vector<int>{-1, INT_MIN});
      o.num_sequences = v;
      d << "opts.num_sequences = " << v;
      m->kind = "opts.num_sequences negative";
      m->names = {"opts.num_sequences"};
      break;
    }
    case 5:
    case 6: {
      const bool q = r.coin();
      (q ? o.seqused_q : o.seqused_k) = fake_int(0xA000300);
      d << "opts.seqused_" << (q ? "q" : "k") << " set on a fixed-length call";
      m->kind = std::string("opts.seqused_") + (q ? "q" : "k") + " without cu_seqlens";
      m->names = {std::string("opts.seqused_") + (q ? "q" : "k")};
      break;
    }
    case 7: {
      const bool q = r.coin();
      (q ? o.cu_seqlens_q : o.cu_seqlens_k) = fake_int(0xA000000);
      o.num_sequences = 3;
      o.max_seqlen_q = o.max_seqlen_k = 128;
      d << "opts.cu_seqlens_" << (q ? "q" : "k") << " set alone";
      m->kind = "one of opts.cu_seqlens_q / opts.cu_seqlens_k";
      m->names = {"opts.cu_seqlens_q", "opts.cu_seqlens_k"};
      break;
    }
    case 8: {
      o.cu_seqlens_q = fake_int(0xA000000);
      o.cu_seqlens_k = fake_int(0xA000100);
      o.num_sequences = 2;
      o.max_seqlen_q = o.max_seqlen_k = 3;
      d << "opts.cu_seqlens_q / _k set on a KV-cache call";
      m->kind = "varlen options on a KV-cache call";
      m->names = {"opts.cu_seqlens_q", "opts.cu_seqlens_k"};
      break;
    }
    case 9: {
      const bool q = r.coin();
      (q ? o.seqused_q : o.seqused_k) = fake_int(0xA000300);
      d << "opts.seqused_" << (q ? "q" : "k") << " on a KV-cache call";
      m->kind = "opts.seqused_* on a KV-cache call";
      m->names = {std::string("opts.seqused_") + (q ? "q" : "k")};
      break;
    }
    case 10: {
      const bool q = r.coin();
      const int v = r.pick(std::vector<int>{-1, -128, INT_MIN});
      (q ? o.max_seqlen_q : o.max_seqlen_k) = v;
      d << "opts.max_seqlen_" << (q ? "q" : "k") << " = " << v;
      m->kind = std::string("opts.max_seqlen_") + (q ? "q" : "k") + " negative";
      m->names = {std::string("opts.max_seqlen_") + (q ? "q" : "k")};
      break;
    }
    case 11: {
      const bool q = r.coin();
      (q ? o.max_seqlen_q : o.max_seqlen_k) = INT_MAX;
      d << "opts.max_seqlen_" << (q ? "q" : "k") << " = INT_MAX";
      m->kind = "opts.max_seqlen_* past the int32 row limit";
      m->names = {std::string("opts.max_seqlen_") + (q ? "q" : "k")};
      break;
    }
    case 12: {
      const int v = r.pick(std::vector<int>{(1 << 30) + 1, INT_MAX, 1 << 23});
      o.num_sequences = v;
      d << "opts.num_sequences = " << v;
      m->kind = "opts.num_sequences too large";
      m->names = {"opts.num_sequences"};
      break;
    }
    case 13: {
      const int which = int(r.range(0, 3));
      const char* names[] = {"opts.cu_seqlens_q", "opts.cu_seqlens_k", "opts.seqused_q", "opts.seqused_k"};
      const int** f[] = {&o.cu_seqlens_q, &o.cu_seqlens_k, &o.seqused_q, &o.seqused_k};
      const int64_t off = r.range(1, 3);
      *f[which] = static_cast<const int*>(byte_offset(*f[which] ? *f[which] : fake_int(0xA000400), off));
      d << names[which] << " + " << off << " bytes";
      m->kind = std::string(names[which]) + " misaligned";
      m->names = {names[which]};
      break;
    }
    case 14: {
      const bool q = r.coin();
      (q ? o.cu_seqlens_q : o.cu_seqlens_k) = nullptr;
      d << "opts.cu_seqlens_" << (q ? "q" : "k") << " = null on a varlen call";
      m->kind = "one cu_seqlens null on a varlen call";
      m->names = {"opts.cu_seqlens_q", "opts.cu_seqlens_k"};
      break;
    }
    case 15: {
      const int v = r.pick(std::vector<int>{-1, INT_MIN});
      o.num_sequences = v;
      d << "opts.num_sequences = " << v << " (varlen)";
      m->kind = "opts.num_sequences negative (varlen)";
      m->names = {"opts.num_sequences"};
      break;
    }
    case 16: {
      o.softcap = 5.f;
      d << "opts.softcap = 5 with fp8_e4m3 inputs";
      m->kind = "softcap with FP8 inputs";
      m->names = {"opts.softcap", "softcap"};
      break;
    }
    default: return false;
  }
  m->detail = d.str();
  return true;
}

std::vector<std::string> with_option_names(std::vector<std::string> v) {
  for (const char* n : {"opts.softmax_scale", "opts.softcap", "opts.pack_gqa", "opts.num_splits", "opts.num_sequences",
                        "opts.cu_seqlens_q", "opts.cu_seqlens_k", "opts.seqused_q", "opts.seqused_k",
                        "opts.max_seqlen_q", "opts.max_seqlen_k"})
    v.push_back(n);
  return v;
}

std::vector<std::string> slot_names(const std::vector<Slot>& slots) {
  std::vector<std::string> v;
  for (const Slot& s : slots) v.push_back(s.name);
  return v;
}

// ---------------------------------------------------------------------------
// Valid argument sets (bases) and their slots.
// ---------------------------------------------------------------------------
enum class FwdBase { kFixed, kVarlen, kFp8 };

ForwardArgs make_forward(FwdBase b) {
  ForwardArgs a;
  if (b == FwdBase::kVarlen) {
    // Three sequences, 300 query and 500 key rows in all.
    a.q = dense(0x1000000, DType::kBFloat16, {300, 8, 64});
    a.k = dense(0x2000000, DType::kBFloat16, {500, 2, 64});
    a.v = dense(0x3000000, DType::kBFloat16, {500, 2, 64});
    a.out = dense(0x4000000, DType::kBFloat16, {300, 8, 64});
    a.lse = dense(0x5000000, DType::kFloat32, {8, 300});
    a.opts.cu_seqlens_q = fake_int(0xA000000);
    a.opts.cu_seqlens_k = fake_int(0xA000100);
    a.opts.seqused_k = fake_int(0xA000200);
    a.opts.num_sequences = 3;
    a.opts.max_seqlen_q = 128;
    a.opts.max_seqlen_k = 256;
    return a;
  }
  const DType in = b == FwdBase::kFp8 ? DType::kFloat8E4M3 : DType::kBFloat16;
  a.q = dense(0x1000000, in, {2, 128, 8, 64});
  a.k = dense(0x2000000, in, {2, 256, 2, 64});
  a.v = dense(0x3000000, in, {2, 256, 2, 64});
  a.out = dense(0x4000000, DType::kBFloat16, {2, 128, 8, 64});
  a.lse = dense(0x5000000, DType::kFloat32, {2, 8, 128});
  if (b == FwdBase::kFp8) {
    a.q_descale = dense(0x6000000, DType::kFloat32, {2, 2});  // (b, hkv)
    a.k_descale = dense(0x6000100, DType::kFloat32, {2, 2});
    a.v_descale = dense(0x6000200, DType::kFloat32, {2, 2, 2});  // blocks (b, hkv, ceil(256 / 128))
  }
  return a;
}

std::vector<Slot> forward_slots(ForwardArgs& a, FwdBase b) {
  std::vector<Slot> s = {tma_slot("q", &a.q, false), tma_slot("k", &a.k, false), tma_slot("v", &a.v, false),
                         tma_slot("out", &a.out, true), lse_slot("lse", &a.lse, true)};
  if (b == FwdBase::kFp8) {
    for (auto [name, t] : {std::pair<const char*, TensorView*>{"q_descale", &a.q_descale},
                           {"k_descale", &a.k_descale},
                           {"v_descale", &a.v_descale}}) {
      Slot d = slot(name, t, false, 4, 1, false, false);
      d.ok_ndims = {2, 3};
      s.push_back(d);
    }
  }
  return s;
}

std::vector<ArrayRef> forward_arrays(ForwardArgs& a, FwdBase b) {
  if (b != FwdBase::kVarlen) return {};
  return {{"opts.cu_seqlens_q", &a.opts.cu_seqlens_q, 16},
          {"opts.cu_seqlens_k", &a.opts.cu_seqlens_k, 16},
          {"opts.seqused_k", &a.opts.seqused_k, 12}};
}

enum class BwdBase { kFixed, kVarlen };

BackwardArgs make_backward(BwdBase b) {
  BackwardArgs a;
  if (b == BwdBase::kVarlen) {
    a.q = dense(0x1000000, DType::kBFloat16, {300, 8, 64});
    a.k = dense(0x2000000, DType::kBFloat16, {500, 2, 64});
    a.v = dense(0x3000000, DType::kBFloat16, {500, 2, 64});
    a.out = dense(0x4000000, DType::kBFloat16, {300, 8, 64});
    a.dout = dense(0x4800000, DType::kBFloat16, {300, 8, 64});
    a.lse = dense(0x5000000, DType::kFloat32, {8, 300});
    a.dlse = dense(0x5800000, DType::kFloat32, {8, 300});
    a.dq = dense(0x7000000, DType::kBFloat16, {300, 8, 64});
    a.dk = dense(0x8000000, DType::kBFloat16, {500, 2, 64});
    a.dv = dense(0x9000000, DType::kBFloat16, {500, 2, 64});
    a.opts.cu_seqlens_q = fake_int(0xA000000);
    a.opts.cu_seqlens_k = fake_int(0xA000100);
    a.opts.seqused_q = fake_int(0xA000200);
    a.opts.num_sequences = 3;
    a.opts.max_seqlen_q = 128;
    a.opts.max_seqlen_k = 256;
    return a;
  }
  a.q = dense(0x1000000, DType::kBFloat16, {2, 128, 8, 64});
  a.k = dense(0x2000000, DType::kBFloat16, {2, 256, 2, 64});
  a.v = dense(0x3000000, DType::kBFloat16, {2, 256, 2, 64});
  a.out = dense(0x4000000, DType::kBFloat16, {2, 128, 8, 64});
  a.dout = dense(0x4800000, DType::kBFloat16, {2, 128, 8, 64});
  a.lse = dense(0x5000000, DType::kFloat32, {2, 8, 128});
  a.dlse = dense(0x5800000, DType::kFloat32, {2, 8, 128});
  a.dq = dense(0x7000000, DType::kBFloat16, {2, 128, 8, 64});
  a.dk = dense(0x8000000, DType::kBFloat16, {2, 256, 2, 64});
  a.dv = dense(0x9000000, DType::kBFloat16, {2, 256, 2, 64});
  return a;
}

std::vector<Slot> backward_slots(BackwardArgs& a) {
  return {tma_slot("q", &a.q, false),       tma_slot("k", &a.k, false),       tma_slot("v", &a.v, false),
          tma_slot("out", &a.out, false),   tma_slot("dout", &a.dout, false), lse_slot("lse", &a.lse, false),
          lse_slot("dlse", &a.dlse, false), tma_slot("dq", &a.dq, true),      tma_slot("dk", &a.dk, true),
          tma_slot("dv", &a.dv, true)};
}

std::vector<ArrayRef> backward_arrays(BackwardArgs& a, BwdBase b) {
  if (b != BwdBase::kVarlen) return {};
  return {{"opts.cu_seqlens_q", &a.opts.cu_seqlens_q, 16},
          {"opts.cu_seqlens_k", &a.opts.cu_seqlens_k, 16},
          {"opts.seqused_q", &a.opts.seqused_q, 12}};
}

CombineArgs make_combine() {
  CombineArgs a;
  a.out_partial = dense(0x10000000, DType::kFloat32, {3, 2, 5, 4, 64});
  a.lse_partial = dense(0x20000000, DType::kFloat32, {3, 2, 5, 4});
  a.out = dense(0x30000000, DType::kBFloat16, {2, 5, 4, 64});
  a.lse = dense(0x40000000, DType::kFloat32, {2, 5, 4});
  return a;
}

std::vector<Slot> combine_slots(CombineArgs& a) {
  Slot out = slot("out", &a.out, true, 2, 1, true, false);
  out.ok_dtypes = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  return {slot("out_partial", &a.out_partial, false, 16, 4, true, false),
          slot("lse_partial", &a.lse_partial, false, 4, 1, false, false), out,
          slot("lse", &a.lse, true, 4, 1, false, false)};
}

enum class KvBase { kContiguous, kPaged };

// b 2, sq 3, hq 8, hkv 2, d 128; 5 new rows; rotary dim 64; contiguous: 4 cache
// entries of 256 rows with cache_batch_idx and cache_leftpad; paged: 10 pages of
// 64 rows, 4 per sequence (capacity 256).
KVCacheArgs make_kvcache(KvBase b) {
  KVCacheArgs a;
  auto t4 = [](uintptr_t p, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    return dense(p, DType::kBFloat16, {s0, s1, s2, s3});
  };
  a.q = t4(0x100000, 2, 3, 8, 128);
  a.k_cache = b == KvBase::kPaged ? t4(0x1000000, 10, 64, 2, 128) : t4(0x1000000, 4, 256, 2, 128);
  a.v_cache = b == KvBase::kPaged ? t4(0x2000000, 10, 64, 2, 128) : t4(0x2000000, 4, 256, 2, 128);
  a.k_new = t4(0x3000000, 2, 5, 2, 128);
  a.v_new = t4(0x3100000, 2, 5, 2, 128);
  a.rotary_cos = dense(0x3200000, DType::kBFloat16, {256, 32});
  a.rotary_sin = dense(0x3300000, DType::kBFloat16, {256, 32});
  a.out = t4(0x4000000, 2, 3, 8, 128);
  a.lse =
      TensorView::make3d(fake(0x5000000), DType::kFloat32, 2, 8, 3, 3, 6, 1);  // (b, hq, sq) of an (hq, b, sq) buffer
  a.cache_seqlens = fake_int(0x6000000);
  a.rotary_seqlens = fake_int(0x6000300);
  if (b == KvBase::kPaged) {
    a.page_table = fake_int(0x6000400);
    a.page_table_batch_stride = 4;
    a.page_table_max_pages = 4;
  } else {
    a.cache_batch_idx = fake_int(0x6000100);
    a.cache_leftpad = fake_int(0x6000200);
  }
  return a;
}

std::vector<Slot> kvcache_slots(KVCacheArgs& a) {
  const bool append = a.k_new.defined();
  std::vector<Slot> s = {tma_slot("q", &a.q, false),
                         tma_slot("k_cache", &a.k_cache, append),
                         tma_slot("v_cache", &a.v_cache, append),
                         tma_slot("k_new", &a.k_new, false),
                         tma_slot("v_new", &a.v_new, false),
                         tma_slot("out", &a.out, true),
                         lse_slot("lse", &a.lse, true)};
  Slot cos_table = slot("rotary_cos", &a.rotary_cos, false, 2, 1, true, false);
  cos_table.free_dim = 0;
  s.push_back(cos_table);
  s.push_back(slot("rotary_sin", &a.rotary_sin, false, 2, 1, true, false));
  return s;
}

std::vector<ArrayRef> kvcache_arrays(KVCacheArgs& a) {
  std::vector<ArrayRef> v = {{"cache_seqlens", &a.cache_seqlens, 8}, {"rotary_seqlens", &a.rotary_seqlens, 8}};
  if (a.cache_batch_idx) v.push_back({"cache_batch_idx", &a.cache_batch_idx, 8});
  if (a.cache_leftpad) v.push_back({"cache_leftpad", &a.cache_leftpad, 8});
  if (a.page_table) v.push_back({"page_table", &a.page_table, 8 * 4 * 2});
  return v;
}

enum class QBase { kGroups, kBlocks, kHadamard, kRotary };

QuantizeFp8Args make_quantize(QBase b) {
  QuantizeFp8Args a;
  a.x = dense(0x1000000, DType::kBFloat16, {2, 100, 8, 128});
  a.out = dense(0x4000000, DType::kFloat8E4M3, {2, 100, 8, 128});
  if (b == QBase::kBlocks) {
    a.block_scales = true;
    a.heads_per_scale = 1;
    a.descale = dense(0x6000000, DType::kFloat32, {2, 8, 1});
  } else {
    a.heads_per_scale = 2;
    a.descale = dense(0x6000000, DType::kFloat32, {2, 4});
  }
  if (b == QBase::kHadamard) {
    a.hadamard = true;
    a.hadamard_seed = 1234;
  }
  if (b == QBase::kRotary) {
    a.rotary_cos = dense(0x7000000, DType::kBFloat16, {100, 32});
    a.rotary_sin = dense(0x7100000, DType::kBFloat16, {100, 32});
    a.rotary_interleaved = false;
  }
  return a;
}

std::vector<Slot> quantize_slots(QuantizeFp8Args& a) {
  Slot x = slot("x", &a.x, false, 16, 8, true, false);
  if (!a.rotary_cos.defined()) x.ok_dtypes = {DType::kBFloat16, DType::kFloat16};
  Slot descale = slot("descale", &a.descale, true, 4, 1, true, false);
  descale.ok_ndims = {a.block_scales ? 3 : 2};
  std::vector<Slot> s = {x, slot("out", &a.out, true, 16, 16, true, false), descale};
  if (a.rotary_cos.defined()) {
    for (auto [name, t] :
         {std::pair<const char*, TensorView*>{"rotary_cos", &a.rotary_cos}, {"rotary_sin", &a.rotary_sin}}) {
      Slot r = slot(name, t, false, 16, 8, true, false);
      r.free_dim = 0;
      s.push_back(r);
    }
  }
  return s;
}

// ---------------------------------------------------------------------------
// C ABI conversions.
// ---------------------------------------------------------------------------
// The flash3_tensor of a view (ndim and dtype as they are, even out of range);
// false when the C struct cannot carry the view exactly.
bool to_c(const TensorView& t, flash3_tensor* c) {
  std::memset(c, 0, sizeof(*c));
  c->data = t.data;
  c->dtype = static_cast<int32_t>(t.dtype);
  c->ndim = t.ndim;
  for (int i = 0; i < 4 && i < t.ndim; ++i) {
    c->shape[i] = t.shape[i];
    c->stride[i] = t.stride[i];
  }
  return t.ndim >= 0 && t.ndim <= 4 && int(t.dtype) >= 0 && int(t.dtype) <= 3;
}

flash3_options to_c(const AttentionOptions& o) { return flash3::testutil::to_c_options(o); }

// A view's C tensor, or NULL for an undefined (absent) view.
struct CTensor {
  flash3_tensor t;
  bool present = false;
  bool exact = true;
  void set(const TensorView& v) {
    present = v.defined();
    exact = !present || to_c(v, &t);
  }
  const flash3_tensor* ptr() const { return present ? &t : nullptr; }
};

std::string last_error() { return flash3_last_error(); }

// Leaves a known message in flash3_last_error() (of another function than `fn`).
void plant_sentinel(const std::string& fn) {
  if (fn != "flash3_forward_plan") {
    (void)flash3_forward_plan(FLASH3_BF16, 1, 1, 1, 1, 1, 64, 64, nullptr, nullptr, nullptr);
  } else {
    (void)flash3_combine(nullptr, 0, nullptr, 0, 1, nullptr, nullptr, nullptr);
  }
}

// Checks a C call against the C++ oracle's status `s` (an error): the same code;
// flash3_last_error() is "<fn>: " + s.message when `exact`, else it names one of
// the corruption's arguments (or any argument of the call).
void check_c(Tally& t, const Mut& m, const Status& s, const std::string& fn, flash3_status got, bool exact,
             const std::vector<std::string>& arg_names) {
  t.call(fn);
  const std::string msg = last_error();
  const std::string prefix = fn + ": ";
  const std::string ex = m.detail + " -> C++ " + code_name(s.code) + " \"" + s.message + "\", " + fn + " " +
                         std::to_string(int(got)) + " \"" + msg + "\"";
  if (got == FLASH3_OK) {
    t.fail(m.kind + ": " + fn + " accepted", ex);
    return;
  }
  if (got != FLASH3_INVALID_ARGUMENT && got != FLASH3_NOT_SUPPORTED) {
    t.fail(m.kind + ": " + fn + " status " + std::to_string(int(got)), ex);
    return;
  }
  if (msg.compare(0, prefix.size(), prefix) != 0) {
    t.fail(m.kind + ": " + fn + " did not set flash3_last_error()", ex);
    return;
  }
  if (exact) {
    if (int(got) != int(s.code) || msg != prefix + s.message)
      t.fail(m.kind + ": " + fn + " differs from the C++ API", ex);
    return;
  }
  const std::vector<std::string>& want = m.names.empty() ? arg_names : m.names;
  if (!names_any(msg, want)) t.fail(m.kind + ": " + fn + " message does not name " + join(want), ex);
}

// ---------------------------------------------------------------------------
// Case generators per entry point: each fills a Mut and the corrupted args.
// ---------------------------------------------------------------------------
constexpr int kForwardCases = 3000;
constexpr int kBackwardCases = 2000;
constexpr int kCombineCases = 1500;
constexpr int kKVCacheCases = 3000;
constexpr int kQuantizeCases = 1500;
constexpr int kPlanCases = 800;
constexpr int kWorkspaceCases = 1500;
constexpr int kCApiCases = 3000;

struct ForwardCase {
  FwdBase base;
  ForwardArgs a;
  Mut m;
  std::vector<std::string> arg_names;
};

ForwardCase forward_case(Rng& r) {
  ForwardCase c;
  c.base = FwdBase(r.range(0, 2));
  for (;;) {
    c.a = make_forward(c.base);
    std::vector<Slot> slots = forward_slots(c.a, c.base);
    std::vector<ArrayRef> arrays = forward_arrays(c.a, c.base);
    c.arg_names = with_option_names(slot_names(slots));
    OptCtx ctx;
    ctx.varlen = c.base == FwdBase::kVarlen;
    ctx.fp8 = c.base == FwdBase::kFp8;
    const int64_t what = r.range(0, 99);
    bool ok = false;
    if (what < 55) {
      ok = mutate_random_slot(slots, r, &c.m);
    } else if (what < 75) {
      ok = mutate_options(c.a.opts, ctx, r, &c.m);
    } else if (what < 92) {
      ok = mutate_alias(slots, arrays, r, &c.m);
    } else if (c.base == FwdBase::kFixed) {
      c.a.q_descale = dense(0x6000000, DType::kFloat32, {2, 2});
      c.m = {"a descale on a 16-bit call", "q_descale given with bf16 q", {"q_descale"}};
      ok = true;
    } else if (c.base == FwdBase::kFp8) {
      c.a.opts.cu_seqlens_q = fake_int(0xA000000);
      c.a.opts.cu_seqlens_k = fake_int(0xA000100);
      c.a.opts.num_sequences = 2;
      c.a.opts.max_seqlen_q = c.a.opts.max_seqlen_k = 128;
      c.m = {"FP8 with cu_seqlens", "fp8_e4m3 q / k / v with opts.cu_seqlens_q", {"opts.cu_seqlens_q"}};
      ok = true;
    } else {
      ok = mutate_options(c.a.opts, ctx, r, &c.m);
    }
    if (ok) return c;
  }
}

struct BackwardCase {
  BwdBase base;
  BackwardArgs a;
  Mut m;
  std::vector<std::string> arg_names;
};

BackwardCase backward_case(Rng& r) {
  BackwardCase c;
  c.base = BwdBase(r.range(0, 1));
  for (;;) {
    c.a = make_backward(c.base);
    std::vector<Slot> slots = backward_slots(c.a);
    std::vector<ArrayRef> arrays = backward_arrays(c.a, c.base);
    c.arg_names = with_option_names(slot_names(slots));
    OptCtx ctx;
    ctx.varlen = c.base == BwdBase::kVarlen;
    const int64_t what = r.range(0, 99);
    bool ok = false;
    if (what < 55) {
      ok = mutate_random_slot(slots, r, &c.m);
    } else if (what < 75) {
      ok = mutate_options(c.a.opts, ctx, r, &c.m);
    } else if (what < 95) {
      ok = mutate_alias(slots, arrays, r, &c.m);
    } else {
      for (TensorView* t : {&c.a.q, &c.a.k, &c.a.v, &c.a.out, &c.a.dout, &c.a.dq, &c.a.dk, &c.a.dv})
        t->dtype = DType::kFloat8E4M3;
      c.m = {"FP8 backward", "every 16-bit tensor fp8_e4m3", {"q"}};
      ok = true;
    }
    if (ok) return c;
  }
}

struct CombineCase {
  CombineArgs a;
  Mut m;
  std::vector<std::string> arg_names;
  bool partial_dim0_or_ndim = false;  // the C ABI passes the split dimension apart
};

CombineCase combine_case(Rng& r) {
  CombineCase c;
  for (;;) {
    c.a = make_combine();
    std::vector<Slot> slots = combine_slots(c.a);
    std::vector<ArrayRef> arrays;
    c.arg_names = slot_names(slots);
    const int64_t what = r.range(0, 99);
    bool ok = false;
    if (what < 70) {
      ok = mutate_random_slot(slots, r, &c.m);
    } else if (what < 88) {
      ok = mutate_alias(slots, arrays, r, &c.m);
    } else if (what < 94) {
      const int64_t v = r.pick(std::vector<int64_t>{0, 257, 1000});
      c.a.out_partial.shape[0] = c.a.lse_partial.shape[0] = v;
      c.m = {"num_splits out of range", "out_partial / lse_partial.shape[0] = " + std::to_string(v), {"out_partial"}};
      ok = true;
    } else {
      const int64_t v = r.pick(std::vector<int64_t>{1, 2, 6, 130, 516, 1024});
      c.a.out_partial.shape[4] = c.a.out.shape[3] = v;
      c.m = {"head_dim unsupported", "out_partial.shape[4] = out.shape[3] = " + std::to_string(v), {"out_partial"}};
      ok = true;
    }
    if (!ok) continue;
    const TensorView &op = c.a.out_partial, &lp = c.a.lse_partial;
    c.partial_dim0_or_ndim = op.ndim != 5 || lp.ndim != 4 || op.shape[0] != 3 || lp.shape[0] != 3 || op.stride[0] < 0 ||
                             lp.stride[0] < 0 || op.dtype != DType::kFloat32 || lp.dtype != DType::kFloat32 ||
                             op.data == nullptr || lp.data == nullptr;
    return c;
  }
}

struct KVCacheCase {
  KvBase base;
  KVCacheArgs a;
  Mut m;
  std::vector<std::string> arg_names;
};

std::vector<std::string> kvcache_arg_names(const std::vector<Slot>& slots) {
  std::vector<std::string> v = with_option_names(slot_names(slots));
  for (const char* n : {"cache_seqlens", "cache_batch_idx", "cache_leftpad", "rotary_seqlens", "page_table",
                        "page_table_batch_stride", "page_table_max_pages"})
    v.push_back(n);
  return v;
}

bool mutate_kvcache_specific(KVCacheArgs& a, KvBase base, Rng& r, Mut* m) {
  std::vector<int> kinds = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 18, 19};
  if (base == KvBase::kPaged) kinds.insert(kinds.end(), {10, 11, 12, 13, 16, 17});
  else kinds.insert(kinds.end(), {14, 15});
  std::ostringstream d;
  switch (r.pick(kinds)) {
    case 0:
      a.cache_seqlens = nullptr;
      *m = {"append without cache_seqlens", "cache_seqlens = null with k_new", {"cache_seqlens"}};
      return true;
    case 1: {
      const char* names[] = {"cache_seqlens", "rotary_seqlens", "cache_batch_idx", "cache_leftpad", "page_table"};
      const int** f[] = {&a.cache_seqlens, &a.rotary_seqlens, &a.cache_batch_idx, &a.cache_leftpad, &a.page_table};
      std::vector<int> have;
      for (int i = 0; i < 5; ++i)
        if (*f[i] != nullptr) have.push_back(i);
      const int i = r.pick(have);
      const int64_t off = r.range(1, 3);
      *f[i] = static_cast<const int*>(byte_offset(*f[i], off));
      d << names[i] << " + " << off << " bytes";
      *m = {std::string(names[i]) + " misaligned", d.str(), {names[i]}};
      return true;
    }
    case 2:
      a.rotary_cos = a.rotary_sin = TensorView{};
      *m = {"rotary_seqlens without rotary tables", "rotary_cos / rotary_sin removed", {"rotary_seqlens"}};
      return true;
    case 3: {
      const bool k = r.coin();
      (k ? a.v_new : a.k_new) = TensorView{};
      *m = {"k_new / v_new alone", k ? "v_new removed" : "k_new removed", {"k_new", "v_new"}};
      return true;
    }
    case 4:
      a.k_new = a.v_new = TensorView{};
      *m = {"rotary without an append", "k_new / v_new removed, rotary tables kept", {"rotary_cos", "rotary_sin"}};
      return true;
    case 5: {
      const int64_t v = r.pick(std::vector<int64_t>{257, 1000, int64_t(INT32_MAX)});
      a.k_new.shape[1] = a.v_new.shape[1] = v;
      d << "k_new / v_new.shape[1] = " << v << " (capacity 256)";
      *m = {"more new rows than the cache holds", d.str(), {"k_new"}};
      return true;
    }
    case 6: {
      // The new rows are a view of the cache they are appended to.
      const bool k = r.coin();
      TensorView& nw = k ? a.k_new : a.v_new;
      const TensorView& cache = k ? a.k_cache : a.v_cache;
      nw.data = byte_offset(cache.data, 16 * r.range(0, span_bytes(cache) / 16 - 1));
      nw.stride[0] = cache.stride[0];
      nw.stride[1] = cache.stride[1];
      d << (k ? "k_new" : "v_new") << " = a view into " << (k ? "k_cache" : "v_cache");
      *m = {"new rows that are a view of the cache", d.str(), {k ? "k_new" : "v_new", k ? "k_cache" : "v_cache"}};
      return true;
    }
    case 7:
      a.v_cache = a.k_cache;
      *m = {"k_cache is v_cache with an append", "v_cache = k_cache", {"k_cache", "v_cache"}};
      return true;
    case 8:
      a.cache_batch_idx = nullptr;
      a.k_cache.shape[0] = a.v_cache.shape[0] = 1;
      if (base == KvBase::kPaged) {
        // A pool may hold fewer pages than sequences: a negative page count instead.
        a.k_cache.shape[0] = a.v_cache.shape[0] = -1;
        *m = {"negative page count", "k_cache / v_cache.shape[0] = -1", {"k_cache"}};
        return true;
      }
      *m = {"cache batch smaller than q's without cache_batch_idx", "k_cache / v_cache.shape[0] = 1", {"k_cache"}};
      return true;
    case 9: {
      const int64_t v = r.pick(std::vector<int64_t>{0, 1, 100});
      a.rotary_cos.shape[0] = a.rotary_sin.shape[0] = v;
      d << "rotary_cos / rotary_sin.shape[0] = " << v << " (capacity 256)";
      *m = {"rotary tables shorter than the cache", d.str(), {"rotary_cos"}};
      return true;
    }
    case 10: {
      const int v = r.pick(std::vector<int>{0, -1, INT_MIN});
      a.page_table_max_pages = v;
      d << "page_table_max_pages = " << v;
      *m = {"page_table_max_pages < 1", d.str(), {"page_table_max_pages"}};
      return true;
    }
    case 11: {
      const int64_t v = r.pick(std::vector<int64_t>{0, 3, -1, INT64_MIN});
      a.page_table_batch_stride = v;
      d << "page_table_batch_stride = " << v << " (max pages 4, batch 2)";
      *m = {"page_table rows overlapping", d.str(), {"page_table_batch_stride"}};
      return true;
    }
    case 12: {
      const int64_t v = r.pick(std::vector<int64_t>{int64_t(1) << 62, INT64_MAX});
      a.page_table_batch_stride = v;
      d << "page_table_batch_stride = " << v;
      *m = {"page_table_batch_stride overflowing", d.str(), {"page_table_batch_stride"}};
      return true;
    }
    case 13: {
      const int v = r.pick(std::vector<int>{1 << 26, INT_MAX});
      a.page_table_max_pages = v;
      a.page_table_batch_stride = v;
      d << "page_table_max_pages = " << v << " (x page size 64 past INT32_MAX)";
      *m = {"paged capacity past int32", d.str(), {"page_table_max_pages"}};
      return true;
    }
    case 14: {
      const int v = r.pick(std::vector<int>{1, 0});
      a.k_cache.shape[1] = a.v_cache.shape[1] = v;
      d << "seqlen_cache = " << v << " (5 new rows)";
      *m = {"cache too short for the new rows", d.str(), {"k_new", "k_cache"}};
      return true;
    }
    case 15: {
      const int v = r.pick(std::vector<int>{1, 3, -1});
      a.page_table_rows = v;
      d << "page_table_rows = " << v << " without a page table";
      *m = {"page_table_rows without page_table", d.str(), {"page_table_rows"}};
      return true;
    }
    case 16: {
      const int v = r.pick(std::vector<int>{-2, INT_MIN});
      a.page_table_rows = v;
      d << "page_table_rows = " << v;
      *m = {"page_table_rows negative", d.str(), {"page_table_rows"}};
      return true;
    }
    case 17:
      a.cache_batch_idx = fake_int(0x6000100);
      *m = {"cache_batch_idx with page_table, page_table_rows 0", "cache_batch_idx set, page_table_rows = 0",
            {"page_table_rows"}};
      return true;
    case 18:
      a.cu_seqlens_k_new = fake_int(0x6000500);  // k_new / v_new stay (b, s_new, hkv, d)
      *m = {"cu_seqlens_k_new with 4-d new rows", "cu_seqlens_k_new set, k_new 4-d", {"k_new", "cu_seqlens_k_new"}};
      return true;
    case 19:
      a.opts.cu_seqlens_q = fake_int(0xA000000);  // q / out stay (b, sq, hq, d)
      a.opts.max_seqlen_q = 3;
      a.opts.num_sequences = 2;
      *m = {"opts.cu_seqlens_q with a 4-d q", "opts.cu_seqlens_q set, q 4-d", {"q", "opts.cu_seqlens_q"}};
      return true;
  }
  return false;
}

KVCacheCase kvcache_case(Rng& r) {
  KVCacheCase c;
  c.base = KvBase(r.range(0, 1));
  for (;;) {
    c.a = make_kvcache(c.base);
    std::vector<Slot> slots = kvcache_slots(c.a);
    std::vector<ArrayRef> arrays = kvcache_arrays(c.a);
    c.arg_names = kvcache_arg_names(slots);
    OptCtx ctx;
    ctx.kvcache = true;
    const int64_t what = r.range(0, 99);
    bool ok = false;
    if (what < 45) ok = mutate_random_slot(slots, r, &c.m);
    else if (what < 60) ok = mutate_options(c.a.opts, ctx, r, &c.m);
    else if (what < 78) ok = mutate_alias(slots, arrays, r, &c.m);
    else ok = mutate_kvcache_specific(c.a, c.base, r, &c.m);
    if (ok) return c;
  }
}

struct QuantizeCase {
  QBase base;
  QuantizeFp8Args a;
  Mut m;
  std::vector<std::string> arg_names;
};

QuantizeCase quantize_case(Rng& r) {
  QuantizeCase c;
  c.base = QBase(r.range(0, 3));
  for (;;) {
    c.a = make_quantize(c.base);
    std::vector<Slot> slots = quantize_slots(c.a);
    std::vector<ArrayRef> arrays;
    c.arg_names = slot_names(slots);
    for (const char* n : {"heads_per_scale", "block_scales", "hadamard", "rotary_dim"}) c.arg_names.push_back(n);
    const int64_t what = r.range(0, 99);
    bool ok = false;
    std::ostringstream d;
    if (what < 60) {
      ok = mutate_random_slot(slots, r, &c.m);
    } else if (what < 75) {
      ok = mutate_alias(slots, arrays, r, &c.m);
    } else if (what < 83) {
      const int v = r.pick(std::vector<int>{0, -1, 3, 16, INT_MIN});
      c.a.heads_per_scale = v;
      d << "heads_per_scale = " << v << " (8 heads)";
      c.m = {"heads_per_scale not a divisor of the heads", d.str(), {"heads_per_scale"}};
      ok = true;
    } else if (what < 87 && c.base == QBase::kBlocks) {
      c.a.heads_per_scale = 2;
      c.m = {"block_scales with heads_per_scale 2", "block_scales, heads_per_scale = 2", {"heads_per_scale"}};
      ok = true;
    } else if (what < 94) {
      // head_dim: not a multiple of 8, above 256, or (with the rotation) not a power of two in [32, 256].
      std::vector<int64_t> c_d = {100, 12, 264, 1024};
      if (c.base == QBase::kHadamard) c_d.insert(c_d.end(), {96, 24, 40, 192});
      const int64_t v = r.pick(c_d);
      c.a.x.shape[3] = c.a.out.shape[3] = v;
      d << "x / out.shape[3] = " << v << (c.a.hadamard ? " with hadamard" : "");
      c.m = {"unsupported head_dim", d.str(), {"x"}};
      ok = true;
    } else if (c.base == QBase::kRotary) {
      const int k = int(r.range(0, 3));
      if (k == 0) {
        const int64_t v = r.pick(std::vector<int64_t>{4, 12, 0});
        c.a.rotary_cos.shape[1] = c.a.rotary_sin.shape[1] = v;
        d << "rotary_cos / rotary_sin.shape[1] = " << v << " (rotary_dim " << 2 * v << ")";
        c.m = {"rotary_dim not a multiple of 16", d.str(), {"rotary_cos", "rotary_dim"}};
      } else if (k == 1) {
        c.a.rotary_cos.shape[1] = c.a.rotary_sin.shape[1] = 24;
        c.m = {"half-split rotary_dim not a power of two",
               "rotary_dim 48, rotary_interleaved false",
               {"rotary_cos", "rotary_dim"}};
      } else if (k == 2) {
        c.a.rotary_cos.shape[1] = c.a.rotary_sin.shape[1] = 72;
        c.m = {"rotary_dim above head_dim", "rotary_dim 144, head_dim 128", {"rotary_cos", "rotary_dim"}};
      } else {
        const bool cos = r.coin();
        (cos ? c.a.rotary_sin : c.a.rotary_cos) = TensorView{};
        c.m = {
            "one rotary table alone", cos ? "rotary_sin removed" : "rotary_cos removed", {"rotary_cos", "rotary_sin"}};
      }
      ok = true;
    } else {
      ok = mutate_random_slot(slots, r, &c.m);
    }
    if (ok) return c;
  }
}

struct PlanArgs {
  DType dtype = DType::kBFloat16;
  int batch = 4, seqlen_q = 1, seqlen_k = 4096, heads_q = 32, heads_kv = 8, head_dim = 128, head_dim_v = 128;
  AttentionOptions opts;
  bool null_plan = false;
};

struct PlanCase {
  PlanArgs a;
  Mut m;
  std::vector<std::string> arg_names;
};

PlanCase plan_case(Rng& r) {
  PlanCase c;
  c.arg_names = with_option_names(
      {"dtype", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v", "plan"});
  for (;;) {
    c.a = PlanArgs{};
    std::ostringstream d;
    const int k = int(r.range(0, 10));
    switch (k) {
      case 0: {
        const int v = r.pick(std::vector<int>{2, 4, -1, 99});
        c.a.dtype = DType(v);
        d << "dtype = " << v;
        c.m = {"bad dtype", d.str(), {"dtype"}, v < 0 || v > 3};
        break;
      }
      case 1: {
        const char* names[] = {"batch", "seqlen_q", "seqlen_k"};
        int* f[] = {&c.a.batch, &c.a.seqlen_q, &c.a.seqlen_k};
        const int i = int(r.range(0, 2));
        const int v = r.pick(std::vector<int>{-1, INT_MIN});
        *f[i] = v;
        d << names[i] << " = " << v;
        c.m = {std::string(names[i]) + " negative", d.str(), {names[i]}};
        break;
      }
      case 2: {
        const bool q = r.coin();
        const int v = r.pick(std::vector<int>{0, -1});
        (q ? c.a.heads_q : c.a.heads_kv) = v;
        d << (q ? "heads_q" : "heads_kv") << " = " << v;
        c.m = {"heads < 1", d.str(), {q ? "heads_q" : "heads_kv"}};
        break;
      }
      case 3: {
        const int v = r.pick(std::vector<int>{3, 64, 5});
        c.a.heads_kv = v;
        d << "heads_kv = " << v << " (heads_q 32)";
        c.m = {"heads_q not a multiple of heads_kv", d.str(), {"heads_q", "heads_kv"}};
        break;
      }
      case 4: {
        const bool v_dim = r.coin();
        const int v = r.pick(std::vector<int>{0, -8, INT_MIN});
        (v_dim ? c.a.head_dim_v : c.a.head_dim) = v;
        d << (v_dim ? "head_dim_v" : "head_dim") << " = " << v;
        c.m = {"head dim < 1", d.str(), {v_dim ? "head_dim_v" : "head_dim"}};
        break;
      }
      case 5: {
        const bool v_dim = r.coin();
        const int v = r.pick(std::vector<int>{7, 12, 264, 1000});
        (v_dim ? c.a.head_dim_v : c.a.head_dim) = v;
        d << (v_dim ? "head_dim_v" : "head_dim") << " = " << v;
        c.m = {"head dim not a multiple of 8 in [8, 256]", d.str(), {v_dim ? "head_dim_v" : "head_dim"}};
        break;
      }
      case 6:
        c.a.seqlen_q = c.a.seqlen_k = INT_MAX;
        c.m = {
            "seqlen_q + seqlen_k past the int32 row limit", "seqlen_q = seqlen_k = INT_MAX", {"seqlen_q", "seqlen_k"}};
        break;
      case 7:
        c.a.null_plan = true;
        c.m = {"plan null", "plan = nullptr", {"plan", "num_splits", "pack_gqa"}};
        break;
      default: {
        OptCtx ctx;
        ctx.plan = true;
        if (!mutate_options(c.a.opts, ctx, r, &c.m)) continue;
        break;
      }
    }
    return c;
  }
}

Status call_plan(const PlanArgs& a, flash3::ForwardPlan* plan) {
  return flash3::forward_plan(a.dtype, a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim, a.head_dim_v,
                              a.opts, a.null_plan ? nullptr : plan);
}

// ---------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------
TEST_F(FuzzInputs, BasesAreValid) {
  skip_device_check(true);
  for (FwdBase b : {FwdBase::kFixed, FwdBase::kVarlen, FwdBase::kFp8})
    EXPECT_TRUE(flash3::check_forward_structure(make_forward(b)).ok())
        << int(b) << ": " << flash3::check_forward_structure(make_forward(b)).message;
  for (BwdBase b : {BwdBase::kFixed, BwdBase::kVarlen})
    EXPECT_TRUE(flash3::check_backward_structure(make_backward(b)).ok())
        << flash3::check_backward_structure(make_backward(b)).message;
  EXPECT_TRUE(flash3::check_combine_structure(make_combine()).ok())
      << flash3::check_combine_structure(make_combine()).message;
  for (KvBase b : {KvBase::kContiguous, KvBase::kPaged})
    EXPECT_TRUE(flash3::check_kvcache_structure(make_kvcache(b)).ok())
        << flash3::check_kvcache_structure(make_kvcache(b)).message;
  for (QBase b : {QBase::kGroups, QBase::kBlocks, QBase::kHadamard, QBase::kRotary})
    EXPECT_TRUE(flash3::validate_quantize_fp8(make_quantize(b)).ok())
        << int(b) << ": " << flash3::validate_quantize_fp8(make_quantize(b)).message;
  flash3::ForwardPlan plan;
  PlanArgs p;
  EXPECT_TRUE(call_plan(p, &plan).ok()) << call_plan(p, &plan).message;
}

// One entry point's fuzz: count seeded bad argument sets (make(rng) -> a
// case with .a, .m, .arg_names), each through its structure check, its
// validation and the entry point itself (run_case).
template <class Make, class Check, class Validate, class Call>
void fuzz_entry(uint64_t seed, const char* entry, int count, Make make, const char* check_name, Check check,
                const char* validate_name, Validate validate, Call call) {
  Rng r(seed);
  Tally t{entry};
  for (int i = 0; i < count; ++i) {
    auto c = make(r);
    const auto& a = c.a;
    run_case(
        t, c.m, c.arg_names, check_name, [&] { return check(a); }, validate_name, [&] { return validate(a); }, entry,
        [&] { return call(a); });
  }
  t.report();
  EXPECT_EQ(t.cases, count);
}

TEST_F(FuzzInputs, Forward) {
  fuzz_entry(
      kSeed ^ 1, "forward", kForwardCases, forward_case, "check_forward_structure",
      [](const ForwardArgs& a) { return flash3::check_forward_structure(a); }, "validate_forward",
      [](const ForwardArgs& a) { return flash3::validate_forward(a); },
      [](const ForwardArgs& a) { return flash3::forward(a, nullptr); });
}

TEST_F(FuzzInputs, Backward) {
  fuzz_entry(
      kSeed ^ 2, "backward", kBackwardCases, backward_case, "check_backward_structure",
      [](const BackwardArgs& a) { return flash3::check_backward_structure(a); }, "validate_backward",
      [](const BackwardArgs& a) { return flash3::validate_backward(a); },
      [](const BackwardArgs& a) { return flash3::backward(a, nullptr); });
}

TEST_F(FuzzInputs, Combine) {
  fuzz_entry(
      kSeed ^ 3, "combine", kCombineCases, combine_case, "check_combine_structure",
      [](const CombineArgs& a) { return flash3::check_combine_structure(a); }, "validate_combine",
      [](const CombineArgs& a) { return flash3::validate_combine(a); },
      [](const CombineArgs& a) { return flash3::combine(a, nullptr); });
}

TEST_F(FuzzInputs, KVCache) {
  fuzz_entry(
      kSeed ^ 4, "forward_kvcache", kKVCacheCases, kvcache_case, "check_kvcache_structure",
      [](const KVCacheArgs& a) { return flash3::check_kvcache_structure(a); }, "validate_kvcache",
      [](const KVCacheArgs& a) { return flash3::validate_kvcache(a); },
      [](const KVCacheArgs& a) { return flash3::forward_kvcache(a, nullptr); });
}

TEST_F(FuzzInputs, QuantizeFp8) {
  const auto validate = [](const QuantizeFp8Args& a) { return flash3::validate_quantize_fp8(a); };
  fuzz_entry(
      kSeed ^ 5, "quantize_fp8", kQuantizeCases, quantize_case, "validate_quantize_fp8", validate,
      "validate_quantize_fp8", validate, [](const QuantizeFp8Args& a) { return flash3::quantize_fp8(a, nullptr); });
}

TEST_F(FuzzInputs, ForwardPlan) {
  Rng r(kSeed ^ 6);
  Tally t{"forward_plan"};
  for (int i = 0; i < kPlanCases; ++i) {
    PlanCase c = plan_case(r);
    flash3::ForwardPlan plan;
    plan.num_splits = plan.pack_gqa = -77;
    run_case(
        t, c.m, c.arg_names, "forward_plan", [&] { return call_plan(c.a, &plan); }, "forward_plan", nullptr, nullptr,
        nullptr);
    if (!call_plan(c.a, &plan).ok() && (plan.num_splits != -77 || plan.pack_gqa != -77))
      t.fail(c.m.kind + ": plan written on an error", c.m.detail);
  }
  t.report();
  EXPECT_GE(t.total_calls(), kPlanCases);
}

// The workspace-size functions on corrupted arguments: no crash; 0 where the
// header says so (malformed KV-cache arguments; the C functions' bad
// struct_size, dtype or ndim); otherwise a size below 1 TiB (no overflow).
TEST_F(FuzzInputs, WorkspaceSizes) {
  Rng r(kSeed ^ 7);
  Tally t{"workspace sizes"};
  constexpr size_t kSane = size_t(1) << 40;
  skip_device_check(true);
  auto sane = [&](const Mut& m, const char* fn, size_t n) {
    t.call(fn);
    if (n > kSane) t.fail(m.kind + ": " + fn + " returns " + std::to_string(n), m.detail);
  };
  for (int i = 0; i < kWorkspaceCases; ++i) {
    ++t.cases;
    switch (i % 3) {
      case 0: {
        ForwardCase c = forward_case(r);
        sane(c.m, "forward_workspace_size", flash3::forward_workspace_size(c.a));
        CTensor q, k, v;
        q.set(c.a.q), k.set(c.a.k), v.set(c.a.v);
        flash3_options o = to_c(c.a.opts);
        const size_t n = flash3_forward_workspace_size(q.ptr(), k.ptr(), v.ptr(), &o);
        sane(c.m, "flash3_forward_workspace_size", n);
        if ((!q.exact || !k.exact || !v.exact) && n != 0)
          t.fail(c.m.kind + ": flash3_forward_workspace_size of a bad dtype / ndim is not 0", c.m.detail);
        o.struct_size = 3;
        t.call("flash3_forward_workspace_size");
        if (flash3_forward_workspace_size(q.ptr(), k.ptr(), v.ptr(), &o) != 0)
          t.fail("flash3_forward_workspace_size with opts->struct_size 3 is not 0", c.m.detail);
        break;
      }
      case 1: {
        BackwardCase c = backward_case(r);
        sane(c.m, "backward_workspace_size", flash3::backward_workspace_size(c.a));
        CTensor q, k, v;
        q.set(c.a.q), k.set(c.a.k), v.set(c.a.v);
        flash3_options o = to_c(c.a.opts);
        const size_t n = flash3_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), &o);
        sane(c.m, "flash3_backward_workspace_size", n);
        if ((!q.exact || !k.exact || !v.exact) && n != 0)
          t.fail(c.m.kind + ": flash3_backward_workspace_size of a bad dtype / ndim is not 0", c.m.detail);
        o.struct_size = 0;
        t.call("flash3_backward_workspace_size");
        if (flash3_backward_workspace_size(q.ptr(), k.ptr(), v.ptr(), &o) != 0)
          t.fail("flash3_backward_workspace_size with opts->struct_size 0 is not 0", c.m.detail);
        break;
      }
      default: {
        KVCacheCase c = kvcache_case(r);
        const bool rejected = !flash3::check_kvcache_structure(c.a).ok();
        const size_t n = flash3::kvcache_workspace_size(c.a);
        sane(c.m, "kvcache_workspace_size", n);
        if (rejected && n != 0)
          t.fail(c.m.kind + ": kvcache_workspace_size of rejected arguments is not 0", c.m.detail);
        break;
      }
    }
  }
  t.report();
  EXPECT_GE(t.total_calls(), kWorkspaceCases);
}

// The C ABI: the corrupted argument sets above through flash3_*, plus what only
// the C structs can get wrong (struct_size, dtype and ndim out of range, NULL
// arguments, combine's split dimension).
TEST_F(FuzzInputs, CApi) {
  Rng r(kSeed ^ 8);
  Tally t{"C ABI"};
  const std::vector<uint32_t> bad_opts_sizes = [] {
    std::vector<uint32_t> v;
    const uint32_t good = sizeof(flash3_options);
    const uint32_t pre_splits = (offsetof(flash3_options, pack_gqa) + 4 + alignof(flash3_options) - 1) /
                                alignof(flash3_options) * alignof(flash3_options);
    const uint32_t pre_pack = offsetof(flash3_options, seqused_k) + sizeof(void*);
    for (uint32_t s : {0u, 1u, 4u, 40u, good - 4, good + 4, good + 8, 0xFFFFFFFFu})
      if (s != good && s != pre_splits && s != pre_pack) v.push_back(s);
    return v;
  }();
  const std::vector<uint32_t> bad_kv_sizes = [] {
    std::vector<uint32_t> v;
    for (uint32_t s : {0u, 1u, 8u, uint32_t(sizeof(flash3_kvcache_args)) + 8, uint32_t(sizeof(flash3_kvcache_args)) - 4,
                       0xFFFFFFFFu})
      if (s != sizeof(flash3_kvcache_args) && s != offsetof(flash3_kvcache_args, page_table)) v.push_back(s);
    return v;
  }();

  int cpp_accepted = 0;  // corrupted sets the C++ oracle accepts (reported by the C++ tests)
  for (int i = 0; i < kCApiCases; ++i) {
    ++t.cases;
    skip_device_check(true);
    // C-only corruptions, applied on top of a valid argument set instead of the C++ one.
    const bool c_only = r.range(0, 99) < 30;
    switch (i % 6) {
      case 0:
      case 1: {  // forward (16-bit fixed / varlen, FP8)
        ForwardCase c = forward_case(r);
        if (c_only) {
          c.base = FwdBase(r.range(0, 2));
          c.a = make_forward(c.base);
        }
        CTensor q, k, v, out, lse, qd, kd, vd;
        auto convert = [&] {
          q.set(c.a.q), k.set(c.a.k), v.set(c.a.v), out.set(c.a.out), lse.set(c.a.lse);
          qd.set(c.a.q_descale), kd.set(c.a.k_descale), vd.set(c.a.v_descale);
        };
        convert();
        flash3_options o = to_c(c.a.opts);
        bool exact = !c.m.lossy_c;
        if (c_only) {
          const int k2 = int(r.range(0, 3));
          CTensor* ts[] = {&q, &k, &v, &out};
          const char* names[] = {"q", "k", "v", "out"};
          const int j = int(r.range(0, 3));
          if (k2 == 0) {
            o.struct_size = r.pick(bad_opts_sizes);
            c.m = {"opts->struct_size", "opts->struct_size = " + std::to_string(o.struct_size), {"opts->struct_size"}};
          } else if (k2 == 1) {
            ts[j]->t.dtype = r.pick(std::vector<int32_t>{4, -1, 1000, INT32_MIN});
            c.m = {"C dtype out of range",
                   std::string(names[j]) + ".dtype = " + std::to_string(ts[j]->t.dtype),
                   {names[j]}};
          } else if (k2 == 2) {
            ts[j]->t.ndim = r.pick(std::vector<int32_t>{5, -1, 1000, INT32_MIN});
            c.m = {
                "C ndim out of range", std::string(names[j]) + ".ndim = " + std::to_string(ts[j]->t.ndim), {names[j]}};
          } else {
            ts[j]->present = false;
            c.m = {"C NULL tensor", std::string(names[j]) + " = NULL", {names[j]}};
          }
          exact = false;
        }
        exact = exact && q.exact && k.exact && v.exact && out.exact && lse.exact && qd.exact && kd.exact && vd.exact;
        // The oracle: the C++ structure check of the same arguments; a C-only corruption is the C
        // layer's to reject (with a message of its own).
        const Status s = c_only ? Status::Invalid("(C layer)") : flash3::check_forward_structure(c.a);
        if (s.ok()) {  // the C++ oracle accepts it: FuzzInputs.Forward reports that
          ++cpp_accepted;
          break;
        }
        const Status& expect = s;
        // Descales exist only in flash3_forward_fp8 (which also takes 16-bit inputs, to reject them).
        const bool fp8 = c.base == FwdBase::kFp8 || qd.present || kd.present || vd.present;
        if (!fp8) {
          plant_sentinel("flash3_validate_forward");
          check_c(t, c.m, expect, "flash3_validate_forward",
                  flash3_validate_forward(q.ptr(), k.ptr(), v.ptr(), out.ptr(), lse.ptr(), &o), exact, c.arg_names);
        }
        skip_device_check(false);
        plant_sentinel(fp8 ? "flash3_forward_fp8" : "flash3_forward");
        if (fp8) {
          check_c(t, c.m, expect, "flash3_forward_fp8",
                  flash3_forward_fp8(q.ptr(), k.ptr(), v.ptr(), out.ptr(), lse.ptr(), qd.ptr(), kd.ptr(), vd.ptr(), &o,
                                     nullptr, 0, nullptr),
                  exact, c.arg_names);
        } else if (r.coin()) {
          check_c(t, c.m, expect, "flash3_forward",
                  flash3_forward(q.ptr(), k.ptr(), v.ptr(), out.ptr(), lse.ptr(), &o, nullptr), exact, c.arg_names);
        } else {
          check_c(
              t, c.m, expect, "flash3_forward_with_workspace",
              flash3_forward_with_workspace(q.ptr(), k.ptr(), v.ptr(), out.ptr(), lse.ptr(), &o, nullptr, 0, nullptr),
              exact, c.arg_names);
        }
        break;
      }
      case 2: {  // backward
        BackwardCase c = backward_case(r);
        if (c_only) c.a = make_backward(c.base);
        CTensor ts[10];
        TensorView* views[10] = {&c.a.q,   &c.a.k,    &c.a.v,  &c.a.out, &c.a.dout,
                                 &c.a.lse, &c.a.dlse, &c.a.dq, &c.a.dk,  &c.a.dv};
        const char* names[10] = {"q", "k", "v", "out", "dout", "lse", "dlse", "dq", "dk", "dv"};
        for (int j = 0; j < 10; ++j) ts[j].set(*views[j]);
        flash3_options o = to_c(c.a.opts);
        bool exact = !c.m.lossy_c;
        if (c_only) {
          const int j = int(r.range(0, 9));
          const int k2 = int(r.range(0, 3));
          if (k2 == 0) {
            o.struct_size = r.pick(bad_opts_sizes);
            c.m = {"opts->struct_size", "opts->struct_size = " + std::to_string(o.struct_size), {"opts->struct_size"}};
          } else if (k2 == 1) {
            ts[j].t.dtype = r.pick(std::vector<int32_t>{4, -1, 1000});
            c.m = {"C dtype out of range",
                   std::string(names[j]) + ".dtype = " + std::to_string(ts[j].t.dtype),
                   {names[j]}};
          } else if (k2 == 2) {
            ts[j].t.ndim = r.pick(std::vector<int32_t>{5, -1, 1000});
            c.m = {
                "C ndim out of range", std::string(names[j]) + ".ndim = " + std::to_string(ts[j].t.ndim), {names[j]}};
          } else {
            if (j == 6) ts[j].t.ndim = 7;  // dlse is optional: a bad rank instead
            else ts[j].present = false;
            c.m = {j == 6 ? "C ndim out of range" : "C NULL tensor", std::string(names[j]) + " = NULL", {names[j]}};
          }
          exact = false;
        }
        for (const CTensor& x : ts) exact = exact && x.exact;
        const Status s = flash3::check_backward_structure(c.a);
        if (!c_only && s.ok()) {  // the C++ oracle accepts it: the C++ test reports that
          ++cpp_accepted;
          break;
        }
        const Status expect = s.ok() ? Status::Invalid("(C layer)") : s;
        skip_device_check(false);
        plant_sentinel("flash3_backward");
        check_c(t, c.m, expect, "flash3_backward",
                flash3_backward(ts[0].ptr(), ts[1].ptr(), ts[2].ptr(), ts[3].ptr(), ts[4].ptr(), ts[5].ptr(),
                                ts[6].ptr(), ts[7].ptr(), ts[8].ptr(), ts[9].ptr(), &o, nullptr, 0, nullptr),
                exact && !s.ok(), c.arg_names);
        break;
      }
      case 3: {  // combine: the split dimension passed apart
        CombineCase c = combine_case(r);
        if (c_only) c.a = make_combine();
        const TensorView &op = c.a.out_partial, &lp = c.a.lse_partial;
        TensorView op4 = op, lp3 = lp;
        op4.ndim = op.ndim - 1;
        lp3.ndim = lp.ndim - 1;
        for (int j = 0; j + 1 < flash3::kMaxTensorDims; ++j) {
          op4.shape[j] = op.shape[j + 1], op4.stride[j] = op.stride[j + 1];
          lp3.shape[j] = lp.shape[j + 1], lp3.stride[j] = lp.stride[j + 1];
        }
        op4.shape[4] = op4.stride[4] = lp3.shape[4] = lp3.stride[4] = 0;
        CTensor cop, clp, out, lse;
        cop.set(op4), clp.set(lp3), out.set(c.a.out), lse.set(c.a.lse);
        int64_t op_split = op.stride[0], lp_split = lp.stride[0];
        int32_t splits = static_cast<int32_t>(std::clamp<int64_t>(op.shape[0], INT32_MIN, INT32_MAX));
        bool exact = !c.m.lossy_c && !c.partial_dim0_or_ndim;
        if (c_only) {
          const int k2 = int(r.range(0, 3));
          if (k2 == 0) {
            splits = r.pick(std::vector<int32_t>{0, -1, 257, INT32_MIN});
            c.m = {"C num_splits out of range", "num_splits = " + std::to_string(splits), {"num_splits"}};
          } else if (k2 == 1) {
            const bool o = r.coin();
            (o ? op_split : lp_split) = r.pick(std::vector<int64_t>{-1, -4096, INT64_MIN});
            c.m = {"C split stride negative",
                   std::string(o ? "out_partial" : "lse_partial") + "_split_stride negative",
                   {o ? "out_partial_split_stride" : "lse_partial_split_stride"}};
          } else if (k2 == 2) {
            const bool o = r.coin();
            (o ? cop : clp).present = false;
            c.m = {
                "C NULL partial", o ? "out_partial = NULL" : "lse_partial = NULL", {o ? "out_partial" : "lse_partial"}};
          } else {
            out.present = false;
            c.m = {"C NULL out", "out = NULL", {"out"}};
          }
          exact = false;
        }
        exact = exact && cop.exact && clp.exact && out.exact && lse.exact;
        if (!c_only && lp.ndim == 4 && op.ndim == 5 && lp.shape[0] != op.shape[0]) {
          --t.cases;  // flash3_combine takes one num_splits for both partials: nothing to pass
          break;
        }
        const Status s = flash3::check_combine_structure(c.a);
        if (!c_only && s.ok()) {  // the C++ oracle accepts it: the C++ test reports that
          ++cpp_accepted;
          break;
        }
        const Status expect = s.ok() ? Status::Invalid("(C layer)") : s;
        std::vector<std::string> names = c.arg_names;
        for (const char* n : {"num_splits", "out_partial_split_stride", "lse_partial_split_stride"}) names.push_back(n);
        Mut m = c.m;
        if (!exact && !c_only) m.names.clear();  // the C view of the partials differs: any argument
        skip_device_check(false);
        plant_sentinel("flash3_combine");
        check_c(t, m, expect, "flash3_combine",
                flash3_combine(cop.ptr(), op_split, clp.ptr(), lp_split, splits, out.ptr(), lse.ptr(), nullptr),
                exact && !s.ok(), names);
        break;
      }
      case 4: {  // KV cache
        KVCacheCase c = kvcache_case(r);
        if (c_only) c.a = make_kvcache(c.base);
        CTensor ts[9];
        const TensorView* views[9] = {&c.a.q,          &c.a.k_cache,    &c.a.v_cache, &c.a.k_new, &c.a.v_new,
                                      &c.a.rotary_cos, &c.a.rotary_sin, &c.a.out,     &c.a.lse};
        const char* names[9] = {"q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos", "rotary_sin", "out", "lse"};
        for (int j = 0; j < 9; ++j) ts[j].set(*views[j]);
        flash3_kvcache_args ca = flash3_default_kvcache_args();
        flash3_options o = to_c(c.a.opts);
        bool exact = !c.m.lossy_c;
        bool null_args = false;
        const int j = int(r.range(0, 8));
        if (c_only) {
          const int k2 = int(r.range(0, 4));
          if (k2 == 0) {
            o.struct_size = r.pick(bad_opts_sizes);
            c.m = {"opts->struct_size", "opts->struct_size = " + std::to_string(o.struct_size), {"opts->struct_size"}};
          } else if (k2 == 1) {
            ca.struct_size = r.pick(bad_kv_sizes);
            c.m = {"args->struct_size", "args->struct_size = " + std::to_string(ca.struct_size), {"args->struct_size"}};
          } else if (k2 == 2) {
            ts[j].t.dtype = r.pick(std::vector<int32_t>{4, -1, 1000});
            c.m = {"C dtype out of range",
                   std::string(names[j]) + ".dtype = " + std::to_string(ts[j].t.dtype),
                   {names[j]}};
          } else if (k2 == 3) {
            ts[j].t.ndim = r.pick(std::vector<int32_t>{5, -1, 1000});
            c.m = {
                "C ndim out of range", std::string(names[j]) + ".ndim = " + std::to_string(ts[j].t.ndim), {names[j]}};
          } else {
            null_args = true;
            c.m = {"C NULL args", "args = NULL", {"args"}};
          }
          exact = false;
        }
        for (const CTensor& x : ts) exact = exact && x.exact;
        ca.q = ts[0].ptr(), ca.k_cache = ts[1].ptr(), ca.v_cache = ts[2].ptr(), ca.k_new = ts[3].ptr();
        ca.v_new = ts[4].ptr(), ca.rotary_cos = ts[5].ptr(), ca.rotary_sin = ts[6].ptr(), ca.out = ts[7].ptr();
        ca.lse = ts[8].ptr();
        ca.rotary_interleaved = c.a.rotary_interleaved;
        ca.cache_seqlens = c.a.cache_seqlens, ca.cache_batch_idx = c.a.cache_batch_idx;
        ca.cache_leftpad = c.a.cache_leftpad, ca.rotary_seqlens = c.a.rotary_seqlens;
        ca.page_table = c.a.page_table, ca.page_table_batch_stride = c.a.page_table_batch_stride;
        ca.page_table_max_pages = c.a.page_table_max_pages;
        ca.page_table_rows = c.a.page_table_rows, ca.cu_seqlens_k_new = c.a.cu_seqlens_k_new;
        const Status s = flash3::check_kvcache_structure(c.a);
        if (!c_only && s.ok()) {  // the C++ oracle accepts it: the C++ test reports that
          ++cpp_accepted;
          break;
        }
        const Status expect = s.ok() ? Status::Invalid("(C layer)") : s;
        skip_device_check(false);
        plant_sentinel("flash3_forward_kvcache");
        check_c(t, c.m, expect, "flash3_forward_kvcache",
                flash3_forward_kvcache(null_args ? nullptr : &ca, &o, nullptr, 0, nullptr), exact && !s.ok(),
                c.arg_names);
        skip_device_check(true);
        t.call("flash3_kvcache_workspace_size");
        if (flash3_kvcache_workspace_size(null_args ? nullptr : &ca, &o) != 0)
          t.fail(c.m.kind + ": flash3_kvcache_workspace_size of rejected arguments is not 0", c.m.detail);
        break;
      }
      default: {  // quantize, forward_plan
        if (r.coin()) {
          QuantizeCase c = quantize_case(r);
          if (c_only) c.a = make_quantize(c.base);
          CTensor x, out, ds, rc, rs;
          x.set(c.a.x), out.set(c.a.out), ds.set(c.a.descale), rc.set(c.a.rotary_cos), rs.set(c.a.rotary_sin);
          bool exact = !c.m.lossy_c;
          if (c_only) {
            CTensor* tsq[] = {&x, &out, &ds};
            const char* names[] = {"x", "out", "descale"};
            const int j = int(r.range(0, 2));
            const int k2 = int(r.range(0, 1));
            if (k2 == 0) {
              tsq[j]->t.dtype = r.pick(std::vector<int32_t>{4, -1, 1000});
              c.m = {"C dtype out of range", std::string(names[j]) + ".dtype bad", {names[j]}};
            } else {
              tsq[j]->t.ndim = r.pick(std::vector<int32_t>{5, -1, 1000});
              c.m = {"C ndim out of range", std::string(names[j]) + ".ndim bad", {names[j]}};
            }
            exact = false;
          }
          exact = exact && x.exact && out.exact && ds.exact && rc.exact && rs.exact;
          const Status s = flash3::validate_quantize_fp8(c.a);
          if (!c_only && s.ok()) {  // the C++ oracle accepts it: the C++ test reports that
            ++cpp_accepted;
            break;
          }
          const Status expect = s.ok() ? Status::Invalid("(C layer)") : s;
          skip_device_check(false);
          const bool rotary = rc.present || rs.present || r.coin();
          const std::string fn = rotary ? "flash3_quantize_fp8_rotary" : "flash3_quantize_fp8";
          plant_sentinel(fn);
          const flash3_status got =
              rotary ? flash3_quantize_fp8_rotary(x.ptr(), out.ptr(), ds.ptr(), c.a.heads_per_scale, c.a.block_scales,
                                                  c.a.hadamard, c.a.hadamard_seed, rc.ptr(), rs.ptr(),
                                                  c.a.rotary_interleaved, nullptr)
                     : flash3_quantize_fp8(x.ptr(), out.ptr(), ds.ptr(), c.a.heads_per_scale, c.a.block_scales,
                                           c.a.hadamard, c.a.hadamard_seed, nullptr);
          check_c(t, c.m, expect, fn, got, exact && !s.ok(), c.arg_names);
        } else {
          PlanCase c = plan_case(r);
          flash3_options o = to_c(c.a.opts);
          bool exact = !c.m.lossy_c;
          if (c_only) {
            c.a = PlanArgs{};
            o = flash3_default_options();
            o.struct_size = r.pick(bad_opts_sizes);
            c.m = {"opts->struct_size", "opts->struct_size = " + std::to_string(o.struct_size), {"opts->struct_size"}};
            exact = false;
          }
          flash3::ForwardPlan plan;
          const Status s = call_plan(c.a, &plan);
          if (!c_only && s.ok()) {  // the C++ oracle accepts it: the C++ test reports that
            ++cpp_accepted;
            break;
          }
          const Status expect = s.ok() ? Status::Invalid("(C layer)") : s;
          int32_t splits = -77, pack = -77;
          plant_sentinel("flash3_forward_plan");
          const flash3_status got = flash3_forward_plan(
              int32_t(c.a.dtype), c.a.batch, c.a.seqlen_q, c.a.seqlen_k, c.a.heads_q, c.a.heads_kv, c.a.head_dim,
              c.a.head_dim_v, &o, c.a.null_plan ? nullptr : &splits, c.a.null_plan ? nullptr : &pack);
          // The C function names its outputs num_splits / pack_gqa, not plan.
          Mut m = c.m;
          if (c.a.null_plan) exact = false;
          check_c(t, m, expect, "flash3_forward_plan", got, exact && !s.ok(), c.arg_names);
          if (got != FLASH3_OK && (splits != -77 || pack != -77))
            t.fail(c.m.kind + ": flash3_forward_plan wrote its outputs on an error", c.m.detail);
        }
        break;
      }
    }
  }
  std::printf("[fuzz] C ABI: %d corrupted sets not passed to C: the C++ checks accept them (see the C++ tests)\n",
              cpp_accepted);
  t.report();
  EXPECT_GE(t.total_calls(), kCApiCases);
}

// What the header documents as valid stays valid (the fuzz's fixes must not
// reject it): any window value, a scale of 0 or any normal float, softcap 0,
// zero strides on inputs, any stride on a dimension of size 1, max_seqlen 0
// (FlashAttention-3's empty varlen batch), combine up to head_dim 512 and paged
// caches with cache_batch_idx / cache_leftpad (issue 39: FlashAttention-3
// accepts them).
TEST_F(FuzzInputs, DocumentedValuesAccepted) {
  skip_device_check(true);
  int n = 0;
  auto fwd_ok = [&](const char* what, const std::function<void(ForwardArgs&)>& edit, FwdBase b = FwdBase::kFixed) {
    ForwardArgs a = make_forward(b);
    edit(a);
    const Status s = flash3::check_forward_structure(a);
    ++n;
    EXPECT_TRUE(s.ok()) << what << ": " << s.message;
  };
  for (int w : {INT_MIN, -2, -1, 0, 1, 127, 128, 255, 256, 100000, INT_MAX})
    for (bool causal : {false, true}) {
      fwd_ok("window_left", [&](ForwardArgs& a) { a.opts.window_left = w, a.opts.causal = causal; });
      fwd_ok("window_right", [&](ForwardArgs& a) { a.opts.window_right = w, a.opts.causal = causal; });
      fwd_ok(
          "varlen window", [&](ForwardArgs& a) { a.opts.window_left = a.opts.window_right = w; }, FwdBase::kVarlen);
    }
  for (float s : {0.f, FLT_MIN, 1e-30f, 0.125f, 1.f, 1e30f, std::numeric_limits<float>::quiet_NaN()})
    fwd_ok("softmax_scale", [&](ForwardArgs& a) { a.opts.softmax_scale = s; });
  for (float s : {0.f, 0.5f, 30.f, 1e30f}) fwd_ok("softcap", [&](ForwardArgs& a) { a.opts.softcap = s; });
  for (int p : {-1, 0, 1}) fwd_ok("pack_gqa", [&](ForwardArgs& a) { a.opts.pack_gqa = p; });
  for (int s : {0, 1, 2, 256}) fwd_ok("num_splits", [&](ForwardArgs& a) { a.opts.num_splits = s; });
  fwd_ok("zero strides on an input (broadcast k)", [](ForwardArgs& a) { a.k.stride[1] = 0; });
  fwd_ok("any stride on a size-1 dimension", [](ForwardArgs& a) {
    a.q = dense(0x1000000, DType::kBFloat16, {2, 128, 1, 64});
    a.k = dense(0x2000000, DType::kBFloat16, {2, 256, 1, 64});
    a.v = dense(0x3000000, DType::kBFloat16, {2, 256, 1, 64});
    a.out = dense(0x4000000, DType::kBFloat16, {2, 128, 1, 64});
    a.lse = dense(0x5000000, DType::kFloat32, {2, 1, 128});
    a.q.stride[2] = a.out.stride[2] = -7;
    a.lse.stride[1] = 3;
  });
  fwd_ok("q, k and v overlapping (read only)", [](ForwardArgs& a) { a.k.data = a.v.data = a.q.data; });
  fwd_ok(
      "max_seqlen 0", [](ForwardArgs& a) { a.opts.max_seqlen_q = a.opts.max_seqlen_k = 0; }, FwdBase::kVarlen);
  {
    CombineArgs a = make_combine();
    a.out_partial = dense(0x10000000, DType::kFloat32, {3, 2, 5, 4, 512});
    a.out = dense(0x30000000, DType::kBFloat16, {2, 5, 4, 512});
    const Status s = flash3::check_combine_structure(a);
    ++n;
    EXPECT_TRUE(s.ok()) << "combine head_dim 512: " << s.message;
  }
  for (int which = 0; which < 2; ++which) {
    KVCacheArgs a = make_kvcache(KvBase::kPaged);
    (which == 0 ? a.cache_batch_idx : a.cache_leftpad) = fake_int(0x6000100);
    if (which == 0) a.page_table_rows = static_cast<int>(a.q.shape[0]);  // the entries cache_batch_idx picks from
    const Status s = flash3::check_kvcache_structure(a);
    ++n;
    if (!FLASH3_SERVING_WIP) {  // accepted by the build with the serving work (not yet GPU-tested)
      EXPECT_EQ(s.code, flash3::StatusCode::kNotSupported) << s.message;
      EXPECT_NE(s.message.find("FLASH3_SERVING_WIP"), std::string::npos) << s.message;
      continue;
    }
    EXPECT_TRUE(s.ok()) << "paged cache with " << (which == 0 ? "cache_batch_idx" : "cache_leftpad") << ": "
                        << s.message;
  }
  {
    KVCacheArgs a = make_kvcache(KvBase::kContiguous);
    a.k_new = a.v_new = a.rotary_cos = a.rotary_sin = TensorView{};
    a.rotary_seqlens = nullptr;
    a.v_cache = a.k_cache;  // read only: no append
    const Status s = flash3::check_kvcache_structure(a);
    ++n;
    EXPECT_TRUE(s.ok()) << "k_cache is v_cache without an append: " << s.message;
  }
  std::printf("[fuzz] documented values: %d valid argument sets checked\n", n);
}

}  // namespace
