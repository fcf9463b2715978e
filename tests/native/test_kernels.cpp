// [NOTE] Torch-free tests of the packed format, of every ISA micro-kernel table
// the CPU can run, and of the MoE driver. Built and run by
// tests/test_native_kernels.py; prints one line per check and a final
// "N passed, M failed" line; exit status 1 if anything failed.
//
// The references here are independent of the code under test:
//   * bf16 rounding: chooses the nearer of the two neighbouring bf16 values in
//     double arithmetic (ties to even), not the bit trick of bf16_scalar.h;
//   * packed weights are decoded by the byte-offset formulas of packed_format.h
//     (never by the packer's or kernels' code), which also checks every byte that
//     no formula covers is zero;
//   * gemm results are recomputed in double from the decoded weights and the
//     exact int8 activations (tight tolerances: integer parts must match) and from
//     the dense fp32 weights (accuracy metric of each format);
//   * the driver is compared with a double-precision emulation of the same
//     pipeline (tight) and with the dense fp32 MoE (accuracy metric), and its
//     bits must not depend on the ParallelFor partition.
// ISAs come from kernels/isa_select.h, as in the extension: one the CPU lacks, or
// whose table has null entries (being written), is reported "skipped: <why>".
// `test_kernels --accuracy E H I K T` runs only the accuracy metric at that shape;
// KTMOE_TEST_SEED=n runs the same checks on other random data.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_features.h"
#include "kernels/isa_kernels.h"
#include "kernels/isa_select.h"
#include "kernels/moe_driver.h"
#include "kernels/pack.h"
#include "kernels/packed_format.h"

using namespace ktmoe;

namespace {

// ---------------------------------------------------------------- reporting
int g_passed = 0, g_failed = 0, g_skipped = 0;

std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  (ok ? g_passed : g_failed)++;
}

void skip(const std::string& what) {
  std::printf("SKIP %s\n", what.c_str());
  ++g_skipped;
}

const char* fmt_name(WeightFormat f) {
  return f == WeightFormat::kBF16 ? "bf16" : f == WeightFormat::kINT8 ? "int8" : "int4";
}
const char* role_name(MatrixRole r) {
  return r == MatrixRole::kGateUp ? "gateup" : r == MatrixRole::kDown ? "down" : "plain";
}

// ---------------------------------------------------------------- helpers
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

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float bf16_value(uint16_t h) { return float_of(uint32_t(h) << 16); }

// Independent RNE reference: the nearer of the two bf16 neighbours, ties to even.
uint16_t ref_bf16(float f) {
  const uint32_t u = bits_of(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40u);
  if (std::isinf(f)) return uint16_t(u >> 16);
  const uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu, lo = mag & 0xFFFF0000u;
  const int expo = int(lo >> 23);
  const double ulp = std::ldexp(1.0, (expo == 0 ? 1 : expo) - 127 - 7);
  const double x = double(float_of(mag)), a = double(float_of(lo));
  const double d_lo = x - a, d_hi = a + ulp - x;
  const bool take_lo = d_lo < d_hi || (d_lo == d_hi && ((lo >> 16) & 1u) == 0);
  return uint16_t((sign | (take_lo ? lo : lo + 0x10000u)) >> 16);
}
float ref_bf16_value(float f) { return bf16_value(ref_bf16(f)); }

// Independent int8 row quantizer (spec of quantize_rows). A row holding a NaN
// or Inf: scale NaN, q 0 (so the token's output is non-finite).
float ref_quantize_row(const float* x, int64_t k, int64_t kp, int8_t* q) {
  bool finite = true;
  for (int64_t c = 0; c < k; ++c) finite = finite && std::isfinite(x[c]);
  if (!finite) {
    for (int64_t c = 0; c < kp; ++c) q[c] = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  float amax = 0.f;
  for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x[c]));
  float s = amax / 127.f;
  if (!(s > 0.f)) s = 1.f;
  for (int64_t c = 0; c < kp; ++c) {
    float v = c < k ? std::round(x[c] / s) : 0.f;
    q[c] = int8_t(std::min(127.f, std::max(-127.f, v)));
  }
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

double ref_silu(double g) { return g / (1.0 + std::exp(-g)); }

// ---------------------------------------------------------------- decoding packed blobs
// Values by *packed* row pr (np rows) and column c (kp columns), read with the
// byte-offset formulas of packed_format.h; `touched` marks every byte read.
struct Decoded {
  PackedMatrixHeader h{};
  int64_t n = 0, k = 0, np = 0, kp = 0, g = 0, ng = 0;
  WeightFormat f = WeightFormat::kBF16;
  std::vector<int64_t> packed_of;   // logical row -> packed row
  std::vector<int64_t> logical_of;  // packed row -> logical row or -1
  std::vector<double> w;            // [np][kp] dequantized
  std::vector<int32_t> wi;          // [np][kp] int8: u - 128, int4: q
  std::vector<uint16_t> wb;         // [np][kp] bf16 bits
  std::vector<float> s;             // int8 [np]
  std::vector<float> d, lo;         // int4 [np][ng]
  std::vector<uint8_t> touched;     // [total_bytes]
};

int64_t ref_packed_row(const PackedMatrixHeader& h, int64_t r) {
  if (h.role != uint8_t(MatrixRole::kGateUp)) return r;
  const int64_t inter = h.n / 2;
  if (r < inter) return 32 * (r / 16) + r % 16;
  r -= inter;
  return 32 * (r / 16) + 16 + r % 16;
}

Decoded decode(const uint8_t* blob) {
  Decoded D;
  std::memcpy(&D.h, blob, sizeof(D.h));
  const auto& h = D.h;
  D.n = h.n, D.k = h.k, D.np = h.np, D.kp = h.kp, D.f = WeightFormat(h.format);
  D.g = D.f == WeightFormat::kBF16 ? 0 : h.group;
  D.ng = D.g ? D.kp / D.g : 0;
  D.touched.assign(size_t(h.total_bytes), 0);
  for (int i = 0; i < 64; ++i) D.touched[i] = 1;
  D.packed_of.resize(size_t(D.n));
  D.logical_of.assign(size_t(D.np), -1);
  for (int64_t r = 0; r < D.n; ++r) {
    D.packed_of[r] = ref_packed_row(h, r);
    D.logical_of[D.packed_of[r]] = r;
  }
  D.w.assign(size_t(D.np * D.kp), 0.0);
  D.wi.assign(size_t(D.np * D.kp), 0);
  D.wb.assign(size_t(D.np * D.kp), 0);
  D.s.assign(size_t(D.np), 0.f);
  D.d.assign(size_t(D.np * std::max<int64_t>(D.ng, 1)), 0.f);
  D.lo.assign(D.d.size(), 0.f);
  auto rd16 = [&](int64_t off) {
    D.touched[off] = D.touched[off + 1] = 1;
    return uint16_t(blob[off] | (blob[off + 1] << 8));
  };
  const int64_t dof = h.data_offset, sof = h.scale_offset;
  for (int64_t pr = 0; pr < D.np; ++pr) {
    const int64_t blk = pr / 16, i = pr % 16;
    if (D.f == WeightFormat::kINT8) {
      for (int b = 0; b < 4; ++b) D.touched[sof + pr * 4 + b] = 1;
      std::memcpy(&D.s[pr], blob + sof + pr * 4, 4);
    }
    if (D.f == WeightFormat::kINT4)
      for (int64_t G = 0; G < D.ng; ++G) {
        const int64_t off = sof + (blk * D.ng + G) * 64 + i * 2;
        D.d[pr * D.ng + G] = bf16_value(rd16(off));
        D.lo[pr * D.ng + G] = bf16_value(rd16(off + 32));
      }
    for (int64_t c = 0; c < D.kp; ++c) {
      const size_t e = size_t(pr * D.kp + c);
      if (D.f == WeightFormat::kBF16) {
        D.wb[e] = rd16(dof + blk * (D.kp * 32) + (c / 2) * 64 + i * 4 + (c % 2) * 2);
        D.w[e] = bf16_value(D.wb[e]);
      } else if (D.f == WeightFormat::kINT8) {
        const int64_t off = dof + blk * (D.kp * 16) + (c / 4) * 64 + i * 4 + (c % 4);
        D.touched[off] = 1;
        D.wi[e] = int32_t(blob[off]) - 128;
        D.w[e] = double(D.s[pr]) * D.wi[e];
      } else {
        const int64_t off = dof + blk * (D.kp * 8) + (c / 8) * 64 + i * 4 + (c % 4);
        D.touched[off] = 1;
        D.wi[e] = (c % 8) < 4 ? (blob[off] & 15) : (blob[off] >> 4);
        const int64_t G = c / D.g;
        D.w[e] = double(D.d[pr * D.ng + G]) * D.wi[e] + double(D.lo[pr * D.ng + G]);
      }
    }
  }
  return D;
}

