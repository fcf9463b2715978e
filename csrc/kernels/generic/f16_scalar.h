// Scalar fp16 <-> fp32 conversion, the oracle of the f16_to_f32 / f32_to_f16
// micro-kernels (fp16 models' activations): fp16 -> fp32 is exact (NaN made quiet,
// sign and payload kept); fp32 -> fp16 rounds to nearest even, overflows to inf,
// keeps denormals, and makes NaN quiet keeping sign and top payload bits -- what
// F16C's vcvtps2ph does. Torch-free, header-only, no ISA flags needed.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/generic/bf16_scalar.h"

namespace ktmoe {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {  // zero or denormal: m * 2^-24, exact in fp32
    const float v = float(m) * (1.f / 16777216.f);
    return f32_from_bits(f32_bits(v) | sign);
  }
  if (e == 31) return f32_from_bits(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t f32_to_f16_rne(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN, quiet
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 (tie above 65504 rounds up) or inf
  if (a >= 0x38800000u) {  // normal: rebias the exponent (127 -> 15), round the 13 dropped bits
    const uint32_t r = a - 0x38000000u;
    return uint16_t(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // denormal (or rounds up to the smallest normal, 0x400): |f| * 2^24 to the nearest even integer
  return uint16_t(sign | uint16_t(std::nearbyint(f32_from_bits(a) * 16777216.f)));
}

}  // namespace ktmoe
