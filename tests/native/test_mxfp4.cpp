// The kMXFP4 format (mxfp4_format.h): e2m1 / E8M0 values and the kernels' decode tables against
// the fields written out again, nearest-e2m1 rounding (ties to even, saturation), the exact
// packer's nibbles and scale bytes at the layout's offsets (written out again), the dense packer
// against OCP MX's rule, what the packer refuses, and every ISA's gemm_mxfp4: every code times
// the E8M0 extremes exactly (one-hot rows), random codes against a double-precision reference (within an fp32 sum's bound plus the
// int16 activations' rounding of the integer kernels)
// and against generic (avx2, and avx512's integer kernel that amx runs below its tiles, bit-identical: the same
// integer dots and fp32 operations), bits that depend neither
// on the (b0, b1) split nor on M (amx: below its tile threshold; its tiles are held to the emulator's bits over
// the decoded weights, which must be the exact values in kBF16's layout).
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "check.h"
#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_emulated.h"
#include "kernels/avx512/amx_entry_points.h"
#include "kernels/pack.h"
#include "kernels/pack_mxfp4.h"
#include "packed_reference.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

// e2m1 from its fields: (-1)^s * (e == 0 ? m/2 : 2^(e-1) * (1 + m/2)).
double ref_e2m1(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return code & 8 ? -mag : mag;
}

// An MXFP4 matrix as a checkpoint holds it: codes [n][k] (one per byte), E8M0 bytes [n][groups].
struct Mxfp4Matrix {
  std::vector<uint8_t> q, e;
  std::vector<const uint8_t*> rows, erows;
};

// Whether isa's gemm_mxfp4 of m rows runs mxfp4_format.h's integer evaluation, generic's bits: all but
// avx512's fp32 group sums (vdpbf16ps) and amx's tiles (m >= prefill_min_rows(); below, avx512's integer kernel).
bool generic_bits(const IsaKernels& isa, int64_t m) {
  const std::string name = isa.name;
  return name != "avx512" && !(name == "amx" && m >= amx::prefill_min_rows());
}

Mxfp4Matrix random_mxfp4(const PackedMatrixHeader& h, int e_lo, int e_hi, Rng& rng) {
  Mxfp4Matrix d;
  const int64_t ng = h.kp / h.group;
  d.q.resize(size_t(h.n) * h.k);
  for (auto& q : d.q) q = uint8_t(rng.below(16));
  d.e.resize(size_t(h.n * ng));
  for (auto& e : d.e) e = uint8_t(e_lo + int(rng.below(uint64_t(e_hi - e_lo + 1))));
  for (int64_t r = 0; r < h.n; ++r) d.rows.push_back(d.q.data() + r * h.k), d.erows.push_back(d.e.data() + r * ng);
  return d;
}

AlignedBytes pack(const PackedMatrixHeader& h, const Mxfp4Matrix& d, uint8_t fill) {
  AlignedBytes out(size_t(h.total_bytes), fill);
  mxfp4_pack_matrix(h, d.rows.data(), d.erows.data(), 0, out.get());
  return out;
}

// Dense row of packed row pr, or -1 (packed_format.h's role rule, written out again).
int64_t dense_of(const PackedMatrixHeader& h, int64_t pr) {
  if (h.role != uint8_t(MatrixRole::kGateUp)) return pr < h.n ? pr : -1;
  const int64_t i = (pr / 32) * 16 + pr % 16, inter = h.n / 2;
  return i >= inter ? -1 : (pr / 16) % 2 ? inter + i : i;
}

