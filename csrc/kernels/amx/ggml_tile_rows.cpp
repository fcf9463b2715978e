// [NOTE] GGML rows as A tiles (ggml_tiles.h's GgmlTileRows): per type, 16 rows of GGUF blocks -> their exact
// integer codes as bf16, one row of k codes per weight row, and the fp32 scale (and offset) of every k-group.
// AVX-512 BW, 32 codes per instruction group; a super-block's scales unpacked in vector lanes too (variable
// shifts of the scale bytes, gathered by vpshufb), widened from fp16 by F16C (exact) and rounded as gguf's
// formula rounds them (ggml_decode.cpp: d · sc, dmin · m, d · (ls - 32) are each one product). A row's scales
// are contiguous (s[G] of its groups G), as GgmlTileRows says.
//   q8_0    codes q (vpmovsxbd, vcvtdq2ps, vcvtne2ps2bf16: exact below 2^8)         s = d
//   q4_0    codes q - 8 (a nibble through vpermw over a 16-entry bf16 table)         s = d
//   q4_K    codes 0..15 (low / high nibbles of 32 bytes)                             s = d·sc_j, o = -(dmin·m_j)
//   q5_K    codes 0..31 (the nibble with qh's bit j as bit 4)                        as q4_K
//   q6_K    codes -32..31 (ql's nibble | qh's 2 bits << 4, vpermt2w over 64 entries)  s = d·sc_g (16 inputs)
//   q2_K    codes 0..3 (2-bit fields of qs)                       s = d·(sc_g & 15), o = -(dmin·(sc_g >> 4)) (16)
//   q3_K    codes -4..3 (2 bits of qs, hmask's bit as 4)                          s = d·(6-bit sc_g - 32) (16)
//   iq4_xs  codes the iq4 levels (vpermw)                                            s = d·(ls_j - 32)
//   iq4_nl  as iq4_xs, one block of 32                                              s = d
//   mxfp4   codes 2·e2m1 (vpermw)                                                    s = 2^(e - 128)
// Element order inside blocks as ggml's dequantize_row_* (ggml_blocks.h); every code is a small integer, so
// its bf16 is exact and normal (or zero): AMX's denormals-are-zero never touches a weight.
#include <immintrin.h>

#include <cstring>

#include "kernels/amx/ggml_tiles.h"
#include "kernels/ggml/ggml_blocks.h"