// Spec of the int4 group search, reimplemented: the smallest squared error over
// the shrink factors.
double ref_int4_best_err(const float* v, int64_t len) {
  float vmin = v[0], vmax = v[0];
  for (int64_t i = 1; i < len; ++i) vmin = std::min(vmin, v[i]), vmax = std::max(vmax, v[i]);
  double best = std::numeric_limits<double>::infinity();
  for (float f : {1.0f, 0.95f, 0.9f, 0.85f, 0.8f}) {
    const float lo = ref_bf16_value(vmin * f), d = ref_bf16_value((vmax * f - vmin * f) / 15.f);
    double err = 0;
    for (int64_t i = 0; i < len; ++i) {
      const float q = d > 0 ? std::min(15.f, std::max(0.f, std::round((v[i] - lo) / d))) : 0.f;
      const double e = double(v[i]) - (double(d) * q + lo);
      err += e * e;
    }
    best = std::min(best, err);
  }
  return best;
}

// A dense matrix [n][k] ~ N(0, 1/k), with a few constant groups for int4's d == 0 path.
std::vector<float> random_matrix(int64_t n, int64_t k, Rng& rng, bool with_constants) {
  std::vector<float> w(static_cast<size_t>(n * k));
  const double sd = 1.0 / std::sqrt(double(k));
  for (auto& v : w) v = float(rng.gauss() * sd);
  if (with_constants && n > 3) {
    for (int64_t c = 0; c < std::min<int64_t>(k, 32); ++c) w[size_t(1 * k + c)] = 0.25f;  // constant group
    for (int64_t c = 0; c < std::min<int64_t>(k, 32); ++c) w[size_t(2 * k + c)] = 0.f;    // zero group
    for (int64_t c = 0; c < k; ++c) w[size_t(3 * k + c)] = 0.f;                            // zero row
  }
  return w;
}

AlignedBytes pack(const PackedMatrixHeader& h, const std::vector<float>& w, uint8_t fill = 0) {
  AlignedBytes out(size_t(h.total_bytes), fill);
  std::vector<const float*> rows(static_cast<size_t>(h.n));
  for (int64_t r = 0; r < h.n; ++r) rows[r] = w.data() + r * h.k;
  pack_matrix(h, rows.data(), out.get());
  return out;
}

// ---------------------------------------------------------------- packing tests
void test_pack(WeightFormat f, MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const std::string name = strf("pack %s %s n=%lld k=%lld g=%lld", fmt_name(f), role_name(role),
                                (long long)n, (long long)k, (long long)group);
  const PackedMatrixHeader h = packed_matrix_header(f, role, n, k, group);
  // header fields, computed independently
  const int64_t g = f == WeightFormat::kINT4 ? (group ? group : 32) : 0;
  const int64_t kp = f == WeightFormat::kINT4 ? round_up(k, std::max<int64_t>(g, 32)) : round_up(k, 32);
  const int64_t np = role == MatrixRole::kGateUp ? 2 * round_up(n / 2, 16) : round_up(n, 16);
  const int64_t per_k = f == WeightFormat::kBF16 ? 32 : f == WeightFormat::kINT8 ? 16 : 8;
  const int64_t data_end = 64 + (np / 16) * kp * per_k;
  const int64_t scale_bytes = f == WeightFormat::kINT8 ? np * 4 : f == WeightFormat::kINT4 ? (np / 16) * (kp / g) * 64 : 0;
  bool pad_zero = h.reserved == 0;
  for (uint8_t b : h.pad) pad_zero = pad_zero && b == 0;
  check(h.magic == kPackedMagic && h.version == kPackedVersion && h.format == uint8_t(f) &&
            h.role == uint8_t(role) && h.n == n && h.k == k && h.np == np && h.kp == kp &&
            h.kp % 32 == 0 && h.group == (f == WeightFormat::kINT8 ? kp : g) &&
            h.data_offset == 64 && h.scale_offset == (scale_bytes ? round_up(data_end, 64) : 0) &&
            h.total_bytes == round_up(data_end, 64) + round_up(scale_bytes, 64) &&
            h.total_bytes % 64 == 0 && pad_zero,
        name + strf(": header (np=%d kp=%d total=%lld)", h.np, h.kp, (long long)h.total_bytes));

  const std::vector<float> w = random_matrix(n, k, rng, true);
  const AlignedBytes a = pack(h, w, 0xAA), b = pack(h, w, 0x55);
  check(std::memcmp(a.get(), b.get(), a.n) == 0, name + ": deterministic, every byte written");

  const Decoded D = decode(a.get());
  int64_t bad_pad = 0, bad_val = 0, bad_bytes = 0;
  double worst_int4 = 0;  // actual / best squared error - 1
  for (size_t i = 64; i < D.touched.size(); ++i) bad_bytes += !D.touched[i] && a.get()[i] != 0;
  for (int64_t pr = 0; pr < D.np; ++pr) {
    const int64_t r = D.logical_of[pr];
    for (int64_t c = 0; c < D.kp; ++c) {
      const size_t e = size_t(pr * D.kp + c);
      const bool pad = r < 0 || c >= k;
      if (f == WeightFormat::kBF16) {
        if (pad) bad_pad += D.wb[e] != 0;
        else bad_val += D.wb[e] != ref_bf16(w[size_t(r * k + c)]);
      } else if (f == WeightFormat::kINT8) {
        if (pad) bad_pad += D.wi[e] != 0;  // padded weight 0 <=> u = 128
        else {
          const double t = D.s[pr] > 0 ? w[size_t(r * k + c)] / D.s[pr] : 0.0;
          bad_val += D.wi[e] < -127 || std::fabs(D.wi[e] - t) > 0.5 + 1e-4;
        }
      } else {
        if (pad) bad_pad += D.wi[e] != 0;
      }
    }
    if (f == WeightFormat::kINT8) {
      float amax = 0;
      if (r >= 0)
        for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(w[size_t(r * k + c)]));
      bad_val += bits_of(D.s[pr]) != bits_of(amax / 127.f);
    }
    if (f == WeightFormat::kINT4)
      for (int64_t G = 0; G < D.ng; ++G) {
        const int64_t c0 = G * D.g, len = std::min(k, c0 + D.g) - c0;
        const float dd = D.d[pr * D.ng + G], ll = D.lo[pr * D.ng + G];
        if (r < 0 || len <= 0) {
          bad_pad += dd != 0.f || ll != 0.f;
          continue;
        }
        const float* v = w.data() + r * k + c0;
        bool constant = true;
        for (int64_t i = 1; i < len; ++i) constant = constant && v[i] == v[0];
        if (constant) {  // d = 0, q = 0, lo = the value
          bad_val += dd != 0.f || ll != ref_bf16_value(v[0]);
          for (int64_t i = 0; i < len; ++i) bad_val += D.wi[size_t(pr * D.kp + c0 + i)] != 0;
        }
        double err = 0;
        for (int64_t i = 0; i < len; ++i) {
          const double e = v[i] - D.w[size_t(pr * D.kp + c0 + i)];
          err += e * e;
        }
        const double best = ref_int4_best_err(v, len);
        const double rel = best > 0 ? std::fabs(err / best - 1.0) : (err > 0 ? 1.0 : 0.0);
        worst_int4 = std::max(worst_int4, rel);
      }
  }
  check(bad_pad == 0 && bad_bytes == 0,
        name + strf(": padding is zero (bad padded elements %lld, bad gap bytes %lld)",
                    (long long)bad_pad, (long long)bad_bytes));
  if (f == WeightFormat::kINT4)
    check(bad_val == 0 && worst_int4 < 1e-9,
          name + strf(": int4 groups = best of the MSE search (|err/best-1| max %.2g), constant groups exact (bad %lld)",
                      worst_int4, (long long)bad_val));
  else
    check(bad_val == 0, name + strf(": values and scales match the spec (bad %lld)", (long long)bad_val));
}

