// [NOTE] The kMXFP4 packed format: OCP MXFP4 weights, e2m1 codes with one E8M0 scale per
// (column, 32 inputs), kept exactly, with bf16 activations: 4 + 8/32 = 4.25 bits per weight.
//
// What it stores. An MXFP4 checkpoint (gpt-oss's `*_blocks` / `*_scales`, DeepSeek-V4's
// expert_dtype="fp4") keeps each weight row as 4-bit e2m1 codes q, two per byte (low nibble
// first), and per block of 32 inputs one E8M0 byte e:  w[n][k] = e2m1(q[n][k]) * 2^(e - 127).
// kMXFP4 keeps both exactly; kernels turn a code into its bf16 value (avx512, amx's tiles), 2·e2m1
// (avx512's int16 kernel) or 2·e2m1 + 12 (generic, avx2) with a 16-entry table and scale each group's
// (or block's) sum by powers of two.
//
// e2m1: 1 sign, 2 exponent bits (bias 1), 1 mantissa bit, no infinity or NaN. Codes 0..7 are
// 0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6; codes 8..15 the same negated (8 is -0).
// Every value is exact in bf16 and fp16 (and normal in both, so vdpbf16ps's denormal flush
// never touches a weight). E8M0: an unsigned biased exponent, 2^(e - 127) for e = 0..254
// (2^-127 is an fp32 subnormal, still exact); e = 255 is NaN, refused by the packers.
//
// Layout (packed_format.h's conventions: blocks of 16 output columns, kGateUp blocks
// interleaved gate / up; kp = round_up(k, group), group a multiple of 32, 32 by default and in
// every MX checkpoint):
//   data: kINT4A's nibble layout (int4_affine_format.h): per block, kp/4 "k-quads" of 32 bytes,
//         byte (n%16)*2 + (k%2) of quad j holding input 4j + k%2 (low nibble) and 4j + 2 + k%2
//         (high nibble), so each nibble plane is a k-pair in the VNNI pair layout vdpbf16ps
//         reads. Padded inputs and rows hold code 0 (+0).
//   scales: per block, per k-group, 16 E8M0 bytes (one per column) at scale byte offset
//         (block*(kp/group) + k/group)*16 + n%16. Padded rows: e = 0 (their codes are 0).
//   value: y[m][n] = Σ_G 2^(e[n,G] - 127) · Σ_{k∈G} a[m][k]·e2m1(q[n][k]).
//
// How the kernels evaluate it (tests/native/test_mxfp4.cpp holds every ISA to the reference on the
// dequantized weights within an fp32 sum's bound plus the activation term below):
//   * generic, avx2 and avx512's gemm_mxfp4_int16 (amx's decode rows; the bits match): integer
//     group dots. Per row and block j of 32 inputs (kMxfp4Group), the bf16 activations become int16 x[k] = round_half_even(a[k] · 2^s_j)
//     (mxfp4_block_shift: s_j = min(13 - E_j, 127), E_j the fp32 exponent of the block's largest
//     |a|, so |x| <= 2^14); every |a| >= 2^(E_j - 6) is exact (bf16 has 8 significant bits), a
//     smaller one is rounded to a multiple of 2^(E_j - 13), i.e. by at most 2^-14 of the block's
//     largest: 2^5 finer than bf16's own rounding of it. Then per column
//     the exact int32 d = Σ_{k∈j} x[k]·2e2m1(q[n][k]) (|d| < 2^24, so float(d) is exact too), and
//     y += (float(d) · 2^-(s_j + 1)) · 2^(e[n, G(j)] - 127): two multiplies by powers of two
//     (exact in fp32's normal range), then one add, blocks j ascending, y starting at +0. A block
//     holding Inf or NaN has the scale NaN: its row's outputs are NaN.
//   * avx512: each group's fp32 sum of exact products (a bf16 times an e2m1 value), then one
//     multiply by 2^(e - 127) and an add (gemm_mxfp4_avx512.cpp); amx's tiles: tdpbf16ps over the
//     exact weights (gemm_mxfp4_amx.cpp).
//
// From dense weights (pack.cpp), per (row, group) of valid values v, as OCP MX: amax = max|v|,
// E = floor(log2 amax) - 2 (clamped to -127; amax = 0: E = 0), e = E + 127, and each code the
// e2m1 value nearest to v * 2^-E (ties to the even code, |v * 2^-E| < 8 saturating to 6) with v's sign.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/int4_affine_format.h"

