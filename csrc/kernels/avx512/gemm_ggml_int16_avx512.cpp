// [NOTE] avx512 gemm_ggml_int16: a GGML matrix where it lies against int16 activations, the amx table's
// decode rows (below its tiles; ggml_codes_int16_avx512.h says why and how).
//
// q8_0, q4_K, q5_K, q6_K and iq4_xs run ggml_codes_int16_avx512.h's kernels: per call the activation rows
// become int16 per block of 32 (int16_activations.h), then passes of up to 4 rows over all weight rows
// (decode: one pass, every weight byte read once), each block's codes built once per pass. Other types go
// to avx512's gemm_ggml. Output (r, i) depends only on rows r and i: the same bits for any split of n or m.
#include <immintrin.h>

#include <algorithm>

#include "kernels/avx512/amx_entry_points.h"
#include "kernels/avx512/avx512_common.h"
#include "kernels/avx512/ggml_codes_int16_avx512.h"
#include "kernels/avx512/int16_activations.h"
#include "kernels/ggml/ggml_code_kernels.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();

namespace {

// c[r * ldc + j] = weight row j (w + j · row_bytes, nb blocks of T) . activation row r0 + r of q, r < R, j < NR
// (xs: q's scales back, 2^-s). The NR rows' blocks go side by side: NR streams in flight, NR · R independent
// chains. flatten: the blocks and Rows16 inline here, so the accumulators stay in registers.
template <class T, int R, int NR>
__attribute__((flatten)) void rows_dot(const uint8_t* w, int64_t row_bytes, int64_t nb, const QuantRows& q,
                                       const float* xs, int64_t r0, float* c, int64_t ldc) {
  ggml_int16::Rows16<R, NR> rows;
  for (int r = 0; r < R; ++r) {
    rows.x[r] = q.x + (r0 + r) * q.kp;
    rows.xs[r] = xs + (r0 + r) * q.nj;
    rows.xsum[r] = q.xsum + (r0 + r) * q.nj;
  }
  // prefetch the same block of the row whole groups of NR rows on, at least kAhead bytes ahead
  const int64_t group = NR * row_bytes, ahead = (ggml_codes::kAhead + group - 1) / group * group;
  for (int64_t b = 0; b < nb; ++b) {
    ggml_codes::unrolled<NR>([&](auto j) {
      const uint8_t* blk = w + j * row_bytes + b * T::kBytes;
      for (int off = 0; off < T::kBytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk + ahead + off), _MM_HINT_T1);
      T::template block<decltype(j)::value>(blk, rows);
    });
    rows.next_block(T::kElems);
  }
  for (int r = 0; r < R; ++r) {
    __m512 v[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int j = 0; j < NR; ++j) v[j] = _mm512_sub_ps(rows.acc[r][j], rows.corr[r][j]);
    alignas(16) float out[4];
    _mm_store_ps(out, ggml_int16::sums4(v));
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = out[j];
  }
}

// Weight rows [0, n) against activation rows [r0, r0 + R): NR at a time, then one at a time.
template <class T, int R, int NR>
void pass(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t nb, const QuantRows& q, const float* xs, int64_t r0,
          float* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + NR <= n; i += NR) rows_dot<T, R, NR>(w + i * row_bytes, row_bytes, nb, q, xs, r0, c + r0 * ldc + i, ldc);
  for (; i < n; ++i) rows_dot<T, R, 1>(w + i * row_bytes, row_bytes, nb, q, xs, r0, c + r0 * ldc + i, ldc);
}

// w: n rows of row_bytes (k / T::kElems blocks), a: bf16 rows [m, lda], c[r * ldc + i]. Passes of up to 4
// activation rows over all weight rows (decode: one pass, every weight byte read once), the weight rows 4, 2
// or 1 at a time for 1, 2 or 3-4 activation rows (16 / 8 / 12-16 chains).
template <class T>
void gemm_codes_int16(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      int64_t m, float* c, int64_t ldc) {
  static thread_local Scratch buf;
  const QuantRows q = quant_rows(buf, m, k);
  quantize(a, lda, m, q);
  // xs: x's scale back 2^-s = 2 · q.scale (q.scale is the nibble formats' 2^-(s + 1)), exact; NaN stays NaN
  float* xs = q.scale;
  for (int64_t i = 0; i < m * q.nj; ++i) xs[i] *= 2;
  const int64_t nb = k / T::kElems;
  for (int64_t r0 = 0; r0 < m; r0 += 4) switch (std::min<int64_t>(4, m - r0)) {
      case 1: pass<T, 1, 4>(w, row_bytes, n, nb, q, xs, r0, c, ldc); break;
      case 2: pass<T, 2, 2>(w, row_bytes, n, nb, q, xs, r0, c, ldc); break;
      case 3: pass<T, 3, 1>(w, row_bytes, n, nb, q, xs, r0, c, ldc); break;
      default: pass<T, 4, 1>(w, row_bytes, n, nb, q, xs, r0, c, ldc); break;
    }
}

}  // namespace

// w: n rows of row_bytes (k inputs of `type`); a: bf16 rows [m, lda]; c[r * ldc + i], r < m, i < n.
void gemm_ggml_int16(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                     const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  using namespace ggml_int16;
  ggml::with_code_kernel<Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS>(
      type.id, [&](auto t) { gemm_codes_int16<decltype(t)>(w, row_bytes, n, k, a, lda, m, c, ldc); },
      [&] { gemm_ggml(type, w, row_bytes, n, k, a, lda, m, c, ldc); });
}

}  // namespace avx512
}  // namespace ktmoe
