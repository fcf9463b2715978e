// [NOTE] GGML blocks -> fp32, exactly as the `gguf` package's gguf.quants.dequantize (and llama.cpp's
// dequantize_row_*) computes them: per block the fp16 scales widened exactly, the integer code, then
// the same fp32 multiplies and adds in the same order (`(d * sc) * q - (dmin * m)` for q4_K), each
// rounded once. That needs the compiler not to fuse a multiply and an add into an FMA: this file is
// built with the generic flags (no FMA instructions; the #error below keeps it so).
//
// One function per type, each a loop over blocks (ggml_types.h's GgmlDecodeFn); the element order of
// each block is ggml's (ggml_blocks.h, and the comments below).
#include "kernels/ggml/ggml_decode.h"

#include <cstring>

#include "kernels/generic/f16_scalar.h"
#include "kernels/ggml/ggml_blocks.h"

#if defined(__FMA__) || defined(__AVX512F__)
#error "ggml_decode.cpp must be compiled without FMA: a fused d * q - m would differ from gguf's two roundings"
#endif

namespace ktmoe {
namespace {

using namespace ggml;

// Element j of a 32-element nibble block: the low nibble of qs[j] for j < 16, else the high one of qs[j - 16].
inline int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4; }

// ggml_e8m0_to_fp32_half: 2^(e - 128), e = 0 and 1 as fp32 subnormals.
inline float e8m0_half(uint8_t e) {
  return f32_from_bits(e < 2 ? uint32_t(0x00200000u) << e : uint32_t(e - 1) << 23);
}

}  // namespace

void ggml_decode_f32(const uint8_t* blocks, int64_t n, float* out) { std::memcpy(out, blocks, size_t(n) * 4); }

void ggml_decode_f16(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_block<uint16_t>(blocks, i));
}

void ggml_decode_bf16(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_block<uint16_t>(blocks, i));
}

void ggml_decode_q4_0(const uint8_t* blocks, int64_t n, float* out) {  // d * (q - 8)
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockQ4_0>(blocks, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) out[j] = d * float(nibble(b.qs, j) - 8);
  }
}

void ggml_decode_q4_1(const uint8_t* blocks, int64_t n, float* out) {  // d * q + m
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockQ4_1>(blocks, i);
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int j = 0; j < kQK; ++j) out[j] = d * float(nibble(b.qs, j)) + m;
  }
}

void ggml_decode_q5_0(const uint8_t* blocks, int64_t n, float* out) {  // d * ((q | h << 4) - 16)
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockQ5_0>(blocks, i);
    const float d = f16_to_f32(b.d);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < kQK; ++j) out[j] = d * float((nibble(b.qs, j) | int((qh >> j) & 1) << 4) - 16);
  }
}

void ggml_decode_q5_1(const uint8_t* blocks, int64_t n, float* out) {  // d * (q | h << 4) + m
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockQ5_1>(blocks, i);
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < kQK; ++j) out[j] = d * float(nibble(b.qs, j) | int((qh >> j) & 1) << 4) + m;
  }
}

void ggml_decode_q8_0(const uint8_t* blocks, int64_t n, float* out) {  // q * d
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockQ8_0>(blocks, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) out[j] = float(b.qs[j]) * d;
  }
}

// Element e = 128 h + 32 s + l (h < 2, s < 4, l < 32) is bits 2s..2s+1 of qs[32 h + l]; its 16-element
// group g = e / 16 has the scale d * (scales[g] & 15) and the min dmin * (scales[g] >> 4).
void ggml_decode_q2_k(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i, out += kQK_K) {
    const auto b = load_block<BlockQ2_K>(blocks, i);
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e / 32) % 4, l = e % 32, g = e / 16;
      const float dl = d * float(b.scales[g] & 0xF), ml = dmin * float(b.scales[g] >> 4);
      out[e] = dl * float((b.qs[32 * h + l] >> (2 * s)) & 3) - ml;
    }
  }
}

