// [NOTE] int8 GEMM over packed kINT8 blocks, AVX2 (exact int32 dot products).
//
// Computes, for rows m < M and packed blocks b in [b0, b1), n = 16b + j (packed_format.h,
// kINT8: per block, kp/4 k-quads of 16 columns x 4 u8 = 64 bytes, u = wq + 128):
//   one group (per channel): c[m][16*(b-b0) + j] = (sx[m]·s[n]) · I,
//   groups: acc = fma(s[n,G], I_G, acc) over G in order, c = sx[m] · acc,
//   I_G = Σ_{k∈G} u[n][k]·xq[m][k] − 128·gsum[m][G]  (I: the one group).
//
// Why not vpmaddubsw: u (0..255) times xq (-127..127) summed in pairs reaches
// 255·127·2 > 32767 and saturates. Instead both operands are widened to int16 and
// vpmaddwd adds pairs exactly into int32:
//   weights  one 256-bit load = 8 columns x 4 u8 (k0 k1 k2 k3 per column);
//            w & 0x00FF per 16-bit lane -> int16 (u0, u2), w >> 8 -> (u1, u3);
//   activations are re-laid once per call (per-thread scratch) as int16
//            (x0, x2, x1, x3) per k-quad, so each row needs just two 32-bit
//            broadcasts from memory per k-quad: (x0, x2) and (x1, x3);
//   dot += madd(wlo, x02) + madd(whi, x13).
// Register blocking: MR=4 rows x 16 columns = 8 int32 accumulators + 4 widened
// weight vectors; the dot is pure integer work, so decode (M=1) needs no extra
// accumulator chains (vpaddd has 1-cycle latency). The int32 sums are exact, so
// the integers are identical to every other ISA; the epilogue is the generic one
// (the same multiplies and fmas in the same order), so even the fp32 bits agree.
// Group sums of xq come from the caller (QuantizedRows::gsum, per header.group).
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

// Re-lays `rows` rows of xq (s8 [rows, ldq], kp used) as int16 (x0, x2, x1, x3) per
// k-quad: dst [rows, kp] int16.
void relayout_int8_rows(const int8_t* q, int64_t ldq, int64_t rows, int64_t kp, int16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < kp; k += 16) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + r * ldq + k));
      __m256i v = _mm256_cvtepi8_epi16(x);                                 // x0 x1 x2 x3 per k-quad
      v = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xD8), 0xD8);  // -> x0 x2 x1 x3
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + r * kp + k), v);
    }
  }
}

// acc[r][h] += Σ u·xq over k-quads [kq0, kq1) of one block (wb), columns 8h .. 8h+7.
template <int MR>
inline void int8_quads(__m256i (&acc)[MR][2], const uint8_t* wb, int64_t kq0, int64_t kq1,
                       const int16_t* xs, int64_t ldx) {
  const __m256i lo_mask = _mm256_set1_epi16(0x00FF);
  for (int64_t kq = kq0; kq < kq1; ++kq) {
    const __m256i* p = reinterpret_cast<const __m256i*>(wb + kq * 64);
    const __m256i w0 = _mm256_loadu_si256(p), w1 = _mm256_loadu_si256(p + 1);
    const __m256i l0 = _mm256_and_si256(w0, lo_mask), h0 = _mm256_srli_epi16(w0, 8);
    const __m256i l1 = _mm256_and_si256(w1, lo_mask), h1 = _mm256_srli_epi16(w1, 8);
    for (int r = 0; r < MR; ++r) {
      const int16_t* x = xs + r * ldx + kq * 4;
      const __m256i x02 = broadcast32(x), x13 = broadcast32(x + 2);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(l0, x02));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(l1, x02));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(h0, x13));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(h1, x13));
    }
  }
}

// MR rows (xs: relaid int16 [MR, ldx]) x one block (wb: its kp/4 k-quads; s: its
// scale records, 16 fp32 per group), groups of g inputs.
template <int MR>
inline void int8_tile(const uint8_t* wb, int64_t kp, int64_t g, const int16_t* xs, int64_t ldx,
                      const float* sx, const int32_t* gsum, int64_t gsum_ld, const float* s, float* c,
                      int64_t ldc) {
  __m256i acc[MR][2];
  const int64_t ngroups = kp / g;
  if (ngroups == 1) {  // per channel: (sx·s[n])·float(I)
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    int8_quads<MR>(acc, wb, 0, kp / 4, xs, ldx);
    const __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256i corr = _mm256_set1_epi32(128 * gsum[r * gsum_ld]);
      const __m256 f = _mm256_set1_ps(sx[r]);
      const __m256 d0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][0], corr));
      const __m256 d1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][1], corr));
      _mm256_storeu_ps(c + r * ldc, _mm256_mul_ps(_mm256_mul_ps(f, s0), d0));
      _mm256_storeu_ps(c + r * ldc + 8, _mm256_mul_ps(_mm256_mul_ps(f, s1), d1));
    }
    return;
  }
  __m256 facc[MR][2];
  for (int r = 0; r < MR; ++r) facc[r][0] = facc[r][1] = _mm256_setzero_ps();
  for (int64_t G = 0; G < ngroups; ++G) {
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    int8_quads<MR>(acc, wb, G * g / 4, (G + 1) * g / 4, xs, ldx);
    const __m256 s0 = _mm256_loadu_ps(s + G * 16), s1 = _mm256_loadu_ps(s + G * 16 + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256i corr = _mm256_set1_epi32(128 * gsum[r * gsum_ld + G]);
      facc[r][0] = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][0], corr)), facc[r][0]);
      facc[r][1] = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][1], corr)), facc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    const __m256 f = _mm256_set1_ps(sx[r]);
    _mm256_storeu_ps(c + r * ldc, _mm256_mul_ps(f, facc[r][0]));
    _mm256_storeu_ps(c + r * ldc + 8, _mm256_mul_ps(f, facc[r][1]));
  }
}

}  // namespace

// w: packed kINT8; a: int8 rows (kp used), scales and kp / group sums per row;
// c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, g = w->group, nblk = b1 - b0;
  const int64_t blk_bytes = block_data_bytes(WeightFormat::kINT8, kp);
  const uint8_t* wblk = packed_data(w) + b0 * blk_bytes;
  const int64_t blk_scales = 16 * (kp / g);  // fp32 scales per block
  const float* scales = reinterpret_cast<const float*>(packed_scales(w)) + b0 * blk_scales;
  if (m <= 0 || nblk <= 0) return;
  const int64_t chunk = std::min(m, kRowChunk);
  int16_t* xs = static_cast<int16_t*>(thread_scratch(size_t(chunk * kp) * 2));
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    relayout_int8_rows(a.q + r0 * a.ldq, a.ldq, rows, kp, xs);
    const float* sx = a.scale + r0;
    const int32_t* gsum = a.gsum + r0 * a.gsum_ld;
    float* cr = c + r0 * ldc;
    // block-outer: a block (kp*16 bytes) stays in cache while every row tile reads it
    for (int64_t b = 0; b < nblk; ++b) {
      for_row_tiles(rows, [&](auto mr, int64_t r) {
        int8_tile<decltype(mr)::value>(wblk + b * blk_bytes, kp, g, xs + r * kp, kp, sx + r,
                                       gsum + r * a.gsum_ld, a.gsum_ld, scales + b * blk_scales,
                                       cr + r * ldc + b * 16, ldc);
      });
    }
  }
}

}  // namespace avx2
}  // namespace ktmoe
