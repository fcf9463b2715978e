// [NOTE] avx512 GGML code kernels on int16 activations: one weight row's blocks dotted with R activation rows
// by vpdpwssd, for the amx table's decode rows (gemm_ggml_int16_avx512.cpp calls them).
//
// Why: on Intel's AMX cores the fp32 code kernels (ggml_codes_avx512.h) spend about six cycles a 32 weights
// widening codes to fp32 lanes (vpmovzxbd, vpermps / vcvtdq2ps) and three FMAs a row (q4_K read at 57-62 % of
// the read roof), where vpdpwssd takes 32 int16 products a cycle on either vector port. Here the codes stay
// exact small integers in int16 lanes, 32 weights a zmm, in the activations' order:
//   q4_K   a 32-byte chunk vpmovzxbw'ed: its low nibbles (& 15) are sub-block 2c, its high ones (>> 4) 2c + 1;
//   q5_K   the same nibbles with qh's bit j moved to bit 4 (a shift, a mask, a bit select);
//   q6_K   ggml_codes_avx512.h's 256 int8 codes (q - 32) of the block, vpmovsxbw 32 at a time;
//   q8_0   the 32 int8 codes, vpmovsxbw;
//   iq4_xs the 16 bytes of a sub-block in both halves of a zmm (vpmovzxbw of a broadcast), shifted by 0 / 4
//          per half (vpsrlvw), then vpermw over the 16 levels (int16): its 32 weights in element order.
// With x the activations as int16 (int16_activations.h: x = a · 2^s per 32-block, xs = 2^-s its exact scale
// back), each (row, 32 weights) adds
//   d = vpdpwssd(0, codes, x)            16 int32 lanes of exact pair sums (|d| < 2^24 but for q8_0 / iq4_xs)
//   acc = fma(s_g · xs, float(d), acc)   s_g the group's fp32 scale as gguf rounds it, xs a power of two
// (q6_K's 16-weight groups: lanes 0-7 and 8-15 of one d take their own scale, one vector), and q4_K / q5_K's
// mins corr = fma(m_g · xs, Σ_g x, corr) on the odd lanes of [s_0, m_0, s_1, m_1, ...]; the output is the
// lane sum of acc − corr, as the fp32 kernels' (ggml_row_groups.h runs both). A unit activation row (x = 2^13,
// xs = 2^-13) therefore still reads back gguf's weight exactly: s_g · xs · float(q · 2^13) is the exact
// s_g · q, rounded once by the FMA, and corr = m_g. Random rows: fp32 sums of exact products of the rounded
// activations (within fp32 summation's bound plus x's rounding). s_g · xs is exact while it stays a normal
// fp32: with fp16 scales, for activations below about 2^100. Each row's bits depend only on its activation
// row and the weight row, whatever R.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/avx512/ggml_codes_avx512.h"
#include "kernels/avx512/int16_activations.h"
#include "kernels/ggml/ggml_blocks.h"

namespace ktmoe {
namespace avx512 {
namespace ggml_int16 {

using ggml_codes::in_memory;

// 32 bytes at p as 32 int16 lanes, zero / sign extended.
inline __m512i u8x32(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512i s8x32(const void* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }

// Entry i: iq4_xs's level of code i % 16, as int16 (vpermw reads an index's low 5 bits).
struct IQ4LevelsI16 {
  alignas(64) int16_t v[32] = {};
  constexpr IQ4LevelsI16() {
    for (int i = 0; i < 32; ++i) v[i] = ggml::kIQ4Levels[i % 16];
  }
};
constexpr IQ4LevelsI16 kIQ4LevelsI16;

// [v_0, v_0, v_1, v_1, ..., v_7, v_7] from 8 floats at p.
inline __m512 pairs8(const float* p) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                               _mm512_castps256_ps512(_mm256_loadu_ps(p)));
}

// The call's activation rows as int16 (int16_activations.h), with xs [m][q.nj] their scales back 2^-s.
struct Acts16 {
  const QuantRows* q;
  const float* xs;
};

// The accumulators of R activation rows against NR weight rows (ggml_row_groups.h's Rows policy): one chain
// per (activation row, weight row).
template <int R, int NR>
struct Rows16 {
  __m512 acc[R][NR];
  __m512 corr[R][NR];
  const int16_t* x[R];     // int16 activations of the current block
  const float* xs[R];      // their scale back 2^-s per 32-block of the current block
  const int32_t* xsum[R];  // their Σ x per 32-block of the current block

  Rows16(const Acts16& a, int64_t r0) {
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < NR; ++j) acc[r][j] = corr[r][j] = _mm512_setzero_ps();
      x[r] = a.q->x + (r0 + r) * a.q->kp;
      xs[r] = a.xs + (r0 + r) * a.q->nj;
      xsum[r] = a.q->xsum + (r0 + r) * a.q->nj;
    }
  }

