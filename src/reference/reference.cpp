// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// float64 CPU reference for attention (see reference.h for layouts and semantics).
#include "reference/reference.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

namespace flash3::ref {

// ---------------------------------------------------------------------------
// Problem geometry.
// ---------------------------------------------------------------------------
int Problem::seqlen_q_of(int b) const {
  return varlen() ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q;
}
int Problem::seqlen_k_of(int b) const {
  return varlen() ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k;
}
int64_t Problem::q_offset(int b) const {
  return varlen() ? int64_t(cu_seqlens_q[b]) : int64_t(b) * seqlen_q;
}
int64_t Problem::k_offset(int b) const {
  return varlen() ? int64_t(cu_seqlens_k[b]) : int64_t(b) * seqlen_k;
}
int64_t Problem::total_q() const {
  return varlen() ? int64_t(cu_seqlens_q[batch]) : int64_t(batch) * seqlen_q;
}
int64_t Problem::total_k() const {
  return varlen() ? int64_t(cu_seqlens_k[batch]) : int64_t(batch) * seqlen_k;
}

int64_t lse_index(const Problem& p, int b, int h, int i) {
  if (p.varlen()) return int64_t(h) * p.total_q() + p.q_offset(b) + i;
  return (int64_t(b) * p.heads_q + h) * p.seqlen_q + i;
}

bool visible(const Options& o, int i, int j, int sq, int sk) {
  if (j < 0 || j >= sk || i < 0 || i >= sq) return false;
  const int wl = o.window_left;
  const int wr = o.causal ? 0 : o.window_right;
  const int64_t diag = int64_t(i) + sk - sq;  // key aligned with query i (bottom-right)
  if (wl >= 0 && int64_t(j) < diag - wl) return false;
  if (wr >= 0 && int64_t(j) > diag + wr) return false;
  return true;
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double scale_of(const Problem& p, const Options& o) {
  return std::isnan(o.softmax_scale) ? 1.0 / std::sqrt(double(p.head_dim)) : o.softmax_scale;
}

// Range of visible keys [lo, hi) for query i: the mask is an interval.
void key_range(const Options& o, int i, int sq, int sk, int* lo, int* hi) {
  const int wl = o.window_left;
  const int wr = o.causal ? 0 : o.window_right;
  const int64_t diag = int64_t(i) + sk - sq;
  int64_t l = 0, h = sk;
  if (wl >= 0) l = std::max<int64_t>(l, diag - wl);
  if (wr >= 0) h = std::min<int64_t>(h, diag + wr + 1);
  if (h < l) h = l;
  *lo = int(std::min<int64_t>(l, sk));
  *hi = int(std::max<int64_t>(std::min<int64_t>(h, sk), *lo));
}

// Range of queries [lo, hi) that see key j (the transpose of key_range).
void query_range(const Options& o, int j, int sq, int sk, int* lo, int* hi) {
  const int wl = o.window_left;
  const int wr = o.causal ? 0 : o.window_right;
  const int64_t shift = int64_t(sk) - sq;  // query i is aligned with key i + shift
  int64_t l = 0, h = sq;
  if (wr >= 0) l = std::max<int64_t>(l, j - shift - wr);
  if (wl >= 0) h = std::min<int64_t>(h, j - shift + wl + 1);
  l = std::min<int64_t>(l, sq);
  *lo = int(l);
  *hi = int(std::max<int64_t>(h, l));
}

// A unit of work: rows [r0, r1) of head h of sequence b (or keys, for the dK/dV pass).
struct Task {
  int b, h, r0, r1;
};

constexpr int kChunk = 32;

std::vector<Task> make_tasks(const Problem& p, int heads, bool over_keys) {
  std::vector<Task> t;
  for (int b = 0; b < p.batch; ++b) {
    const int n = over_keys ? p.seqlen_k_of(b) : p.seqlen_q_of(b);
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < n; r += kChunk) t.push_back({b, h, r, std::min(n, r + kChunk)});
  }
  return t;
}

// Runs fn(task) for every task, over hardware_concurrency() threads when the
// work is large enough to amortise starting them.
void parallel_for(const std::vector<Task>& tasks, double work, const std::function<void(const Task&)>& fn) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  size_t nthreads = std::min<size_t>(hw, tasks.size());
  if (work < 2e5) nthreads = 1;
  if (nthreads <= 1) {
    for (const Task& t : tasks) fn(t);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < tasks.size(); i = next.fetch_add(1)) fn(tasks[i]);
  };
  std::vector<std::thread> pool;
  pool.reserve(nthreads - 1);
  for (size_t i = 0; i + 1 < nthreads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

inline double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

struct Geo {
  const Problem& p;
  int group;  // query heads per kv head
  const double* qrow(const double* q, int b, int h, int i) const {
    return q + ((p.q_offset(b) + i) * p.heads_q + h) * int64_t(p.head_dim);
  }
  const double* krow(const double* k, int b, int kh, int j) const {
    return k + ((p.k_offset(b) + j) * p.heads_kv + kh) * int64_t(p.head_dim);
  }
  const double* vrow(const double* v, int b, int kh, int j) const {
    return v + ((p.k_offset(b) + j) * p.heads_kv + kh) * int64_t(p.head_dim_v);
  }
  int64_t orow(int b, int h, int i) const { return ((p.q_offset(b) + i) * p.heads_q + h) * int64_t(p.head_dim_v); }
};

Geo make_geo(const Problem& p) {
  assert(p.heads_kv > 0 && p.heads_q % p.heads_kv == 0);
  assert(!p.varlen() || (int(p.cu_seqlens_q.size()) == p.batch + 1 && int(p.cu_seqlens_k.size()) == p.batch + 1));
  return Geo{p, p.heads_q / p.heads_kv};
}

double total_work(const Problem& p) {
  double sq = double(p.total_q()), sk = double(p.total_k());
  double per_b = p.batch > 0 ? sq * sk / p.batch : 0;  // rough
  return per_b * p.heads_q * (p.head_dim + p.head_dim_v);
}

// Scaled (and soft-capped) score; tanh_out gets tanh(z / softcap) when capping.
inline double score(double dotqk, double scale, double softcap, double* tanh_out) {
  double z = dotqk * scale;
  if (softcap > 0) {
    double t = std::tanh(z / softcap);
    if (tanh_out) *tanh_out = t;
    return softcap * t;
  }
  if (tanh_out) *tanh_out = 0;
  return z;
}

}  // namespace

