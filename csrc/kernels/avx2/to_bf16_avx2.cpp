// [NOTE] fp32 -> bf16 with round-to-nearest-even, AVX2, 8 lanes at a time.
//
// y = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16, the exact RNE of the top half
// (an overflow past the largest finite rounds to inf, as it must). NaN is not
// rounded (it could carry into inf): it is made quiet, keeping its sign and top
// payload bits, (bits >> 16) | 0x40, exactly as the generic kernel does. The 8 uint32 results are packed to uint16 with
// vpackusdw (values fit in 16 bits) plus a lane fix-up permute.
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

inline __m128i to_bf16x8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, nan);
  const __m256i p = _mm256_packus_epi32(r, r);  // lanes: r0..3 r0..3 | r4..7 r4..7
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

}  // namespace

// x: [n] fp32; y: [n] bf16 bits.
void to_bf16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), to_bf16x8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float t[8] = {};
    alignas(16) uint16_t o[8];
    std::memcpy(t, x + i, size_t(n - i) * 4);
    _mm_store_si128(reinterpret_cast<__m128i*>(o), to_bf16x8(_mm256_load_ps(t)));
    std::memcpy(y + i, o, size_t(n - i) * 2);
  }
}

}  // namespace avx2
}  // namespace ktmoe
