// [NOTE] The gated activations h = act(gate) ⊙ up, AVX2 + FMA, 8 lanes at a time.
//
// gated_act: each row of gated_activation.h as the generic kernel writes it (silu(x) =
// x / (1 + exp(-x))); clamps are vminps / vmaxps with the data as 2nd operand, so NaN
// stays NaN. tanh (softcaps): Cephes' odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1)
// above, sign copied back; ~2 ulp.
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

inline __m256 silu8(__m256 g) {
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

inline __m256 clamp8(__m256 x, __m256 lim) {  // clamp(x, -lim, lim); NaN stays NaN
  return _mm256_min_ps(lim, _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), lim), x));
}

// tanh(x): Cephes tanhf's odd polynomial for |x| < 0.625, 1 - 2 / (exp(2|x|) + 1) above, x's sign copied back;
// NaN takes the polynomial (the comparison is unordered-true), so it stays NaN.
inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.f), one = _mm256_set1_ps(1.f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 e = exp8(_mm256_add_ps(ax, ax));
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, one)));
  const __m256 signed_big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
  return _mm256_blendv_ps(signed_big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_NGE_UQ));
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

// gate, up, h: [n] fp32; act: a row of gated_activation.h.
void gated_act(const Activation& act, const float* gate, const float* up, float* h, int64_t n) {
  const __m256 p0 = _mm256_set1_ps(act.p[0]), p1 = _mm256_set1_ps(act.p[1]), one = _mm256_set1_ps(1.f);
  switch (act.kind) {
    case GateActivation::kSilu:
      return gated_map(gate, up, h, n, [](__m256 g, __m256 u) { return _mm256_mul_ps(silu8(g), u); });
    case GateActivation::kSiluClamp:  // p0 = limit
      return gated_map(gate, up, h, n, [&](__m256 g, __m256 u) {
        return _mm256_mul_ps(silu8(_mm256_min_ps(p0, g)), clamp8(u, p0));
      });
    case GateActivation::kSiluClampAfter:  // p0 = limit
      return gated_map(gate, up, h, n, [&](__m256 g, __m256 u) {
        return _mm256_mul_ps(_mm256_min_ps(p0, silu8(g)), clamp8(u, p0));
      });
    case GateActivation::kSwigluOai:  // p0 = alpha, p1 = limit
      return gated_map(gate, up, h, n, [&](__m256 g, __m256 u) {
        g = _mm256_min_ps(p1, g);
        const __m256 den = _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), p0), g)));
        return _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_add_ps(clamp8(u, p1), one));
      });
    case GateActivation::kSwigluSoftcap:  // p0 = gate_softcap, p1 = up_softcap
      return gated_map(gate, up, h, n, [&](__m256 g, __m256 u) {
        const __m256 capped = _mm256_mul_ps(p0, tanh8(_mm256_div_ps(g, p0)));
        const __m256 a = _mm256_div_ps(capped, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        return _mm256_mul_ps(a, _mm256_mul_ps(p1, tanh8(_mm256_div_ps(u, p1))));
      });
  }
}

}  // namespace avx2
}  // namespace ktmoe
