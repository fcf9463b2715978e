// [NOTE] gemm_ggml of every ISA table over GGML rows where they lie (kernels/ggml/), against the type's exact
// decoder (kernels/ggml/ggml_decode.cpp, itself held bit for bit to gguf.quants.dequantize by
// tests/test_ggml_dequantize.py):
//   * the weights: activation rows that are unit vectors (one 1.0 at column j) read back W[i][j] itself,
//     equal to the decoder's value (a kernel that fuses the scales into its sums still applies each
//     rounding of gguf's formula once: the other columns contribute exact zeros);
//   * the sums: random bf16 activations against a double dot with the decoded weights, within fp32
//     summation's bound (k · 2^-23 · Σ|a·w|; plus the activations' rounding where amx's decode rows take them
//     as int16), for M = 1, 2, 3, 5, 17 rows (the kernels' decode and prefill paths), rows read at any byte
//     offset (17-byte mxfp4 blocks);
//   * the same bits for any split of the n rows.
// Blocks are random bytes with the fp16 scale fields set to sane values (their byte offsets from ggml's
// block structs, written out here, not taken from ggml_blocks.h; iq1_m's scale is the top nibbles of the
// four 16-bit words at bytes 48..55).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "check.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/generic/f16_scalar.h"
#include "tests.h"

