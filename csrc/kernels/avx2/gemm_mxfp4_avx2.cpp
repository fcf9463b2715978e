// [NOTE] avx2 gemm_mxfp4 (AVX2 + FMA + F16C): c[m, 16*(b - b0) + j] =
//   Σ_G 2^(e[16b+j, G] - 127) · Σ_{k∈G} a[m][k] · e2m1(q[16b+j][k])      (mxfp4_format.h)
// by the tile loops of gemm_decoded_avx2.h (shared with gemm_fp8 and gemm_int4_affine).
//
// Decode of k-pair p of a block: the 32 bytes of its k-quad p/2 (word n = column n's even-k
// byte low, odd-k byte high; k-pair p in the low nibbles for even p, the high ones for odd p)
// shifted right by 4 * (p % 2) and masked to a nibble per byte, then one vpshufb of a 16-entry
// LUT (kMxfp4F16High) gives each code's fp16 high byte, whose low byte is 0 (every e2m1 value
// is an fp16 with at most one mantissa bit): even k = word << 8, odd k = word & 0xFF00, then 4
// vcvtph2ps, exact. 6 vector ops + 4 conversions per 32 weights, no branch (0.5 and ±0 too).
// The group end is generic's: c = c + s * acc with s = 2^(e - 127) built in registers
// (vpmovzxbd, vpslld 23, e = 0 blended to 2^-127's bits), the product rounded before the add
// (never contracted to an FMA). A bf16 times an e2m1 value is exact in fp32 and the loops add
// in k order, so the result bits equal the generic kernel's.
#include "kernels/avx2/gemm_decoded_avx2.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace avx2 {
namespace {

// The e2m1 decoder of gemm_decoded_avx2.h.
struct Mxfp4Decoder : decoded::GroupRecords {
  static constexpr bool kRowSums = false;
  static constexpr int64_t kPairBytes = 16;
  __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4F16High.v)));
  __m256i nibble = _mm256_set1_epi8(0x0F), high_byte = _mm256_set1_epi16(int16_t(0xFF00));
  Mxfp4Decoder(const uint8_t* s, int64_t ng) : GroupRecords{s, ng, kMxfp4ScaleRecordBytes} {}

  // w[0..3] = columns 0-7 even k, 8-15 even k, 0-7 odd k, 8-15 odd k of k-pair p of a block.
  inline void pair(const uint8_t* block, int64_t p, __m256 (&w)[4]) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (p / 2) * 32));
    const __m256i q = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(int(p & 1) * 4)), nibble);
    const __m256i h = _mm256_shuffle_epi8(table, q);  // fp16 high bytes of both k
    const __m256i even = _mm256_slli_epi16(h, 8), odd = _mm256_and_si256(h, high_byte);
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(even));
    w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(even, 1));
    w[2] = _mm256_cvtph_ps(_mm256_castsi256_si128(odd));
    w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1));
  }
  // c[0..15] = (g == 0 ? +0 : c) + 2^(e - 127) * acc.
  inline void group_end(int64_t b, int64_t g, const __m256 (&acc)[2], float, float* c) const {
    const uint8_t* rec = record(b, g);
    for (int h = 0; h < 2; ++h) {
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 8 * h)));
      const __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000),
                                              _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
      const __m256 prev = g == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(c + 8 * h);
      _mm256_storeu_ps(c + 8 * h, _mm256_add_ps(prev, rounded(_mm256_mul_ps(_mm256_castsi256_ps(bits), acc[h]))));
    }
  }
};

}  // namespace

// w: kMXFP4 matrix; a: bf16 [M, lda] (kp columns used); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  decoded::gemm_of<Mxfp4Decoder>(w, int4a_block_data_bytes(w->kp), a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx2
}  // namespace ktmoe
