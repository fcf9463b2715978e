// [NOTE] avx2 GGML code kernels: a block of a type with a kernel of its own (q8_0, q4_K, q5_K, q6_K,
// iq4_xs) as int8 codes and fp32 group scales, for gemm_ggml_avx2.cpp's dots.
//
// A block's weights are  W = s_g · q − m_g  per group g (16 or 32 weights): q the exact small integer
// code (q4_K's nibble, q5_K's 5 bits, q6_K's 6 bits − 32, q8_0's byte, iq4_xs's level), s_g and m_g fp32
// values gguf's formula rounds once each (q4_K / q5_K: d·sc_j and dmin·m_j; q6_K: d·sc_g; q8_0: d; iq4_xs: d·(ls_j − 32)).
// Each type gives, per block:
//   codes(b, buf)      its kElems codes as int8 in element order: q8_0's own bytes, the others built
//                      32 at a time with byte ops (nibble masks, 16-bit shifts of qh, vpshufb over the
//                      iq4 levels) into the L1 buffer buf;
//   scales(b, s)       s[g] = s_g for its kElems / kGroup groups, and (q4_K, q5_K) the 8 mins m_g as lanes;
// the fp16 scales widened by F16C's vcvtph2ps (exact, fp16 subnormals included). gemm_ggml_avx2.cpp
// widens 8 codes at a time to fp32 (vpmovsxbd, vcvtdq2ps) and sums t = Σ_group x·q, acc = fma(s_g, t, acc).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ggml/ggml_types.h"

namespace ktmoe {
namespace avx2 {
namespace ggml_codes {

// The fp16 at p widened exactly, in all 8 lanes.
inline __m256 f16_all(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
}

// The 8 bytes of v (little-endian) / at p as 8 fp32 lanes (unsigned / signed integers, exact).
inline __m256 u8x8_f32(uint64_t v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(v))));
}
inline __m256 s8x8_f32(const void* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store32(int8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }

// q8_0: d (fp16), 32 int8 codes.
struct Q8_0 {
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  static constexpr int kElems = 32, kBytes = 34, kGroup = 32, kGsum = 0;
  static const int8_t* codes(const uint8_t* b, int8_t*) { return reinterpret_cast<const int8_t*>(b + 2); }
  static __m256 scales(const uint8_t* b, float* s) {
    _mm_store_ss(s, _mm256_castps256_ps128(f16_all(b)));
    return _mm256_setzero_ps();
  }
};

// q4_K: d, dmin (fp16), 12 bytes of 6-bit scales / mins, 128 bytes of nibbles: sub-block j = 2c + s
// is nibble s of qs[32c + l], l < 32. kGsum: the 8 sub-blocks' Σ x per block.
struct Q4_K {
  static constexpr GgmlType kType = GgmlType::kQ4_K;
  static constexpr int kElems = 256, kBytes = 144, kGroup = 32, kGsum = 8;
  static const int8_t* codes(const uint8_t* b, int8_t* buf) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load32(b + 16 + 32 * c);
      store32(buf + 64 * c, _mm256_and_si256(v, low4));
      store32(buf + 64 * c + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    }
    return buf;
  }
  // s[j] = d·sc_j; returns the lanes dmin·m_j (ggml's get_scale_min_k4, its bit fields for all 8 j at
  // once in general registers).
  static __m256 scales(const uint8_t* b, float* s) {
    uint32_t u[3];
    std::memcpy(u, b + 4, 12);
    const uint64_t sc = (u[0] & 0x3F3F3F3Fu) |                                                 // scales[j] & 63
                        uint64_t((u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u)) << 32;  // j >= 4
    const uint64_t m = (u[1] & 0x3F3F3F3Fu) |                                                  // scales[j + 4] & 63
                       uint64_t(((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u)) << 32;
    _mm256_store_ps(s, _mm256_mul_ps(u8x8_f32(sc), f16_all(b)));
    return _mm256_mul_ps(u8x8_f32(m), f16_all(b + 2));
  }
};

// q5_K: q4_K's d, dmin and scales, then 32 bytes qh and 128 bytes of nibbles: sub-block j = 2c + s is
// nibble s of qs[32c + l] | bit j of qh[l] << 4 (0..31), l < 32.
struct Q5_K {
  static constexpr GgmlType kType = GgmlType::kQ5_K;
  static constexpr int kElems = 256, kBytes = 176, kGroup = 32, kGsum = Q4_K::kGsum;
  static const int8_t* codes(const uint8_t* b, int8_t* buf) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    const __m256i qh = load32(b + 16);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load32(b + 48 + 32 * c);
      // bit j of each qh byte at bit 4 (16-bit shifts: what crosses bytes is masked off), j = 2c, 2c + 1
      const __m256i top0 = c < 2 ? _mm256_slli_epi16(qh, 4 - 2 * c) : _mm256_srli_epi16(qh, 2 * c - 4);
      const __m256i top1 = c < 2 ? _mm256_slli_epi16(qh, 3 - 2 * c) : _mm256_srli_epi16(qh, 2 * c - 3);
      store32(buf + 64 * c, _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_and_si256(top0, bit4)));
      store32(buf + 64 * c + 32,
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), _mm256_and_si256(top1, bit4)));
    }
    return buf;
  }
  static __m256 scales(const uint8_t* b, float* s) { return Q4_K::scales(b, s); }
};

