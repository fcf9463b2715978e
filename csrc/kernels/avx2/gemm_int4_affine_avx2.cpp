// [NOTE] avx2 gemm_int4_affine (AVX2 + FMA): c[m, 16*(b - b0) + j] =
//   Σ_G ( s[16b+j, G] · Σ_{k∈G} a[m][k]·q[16b+j][k]  +  o[16b+j, G] · Σ_{k∈G} a[m][k] ),  o = -s·z
// (int4_affine_format.h), by the tile loops of gemm_decoded_avx2.h (shared with gemm_fp8).
//
// Decode of k-pair p of a block: the 32 bytes of its k-quad p/2 (word n = column n's even-k
// byte low, odd-k byte high; k-pair p in the low nibbles for even p, the high ones for odd p)
// shifted right by 4 * (p % 2) (even k) and 8 + 4 * (p % 2) (odd k) and masked to 4 bits,
// then zero-extended to dwords and converted to fp32 (exact): 4 + 8 vector ops per 32
// weights and row.
// The row sums xsum_G and the group end (c += s * acc, then c += o * xsum, each a multiply
// and an add, never contracted to an FMA; o = -(s * z)) are generic's, and a bf16 times a code is exact in fp32, so
// the result bits equal the generic kernel's.
#include "kernels/avx2/gemm_decoded_avx2.h"
#include "kernels/int4_affine_format.h"

namespace ktmoe {
namespace avx2 {
namespace {

inline __m256 u16x8_to_f32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(v)); }

// The nibble decoder of gemm_decoded_avx2.h.
struct Int4AffineDecoder {
  static constexpr bool kRowSums = true;
  static constexpr int64_t kPairBytes = 16;
  const uint8_t* scales;  // block 0, group 0
  int64_t ngroups;
  __m256i nibble = _mm256_set1_epi16(0x000F);
  Int4AffineDecoder(const uint8_t* s, int64_t ng) : scales(s), ngroups(ng) {}

  // w[0..3] = columns 0-7 even k, 8-15 even k, 0-7 odd k, 8-15 odd k of k-pair p of a block.
  inline void pair(const uint8_t* block, int64_t p, __m256 (&w)[4]) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (p / 2) * 32));
    const int sh = int(p & 1) * 4;
    const __m256i even = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(sh)), nibble);
    const __m256i odd = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(sh + 8)), nibble);
    w[0] = u16x8_to_f32(_mm256_castsi256_si128(even));
    w[1] = u16x8_to_f32(_mm256_extracti128_si256(even, 1));
    w[2] = u16x8_to_f32(_mm256_castsi256_si128(odd));
    w[3] = u16x8_to_f32(_mm256_extracti128_si256(odd, 1));
  }
  // c[0..15] = (g == 0 ? +0 : c) + s * acc, then + o * xsum.
  inline void group_end(int64_t b, int64_t g, const __m256 (&acc)[2], float xsum, float* c) const {
    const uint8_t* rec = scales + (b * ngroups + g) * kInt4AffineRecordBytes;
    const __m256 xs = _mm256_set1_ps(xsum), sign = _mm256_set1_ps(-0.f);
    for (int h = 0; h < 2; ++h) {
      const __m256 s = _mm256_loadu_ps(reinterpret_cast<const float*>(rec) + 8 * h);
      const __m128i z8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + kInt4AffineZeroAt + 8 * h));
      const __m256 o = _mm256_xor_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z8))), sign);
      const __m256 prev = g == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(c + 8 * h);
      const __m256 y = _mm256_add_ps(prev, rounded(_mm256_mul_ps(s, acc[h])));
      _mm256_storeu_ps(c + 8 * h, _mm256_add_ps(y, rounded(_mm256_mul_ps(o, xs))));
    }
  }
};

}  // namespace

// w: kINT4A matrix; a: bf16 [M, lda] (kp columns used); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_int4_affine(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc) {
  decoded::gemm_of<Int4AffineDecoder>(w, int4a_block_data_bytes(w->kp), a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx2
}  // namespace ktmoe