void test_pack_errors() {
  bool threw = false;
  try {
    packed_matrix_header(WeightFormat::kINT4, MatrixRole::kPlain, 16, 64, 48);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  bool threw2 = false;
  try {
    packed_matrix_header(WeightFormat::kBF16, MatrixRole::kGateUp, 15, 64, 0);
  } catch (const std::invalid_argument&) {
    threw2 = true;
  }
  check(threw && threw2, "pack: bad arguments rejected (int4 group 48, odd kGateUp n)");
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4}) {
    const PackedMatrixHeader h = packed_matrix_header(f, MatrixRole::kPlain, 16, 64, 0);
    std::vector<float> w(16 * 64, 0.25f);
    w[5 * 64 + 7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<const float*> rows;
    for (int r = 0; r < 16; ++r) rows.push_back(w.data() + r * 64);
    AlignedBytes out(size_t(h.total_bytes), 0xAB);
    std::string what;
    try {
      pack_matrix(h, rows.data(), out.get());
    } catch (const std::domain_error& e) {
      what = e.what();
    }
    check(what == "nan at row 5, column 7" && out.get()[0] == 0xAB,
          strf("pack [%d]: a NaN weight is refused before anything is written ('%s')", int(f), what.c_str()));
  }
}

// ---------------------------------------------------------------- ISA tables
struct Isa {
  const IsaKernels* k;
  bool usable;
};

std::vector<Isa> usable_isas() {  // the selection the extension uses (kernels/isa_select.h)
  std::vector<Isa> out;
  for (const char* name : {"generic", "avx2", "avx512"}) {
    std::string why;
    if (const IsaKernels* k = find_isa(name, cpu_features(), &why)) {
      std::printf("INFO isa %s: complete, testing\n", name);
      out.push_back({k, true});
    } else {
      skip(strf("isa %s: skipped: %s", name, why.c_str()));
    }
  }
  return out;
}

// ---------------------------------------------------------------- micro-kernel tests
struct ActQ {  // quantized activations in the layout QuantizedRows describes
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<int32_t> gsum;
  int64_t ldq = 0, gld = 0;
  QuantizedRows view(int64_t r0 = 0) const {
    return {q.data() + r0 * ldq, ldq, s.data() + r0, gsum.data() + r0 * gld, gld};
  }
};

ActQ quantize_acts(const std::vector<float>& a, int64_t m, int64_t k, int64_t kp, int64_t group) {
  ActQ A;
  A.ldq = kp + 32;
  A.gld = kp / group + 3;
  A.q.assign(size_t(m * A.ldq), 0);
  A.s.assign(size_t(m), 0.f);
  A.gsum.assign(size_t(m * A.gld), 0);
  for (int64_t r = 0; r < m; ++r) {
    A.s[r] = ref_quantize_row(a.data() + r * k, k, kp, A.q.data() + r * A.ldq);
    for (int64_t G = 0; G < kp / group; ++G)
      for (int64_t c = G * group; c < (G + 1) * group; ++c) A.gsum[r * A.gld + G] += A.q[r * A.ldq + c];
  }
  return A;
}