  // 32 weights of weight row J at element e of the block: acc += scale(r) · Σ pairs(codes · x[r][e ..]),
  // scale(r) a vector.
  template <int J, class Scale>
  inline void dot(int e, __m512i codes, Scale&& scale) {
    for (int r = 0; r < R; ++r) {
      const __m512i d = _mm512_dpwssd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(x[r] + e));
      acc[r][J] = _mm512_fmadd_ps(scale(r), _mm512_cvtepi32_ps(d), acc[r][J]);
    }
  }

  // q4_K / q5_K's 256-blocks of weight row J: sx[r] = [s_j · xs_j, m_j · xs_j] interleaved (lanes 2j, 2j + 1),
  // and the mins corr += m_j · xs_j · Σ_j x on the odd lanes.
  template <int J>
  inline void scales_mins(__m512 sm, float (&sx)[R][16]) {
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_mul_ps(sm, pairs8(xs[r]));
      _mm512_storeu_ps(sx[r], v);
      const __m512 g = _mm512_cvtepi32_ps(_mm512_castps_si512(pairs8(reinterpret_cast<const float*>(xsum[r]))));
      corr[r][J] = _mm512_mask3_fmadd_ps(v, g, corr[r][J], 0xAAAA);
    }
  }

  inline void next_block(int elems) {
    for (int r = 0; r < R; ++r) x[r] += elems, xs[r] += elems / 32, xsum[r] += elems / 32;
  }

  inline __m512 total(int r, int j) const { return _mm512_sub_ps(acc[r][j], corr[r][j]); }
};

// ---- the types: kElems / kBytes per block and block<J>(b, rows): the block at b of weight row J into rows.

struct Q8_0 {
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  static constexpr int kElems = 32, kBytes = 34;
  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    const float d = _cvtsh_ss(h);
    rows.template dot<J>(0, s8x32(b + 2), [&](int r) { return _mm512_set1_ps(d * rows.xs[r][0]); });
  }
};

struct Q4_K {
  static constexpr GgmlType kType = GgmlType::kQ4_K;
  static constexpr int kElems = 256, kBytes = 144;
  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    float sx[R][16];
    rows.template scales_mins<J>(ggml_codes::Q4_K::scales_mins(b), sx);
    in_memory(sx);
    const __m512i low4 = _mm512_set1_epi16(15);
    ggml_codes::unrolled<4>([&](auto c) {
      const __m512i z = u8x32(b + 16 + 32 * c);
      rows.template dot<J>(64 * c, _mm512_and_si512(z, low4), [&](int r) { return _mm512_set1_ps(sx[r][4 * c]); });
      rows.template dot<J>(64 * c + 32, _mm512_srli_epi16(z, 4),
                                        [&](int r) { return _mm512_set1_ps(sx[r][4 * c + 2]); });
    });
  }
};

struct Q5_K {
  static constexpr GgmlType kType = GgmlType::kQ5_K;
  static constexpr int kElems = 256, kBytes = 176;
  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    float sx[R][16];
    rows.template scales_mins<J>(ggml_codes::Q4_K::scales_mins(b), sx);
    in_memory(sx);
    const __m512i low4 = _mm512_set1_epi16(15), bit4 = _mm512_set1_epi16(16);
    const __m512i h = u8x32(b + 16);  // qh[l], l < 32
    ggml_codes::unrolled<8>([&](auto j) {
      const __m512i z = u8x32(b + 48 + 32 * (j / 2));
      const __m512i nib = j % 2 ? _mm512_srli_epi16(z, 4) : z;
      __m512i top;  // bit j of qh at bit 4
      if constexpr (j < 4) top = _mm512_and_si512(_mm512_slli_epi16(h, 4 - j), bit4);
      else top = _mm512_and_si512(_mm512_srli_epi16(h, j - 4), bit4);
      // low4 ? nibble : top
      rows.template dot<J>(32 * j, _mm512_ternarylogic_epi32(low4, nib, top, 0xCA),
                                [&](int r) { return _mm512_set1_ps(sx[r][2 * j]); });
    });
  }
};

struct Q6_K {
  static constexpr GgmlType kType = GgmlType::kQ6_K;
  static constexpr int kElems = 256, kBytes = 210;
  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    alignas(64) int8_t q[256];
    ggml_codes::Q6_K::codes(b, q);
    const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(ggml_codes::s8x16(b + 192)), ggml_codes::f16_all(b + 208));
    ggml_codes::unrolled<8>([&](auto p) {  // groups 2p (lanes 0-7) and 2p + 1 (lanes 8-15)
      const __m512 sp = _mm512_permutexvar_ps(
          _mm512_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                            2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1),
          s);
      rows.template dot<J>(32 * p, s8x32(q + 32 * p),
                                [&](int r) { return _mm512_mul_ps(sp, _mm512_set1_ps(rows.xs[r][p])); });
    });
  }
};

struct IQ4_XS {
  static constexpr GgmlType kType = GgmlType::kIQ4_XS;
  static constexpr int kElems = 256, kBytes = 136;
  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    float sx[R][16];
    const __m512 s = ggml_codes::IQ4_XS::scales(b);  // lanes 0-7
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(sx[r], _mm512_mul_ps(s, _mm512_castps256_ps512(_mm256_loadu_ps(rows.xs[r]))));
    in_memory(sx);
    const __m512i levels = _mm512_load_si512(kIQ4LevelsI16.v);
    const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x00040004, 0x00040004, 0x00040004, 0x00040004,
                                             0x00040004, 0x00040004, 0x00040004, 0x00040004);
    ggml_codes::unrolled<8>([&](auto j) {  // low nibbles: weights 0-15, high: 16-31
      const __m512i z = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * j))));
      rows.template dot<J>(32 * j, _mm512_permutexvar_epi16(_mm512_srlv_epi16(z, halves), levels),
                                [&](int r) { return _mm512_set1_ps(sx[r][j]); });
    });
  }
};

}  // namespace ggml_int16
}  // namespace avx512
}  // namespace ktmoe
