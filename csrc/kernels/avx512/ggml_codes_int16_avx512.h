// [NOTE] avx512 GGML code kernels on int16 activations: one weight row's blocks dotted with R activation rows
// by vpdpwssd, for the amx table's decode rows (gemm_ggml_int16_avx512.cpp calls them).
//
// Why: on Intel's AMX cores the fp32 code kernels (ggml_codes_avx512.h) spend about six cycles a 32 weights
// widening codes to fp32 lanes (vpmovzxbd, vpermps / vcvtdq2ps) and three FMAs a row (q4_K read at 57-62 % of
// the read roof), where vpdpwssd takes 32 int16 products a cycle on either vector port. Here the codes stay
// exact small integers in int16 lanes, 32 weights a zmm, in the activations' order:
//   q4_K   64 bytes of nibbles as they lie, four codes a word picked by a shift and a mask, the activations
//          laid out to match once per call (Q4_K below);
//   q5_K   the same nibbles with qh's bit j moved to bit 4 (a shift, a mask, a bit select);
//   q6_K   ggml_codes_avx512.h's 256 int8 codes (q - 32) of the block, vpmovsxbw 32 at a time;
//   iq4_xs as q4_K, each code then a vpermw over the 16 levels (int16) (IQ4_XS below).
// q8_0 keeps the fp32 kernel: its codes need one widening either way, and its scale per 32 weights and row
// (d · xs) cost the int16 route as much as it saved (bench_ggml_rows, 2 threads: 0.79-0.82x at 2-16 rows
// an expert, 1.04-1.1x at one).
// With x the activations as int16 (int16_activations.h: x = a · 2^s per 32-block, xs = 2^-s its exact scale
// back), each (row, 32 weights) adds
//   d = vpdpwssd(0, codes, x)            16 int32 lanes of exact pair sums (|d| < 2^24 but for iq4_xs)
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
// A type with kPermuted reads them in its own order per block (its permute), from xp.
struct Acts16 {
  const QuantRows* q;
  const float* xs;
  const int16_t* xp;  // q's x laid out for the type (T::permute), or null: q.x as it is
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
      x[r] = (a.xp ? a.xp : a.q->x) + (r0 + r) * a.q->kp;
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

  // 64 weights of weight row J whose codes c0 / c1 pair with the 32 activations at e / e + 32: acc +=
  // scale(r) · Σ pairs(c0 · x[r][e ..] + c1 · x[r][e + 32 ..]).
  template <int J, class Scale>
  inline void dot2(int e, __m512i c0, __m512i c1, Scale&& scale) {
    for (int r = 0; r < R; ++r) {
      const __m512i d = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), c0, _mm512_loadu_si512(x[r] + e)),
                                            c1, _mm512_loadu_si512(x[r] + e + 32));
      acc[r][J] = _mm512_fmadd_ps(scale(r), _mm512_cvtepi32_ps(d), acc[r][J]);
    }
  }

  // 128 weights of weight row J whose codes c0 .. c3 pair with the 32 activations at e, e + 32, e + 64, e + 96:
  // acc += scale(r) · their Σ pairs.
  template <int J, class Scale>
  inline void dot4(int e, __m512i c0, __m512i c1, __m512i c2, __m512i c3, Scale&& scale) {
    for (int r = 0; r < R; ++r) {
      __m512i d = _mm512_dpwssd_epi32(_mm512_setzero_si512(), c0, _mm512_loadu_si512(x[r] + e));
      d = _mm512_dpwssd_epi32(d, c1, _mm512_loadu_si512(x[r] + e + 32));
      d = _mm512_dpwssd_epi32(d, c2, _mm512_loadu_si512(x[r] + e + 64));
      d = _mm512_dpwssd_epi32(d, c3, _mm512_loadu_si512(x[r] + e + 96));
      acc[r][J] = _mm512_fmadd_ps(scale(r), _mm512_cvtepi32_ps(d), acc[r][J]);
    }
  }

  // q4_K / q5_K's 256-blocks of weight row J: sx[r] = [s_j · xs_j, m_j · xs_j] interleaved (lanes 2j, 2j + 1),
  // and the mins corr += m_j · xs_j · Σ_j x on the odd lanes. The activations' [xs_j, xs_j] and [Σ_j x, Σ_j x]
  // are built once per block, at weight row 0.
  template <int J>
  inline void scales_mins(__m512 sm, float (&sx)[R][16]) {
    for (int r = 0; r < R; ++r) {
      if constexpr (J == 0) {
        xs2[r] = pairs8(xs[r]);
        gs2[r] = _mm512_cvtepi32_ps(_mm512_castps_si512(pairs8(reinterpret_cast<const float*>(xsum[r]))));
      }
      const __m512 v = _mm512_mul_ps(sm, xs2[r]);
      _mm512_storeu_ps(sx[r], v);
      corr[r][J] = _mm512_mask3_fmadd_ps(v, gs2[r], corr[r][J], 0xAAAA);
    }
  }
  __m512 xs2[R], gs2[R];  // the current block's [xs_j, xs_j] and [Σ_j x, Σ_j x] (scales_mins)

  inline void next_block(int elems) {
    for (int r = 0; r < R; ++r) x[r] += elems, xs[r] += elems / 32, xsum[r] += elems / 32;
  }

  inline __m512 total(int r, int j) const { return _mm512_sub_ps(acc[r][j], corr[r][j]); }
};