namespace ktmoe {
namespace amx {
namespace {

using namespace ggml;

inline uint16_t bf16_of(int v) {  // exact for |v| <= 256
  const float f = float(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

// vpermw / vpermt2w tables: the bf16 of each code's value.
struct Tables {
  alignas(64) uint16_t u5[32];         // 0..31
  alignas(64) uint16_t s6[64];         // i - 32
  alignas(64) uint16_t q4_0[32];       // i - 8 (i < 16)
  alignas(64) uint16_t iq4[32];        // kIQ4Levels
  alignas(64) uint16_t mxfp4[32];      // kMXFP4Levels2
  alignas(64) uint16_t q3[32];         // i - 4 (i < 8)
  Tables() {
    for (int i = 0; i < 32; ++i) {
      u5[i] = bf16_of(i);
      q4_0[i] = bf16_of(i % 16 - 8);
      iq4[i] = bf16_of(kIQ4Levels[i % 16]);
      mxfp4[i] = bf16_of(kMXFP4Levels2[i % 16]);
      q3[i] = bf16_of(i % 8 - 4);
    }
    for (int i = 0; i < 64; ++i) s6[i] = bf16_of(i - 32);
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
inline __m512i table(const uint16_t* t) { return _mm512_load_si512(t); }
enum class Levels { kQ4_0, kIQ4, kMXFP4 };  // the 32-element nibble types' tables
template <Levels L>
const uint16_t* levels() {
  return L == Levels::kQ4_0 ? tables().q4_0 : L == Levels::kIQ4 ? tables().iq4 : tables().mxfp4;
}

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// 32 codes of a row from its input e (a multiple of 32) into the tile order (GgmlTileRows): codes points at the
// row's slot of group 0, groups are 16 · kGroup codes apart.
template <int kGroup>
inline void put(uint16_t* codes, int64_t e, __m512i v) {
  if constexpr (kGroup == 32) {
    _mm512_storeu_si512(codes + (e / 32) * 16 * 32, v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + (e / 16) * 16 * 16), _mm512_castsi512_si256(v));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + (e / 16 + 1) * 16 * 16), _mm512_extracti64x4_epi64(v, 1));
  }
}
inline __m512i u8x32_words(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// A 32-element nibble block (16 bytes: element j < 16 the low nibble of qs[j], 16 + j the high one) through t.
inline __m512i nibble_block(const uint8_t* qs, __m512i t) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i idx =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, _mm256_set1_epi16(15))), _mm256_srli_epi16(v, 4), 1);
  return _mm512_permutexvar_epi16(idx, t);
}

// One row of each type: its codes (put) and, per group G of the row, s[G] (and o[G]).
void row_q8_0(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float*) {
  for (int64_t b = 0; b < k / kQK; ++b, row += sizeof(BlockQ8_0)) {
    s[b] = f16(row);
    const auto* q = reinterpret_cast<const __m128i*>(row + 2);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1)));
    put<32>(codes, 32 * b, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

template <int kBytes, Levels kLevels, bool kE8m0>
void row_nibble32(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float*) {
  const __m512i t = table(levels<kLevels>());
  for (int64_t b = 0; b < k / kQK; ++b, row += kBytes) {
    if constexpr (kE8m0) {  // ggml_e8m0_to_fp32_half: 2^(e - 128), e = 0 and 1 as fp32 subnormals
      const uint32_t e = row[0], bits = e < 2 ? uint32_t(0x00200000u) << e : (e - 1) << 23;
      std::memcpy(&s[b], &bits, 4);
    } else {
      s[b] = f16(row);
    }
    put<32>(codes, 32 * b, nibble_block(row + (kE8m0 ? 1 : 2), t));
  }
}

// q4_K / q5_K's super-block at b: s[j] = d · sc_j, o[j] = -(dmin · m_j), j < 8 (ggml's get_scale_min_k4 in 16
// lanes: lane j the scale, lane 8 + j the min; a low field of byte A >> sa masked, or'd with the top 2 bits
// of byte B (j >= 4) shifted to bits 4-5).
inline void k_scales_mins(const uint8_t* b, float* s, float* o) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));  // 12 scale bytes (+ 4 of qh / qs)
  const __m512i a = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)));
  const __m512i bb = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 4, 5, 6, 7)));
  const __m512i sa = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4);
  const __m512i ma = _mm512_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
  const __m512i mb = _mm512_setr_epi32(0, 0, 0, 0, 3, 3, 3, 3, 0, 0, 0, 0, 3, 3, 3, 3);
  const __m512i v = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(a, sa), ma),
                                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bb, 6), mb), 4));
  const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f16(b)), _mm512_set1_ps(f16(b + 2)));
  const __m512 prod = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(v));
  _mm256_storeu_ps(s, _mm512_castps512_ps256(prod));
  _mm256_storeu_ps(o, _mm256_xor_ps(_mm512_extractf32x8_ps(prod, 1), _mm256_set1_ps(-0.f)));  // -(dmin · m)
}

template <bool kFifthBit>
void row_k_with_mins(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float* o) {
  constexpr int kBytes = kFifthBit ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const __m512i t = table(tables().u5), nib = _mm512_set1_epi16(15), one = _mm512_set1_epi16(1);
  for (int64_t sb = 0; sb < k / kQK_K; ++sb, row += kBytes, s += 8, o += 8) {
    k_scales_mins(row, s, o);
    const uint8_t* qs = row + (kFifthBit ? 48 : 16);
    const __m512i h = kFifthBit ? u8x32_words(row + 16) : _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles) and 2p + 1 (high) of qs[32p .. 32p + 32)
      const __m512i v = u8x32_words(qs + 32 * p);
      __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_srli_epi16(v, 4);
      if constexpr (kFifthBit) {
        lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2 * p), one), 4));
        hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2 * p + 1), one), 4));
      }
      put<32>(codes, 256 * sb + 64 * p, _mm512_permutexvar_epi16(lo, t));
      put<32>(codes, 256 * sb + 64 * p + 32, _mm512_permutexvar_epi16(hi, t));
    }
  }
}