void test_mxfp4_values() {
  int bad = 0;
  for (int c = 0; c < 16; ++c) {
    const double v = ref_e2m1(c);
    bad += double(e2m1_to_float(uint8_t(c))) != v || std::signbit(e2m1_to_float(uint8_t(c))) != bool(c & 8);
    bad += double(bf16_value(kMxfp4Bf16.v[c])) != v || kMxfp4Bf16.v[c + 16] != kMxfp4Bf16.v[c];
    bad += double(kMxfp4U8.v[c]) - kMxfp4U8Offset != 2 * v || std::signbit(bf16_value(kMxfp4Bf16.v[c])) != bool(c & 8);
    bad += kMxfp4I16.v[c] != 2 * v || kMxfp4I16.v[c + 16] != kMxfp4I16.v[c];
    bad += e2m1_from_float(float(v)) != c;  // -0.0 keeps its sign: code 8
  }
  // midpoints go to the even code, a quarter away to the nearer; beyond 6 saturates
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  const int even[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) {
    const double lo = ref_e2m1(i), hi = ref_e2m1(i + 1);
    bad += e2m1_from_float(mids[i]) != even[i] || e2m1_from_float(-mids[i]) != (8 | even[i]);
    bad += e2m1_from_float(float(lo + (hi - lo) / 4)) != i || e2m1_from_float(float(hi - (hi - lo) / 4)) != i + 1;
  }
  bad += e2m1_from_float(7.99f) != 7 || e2m1_from_float(-100.f) != 15 || e2m1_from_float(-0.1f) != 8;
  bad += e8m0_to_float(0) != std::ldexp(1.f, -127) || e8m0_to_float(127) != 1.f || e8m0_to_float(254) != std::ldexp(1.f, 127);
  // the dense packer's exponent: floor(log2 amax) - 2, by repeated halving here
  for (float amax : {1.f, 0.999f, 6.f, 8.f, 1e-3f, 3e38f, 1e-40f, 0.f}) {
    int fl = 0;
    for (double a = amax; a >= 2; a /= 2) ++fl;
    for (double a = amax; a > 0 && a < 1; a *= 2) --fl;
    bad += e8m0_for_amax(amax) != (amax == 0.f ? 127 : std::max(0, fl - 2 + 127));
  }
  CHECK(bad == 0, strf("mxfp4: e2m1 of all 16 codes and the bf16 / 2e2m1+12 / 2e2m1 decode tables = the fields' values, nearest "
                       "e2m1 ties to even and saturates, E8M0 2^(e-127) incl. 2^-127, the dense exponent (bad %d)", bad));
}

void test_mxfp4_pack(MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const std::string name = strf("mxfp4 pack %s n=%lld k=%lld group=%lld", role_name(role), (long long)n,
                                (long long)k, (long long)group);
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kMXFP4, role, n, k, group);
  const int64_t g = group ? group : 32, kp = round_up(k, g), ng = kp / g;
  const int64_t np = role == MatrixRole::kGateUp ? 2 * round_up(n / 2, 16) : round_up(n, 16);
  const int64_t data_end = round_up(64 + np * kp / 2, 64);
  CHECK(h.format == 5 && h.np == np && h.kp == kp && h.group == g && h.scale_offset == data_end &&
            h.total_bytes == round_up(data_end + np * ng, 64),
        name + strf(": header (np=%d kp=%d group=%d total=%lld)", h.np, h.kp, h.group, (long long)h.total_bytes));
  const Mxfp4Matrix d = random_mxfp4(h, 0, 254, rng);
  const AlignedBytes a = pack(h, d, 0xAA), b = pack(h, d, 0x55);
  std::vector<uint8_t> touched(size_t(h.total_bytes), 0);
  std::fill(touched.begin(), touched.begin() + 64, 1);
  int64_t bad = 0;
  for (int64_t pr = 0; pr < np; ++pr) {
    const int64_t r = dense_of(h, pr);
    for (int64_t c = 0; c < kp; ++c) {
      const int64_t off = 64 + (pr / 16) * (kp * 8) + (c / 4) * 32 + (pr % 16) * 2 + (c % 2);
      const int code = (c / 2) % 2 ? a.get()[off] >> 4 : a.get()[off] & 15;
      bad += code != (r >= 0 && c < k ? d.q[size_t(r * k + c)] : 0);
      touched[size_t(off)] = 1;
    }
    for (int64_t G = 0; G < ng; ++G) {
      const int64_t off = h.scale_offset + ((pr / 16) * ng + G) * 16 + pr % 16;
      bad += a.get()[off] != (r >= 0 ? d.e[size_t(r * ng + G)] : 0);
      touched[size_t(off)] = 1;
    }
  }
  for (int64_t i = 0; i < h.total_bytes; ++i) bad += !touched[size_t(i)] && a.get()[i] != 0;
  // dense weights: the packer's codes and exponents are OCP MX's, computed here in double
  std::vector<float> w(size_t(n * k));
  for (auto& x : w) x = float(rng.gauss() * std::ldexp(1.0, int(rng.below(20)) - 10));
  w[0] = 0.f;
  std::vector<const float*> wrows;
  Mxfp4Matrix q;
  q.q.resize(size_t(n * k));
  q.e.resize(size_t(n * ng));
  for (int64_t r = 0; r < n; ++r) {
    wrows.push_back(w.data() + r * k);
    for (int64_t G = 0; G < ng; ++G) {
      double amax = 0;
      for (int64_t c = G * g; c < std::min(k, (G + 1) * g); ++c) amax = std::max(amax, std::fabs(double(w[size_t(r * k + c)])));
      const int e = amax > 0 ? std::max(0, int(std::floor(std::log2(amax))) - 2 + 127) : 127;
      q.e[size_t(r * ng + G)] = uint8_t(e);
      for (int64_t c = G * g; c < std::min(k, (G + 1) * g); ++c) {
        const double x = std::ldexp(double(w[size_t(r * k + c)]), 127 - e);
        int best = 0;  // nearest magnitude, the even code on ties
        for (int m = 1; m < 8; ++m) {
          const double dm = std::fabs(std::fabs(x) - ref_e2m1(m)), db = std::fabs(std::fabs(x) - ref_e2m1(best));
          if (dm < db || (dm == db && m % 2 == 0)) best = m;
        }
        q.q[size_t(r * k + c)] = uint8_t((std::signbit(x) ? 8 : 0) | best);
      }
    }
    q.rows.push_back(q.q.data() + r * k), q.erows.push_back(q.e.data() + r * ng);
  }
  AlignedBytes dense(size_t(h.total_bytes), 0x77);
  pack_matrix(h, wrows.data(), dense.get());
  const AlignedBytes want = pack(h, q, 0);
  CHECK(bad == 0 && std::memcmp(a.get(), b.get(), a.n) == 0 && std::memcmp(dense.get(), want.get(), a.n) == 0,
        name + strf(": codes and E8M0 bytes at their offsets, padding and gaps 0, deterministic (bad %lld); dense "
                    "weights packed as OCP MX rounds them: %s", (long long)bad,
                    std::memcmp(dense.get(), want.get(), a.n) == 0 ? "same bytes" : "DIFFER"));
}

