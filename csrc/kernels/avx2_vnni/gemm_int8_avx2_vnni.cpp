// [NOTE] int8 GEMM over packed kINT8 blocks, AVX2 + AVX-VNNI (exact int32 dot products).
//
// Computes what avx2/gemm_int8_avx2.cpp computes (packed_format.h, kINT8: per block kp/4
// k-quads of 16 columns x 4 u8 = 64 bytes, u = wq + 128), for rows m < M and blocks [b0, b1):
//   one group (per channel): c[m][16*(b-b0) + j] = (sx[m]·s[n]) · I,
//   groups: acc = fma(s[n,G]·sx[m,G], I_G, acc) over G in order, c = acc (activation scales per
//   (row, group)),
//   I_G = Σ_{k∈G} (u[n][k] − 128)·xq[m][k] = Σ_{k∈G} u·xq − 128·gsum[m][G].
//
// The dot: vpdpbusd (vnni_dot.h) multiplies the weight bytes u (unsigned) by the caller's xq
// (signed) and adds each column's 4 products to its int32 lane; the group's dot starts at
// −128·gsum (a.gsum, the activation sums over the matrix's group), so the offset costs nothing
// per quad. Per 64 weight bytes and row: 2 loads, 1 broadcast, 2 vpdpbusd (avx2: 18
// instructions, the u8·s8 product taking vpsignb + vpmaddubsw + vpmaddwd + vpaddd); the
// one-row loop is 7 instructions per 64 weight bytes with its counters (objdump). No
// |xq| rows in scratch and no row chunks. Decode tiles (one row) keep the even and odd
// quads in separate accumulators (4 vpdpbusd chains instead of 2; added exactly at the
// group's end). vpdpbusd wraps mod 2^32 and I_G (|.| <= 128·127·kp) fits int32 for kp < 130000,
// so the integers are exactly every ISA's; the epilogue is avx2's (avx2/gemm_int8_tile.h: generic's operations in generic's
// order), so the fp32 bits equal generic's.
// Tiles: MR = 4 rows x 1 block (8 int32 accumulators), blocks outer.
#include "kernels/avx2/gemm_int8_tile.h"
#include "kernels/avx2_vnni/vnni_dot.h"

namespace ktmoe {
namespace KTMOE_AVX2_VNNI_NS {
namespace {

// acc[r][h] += Σ u·xq over k-quads [kq0, kq1) of one block (wb), columns 8h .. 8h+7, for rows
// r < MR of xq (stride ldq). kq1 − kq0 is even: groups are multiples of 32 k (8 quads).
template <int MR>
inline void vnni_quads(__m256i (&acc)[MR][2], const uint8_t* wb, int64_t kq0, int64_t kq1, const int8_t* xq,
                       int64_t ldq) {
  constexpr int S = MR == 1 ? 2 : 1;  // accumulator sets: decode splits even / odd quads
  __m256i part[S][MR][2];
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) {
      part[0][r][h] = acc[r][h];
      for (int t = 1; t < S; ++t) part[t][r][h] = _mm256_setzero_si256();
    }
  for (int64_t kq = kq0; kq < kq1; kq += S)
    for (int t = 0; t < S; ++t) {
      const uint8_t* p = wb + (kq + t) * 64;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
      for (int r = 0; r < MR; ++r) {
        const __m256i x = avx2::broadcast32(xq + r * ldq + (kq + t) * 4);
        part[t][r][0] = dot_u8s8(part[t][r][0], w0, x);
        part[t][r][1] = dot_u8s8(part[t][r][1], w1, x);
      }
    }
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) {
      acc[r][h] = part[0][r][h];
      for (int t = 1; t < S; ++t) acc[r][h] = _mm256_add_epi32(acc[r][h], part[t][r][h]);
    }
}

}  // namespace

// w: packed kINT8; a: int8 rows (kp used), scales and group sums over w->group; c: fp32 [M, ldc],
// 16*(b1-b0) columns.
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
               int64_t ldc) {
  const int64_t kp = w->kp, g = w->group, nblk = b1 - b0;
  const int64_t blk_bytes = block_data_bytes(WeightFormat::kINT8, kp);
  const uint8_t* wblk = packed_data(w) + b0 * blk_bytes;
  const int64_t blk_scales = 16 * (kp / g);  // fp32 scales per block
  const float* scales = reinterpret_cast<const float*>(packed_scales(w)) + b0 * blk_scales;
  if (m <= 0 || nblk <= 0) return;
  // block-outer: a block (kp*16 bytes) stays in cache while every row tile reads it
  for (int64_t b = 0; b < nblk; ++b) {
    avx2::for_row_tiles(m, [&](auto mr, int64_t r) {
      constexpr int MR = decltype(mr)::value;
      const uint8_t* wb = wblk + b * blk_bytes;
      const int8_t* xr = a.q + r * a.ldq;
      const int32_t* gs = a.gsum + r * a.gsum_ld;
      const auto group_dot = [&](__m256i(&acc)[MR][2], int64_t G) {
        for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_set1_epi32(-128 * gs[i * a.gsum_ld + G]);
        vnni_quads<MR>(acc, wb, G * g / 4, (G + 1) * g / 4, xr, a.ldq);
      };
      avx2::int8_tile<MR>(kp / g, group_dot, a.scale + r * (kp / g), scales + b * blk_scales, c + r * ldc + b * 16,
                          ldc);
    });
  }
}

}  // namespace KTMOE_AVX2_VNNI_NS
}  // namespace ktmoe
