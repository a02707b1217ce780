// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors

#include "reference/fp8_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace flash3::ref {

namespace {

// e4m3fn: finite values are m * 2^(e - 10) for e in 1..15 (m = 8..15: normals,
// largest 15 * 2^5 = 448 once the NaN code 0x7f is excluded) and m * 2^-9 for
// m = 0..7 (subnormals). The grid spacing at |x| is 2^(floor(log2 |x|) - 3),
// never below 2^-9.
double e4m3_spacing(double a) {
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  int e;
  std::frexp(a, &e);  // a = f * 2^e with f in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 3);
}

// f(element index, descale index) over every element of t's shape.
template <class F>
void for_each_element(const Fp8Tensor& t, F&& f) {
  for (int b = 0; b < t.batch; ++b)
    for (int r = 0; r < t.seqlen; ++r)
      for (int h = 0; h < t.heads; ++h) {
        const int64_t s = t.scale_index(b, r, h), row = ((int64_t(b) * t.seqlen + r) * t.heads + h) * t.d;
        for (int c = 0; c < t.d; ++c) f(row + c, s);
      }
}

}  // namespace

double round_e4m3(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  if (a >= kE4M3Max) return std::copysign(kE4M3Max, x);
  const double step = e4m3_spacing(a);
  const double n = a / step;  // exact: step is a power of two
  double r = std::floor(n);
  const double frac = n - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  return std::copysign(std::min(r * step, kE4M3Max), x);
}

double e4m3_value(uint8_t bits) {
  const int sign = bits >> 7, exp = (bits >> 3) & 0xf, man = bits & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(double(man), -9) : std::ldexp(double(8 + man), exp - 10);
  return sign ? -mag : mag;
}

uint8_t e4m3_bits(double x) {
  if (std::isnan(x)) return 0x7f;
  const double r = round_e4m3(x);
  const uint8_t sign = std::signbit(r) ? 0x80 : 0x00;
  const double a = std::fabs(r);
  if (a < std::ldexp(1.0, -6)) return uint8_t(sign | uint8_t(std::lround(std::ldexp(a, 9))));  // subnormal (or 0)
  int e;
  const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): exponent field e - 1 + 7
  const int man = int(std::lround(f * 16.0)) - 8;
  return uint8_t(sign | uint8_t((e + 6) << 3) | uint8_t(man));
}

std::vector<int8_t> hadamard_signs(int d, uint64_t seed) {
  std::vector<int8_t> s(size_t(std::max(d, 0)));
  uint64_t state = seed;
  for (auto& v : s) {
    // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v = (z >> 63) ? int8_t(-1) : int8_t(1);
  }
  return s;
}

void hadamard_rows(const double* x, double* y, int64_t n_rows, int d, const std::vector<int8_t>& signs) {
  if (d <= 0 || (d & (d - 1)) != 0) throw std::invalid_argument("hadamard_rows: d must be a power of two");
  if (int(signs.size()) != d) throw std::invalid_argument("hadamard_rows: one sign per column");
  const double norm = 1.0 / std::sqrt(double(d));
  std::vector<double> row(static_cast<size_t>(d));
  for (int64_t r = 0; r < n_rows; ++r) {
    std::copy(x + r * d, x + (r + 1) * d, row.begin());
    // (x H)_j = sum_i x_i H_ij with Sylvester's H: butterflies over the bits of the index.
    for (int len = 1; len < d; len <<= 1) {
      for (int i = 0; i < d; i += 2 * len) {
        for (int j = i; j < i + len; ++j) {
          const double a = row[size_t(j)], b = row[size_t(j + len)];
          row[size_t(j)] = a + b;
          row[size_t(j + len)] = a - b;
        }
      }
    }
    for (int j = 0; j < d; ++j) y[r * d + j] = row[size_t(j)] * norm * double(signs[size_t(j)]);
  }
}

int64_t Fp8Tensor::scale_index(int b, int row, int h) const {
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      return 0;
    case Fp8Scaling::kPerHead:
      return int64_t(b) * (heads / heads_per_scale) + h / heads_per_scale;
    case Fp8Scaling::kPerBlock:
    default: {
      const int blocks = (seqlen + block_rows - 1) / block_rows;
      return (int64_t(b) * (heads / heads_per_scale) + h / heads_per_scale) * blocks + row / block_rows;
    }
  }
}

double Fp8Tensor::value(int b, int row, int h, int c) const {
  const int64_t i = ((int64_t(b) * seqlen + row) * heads + h) * d + c;
  return x8[size_t(i)] * descale[size_t(scale_index(b, row, h))];
}

std::vector<double> Fp8Tensor::dequantized() const {
  std::vector<double> out(x8.size());
  for_each_element(*this, [&](int64_t i, int64_t s) { out[size_t(i)] = x8[size_t(i)] * descale[size_t(s)]; });
  return out;
}