// Packs a 32 x 64 kGateUp matrix of code 2 (1.0) with code 17 at (21, 7) or e = 0xff at (9, 1);
// returns the domain_error's text ("" if none) and whether out is untouched.
std::pair<std::string, bool> pack_refused(uint8_t code_21_7, uint8_t e_9_1) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kMXFP4, MatrixRole::kGateUp, 32, 64, 0);
  std::vector<uint8_t> q(32 * 64, 2), e(32 * 2, 127);
  q[21 * 64 + 7] = code_21_7;
  e[9 * 2 + 1] = e_9_1;
  std::vector<const uint8_t*> rows, erows;
  for (int r = 0; r < 32; ++r) rows.push_back(q.data() + r * 64), erows.push_back(e.data() + r * 2);
  AlignedBytes out(size_t(h.total_bytes), 0xAB);
  std::string what;
  try {
    mxfp4_pack_matrix(h, rows.data(), erows.data(), 4, out.get());
  } catch (const std::domain_error& err) {
    what = err.what();
  }
  return {what, out.get()[0] == 0xAB};
}

void test_mxfp4_pack_errors() {
  const auto [code, untouched1] = pack_refused(17, 127);
  const auto [nan, untouched2] = pack_refused(2, 0xFF);
  CHECK(code.find("expert 4: row 21, column 7") != std::string::npos && untouched1 &&
            nan.find("expert 4: row 9") != std::string::npos && nan.find("NaN") != std::string::npos && untouched2 &&
            pack_refused(15, 254).first.empty() && pack_refused(8, 0).first.empty(),
        strf("mxfp4 pack: code 17 ('%s') and the E8M0 NaN 0xff ('%s') refused before anything is written; "
             "codes 8 / 15 and e = 0 / 254 accepted", code.c_str(), nan.c_str()));
}

// c = gemm(rows a [m, lda]) over blocks [b0, b1), ldc = 16 * (b1 - b0).
std::vector<float> run(const IsaKernels& isa, const uint8_t* blob, const uint16_t* a, int64_t lda, int64_t m,
                       int64_t b0, int64_t b1) {
  std::vector<float> c(size_t(m * 16 * (b1 - b0)), f32_from_bits(0x7FC12345u));
  isa.gemm_mxfp4(reinterpret_cast<const PackedMatrixHeader*>(blob), a, lda, m, b0, b1, c.data(), 16 * (b1 - b0));
  return c;
}

