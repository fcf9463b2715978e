// [NOTE] int4 GEMM over packed kINT4 blocks, AVX2 (exact int32 group dots).
//
// Computes c[m][16*(b-b0) + j] = sx[m] · Σ_G d[n,G] · ( Σ_{k∈G} u[n][k]·xq[m][k]
//                                                     − 64 · Σ_{k∈G} xq[m][k] ),  n = 16b + j,
// for rows m < M and packed blocks b in [b0, b1) (packed_format.h, kINT4: per block
// kp/8 k-octets of 64 bytes; byte (n%16)*4 + i of octet j holds k = 8j+i in its low
// nibble and k = 8j+4+i in its high nibble; per (block, group) 16 bf16 d), where
// u = kInt4U8[q] = L[q] + 64 in [0, 120].
//
// Dot. An octet is one 64-byte line: two 256-bit loads of 8 columns x 4 bytes. Each
// is unpacked once (`w & 0x0F`, `(w >> 4) & 0x0F`, one vpshufb each into u) and the
// four u vectors serve every row of the tile. Per row: vpmaddubsw(u, xq) sums pairs
// into int16, then vpmaddwd with ones widens to int32. One widening per vpmaddubsw is
// what the range allows: a pair sum reaches 2·120·127 = 30480, two of them overflow
// int16. Adding the low- and high-nibble pairs in 16 bits would need |weight| <= 64
// (u − 60, signed) against |xq| (unsigned), i.e. a vpsignb per u vector and row to
// move xq's sign onto the weights: as many instructions as the widenings it saves.
// The group's int32 dot starts at −64·Σxq, so the offset costs nothing per octet.
// Vector instructions per 64 weight bytes at one row (the decode loop): 2 loads,
// 6 unpack, 4 vpshufb, 2 broadcasts, 4 vpmaddubsw, 4 vpmaddwd, 4 vpaddd, 1 prefetch;
// per group (g/8 octets) 4 scale widenings, 2 converts, 2 mul + 2 add.
// Each tile size is its own (noinline) function, so the one-row loop keeps its
// constants in registers whatever the four-row tile needs.
//
// Decode. A tile reads one block (one weight stream; the next block is the next
// bytes) and prefetches it kPfLines octets (2 KiB) ahead and the scales kPfGroups
// groups ahead; prefetches past the matrix are harmless hints.
//
// Epilogue per group: acc += d·float(dot), as a mul then an add kept apart (the
// product is pinned in a register, so the compiler cannot fuse them into an FMA):
// the generic kernel's rounding. Then c = sx·acc: the fp32 bits equal generic's for
// every MR, (b0, b1) and thread.
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

constexpr int64_t kPfLines = 32;  // weight prefetch distance, octets (64-byte lines) ahead
constexpr int64_t kPfGroups = 8;  // scale prefetch distance, groups (32-byte records) ahead

// The u bytes of the low and high nibbles of the 32 packed bytes at p.
inline void unpack_u(const uint8_t* p, __m256i table, __m256i nib, __m256i& lo, __m256i& hi) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  lo = _mm256_shuffle_epi8(table, _mm256_and_si256(w, nib));
  hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), nib));
}

// Per 32-bit lane (one column): Σ_{i<4} lo[i]·xl[i] + hi[i]·xh[i], exact in int32.
inline __m256i octet_dot(__m256i lo, __m256i hi, __m256i xl, __m256i xh, __m256i ones) {
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones),
                          _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones));
}

// a·b then + c, rounded twice (the product is pinned in a register: no FMA).
inline __m256 mul_then_add(__m256 a, __m256 b, __m256 c) {
  __m256 p = _mm256_mul_ps(a, b);
  asm("" : "+x"(p));
  return _mm256_add_ps(c, p);
}

// MR rows of xq (s8 [MR, ldq]) x one block: wb its kp/8 octets, sc its kp/g scale
// records (kInt4ScaleBytes each), gsum [MR, gsum_ld]; c [MR, ldc], 16 columns.
template <int MR>
__attribute__((noinline)) void int4_tile(const uint8_t* wb, const uint8_t* sc, int64_t kp, int64_t g,
                                         const int8_t* xq, int64_t ldq, const float* sx,
                                         const int32_t* gsum, int64_t gsum_ld, float* c, int64_t ldc) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kInt4U8)));
  const int64_t octets = g / 8;  // per group
  for (int64_t G = 0; G < kp / g; ++G) {
    const uint8_t* wg = wb + G * g * 8;
    const int8_t* xg = xq + G * g;
    _mm_prefetch(reinterpret_cast<const char*>(sc + (G + kPfGroups) * kInt4ScaleBytes), _MM_HINT_T0);
    __m256i dot[MR][2];
    for (int r = 0; r < MR; ++r)
      dot[r][0] = dot[r][1] = _mm256_set1_epi32(-kInt4Offset * gsum[r * gsum_ld + G]);
    for (int64_t o = 0; o < octets; ++o) {
      const uint8_t* p = wg + o * 64;
      _mm_prefetch(reinterpret_cast<const char*>(p + kPfLines * 64), _MM_HINT_T0);
      __m256i l0, h0, l1, h1;
      unpack_u(p, table, nib, l0, h0);
      unpack_u(p + 32, table, nib, l1, h1);
      for (int r = 0; r < MR; ++r) {
        const __m256i xl = broadcast32(xg + r * ldq + o * 8);
        const __m256i xh = broadcast32(xg + r * ldq + o * 8 + 4);
        dot[r][0] = _mm256_add_epi32(dot[r][0], octet_dot(l0, h0, xl, xh, ones));
        dot[r][1] = _mm256_add_epi32(dot[r][1], octet_dot(l1, h1, xl, xh, ones));
      }
    }
    const uint16_t* s = reinterpret_cast<const uint16_t*>(sc + G * kInt4ScaleBytes);
    const __m256 d[2] = {bf16x8_to_f32(s), bf16x8_to_f32(s + 8)};
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < 2; ++h) acc[r][h] = mul_then_add(d[h], _mm256_cvtepi32_ps(dot[r][h]), acc[r][h]);
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