namespace ktmoe {

// The MX block: one scale per 32 inputs.
constexpr int64_t kMxfp4Group = 32;
constexpr int64_t kMxfp4ScaleRecordBytes = 16;  // one (block, group) record: 16 E8M0 bytes
constexpr uint8_t kE8m0Nan = 0xFF;
constexpr int kE8m0Bias = 127;

// e2m1 magnitudes of codes 0..7 (code 8 + i is -value i).
constexpr float kE2m1Magnitude[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};

inline float e2m1_to_float(uint8_t code) {
  const float m = kE2m1Magnitude[code & 7];
  return code & 8 ? -m : m;
}

// 2^(e - 127), exact (e = 0: the fp32 subnormal 2^-127); e = 255 (NaN) is never stored.
inline float e8m0_to_float(uint8_t e) { return std::ldexp(1.f, int(e) - kE8m0Bias); }

// The code of the e2m1 value nearest to x (ties to the even code; |x| > 6 saturates to 6), with
// x's sign bit (a negative x that rounds to 0, and -0, give -0: unpacked weights repack to the same bytes).
inline uint8_t e2m1_from_float(float x) {
  const float a = std::fabs(x);
  const int m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.f);
  return uint8_t((std::signbit(x) ? 8 : 0) | m);
}

// The E8M0 byte of a group whose largest magnitude is amax (finite, >= 0): 127 + floor(log2 amax) - 2,
// at least 0; amax = 0 gives 127 (scale 1, every code 0).
inline uint8_t e8m0_for_amax(float amax) {
  if (!(amax > 0.f)) return uint8_t(kE8m0Bias);
  int e = 0;
  std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2 amax) = e - 1
  const int biased = e - 1 - 2 + kE8m0Bias;
  return uint8_t(biased < 0 ? 0 : biased);  // amax < 2^128: biased <= 254
}

// The int16 activations of the integer kernels (generic, avx2, avx512's gemm_mxfp4_int16): the shift s of a block of 32 bf16 values
// from the largest of their fp32 bit patterns without the sign (a zero block: s = 13 + 127, clamped). A
// block holding Inf or NaN: kMxfp4NonFinite.
constexpr int kMxfp4NonFinite = -1000;
inline int mxfp4_block_shift(uint32_t max_abs_bits) {
  if (max_abs_bits >= 0x7F800000u) return kMxfp4NonFinite;
  const int s = 13 - (int(max_abs_bits >> 23) - 127);  // 13 - E: the largest |a| * 2^s in [2^13, 2^14)
  return s < 127 ? s : 127;                            // 2^s stays a normal fp32 (blocks below 2^-114 coarser)
}
// 2^p as fp32 from its bits, p in [-149, 127] (below -126 a subnormal): no libm call per block.
inline float mxfp4_pow2(int p) {
  const uint32_t bits = p >= -126 ? uint32_t(p + 127) << 23 : 0x00800000u >> (-126 - p);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// The block's scale 2^-(s + 1) (the + 1: the dot's weights are 2·e2m1, integers); NaN for a non-finite block.
inline float mxfp4_block_scale(int s) { return s == kMxfp4NonFinite ? NAN : mxfp4_pow2(-(s + 1)); }

// 2·e2m1(code), an integer in [-12, 12]: the integer kernels' weights.
constexpr int e2m1_twice(int c) {
  constexpr int kTwice[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  return c & 8 ? -kTwice[c & 7] : kTwice[c & 7];
}

// 2·e2m1(code) + 12 in [0, 24] (the avx2 dot's unsigned weights; its group sum subtracts 12·Σx).
struct Mxfp4U8Table {
  alignas(16) uint8_t v[16] = {};
  constexpr Mxfp4U8Table() {
    for (int c = 0; c < 16; ++c) v[c] = uint8_t(12 + e2m1_twice(c));
  }
};
constexpr Mxfp4U8Table kMxfp4U8;
constexpr int kMxfp4U8Offset = 12;

// avx512's integer decode (vpermw into int16 words): entry i is 2·e2m1(i % 16) (a word index's low 5 bits).
struct Mxfp4I16Table {
  alignas(64) int16_t v[32] = {};
  constexpr Mxfp4I16Table() {
    for (int i = 0; i < 32; ++i) v[i] = int16_t(e2m1_twice(i % 16));
  }
};
constexpr Mxfp4I16Table kMxfp4I16;

// Byte of the (block, group) scale record of packed row pr, from the start of the scales.
inline int64_t mxfp4_scale_offset(int64_t kp, int64_t group, int64_t pr, int64_t g) {
  return ((pr / kBlockN) * (kp / group) + g) * kMxfp4ScaleRecordBytes + pr % kBlockN;
}

// bf16 bits of e2m1 code c: 2^E * (1 + m/2) is ((127 + E) << 7) | m << 6; 0.5 is 0x3F00.
constexpr uint16_t e2m1_bf16(int c) {
  const int e = (c >> 1) & 3, m = c & 1;
  const uint16_t mag = e == 0 ? (m ? 0x3F00 : 0) : uint16_t(((126 + e) << 7) | (m << 6));
  return uint16_t((c & 8 ? 0x8000 : 0) | mag);
}

// avx512's decode (vpermw): entry i is the bf16 of code i % 16 (a word index's low 5 bits).
struct Mxfp4Bf16Table {
  alignas(64) uint16_t v[32] = {};
  constexpr Mxfp4Bf16Table() {
    for (int i = 0; i < 32; ++i) v[i] = e2m1_bf16(i % 16);
  }
};
constexpr Mxfp4Bf16Table kMxfp4Bf16;


}  // namespace ktmoe
