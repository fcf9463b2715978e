// The kFP8 format (fp8_format.h): e4m3 decode of all 256 bytes, the packer's bytes against
// the layout's offset formulas (written out again here), the bytes and scales it refuses,
// and every ISA's gemm_fp8 against a double-precision reference of the dequantized weights
// x bf16 activations: tight tolerance, exact values for one-hot activations, bits that do
// not depend on the (b0, b1) split or on M.
#include <stdexcept>
#include <string>
#include <utility>

#include "check.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/pack.h"
#include "kernels/pack_fp8.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

// The kFP8 header of a test shape: group 0 is per channel (one k-group, group = kp).
PackedMatrixHeader fp8_header(MatrixRole role, int64_t n, int64_t k, int64_t group) {
  return packed_matrix_header(WeightFormat::kFP8, role, n, k, group ? group : round_up(k, 32));
}

// e4m3fn from its fields in double: (-1)^s * 2^(e-7) * (1 + m/8), subnormal 2^-6 * m/8.
double ref_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::nan("");
  return sign * (e == 0 ? std::ldexp(double(m), -9) : std::ldexp(8.0 + m, e - 10));
}

uint8_t random_e4m3(Rng& rng) {  // any byte but the two NaNs
  uint8_t b;
  do b = uint8_t(rng.next() >> 56); while ((b & 0x7F) == 0x7F);
  return b;
}

// A dense e4m3 matrix and its checkpoint scales, as fp8_pack_matrix takes them.
struct Fp8Dense {
  int64_t n = 0, k = 0, ngroups = 0;
  std::vector<uint8_t> q;          // [n][k]
  std::vector<float> scale_store;  // the scale tensor(s)
  std::vector<const uint8_t*> rows;
  std::vector<const float*> scale_rows;
};

// group > 0: block scales [ceil(rows/128), ngroups] (kGateUp: one tensor for gate, one for
// up, as a checkpoint stores them); group = 0: per-channel scales [n].
Fp8Dense random_fp8(MatrixRole role, int64_t n, int64_t k, int64_t group, int64_t kp, Rng& rng) {
  Fp8Dense d;
  d.n = n, d.k = k, d.ngroups = group ? kp / group : 1;
  d.q.resize(size_t(n * k));
  for (auto& b : d.q) b = random_e4m3(rng);
  const int64_t parts = role == MatrixRole::kGateUp ? 2 : 1, prow = n / parts;
  const int64_t bn = group ? 128 : 1, per_part = (prow + bn - 1) / bn * d.ngroups;
  d.scale_store.resize(size_t(parts * per_part));
  for (auto& s : d.scale_store) s = float(std::ldexp(0.5 + rng.uniform(), -8 - int(rng.below(4))));
  for (int64_t r = 0; r < n; ++r) d.rows.push_back(d.q.data() + r * k);
  for (int64_t p = 0; p < parts; ++p) {
    const auto part = fp8_scale_rows(d.scale_store.data() + p * per_part, prow, bn, d.ngroups);
    d.scale_rows.insert(d.scale_rows.end(), part.begin(), part.end());
  }
  return d;
}

AlignedBytes pack_fp8(const PackedMatrixHeader& h, const Fp8Dense& d, uint8_t fill) {
  AlignedBytes out(size_t(h.total_bytes), fill);
  fp8_pack_matrix(h, d.rows.data(), d.scale_rows.data(), 0, out.get());
  return out;
}

// Packed row of dense row r (packed_format.h's role rule, written out again).
int64_t ref_packed_row_fp8(MatrixRole role, int64_t n, int64_t r) {
  if (role != MatrixRole::kGateUp) return r;
  const int64_t inter = n / 2, up = r >= inter ? 1 : 0, i = r - up * inter;
  return (i / 16) * 32 + up * 16 + i % 16;
}

// Values by packed row and column, read by the format's offset formulas.
struct Fp8Decoded {
  std::vector<uint8_t> byte;   // [np][kp]
  std::vector<float> scale;    // [np][kp / group]
  std::vector<uint8_t> touched;
};

