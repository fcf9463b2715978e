// The kINT4A format (int4_affine_format.h): the exact packer's bytes against the layout's
// offset formulas (written out again here), the dense packer's codes / scales / zero points
// against GPTQ's min/max rule, what the packers refuse, and every ISA's gemm_int4_affine
// against a double-precision reference of the dequantized weights x bf16 activations: tight
// tolerance, exact s * (q - z) for one-hot activations, bits that do not depend on the
// (b0, b1) split or on M, and avx2 bit-identical to generic (the same fp32 operations).
#include <stdexcept>
#include <string>
#include <utility>

#include "check.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/avx512/amx_entry_points.h"
#include "kernels/pack.h"
#include "kernels/pack_int4_affine.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

// Packed row of dense row r (packed_format.h's role rule, written out again).
int64_t ref_packed_row(MatrixRole role, int64_t n, int64_t r) {
  if (role != MatrixRole::kGateUp) return r;
  const int64_t inter = n / 2, up = r >= inter ? 1 : 0, i = r - up * inter;
  return (i / 16) * 32 + up * 16 + i % 16;
}

// An int4 checkpoint's matrix: codes [n][k], scales and zero points [n][ngroups].
struct Int4Checkpoint {
  int64_t n = 0, k = 0, ngroups = 0;
  std::vector<uint8_t> q, z;
  std::vector<float> s;
  std::vector<const uint8_t*> rows, zrows;
  std::vector<const float*> srows;
};

// Scales are bf16 values (as compressed-tensors stores them) of magnitude ~2^-6; zero points
// 0..16, or all 8 (symmetric).
Int4Checkpoint random_checkpoint(int64_t n, int64_t k, int64_t group, bool zeros, Rng& rng) {
  Int4Checkpoint d;
  d.n = n, d.k = k, d.ngroups = (k + group - 1) / group;
  d.q.resize(size_t(n * k));
  for (auto& b : d.q) b = uint8_t(rng.below(16));
  d.s.resize(size_t(n * d.ngroups));
  for (auto& s : d.s) s = ref_bf16_value(float(std::ldexp((rng.uniform() + 0.5) * (rng.below(2) ? 1 : -1), -6)));
  d.z.resize(size_t(n * d.ngroups));
  for (auto& z : d.z) z = zeros ? uint8_t(rng.below(17)) : uint8_t(8);
  for (int64_t r = 0; r < n; ++r) {
    d.rows.push_back(d.q.data() + r * k);
    d.srows.push_back(d.s.data() + r * d.ngroups);
    d.zrows.push_back(d.z.data() + r * d.ngroups);
  }
  return d;
}

// Values by packed row and column, read by the format's offset formulas.
struct Int4Decoded {
  std::vector<uint8_t> q, z;  // [np][kp], [np][ng]
  std::vector<float> s;       // [np][ng]
  std::vector<uint8_t> touched;
};

Int4Decoded decode(const uint8_t* blob) {
  PackedMatrixHeader h;
  std::memcpy(&h, blob, sizeof(h));
  const int64_t np = h.np, kp = h.kp, ng = kp / h.group;
  Int4Decoded D;
  D.q.resize(size_t(np * kp));
  D.s.resize(size_t(np * ng));
  D.z.resize(size_t(np * ng));
  D.touched.assign(size_t(h.total_bytes), 0);
  for (int i = 0; i < 64; ++i) D.touched[size_t(i)] = 1;
  for (int64_t pr = 0; pr < np; ++pr) {
    for (int64_t c = 0; c < kp; ++c) {
      const int64_t off = h.data_offset + (pr / 16) * (kp * 8) + (c / 4) * 32 + (pr % 16) * 2 + (c % 2);
      D.q[size_t(pr * kp + c)] = (c / 2) % 2 ? blob[off] >> 4 : blob[off] & 15;
      D.touched[size_t(off)] = 1;
    }
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t rec = h.scale_offset + ((pr / 16) * ng + g) * 80;
      std::memcpy(&D.s[size_t(pr * ng + g)], blob + rec + (pr % 16) * 4, 4);
      D.z[size_t(pr * ng + g)] = blob[rec + 64 + pr % 16];
      for (int i = 0; i < 4; ++i) D.touched[size_t(rec + (pr % 16) * 4 + i)] = 1;
      D.touched[size_t(rec + 64 + pr % 16)] = 1;
    }
  }
  return D;
}

