// [NOTE] The gated activations h = act(gate) ⊙ up, AVX2 + FMA, 8 lanes at a time.
//
// silu_mul:   h[i] = gate[i] / (1 + exp(-gate[i])) * up[i].
// swiglu_oai: g = min(gate[i], limit), u = clamp(up[i], -limit, limit) (vminps /
//             vmaxps with the data as 2nd operand, so NaN stays NaN),
//             h[i] = g / (1 + exp(-alpha g)) * (u + 1)  (gpt-oss).
// exp is the Cephes single-precision
// scheme: n = round(x·log2 e), r = x − n·ln2 (ln2 split in two constants so the
// reduction is exact enough), exp(r) by a degree-5 polynomial, then scaled by 2^n
// built in the exponent field. Relative error about 2 ulp over the clamped range
// [-87.3, 88.37]; beyond it exp returns 0 / +inf (so silu → gate·up or −0 like
// the scalar formula). The division is a true division (no rcp approximation).
// The scalar tail runs the same vector code on a zero-padded copy.
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), over);
  return _mm256_andnot_ps(under, y);
}

inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
  return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}

inline __m256 swiglu_oai8(__m256 g, __m256 u, __m256 alpha, __m256 limit) {
  const __m256 one = _mm256_set1_ps(1.0f);
  g = _mm256_min_ps(limit, g);
  u = _mm256_min_ps(limit, _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), limit), u));
  const __m256 den = _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), alpha), g)));
  return _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_add_ps(u, one));
}

// h[i] = f(gate[i], up[i]) for i < n, 8 lanes at a time; the tail runs f on a zero-padded copy.
template <class F>
inline void gated_map(const float* gate, const float* up, float* h, int64_t n, const F& f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(h + i, f(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    std::memcpy(g, gate + i, size_t(n - i) * 4);
    std::memcpy(u, up + i, size_t(n - i) * 4);
    _mm256_store_ps(o, f(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::memcpy(h + i, o, size_t(n - i) * 4);
  }
}

}  // namespace

// gate, up, h: [n] fp32.
void silu_mul(const float* gate, const float* up, float* h, int64_t n) {
  gated_map(gate, up, h, n, silu_mul8);
}

// gate, up, h: [n] fp32.
void swiglu_oai(const float* gate, const float* up, float* h, int64_t n, float alpha, float limit) {
  const __m256 a = _mm256_set1_ps(alpha), l = _mm256_set1_ps(limit);
  gated_map(gate, up, h, n, [&](__m256 g, __m256 u) { return swiglu_oai8(g, u, a, l); });
}

}  // namespace avx2
}  // namespace ktmoe