// Column j of a 16 x 256 matrix holds code (c + j) % 16 at input c and E8M0 byte kEdge[(G + j) % 7] in
// group G: one-hot rows give every code times every edge scale, which must be exact (ldexp).
void test_mxfp4_gemm_edges(const IsaKernels& isa) {
  static const uint8_t kEdge[7] = {0, 1, 100, 126, 127, 128, 254};
  const int64_t k = 256;
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kMXFP4, MatrixRole::kPlain, 16, k, 32);
  Mxfp4Matrix d;
  d.q.resize(16 * k), d.e.resize(16 * 8);
  for (int64_t j = 0; j < 16; ++j) {
    for (int64_t c = 0; c < k; ++c) d.q[size_t(j * k + c)] = uint8_t((c + j) % 16);
    for (int64_t G = 0; G < 8; ++G) d.e[size_t(j * 8 + G)] = kEdge[(G + j) % 7];
    d.rows.push_back(d.q.data() + j * k), d.erows.push_back(d.e.data() + j * 8);
  }
  const AlignedBytes blob = pack(h, d, 0);
  std::vector<uint16_t> a(size_t(k * k), 0);
  for (int64_t r = 0; r < k; ++r) a[size_t(r * k + r)] = 0x3F80;  // 1.0
  int64_t bad = 0;
  for (int64_t m : {k, int64_t(8), int64_t(1)})
    for (int64_t r0 = 0; r0 < k; r0 += m) {
      const std::vector<float> c = run(isa, blob.get(), a.data() + r0 * k, k, m, 0, 1);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < 16; ++j) {
          const int64_t kk = r0 + r;
          const float want = std::ldexp(e2m1_to_float(d.q[size_t(j * k + kk)]), int(d.e[size_t(j * 8 + kk / 32)]) - 127);
          bad += f32_bits(c[size_t(r * 16 + j)]) != f32_bits(want) && !(want == 0.f && c[size_t(r * 16 + j)] == 0.f);
        }
    }
  CHECK(bad == 0, strf("gemm_mxfp4 [%s]: every code (±0, 0.5, ±6) x E8M0 0, 1, 100, 126, 127, 128, 254 exactly "
                       "(one-hot rows, M = 256, 8, 1; amx: its fallback for such scales; bad %lld)", isa.name,
                       (long long)bad));
}

