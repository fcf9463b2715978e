// [NOTE] gemm_ggml of every ISA table over GGML rows where they lie (kernels/ggml/), against the type's exact
// decoder (kernels/ggml/ggml_decode.cpp, itself held bit for bit to gguf.quants.dequantize by
// tests/test_ggml_dequantize.py):
//   * the weights: activation rows that are unit vectors (one 1.0 at column j) read back W[i][j] itself,
//     equal to the decoder's value (a kernel that fuses the scales into its sums still applies each
//     rounding of gguf's formula once: the other columns contribute exact zeros);
//   * the sums: random bf16 activations against a double dot with the decoded weights, within fp32
//     summation's bound (k · 2^-23 · Σ|a·w|), for M = 1, 2, 3, 5, 17 rows (the kernels' decode and
//     prefill paths), rows read at any byte offset (17-byte mxfp4 blocks);
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
    const double worst = ggml_sum_error(a, lda, m, wv, n, k, cbuf);
    CHECK(worst <= 1.0, what + strf(" M=%lld: fp32 sums within k*2^-23*sum|a*w| (worst %.3f of it)", (long long)m,
                                    worst));
    CHECK(std::memcmp(cbuf.data(), split.data(), cbuf.size() * 4) == 0,
          what + strf(" M=%lld: the same bits for rows split %lld + %lld", (long long)m, (long long)n0,
                      (long long)(n - n0)));
  }
}

}  // namespace

double ggml_sum_error(const std::vector<uint16_t>& a, int64_t lda, int64_t m, const std::vector<float>& wv, int64_t n,
                      int64_t k, const std::vector<float>& c) {
  double worst = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = double(bf16_value(a[size_t(r * lda + kk)])) * wv[size_t(i * k + kk)];
        ref += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(c[size_t(r * n + i)] - ref) / (double(k) * 0x1.0p-23 * mag + 1e-30));
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