Fp8Decoded decode_fp8(const uint8_t* blob) {
  PackedMatrixHeader h;
  std::memcpy(&h, blob, sizeof(h));
  const int64_t np = h.np, kp = h.kp, ng = kp / h.group;
  Fp8Decoded D;
  D.byte.resize(size_t(np * kp));
  D.scale.resize(size_t(np * ng));
  D.touched.assign(size_t(h.total_bytes), 0);
  for (int i = 0; i < 64; ++i) D.touched[size_t(i)] = 1;
  for (int64_t pr = 0; pr < np; ++pr) {
    for (int64_t c = 0; c < kp; ++c) {
      const int64_t off = h.data_offset + (pr / 16) * (kp * 16) + (c / 2) * 32 + (pr % 16) * 2 + (c % 2);
      D.byte[size_t(pr * kp + c)] = blob[off];
      D.touched[size_t(off)] = 1;
    }
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t off = h.scale_offset + ((pr / 16) * ng + g) * 64 + (pr % 16) * 4;
      std::memcpy(&D.scale[size_t(pr * ng + g)], blob + off, 4);
      for (int i = 0; i < 4; ++i) D.touched[size_t(off + i)] = 1;
    }
  }
  return D;
}

void test_e4m3_decode() {
  int bad = 0;
  for (int b = 0; b < 256; ++b) {
    const double ref = ref_e4m3(uint8_t(b));
    const float got = e4m3_to_float(uint8_t(b));
    if (std::isnan(ref)) bad += !std::isnan(got) || e4m3_is_nan(uint8_t(b)) != true;
    else bad += double(got) != ref || std::signbit(got) != bool(b & 0x80) || e4m3_is_nan(uint8_t(b));
  }
  for (int m = 0; m < 8; ++m)  // the kernels' scaled subnormals: bf16 of m * 2^-17
    bad += double(bf16_value(e4m3_subnormal_scaled_bf16(m))) != std::ldexp(double(m), -17);
  CHECK(bad == 0, strf("fp8: e4m3_to_float of all 256 bytes = the value of its fields (NaN only for "
                       "0x7f / 0xff), scaled subnormals exact (bad %d)", bad));
}

// e4m3_from_float: every finite byte's value maps back to the byte; a point between two
// neighbours goes to the nearer, a midpoint to the even byte; beyond 448 saturates.
void test_e4m3_encode() {
  int bad = 0;
  for (int b = 0; b < 256; ++b) {
    if (e4m3_is_nan(uint8_t(b))) continue;
    const float v = e4m3_to_float(uint8_t(b));
    bad += e4m3_from_float(v) != uint8_t(b);
    const int next = (b & 0x7F) + 1;
    if ((next & 0x7F) == 0x7F) continue;
    const uint8_t nb = uint8_t((b & 0x80) | next);
    const double lo = ref_e4m3(uint8_t(b)), hi = ref_e4m3(nb), mid = (lo + hi) / 2;
    bad += e4m3_from_float(float(lo + (hi - lo) / 4)) != uint8_t(b);
    bad += e4m3_from_float(float(hi - (hi - lo) / 4)) != nb;
    bad += e4m3_from_float(float(mid)) != ((b & 1) ? nb : uint8_t(b));
  }
  bad += e4m3_from_float(470.f) != 0x7E || e4m3_from_float(-1e30f) != 0xFE;
  CHECK(bad == 0, strf("fp8: e4m3_from_float rounds to nearest even, saturates at 448 (bad %d)", bad));
}

