// [NOTE] fp16 <-> fp32 activations (fp16 models), F16C, 8 lanes at a time.
//
// vcvtph2ps is exact (denormals included); vcvtps2ph with imm 0 rounds to nearest
// even, overflows to inf, keeps denormals and makes NaN quiet keeping its sign and
// top payload bits, the rules of the generic f16_scalar.h (tested bit for bit).
// The tails run the same instruction on a zero-padded copy.
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {

// x: [n] fp16 bits; y: [n] fp32.
void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  if (i < n) {
    alignas(16) uint16_t t[8] = {};
    alignas(32) float o[8];
    std::memcpy(t, x + i, size_t(n - i) * 2);
    _mm256_store_ps(o, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(t))));
    std::memcpy(y + i, o, size_t(n - i) * 4);
  }
}

// x: [n] fp32; y: [n] fp16 bits.
void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    alignas(32) float t[8] = {};
    alignas(16) uint16_t o[8];
    std::memcpy(t, x + i, size_t(n - i) * 4);
    _mm_store_si128(reinterpret_cast<__m128i*>(o), _mm256_cvtps_ph(_mm256_load_ps(t), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(y + i, o, size_t(n - i) * 2);
  }
}

}  // namespace avx2
}  // namespace ktmoe
