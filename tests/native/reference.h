// [NOTE] Independent scalar references and small helpers of the native tests.
//
// None of this calls the code under test: bf16 rounding picks the nearer of the two
// neighbouring bf16 values in double arithmetic (ties to even), not the bit trick of
// bf16_scalar.h; fp16 values come from their fields in double; the int8 row quantizer (per
// row or per group of columns) is the spec of quantize_rows written out again.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/generic/bf16_scalar.h"  // f32_bits / f32_from_bits (bit casts only; the rounding here stays independent)
#include "kernels/packed_format.h"

namespace ktmoe_test {

using namespace ktmoe;

inline const char* fmt_name(WeightFormat f) {
  return f == WeightFormat::kBF16 ? "bf16" : f == WeightFormat::kINT8 ? "int8" : "int4";
}
inline const char* role_name(MatrixRole r) {
  return r == MatrixRole::kGateUp ? "gateup" : r == MatrixRole::kDown ? "down" : "plain";
}

// The accuracy bound of a format: mean|out - ref| / mean|ref| against dense fp32 (tests/helpers/__init__.py's table).
inline double format_bound(WeightFormat f) {
  return f == WeightFormat::kBF16 ? 0.01 : f == WeightFormat::kINT8 ? 0.03 : 0.15;
}
// The looser of two formats' bounds (gate/up and down packed differently).
inline double format_bound(WeightFormat a, WeightFormat b) { return std::max(format_bound(a), format_bound(b)); }

// splitmix64: the tests' one random stream (KTMOE_TEST_SEED picks another).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  double gauss() {
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

inline float bf16_value(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
// Independent RNE reference: the nearer of the two bf16 neighbours, ties to even.
inline uint16_t ref_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40u);
  if (std::isinf(f)) return uint16_t(u >> 16);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu, lo = mag & 0xFFFF0000u;
  const int expo = int(lo >> 23);
  const double ulp = std::ldexp(1.0, (expo == 0 ? 1 : expo) - 127 - 7);
  const double x = double(f32_from_bits(mag)), a = double(f32_from_bits(lo));
  const double d_lo = x - a, d_hi = a + ulp - x;
  const bool take_lo = d_lo < d_hi || (d_lo == d_hi && ((lo >> 16) & 1u) == 0);
  return uint16_t((sign | (take_lo ? lo : lo + 0x10000u)) >> 16);
}
inline float ref_bf16_value(float f) { return bf16_value(ref_bf16(f)); }

// Independent int8 quantizer of one row (spec of quantize_rows): a scale per group of
// scale_group columns (kp: one for the row), s[kp / scale_group]. A group holding a NaN or
// Inf: scale NaN, q 0 (so the token's output is non-finite).
inline void ref_quantize_groups(const float* x, int64_t k, int64_t kp, int64_t scale_group, int8_t* q, float* s) {
  for (int64_t S = 0; S < kp / scale_group; ++S) {
    const int64_t c0 = S * scale_group, c1 = std::min(k, c0 + scale_group);
    bool finite = true;
    float amax = 0.f;
    for (int64_t c = c0; c < c1; ++c) finite = finite && std::isfinite(x[c]), amax = std::max(amax, std::fabs(x[c]));
    float sg = finite ? amax / 127.f : std::numeric_limits<float>::quiet_NaN();
    if (finite && !(sg > 0.f)) sg = 1.f;
    s[S] = sg;
    for (int64_t c = c0; c < c0 + scale_group; ++c) {
      const float v = c < k && finite ? std::round(x[c] / sg) : 0.f;
      q[c] = int8_t(std::min(127.f, std::max(-127.f, v)));
    }
  }
}

// The same with one scale for the row, returned.
inline float ref_quantize_row(const float* x, int64_t k, int64_t kp, int8_t* q) {
  float s;
  ref_quantize_groups(x, k, kp, kp, q, &s);
  return s;
}

struct AlignedBytes {
  std::unique_ptr<uint8_t, void (*)(void*)> p{nullptr, std::free};
  size_t n = 0;
  explicit AlignedBytes(size_t bytes, uint8_t fill = 0) : n(bytes) {
    p.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)));
    std::memset(p.get(), fill, n);
  }
  uint8_t* get() const { return p.get(); }
};

inline double ref_silu(double g) { return g / (1.0 + std::exp(-g)); }

// The fp16 value of bits h, from its fields in double arithmetic (independent of f16_scalar.h).
inline double ref_f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(double(m), -24);
  if (e == 31) return m ? std::nan("") : sign * HUGE_VAL;
  return sign * std::ldexp(double(1024 + m), e - 25);
}

// Nearest fp16 to finite or infinite f (ties to even), by search over the 2^15 magnitudes in double.
inline uint16_t ref_f16(float f) {
  const double a = std::fabs(double(f));
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7C00;
  uint16_t lo = 0, hi = 0x7BFF;  // largest magnitude <= a, by bisection over the ordered bit patterns
  while (lo < hi) {
    const uint16_t mid = uint16_t((lo + hi + 1) / 2);
    if (ref_f16_value(mid) <= a) lo = mid; else hi = uint16_t(mid - 1);
  }
  const double below = ref_f16_value(lo), above = ref_f16_value(uint16_t(lo + 1));
  uint16_t pick = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1))) pick = uint16_t(lo + 1);
  return sign | pick;
}

}  // namespace ktmoe_test
