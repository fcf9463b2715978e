// [NOTE] The kFP8 packed format: exact FP8 (e4m3fn) block weights, W8A16.
//
// What it stores. DeepSeek-V3-style checkpoints keep each Linear weight W [n, k] as
// float8_e4m3fn bytes q[n][k] plus fp32 scales (`weight_scale_inv`, one per 128x128
// block, or one per output row for FP8_PERCHANNEL):  w[n][k] = e4m3(q[n][k]) * s.
// kFP8 keeps the bytes and the scales exactly; kernels convert to bf16 / fp32 in
// registers. Activations are bf16 rows, as for kBF16.
//
// Layout (packed_format.h's conventions: blocks of 16 output columns, kGateUp blocks
// interleaved gate / up, kp padded, a multiple of 32 and of the group):
//   data: per block, kp/2 "k-pairs" of 32 bytes; the e4m3 byte of w[n][k] is at
//         block*(kp*16) + (k/2)*32 + (n%16)*2 + (k%2)
//         (kBF16's VNNI pair layout with 1-byte elements: widening 32 bytes to 32
//         words gives exactly the pair layout vdpbf16ps reads). Padded weights: 0x00.
//   scales: per block, per k-group of `group` = header.group inputs (128 for
//         block-scaled checkpoints, kp for per-channel ones), 16 fp32 (64 bytes), one
//         per column, at scale byte offset (block*(kp/group) + k/group)*64 + (n%16)*4.
//         A 128x128 block scale is repeated over its columns. Padded rows: scale 0.
//   value: w[n][k] = e4m3(byte) * scale[n, k/group], and
//         y[m][n] = Σ_G scale[n,G] · Σ_{k∈G} a[m][k]·e4m3(byte)
//         (each group's partial sum in fp32, then one multiply-add by the scale).
//
// e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinity; 0x7F and
// 0xFF are NaN (the packer refuses them); exponent 0 is subnormal, m * 2^-9.
// |value| <= 448. Every value is exact in bf16 (8-bit significand, exponent range
// 2^-9 .. 2^8, all normal bf16, so vdpbf16ps's denormal flush never applies).
//
// Kernels use the *scaled* value e4m3 * 2^-8 (kE4m3KernelScale): it is the fp16 whose
// bits are sign<<15 | (byte & 0x7F)<<7 (an fp16 exponent bias of 15 instead of 7), and
// the bf16 whose exponent field is e + 112, which is `0x3800 | (byte & 0x7F)<<4` with
// the sign at bit 15 for a normal byte (an OR, no add). They multiply the scale by 2^8
// (exact), so the product is unchanged.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/packed_format.h"

namespace ktmoe {

// One (block, group) scale record: 16 fp32.
constexpr int64_t kFp8ScaleBytes = 64;
// DeepSeek-V3's weight_block_size: the group of a block-scaled checkpoint.
constexpr int64_t kFp8BlockGroup = 128;
// Kernels multiply by e4m3 * 2^-8 and by scale * 2^8 (see [NOTE]).
constexpr float kE4m3KernelScale = 256.f;

// Bytes of one block's data: kp k values x 16 columns x 1 byte.
inline int64_t fp8_block_data_bytes(int64_t kp) { return kp * kBlockN; }
// Byte of packed row pr (= 16*block + column), input k, from the start of the data.
inline int64_t fp8_data_offset(int64_t kp, int64_t pr, int64_t k) {
  return (pr / kBlockN) * fp8_block_data_bytes(kp) + (k / 2) * 32 + (pr % kBlockN) * 2 + (k % 2);
}
// Byte of the scale of packed row pr, group g, from the start of the scales.
inline int64_t fp8_scale_offset(int64_t kp, int64_t group, int64_t pr, int64_t g) {
  return ((pr / kBlockN) * (kp / group) + g) * kFp8ScaleBytes + (pr % kBlockN) * 4;
}
// Bytes of all scales of a matrix with np packed rows.
inline int64_t fp8_scale_bytes(int64_t np, int64_t kp, int64_t group) {
  return (np / kBlockN) * (kp / group) * kFp8ScaleBytes;
}

inline bool e4m3_is_nan(uint8_t b) { return (b & 0x7F) == 0x7F; }

// Exact value of an e4m3fn byte (quiet NaN for 0x7F / 0xFF). Normal: the fp32 with
// exponent e + 120 and the 3 mantissa bits on top; subnormal: m * 2^-9 (exact).
inline float e4m3_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7;
  uint32_t bits;
  if (e4m3_is_nan(b)) {
    bits = sign | 0x7FC00000u;
  } else if (e == 0) {
    const float v = float(m) * (1.f / 512.f);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | ((e + 120) << 23) | (m << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The e4m3fn byte nearest to x (round to nearest even, as torch's float8_e4m3fn cast),
// |x| clamped to 448 first; x finite. Below 2^-6 the grid is m * 2^-9 (m = 8 is 2^-6,
// byte 0x08); above, 1.m * 2^E with 3 mantissa bits ((2f - 1) * 8 is exact in fp32).
inline uint8_t e4m3_from_float(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fmin(std::fabs(x), 448.f);
  if (a < 0.015625f) return uint8_t(sign | int(std::nearbyint(a * 512.f)));
  int e = 0;
  const float f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int m = int(std::nearbyint((2.f * f - 1.f) * 8.f)), biased = e + 6;
  if (m == 8) m = 0, ++biased;
  return uint8_t(sign | (biased << 3) | m);  // 448 (0x7E) at most: never a NaN byte
}

// bf16 bits of e4m3(m) * 2^-8 for a subnormal magnitude m < 8 (0 for m = 0):
// m * 2^-17 normalized, 1 <= m: exponent 127 - 17 + floor(log2 m).
constexpr uint16_t e4m3_subnormal_scaled_bf16(int m) {
  if (m == 0) return 0;
  int lg = 0;
  while ((m >> (lg + 1)) != 0) ++lg;
  const int frac = (m << (7 - lg)) & 0x7F;  // bits of m below its leading one, on top of 7
  return uint16_t(((110 + lg) << 7) | frac);
}

}  // namespace ktmoe