void test_mxfp4_gemm(const IsaKernels& isa, const IsaKernels& generic, MatrixRole role, int64_t n, int64_t k,
                     int64_t group, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kMXFP4, role, n, k, group);
  const int64_t kp = h.kp, np = h.np, nb = np / 16, ng = kp / h.group;
  const Mxfp4Matrix d = random_mxfp4(h, 117, 137, rng);
  const AlignedBytes blob = pack(h, d, 0);
  double worst = 0;
  bool same = true, splits = true, rows_alone = true;
  const int64_t lda = kp + 16;
  // avx512: decode tiles up to 8 rows, then the prefill; the int16 kernel: row tiles of 4, then 3, 2 or 1, in
  // chunks of 64 rows; amx: tiles from 4 rows
  for (int64_t m : {1, 2, 3, 5, 8, 9, 33, 67}) {
    std::vector<uint16_t> a(size_t(m * lda), 0);  // N(0, 1) bf16 rows, zero past k
    for (int64_t i = 0; i < m * k; ++i) a[size_t(i / k * lda + i % k)] = ref_bf16(float(rng.gauss()));
    const std::vector<float> full = run(isa, blob.get(), a.data(), lda, m, 0, nb);
    const std::vector<float> gen = run(generic, blob.get(), a.data(), lda, m, 0, nb);
    same = same && (!generic_bits(isa, m) || std::memcmp(full.data(), gen.data(), full.size() * 4) == 0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < np; ++pr) {
        const int64_t dr = dense_of(h, pr);
        double sum = 0, mag = 0, act = 0;  // act: the int16 activations' rounding (mxfp4_format.h)
        for (int64_t c = 0; dr >= 0 && c < k; ++c) {
          const double wv = ref_e2m1(d.q[size_t(dr * k + c)]) * std::ldexp(1.0, d.e[size_t(dr * ng + c / h.group)] - 127);
          const double t = double(bf16_value(a[size_t(r * lda + c)])) * wv;
          sum += t, mag += std::fabs(t);
          double block_max = 0;  // the largest |a| of c's block of 32 inputs
          for (int64_t i = c / 32 * 32; i < c / 32 * 32 + 32 && i < k; ++i)
            block_max = std::max(block_max, std::fabs(double(bf16_value(a[size_t(r * lda + i)]))));
          int e2 = 0;
          std::frexp(block_max, &e2);  // block_max in [2^(e2-1), 2^e2): E = e2 - 1, x's step 2^(E - 13)
          act += block_max > 0 ? std::fabs(wv) * std::ldexp(1.0, e2 - 1 - 14) : 0;
        }
        const double err = std::fabs(double(full[size_t(r * np + pr)]) - sum);
        worst = std::max(worst, std::isfinite(err) ? err / ((2.0 * kp + 8) * 0x1.0p-24 * mag + act + 1e-30) : 1e30);
      }
    for (int64_t b = 0; b < nb; ++b) {  // one call per block, then one row at a time: the same bits
      const std::vector<float> c = run(isa, blob.get(), a.data(), lda, m, b, b + 1);
      for (int64_t r = 0; r < m; ++r) splits = splits && !std::memcmp(&c[size_t(r * 16)], &full[size_t(r * np + 16 * b)], 64);
    }
    if (nb > 1) {  // blocks [1, nb) in one call: the multi-block tiles from b0 > 0
      const std::vector<float> c = run(isa, blob.get(), a.data(), lda, m, 1, nb);
      for (int64_t r = 0; r < m; ++r)
        splits = splits && !std::memcmp(&c[size_t(r * (np - 16))], &full[size_t(r * np + 16)], size_t(np - 16) * 4);
    }
    const bool tiles = std::string(isa.name) == "amx" && m >= amx::prefill_min_rows();  // tdpbf16ps' own sums
    for (int64_t r = 0; r < m && m > 1 && !tiles; ++r)
      rows_alone = rows_alone && !std::memcmp(run(isa, blob.get(), a.data() + r * lda, lda, 1, 0, nb).data(),
                                              &full[size_t(r * np)], size_t(np) * 4);
  }
  CHECK(worst <= 1.0 && splits && rows_alone && same,
        strf("gemm_mxfp4 [%s] %s n=%lld k=%lld group=%d M={1,2,3,5,8,9,33,67}: max err/tol %.3f vs the dequantized "
             "reference, block splits %s, rows alone (below amx's tiles) %s, generic's bits where the integer "
             "kernels run %s", isa.name, role_name(role), (long long)n, (long long)k, h.group, worst,
             splits ? "bit-identical" : "DIFFER", rows_alone ? "bit-identical" : "DIFFER", same ? "yes" : "NO"));
}

