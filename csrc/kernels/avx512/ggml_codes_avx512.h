// [NOTE] avx512 GGML code kernels: one weight row's blocks dotted with R fp32 activation rows, for the
// types with a kernel of their own (gemm_ggml_avx512.cpp calls them; the rest decode rows).
//
// A block's weights are  W = s_g · q − m_g  per group g (16 or 32 weights): q the exact small integer
// code, s_g and m_g fp32 values gguf's formula rounds once each (q4_K / q5_K: d·sc_j, dmin·m_j; q6_K: d·sc_g;
// q8_0: d; iq4_xs: d·(ls_j − 32), q a level). The codes become exact fp32 lanes in registers, 16 at a
// time, by the cheapest exact route this CPU has (fp32 FMA issues twice a cycle here, vdpbf16ps
// about once every two, and blocks the shuffle port half that time: bf16 dot products lose):
//   * a nibble: vpermps over a 16-entry fp32 table (the index is the lane's low 4 bits, so the low
//     nibble of a zero-extended byte needs no mask): iq4_xs's levels, q4_K's low nibbles (0..15);
//     a high nibble: byte >> 4 then vcvtdq2ps (q4_K; one shuffle-port op fewer) or the table (iq4_xs);
//   * q5_K: the nibble with qh's bit shifted to bit 4 (one bit select), vpermt2ps over 0..31;
//   * q6_K: ql's nibble | qh's 2 bits << 4, minus 32, built 64 codes at a time in int8 lanes (16-bit
//     variable shifts, one bit select), kept in an L1 buffer, then vpmovsxbd + vcvtdq2ps;
//   * q8_0: vpmovsxbd + vcvtdq2ps.
// Each (activation row, weight row, group) then adds to its accumulator (ggml_row_groups.h runs weight rows
// side by side, so the FMA latency overlaps), with x the activations as fp32:
//   32-weight groups   t = x0·q0 + x1·q1 (a multiply, an FMA), acc = fma(s_g, t, acc);
//   16-weight groups   acc = fma(x, s_g · q, acc)   (s_g · q is gguf's weight itself);
//   mins (q4_K, q5_K)  corr = fma(m_g, Σ_g x, corr)  (8 lanes, Σ_g x from the call's group sums);
//   the output         c = the lane sum of acc − corr.
// A unit activation row therefore reads back gguf's weight exactly: t = q exactly, fma(s_g, q, 0) is
// round(s_g · q), every other product is an exact zero, and corr = m_g: round(round(s_g·q) − m_g).
// Random rows give fp32 sums of exact products (within fp32 summation's bound). Every row sees the
// same operations whatever R and whichever other rows share the pass: the bits depend only on the
// activation row and the weight row.
//
// The fp16 scales are widened by vcvtph2ps (F16C's exact conversion: fp16 subnormals stay exact). q4_K's
// eight 6-bit scales and mins are unpacked in 16 lanes at once (lane 2j: sc_j, lane 2j + 1: m_j; a
// per-lane variable shift and mask of the 12 scale bytes broadcast as dwords) and multiplied by
// [d, dmin] interleaved the same way, one vmulps: the fp32 products gguf rounds.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/avx512/avx512_common.h"
#include "kernels/ggml/ggml_types.h"

namespace ktmoe {
namespace avx512 {
namespace ggml_codes {

// f(std::integral_constant<int, I>{}) for I = 0 .. N-1, unrolled at compile time.
template <class F, int... I>
inline void unrolled_seq(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
inline void unrolled(F&& f) {
  unrolled_seq(f, std::make_integer_sequence<int, N>{});
}

// Bytes of the weight stream prefetched ahead, into L2: cold m = 1 rows of 2048 (1536 x 2048, one thread)
// read 8.0 GB/s of q4_K without, 9.5 / 11.1 / 12.2 / 12.0 GB/s 1 / 2 / 4 / 8 KiB ahead (into L1 2 KiB
// ahead: 7.5); hot in L2 13.7 (one run each, on a shared 2-core host).
constexpr int kAhead = 4096;

// 16 bytes at p as 16 int32 lanes, zero / sign extended.
inline __m512i u8x16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i s8x16(const void* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))); }

// The fp16 at p widened exactly, in every lane.
inline __m512 f16_all(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h)));
}

// Stored values the compiler must read back from memory: a broadcast of one is a load-port {1to16}
// operand, where GCC would otherwise shuffle it out of the register just stored (port 5, the codes').
template <class V, size_t N>
inline void in_memory(V (&a)[N]) {
  asm("" : "+m"(a));
}

