// [NOTE] bf16 activation rows as int16 for the avx512 integer dots (vpdpwssd): per row and block of 32
// inputs, x = round_half_even(a · 2^s) with s = mxfp4_block_shift of the block's largest |a| (mxfp4_format.h
// says why it is exact for every |a| >= 2^-6 of that largest and rounds a smaller one by at most 2^-14 of
// it), the block's scale 2^-(s + 1) and its exact Σ x. A block holding Inf or NaN: x = 0, Σ x = 0 and the
// scale NaN, so whatever sums it makes its row's outputs NaN. Used by the nibble formats' decode rows
// (gemm_nibble_int16_avx512.cpp) and GGUF's (gemm_ggml_int16_avx512.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512/avx512_common.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace avx512 {

// Rows quantized for the dot: x int16 [rows][kp]; per (row, block of 32) the scale 2^-(s + 1) and Σ x.
struct QuantRows {
  int16_t* x;
  float* scale;
  int32_t* xsum;
  int64_t kp, nj;  // nj = kp / 32
};

// a: bf16 rows [rows, lda] -> q (kp a multiple of 32). A block holding Inf or NaN: x = 0, scale NaN.
inline void quantize(const uint16_t* a, int64_t lda, int64_t rows, const QuantRows& q) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < q.nj; ++j) {
      const uint16_t* src = a + r * lda + j * kMxfp4Group;
      const __m512 v0 = bf16x16_to_f32(src), v1 = bf16x16_to_f32(src + 16);
      const __m512i mx = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(v0), abs_mask),
                                          _mm512_and_si512(_mm512_castps_si512(v1), abs_mask));
      const int s = mxfp4_block_shift(_mm512_reduce_max_epu32(mx));
      q.scale[r * q.nj + j] = mxfp4_block_scale(s);
      int16_t* x = q.x + r * q.kp + j * kMxfp4Group;
      if (s == kMxfp4NonFinite) {
        _mm512_storeu_si512(x, _mm512_setzero_si512());
        q.xsum[r * q.nj + j] = 0;
        continue;
      }
      const __m512 f = _mm512_set1_ps(mxfp4_pow2(s));
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, f)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, f));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtsepi32_epi16(i0));  // |x| <= 2^14: no saturation
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 16), _mm512_cvtsepi32_epi16(i1));
      q.xsum[r * q.nj + j] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

// A QuantRows of `rows` rows of kp inputs (a multiple of 32) in buf: x [rows][kp] int16, then scale and xsum
// [rows][kp / 32].
inline QuantRows quant_rows(Scratch& buf, int64_t rows, int64_t kp) {
  const int64_t nj = kp / kMxfp4Group;
  uint8_t* s = buf.at_least(size_t(rows * (kp * 2 + nj * 8)));
  return {reinterpret_cast<int16_t*>(s), reinterpret_cast<float*>(s + rows * kp * 2),
          reinterpret_cast<int32_t*>(s + rows * (kp * 2 + nj * 4)), kp, nj};
}

}  // namespace avx512
}  // namespace ktmoe
