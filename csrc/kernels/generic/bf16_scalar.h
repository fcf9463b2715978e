// Scalar bf16 <-> fp32 conversion, shared by packing, the generic kernels and
// anything else that needs the exact rounding rule of the library:
// round-to-nearest-even, NaN stays NaN (made quiet, sign and top payload kept).
// Torch-free, header-only, no ISA flags needed.
#pragma once
#include <cstdint>
#include <cstring>

namespace ktmoe {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16 bits, round-to-nearest-even. Branch-free on the common path so a
// loop over it vectorizes with SSE2 integer ops.
inline uint16_t f32_to_bf16_rne(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;  // quiet NaN, sign and payload top kept
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// The value of fp32 rounded to bf16, as fp32.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16_rne(f)); }

}  // namespace ktmoe