// The call's activation rows as the fp32 kernels read them: x [m][k] fp32, gs [m][ldg] the group sums (types
// with mins: Σ x of each 32-group j at lanes 2j and 2j + 1 of its block's 16; else null).
struct Acts32 {
  const float* x;
  int64_t k;
  const float* gs;
  int64_t ldg;
};

// The accumulators of R activation rows against NR weight rows (ggml_row_groups.h's Rows policy): one chain
// per (activation row, weight row).
template <int R, int NR>
struct Rows {
  __m512 acc[R][NR];
  __m512 corr[R][NR];
  const float* x[R];   // fp32 activations of the current block
  const float* gs[R];  // group sums of the current block (types with mins)

  Rows(const Acts32& a, int64_t r0) {
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < NR; ++j) acc[r][j] = corr[r][j] = _mm512_setzero_ps();
      x[r] = a.x + (r0 + r) * a.k;
      gs[r] = a.gs ? a.gs + (r0 + r) * a.ldg : nullptr;
    }
  }

  // A 32-weight group of weight row J at element e of the block, codes q0 (e .. e+15) and q1 (e+16 .. e+31),
  // scale s.
  template <int J>
  inline void group32(__m512 s, int e, __m512 q0, __m512 q1) {
    for (int r = 0; r < R; ++r) {
      const __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(x[r] + e + 16), q1, _mm512_mul_ps(_mm512_loadu_ps(x[r] + e), q0));
      acc[r][J] = _mm512_fmadd_ps(s, t, acc[r][J]);
    }
  }

  // A 16-weight group of weight row J at element e: its weights w = s · q (gguf's, one rounding).
  template <int J>
  inline void group16(__m512 w, int e) {
    for (int r = 0; r < R; ++r) acc[r][J] = _mm512_fmadd_ps(_mm512_loadu_ps(x[r] + e), w, acc[r][J]);
  }

  // corr += m · gs on the lanes of k (weight row J's block mins against its group sums).
  template <int J>
  inline void mins(__m512 m, __mmask16 k) {
    for (int r = 0; r < R; ++r) corr[r][J] = _mm512_mask3_fmadd_ps(m, _mm512_loadu_ps(gs[r]), corr[r][J], k);
  }

  inline void next_block(int elems) {
    for (int r = 0; r < R; ++r) {
      x[r] += elems;
      if (gs[r]) gs[r] += elems / 16;
    }
  }

  inline __m512 total(int r, int j) const { return _mm512_sub_ps(acc[r][j], corr[r][j]); }
};

// ---- the types: kElems / kBytes per block, kGsum group-sum floats per block (0: no mins), and
// block<J>(b, rows): the block at b of weight row J into rows.

// q8_0: d (fp16), 32 int8 codes.
struct Q8_0 {
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  static constexpr int kElems = 32, kBytes = 34, kGsum = 0;
  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows<R, NR>& rows) {
    const __m512 q0 = _mm512_cvtepi32_ps(s8x16(b + 2)), q1 = _mm512_cvtepi32_ps(s8x16(b + 18));
    rows.template group32<J>(f16_all(b), 0, q0, q1);
  }
};

// q4_K: d, dmin (fp16), 12 bytes of 6-bit scales / mins, 128 bytes of nibbles: sub-block j = 2c + s
// is nibble s of qs[32c + l], l < 32.
struct Q4_K {
  static constexpr GgmlType kType = GgmlType::kQ4_K;
  static constexpr int kElems = 256, kBytes = 144, kGsum = 16;  // gs_j at lanes 2j and 2j + 1