// Row x of k int16 inputs laid out for nibbles read 64 bytes at a time, sub-blocks of 2G inputs whose low
// nibbles sit in G words: per 128 inputs, the inputs paired with bits 0-3, 8-11, 4-7 and 12-15 of words
// 0-31 (word w: inputs e, e + 1, e + 2G, e + 2G + 1 with e = 4G (w / G) + 2 (w % G)).
template <int G>
void permute_nibble_inputs(const int16_t* x, int16_t* out, int64_t k) {
  for (int64_t s = 0; s < k; s += 128)
    for (int w = 0; w < 32; ++w) {
      const int64_t e = s + 4 * G * (w / G) + 2 * (w % G);
      out[s + w] = x[e], out[s + 32 + w] = x[e + 1], out[s + 64 + w] = x[e + 2 * G], out[s + 96 + w] = x[e + 2 * G + 1];
    }
}

// ---- the types: kElems / kBytes per block and block<J>(b, rows): the block at b of weight row J into rows;
// kPermuted types read their activations laid out by permute; calls of more than kMaxRows rows go to the fp32
// kernel.

// q4_K reads 64 bytes at a time (chunks 2h and 2h + 1 of its nibbles) without widening them: in word w,
// bits 0-3 / 8-11 / 4-7 / 12-15 are the codes of inputs 2w / 2w + 1 of the low sub-blocks (4h for w < 16, 4h + 2
// above) and of the high ones (4h + 1, 4h + 3), so lanes 0-7 of a dot sum sub-block 4h (or 4h + 1) and lanes
// 8-15 sub-block 4h + 2 (4h + 3), each with its own scale. The activations are laid out to match once per call
// (permute).
struct Q4_K {
  static constexpr GgmlType kType = GgmlType::kQ4_K;
  static constexpr int64_t kMaxRows = INT64_MAX;
  static constexpr int kElems = 256, kBytes = 144;
  static constexpr bool kPermuted = true;

  static void permute(const int16_t* x, int16_t* out, int64_t k) { permute_nibble_inputs<16>(x, out, k); }

  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    float sx[R][16];
    rows.template scales_mins<J>(ggml_codes::Q4_K::scales_mins(b), sx);
    in_memory(sx);
    const __m512i low4 = _mm512_set1_epi16(15);
    // [sx of sub-block g0] x 8, [sx of g1] x 8
    auto pair = [&](int r, int g0, int g1) {
      return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(sx[r][2 * g0]), _mm512_set1_ps(sx[r][2 * g1]));
    };
    ggml_codes::unrolled<2>([&](auto h) {
      const __m512i v = _mm512_loadu_si512(b + 16 + 64 * h);
      rows.template dot2<J>(128 * h, _mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16(v, 8), low4),
                            [&](int r) { return pair(r, 4 * h, 4 * h + 2); });
      rows.template dot2<J>(128 * h + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), _mm512_srli_epi16(v, 12),
                            [&](int r) { return pair(r, 4 * h + 1, 4 * h + 3); });
    });
  }
};

struct Q5_K {
  static constexpr GgmlType kType = GgmlType::kQ5_K;
  static constexpr int64_t kMaxRows = INT64_MAX;
  static constexpr bool kPermuted = false;
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

// q6_K runs here for calls of 1 or 2 rows only: from 3 its per-row scale vectors (two multiplies a 32 weights)
// cost more than the fp32 kernel's shared decode saves (bench_ggml_rows, avx512 / amx at 1, 2, 4 rows an expert:
// 1.15-1.24, 1.01-1.03, 0.85-0.86).
struct Q6_K {
  static constexpr GgmlType kType = GgmlType::kQ6_K;
  static constexpr int64_t kMaxRows = 2;
  static constexpr bool kPermuted = false;
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

// iq4_xs reads 64 bytes (sub-blocks 4h .. 4h + 3) at a time as q4_K does: in word w, bits 0-3 / 8-11 / 4-7 /
// 12-15 are levels of inputs 2w', 2w' + 1, 16 + 2w', 17 + 2w' (w' = w % 8) of sub-block 4h + w / 8, each picked
// by vpermw over the 16 levels (it reads the index's low 5 bits). All four fall in the same lanes' sub-block,
// lanes 4q .. 4q + 3 holding sub-block 4h + q: one dot of four, one scale vector.
struct IQ4_XS {
  static constexpr GgmlType kType = GgmlType::kIQ4_XS;
  static constexpr int64_t kMaxRows = INT64_MAX;
  static constexpr int kElems = 256, kBytes = 136;
  static constexpr bool kPermuted = true;
  static void permute(const int16_t* x, int16_t* out, int64_t k) { permute_nibble_inputs<8>(x, out, k); }

  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows16<R, NR>& rows) {
    const __m512 s = ggml_codes::IQ4_XS::scales(b);  // lanes 0-7
    __m512 sx[R];
    for (int r = 0; r < R; ++r) sx[r] = _mm512_mul_ps(s, _mm512_castps256_ps512(_mm256_loadu_ps(rows.xs[r])));
    const __m512i levels = _mm512_load_si512(kIQ4LevelsI16.v);
    ggml_codes::unrolled<2>([&](auto h) {
      const __m512i v = _mm512_loadu_si512(b + 8 + 64 * h);
      const __m512i q = _mm512_add_epi32(_mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2),
                                         _mm512_set1_epi32(4 * h));  // lane l: sub-block 4h + l / 4
      rows.template dot4<J>(128 * h, _mm512_permutexvar_epi16(v, levels),
                            _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), levels),
                            _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), levels),
                            _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), levels),
                            [&](int r) { return _mm512_permutexvar_ps(q, sx[r]); });
    });
  }
};

}  // namespace ggml_int16
}  // namespace avx512
}  // namespace ktmoe
