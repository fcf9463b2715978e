// [NOTE] The int4 tile loop shared by the 256-bit int4 gemms (avx2/gemm_int4_avx2.cpp,
// avx2_vnni/gemm_int4_avx2_vnni.cpp): unpack, prefetch and the group epilogue, over a
// policy `Dot` that adds one k-octet's u·xq to a row's exact int32 dot.
//
// Computes c[m][16*(b-b0) + j] = sx[m] · Σ_G d[n,G] · ( Σ_{k∈G} u[n][k]·xq[m][k] − 64·Σ_{k∈G} xq[m][k] ),
// n = 16b + j (packed_format.h, kINT4; u = kInt4U8[q] in [0, 120]).
//   unpack: an octet is one 64-byte line, two 256-bit loads of 8 columns x 4 bytes, each
//           unpacked once (`w & 0x0F`, `(w >> 4) & 0x0F`, one vpshufb each into u) for every
//           row of the tile;
//   Dot:    `Dot::kSets<MR>` int32 accumulators per row and 8 columns (more independent
//           chains for short tiles); `Dot::add(dot, lo, hi, xl, xh)` adds per 32-bit lane (one
//           column) Σ_{i<4} lo[i]·xl[i] + hi[i]·xh[i] into them, exactly. Set 0 starts at
//           −64·Σxq, the others at 0; they are added (exactly) at the group's end;
//   decode: a tile reads one block (one weight stream) and prefetches it kAhead bytes ahead
//           with hint kHint (each including file picks them; blocks are contiguous, so near a
//           block's end that is the next tile's block) and the scales kPfGroups groups ahead
//           (past the matrix: harmless hints);
//   epilogue per group: acc += d·float(dot) as a mul then an add kept apart (the product is
//           pinned in a register, so the compiler cannot fuse them into an FMA): the generic
//           kernel's rounding. Then c = sx·acc: the fp32 bits equal generic's for every MR,
//           (b0, b1) and thread.
// Each tile size is its own (noinline) function, so the one-row loop keeps its constants in
// registers whatever the four-row tile needs. In an anonymous namespace: every file that
// includes it (each compiled with its own ISA flags) keeps its own copy.
#pragma once
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

constexpr int64_t kPfGroups = 8;  // scale prefetch distance, groups (32-byte records) ahead

// The u bytes of the low and high nibbles of the 32 packed bytes at p.
inline void unpack_u(const uint8_t* p, __m256i table, __m256i nib, __m256i& lo, __m256i& hi) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  lo = _mm256_shuffle_epi8(table, _mm256_and_si256(w, nib));
  hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), nib));
}

// a·b then + c, rounded twice (the product is pinned in a register: no FMA).
inline __m256 mul_then_add(__m256 a, __m256 b, __m256 c) {
  __m256 p = _mm256_mul_ps(a, b);
  asm("" : "+x"(p));
  return _mm256_add_ps(c, p);
}

// MR rows of xq (s8 [MR, ldq]) x one block: wb its kp/8 octets, sc its kp/g scale
// records (kInt4ScaleBytes each), gsum [MR, gsum_ld]; c [MR, ldc], 16 columns.
// kAhead / kHint: the weight prefetch, bytes ahead on the block stream and _MM_HINT_* (0: none).
template <class Dot, int MR, int64_t kAhead, int kHint>
__attribute__((noinline)) void int4_tile(const uint8_t* wb, const uint8_t* sc, int64_t kp, int64_t g,
                                         const int8_t* xq, int64_t ldq, const float* sx,
                                         const int32_t* gsum, int64_t gsum_ld, float* c, int64_t ldc) {
  constexpr int S = Dot::template kSets<MR>;
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kInt4U8)));
  const int64_t octets = g / 8;  // per group
  for (int64_t G = 0; G < kp / g; ++G) {
    const uint8_t* wg = wb + G * g * 8;
    const int8_t* xg = xq + G * g;
    _mm_prefetch(reinterpret_cast<const char*>(sc + (G + kPfGroups) * kInt4ScaleBytes), _MM_HINT_T0);
    __m256i dot[MR][2][S];
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < 2; ++h) {
        dot[r][h][0] = _mm256_set1_epi32(-kInt4Offset * gsum[r * gsum_ld + G]);
        for (int t = 1; t < S; ++t) dot[r][h][t] = _mm256_setzero_si256();
      }
    for (int64_t o = 0; o < octets; ++o) {
      const uint8_t* p = wg + o * 64;
      if constexpr (kAhead > 0) _mm_prefetch(reinterpret_cast<const char*>(p + kAhead), _mm_hint(kHint));
      __m256i l0, h0, l1, h1;
      unpack_u(p, table, nib, l0, h0);
      unpack_u(p + 32, table, nib, l1, h1);
      for (int r = 0; r < MR; ++r) {
        const __m256i xl = broadcast32(xg + r * ldq + o * 8);
        const __m256i xh = broadcast32(xg + r * ldq + o * 8 + 4);
        Dot::add(dot[r][0], l0, h0, xl, xh);
        Dot::add(dot[r][1], l1, h1, xl, xh);
      }
    }
    const uint16_t* s = reinterpret_cast<const uint16_t*>(sc + G * kInt4ScaleBytes);
    const __m256 d[2] = {bf16x8_to_f32(s), bf16x8_to_f32(s + 8)};
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < 2; ++h) {
        for (int t = 1; t < S; ++t) dot[r][h][0] = _mm256_add_epi32(dot[r][h][0], dot[r][h][t]);
        acc[r][h] = mul_then_add(d[h], _mm256_cvtepi32_ps(dot[r][h][0]), acc[r][h]);
      }
  }
  for (int r = 0; r < MR; ++r) {
    const __m256 f = _mm256_set1_ps(sx[r]);
    _mm256_storeu_ps(c + r * ldc, _mm256_mul_ps(f, acc[r][0]));
    _mm256_storeu_ps(c + r * ldc + 8, _mm256_mul_ps(f, acc[r][1]));
  }
}

// The gemm_int4 entry point (isa_kernels.h) over Dot, prefetching the weights kAhead bytes
// ahead with _MM_HINT_* kHint (0: none). w: packed kINT4 (group w->group: a
// multiple of 32 dividing kp); a: int8 rows (kp used, scale, group sums over w->group);
// c: fp32 [M, ldc], 16*(b1-b0) columns.
template <class Dot, int64_t kAhead, int kHint>
void gemm_int4_with(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1,
                    float* c, int64_t ldc) {
  const int64_t kp = w->kp, g = w->group, nblk = b1 - b0;
  const int64_t blk_bytes = block_data_bytes(WeightFormat::kINT4, kp);
  const int64_t sc_bytes = kp / g * kInt4ScaleBytes;  // one block's scale records
  const uint8_t* wblk = packed_data(w) + b0 * blk_bytes;
  const uint8_t* sblk = packed_scales(w) + b0 * sc_bytes;
  if (m <= 0 || nblk <= 0) return;
  // block-outer: a block (kp*8 bytes) stays in cache while every row tile reads it
  for (int64_t b = 0; b < nblk; ++b) {
    for_row_tiles(m, [&](auto mr, int64_t r) {
      int4_tile<Dot, decltype(mr)::value, kAhead, kHint>(wblk + b * blk_bytes, sblk + b * sc_bytes, kp, g,
                                                         a.q + r * a.ldq, a.ldq, a.scale + r, a.gsum + r * a.gsum_ld,
                                                         a.gsum_ld, c + r * ldc + b * 16, ldc);
    });
  }
}

}  // namespace
}  // namespace avx2
}  // namespace ktmoe