  // [d·sc_0, dmin·m_0, d·sc_1, dmin·m_1, ...] (ggml's get_scale_min_k4 in 16 lanes).
  static inline __m512 scales_mins(const uint8_t* b) {
    // lane 2j + s (s = 1: the min): the low bits from scales[j] (j < 4, sc) / scales[j + 4] (j < 4, m) /
    // scales[j + 4]'s nibble s (j >= 4), the top 2 bits (j >= 4) from bits 6-7 of scales[j - 4] / scales[j].
    const __m512i u0 = bcast32(b + 4), u1 = bcast32(b + 8), u2 = bcast32(b + 12);
    const __m512i top_src = _mm512_mask_blend_epi32(0xAAAA, u0, u1);
    const __m512i low_src = _mm512_mask_blend_epi32(0xFF00, top_src, u2);
    const __m512i low_shift = _mm512_setr_epi32(0, 0, 8, 8, 16, 16, 24, 24, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i low_mask = _mm512_setr_epi32(63, 63, 63, 63, 63, 63, 63, 63, 15, 15, 15, 15, 15, 15, 15, 15);
    const __m512i top_shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 10, 10, 18, 18, 26, 26);
    const __m512i top_mask = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 48, 48, 48, 48, 48, 48, 48, 48);
    const __m512i top = _mm512_and_si512(_mm512_srlv_epi32(top_src, top_shift), top_mask);
    // (low & low_mask) | top
    const __m512i v = _mm512_ternarylogic_epi32(_mm512_srlv_epi32(low_src, low_shift), low_mask, top, 0xEA);
    uint32_t dd;
    std::memcpy(&dd, b, 4);
    const __m512 d_dmin = _mm512_cvtph_ps(_mm256_set1_epi32(static_cast<int>(dd)));  // [d, dmin, d, ...]
    return _mm512_mul_ps(_mm512_cvtepi32_ps(v), d_dmin);
  }

  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows<R, NR>& rows) {
    alignas(64) float sm[16];
    const __m512 v = scales_mins(b);
    _mm512_store_ps(sm, v);
    in_memory(sm);
    rows.template mins<J>(v, 0xAAAA);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    unrolled<4>([&](auto c) {
      const uint8_t* qs = b + 16 + 32 * c;
      const __m512i z0 = u8x16(qs), z1 = u8x16(qs + 16);
      rows.template group32<J>(_mm512_set1_ps(sm[4 * c]), 64 * c,
                                        _mm512_permutexvar_ps(z0, iota), _mm512_permutexvar_ps(z1, iota));
      rows.template group32<J>(_mm512_set1_ps(sm[4 * c + 2]), 64 * c + 32,
                                            _mm512_cvtepi32_ps(_mm512_srli_epi32(z0, 4)),
                                            _mm512_cvtepi32_ps(_mm512_srli_epi32(z1, 4)));
    });
  }
};

// q5_K: q4_K's d, dmin and scales, then 32 bytes qh and 128 bytes of nibbles: sub-block j = 2c + s is
// nibble s of qs[32c + l] | bit j of qh[l] << 4 (0..31), l < 32.
struct Q5_K {
  static constexpr GgmlType kType = GgmlType::kQ5_K;
  static constexpr int kElems = 256, kBytes = 176, kGsum = Q4_K::kGsum;

  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows<R, NR>& rows) {
    alignas(64) float sm[16];
    const __m512 v = Q4_K::scales_mins(b);
    _mm512_store_ps(sm, v);
    in_memory(sm);
    rows.template mins<J>(v, 0xAAAA);
    // 0..31 over two 16-entry halves: vpermt2ps reads the index's low 5 bits (nibble, then qh's bit at 4)
    const __m512 lo = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 hi = _mm512_add_ps(lo, _mm512_set1_ps(16));
    const __m512i low4 = _mm512_set1_epi32(0x0F);
    const __m512i h[2] = {u8x16(b + 16), u8x16(b + 32)};  // qh[l], l < 16 and l >= 16
    unrolled<8>([&](auto j) {
      // bit j of qh at bit 4 (the bits shifted in above it are ignored by vpermt2ps)
      auto top = [&](int half) {
        if constexpr (j < 4) return _mm512_slli_epi32(h[half], 4 - j);
        else return _mm512_srli_epi32(h[half], j - 4);
      };
      auto codes = [&](int half) {
        const __m512i z = u8x16(b + 48 + 32 * (j / 2) + 16 * half);
        const __m512i nib = j % 2 ? _mm512_srli_epi32(z, 4) : z;
        // low4 ? nibble : top
        return _mm512_permutex2var_ps(lo, _mm512_ternarylogic_epi32(low4, nib, top(half), 0xCA), hi);
      };
      rows.template group32<J>(_mm512_set1_ps(sm[2 * j]), 32 * j, codes(0), codes(1));
    });
  }
};

// q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, d (fp16). Element 128 h + 64 s + l (l < 64) is
// nibble s of ql[64 h + l] | bits 2t..2t+1 of qh[32 h + l % 32] << 4 (t = 2 s + l / 32), minus 32;
// group e / 16 has the scale d · scales[e / 16].
struct Q6_K {
  static constexpr GgmlType kType = GgmlType::kQ6_K;
  static constexpr int kElems = 256, kBytes = 210, kGsum = 0;