void test_fp8_pack(MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const std::string name = strf("fp8 pack %s n=%lld k=%lld group=%lld", role_name(role), (long long)n,
                                (long long)k, (long long)group);
  const PackedMatrixHeader h = fp8_header(role, n, k, group);
  const int64_t kp = group ? round_up(k, group) : round_up(k, 32), g = group ? group : kp;
  const int64_t np = role == MatrixRole::kGateUp ? 2 * round_up(n / 2, 16) : round_up(n, 16);
  const int64_t data_end = round_up(64 + np * kp, 64), scale_bytes = (np / 16) * (kp / g) * 64;
  CHECK(h.magic == kPackedMagic && h.version == kPackedVersion && h.format == 3 && h.role == uint8_t(role) &&
            h.n == n && h.k == k && h.np == np && h.kp == kp && h.group == g && h.data_offset == 64 &&
            h.scale_offset == data_end && h.total_bytes == round_up(data_end + scale_bytes, 64) &&
            h.reserved == 0,
        name + strf(": header (np=%d kp=%d group=%d total=%lld)", h.np, h.kp, h.group, (long long)h.total_bytes));
  const Fp8Dense d = random_fp8(role, n, k, group, kp, rng);
  const AlignedBytes a = pack_fp8(h, d, 0xAA), b = pack_fp8(h, d, 0x55);
  CHECK(std::memcmp(a.get(), b.get(), a.n) == 0, name + ": deterministic, every byte written");
  const Fp8Decoded D = decode_fp8(a.get());
  int64_t bad_val = 0, bad_pad = 0, bad_gap = 0;
  std::vector<int64_t> logical(size_t(np), -1);
  for (int64_t r = 0; r < n; ++r) logical[size_t(ref_packed_row_fp8(role, n, r))] = r;
  for (int64_t pr = 0; pr < np; ++pr) {
    const int64_t r = logical[size_t(pr)];
    for (int64_t c = 0; c < kp; ++c) {
      const uint8_t got = D.byte[size_t(pr * kp + c)];
      if (r < 0 || c >= k) bad_pad += got != 0;
      else bad_val += got != d.q[size_t(r * k + c)];
    }
    for (int64_t G = 0; G < kp / g; ++G) {
      const float got = D.scale[size_t(pr * (kp / g) + G)];
      if (r < 0) bad_pad += got != 0.f;
      else bad_val += f32_bits(got) != f32_bits(d.scale_rows[size_t(r)][G]);
    }
  }
  for (size_t i = 64; i < D.touched.size(); ++i) bad_gap += !D.touched[i] && a.get()[i] != 0;
  CHECK(bad_val == 0 && bad_pad == 0 && bad_gap == 0,
        name + strf(": bytes and scales at their offsets (bad %lld), padding 0 (bad %lld), gaps 0 (bad %lld)",
                    (long long)bad_val, (long long)bad_pad, (long long)bad_gap));
}

// Packs a 32 x 64 kGateUp matrix of 1.0 bytes with one bad byte at (21, 7) and per-channel scales
// with one bad scale at row 9, into a blob filled with 0xAB; returns the domain_error's text
// ("" if none) and whether the blob's first byte is still 0xAB.
std::pair<std::string, bool> pack_refused(uint8_t byte_21_7, float scale_9, int64_t expert) {
  const PackedMatrixHeader h = fp8_header(MatrixRole::kGateUp, 32, 64, 0);
  std::vector<uint8_t> q(32 * 64, 0x38);  // 1.0
  q[21 * 64 + 7] = byte_21_7;
  std::vector<float> s(32, 1.f);
  s[9] = scale_9;
  std::vector<const uint8_t*> rows;
  for (int r = 0; r < 32; ++r) rows.push_back(q.data() + r * 64);
  const auto srows = fp8_scale_rows(s.data(), 32, 1, 1);
  AlignedBytes out(size_t(h.total_bytes), 0xAB);
  std::string what;
  try {
    fp8_pack_matrix(h, rows.data(), srows.data(), expert, out.get());
  } catch (const std::domain_error& e) {
    what = e.what();
  }
  return {what, out.get()[0] == 0xAB};
}

void test_fp8_pack_errors() {
  bool threw = false;
  try {
    packed_matrix_header(WeightFormat::kFP8, MatrixRole::kPlain, 16, 64, 48);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw, "fp8 pack: group 48 (not a multiple of 32) rejected");
  for (uint8_t nan : {uint8_t(0x7F), uint8_t(0xFF)}) {
    const auto [what, untouched] = pack_refused(nan, 1.f, 3);
    CHECK(what.find("expert 3: row 21, column 7") != std::string::npos && what.find("NaN") != std::string::npos &&
              untouched,
          strf("fp8 pack: NaN byte 0x%02x refused before anything is written ('%s')", nan, what.c_str()));
  }
  const auto [what, untouched] = pack_refused(0x38, std::numeric_limits<float>::infinity(), 5);
  CHECK(what.find("expert 5: row 9") != std::string::npos && untouched,
        strf("fp8 pack: an infinite scale refused before anything is written ('%s')", what.c_str()));
  CHECK(pack_refused(0x38, 1.f, 0).first.empty() && pack_refused(0xFE, -2.f, 0).first.empty(),
        "fp8 pack: finite bytes (0xfe = -448) and scales (negative too) accepted");
}