namespace ktmoe_test {
namespace {

struct GgmlCase {
  GgmlType type;
  std::vector<int> f16_fields;  // byte offsets of the block's fp16 scales
};

const GgmlCase kCases[] = {
    {GgmlType::kQ4_0, {0}},      {GgmlType::kQ4_1, {0, 2}},   {GgmlType::kQ5_0, {0}},
    {GgmlType::kQ5_1, {0, 2}},   {GgmlType::kQ8_0, {0}},      {GgmlType::kQ2_K, {80, 82}},
    {GgmlType::kQ3_K, {108}},    {GgmlType::kQ4_K, {0, 2}},   {GgmlType::kQ5_K, {0, 2}},
    {GgmlType::kQ6_K, {208}},    {GgmlType::kIQ4_NL, {0}},    {GgmlType::kIQ4_XS, {0}},
    {GgmlType::kMXFP4, {}},      {GgmlType::kF16, {}},        {GgmlType::kBF16, {}},
    {GgmlType::kF32, {}},        {GgmlType::kIQ2_XXS, {0}},   {GgmlType::kIQ2_XS, {0}},
    {GgmlType::kIQ2_S, {0}},     {GgmlType::kIQ3_XXS, {0}},   {GgmlType::kIQ3_S, {0}},
    {GgmlType::kIQ1_S, {0}},     {GgmlType::kIQ1_M, {}},
};

// fp16 scale bit patterns the first blocks take (each field its own, in turn): +-0, the smallest and largest
// subnormals, the smallest normal, 1, 65504 (widened exactly by every kernel: F16C, not a flush to zero).
const uint16_t kF16Edges[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x3C00, 0x7BFF};

uint16_t sane_f16(Rng& rng) { return f32_to_f16_rne(float(0.001 + 0.019 * rng.uniform())); }

// n rows of k weights of `c`'s type: random bytes, sane scales (the first blocks' fp16 fields kF16Edges,
// the rest small normal values; mxfp4: exponents 119..123; plain types: small normal values), starting
// `skew` bytes into the buffer.
std::vector<uint8_t> random_rows(const GgmlCase& c, const GgmlTypeTraits& t, int64_t n, int64_t k, int skew, Rng& rng) {
  const int64_t blocks = n * (k / t.block_elems), bytes = blocks * t.block_bytes;
  std::vector<uint8_t> buf(size_t(bytes + skew));
  uint8_t* p = buf.data() + skew;
  for (int64_t i = 0; i < bytes; ++i) p[i] = uint8_t(rng.next());
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = p + b * t.block_bytes;
    for (size_t f = 0; f < c.f16_fields.size(); ++f) {
      const int off = c.f16_fields[f];
      const size_t edge = size_t(b) * c.f16_fields.size() + f;
      const uint16_t h = edge < std::size(kF16Edges) ? kF16Edges[edge] : sane_f16(rng);
      std::memcpy(blk + off, &h, 2);
    }
    if (c.type == GgmlType::kMXFP4) blk[0] = uint8_t(119 + rng.below(5));
    if (c.type == GgmlType::kIQ1_M) {  // the scale's bits 4 w .. 4 w + 3 are the top nibble of word w
      const uint16_t h = sane_f16(rng);
      for (int w = 0; w < 4; ++w) {
        uint16_t v;
        std::memcpy(&v, blk + 48 + 2 * w, 2);
        v = uint16_t((v & 0x0FFF) | ((h >> (4 * w)) & 0xF) << 12);
        std::memcpy(blk + 48 + 2 * w, &v, 2);
      }
    }
  }
  if (c.type == GgmlType::kF32 || c.type == GgmlType::kF16 || c.type == GgmlType::kBF16)
    for (int64_t i = 0; i < blocks; ++i) {
      const float v = float(0.05 * rng.gauss());
      if (c.type == GgmlType::kF32) std::memcpy(p + 4 * i, &v, 4);
      const uint16_t h = c.type == GgmlType::kF16 ? f32_to_f16_rne(v) : uint16_t(f32_bits(v) >> 16);
      if (c.type != GgmlType::kF32) std::memcpy(p + 2 * i, &h, 2);
    }
  return buf;
}

// Whether isa's gemm_ggml rounds m rows of activations to int16 for `type`: amx below its tiles, the types of
// avx512/ggml_codes_int16_avx512.h (q6_K for 1-2 rows).
bool int16_activations(const IsaKernels& isa, GgmlType type, int64_t m) {
  const GgmlType int16_types[] = {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS};
  return std::string(isa.name) == "amx" && m < amx::ggml_prefill_min_rows() &&
         std::find(std::begin(int16_types), std::end(int16_types), type) != std::end(int16_types) &&
         (type != GgmlType::kQ6_K || m <= 2);
}

// Activation rows at the edges, in one call: row 0 spans 2^-40 .. 2^40 inside every block of 32 (int16
// activations round its small values), row 1 is zero, row 2 holds an Inf and row 3 a NaN in one block. Rows 0
// and 1 within the bound and with the bits they get alone (+0 for the zero row), rows 2 and 3 not finite.
void test_edge_rows(const IsaKernels& isa, GgmlType type, const GgmlTypeTraits& t, const uint8_t* w,
                    int64_t row_bytes, int64_t n, int64_t k, const std::vector<float>& wv, Rng& rng,
                    const std::string& what) {
  const int64_t m = 4, lda = k;
  std::vector<uint16_t> a(size_t(m * lda), 0);
  for (int64_t kk = 0; kk < k; ++kk) {
    const float v = float(std::ldexp(rng.gauss(), int(rng.below(81)) - 40));
    a[size_t(kk)] = uint16_t(f32_bits(v) >> 16);
    a[size_t(2 * lda + kk)] = a[size_t(3 * lda + kk)] = uint16_t(f32_bits(float(rng.gauss())) >> 16);
  }
  a[size_t(2 * lda + k / 2)] = 0x7F80;  // +Inf
  a[size_t(3 * lda + 1)] = 0x7FC0;      // NaN
  std::vector<float> c(static_cast<size_t>(m * n)), alone(static_cast<size_t>(n));
  isa.gemm_ggml(t, w, row_bytes, n, k, a.data(), lda, m, c.data(), n);
  const std::vector<uint16_t> row0(a.begin(), a.begin() + k);
  const std::vector<float> c0(c.begin(), c.begin() + n);
  const double worst = ggml_sum_error(row0, lda, 1, wv, n, k, c0, int16_activations(isa, type, m));
  // a row alone runs the same kernel as in the call of 4 (amx's q6_K does not: int16 for 1-2 rows only)
  bool same = true, zero = true, non_finite = true;
  for (int64_t r = 0; r < 2 && int16_activations(isa, type, 1) == int16_activations(isa, type, m); ++r) {
    isa.gemm_ggml(t, w, row_bytes, n, k, a.data() + r * lda, lda, 1, alone.data(), n);
    same = same && std::memcmp(alone.data(), c.data() + r * n, size_t(n) * 4) == 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    zero = zero && c[size_t(n + i)] == 0.f && !std::signbit(c[size_t(n + i)]);
    non_finite = non_finite && !std::isfinite(c[size_t(2 * n + i)]) && !std::isfinite(c[size_t(3 * n + i)]);
  }
  CHECK(worst <= 1.0 && same && zero && non_finite,
        what + strf(": edge rows (2^-40..2^40 within bound: worst %.3f of it; alone the same bits %s; zero row +0 %s; "
                    "Inf / NaN rows not finite %s)", worst, same ? "yes" : "NO", zero ? "yes" : "NO",
                    non_finite ? "yes" : "NO"));
}

void test_one(const IsaKernels& isa, const GgmlCase& c, int64_t n, int64_t k, int skew, Rng& rng) {
  const GgmlTypeTraits& t = *find_ggml_type(uint32_t(c.type));
  const std::string what = strf("%s gemm_ggml %s n=%lld k=%lld", isa.name, t.name, (long long)n, (long long)k);
  const std::vector<uint8_t> buf = random_rows(c, t, n, k, skew, rng);
  const uint8_t* w = buf.data() + skew;
  const int64_t row_bytes = k / t.block_elems * t.block_bytes;
  std::vector<float> wv(size_t(n * k));
  for (int64_t i = 0; i < n; ++i) t.decode(w + i * row_bytes, k / t.block_elems, wv.data() + i * k);
  const int64_t lda = k + 8;
  // the weights, through unit rows: column j of each of 5 rows
  bool exact = true;
  for (int64_t j0 = 0; j0 < k && exact; j0 += 5) {
    const int64_t m = std::min<int64_t>(5, k - j0);
    std::vector<uint16_t> a(size_t(m * lda), 0);
    for (int64_t r = 0; r < m; ++r) a[size_t(r * lda + j0 + r)] = 0x3F80;  // bf16 1.0
    std::vector<float> cbuf(size_t(m * n));
    isa.gemm_ggml(t, w, row_bytes, n, k, a.data(), lda, m, cbuf.data(), n);
    for (int64_t r = 0; r < m && exact; ++r)
      for (int64_t i = 0; i < n && exact; ++i) exact = cbuf[size_t(r * n + i)] == wv[size_t(i * k + j0 + r)];
  }
  CHECK(exact, what + ": unit rows read the decoder's weights exactly");
  // the sums, for every M
  for (int64_t m : {1, 2, 3, 5, 17}) {
    std::vector<uint16_t> a(size_t(m * lda));
    for (auto& v : a) v = uint16_t(f32_bits(float(rng.gauss())) >> 16);
    std::vector<float> cbuf(size_t(m * n), -1.f), split(size_t(m * n), -2.f);
    isa.gemm_ggml(t, w, row_bytes, n, k, a.data(), lda, m, cbuf.data(), n);
    const int64_t n0 = n / 3;  // the same rows in two calls
    isa.gemm_ggml(t, w, row_bytes, n0, k, a.data(), lda, m, split.data(), n);
    isa.gemm_ggml(t, w + n0 * row_bytes, row_bytes, n - n0, k, a.data(), lda, m, split.data() + n0, n);
    const bool int16 = int16_activations(isa, c.type, m);
    const double worst = ggml_sum_error(a, lda, m, wv, n, k, cbuf, int16);
    CHECK(worst <= 1.0, what + strf(" M=%lld: fp32 sums within k*2^-23*sum|a*w|%s (worst %.3f of it)", (long long)m,
                                    int16 ? " + the int16 activations' rounding" : "", worst));
    CHECK(std::memcmp(cbuf.data(), split.data(), cbuf.size() * 4) == 0,
          what + strf(" M=%lld: the same bits for rows split %lld + %lld", (long long)m, (long long)n0,
                      (long long)(n - n0)));
  }
  test_edge_rows(isa, c.type, t, w, row_bytes, n, k, wv, rng, what);
}

}  // namespace

