// [NOTE] avx512 gemm_ggml: a GGML matrix where it lies (isa_kernels.h's contract).
//
// q8_0, q4_K, q5_K, q6_K and iq4_xs (the types of Q8_0, Q4_K_M, Q5_K_M, IQ4_XS) run code kernels
// (ggml_codes_avx512.h: the codes widened to exact fp32 lanes in registers, the group scales applied
// per group, the mins against the call's group sums); per call the activation rows are widened to
// fp32 once, and for types with mins each 32-group's Σ x is summed (fp32, in a fixed order); then
// ggml_row_groups.h's passes over the weight rows. Other types decode
// each weight row exactly (the type's decoder, kernels/ggml/ggml_decode.cpp) into an fp32 row and dot
// it with every activation row. Output (r, i) depends only on rows r and i: the same bits for any
// split of n or m.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/avx512/avx512_common.h"
#include "kernels/avx512/ggml_codes_avx512.h"
#include "kernels/avx512/ggml_row_groups.h"
#include "kernels/ggml/ggml_code_kernels.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

using namespace ggml_codes;

// Per-thread scratch: fp32 activation rows, their group sums.
struct CallScratch {
  Scratch x, gsum;
};
thread_local CallScratch tl;

// w: n rows of row_bytes (k / T::kElems blocks), a: bf16 rows [m, lda], c[r * ldc + i].
template <class T>
void gemm_codes(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const uint16_t* a, int64_t lda, int64_t m,
                float* c, int64_t ldc) {
  const int64_t nb = k / T::kElems, ldg = nb * T::kGsum;
  float* x = reinterpret_cast<float*>(tl.x.at_least(size_t(m * k) * 4));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t kk = 0; kk < k; kk += 16) _mm512_storeu_ps(x + r * k + kk, bf16x16_to_f32(a + r * lda + kk));
  float* gs = nullptr;
  if (T::kGsum) {  // Σ x of each 32-group j, at lanes 2j and 2j + 1 of the block's 16
    gs = reinterpret_cast<float*>(tl.gsum.at_least(size_t(m * ldg) * 4));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t g = 0; g < k / 32; ++g) {
        const float* xg = x + r * k + 32 * g;
        const float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xg), _mm512_loadu_ps(xg + 16)));
        gs[r * ldg + 2 * g] = gs[r * ldg + 2 * g + 1] = s;
      }
  }
  ggml_rows::gemm_rows<T, Rows>(w, row_bytes, n, nb, m, Acts32{x, k, gs, ldg}, c, ldc);
}

// Any decodable type: each weight row decoded exactly into an fp32 row, dotted with every activation row
// (16 lanes, two accumulators over k, a masked tail for plain types whose k is no multiple of 16).
void gemm_decoded_rows(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                       const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  thread_local std::vector<float> row;
  row.resize(size_t(k));
  const int64_t k32 = k / 32 * 32, k16 = k / 16 * 16;
  const __mmask16 tail = first_lanes(k - k16);
  for (int64_t i = 0; i < n; ++i) {
    type.decode(w + i * row_bytes, k / type.block_elems, row.data());
    const float* wr = row.data();
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t* ar = a + r * lda;
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      int64_t kk = 0;
      for (; kk < k32; kk += 32) {
        acc0 = _mm512_fmadd_ps(bf16x16_to_f32(ar + kk), _mm512_loadu_ps(wr + kk), acc0);
        acc1 = _mm512_fmadd_ps(bf16x16_to_f32(ar + kk + 16), _mm512_loadu_ps(wr + kk + 16), acc1);
      }
      if (kk < k16) {
        acc0 = _mm512_fmadd_ps(bf16x16_to_f32(ar + kk), _mm512_loadu_ps(wr + kk), acc0);
        kk += 16;
      }
      if (tail) {
        const __m256i h = _mm256_maskz_loadu_epi16(tail, ar + kk);
        const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        acc1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, wr + kk), acc1);
      }
      c[r * ldc + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    }
  }
}

}  // namespace

void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  ggml::with_code_kernel<Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS>(
      type.id, [&](auto t) { gemm_codes<decltype(t)>(w, row_bytes, n, k, a, lda, m, c, ldc); },
      [&] { gemm_decoded_rows(type, w, row_bytes, n, k, a, lda, m, c, ldc); });
}

}  // namespace avx512
}  // namespace ktmoe
