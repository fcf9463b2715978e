// [NOTE] avx2 gemm_fp8 (AVX2 + FMA + F16C): c[m, 16*(b - b0) + j] =
//   Σ_G s[16b + j, G] · Σ_{k∈G} a[m][k] · e4m3(W[16b + j][k])      (fp8_format.h)
//
// Decode of one k-pair of a block (32 bytes, word j = column j's even-k byte low,
// odd-k byte high) to fp32 e4m3 * 2^-8 (exact; the scale is taken * 2^8): the fp16
// with bits sign<<15 | magnitude<<7 is that value (fp16 exponent bias 15 instead of
// e4m3's 7, and fp16 subnormals are e4m3's), and vcvtph2ps converts it exactly:
//   even k: ((v << 8) >>arith 1) & 0xBF80,   odd k: (v >>arith 1) & 0xBF80
// (the arithmetic shift copies the sign into bit 15; the mask drops its copy in bit
// 14 and the other byte), then 4 vcvtph2ps (columns 0-7 / 8-15, even / odd k): no
// branch, subnormals included. ~13 vector uops + 4 FMAs per 32 weights and row, so a
// decode row is bound by these instructions: measured 17.6 GB/s of fp8 weights in L2
// and 13.7 out of cache (1 thread, loaded AVX-512 host, read roof 27 GB/s in that run).
//
// The tile loops (decode: 4 blocks side by side in registers; prefill: decoded fp32 panels
// and 4-row tiles) and the accumulation order are gemm_decoded_avx2.h's, shared with
// gemm_int4_affine: per column and k-group, acc = fma(w, a, acc) for k ascending (a bf16
// times an e4m3 value is exact in fp32, so this is the generic kernel's sum), then
// c = c + (s * 2^8) * acc (c = +0 before the first group), a multiply and an add.
#include "kernels/avx2/gemm_decoded_avx2.h"
#include "kernels/fp8_format.h"

namespace ktmoe {
namespace avx2 {
namespace {

// The e4m3 decoder of gemm_decoded_avx2.h.
struct Fp8Decoder {
  static constexpr bool kRowSums = false;
  static constexpr int64_t kPairBytes = 32;
  const uint8_t* scales;  // block 0, group 0
  int64_t ngroups;
  __m256i mask = _mm256_set1_epi16(int16_t(0xBF80));
  Fp8Decoder(const uint8_t* s, int64_t ng) : scales(s), ngroups(ng) {}

  // w[0..3] = columns 0-7 even k, 8-15 even k, 0-7 odd k, 8-15 odd k of k-pair p of a block.
  inline void pair(const uint8_t* block, int64_t p, __m256 (&w)[4]) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + p * 32));
    const __m256i he = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), mask);
    const __m256i ho = _mm256_and_si256(_mm256_srai_epi16(v, 1), mask);
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(he));
    w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(he, 1));
    w[2] = _mm256_cvtph_ps(_mm256_castsi256_si128(ho));
    w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(ho, 1));
  }
  // c[0..15] = (g == 0 ? +0 : c) + (s[b, g] * 2^8) * acc.
  inline void group_end(int64_t b, int64_t g, const __m256 (&acc)[2], float, float* c) const {
    const float* s = reinterpret_cast<const float*>(scales + (b * ngroups + g) * kFp8ScaleBytes);
    const __m256 k256 = _mm256_set1_ps(kE4m3KernelScale);
    for (int h = 0; h < 2; ++h) {
      const __m256 prev = g == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(c + 8 * h);
      const __m256 sh = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * h), k256);
      _mm256_storeu_ps(c + 8 * h, _mm256_add_ps(prev, _mm256_mul_ps(sh, acc[h])));
    }
  }
};

}  // namespace

// w: kFP8 matrix; a: bf16 [M, lda] (kp columns used); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  decoded::gemm_of<Fp8Decoder>(w, fp8_block_data_bytes(w->kp), a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx2
}  // namespace ktmoe
