// [NOTE] int4 GEMM over packed kINT4 blocks, AVX2 (exact int32 group dots).
//
// Computes c[m][16*(b-b0) + j] = sx[m] · Σ_G d[n,G] · ( Σ_{k∈G} u[n][k]·xq[m][k]
//                                                     − 64 · Σ_{k∈G} xq[m][k] ),  n = 16b + j,
// for rows m < M and packed blocks b in [b0, b1) (packed_format.h, kINT4: per block
// kp/8 k-octets of 64 bytes; byte (n%16)*4 + i of octet j holds k = 8j+i in its low
// nibble and k = 8j+4+i in its high nibble; per (block, group) 16 bf16 d), where
// u = kInt4U8[q] = L[q] + 64 in [0, 120].
//
// Dot. One 256-bit load = 8 columns x 4 bytes; `w & 0x0F` and `(w >> 4) & 0x0F` are
// the two k-quads' nibbles, vpshufb looks each up in the u table. vpmaddubsw(u, xq)
// adds pairs into int16: |127·127·2| = 32258 < 32767 (xq is in [-127, 127]), so
// each result is widened at once (vpmaddwd with ones) into the int32 group dot,
// which is exact. Activations need no re-layout: each row broadcasts the 4 xq
// bytes of each quad (32-bit broadcast from memory).
// Register blocking: MR=4 rows x 16 columns = 8 int32 accumulators + 4 decoded
// vectors in registers; fp32 accumulators are touched once per group. Epilogue
// per group: acc += d·float(dot − 64·Σxq), as mul then add (the generic kernel's
// rounding), then c = sx·acc: the fp32 bits equal generic's for every MR, (b0, b1)
// and thread.
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

// MR rows of xq (s8 [MR, ldq]) x one block: wb its kp/8 octets, sc its kp/g scale
// records (kInt4ScaleBytes each), gsum [MR, gsum_ld].
template <int MR>
inline void int4_tile(const uint8_t* wb, const uint8_t* sc, int64_t kp, int64_t g,
                      const int8_t* xq, int64_t ldq, const float* sx, const int32_t* gsum,
                      int64_t gsum_ld, float* c, int64_t ldc) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kInt4U8)));
  auto decode = [&](__m256i v, int shift) {
    return _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, shift), nib));
  };
  for (int64_t G = 0; G < kp / g; ++G) {
    __m256i dot[MR][2];
    for (int r = 0; r < MR; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    for (int64_t k = G * g; k < (G + 1) * g; k += 8) {  // one octet
      const __m256i* p = reinterpret_cast<const __m256i*>(wb + k * 8);
      const __m256i w0 = _mm256_loadu_si256(p), w1 = _mm256_loadu_si256(p + 1);
      const __m256i l0 = decode(w0, 0), h0 = decode(w0, 4);
      const __m256i l1 = decode(w1, 0), h1 = decode(w1, 4);
      for (int r = 0; r < MR; ++r) {
        const __m256i xl = broadcast32(xq + r * ldq + k);
        const __m256i xh = broadcast32(xq + r * ldq + k + 4);
        const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(l0, xl), ones),
                                            _mm256_madd_epi16(_mm256_maddubs_epi16(h0, xh), ones));
        const __m256i s1 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(l1, xl), ones),
                                            _mm256_madd_epi16(_mm256_maddubs_epi16(h1, xh), ones));
        dot[r][0] = _mm256_add_epi32(dot[r][0], s0);
        dot[r][1] = _mm256_add_epi32(dot[r][1], s1);
      }
    }
    const uint16_t* s = reinterpret_cast<const uint16_t*>(sc + G * kInt4ScaleBytes);
    const __m256 d[2] = {bf16x8_to_f32(s), bf16x8_to_f32(s + 8)};
    for (int r = 0; r < MR; ++r) {
      const __m256i off = _mm256_set1_epi32(kInt4Offset * gsum[r * gsum_ld + G]);
      for (int h = 0; h < 2; ++h) {
        const __m256 t = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(_mm256_sub_epi32(dot[r][h], off)));
        acc[r][h] = _mm256_add_ps(acc[r][h], t);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    const __m256 f = _mm256_set1_ps(sx[r]);
    _mm256_storeu_ps(c + r * ldc, _mm256_mul_ps(f, acc[r][0]));
    _mm256_storeu_ps(c + r * ldc + 8, _mm256_mul_ps(f, acc[r][1]));
  }
}

}  // namespace

// w: packed kINT4 (group w->group: a multiple of 32 dividing kp); a: int8 rows (kp used, scale,
// group sums over w->group); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, g = w->group, nblk = b1 - b0;
  const int64_t blk_bytes = block_data_bytes(WeightFormat::kINT4, kp);
  const int64_t sc_bytes = kp / g * kInt4ScaleBytes;  // one block's scale records
  const uint8_t* wblk = packed_data(w) + b0 * blk_bytes;
  const uint8_t* sblk = packed_scales(w) + b0 * sc_bytes;
  if (m <= 0 || nblk <= 0) return;
  // block-outer: a block (kp*8 bytes) stays in cache while every row tile reads it
  for (int64_t b = 0; b < nblk; ++b) {
    for_row_tiles(m, [&](auto mr, int64_t r) {
      int4_tile<decltype(mr)::value>(wblk + b * blk_bytes, sblk + b * sc_bytes, kp, g,
                                     a.q + r * a.ldq, a.ldq, a.scale + r,
                                     a.gsum + r * a.gsum_ld, a.gsum_ld, c + r * ldc + b * 16,
                                     ldc);
    });
  }
}

}  // namespace avx2
}  // namespace ktmoe