// Every non-NaN byte through the kernel: W[j][c] = byte c (NaN -> 0), scale 1, one-hot
// activation rows (row r = unit vector e_r): c[r][j] must be e4m3(byte r) exactly, for
// M = kp at once, M = 2 and M = 1 per row.
void test_fp8_gemm_all_bytes(const IsaKernels& isa) {
  const auto gemm = isa.gemm_fp8;
  const int64_t n = 16, k = 256;
  const PackedMatrixHeader h = fp8_header(MatrixRole::kPlain, n, k, 128);
  std::vector<uint8_t> q(size_t(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < k; ++c) q[size_t(j * k + c)] = e4m3_is_nan(uint8_t(c)) ? 0 : uint8_t(c);
  std::vector<float> s(size_t(2), 1.f);
  std::vector<const uint8_t*> rows;
  for (int64_t r = 0; r < n; ++r) rows.push_back(q.data() + r * k);
  const auto srows = fp8_scale_rows(s.data(), n, 128, 2);
  AlignedBytes blob(size_t(h.total_bytes));
  fp8_pack_matrix(h, rows.data(), srows.data(), 0, blob.get());
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const int64_t lda = k + 32;
  std::vector<uint16_t> a(size_t(k * lda), 0);
  for (int64_t r = 0; r < k; ++r) a[size_t(r * lda + r)] = 0x3F80;  // 1.0
  int64_t bad = 0;
  std::vector<float> c(size_t(k * 16));
  gemm(hw, a.data(), lda, k, 0, 1, c.data(), 16);
  for (int64_t r = 0; r < k; ++r)
    for (int64_t j = 0; j < 16; ++j) bad += double(c[size_t(r * 16 + j)]) != ref_e4m3(q[size_t(j * k + r)]);
  for (int64_t r = 0; r + 2 <= k; r += 2) {
    float c2[32];
    gemm(hw, a.data() + r * lda, lda, 2, 0, 1, c2, 16);
    for (int64_t i = 0; i < 32; ++i) bad += double(c2[i]) != ref_e4m3(q[size_t((i % 16) * k + r + i / 16)]);
    gemm(hw, a.data() + r * lda, lda, 1, 0, 1, c2, 16);
    for (int64_t j = 0; j < 16; ++j) bad += double(c2[j]) != ref_e4m3(q[size_t(j * k + r)]);
  }
  CHECK(bad == 0, strf("gemm_fp8 [%s]: all 254 non-NaN bytes decode exactly (one-hot rows, M = 256, 2, 1; bad %lld)",
                       isa.name, (long long)bad));
}

// s * e4m3(q) of d by packed row [np][kp] (independent of the packer's layout), and each packed row's
// largest |weight| in row_mag.
std::vector<double> fp8_dequantized(const PackedMatrixHeader& h, const Fp8Dense& d, std::vector<double>* row_mag) {
  const int64_t kp = h.kp, np = h.np;
  std::vector<double> wv(size_t(np * kp), 0.0);
  row_mag->assign(size_t(np), 0.0);
  for (int64_t r = 0; r < h.n; ++r) {
    const int64_t pr = ref_packed_row_fp8(MatrixRole(h.role), h.n, r);
    for (int64_t c = 0; c < h.k; ++c) {
      const double v = d.scale_rows[size_t(r)][c / h.group] * ref_e4m3(d.q[size_t(r * h.k + c)]);
      wv[size_t(pr * kp + c)] = v;
      (*row_mag)[size_t(pr)] = std::max((*row_mag)[size_t(pr)], std::fabs(v));
    }
  }
  return wv;
}

void test_fp8_gemm(const IsaKernels& isa, MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng) {
  const auto gemm = isa.gemm_fp8;
  const PackedMatrixHeader h = fp8_header(role, n, k, group);
  const int64_t kp = h.kp, np = h.np, nb = np / 16;
  const Fp8Dense d = random_fp8(role, n, k, group, kp, rng);
  const AlignedBytes blob = pack_fp8(h, d, 0);
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  std::vector<double> row_mag;
  const std::vector<double> wv = fp8_dequantized(h, d, &row_mag);
  const float sentinel = f32_from_bits(0x7FC12345u);
  double worst = 0;
  bool guards = true, splits = true, m_indep = true;
  for (int64_t m : {1, 2, 3, 8, 17, 70}) {
    const int64_t lda = kp + 16;
    std::vector<uint16_t> a(size_t(m * lda), 0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) a[size_t(r * lda + c)] = ref_bf16(float(rng.gauss()));
    std::vector<double> ref(size_t(m * np)), tol(size_t(m * np));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < np; ++pr) {
        double s = 0, sa = 0;
        for (int64_t c = 0; c < kp; ++c) {
          const double t = double(bf16_value(a[size_t(r * lda + c)])) * wv[size_t(pr * kp + c)];
          s += t, sa += std::fabs(t);
        }
        ref[size_t(r * np + pr)] = s, tol[size_t(r * np + pr)] = (2.0 * kp + 8) * 0x1.0p-24 * sa + 1e-30;
      }
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, nb}, {nb - 1, nb}};
    if (nb > 2) ranges.push_back({1, nb - 1});
    std::vector<float> full;
    for (auto [b0, b1] : ranges) {
      const int64_t cols = 16 * (b1 - b0), ldc = cols + 5;
      std::vector<float> c(size_t(m * ldc), sentinel);
      gemm(hw, a.data(), lda, m, b0, b1, c.data(), ldc);
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
      }
    }
    for (int64_t b = 0; b < nb; ++b) {  // one call per block: the same bits
      std::vector<float> c(size_t(m * 16));
      gemm(hw, a.data(), lda, m, b, b + 1, c.data(), 16);
      for (int64_t r = 0; r < m; ++r)
        splits = splits && std::memcmp(&c[size_t(r * 16)], &full[size_t(r * np + 16 * b)], 64) == 0;
    }
    const bool tiles = std::string(isa.name) == "amx" && m >= amx::fp8_prefill_min_rows();  // tdpbf16ps' own sums
    for (int64_t r = 0; r < m && m > 1 && !tiles; ++r) {  // one row at a time: the same bits
      std::vector<float> c(static_cast<size_t>(np));
      gemm(hw, a.data() + r * lda, lda, 1, 0, nb, c.data(), np);
      m_indep = m_indep && std::memcmp(c.data(), &full[size_t(r * np)], size_t(np) * 4) == 0;
    }
  }
  CHECK(worst <= 1.0 && guards && splits && m_indep,
        strf("gemm_fp8 [%s] %s n=%lld k=%lld group=%d M={1,2,3,8,17,70}: max err/tol %.3f vs the dequantized "
             "reference, guards %s, block splits %s, rows alone (below amx's tiles) %s",
             isa.name, role_name(role), (long long)n, (long long)k, h.group, worst, guards ? "intact" : "OVERWRITTEN",
             splits ? "bit-identical" : "DIFFER", m_indep ? "bit-identical" : "DIFFER"));
}

}  // namespace