// Element 128 h + 64 s + 32 u + l: nibble s of ql[64 h + 32 u + l] | bits 2 (2s + u) of qh[32 h + l] << 4, - 32.
void row_q6_K(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float*) {
  const __m512i lo_t = table(tables().s6), hi_t = table(tables().s6 + 32);
  const __m512i nib = _mm512_set1_epi16(15), two = _mm512_set1_epi16(3);
  for (int64_t sb = 0; sb < k / kQK_K; ++sb, row += sizeof(BlockQ6_K), s += 16) {
    const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 192)));
    _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_set1_ps(f16(row + 208)), _mm512_cvtepi32_ps(sc)));
    for (int h = 0; h < 2; ++h) {
      const __m512i qh = u8x32_words(row + 128 + 32 * h);
      for (int u = 0; u < 2; ++u) {
        const __m512i ql = u8x32_words(row + 64 * h + 32 * u);
        for (int sh = 0; sh < 2; ++sh) {
          const __m512i lo = sh ? _mm512_srli_epi16(ql, 4) : _mm512_and_si512(ql, nib);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(qh, 2 * (2 * sh + u)), two);
          const __m512i idx = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
          put<16>(codes, 256 * sb + 128 * h + 64 * sh + 32 * u, _mm512_permutex2var_epi16(lo_t, idx, hi_t));
        }
      }
    }
  }
}

// q2_K: element 128 h + 32 s + l is bits 2s..2s+1 of qs[32 h + l]; group g = e / 16: s = d · (scales[g] & 15),
// o = -(dmin · (scales[g] >> 4)).
void row_q2_K(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float* o) {
  const __m512i t = table(tables().u5), three = _mm512_set1_epi16(3);
  for (int64_t sb = 0; sb < k / kQK_K; ++sb, row += sizeof(BlockQ2_K), s += 16, o += 16) {
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4));
    _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_set1_ps(f16(row + 80)), lo));
    _mm512_storeu_ps(o, _mm512_xor_ps(_mm512_mul_ps(_mm512_set1_ps(f16(row + 82)), hi), _mm512_set1_ps(-0.f)));
    for (int h = 0; h < 2; ++h) {
      const __m512i q = u8x32_words(row + 16 + 32 * h);
      for (int sh = 0; sh < 4; ++sh)
        put<16>(codes, 256 * sb + 128 * h + 32 * sh,
                _mm512_permutexvar_epi16(_mm512_and_si512(_mm512_srli_epi16(q, 2 * sh), three), t));
    }
  }
}

// q3_K: element 128 h + 32 s + l is bits 2s..2s+1 of qs[32 h + l], minus 4 unless bit 4h + s of hmask[l] is set;
// group g: s = d · (6-bit scale - 32) (low 4 bits from scales[g % 8] >> 4 (g / 8), high 2 from scales[8 + g % 4]).
void row_q3_K(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float*) {
  const __m512i t = table(tables().q3), three = _mm512_set1_epi16(3), one = _mm512_set1_epi16(1);
  for (int64_t sb = 0; sb < k / kQK_K; ++sb, row += sizeof(BlockQ3_K), s += 16) {
    // lane g: (bytes[g % 8] >> 4 (g / 8)) & 15 | ((bytes[8 + g % 4] >> 2 (g / 4)) & 3) << 4, minus 32
    const __m128i bytes = _mm_maskz_loadu_epi8(0x0FFF, row + 96);  // the 12 scale bytes (d follows: not read)
    const __m512i lo = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7)));
    const __m512i hi = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11)));
    const __m512i v = _mm512_or_si512(
        _mm512_and_si512(_mm512_srlv_epi32(lo, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4)), _mm512_set1_epi32(15)),
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(hi, _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)),
                                           _mm512_set1_epi32(3)), 4));
    _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_set1_ps(f16(row + 108)), _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(32)))));
    const __m512i hm = u8x32_words(row);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = u8x32_words(row + 32 + 32 * h);
      for (int sh = 0; sh < 4; ++sh) {
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(q, 2 * sh), three);
        const __m512i hb = _mm512_and_si512(_mm512_srli_epi16(hm, 4 * h + sh), one);
        put<16>(codes, 256 * sb + 128 * h + 32 * sh, _mm512_permutexvar_epi16(_mm512_or_si512(lo, _mm512_slli_epi16(hb, 2)), t));
      }
    }
  }
}