double ggml_sum_error(const std::vector<uint16_t>& a, int64_t lda, int64_t m, const std::vector<float>& wv, int64_t n,
                      int64_t k, const std::vector<float>& c, bool int16_activations) {
  double worst = 0;
  for (int64_t r = 0; r < m; ++r) {
    std::vector<double> step(size_t(k), 0.0);  // half of x's rounding step at each input
    for (int64_t kk = 0; int16_activations && kk < k; ++kk) {
      double block_max = 0;
      for (int64_t j = kk / 32 * 32; j < kk / 32 * 32 + 32 && j < k; ++j)
        block_max = std::max(block_max, std::fabs(double(bf16_value(a[size_t(r * lda + j)]))));
      int e2 = 0;
      std::frexp(block_max, &e2);  // block_max in [2^(e2-1), 2^e2)
      step[size_t(kk)] = block_max > 0 ? std::ldexp(1.0, e2 - 1 - 14) : 0;  // (blocks above 2^-100 here)
    }
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0, mag = 0, act = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = double(bf16_value(a[size_t(r * lda + kk)])) * wv[size_t(i * k + kk)];
        ref += p;
        mag += std::fabs(p);
        act += std::fabs(double(wv[size_t(i * k + kk)])) * step[size_t(kk)];
      }
      worst = std::max(worst, std::fabs(c[size_t(r * n + i)] - ref) / (double(k) * 0x1.0p-23 * mag + act + 1e-30));
    }
  }
  return worst;
}

std::vector<uint8_t> random_ggml_rows(GgmlType type, int64_t n, int64_t k, int skew, Rng& rng) {
  for (const GgmlCase& c : kCases)
    if (c.type == type) return random_rows(c, *find_ggml_type(uint32_t(type)), n, k, skew, rng);
  CHECK(false, "random_ggml_rows: no case for this type");
  return {};
}

void test_ggml(const std::vector<Isa>& isas, Rng& rng) {
  for (const Isa& isa : isas)
    for (const GgmlCase& c : kCases) {
      const GgmlTypeTraits& t = *find_ggml_type(uint32_t(c.type));
      const int64_t k = t.block_elems == 256 ? 512 : t.block_elems == 32 ? 96 : 72;
      test_one(*isa.k, c, 19, k, int(rng.below(3)), rng);
    }
}

}  // namespace ktmoe_test