void test_gemm(const IsaKernels& isa, WeightFormat f, MatrixRole role, int64_t n, int64_t k,
               int64_t group, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(f, role, n, k, group);
  const std::vector<float> w = random_matrix(n, k, rng, false);
  const AlignedBytes blob = pack(h, w);
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const Decoded D = decode(blob.get());
  const int64_t kp = D.kp, nb = D.np / 16;
  const float sentinel = float_of(0x7FC12345u);
  double worst = 0, dense_num = 0, dense_den = 0;
  bool guards = true, splits = true;
  for (int64_t m : {1, 3, 8, 17, 64}) {
    std::vector<float> a(static_cast<size_t>(m * k));
    for (auto& v : a) v = float(rng.gauss());
    // activations as the kernel sees them
    const int64_t lda = kp + 16;
    std::vector<uint16_t> abf(static_cast<size_t>(m * lda), 0);
    ActQ aq;
    if (f == WeightFormat::kBF16) {
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) abf[size_t(r * lda + c)] = ref_bf16(a[size_t(r * k + c)]);
    } else {
      aq = quantize_acts(a, m, k, kp, f == WeightFormat::kINT8 ? kp : D.g);
    }
    // tight reference per (row, packed column)
    std::vector<double> ref(static_cast<size_t>(m * D.np)), tol(size_t(m * D.np));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < D.np; ++pr) {
        const size_t e = size_t(r * D.np + pr);
        const int64_t base = pr * kp;
        if (f == WeightFormat::kBF16) {
          double s = 0, sa = 0;
          for (int64_t c = 0; c < kp; ++c) {
            const double t = double(bf16_value(abf[size_t(r * lda + c)])) * D.w[size_t(base + c)];
            s += t, sa += std::fabs(t);
          }
          ref[e] = s, tol[e] = (2.0 * kp + 8) * 0x1.0p-24 * sa + 1e-30;
        } else if (f == WeightFormat::kINT8) {
          int64_t I = 0;
          for (int64_t c = 0; c < kp; ++c) I += int64_t(D.wi[size_t(base + c)]) * aq.q[size_t(r * aq.ldq + c)];
          ref[e] = double(aq.s[r]) * D.s[pr] * double(I);
          tol[e] = 4 * 0x1.0p-24 * std::fabs(ref[e]) + 1e-30;
        } else {
          double s = 0, sa = 0;
          for (int64_t G = 0; G < D.ng; ++G) {
            int64_t I = 0;
            for (int64_t c = G * D.g; c < (G + 1) * D.g; ++c)
              I += int64_t(D.wi[size_t(base + c)]) * aq.q[size_t(r * aq.ldq + c)];
            const double t1 = double(D.d[pr * D.ng + G]) * I;
            const double t2 = double(D.lo[pr * D.ng + G]) * aq.gsum[size_t(r * aq.gld + G)];
            s += t1 + t2, sa += std::fabs(t1) + std::fabs(t2);
          }
          ref[e] = aq.s[r] * s;
          tol[e] = 2.0 * (D.ng + 4) * 0x1.0p-24 * aq.s[r] * sa + 1e-30;
        }
      }
    auto run = [&](int64_t b0, int64_t b1, float* c, int64_t ldc) {
      if (f == WeightFormat::kBF16) isa.gemm_bf16(hw, abf.data(), lda, m, b0, b1, c, ldc);
      else if (f == WeightFormat::kINT8) isa.gemm_int8(hw, aq.view(), m, b0, b1, c, ldc);
      else isa.gemm_int4(hw, aq.view(), m, b0, b1, c, ldc);
    };
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, nb}, {nb - 1, nb}};
    if (nb > 2) ranges.push_back({1, nb - 1});
    std::vector<float> full;
    for (auto [b0, b1] : ranges) {
      const int64_t cols = 16 * (b1 - b0), ldc = cols + 5;
      std::vector<float> c(static_cast<size_t>(m * ldc), sentinel);
      run(b0, b1, c.data(), ldc);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          const size_t e = size_t(r * D.np + 16 * b0 + j);
          const double err = std::fabs(double(c[size_t(r * ldc + j)]) - ref[e]);
          worst = std::max(worst, std::isfinite(err) ? err / tol[e] : 1e30);
        }
        for (int64_t j = cols; j < ldc; ++j) guards = guards && bits_of(c[size_t(r * ldc + j)]) == bits_of(sentinel);
      }
      if (b0 == 0 && b1 == nb) {
        full.assign(size_t(m * cols), 0.f);
        for (int64_t r = 0; r < m; ++r) std::memcpy(&full[size_t(r * cols)], &c[size_t(r * ldc)], size_t(cols) * 4);
        if (m == 64)  // accuracy vs the dense fp32 weights and fp32 activations
          for (int64_t r = 0; r < m; ++r)
            for (int64_t lr = 0; lr < n; ++lr) {
              double s = 0;
              for (int64_t q = 0; q < k; ++q) s += double(a[size_t(r * k + q)]) * w[size_t(lr * k + q)];
              dense_num += std::fabs(full[size_t(r * D.np + D.packed_of[lr])] - s);
              dense_den += std::fabs(s);
            }
      }
    }
    if (m == 17 || m == 1) {  // one call per block gives the same bits as one call for all
      for (int64_t b = 0; b < nb; ++b) {
        std::vector<float> c(static_cast<size_t>(m * 16));
        run(b, b + 1, c.data(), 16);
        for (int64_t r = 0; r < m; ++r)
          splits = splits && std::memcmp(&c[size_t(r * 16)], &full[size_t(r * 16 * nb + 16 * b)], 64) == 0;
      }
    }
  }
  const double dense_rel = dense_num / dense_den;
  const double bound = f == WeightFormat::kBF16 ? 0.01 : f == WeightFormat::kINT8 ? 0.03 : 0.15;
  check(worst <= 1.0 && guards && splits && dense_rel <= bound,
        strf("gemm_%s [%s] %s n=%lld k=%lld g=%lld M={1,3,8,17,64}: max err/tol %.3f, "
             "rel err vs dense %.4f (<= %.2f), guards %s, block splits %s",
             fmt_name(f), isa.name, role_name(role), (long long)n, (long long)k, (long long)D.g, worst,
             dense_rel, bound, guards ? "intact" : "OVERWRITTEN", splits ? "bit-identical" : "DIFFER"));
}

void test_silu(const IsaKernels& isa, Rng& rng) {
  std::vector<float> g = {0.f, -0.f, 1e-3f, -1e-3f, 1.f, -1.f, 10.f, -10.f, 20.f, -20.f, 88.f, -88.f,
                          100.f, -100.f, 1e30f, -1e30f};
  while (g.size() < 1037) g.push_back(float(rng.gauss() * 4));
  std::vector<float> u(g.size());
  for (auto& v : u) v = float(rng.gauss());
  u[0] = 0.f;
  double worst = 0;
  for (int64_t n : {int64_t(1), int64_t(16), int64_t(37), int64_t(g.size())}) {
    std::vector<float> h(static_cast<size_t>(n) + 1, -7.f);
    isa.silu_mul(g.data(), u.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = ref_silu(g[i]) * u[i];
      const double tol = 1e-5 * std::fabs(ref) + 1e-30;
      const double err = std::fabs(h[i] - ref);
      worst = std::max(worst, std::isfinite(err) ? err / tol : 1e30);
    }
    if (h[n] != -7.f) worst = 1e30;
  }
  check(worst <= 1.0, strf("silu_mul [%s] n={1,16,37,1037} incl. +-0, +-88, +-100, +-1e30: max err/tol %.3f (rel tol 1e-5)",
                           isa.name, worst));
}

// gpt-oss's clamped SwiGLU against a double-precision evaluation of its definition,
// including values at and around the clamps, huge values and NaN (must stay NaN).
void test_swiglu_oai(const IsaKernels& isa, Rng& rng) {
  const float alpha = 1.702f, limit = 7.f, nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> g = {0.f, -0.f, 6.99f, 7.f, 7.01f, -7.01f, 50.f, -50.f, 100.f, -100.f, 1e30f, -1e30f, nan, 1.f};
  std::vector<float> u = {0.f, 7.01f, -7.01f, 1e30f, -1e30f, -1.f, 6.99f, -6.99f, 3.f, -3.f, 0.5f, nan, 1.f, nan};
  while (g.size() < 1037) g.push_back(float(rng.gauss() * 6));
  while (u.size() < g.size()) u.push_back(float(rng.gauss() * 6));
  double worst = 0;
  bool nan_kept = true;
  for (int64_t n : {int64_t(1), int64_t(16), int64_t(37), int64_t(g.size())}) {
    std::vector<float> h(static_cast<size_t>(n) + 1, -7.f);
    isa.swiglu_oai(g.data(), u.data(), h.data(), n, alpha, limit);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(g[i]) || std::isnan(u[i])) {
        nan_kept &= std::isnan(h[i]);
        continue;
      }
      const double gc = std::min<double>(g[i], limit), uc = std::min<double>(std::max<double>(u[i], -limit), limit);
      const double glu = gc / (1 + std::exp(-double(alpha) * gc)), ref = glu * (uc + 1);
      const double tol = 1e-5 * (std::fabs(ref) + std::fabs(glu)) + 1e-30;  // (u + 1) rounds in fp32
      const double err = std::fabs(h[i] - ref);
      worst = std::max(worst, std::isfinite(err) ? err / tol : 1e30);
    }
    if (h[n] != -7.f) worst = 1e30;
  }
  check(worst <= 1.0 && nan_kept,
        strf("swiglu_oai [%s] n={1,16,37,1037} incl. the clamps, +-1e30: max err/tol %.3f (rel tol 1e-5), NaN %s",
             isa.name, worst, nan_kept ? "kept" : "LOST"));
}