// The integer kernels' activations at their edges (mxfp4_format.h): row 0 spans 2^-40 .. 2^40 inside each block
// of 32 (x rounds its small values), row 1 holds an Inf and row 2 a NaN in one block (their rows' outputs
// not finite: NaN from the integer kernels, ±Inf or NaN from avx512's fp32 sums; the other rows untouched), row 3 is zero (+0 out), row 4 sits near bf16's smallest normals (shift clamped).
void test_mxfp4_gemm_activations(const IsaKernels& isa, const IsaKernels& generic, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kMXFP4, MatrixRole::kPlain, 32, 128, 32);
  const int64_t k = 128, np = h.np, nb = np / 16, ng = h.kp / 32;
  const Mxfp4Matrix d = random_mxfp4(h, 117, 137, rng);
  const AlignedBytes blob = pack(h, d, 0);
  const int64_t m = 5;
  std::vector<uint16_t> a(size_t(m * k), 0);
  for (int64_t c = 0; c < k; ++c) {
    a[size_t(c)] = ref_bf16(float(std::ldexp(rng.gauss(), int(rng.below(81)) - 40)));
    a[size_t(k + c)] = a[size_t(2 * k + c)] = ref_bf16(float(rng.gauss()));
    a[size_t(4 * k + c)] = ref_bf16(float(std::ldexp(rng.gauss(), -120)));
  }
  a[size_t(k + 37)] = 0x7F80;       // +Inf
  a[size_t(2 * k + 100)] = 0x7FC1;  // NaN
  const std::vector<float> got = run(isa, blob.get(), a.data(), k, m, 0, nb);
  const std::vector<float> gen = run(generic, blob.get(), a.data(), k, m, 0, nb);
  double worst = 0;
  bool nan_rows = true, zero_row = true;
  for (int64_t pr = 0; pr < np; ++pr) {
    const int64_t dr = dense_of(h, pr);
    nan_rows = nan_rows && !std::isfinite(got[size_t(np + pr)]) && std::isnan(got[size_t(2 * np + pr)]);
    zero_row = zero_row && f32_bits(got[size_t(3 * np + pr)]) == 0;
    for (int64_t r : {int64_t(0), int64_t(4)}) {
      double sum = 0, bound = 1e-300;
      for (int64_t c = 0; dr >= 0 && c < k; ++c) {
        const double wv = ref_e2m1(d.q[size_t(dr * k + c)]) * std::ldexp(1.0, d.e[size_t(dr * ng + c / 32)] - 127);
        double block_max = 0;
        for (int64_t i = c / 32 * 32; i < c / 32 * 32 + 32; ++i)
          block_max = std::max(block_max, std::fabs(double(bf16_value(a[size_t(r * k + i)]))));
        sum += double(bf16_value(a[size_t(r * k + c)])) * wv;
        // fp32 sum + x's rounding: 2^-14 of the block's largest (2^-114's step where the shift is clamped)
        bound += std::fabs(wv) * (2 * k * 0x1.0p-24 * block_max + std::max(block_max * 0x1.0p-14, 0x1.0p-114));
      }
      worst = std::max(worst, std::fabs(double(got[size_t(r * np + pr)]) - sum) / bound);
    }
  }
  const auto same_bits = [](const std::vector<float>& x, const float* y) {  // NaN bits aside (any NaN is a NaN)
    for (size_t i = 0; i < x.size(); ++i)
      if (f32_bits(x[i]) != f32_bits(y[i]) && !(std::isnan(x[i]) && std::isnan(y[i]))) return false;
    return true;
  };
  bool same = !generic_bits(isa, m) || same_bits(got, gen.data());
  for (int64_t r = 0; r < m; ++r)  // each row alone: the integer kernels where amx's tiles take 5 rows
    same = same && (!generic_bits(isa, 1) || same_bits(run(isa, blob.get(), a.data() + r * k, k, 1, 0, nb), &gen[size_t(r * np)]));
  CHECK(worst <= 1.0 && nan_rows && zero_row && same,
        strf("gemm_mxfp4 [%s] activations: 2^-40..2^40 in a block and near 2^-120 within bound (max err/tol %.3f), "
             "Inf / NaN rows not finite %s, zero row +0 %s, generic's bits where the integer kernels run (5 rows, "
             "each alone) %s", isa.name, worst, nan_rows ? "yes" : "NO", zero_row ? "yes" : "NO", same ? "yes" : "NO"));
}

// A portable BlockDecoder for the emulator: every weight e2m1(q) * 2^(e - 127) to bf16 (exact), never refusing.
bool scalar_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out) {
  const int64_t kp = w->kp, ng = kp / w->group;
  const uint8_t* q = packed_data(w) + block * int4a_block_data_bytes(kp);
  for (int64_t j = 0; j < kp / 4; ++j)  // k-quad j: byte b = column b / 2, input 4j + b % 2 (+ 2: high nibble)
    for (int b = 0; b < 32; ++b)
      for (int t = 0; t < 2; ++t) {
        const uint8_t e = packed_scales(w)[(block * ng + 4 * j / w->group) * kMxfp4ScaleRecordBytes + b / 2];
        const float v = e2m1_to_float(uint8_t(t ? q[j * 32 + b] >> 4 : q[j * 32 + b] & 0xF)) * e8m0_to_float(e);
        const uint16_t bf = uint16_t(f32_bits(v) >> 16);
        out[(2 * j + t) * 64 + 2 * b] = uint8_t(bf), out[(2 * j + t) * 64 + 2 * b + 1] = uint8_t(bf >> 8);
      }
  return true;
}