AlignedBytes pack_checkpoint(const PackedMatrixHeader& h, const Int4Checkpoint& d, bool zeros, uint8_t fill) {
  AlignedBytes out(size_t(h.total_bytes), fill);
  int4a_pack_matrix(h, d.rows.data(), d.srows.data(), zeros ? d.zrows.data() : nullptr, 0, out.get());
  return out;
}

// Every value at its offset, every other byte 0, the same bytes whatever out held before.
bool blob_holds(const PackedMatrixHeader& h, const AlignedBytes& a, const AlignedBytes& b,
                const std::vector<int64_t>& dense_of, const Int4Checkpoint& d, int64_t* bad) {
  const Int4Decoded D = decode(a.get());
  const int64_t kp = h.kp, ng = kp / h.group;
  for (int64_t pr = 0; pr < h.np; ++pr) {
    const int64_t r = dense_of[size_t(pr)];
    for (int64_t c = 0; c < kp; ++c)
      *bad += D.q[size_t(pr * kp + c)] != (r >= 0 && c < h.k ? d.q[size_t(r * h.k + c)] : 0);
    for (int64_t g = 0; g < ng; ++g) {
      *bad += f32_bits(D.s[size_t(pr * ng + g)]) != (r >= 0 ? f32_bits(d.s[size_t(r * ng + g)]) : 0u);
      *bad += D.z[size_t(pr * ng + g)] != (r >= 0 ? d.z[size_t(r * ng + g)] : 0);
    }
  }
  for (int64_t i = 0; i < h.total_bytes; ++i) *bad += !D.touched[size_t(i)] && a.get()[i] != 0;
  return *bad == 0 && std::memcmp(a.get(), b.get(), size_t(h.total_bytes)) == 0;
}

std::vector<int64_t> dense_rows(MatrixRole role, const PackedMatrixHeader& h) {
  std::vector<int64_t> dense_of(size_t(h.np), -1);
  for (int64_t r = 0; r < h.n; ++r) dense_of[size_t(ref_packed_row(role, h.n, r))] = r;
  return dense_of;
}

void test_int4a_exact_pack(MatrixRole role, int64_t n, int64_t k, int64_t group, bool zeros, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4A, role, n, k, group);
  const int64_t kp = (k + group - 1) / group * group, np = role == MatrixRole::kGateUp ? 2 * ((n / 2 + 15) / 16 * 16)
                                                                                      : (n + 15) / 16 * 16;
  const int64_t data = np * kp / 2, scales = (np / 16) * (kp / group) * 80;
  const int64_t want_total = ((64 + data + 63) / 64 * 64 + scales + 63) / 64 * 64;
  Int4Checkpoint d = random_checkpoint(n, k, group, zeros, rng);
  const AlignedBytes a = pack_checkpoint(h, d, zeros, 0xAA), b = pack_checkpoint(h, d, zeros, 0x55);
  int64_t bad = 0;
  const bool ok = blob_holds(h, a, b, dense_rows(role, h), d, &bad);
  CHECK(h.kp == kp && h.np == np && h.group == group && h.total_bytes == want_total && ok,
        strf("int4_affine exact pack %s n=%lld k=%lld group=%lld zeros=%d: header sizes, every code / s / z at its "
             "offset, padding 0, independent of the buffer (bad %lld)",
             role_name(role), (long long)n, (long long)k, (long long)group, int(zeros), (long long)bad));
}