void test_quantize(const IsaKernels& isa, Rng& rng) {
  int64_t bad = 0, cases = 0;
  for (int64_t k : {1, 31, 200}) {
    const int64_t kp = round_up(k, 32);
    for (int64_t group : {int64_t(32), kp}) {
      for (int64_t m : {1, 3, 17}) {
        const int64_t ldx = k + 3, ldq = kp + 16, ng = kp / group, gld = ng + 2;
        std::vector<float> x(static_cast<size_t>(m * ldx), 1e9f);  // junk past k must be ignored
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < k; ++c) x[size_t(r * ldx + c)] = float(rng.gauss() * (r + 1));
        if (m > 1)  // an all-zero row: scale 1, q 0
          for (int64_t c = 0; c < k; ++c) x[size_t(1 * ldx + c)] = 0.f;
        if (m > 4) {  // non-finite rows: a NaN in the last (tail) column, an Inf in the first
          x[size_t(3 * ldx + k - 1)] = std::numeric_limits<float>::quiet_NaN();
          x[size_t(4 * ldx)] = -std::numeric_limits<float>::infinity();
        }
        if (m > 2 && k >= 31) {  // ties: scale exactly 1, x = +-n.5 round away from zero
          const float ties[] = {127.f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -1.5f, 126.5f, -126.5f, 0.49999997f};
          for (int i = 0; i < 10; ++i) x[size_t(2 * ldx + i)] = ties[i];
          for (int64_t c = 10; c < k; ++c) x[size_t(2 * ldx + c)] = float(c % 7) - 3.f;
        }
        std::vector<int8_t> q(static_cast<size_t>(m * ldq), int8_t(99));
        std::vector<float> s(static_cast<size_t>(m) + 1, -1.f);
        std::vector<int32_t> gs(static_cast<size_t>(m * gld), 12345);
        isa.quantize_rows(x.data(), ldx, m, k, kp, group, q.data(), ldq, s.data(), gs.data(), gld);
        for (int64_t r = 0; r < m; ++r) {
          std::vector<int8_t> rq(static_cast<size_t>(kp));
          const float rs = ref_quantize_row(x.data() + r * ldx, k, kp, rq.data());
          bad += bits_of(s[r]) != bits_of(rs);
          for (int64_t c = 0; c < kp; ++c) bad += q[size_t(r * ldq + c)] != rq[c];
          for (int64_t c = kp; c < ldq; ++c) bad += q[size_t(r * ldq + c)] != 99;
          for (int64_t G = 0; G < ng; ++G) {
            int32_t sum = 0;
            for (int64_t c = G * group; c < (G + 1) * group; ++c) sum += rq[c];
            bad += gs[size_t(r * gld + G)] != sum;
          }
          for (int64_t G = ng; G < gld; ++G) bad += gs[size_t(r * gld + G)] != 12345;
        }
        bad += s[m] != -1.f;
        ++cases;
      }
    }
  }
  check(bad == 0, strf("quantize_rows [%s] %lld shapes (k={1,31,200}, group={32,kp}, M={1,3,17}, "
                       "zero row, .5 ties, NaN/Inf rows): q, scale, group sums exact (mismatches %lld)",
                       isa.name, (long long)cases, (long long)bad));
}

void test_to_bf16(const IsaKernels& isa, Rng& rng) {
  std::vector<uint32_t> u = {
      0x00000000u, 0x80000000u, 0x3F800000u, 0x3F808000u /*tie, even down*/, 0x3F818000u /*tie, up*/,
      0x3F808001u, 0x3F807FFFu, 0xBF808000u, 0xBF818000u, 0x7F7FFFFFu /*-> inf*/, 0x7F7F7FFFu,
      0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u /*sNaN*/, 0xFF800001u,
      0x7FFFFFFFu, 0x00000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu, 0x80008001u};
  while (u.size() < 4099) u.push_back(uint32_t(rng.next()));
  std::vector<float> x(u.size());
  for (size_t i = 0; i < u.size(); ++i) x[i] = float_of(u[i]);
  int64_t bad = 0;
  for (int64_t off : {0, 1}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(33), int64_t(x.size()) - off}) {
      std::vector<uint16_t> y(static_cast<size_t>(n) + 2, 0xABCD);
      isa.to_bf16(x.data() + off, y.data() + off, n);
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[size_t(off + i)];
        const uint16_t got = y[size_t(off + i)];
        if (std::isnan(xi))
          bad += !std::isnan(bf16_value(got)) || (got >> 15) != (bits_of(xi) >> 31);
        else
          bad += got != ref_bf16(xi);
      }
      bad += y[size_t(off + n)] != 0xABCD || (off && y[0] != 0xABCD);
    }
  }
  check(bad == 0, strf("to_bf16 [%s] ties, NaN (quiet/signalling), inf, overflow, denormals, 4099 random bit "
                       "patterns, unaligned: RNE exact (mismatches %lld)",
                       isa.name, (long long)bad));
}

// The fp16 value of bits h, from its fields in double arithmetic (independent of f16_scalar.h).
double ref_f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(double(m), -24);
  if (e == 31) return m ? std::nan("") : sign * HUGE_VAL;
  return sign * std::ldexp(double(1024 + m), e - 25);
}

// Nearest fp16 to finite or infinite f (ties to even), by search over the 2^15 magnitudes in double.
uint16_t ref_f16(float f) {
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

void test_f16(const IsaKernels& isa, Rng& rng) {
  // fp32 -> fp16: ties, overflow edge (65504 / 65520), denormals, NaN, inf, random bits
  std::vector<uint32_t> u = {0x00000000u, 0x80000000u, 0x3F800000u, 0x3F801000u /*tie, even down*/,
                             0x3F803000u /*tie, up*/, 0x3F801001u, 0x477FE000u /*65504*/, 0x477FEFFFu,
                             0x477FF000u /*65520 -> inf*/, 0xC77FF000u, 0x7F800000u, 0xFF800000u,
                             0x7FC00000u, 0xFFC12345u, 0x7F800001u /*sNaN*/, 0x33800000u /*2^-24*/,
                             0x33000000u /*2^-25: tie to 0*/, 0x33400000u, 0x387FC000u, 0x387FF000u, 0x38800000u,
                             0x00000001u, 0x1F000000u};
  while (u.size() < 4099) {
    const uint32_t r = uint32_t(rng.next());
    u.push_back(u.size() % 2 ? r : (r & 0x8FFFFFFFu) | 0x30000000u);  // half of them in fp16 range
  }
  int64_t bad = 0;
  for (int64_t off : {0, 1}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(33), int64_t(u.size()) - off}) {
      std::vector<float> x(u.size());
      for (size_t i = 0; i < u.size(); ++i) x[i] = float_of(u[i]);
      std::vector<uint16_t> y(static_cast<size_t>(n) + 2, 0xABCD);
      isa.f32_to_f16(x.data() + off, y.data() + off, n);
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[size_t(off + i)];
        const uint16_t got = y[size_t(off + i)];
        if (std::isnan(xi))
          bad += (got & 0x7E00) != 0x7E00 || (got >> 15) != (bits_of(xi) >> 31) || (got & 0x1FF) != ((bits_of(xi) >> 13) & 0x1FF);
        else
          bad += got != ref_f16(xi);
      }
      bad += y[size_t(off + n)] != 0xABCD || (off && y[0] != 0xABCD);
    }
  }
  // fp16 -> fp32: every one of the 65536 patterns, unaligned
  std::vector<uint16_t> h(65537);
  for (uint32_t i = 0; i < 65536; ++i) h[i + 1] = uint16_t(i);
  std::vector<float> f(65538, 7.f);
  isa.f16_to_f32(h.data() + 1, f.data() + 1, 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const double ref = ref_f16_value(uint16_t(i));
    const float got = f[i + 1];
    if (std::isnan(ref))
      bad += !std::isnan(got) || (bits_of(got) >> 31) != (i >> 15);
    else
      bad += double(got) != ref || std::signbit(got) != bool(i & 0x8000);
  }
  bad += f[0] != 7.f || f[65537] != 7.f;
  check(bad == 0, strf("f32_to_f16 / f16_to_f32 [%s] ties, 65504/65520, denormals, NaN, inf, 4099 random, all 65536 "
                       "fp16 patterns, unaligned: exact (mismatches %lld)", isa.name, (long long)bad));
}