// amx's kMXFP4 tiles (gemm_mxfp4_amx.cpp). A block decoded with its scales folded in is the kBF16 pair layout of
// the exact weights (written out again from the codes and E8M0 bytes), by the portable decoder (every byte
// 0..254: subnormals, Inf from 6 * 2^127) and, where the CPU runs AVX-512, by amx's, which refuses exactly the
// blocks with a nonzero code under a byte outside [2, 252] (bytes 0..254, then 2..252: none refused). The tiles over decoded blocks (emulator) give the kBF16 tiles' bits over
// a kBF16 matrix of the same values. Where the CPU has AMX, the amx table's gemm_mxfp4 gives, from prefill_min_rows() rows, the
// emulator's bits, and avx512's on a block with a scale of 254 (its fallback).
void test_mxfp4_amx_tiles(const std::vector<Isa>& isas, MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kMXFP4, role, n, k, group);
  const int64_t kp = h.kp, np = h.np, nb = np / 16, ng = kp / h.group;
  const IsaKernels *tiles = nullptr, *vec512 = nullptr;  // the amx table, the avx512 one: where the CPU runs them
  for (const Isa& isa : isas) {
    if (std::string(isa.k->name) == "avx512") vec512 = isa.k;
    if (std::string(isa.k->name) == "amx") tiles = isa.k;
  }
  AlignedBytes want(size_t(kp * 32), 0), got(size_t(kp * 32), 0), vec(size_t(kp * 32), 0);
  bool scalar_ok = true, vec_ok = true;
  for (const auto [e_lo, e_hi] : {std::pair{0, 254}, std::pair{2, 252}}) {
    const Mxfp4Matrix all = random_mxfp4(h, e_lo, e_hi, rng);
    const AlignedBytes ball = pack(h, all, 0);
    const auto* hall = reinterpret_cast<const PackedMatrixHeader*>(ball.get());
    for (int64_t b = 0; b < nb; ++b) {
      bool extreme = false;  // a nonzero code under a scale byte outside [2, 252] in the block
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t dr = dense_of(h, 16 * b + j);
        for (int64_t c = 0; dr >= 0 && c < k; ++c) {
          const int e = all.e[size_t(dr * ng + c / h.group)];
          extreme = extreme || ((e < 2 || e > 252) && (all.q[size_t(dr * k + c)] & 7) != 0);
        }
      }
      for (int64_t p = 0; p < kp / 2; ++p)
        for (int64_t j = 0; j < 16; ++j)
          for (int64_t t = 0; t < 2; ++t) {
            const int64_t dr = dense_of(h, 16 * b + j), c = 2 * p + t;
            const double v = dr >= 0 && c < k ? ref_e2m1(all.q[size_t(dr * k + c)]) *
                                                    std::ldexp(1.0, all.e[size_t(dr * ng + c / h.group)] - 127)
                                              : 0.0;
            const uint16_t bf = uint16_t(f32_bits(float(v)) >> 16);  // float(v) exact (or Inf)
            want.get()[p * 64 + j * 4 + t * 2] = uint8_t(bf), want.get()[p * 64 + j * 4 + t * 2 + 1] = uint8_t(bf >> 8);
          }
      scalar_block_to_bf16(hall, b, got.get());
      scalar_ok = scalar_ok && std::memcmp(got.get(), want.get(), size_t(kp * 32)) == 0;
      if (vec512) {
        const bool decoded = amx::mxfp4_block_to_bf16(hall, b, vec.get());
        vec_ok = vec_ok && decoded == !extreme && (extreme || std::memcmp(vec.get(), want.get(), size_t(kp * 32)) == 0);
      }
    }
  }
  // The tiles: E8M0 in [96, 158] (sums far from fp32's ends, whose Inf / NaN bits the hardware may set apart from
  // the emulator), a kBF16 matrix [n, kp] of the same values (zero past k); for the real tiles also one row of
  // block 1 (where there is one), group 0, at 254.
  Mxfp4Matrix d = random_mxfp4(h, 96, 158, rng);
  const AlignedBytes bmx = pack(h, d, 0);
  std::vector<float> dense(size_t(n * kp), 0.f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      dense[size_t(r * kp + c)] = float(ref_e2m1(d.q[size_t(r * k + c)]) * std::ldexp(1.0, d.e[size_t(r * ng + c / h.group)] - 127));
  const AlignedBytes bbf = ktmoe_test::pack(packed_matrix_header(WeightFormat::kBF16, role, n, kp, 0), dense);
  const auto* hmx = reinterpret_cast<const PackedMatrixHeader*>(bmx.get());
  const auto* hbf = reinterpret_cast<const PackedMatrixHeader*>(bbf.get());
  Mxfp4Matrix edge = d;
  edge.rows.clear(), edge.erows.clear();
  for (int64_t r = 0; r < h.n; ++r) edge.rows.push_back(edge.q.data() + r * k), edge.erows.push_back(edge.e.data() + r * ng);
  const int64_t edge_row = nb > 1 ? dense_of(h, 16 + 3) : -1;
  if (edge_row >= 0) edge.e[size_t(edge_row * ng)] = 254;
  const AlignedBytes bedge = pack(h, edge, 0);
  const auto* hedge = reinterpret_cast<const PackedMatrixHeader*>(bedge.get());
  bool emu_ok = true, real_ok = true;
  const int64_t lda = kp + 16, ldc = np + 3;
  for (int64_t m : {16, 17, 33}) {
    std::vector<uint16_t> a(size_t(m * lda), 0);
    for (int64_t i = 0; i < m * k; ++i) a[size_t(i / k * lda + i % k)] = ref_bf16(float(rng.gauss()));
    std::vector<float> c_mx(size_t(m * ldc), 0.f), c_bf(size_t(m * ldc), 0.f), c_real(size_t(m * ldc), 0.f);
    amx::gemm_bf16_tiles<amx::EmulatedTileOps>(hmx, a.data(), lda, m, 0, nb, c_mx.data(), ldc, scalar_block_to_bf16);
    amx::gemm_bf16_tiles<amx::EmulatedTileOps>(hbf, a.data(), lda, m, 0, nb, c_bf.data(), ldc);
    emu_ok = emu_ok && std::memcmp(c_mx.data(), c_bf.data(), c_mx.size() * 4) == 0;
    if (tiles && vec512 && m >= amx::prefill_min_rows()) {
      tiles->gemm_mxfp4(hmx, a.data(), lda, m, 0, nb, c_real.data(), ldc);
      real_ok = real_ok && std::memcmp(c_real.data(), c_mx.data(), c_mx.size() * 4) == 0;
      tiles->gemm_mxfp4(hedge, a.data(), lda, m, 0, nb, c_real.data(), ldc);  // block 1 by avx512
      std::vector<float> c_512(size_t(m * 16), 0.f);
      if (nb > 1) vec512->gemm_mxfp4(hedge, a.data(), lda, m, 1, 2, c_512.data(), 16);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = 0; col < np; ++col)
          real_ok = real_ok && f32_bits(c_real[size_t(r * ldc + col)]) ==
                                   f32_bits(nb > 1 && col / 16 == 1 ? c_512[size_t(r * 16 + col - 16)] : c_mx[size_t(r * ldc + col)]);
    }
  }
  CHECK(scalar_ok && vec_ok && emu_ok && real_ok,
        strf("amx mxfp4 %s n=%lld k=%lld group=%d: decoded blocks = the exact weights' kBF16 layout (E8M0 0..254) by "
             "the portable decoder %s, by amx's AVX-512 decoder %s; emulated tiles over them = kBF16 tiles' bits %s; "
             "amx table on this CPU = emulator's bits %s", role_name(role), (long long)n, (long long)k, h.group,
             scalar_ok ? "yes" : "NO", vec512 ? (vec_ok ? "yes" : "NO") : "(no AVX-512 here)", emu_ok ? "yes" : "NO",
             tiles ? (real_ok ? "yes" : "NO") : "(no AMX here)"));
}

}  // namespace