// ---------------------------------------------------------------------------
// Forward.
// ---------------------------------------------------------------------------
void forward(const Problem& p, const Options& o, const double* q, const double* k, const double* v,
             double* out, double* lse) {
  const Geo g = make_geo(p);
  const double scale = scale_of(p, o);
  const int d = p.head_dim, dv = p.head_dim_v;
  auto tasks = make_tasks(p, p.heads_q, false);
  parallel_for(tasks, total_work(p), [&](const Task& t) {
    const int sq = p.seqlen_q_of(t.b), sk = p.seqlen_k_of(t.b);
    const int kh = t.h / g.group;
    std::vector<double> s(size_t(std::max(sk, 1)));
    for (int i = t.r0; i < t.r1; ++i) {
      double* o_i = out + g.orow(t.b, t.h, i);
      std::fill(o_i, o_i + dv, 0.0);
      double* l_i = lse ? lse + lse_index(p, t.b, t.h, i) : nullptr;
      int lo, hi;
      key_range(o, i, sq, sk, &lo, &hi);
      if (hi <= lo) {
        if (l_i) *l_i = kNegInf;
        continue;
      }
      const double* q_i = g.qrow(q, t.b, t.h, i);
      double m = kNegInf;
      for (int j = lo; j < hi; ++j) {
        s[j] = score(dot(q_i, g.krow(k, t.b, kh, j), d), scale, o.softcap, nullptr);
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int j = lo; j < hi; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      const double inv = 1.0 / sum;
      for (int j = lo; j < hi; ++j) {
        const double pj = s[j] * inv;
        const double* v_j = g.vrow(v, t.b, kh, j);
        for (int x = 0; x < dv; ++x) o_i[x] += pj * v_j[x];
      }
      if (l_i) *l_i = m + std::log(sum);
    }
  });
}

// ---------------------------------------------------------------------------
// Backward: recomputes O/LSE, then a row pass for dQ and a key pass for dK/dV
// (both race-free, so both parallelise over chunks).
// ---------------------------------------------------------------------------
void backward(const Problem& p, const Options& o, const double* q, const double* k, const double* v,
              const double* dout, const double* dlse, double* dq, double* dk, double* dv_out) {
  const Geo g = make_geo(p);
  const double scale = scale_of(p, o);
  const int d = p.head_dim, dv = p.head_dim_v;
  const double cap = o.softcap;

  std::vector<double> out(p.o_elems()), lse(p.lse_elems()), delta(p.lse_elems());
  forward(p, o, q, k, v, out.data(), lse.data());
  // D_i = rowsum(dO * O) (= sum_j P_ij dP_ij).
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h)
      for (int i = 0; i < p.seqlen_q_of(b); ++i) {
        const int64_t r = g.orow(b, h, i);
        delta[lse_index(p, b, h, i)] = dot(dout + r, out.data() + r, dv);
      }

  // dS_ij -> derivative w.r.t. the pre-cap scaled score z_ij = scale * q.k
  // (multiplied by scale by the callers).
  auto dz = [&](int b, int h, int i, double qk, const double* v_j) {
    const int64_t li = lse_index(p, b, h, i);
    double th;
    const double s = score(qk, scale, cap, &th);
    const double pij = std::exp(s - lse[li]);
    const double dpij = dot(dout + g.orow(b, h, i), v_j, dv);
    double ds = pij * (dpij - delta[li] + (dlse ? dlse[li] : 0.0));
    if (cap > 0) ds *= 1.0 - th * th;
    return std::pair<double, double>(ds, pij);
  };

  const double work = total_work(p);
  // dQ.
  auto qtasks = make_tasks(p, p.heads_q, false);
  parallel_for(qtasks, work, [&](const Task& t) {
    const int sq = p.seqlen_q_of(t.b), sk = p.seqlen_k_of(t.b);
    const int kh = t.h / g.group;
    for (int i = t.r0; i < t.r1; ++i) {
      double* dq_i = dq + ((p.q_offset(t.b) + i) * p.heads_q + t.h) * int64_t(d);
      std::fill(dq_i, dq_i + d, 0.0);
      int lo, hi;
      key_range(o, i, sq, sk, &lo, &hi);
      if (hi <= lo) continue;
      const double* q_i = g.qrow(q, t.b, t.h, i);
      for (int j = lo; j < hi; ++j) {
        const double* k_j = g.krow(k, t.b, kh, j);
        const double c = dz(t.b, t.h, i, dot(q_i, k_j, d), g.vrow(v, t.b, kh, j)).first * scale;
        for (int x = 0; x < d; ++x) dq_i[x] += c * k_j[x];
      }
    }
  });
  // dK, dV (summed over the query heads of each kv head).
  auto ktasks = make_tasks(p, p.heads_kv, true);
  parallel_for(ktasks, work, [&](const Task& t) {
    const int sq = p.seqlen_q_of(t.b), sk = p.seqlen_k_of(t.b);
    const int kh = t.h;
    for (int j = t.r0; j < t.r1; ++j) {
      const int64_t kr = (p.k_offset(t.b) + j) * p.heads_kv + kh;
      double* dk_j = dk + kr * d;
      double* dv_j = dv_out + kr * dv;
      std::fill(dk_j, dk_j + d, 0.0);
      std::fill(dv_j, dv_j + dv, 0.0);
      const double* k_j = g.krow(k, t.b, kh, j);
      const double* v_j = g.vrow(v, t.b, kh, j);
      for (int h = kh * g.group; h < (kh + 1) * g.group; ++h) {
        int ilo, ihi;
        query_range(o, j, sq, sk, &ilo, &ihi);
        for (int i = ilo; i < ihi; ++i) {
          const double* q_i = g.qrow(q, t.b, h, i);
          auto [ds, pij] = dz(t.b, h, i, dot(q_i, k_j, d), v_j);
          const double c = ds * scale;
          for (int x = 0; x < d; ++x) dk_j[x] += c * q_i[x];
          const double* do_i = dout + g.orow(t.b, h, i);
          for (int x = 0; x < dv; ++x) dv_j[x] += pij * do_i[x];
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Rounding.
// ---------------------------------------------------------------------------
namespace {
// Round to a binary format with `prec` significant bits (implicit bit included),
// minimum normal exponent emin and maximum exponent emax; round-to-nearest-even,
// gradual underflow, overflow to +-inf.
double round_format(double x, int prec, int emin, int emax) {
  if (!std::isfinite(x) || x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1): unit exponent is e - 1
  const int ue = std::max(e - 1, emin);
  const double ulp = std::ldexp(1.0, ue - (prec - 1));
  // x / ulp is exact (power-of-two scaling); nearbyint rounds half to even under
  // the default rounding mode.
  double r = std::nearbyint(x / ulp) * ulp;
  const double maxv = std::ldexp(2.0 - std::ldexp(1.0, 1 - prec), emax);
  if (std::fabs(r) > maxv) r = std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}
}  // namespace

double round_bf16(double x) { return round_format(x, 8, -126, 127); }
double round_fp16(double x) { return round_format(x, 11, -14, 15); }
double round_to(LowPrecision t, double x) {
  return t == LowPrecision::kBFloat16 ? round_bf16(x) : round_fp16(x);
}

// ---------------------------------------------------------------------------
// Low-precision "plain implementation" forward.
// ---------------------------------------------------------------------------
void forward_lowp(LowPrecision tp, const Problem& p, const Options& o, const double* q, const double* k,
                  const double* v, double* out, double* lse) {
  const Geo g = make_geo(p);
  const float scale = float(scale_of(p, o));
  const float cap = float(o.softcap);
  const int d = p.head_dim, dv = p.head_dim_v;
  auto rt = [tp](float x) { return float(round_to(tp, double(x))); };
  auto tasks = make_tasks(p, p.heads_q, false);
  parallel_for(tasks, total_work(p), [&](const Task& t) {
    const int sq = p.seqlen_q_of(t.b), sk = p.seqlen_k_of(t.b);
    const int kh = t.h / g.group;
    std::vector<float> s(size_t(std::max(sk, 1)));
    std::vector<float> acc(size_t(std::max(dv, 1)));
    for (int i = t.r0; i < t.r1; ++i) {
      double* o_i = out + g.orow(t.b, t.h, i);
      std::fill(o_i, o_i + dv, 0.0);
      double* l_i = lse ? lse + lse_index(p, t.b, t.h, i) : nullptr;
      int lo, hi;
      key_range(o, i, sq, sk, &lo, &hi);
      if (hi <= lo) {
        if (l_i) *l_i = kNegInf;
        continue;
      }
      const double* q_i = g.qrow(q, t.b, t.h, i);
      float m = -std::numeric_limits<float>::infinity();
      for (int j = lo; j < hi; ++j) {
        const double* k_j = g.krow(k, t.b, kh, j);
        float a = 0.f;  // fp32 accumulation of the (exactly representable) products
        for (int x = 0; x < d; ++x) a += float(q_i[x] * k_j[x]);
        float sj = rt(a * scale);  // scaled scores materialised in t
        if (cap > 0) sj = rt(cap * std::tanh(sj / cap));
        s[j] = sj;
        m = std::max(m, sj);
      }
      float sum = 0.f;
      for (int j = lo; j < hi; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int j = lo; j < hi; ++j) {
        const float pj = rt(s[j] / sum);
        const double* v_j = g.vrow(v, t.b, kh, j);
        for (int x = 0; x < dv; ++x) acc[x] += pj * float(v_j[x]);
      }
      for (int x = 0; x < dv; ++x) o_i[x] = double(rt(acc[x]));
      if (l_i) *l_i = double(m + std::log(sum));
    }
  });
}

// ---------------------------------------------------------------------------
// Tolerance rule.
// ---------------------------------------------------------------------------
CloseResult check_close(const double* ours, const double* ref, const double* lowp, size_t n, double eps,
                        double factor) {
  CloseResult r;
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    const double y = ours[i], x = ref[i];
    if (std::isnan(y)) {
      ++r.nan_count;
    } else {
      double e;
      if (std::isinf(x) || std::isnan(x))
        e = (y == x) ? 0.0 : inf;
      else
        e = std::fabs(y - x);  // inf when ours is inf
      r.err = std::max(r.err, e);
    }
    if (lowp) {
      const double l = lowp[i];
      if (std::isnan(l)) continue;  // a NaN baseline says nothing; ignored
      double e;
      if (std::isinf(x) || std::isnan(x))
        e = (l == x) ? 0.0 : inf;
      else
        e = std::fabs(l - x);
      r.base_err = std::max(r.base_err, e);
    }
  }
  r.bound = factor * r.base_err + eps;
  r.ok = r.nan_count == 0 && r.err <= r.bound;
  return r;
}

}  // namespace flash3::ref