// ---------------------------------------------------------------- driver tests
ParallelFor serial_pf() {
  return [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& f) {
    if (n > 0) f(0, n);
  };
}
ParallelFor two_thread_pf() {  // uneven split, second part on another thread
  return [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& f) {
    if (n <= 0) return;
    const int64_t mid = n / 3;
    std::thread t([&] { if (mid < n) f(mid, n); });
    if (mid > 0) f(0, mid);
    t.join();
  };
}
ParallelFor grain1_reverse_pf() {
  return [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& f) {
    for (int64_t i = n - 1; i >= 0; --i) f(i, i + 1);
  };
}

struct MoeWeights {
  int64_t E, H, I;
  WeightFormat f13, f2;
  std::vector<float> w13, w2;       // dense [E][2I][H], [E][H][I]
  std::unique_ptr<AlignedBytes> p13, p2;
  int64_t s13 = 0, s2 = 0;
  std::vector<Decoded> d13, d2;
};

MoeWeights make_weights(int64_t E, int64_t H, int64_t I, WeightFormat f13, int64_t g13, WeightFormat f2,
                        int64_t g2, Rng& rng) {
  MoeWeights M{E, H, I, f13, f2, {}, {}, nullptr, nullptr, 0, 0, {}, {}};
  const PackedMatrixHeader h13 = packed_matrix_header(f13, MatrixRole::kGateUp, 2 * I, H, g13);
  const PackedMatrixHeader h2 = packed_matrix_header(f2, MatrixRole::kDown, H, I, g2);
  M.s13 = h13.total_bytes, M.s2 = h2.total_bytes;
  M.p13 = std::make_unique<AlignedBytes>(size_t(E * M.s13));
  M.p2 = std::make_unique<AlignedBytes>(size_t(E * M.s2));
  for (int64_t e = 0; e < E; ++e) {
    std::vector<float> a = random_matrix(2 * I, H, rng, false), b = random_matrix(H, I, rng, false);
    M.w13.insert(M.w13.end(), a.begin(), a.end());
    M.w2.insert(M.w2.end(), b.begin(), b.end());
    const AlignedBytes pa = pack(h13, a), pb = pack(h2, b);
    std::memcpy(M.p13->get() + e * M.s13, pa.get(), pa.n);
    std::memcpy(M.p2->get() + e * M.s2, pb.get(), pb.n);
    M.d13.push_back(decode(M.p13->get() + e * M.s13));
    M.d2.push_back(decode(M.p2->get() + e * M.s2));
  }
  return M;
}

struct MoeInput {
  int64_t T, K;
  bool bf16;
  std::vector<float> x;       // values (bf16-representable when bf16)
  std::vector<uint16_t> xb;   // bf16 bits when bf16
  std::vector<int64_t> ids;
  std::vector<float> wts;
};

// out[t] (double) of the dense fp32 MoE (`emulate` false) or of the packed
// pipeline emulated in double with exactly the driver's quantization steps.
// The driver computes h = silu(gate)*up in fp32, so an h within fp32 noise of a
// rounding boundary of its bf16 / int8 step may round the other way there: for
// every such ambiguous h (relative margin kHMargin) `slack` gets the effect of
// one step on each output, |w| * step * |W2[r][i]|.
constexpr double kHMargin = 2e-5;
std::vector<double> reference(const MoeWeights& M, const MoeInput& in, bool emulate,
                              std::vector<double>* slack = nullptr) {
  const int64_t H = M.H, I = M.I;
  std::vector<double> out(static_cast<size_t>(in.T * H), 0.0);
  if (slack) slack->assign(out.size(), 0.0);
  std::vector<double> step(static_cast<size_t>(I));  // ambiguous h: its rounding step, else 0
  std::vector<double> gu(static_cast<size_t>(2 * I)), y(static_cast<size_t>(H));
  std::vector<float> hf(static_cast<size_t>(I));
  std::vector<int8_t> q(static_cast<size_t>(round_up(std::max(H, I), 256)));
  std::vector<double> xa(static_cast<size_t>(H)), ha(static_cast<size_t>(I));
  for (int64_t t = 0; t < in.T; ++t) {
    const float* x = in.x.data() + t * H;
    for (int64_t j = 0; j < in.K; ++j) {
      const int64_t e = in.ids[size_t(t * in.K + j)];
      if (e < 0) continue;
      // activations of gate/up
      if (!emulate || M.f13 == WeightFormat::kBF16) {
        for (int64_t c = 0; c < H; ++c) xa[c] = emulate ? ref_bf16_value(x[c]) : x[c];
      } else {
        const float s = ref_quantize_row(x, H, H, q.data());
        for (int64_t c = 0; c < H; ++c) xa[c] = double(s) * q[c];
      }
      for (int64_t r = 0; r < 2 * I; ++r) {
        double s = 0;
        if (emulate) {
          const Decoded& D = M.d13[e];
          const double* wr = D.w.data() + D.packed_of[r] * D.kp;
          for (int64_t c = 0; c < H; ++c) s += xa[c] * wr[c];
        } else {
          const float* wr = M.w13.data() + (e * 2 * I + r) * H;
          for (int64_t c = 0; c < H; ++c) s += xa[c] * wr[c];
        }
        gu[r] = s;
      }
      for (int64_t i = 0; i < I; ++i) hf[i] = float(ref_silu(gu[i]) * gu[I + i]);
      std::fill(step.begin(), step.end(), 0.0);
      if (!emulate) {
        for (int64_t i = 0; i < I; ++i) ha[i] = ref_silu(gu[i]) * gu[I + i];
      } else if (M.f2 == WeightFormat::kBF16) {
        for (int64_t i = 0; i < I; ++i) {
          ha[i] = ref_bf16_value(hf[i]);
          const float a = ref_bf16_value(float(hf[i] * (1 - kHMargin)));
          const float b = ref_bf16_value(float(hf[i] * (1 + kHMargin)));
          step[i] = std::fabs(double(a) - double(b));
        }
      } else {
        const float s = ref_quantize_row(hf.data(), I, I, q.data());
        for (int64_t i = 0; i < I; ++i) {
          ha[i] = double(s) * q[i];
          const double lo = std::round(hf[i] * (1 - kHMargin) / s), hi = std::round(hf[i] * (1 + kHMargin) / s);
          step[i] = lo != hi ? double(s) : 0.0;
        }
      }
      for (int64_t r = 0; r < H; ++r) {
        double s = 0;
        if (emulate) {
          const Decoded& D = M.d2[e];
          const double* wr = D.w.data() + D.packed_of[r] * D.kp;
          for (int64_t c = 0; c < I; ++c) s += ha[c] * wr[c];
        } else {
          const float* wr = M.w2.data() + (e * H + r) * I;
          for (int64_t c = 0; c < I; ++c) s += ha[c] * wr[c];
        }
        y[r] = s;
      }
      const double wt = in.wts[size_t(t * in.K + j)];
      for (int64_t r = 0; r < H; ++r) out[size_t(t * H + r)] += wt * y[r];
      if (emulate && slack)
        for (int64_t i = 0; i < I; ++i) {
          if (step[i] == 0) continue;
          const Decoded& D = M.d2[e];
          for (int64_t r = 0; r < H; ++r)
            (*slack)[size_t(t * H + r)] += std::fabs(wt) * step[i] * std::fabs(D.w[size_t(D.packed_of[r] * D.kp + i)]);
        }
    }
  }
  return out;
}

