// [NOTE] avx2 gemm_ggml: a GGML matrix where it lies (isa_kernels.h's contract).
//
// As avx512's (gemm_ggml_avx512.cpp): each weight row decoded once per call by the type's exact decoder
// into a thread-local fp32 row, then every activation row dotted with it, 8 fp32 lanes, two accumulators
// over k in steps of 16, a scalar tail for plain types whose k is no multiple of 8, summed in a fixed
// order: the same bits for any split of n.
#include <vector>

#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

}  // namespace

void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  thread_local std::vector<float> row;
  row.resize(size_t(k));
  const int64_t k16 = k / 16 * 16, k8 = k / 8 * 8;
  for (int64_t i = 0; i < n; ++i) {
    type.decode(w + i * row_bytes, k / type.block_elems, row.data());
    const float* wr = row.data();
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t* ar = a + r * lda;
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int64_t kk = 0;
      for (; kk < k16; kk += 16) {
        acc0 = _mm256_fmadd_ps(bf16x8_to_f32(ar + kk), _mm256_loadu_ps(wr + kk), acc0);
        acc1 = _mm256_fmadd_ps(bf16x8_to_f32(ar + kk + 8), _mm256_loadu_ps(wr + kk + 8), acc1);
      }
      if (kk < k8) {
        acc0 = _mm256_fmadd_ps(bf16x8_to_f32(ar + kk), _mm256_loadu_ps(wr + kk), acc0);
        kk += 8;
      }
      float s = hsum(_mm256_add_ps(acc0, acc1));
      for (; kk < k; ++kk) {
        uint32_t bits = uint32_t(ar[kk]) << 16;
        float x;
        std::memcpy(&x, &bits, 4);
        s += x * wr[kk];
      }
      c[r * ldc + i] = s;
    }
  }
}

}  // namespace avx2
}  // namespace ktmoe