// pack_matrix's dense rounding (GPTQ's min/max, pack.cpp [NOTE]) from the rule, per (row, group).
void test_int4a_dense_pack(MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4A, role, n, k, group);
  std::vector<float> w(size_t(n * k));
  for (auto& v : w) v = float(rng.gauss() * (rng.below(8) == 0 ? 3.0 : 1.0));
  for (int64_t c = 0; c < k; ++c) w[size_t(c)] = std::fabs(w[size_t(c)]);  // row 0 all >= 0: z = 0
  for (int64_t c = 0; c < k; ++c) w[size_t(k + c)] = 0.f;                 // row 1 all 0: s = 0
  std::vector<const float*> rows;
  for (int64_t r = 0; r < n; ++r) rows.push_back(w.data() + r * k);
  AlignedBytes a(size_t(h.total_bytes), 0x5A);
  pack_matrix(h, rows.data(), a.get());
  Int4Checkpoint d;  // the expected codes, scales and zero points, by the rule
  const int64_t ng = h.kp / group;
  d.n = n, d.k = k, d.ngroups = ng;
  d.q.assign(size_t(n * k), 0), d.s.assign(size_t(n * ng), 0.f), d.z.assign(size_t(n * ng), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t c0 = g * group, c1 = std::min(k, c0 + group);
      float lo = 0.f, hi = 0.f;
      for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, w[size_t(r * k + c)]), hi = std::max(hi, w[size_t(r * k + c)]);
      const float s = ref_bf16_value((hi - lo) / 15.f);
      if (!(s > 0.f)) continue;
      const float z = std::min(15.f, std::max(0.f, std::nearbyint(-lo / s)));
      d.s[size_t(r * ng + g)] = s, d.z[size_t(r * ng + g)] = uint8_t(z);
      for (int64_t c = c0; c < c1; ++c)
        d.q[size_t(r * k + c)] = uint8_t(std::min(15.f, std::max(0.f, std::nearbyint(w[size_t(r * k + c)] / s) + z)));
    }
  int64_t bad = 0;
  const bool ok = blob_holds(h, a, a, dense_rows(role, h), d, &bad);
  double err = 0;  // every weight within s/2 (+ 15 s 2^-8: s is rounded to bf16) of its value
  const Int4Decoded D = decode(a.get());
  for (int64_t r = 0; r < n; ++r) {
    const int64_t pr = ref_packed_row(role, n, r);
    for (int64_t c = 0; c < k; ++c) {
      const int64_t gi = pr * ng + c / group;
      const double v = double(D.s[size_t(gi)]) * (double(D.q[size_t(pr * h.kp + c)]) - D.z[size_t(gi)]);
      err = std::max(err, std::fabs(v - w[size_t(r * k + c)]) - 0.56 * D.s[size_t(gi)]);
    }
  }
  CHECK(ok && err <= 0 && d.z[0] == 0 && d.s[size_t(ng)] == 0.f,
        strf("int4_affine dense pack %s n=%lld k=%lld group=%lld: GPTQ min/max codes, bf16 s, z; every weight within "
             "0.56 s (bad %lld, worst excess %.3g)",
             role_name(role), (long long)n, (long long)k, (long long)group, (long long)bad, err));
}

void test_int4a_pack_errors() {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4A, MatrixRole::kGateUp, 32, 64, 32);
  std::vector<uint8_t> q(size_t(32 * 64), 3), z(size_t(32 * 2), 8);
  std::vector<float> s(size_t(32 * 2), 0.25f);
  std::vector<const uint8_t*> rows, zrows;
  std::vector<const float*> srows;
  for (int64_t r = 0; r < 32; ++r) rows.push_back(&q[size_t(r * 64)]), zrows.push_back(&z[size_t(r * 2)]),
                                   srows.push_back(&s[size_t(r * 2)]);
  auto refused = [&](std::string* what) {
    AlignedBytes out(size_t(h.total_bytes), 0xEE);
    try {
      int4a_pack_matrix(h, rows.data(), srows.data(), zrows.data(), 3, out.get());
    } catch (const std::domain_error& e) {
      *what = e.what();
      for (int64_t i = 0; i < h.total_bytes; ++i)
        if (out.get()[i] != 0xEE) return false;
      return true;
    }
    return false;
  };
  std::string what;
  bool threw = false;
  try {
    packed_matrix_header(WeightFormat::kINT4A, MatrixRole::kPlain, 16, 64, 48);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw, "int4_affine pack: group 48 (not a multiple of 32) rejected");
  q[size_t(5 * 64 + 7)] = 16;
  bool ok = refused(&what);
  CHECK(ok && what.find("expert 3: row 5, column 7: code 16") != std::string::npos,
        strf("int4_affine pack: code 16 refused before anything is written ('%s')", what.c_str()));
  q[size_t(5 * 64 + 7)] = 15;
  z[size_t(9 * 2 + 1)] = 17;
  ok = refused(&what);
  CHECK(ok && what.find("row 9: zero point 17 of k-group 1") != std::string::npos,
        strf("int4_affine pack: zero point 17 refused before anything is written ('%s')", what.c_str()));
  z[size_t(9 * 2 + 1)] = 16;
  s[3] = std::numeric_limits<float>::infinity();
  ok = refused(&what);
  CHECK(ok && what.find("row 1: scale of k-group 1 is not finite") != std::string::npos,
        strf("int4_affine pack: an infinite scale refused before anything is written ('%s')", what.c_str()));
  s[3] = -0.5f;
  CHECK(!refused(&what), "int4_affine pack: codes 15, zero points 16 and negative scales accepted");
}