// Element e = 128 h + 32 s + l: low bits 2s..2s+1 of qs[32 h + l], minus 4 unless bit e / 32 of hmask[l] is
// set; group g = e / 16 has the 6-bit signed scale (low 4 bits from scales[g % 8] >> 4 (g / 8), high 2 from
// scales[8 + g % 4] >> 2 (g / 4)) - 32.
void ggml_decode_q3_k(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i, out += kQK_K) {
    const auto b = load_block<BlockQ3_K>(blocks, i);
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e / 32) % 4, l = e % 32, g = e / 16;
      const int lo = (b.scales[g % 8] >> (4 * (g / 8))) & 0xF, hi = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
      const float dl = d * float(int8_t(uint8_t(lo | hi << 4)) - 32);
      const int q = ((b.qs[32 * h + l] >> (2 * s)) & 3) - (((b.hmask[l] >> (e / 32)) & 1) ? 0 : 4);
      out[e] = dl * float(q);
    }
  }
}

namespace {

// q4_K and q5_K: element 32 j + l (sub-block j) is nibble j % 2 of qs[32 (j / 2) + l] (q5_K: with bit j of qh[l]
// as its fifth bit), in sub-block j with (d * sc_j) and (dmin * m_j).
template <class Block, bool kFifthBit>
void decode_k_with_mins(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i, out += kQK_K) {
    const auto b = load_block<Block>(blocks, i);
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      q4k_scale_min(b.scales, j, &sc, &m);
      const float dl = d * float(sc), ml = dmin * float(m);
      for (int l = 0; l < 32; ++l) {
        int q = (b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
        if constexpr (kFifthBit) q |= ((b.qh[l] >> j) & 1) << 4;
        out[32 * j + l] = dl * float(q) - ml;
      }
    }
  }
}

}  // namespace

void ggml_decode_q4_k(const uint8_t* blocks, int64_t n, float* out) {
  decode_k_with_mins<BlockQ4_K, false>(blocks, n, out);
}

void ggml_decode_q5_k(const uint8_t* blocks, int64_t n, float* out) {
  decode_k_with_mins<BlockQ5_K, true>(blocks, n, out);
}

// Element e = 128 h + 64 s + l (l < 64): nibble s of ql[64 h + l], with bits 2t..2t+1 of qh[32 h + l % 32]
// (t = 2 s + l / 32) above it, minus 32; group e / 16 has the scale d * scales[e / 16].
void ggml_decode_q6_k(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i, out += kQK_K) {
    const auto b = load_block<BlockQ6_K>(blocks, i);
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e / 64) % 2, l = e % 64, t = 2 * s + l / 32;
      const int lo = (b.ql[64 * h + l] >> (4 * s)) & 0xF, hi = (b.qh[32 * h + l % 32] >> (2 * t)) & 3;
      out[e] = (d * float(b.scales[e / 16])) * float(int8_t(uint8_t(lo | hi << 4)) - 32);
    }
  }
}

void ggml_decode_iq4_nl(const uint8_t* blocks, int64_t n, float* out) {  // d * level[q]
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockIQ4_NL>(blocks, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) out[j] = d * float(kIQ4Levels[nibble(b.qs, j)]);
  }
}

// Sub-block j (32 elements, qs[16 j .. 16 j + 15] as a 32-element nibble block) has the 6-bit scale
// (scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2 j) & 3) << 4, minus 32: d * scale * level[q].
void ggml_decode_iq4_xs(const uint8_t* blocks, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i, out += kQK_K) {
    const auto b = load_block<BlockIQ4_XS>(blocks, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < 8; ++j) {
      const int ls = ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | ((b.scales_h >> (2 * j)) & 3) << 4;
      const float dl = d * float(int8_t(uint8_t(ls)) - 32);
      for (int l = 0; l < 32; ++l) out[32 * j + l] = dl * float(kIQ4Levels[nibble(b.qs + 16 * j, l)]);
    }
  }
}

void ggml_decode_mxfp4(const uint8_t* blocks, int64_t n, float* out) {  // 2^(e - 128) * (2 e2m1(q))
  for (int64_t i = 0; i < n; ++i, out += kQK) {
    const auto b = load_block<BlockMXFP4>(blocks, i);
    const float d = e8m0_half(b.e);
    for (int j = 0; j < kQK; ++j) out[j] = d * float(kMXFP4Levels2[nibble(b.qs, j)]);
  }
}

}  // namespace ktmoe
