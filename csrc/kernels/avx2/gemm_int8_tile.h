// [NOTE] The int8 tile epilogue shared by the 256-bit int8 gemms (avx2/gemm_int8_avx2.cpp,
// avx2_vnni/gemm_int8_avx2_vnni.cpp): they differ only in how a group's exact int32 dot is
// computed, which they pass in as `group_dot`.
//
// For MR rows and one packed kINT8 block (16 columns, packed_format.h):
//   one group (per channel): c[r][j] = (sx[r]·s[j]) · I,
//   groups: acc = fma(s[j,G]·sx[r,G], I_G, acc) over G in order, c[r][j] = acc,
// the generic kernel's multiplies and fmas in the same order, so with exact I_G the fp32 bits
// equal generic's. In an anonymous namespace: every file that includes it (each compiled with
// its own ISA flags) keeps its own copy.
#pragma once
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

// group_dot(acc, G) writes I_G = Σ_{k∈G} (u − 128)·xq of rows r < MR, columns 8h .. 8h+7, into
// acc[r][h]; sx: the rows' activation scales [MR, ngroups]; s: the block's scale records (16 fp32
// per group); c: [MR, ldc], 16 columns.
template <int MR, class GroupDot>
inline void int8_tile(int64_t ngroups, GroupDot&& group_dot, const float* sx, const float* s, float* c,
                      int64_t ldc) {
  __m256i acc[MR][2];
  if (ngroups == 1) {  // per channel: (sx·s[n])·float(I)
    group_dot(acc, 0);
    const __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 f = _mm256_set1_ps(sx[r]);
      _mm256_storeu_ps(c + r * ldc, _mm256_mul_ps(_mm256_mul_ps(f, s0), _mm256_cvtepi32_ps(acc[r][0])));
      _mm256_storeu_ps(c + r * ldc + 8, _mm256_mul_ps(_mm256_mul_ps(f, s1), _mm256_cvtepi32_ps(acc[r][1])));
    }
    return;
  }
  __m256 facc[MR][2];
  for (int r = 0; r < MR; ++r) facc[r][0] = facc[r][1] = _mm256_setzero_ps();
  for (int64_t G = 0; G < ngroups; ++G) {
    group_dot(acc, G);
    const __m256 s0 = _mm256_loadu_ps(s + G * 16), s1 = _mm256_loadu_ps(s + G * 16 + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 f = _mm256_set1_ps(sx[r * ngroups + G]);
      facc[r][0] = _mm256_fmadd_ps(_mm256_mul_ps(s0, f), _mm256_cvtepi32_ps(acc[r][0]), facc[r][0]);
      facc[r][1] = _mm256_fmadd_ps(_mm256_mul_ps(s1, f), _mm256_cvtepi32_ps(acc[r][1]), facc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * ldc, facc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, facc[r][1]);
  }
}

}  // namespace
}  // namespace avx2
}  // namespace ktmoe