void test_fp8(const std::vector<Isa>& isas, Rng& rng) {
  test_e4m3_decode();
  test_e4m3_encode();
  struct Shape {
    MatrixRole role;
    int64_t n, k, group;
  };
  const Shape shapes[] = {{MatrixRole::kPlain, 40, 72, 0},      {MatrixRole::kGateUp, 2 * 37, 96, 0},
                          {MatrixRole::kDown, 33, 200, 128},    {MatrixRole::kGateUp, 2 * 20, 300, 128},
                          {MatrixRole::kPlain, 130, 300, 0},    {MatrixRole::kDown, 48, 520, 256},
                          {MatrixRole::kGateUp, 2 * 16, 32, 32}};
  for (const Shape& s : shapes) test_fp8_pack(s.role, s.n, s.k, s.group, rng);
  test_fp8_pack_errors();
  for (const Isa& isa : isas) {
    test_fp8_gemm_all_bytes(*isa.k);
    for (const Shape& s : shapes) test_fp8_gemm(*isa.k, s.role, s.n, s.k, s.group, rng);
  }
  for (const Shape& s : shapes) {  // the amx tiles' decode and epilogue (test_amx_scaled.cpp)
    const PackedMatrixHeader h = fp8_header(s.role, s.n, s.k, s.group);
    const Fp8Dense d = random_fp8(s.role, s.n, s.k, s.group, h.kp, rng);
    const AlignedBytes blob = pack_fp8(h, d, 0);
    std::vector<double> row_mag;
    const std::vector<double> wv = fp8_dequantized(h, d, &row_mag);
    test_amx_scaled_tiles(isas, reinterpret_cast<const PackedMatrixHeader*>(blob.get()), wv, row_mag, rng);
  }
}

}  // namespace ktmoe_test