  // The block's 256 codes q - 32 as int8, in element order.
  static inline void codes(const uint8_t* b, int8_t* out) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
    // Per 16-bit lane: words 0-15 hold l < 32 (t = 2s), words 16-31 l >= 32 (t = 2s + 1); the shift
    // brings bits 2t..2t+1 of each byte to bits 4..5 (what crosses into the next byte is masked off).
    const __m512i lo_shift = _mm512_setr_epi32(0x00040004, 0x00040004, 0x00040004, 0x00040004, 0x00040004, 0x00040004,
                                               0x00040004, 0x00040004, 0x00020002, 0x00020002, 0x00020002, 0x00020002,
                                               0x00020002, 0x00020002, 0x00020002, 0x00020002);  // left: 4 (t=0), 2 (t=1)
    const __m512i hi_shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x00020002, 0x00020002, 0x00020002, 0x00020002,
                                               0x00020002, 0x00020002, 0x00020002, 0x00020002);  // right: 0 (t=2), 2 (t=3)
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
      const __m512i top_lo = _mm512_and_si512(_mm512_sllv_epi16(qh, lo_shift), bits45);
      const __m512i top_hi = _mm512_and_si512(_mm512_srlv_epi16(qh, hi_shift), bits45);
      // low4 ? nibble : top  (bits 0-3 from the nibble, 4-5 from qh, 6-7 zero)
      const __m512i q_lo = _mm512_ternarylogic_epi32(low4, ql, top_lo, 0xCA);
      const __m512i q_hi = _mm512_ternarylogic_epi32(low4, _mm512_srli_epi16(ql, 4), top_hi, 0xCA);
      _mm512_storeu_si512(out + 128 * h, _mm512_sub_epi8(q_lo, bias));
      _mm512_storeu_si512(out + 128 * h + 64, _mm512_sub_epi8(q_hi, bias));
    }
  }

  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows<R, NR>& rows) {
    alignas(64) int8_t q[256];
    codes(b, q);
    alignas(64) float s[16];
    _mm512_store_ps(s, _mm512_mul_ps(_mm512_cvtepi32_ps(s8x16(b + 192)), f16_all(b + 208)));
    in_memory(s);
    unrolled<16>([&](auto g) {
      rows.template group16<J>(_mm512_mul_ps(_mm512_set1_ps(s[g]), _mm512_cvtepi32_ps(s8x16(q + 16 * g))), 16 * g);
    });
  }
};

// iq4_xs: d (fp16), scales_h (16 bits), 4 bytes scales_l, 128 bytes of nibbles: sub-block j (32
// weights) has the low nibbles of qs[16j .. 16j + 15] then their high nibbles, levels kIQ4Levels, and
// the scale d · (ls_j - 32), ls_j = (scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4.
struct IQ4_XS {
  static constexpr GgmlType kType = GgmlType::kIQ4_XS;
  static constexpr int kElems = 256, kBytes = 136, kGsum = 0;

  static inline __m512 scales(const uint8_t* b) {  // lanes 0-7: d · (ls_j - 32)
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(bcast32(b + 4), _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0)),
                                         _mm512_set1_epi32(15));
    const __m512i top = _mm512_and_si512(_mm512_srlv_epi32(bcast32(b), _mm512_setr_epi32(12, 14, 16, 18, 20, 22, 24, 26, 0, 0, 0, 0, 0, 0, 0, 0)),
                                         _mm512_set1_epi32(48));
    const __m512i ls = _mm512_sub_epi32(_mm512_or_si512(low, top), _mm512_set1_epi32(32));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(ls), f16_all(b));
  }

  template <int J, int R, int NR>
  static inline void block(const uint8_t* b, Rows<R, NR>& rows) {
    alignas(64) float s[16];
    _mm512_store_ps(s, scales(b));
    in_memory(s);
    const __m512 levels = _mm512_setr_ps(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    unrolled<8>([&](auto j) {
      const __m512i z = u8x16(b + 8 + 16 * j);
      rows.template group32<J>(_mm512_set1_ps(s[j]), 32 * j, _mm512_permutexvar_ps(z, levels),
                                    _mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), levels));
    });
  }
};

}  // namespace ggml_codes
}  // namespace avx512
}  // namespace ktmoe