// Every code against every zero point through the kernel: one-hot activation rows give
// s * (q - z) exactly (bf16 s: the products and the one sum are exact in fp32).
void test_int4a_gemm_one_hot(const IsaKernels& isa) {
  const int64_t n = 17 * 16, k = 64;  // column j: zero point j / 16, codes c % 16
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4A, MatrixRole::kPlain, n, k, 32);
  std::vector<uint8_t> q(size_t(n * k)), z(size_t(n * 2));
  std::vector<float> s(size_t(n * 2));
  std::vector<const uint8_t*> rows, zrows;
  std::vector<const float*> srows;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; ++c) q[size_t(j * k + c)] = uint8_t((c + j) % 16);
    for (int g = 0; g < 2; ++g)
      z[size_t(j * 2 + g)] = uint8_t(j / 16), s[size_t(j * 2 + g)] = ref_bf16_value(float(0.37 * (g ? -1 : 1) * (1 + j % 5)));
    rows.push_back(&q[size_t(j * k)]), zrows.push_back(&z[size_t(j * 2)]), srows.push_back(&s[size_t(j * 2)]);
  }
  AlignedBytes blob(size_t(h.total_bytes));
  int4a_pack_matrix(h, rows.data(), srows.data(), zrows.data(), 0, blob.get());
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const int64_t lda = k + 32;
  std::vector<uint16_t> a(size_t(k * lda), 0);
  for (int64_t r = 0; r < k; ++r) a[size_t(r * lda + r)] = 0x3F80;  // 1.0
  int64_t bad = 0;
  for (int64_t m : {k, int64_t(3), int64_t(1)})
    for (int64_t r0 = 0; r0 + m <= k; r0 += m) {
      std::vector<float> c(size_t(m * n));
      isa.gemm_int4_affine(hw, a.data() + r0 * lda, lda, m, 0, n / 16, c.data(), n);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kk = r0 + r, gi = j * 2 + kk / 32;
          const double want = double(s[size_t(gi)]) * (double(q[size_t(j * k + kk)]) - z[size_t(gi)]);
          bad += double(c[size_t(r * n + j)]) != want;
        }
    }
  CHECK(bad == 0, strf("gemm_int4_affine [%s]: every code x every zero point 0..16 gives s * (q - z) exactly (one-hot "
                       "rows, M = 64, 3, 1; bad %lld)", isa.name, (long long)bad));
}

// s * (q - z) of d by packed row [np][kp] (exact), and 32 times each packed row's largest |s| in row_mag (the
// fp32 bound's magnitude: Σ a·q with q <= 15 and o·Σ a with |o| <= 16 |s|).
std::vector<double> int4a_dequantized(const PackedMatrixHeader& h, const Int4Checkpoint& d, std::vector<double>* row_mag) {
  const int64_t kp = h.kp, np = h.np, n = h.n, k = h.k, group = h.group, ng = kp / group;
  std::vector<double> wv(size_t(np * kp), 0.0);
  row_mag->assign(size_t(np), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t pr = ref_packed_row(MatrixRole(h.role), n, r);
    for (int64_t c = 0; c < k; ++c) {
      const int64_t gi = r * ng + c / group;
      wv[size_t(pr * kp + c)] = double(d.s[size_t(gi)]) * (double(d.q[size_t(r * k + c)]) - d.z[size_t(gi)]);
      (*row_mag)[size_t(pr)] = std::max((*row_mag)[size_t(pr)], 32 * std::fabs(double(d.s[size_t(gi)])));
    }
  }
  return wv;
}