void test_mxfp4(const std::vector<Isa>& isas, Rng& rng) {
  // (role, n, k, group; 0: the MX block 32): partial blocks of columns and groups, every role
  const std::tuple<MatrixRole, int64_t, int64_t, int64_t> shapes[] = {
      {MatrixRole::kPlain, 40, 72, 0},     {MatrixRole::kGateUp, 74, 96, 32}, {MatrixRole::kDown, 33, 200, 0},
      {MatrixRole::kGateUp, 40, 300, 64},  {MatrixRole::kPlain, 130, 288, 32}, {MatrixRole::kDown, 48, 520, 128},
      {MatrixRole::kGateUp, 32, 32, 0}};
  test_mxfp4_values();
  for (const auto& [role, n, k, group] : shapes) test_mxfp4_pack(role, n, k, group, rng);
  test_mxfp4_pack_errors();
  IsaKernels int16 = {};  // avx512's integer kernel for every M (amx uses it below its tiles)
  for (const IsaKernels* isa : tables_and_avx512_variant(isas, &int16, "avx512 gemm_mxfp4_int16",
                                                         [](IsaKernels& t) { t.gemm_mxfp4 = avx512::gemm_mxfp4_int16; })) {
    test_mxfp4_gemm_edges(*isa);
    test_mxfp4_gemm_activations(*isa, *isas.front().k, rng);
    for (const auto& [role, n, k, group] : shapes) test_mxfp4_gemm(*isa, *isas.front().k, role, n, k, group, rng);
  }
  for (const auto& [role, n, k, group] : shapes) test_mxfp4_amx_tiles(isas, role, n, k, group, rng);
}

}  // namespace ktmoe_test
