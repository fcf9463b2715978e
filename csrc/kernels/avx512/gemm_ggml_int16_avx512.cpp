// [NOTE] avx512 gemm_ggml_int16: a GGML matrix where it lies against int16 activations, the amx table's
// decode rows (below its tiles; ggml_codes_int16_avx512.h says why and how).
//
// q4_K, q5_K, q6_K (calls of 1-2 rows) and iq4_xs run ggml_codes_int16_avx512.h's kernels: per call the activation rows
// become int16 per block of 32 (int16_activations.h), then ggml_row_groups.h's passes over the weight rows.
// Other types go to avx512's gemm_ggml. Output (r, i) depends only on rows r and i: the same bits for any split of n or m.
#include <immintrin.h>

#include "kernels/avx512/amx_entry_points.h"
#include "kernels/avx512/avx512_common.h"
#include "kernels/avx512/ggml_codes_int16_avx512.h"
#include "kernels/avx512/ggml_row_groups.h"
#include "kernels/avx512/int16_activations.h"
#include "kernels/ggml/ggml_code_kernels.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();

namespace {

// w: n rows of row_bytes (k / T::kElems blocks), a: bf16 rows [m, lda], c[r * ldc + i].
template <class T>
void gemm_codes_int16(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      int64_t m, float* c, int64_t ldc) {
  static thread_local Scratch buf;
  const QuantRows q = quant_rows(buf, m, k);
  quantize(a, lda, m, q);
  // xs: x's scale back 2^-s = 2 · q.scale (q.scale is the nibble formats' 2^-(s + 1)), exact; NaN stays NaN
  float* xs = q.scale;
  for (int64_t i = 0; i < m * q.nj; ++i) xs[i] *= 2;
  int16_t* xp = nullptr;
  if constexpr (T::kPermuted) {
    static thread_local Scratch perm;
    xp = reinterpret_cast<int16_t*>(perm.at_least(size_t(m * k) * 2));
    for (int64_t r = 0; r < m; ++r) T::permute(q.x + r * k, xp + r * k, k);
  }
  ggml_rows::gemm_rows<T, ggml_int16::Rows16>(w, row_bytes, n, k / T::kElems, m, ggml_int16::Acts16{&q, xs, xp}, c,
                                              ldc);
}

}  // namespace

// w: n rows of row_bytes (k inputs of `type`); a: bf16 rows [m, lda]; c[r * ldc + i], r < m, i < n.
void gemm_ggml_int16(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                     const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  using namespace ggml_int16;
  ggml::with_code_kernel<Q4_K, Q5_K, Q6_K, IQ4_XS>(
      type.id,
      [&](auto t) {
        if (m <= decltype(t)::kMaxRows) gemm_codes_int16<decltype(t)>(w, row_bytes, n, k, a, lda, m, c, ldc);
        else gemm_ggml(type, w, row_bytes, n, k, a, lda, m, c, ldc);
      },
      [&] { gemm_ggml(type, w, row_bytes, n, k, a, lda, m, c, ldc); });
}

}  // namespace avx512
}  // namespace ktmoe