void test_int4a_gemm(const IsaKernels& isa, const IsaKernels& generic, MatrixRole role, int64_t n, int64_t k, int64_t group,
               bool zeros, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4A, role, n, k, group);
  const int64_t kp = h.kp, np = h.np, nb = np / 16;
  const Int4Checkpoint d = random_checkpoint(n, k, group, zeros, rng);
  const AlignedBytes blob = pack_checkpoint(h, d, zeros, 0);
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  std::vector<double> smax;  // 32 max |s| per packed row
  const std::vector<double> wv = int4a_dequantized(h, d, &smax);
  const float sentinel = f32_from_bits(0x7FC12345u);
  double worst = 0;
  bool guards = true, splits = true, m_indep = true, same_as_generic = true;
  for (int64_t m : {1, 2, 3, 17, 64, 67}) {  // the int16 kernel: row tiles of 4, then 3, 2 or 1, chunks of 64
    const int64_t lda = kp + 16;
    std::vector<uint16_t> a(size_t(m * lda), 0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) a[size_t(r * lda + c)] = ref_bf16(float(rng.gauss()));
    // the int16 kernel (amx below its tiles, or called directly) rounds each activation by up to 2^-14 of its
    // block of 32's largest power of two (gemm_nibble_int16_avx512.cpp): that term is added to its bound
    const bool int16 = std::string(isa.name).find("int16") != std::string::npos ||
                       (std::string(isa.name) == "amx" && m < amx::prefill_min_rows());
    std::vector<double> ref(size_t(m * np)), tol(size_t(m * np));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < np; ++pr) {
        double sum = 0, sx = 0, act = 0;
        for (int64_t c = 0; c < kp; ++c) {
          const double x = double(bf16_value(a[size_t(r * lda + c)]));
          sum += x * wv[size_t(pr * kp + c)];
          sx += std::fabs(x);
          if (int16) {
            double block_max = 0;
            for (int64_t i = c / 32 * 32; i < c / 32 * 32 + 32; ++i)
              block_max = std::max(block_max, std::fabs(double(bf16_value(a[size_t(r * lda + i)]))));
            int e2 = 0;
            std::frexp(block_max, &e2);
            act += block_max > 0 ? std::fabs(wv[size_t(pr * kp + c)]) * std::ldexp(1.0, e2 - 1 - 14) : 0;
          }
        }
        // fp32 rounding of Σ a·q (|q| <= 15), Σ a and the two scaled terms (|s·z| <= 16 |s|)
        ref[size_t(r * np + pr)] = sum, tol[size_t(r * np + pr)] = (2.0 * kp + 8) * 0x1.0p-24 * smax[size_t(pr)] * sx + act + 1e-30;
      }
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, nb}, {nb - 1, nb}};
    if (nb > 2) ranges.push_back({1, nb - 1});
    std::vector<float> full;
    for (auto [b0, b1] : ranges) {
      const int64_t cols = 16 * (b1 - b0), ldc = cols + 5;
      std::vector<float> c(size_t(m * ldc), sentinel);
      isa.gemm_int4_affine(hw, a.data(), lda, m, b0, b1, c.data(), ldc);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          const size_t e = size_t(r * np + 16 * b0 + j);
          const double err = std::fabs(double(c[size_t(r * ldc + j)]) - ref[e]);
          worst = std::max(worst, std::isfinite(err) ? err / tol[e] : 1e30);
        }
        for (int64_t j = cols; j < ldc; ++j) guards = guards && f32_bits(c[size_t(r * ldc + j)]) == f32_bits(sentinel);
      }
      if (b0 == 0 && b1 == nb) {
        full.assign(size_t(m * np), 0.f);
        for (int64_t r = 0; r < m; ++r) std::memcpy(&full[size_t(r * np)], &c[size_t(r * ldc)], size_t(np) * 4);
        if (&isa != &generic && std::string(isa.name) == "avx2") {
          std::vector<float> g(size_t(m * np));
          generic.gemm_int4_affine(hw, a.data(), lda, m, 0, nb, g.data(), np);
          same_as_generic = same_as_generic && std::memcmp(g.data(), full.data(), g.size() * 4) == 0;
        }
      }
    }
    for (int64_t b = 0; b < nb; ++b) {  // one call per block: the same bits
      std::vector<float> c(size_t(m * 16));
      isa.gemm_int4_affine(hw, a.data(), lda, m, b, b + 1, c.data(), 16);
      for (int64_t r = 0; r < m; ++r)
        splits = splits && std::memcmp(&c[size_t(r * 16)], &full[size_t(r * np + 16 * b)], 64) == 0;
    }
    const bool tiles = std::string(isa.name) == "amx" && m >= amx::prefill_min_rows();  // tdpbf16ps' own sums
    for (int64_t r = 0; r < m && m > 1 && !tiles; ++r) {  // one row at a time: the same bits
      std::vector<float> c(static_cast<size_t>(np));
      isa.gemm_int4_affine(hw, a.data() + r * lda, lda, 1, 0, nb, c.data(), np);
      m_indep = m_indep && std::memcmp(c.data(), &full[size_t(r * np)], size_t(np) * 4) == 0;
    }
  }
  CHECK(worst <= 1.0 && guards && splits && m_indep && same_as_generic,
        strf("gemm_int4_affine [%s] %s n=%lld k=%lld group=%d zeros=%d M={1,2,3,17,64,67}: max err/tol %.3f vs the "
             "dequantized reference, guards %s, block splits %s, rows alone (below amx's tiles) %s%s",
             isa.name, role_name(role), (long long)n, (long long)k, h.group, int(zeros), worst,
             guards ? "intact" : "OVERWRITTEN", splits ? "bit-identical" : "DIFFER", m_indep ? "bit-identical" : "DIFFER",
             std::string(isa.name) == "avx2" ? (same_as_generic ? ", = generic bits" : ", DIFFERS from generic") : ""));
}

}  // namespace