MoeInput random_input(int64_t T, int64_t K, const MoeWeights& M, bool bf16, double mask_frac, Rng& rng) {
  MoeInput in{T, K, bf16, {}, {}, {}, {}};
  in.x.resize(size_t(T * M.H));
  for (auto& v : in.x) v = float(rng.gauss());
  if (bf16) {
    in.xb.resize(in.x.size());
    for (size_t i = 0; i < in.x.size(); ++i) {
      in.xb[i] = ref_bf16(in.x[i]);
      in.x[i] = bf16_value(in.xb[i]);
    }
  }
  in.ids.resize(size_t(T * K));
  in.wts.resize(size_t(T * K));
  std::vector<int64_t> perm(static_cast<size_t>(M.E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < M.E; ++e) perm[e] = e;
    for (int64_t j = 0; j < K; ++j) {
      std::swap(perm[j], perm[j + rng.below(M.E - j)]);
      in.ids[size_t(t * K + j)] = rng.uniform() < mask_frac ? -1 : perm[j];
      in.wts[size_t(t * K + j)] = float(0.1 + rng.uniform());
    }
  }
  if (T >= 3)
    for (int64_t j = 0; j < K; ++j) in.ids[size_t(1 * K + j)] = -1;  // token 1 fully masked
  return in;
}

std::vector<float> run_driver(const MoeWeights& M, const MoeInput& in, const IsaKernels& isa,
                              const ParallelFor& pf, std::vector<uint16_t>* raw_bf16 = nullptr) {
  MoeProblem p{};
  p.tokens = in.T, p.hidden = M.H, p.top_k = in.K, p.num_experts = M.E;
  p.x = in.bf16 ? static_cast<const void*>(in.xb.data()) : static_cast<const void*>(in.x.data());
  p.x_dtype = in.bf16 ? ActDtype::kBF16 : ActDtype::kF32;
  p.ids = in.ids.data(), p.weights = in.wts.data();
  p.w13 = M.p13->get(), p.w13_stride = M.s13, p.w2 = M.p2->get(), p.w2_stride = M.s2;
  std::vector<float> out(static_cast<size_t>(in.T * M.H) + 1, 0.f);
  std::vector<uint16_t> ob(static_cast<size_t>(in.T * M.H) + 1, 0);
  if (in.bf16) {
    ob.back() = 0x5A5A;
    p.out = ob.data();
  } else {
    out.back() = 7.f;
    p.out = out.data();
  }
  moe_forward(p, isa, pf);
  if (in.bf16) {
    if (ob.back() != 0x5A5A) out.back() = -1.f;  // wrote past the end
    for (size_t i = 0; i + 1 < ob.size(); ++i) out[i] = bf16_value(ob[i]);
    if (raw_bf16) *raw_bf16 = ob;
  }
  if (!in.bf16 && out.back() != 7.f) out.back() = -1.f;
  return out;
}

// Σ max(0, |got - ref| - slack) / Σ |ref| over [begin, end).
double rel_l1(const std::vector<float>& got, const std::vector<double>& ref, int64_t begin, int64_t end,
              const std::vector<double>* slack = nullptr) {
  double num = 0, den = 0;
  for (int64_t i = begin; i < end; ++i) {
    const double err = std::fabs(got[size_t(i)] - ref[size_t(i)]) - (slack ? (*slack)[size_t(i)] : 0.0);
    num += err > 0 || std::isnan(err) ? err : 0.0;
    den += std::fabs(ref[size_t(i)]);
  }
  if (!std::isfinite(num)) return std::numeric_limits<double>::infinity();  // NaN / inf output
  return den > 0 ? num / den : num;
}

struct Combo {
  WeightFormat f13;
  int64_t g13;
  WeightFormat f2;
  int64_t g2;
};

std::string combo_name(const Combo& c) {
  std::string s = fmt_name(c.f13);
  if (c.f13 == WeightFormat::kINT4) s += strf("(g%lld)", (long long)c.g13);
  if (c.f2 != c.f13 || c.g2 != c.g13) {
    s += std::string("/") + fmt_name(c.f2);
    if (c.f2 == WeightFormat::kINT4) s += strf("(g%lld)", (long long)c.g2);
  }
  return s;
}

double format_bound(WeightFormat a, WeightFormat b) {
  auto one = [](WeightFormat f) { return f == WeightFormat::kBF16 ? 0.01 : f == WeightFormat::kINT8 ? 0.03 : 0.15; };
  return std::max(one(a), one(b));
}