Fp8Tensor quantize_e4m3(const double* x, int batch, int seqlen, int heads, int d, Fp8Scaling scaling,
                        int heads_per_scale, int block_rows) {
  if (heads_per_scale < 1 || heads % heads_per_scale != 0)
    throw std::invalid_argument("quantize_e4m3: heads_per_scale must divide heads");
  if (scaling == Fp8Scaling::kPerBlock && block_rows < 1)
    throw std::invalid_argument("quantize_e4m3: kPerBlock needs block_rows >= 1");
  Fp8Tensor t{batch, seqlen, heads, d, scaling, heads_per_scale, block_rows, {}, {}};
  const int groups = heads / heads_per_scale;
  const int blocks = scaling == Fp8Scaling::kPerBlock ? (seqlen + block_rows - 1) / block_rows : 1;
  const size_t n_scales = scaling == Fp8Scaling::kPerTensor ? 1 : size_t(batch) * groups * blocks;
  std::vector<double> amax(n_scales, 0.0);
  const size_t n = size_t(batch) * seqlen * heads * d;
  for_each_element(t, [&](int64_t i, int64_t s) { amax[size_t(s)] = std::max(amax[size_t(s)], std::fabs(x[i])); });
  t.descale.resize(n_scales);
  for (size_t s = 0; s < n_scales; ++s) t.descale[s] = amax[s] > 0 ? amax[s] / kE4M3Max : 1.0;
  t.x8.resize(n);
  for_each_element(t, [&](int64_t i, int64_t s) { t.x8[size_t(i)] = round_e4m3(x[i] / t.descale[size_t(s)]); });
  return t;
}

void forward_fp8_plain(const Problem& p, const Options& o, const Fp8Tensor& q, const Fp8Tensor& k,
                       const Fp8Tensor& v, double* out, double* lse) {
  if (p.varlen()) throw std::invalid_argument("forward_fp8_plain: fixed length only");
  const int d = p.head_dim, dv = p.head_dim_v, group = p.heads_q / p.heads_kv;
  const double scale = std::isnan(o.softmax_scale) ? 1.0 / std::sqrt(double(d)) : o.softmax_scale;
  const float cap = float(o.softcap);
  const int sq = p.seqlen_q, sk = p.seqlen_k;
  const double kPScale = std::ldexp(1.0, kFp8PScaleLog2);
  std::vector<float> s(size_t(std::max(sk, 1)));
  std::vector<char> seen(size_t(std::max(sk, 1)));
  std::vector<float> acc(size_t(std::max(dv, 1)));
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads_q; ++h) {
      const int kh = h / group;
      for (int i = 0; i < sq; ++i) {
        double* o_i = out + ((int64_t(b) * sq + i) * p.heads_q + h) * dv;
        const size_t qi = size_t(((int64_t(b) * sq + i) * p.heads_q + h) * d);
        const float dq = float(q.descale[size_t(q.scale_index(b, i, h))]);
        float m = -std::numeric_limits<float>::infinity();
        bool any = false;
        for (int j = 0; j < sk; ++j) {
          seen[size_t(j)] = visible(o, i, j, sq, sk);
          if (!seen[size_t(j)]) continue;
          any = true;
          const size_t kj = size_t(((int64_t(b) * sk + j) * p.heads_kv + kh) * d);
          float a = 0.f;  // products of two e4m3 values are exact in fp32
          for (int c = 0; c < d; ++c) a += float(q.x8[qi + size_t(c)] * k.x8[kj + size_t(c)]);
          const float dk = float(k.descale[size_t(k.scale_index(b, j, kh))]);
          float sj = a * (dq * dk) * float(scale);
          if (cap > 0) sj = cap * std::tanh(sj / cap);
          s[size_t(j)] = sj;
          m = std::max(m, sj);
        }
        double* l_i = lse ? lse + lse_index(p, b, h, i) : nullptr;
        if (!any) {
          std::fill(o_i, o_i + dv, 0.0);
          if (l_i) *l_i = -std::numeric_limits<double>::infinity();
          continue;
        }
        float sum = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int j = 0; j < sk; ++j) {
          if (!seen[size_t(j)]) continue;
          const float pj = std::exp(s[size_t(j)] - m);
          sum += pj;
          const float p8 = float(round_e4m3(double(pj) * kPScale)) / float(kPScale);
          const size_t vj = size_t(((int64_t(b) * sk + j) * p.heads_kv + kh) * dv);
          const float dvs = float(v.descale[size_t(v.scale_index(b, j, kh))]);
          for (int c = 0; c < dv; ++c) acc[size_t(c)] += p8 * float(v.x8[vj + size_t(c)]) * dvs;
        }
        for (int c = 0; c < dv; ++c) o_i[c] = double(acc[size_t(c)] / sum);
        if (l_i) *l_i = double(m) + std::log(double(sum));
      }
    }
  }
}

}  // namespace flash3::ref