// q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, d (fp16). Element 128 h + 64 s + l (l < 64) is
// nibble s of ql[64 h + l] | bits 2t..2t+1 of qh[32 h + l % 32] << 4 (t = 2 s + l / 32), minus 32;
// group e / 16 has the scale d · scales[e / 16].
struct Q6_K {
  static constexpr GgmlType kType = GgmlType::kQ6_K;
  static constexpr int kElems = 256, kBytes = 210, kGroup = 16, kGsum = 0;
  static const int8_t* codes(const uint8_t* b, int8_t* buf) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = load32(b + 128 + 32 * h);
      // bits 2t..2t+1 of each qh byte at bits 4..5 (16-bit shifts: what crosses bytes is masked off)
      const __m256i top[4] = {_mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45),
                              _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45), _mm256_and_si256(qh, bits45),
                              _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45)};
      for (int half = 0; half < 2; ++half) {  // l = 32 half + (0..31)
        const __m256i ql = load32(b + 64 * h + 32 * half);
        const __m256i nib[2] = {_mm256_and_si256(ql, low4), _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4)};
        for (int sh = 0; sh < 2; ++sh)
          store32(buf + 128 * h + 64 * sh + 32 * half, _mm256_sub_epi8(_mm256_or_si256(nib[sh], top[2 * sh + half]), bias));
      }
    }
    return buf;
  }
  static __m256 scales(const uint8_t* b, float* s) {
    const __m256 d = f16_all(b + 208);
    _mm256_store_ps(s, _mm256_mul_ps(s8x8_f32(b + 192), d));
    _mm256_store_ps(s + 8, _mm256_mul_ps(s8x8_f32(b + 200), d));
    return _mm256_setzero_ps();
  }
};

// iq4_xs: d (fp16), scales_h (16 bits), 4 bytes scales_l, 128 bytes of nibbles: sub-block j (32
// weights) has the low nibbles of qs[16j .. 16j + 15] then their high nibbles, levels kIQ4Levels, and
// the scale d · (ls_j - 32), ls_j = (scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4.
struct IQ4_XS {
  static constexpr GgmlType kType = GgmlType::kIQ4_XS;
  static constexpr int kElems = 256, kBytes = 136, kGroup = 32, kGsum = 0;
  static const int8_t* codes(const uint8_t* b, int8_t* buf) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i levels = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (bytes 0-15 of v) and 2p + 1 (bytes 16-31)
      const __m256i v = load32(b + 8 + 32 * p);
      const __m256i lo = _mm256_shuffle_epi8(levels, _mm256_and_si256(v, low4));
      const __m256i hi = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
      store32(buf + 64 * p, _mm256_permute2x128_si256(lo, hi, 0x20));
      store32(buf + 64 * p + 32, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    return buf;
  }
  static __m256 scales(const uint8_t* b, float* s) {
    uint32_t l, h;
    std::memcpy(&l, b + 4, 4);
    std::memcpy(&h, b, 4);
    const __m256i low = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(l)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                         _mm256_set1_epi32(15));
    const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(h)), _mm256_setr_epi32(12, 14, 16, 18, 20, 22, 24, 26)),
                                         _mm256_set1_epi32(48));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(low, top), _mm256_set1_epi32(32));
    _mm256_store_ps(s, _mm256_mul_ps(_mm256_cvtepi32_ps(ls), f16_all(b)));
    return _mm256_setzero_ps();
  }
};

}  // namespace ggml_codes
}  // namespace avx2
}  // namespace ktmoe