void test_driver(const std::vector<Isa>& isas, Rng& rng) {
  const int64_t E = 5, H = 200, I = 70, K = 3;
  const Combo combos[] = {{WeightFormat::kBF16, 0, WeightFormat::kBF16, 0},
                          {WeightFormat::kINT8, 0, WeightFormat::kINT8, 0},
                          {WeightFormat::kINT4, 32, WeightFormat::kINT4, 32},
                          {WeightFormat::kINT4, 64, WeightFormat::kINT8, 0}};
  for (const Combo& cb : combos) {
    const MoeWeights M = make_weights(E, H, I, cb.f13, cb.g13, cb.f2, cb.g2, rng);
    for (bool bf16 : {false, true}) {
      for (int64_t T : {0, 1, 7, 600}) {
        const MoeInput in = random_input(T, K, M, bf16, T == 1 ? 0.0 : 0.15, rng);
        std::vector<double> slack;
        const std::vector<double> emu = reference(M, in, true, &slack), dense = reference(M, in, false);
        const std::string what = strf("moe_forward %s x=%s E=%lld H=%lld I=%lld k=%lld T=%lld", combo_name(cb).c_str(),
                                      bf16 ? "bf16" : "fp32", (long long)E, (long long)H, (long long)I,
                                      (long long)K, (long long)T);
        for (const Isa& isa : isas) {
          const std::vector<float> out = run_driver(M, in, *isa.k, serial_pf());
          // per token: relative L1 vs the emulated pipeline; masked tokens exactly 0
          double worst_row = 0;
          bool masked_zero = true;
          for (int64_t t = 0; t < T; ++t) {
            bool all_masked = true;
            for (int64_t j = 0; j < K; ++j) all_masked = all_masked && in.ids[size_t(t * K + j)] < 0;
            if (all_masked) {
              for (int64_t c = 0; c < H; ++c) masked_zero = masked_zero && bits_of(out[size_t(t * H + c)]) == 0;
            } else {
              worst_row = std::max(worst_row, rel_l1(out, emu, t * H, (t + 1) * H, &slack));
            }
          }
          const double row_tol = bf16 ? 4e-3 : 1e-4;
          const double metric = T ? rel_l1(out, dense, 0, T * H) : 0.0;
          const double bound = format_bound(cb.f13, cb.f2);  // a sanity bound: few pairs at small T are noisy
          const bool tail_ok = out.back() >= 0.f;
          check(worst_row <= row_tol && masked_zero && tail_ok && metric <= bound * (T < 7 ? 2.0 : T < 600 ? 1.25 : 1.0),
                what + strf(" [%s]: worst token rel err vs emulated (beyond h rounding slack) %.2g (<= %.0e), vs dense fp32 %.4f, "
                            "masked tokens %s%s",
                            isa.k->name, worst_row, row_tol, metric, masked_zero ? "zero" : "NOT ZERO",
                            tail_ok ? "" : ", WROTE PAST THE END"));
          if (T == 7 || (T == 600 && !bf16)) {
            const std::vector<float> o2 = run_driver(M, in, *isa.k, two_thread_pf());
            const std::vector<float> o3 = run_driver(M, in, *isa.k, grain1_reverse_pf());
            const bool same = std::memcmp(out.data(), o2.data(), out.size() * 4) == 0 &&
                              std::memcmp(out.data(), o3.data(), out.size() * 4) == 0;
            check(same, what + strf(" [%s]: bit-identical for serial / 2 threads / grain-1 reversed partitions",
                                    isa.k->name));
          }
        }
      }
    }
    // an id >= E is an error, not a read out of bounds
    if (cb.f13 == WeightFormat::kBF16) {
      MoeInput in = random_input(4, K, M, false, 0.0, rng);
      in.ids[5] = E;
      bool threw = false;
      try {
        run_driver(M, in, *isas[0].k, serial_pf());
      } catch (const std::out_of_range&) {
        threw = true;
      }
      check(threw, "moe_forward: id >= num_experts throws std::out_of_range");
    }
  }
}

// The accuracy metric of each format: mean|out - ref| / mean|ref| against the
// dense fp32 MoE on Gaussian experts (weights ~ N(0, 1/fan_in)).
void test_accuracy(const std::vector<Isa>& isas, Rng& rng, int64_t E = 4, int64_t H = 512, int64_t I = 256,
                   int64_t K = 2, int64_t T = 48) {
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4}) {
    const MoeWeights M = make_weights(E, H, I, f, 0, f, 0, rng);
    const MoeInput in = random_input(T, K, M, false, 0.0, rng);
    const std::vector<double> dense = reference(M, in, false);
    for (const Isa& isa : isas) {
      const std::vector<float> out = run_driver(M, in, *isa.k, serial_pf());
      const double metric = rel_l1(out, dense, 0, T * H);
      const double bound = format_bound(f, f);
      check(metric <= bound, strf("accuracy %s [%s] E=%lld H=%lld I=%lld k=%lld T=%lld: mean|out-ref|/mean|ref| = %.4f (<= %.2f)",
                                  fmt_name(f), isa.k->name, (long long)E, (long long)H, (long long)I,
                                  (long long)K, (long long)T, metric, bound));
    }
  }
}

// fp16 activations: the driver on fp16 x must give exactly fp16(the fp32 driver's output on the same
// values), since fp16 -> fp32 is exact and the combine rounds its fp32 sum once.
void test_driver_f16(const std::vector<Isa>& isas, Rng& rng) {
  const int64_t E = 5, H = 200, I = 70, K = 3;
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4}) {
    const MoeWeights M = make_weights(E, H, I, f, 0, f, 0, rng);
    for (int64_t T : {1, 7, 40}) {
      MoeInput in = random_input(T, K, M, false, 0.15, rng);
      std::vector<uint16_t> xh(in.x.size());
      for (size_t i = 0; i < in.x.size(); ++i) {
        xh[i] = ref_f16(in.x[i]);
        in.x[i] = float(ref_f16_value(xh[i]));
      }
      for (const Isa& isa : isas) {
        const std::vector<float> ref = run_driver(M, in, *isa.k, serial_pf());
        MoeProblem p{};
        p.tokens = T, p.hidden = H, p.top_k = K, p.num_experts = E;
        p.x = xh.data(), p.x_dtype = ActDtype::kF16;
        p.ids = in.ids.data(), p.weights = in.wts.data();
        p.w13 = M.p13->get(), p.w13_stride = M.s13, p.w2 = M.p2->get(), p.w2_stride = M.s2;
        std::vector<uint16_t> out(size_t(T * H) + 1, 0x5A5A);
        p.out = out.data();
        moe_forward(p, *isa.k, two_thread_pf());
        int64_t bad = out.back() != 0x5A5A;
        for (int64_t i = 0; i < T * H; ++i) bad += out[size_t(i)] != ref_f16(ref[size_t(i)]);
        check(bad == 0, strf("moe_forward x=fp16 %s T=%lld [%s]: out == fp16(fp32 driver on the same values) "
                             "(mismatches %lld)", fmt_name(f), (long long)T, isa.k->name, (long long)bad));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  const char* seed = std::getenv("KTMOE_TEST_SEED");  // other random data, same checks
  Rng rng(seed ? std::strtoull(seed, nullptr, 10) : 20240607ull);
  if (argc == 7 && std::string(argv[1]) == "--accuracy") {  // --accuracy E H I K T: the metric only
    const int64_t E = std::atoll(argv[2]), H = std::atoll(argv[3]), I = std::atoll(argv[4]);
    test_accuracy(usable_isas(), rng, E, H, I, std::atoll(argv[5]), std::atoll(argv[6]));
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
  }
  struct Shape {
    MatrixRole role;
    int64_t n, k;
  };
  const Shape shapes[] = {{MatrixRole::kPlain, 40, 72},
                          {MatrixRole::kGateUp, 2 * 37, 96},
                          {MatrixRole::kDown, 33, 200},
                          {MatrixRole::kGateUp, 2 * 16, 32},
                          {MatrixRole::kPlain, 130, 130}};
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4})
    for (const Shape& s : shapes) test_pack(f, s.role, s.n, s.k, 0, rng);
  test_pack(WeightFormat::kINT4, MatrixRole::kDown, 33, 200, 64, rng);
  test_pack(WeightFormat::kINT4, MatrixRole::kGateUp, 2 * 20, 40, 128, rng);
  test_pack_errors();

  const std::vector<Isa> isas = usable_isas();
  for (const Isa& isa : isas) {
    for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4})
      for (const Shape& s : shapes) test_gemm(*isa.k, f, s.role, s.n, s.k, 0, rng);
    test_gemm(*isa.k, WeightFormat::kINT4, MatrixRole::kDown, 33, 200, 64, rng);
    test_gemm(*isa.k, WeightFormat::kINT4, MatrixRole::kGateUp, 2 * 20, 300, 128, rng);
    test_silu(*isa.k, rng);
    test_swiglu_oai(*isa.k, rng);
    test_quantize(*isa.k, rng);
    test_to_bf16(*isa.k, rng);
    test_f16(*isa.k, rng);
  }
  test_driver(isas, rng);
  test_driver_f16(isas, rng);
  test_accuracy(isas, rng);

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("INFO %d skipped, %.1f s\n", g_skipped, secs);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