void test_int4_affine(const std::vector<Isa>& isas, Rng& rng) {
  struct Shape {
    MatrixRole role;
    int64_t n, k, group;
    bool zeros;
  };
  const Shape shapes[] = {{MatrixRole::kPlain, 40, 72, 32, false},   {MatrixRole::kGateUp, 2 * 37, 96, 32, true},
                          {MatrixRole::kDown, 33, 200, 128, true},    {MatrixRole::kGateUp, 2 * 20, 300, 128, false},
                          {MatrixRole::kPlain, 130, 300, 64, true},   {MatrixRole::kDown, 48, 520, 256, true},
                          {MatrixRole::kGateUp, 2 * 16, 32, 32, true}};
  for (const Shape& s : shapes) test_int4a_exact_pack(s.role, s.n, s.k, s.group, s.zeros, rng);
  for (const Shape& s : shapes) test_int4a_dense_pack(s.role, s.n, s.k, s.group, rng);
  test_int4a_pack_errors();
  const IsaKernels& generic = *isas.front().k;
  IsaKernels int16 = {};  // avx512's int16 kernel for every M (amx uses it below its tiles)
  for (const IsaKernels* isa :
       tables_and_avx512_variant(isas, &int16, "avx512 gemm_int4_affine_int16",
                                 [](IsaKernels& t) { t.gemm_int4_affine = avx512::gemm_int4_affine_int16; })) {
    test_int4a_gemm_one_hot(*isa);
    for (const Shape& s : shapes) test_int4a_gemm(*isa, generic, s.role, s.n, s.k, s.group, s.zeros, rng);
  }
  for (const Shape& s : shapes) {  // the amx tiles' decode and epilogue (test_amx_scaled.cpp)
    const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4A, s.role, s.n, s.k, s.group);
    const Int4Checkpoint d = random_checkpoint(s.n, s.k, s.group, s.zeros, rng);
    const AlignedBytes blob = pack_checkpoint(h, d, s.zeros, 0);
    std::vector<double> row_mag;
    const std::vector<double> wv = int4a_dequantized(h, d, &row_mag);
    test_amx_scaled_tiles(isas, reinterpret_cast<const PackedMatrixHeader*>(blob.get()), wv, row_mag, rng);
  }
}

}  // namespace ktmoe_test
