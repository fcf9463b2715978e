// [NOTE] The loop shared by avx512's GGML code kernels (ggml_codes_avx512.h on fp32 activations,
// ggml_codes_int16_avx512.h on int16 ones): passes of up to 4 activation rows over all weight rows
// (decode, m <= 4: one pass, every weight byte read once; the pass's activations stay in L1), the weight
// rows NR at a time side by side (NR = 4, 2, 1 for 1, 2, 3-4 activation rows: NR streams in flight and
// R · NR independent accumulator chains), each block's codes built once per pass.
//
// A Rows<R, NR> policy holds one accumulator chain per (activation row r, weight row j) (so every output
// sees the same operation sequence whatever R and NR), is built from the call's activations (Acts) and the
// pass's first row, moves its block pointers by next_block(elems) and gives total(r, j), the vector whose
// lane sum is the output. The lane sums of four rows share one reduction tree (sums4), the same tree for
// each vector whatever its neighbours hold: output (r, i) depends only on rows r and i, for any split of n
// or m.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/avx512/ggml_codes_avx512.h"

namespace ktmoe {
namespace avx512 {
namespace ggml_rows {

// The lane sums of v[0 .. 3] in lanes 0 .. 3.
inline __m128 sums4(const __m512 (&v)[4]) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// c[r * ldc + j] = weight row j (w + j · row_bytes, nb blocks of T) . activation row r0 + r, r < R, j < NR.
// Each block of the NR rows is prefetched whole row groups on, at least kAhead bytes ahead. flatten: the
// blocks and the Rows policy inline here, so the accumulators stay in registers.
template <class T, template <int, int> class Rows, int R, int NR, class Acts>
__attribute__((flatten)) void rows_dot(const uint8_t* w, int64_t row_bytes, int64_t nb, const Acts& acts, int64_t r0,
                                       float* c, int64_t ldc) {
  Rows<R, NR> rows(acts, r0);
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
    for (int j = 0; j < NR; ++j) v[j] = rows.total(r, j);
    alignas(16) float out[4];
    _mm_store_ps(out, sums4(v));
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = out[j];
  }
}

// Weight rows [0, n) against activation rows [r0, r0 + R): NR at a time, then one at a time.
template <class T, template <int, int> class Rows, int R, int NR, class Acts>
void pass(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t nb, const Acts& acts, int64_t r0, float* c,
          int64_t ldc) {
  int64_t i = 0;
  for (; i + NR <= n; i += NR) rows_dot<T, Rows, R, NR>(w + i * row_bytes, row_bytes, nb, acts, r0, c + r0 * ldc + i, ldc);
  for (; i < n; ++i) rows_dot<T, Rows, R, 1>(w + i * row_bytes, row_bytes, nb, acts, r0, c + r0 * ldc + i, ldc);
}

// w: n rows of row_bytes (nb blocks of T each), m activation rows in acts; c[r * ldc + i].
template <class T, template <int, int> class Rows, class Acts>
void gemm_rows(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t nb, int64_t m, const Acts& acts, float* c,
               int64_t ldc) {
  for (int64_t r0 = 0; r0 < m; r0 += 4) switch (std::min<int64_t>(4, m - r0)) {
      case 1: pass<T, Rows, 1, 4>(w, row_bytes, n, nb, acts, r0, c, ldc); break;
      case 2: pass<T, Rows, 2, 2>(w, row_bytes, n, nb, acts, r0, c, ldc); break;
      case 3: pass<T, Rows, 3, 1>(w, row_bytes, n, nb, acts, r0, c, ldc); break;
      default: pass<T, Rows, 4, 1>(w, row_bytes, n, nb, acts, r0, c, ldc); break;
    }
}

}  // namespace ggml_rows
}  // namespace avx512
}  // namespace ktmoe