void row_iq4_xs(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float*) {
  const __m512i t = table(tables().iq4);
  const __m256i shift_l = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), shift_h = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  for (int64_t sb = 0; sb < k / kQK_K; ++sb, row += sizeof(BlockIQ4_XS), s += 8) {
    uint16_t scales_h;  // ls_j = nibble j of the 4 bytes scales_l | bits 2j..2j+1 of scales_h << 4
    uint32_t scales_l;
    std::memcpy(&scales_h, row + 2, 2);
    std::memcpy(&scales_l, row + 4, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(scales_l)), shift_l), _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(scales_h), shift_h), _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(f16(row)), _mm256_cvtepi32_ps(ls)));
    for (int j = 0; j < 8; ++j) put<32>(codes, 256 * sb + 32 * j, nibble_block(row + 8 + 16 * j, t));
  }
}

using RowFn = void (*)(const uint8_t* row, int64_t k, uint16_t* codes, float* s, float* o);

// GgmlTileRows::decode from a row function: rows past `rows` get zero codes, scales and offsets.
template <RowFn kRow, int kGroup, bool kMins>
void decode_rows(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, uint16_t* codes, float* s, float* o) {
  const int64_t ngroups = k / kGroup;
  for (int64_t i = 0; i < 16; ++i) {
    if (i < rows) {
      kRow(w + i * row_bytes, k, codes + i * kGroup, s + i * ngroups, o + i * ngroups);
      continue;
    }
    for (int64_t g = 0; g < ngroups; ++g) std::memset(codes + (g * 16 + i) * kGroup, 0, kGroup * 2);
    std::memset(s + i * ngroups, 0, size_t(ngroups) * 4);
    if (kMins) std::memset(o + i * ngroups, 0, size_t(ngroups) * 4);
  }
}

template <RowFn kRow, int kGroup, bool kMins>
constexpr GgmlTileRows tile_rows() {
  return {kGroup, kMins, decode_rows<kRow, kGroup, kMins>};
}

constexpr GgmlTileRows kQ8_0 = tile_rows<row_q8_0, 32, false>();
constexpr GgmlTileRows kQ4_0 = tile_rows<row_nibble32<sizeof(BlockQ4_0), Levels::kQ4_0, false>, 32, false>();
constexpr GgmlTileRows kIQ4_NL = tile_rows<row_nibble32<sizeof(BlockIQ4_NL), Levels::kIQ4, false>, 32, false>();
constexpr GgmlTileRows kMXFP4 = tile_rows<row_nibble32<sizeof(BlockMXFP4), Levels::kMXFP4, true>, 32, false>();
constexpr GgmlTileRows kQ4_K = tile_rows<row_k_with_mins<false>, 32, true>();
constexpr GgmlTileRows kQ5_K = tile_rows<row_k_with_mins<true>, 32, true>();
constexpr GgmlTileRows kQ6_K = tile_rows<row_q6_K, 16, false>();
constexpr GgmlTileRows kIQ4_XS = tile_rows<row_iq4_xs, 32, false>();
constexpr GgmlTileRows kQ2_K = tile_rows<row_q2_K, 16, true>();
constexpr GgmlTileRows kQ3_K = tile_rows<row_q3_K, 16, false>();

}  // namespace

const GgmlTileRows* ggml_tile_rows(GgmlType id) {
  switch (id) {
    case GgmlType::kQ8_0: return &kQ8_0;
    case GgmlType::kQ4_0: return &kQ4_0;
    case GgmlType::kIQ4_NL: return &kIQ4_NL;
    case GgmlType::kMXFP4: return &kMXFP4;
    case GgmlType::kQ4_K: return &kQ4_K;
    case GgmlType::kQ5_K: return &kQ5_K;
    case GgmlType::kQ6_K: return &kQ6_K;
    case GgmlType::kIQ4_XS: return &kIQ4_XS;
    case GgmlType::kQ2_K: return &kQ2_K;
    case GgmlType::kQ3_K: return &kQ3_K;
    default: return nullptr;
  }
}

}  // namespace amx
}  // namespace ktmoe
