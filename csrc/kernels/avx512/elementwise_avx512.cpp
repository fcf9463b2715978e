// [NOTE] avx512 element-wise kernels of the MoE driver, 16 fp32 lanes at a time
// with masked tails (no scalar loops, no reads past n / k):
//   gated_act:     each row of gated_activation.h as the generic kernel writes it, with a
//                  vector exp (Cody-Waite reduction by ln2, degree-6 minimax
//                  polynomial, 2^n applied with vscalefps so overflow gives +inf and
//                  underflow 0 / denormals, never NaN): ~1-2 ulp, so h is within
//                  ~1e-6 relative of the libm expression; gate = -inf or NaN gives NaN
//                  as the expression does. Clamps are vminps / vmaxps with the data as
//                  2nd operand (NaN stays NaN). tanh (softcaps): Cephes' odd polynomial
//                  below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above, sign copied back;
//                  ~2 ulp.
//   quantize_rows: per (row, scale group; the whole row when scale_group = kp):
//                  scale = max|x| / 127 (1 for an all-zero group or one whose scale
//                  underflows to 0), q = round half away from zero of (x / scale),
//                  clamped to [-127, 127] -- a true IEEE division, as the spec
//                  writes it, not x * (1/scale), so the int8 values match a scalar
//                  std::round(x / scale) bit for bit; a group holding a NaN or Inf
//                  gets scale = NaN, q = 0 (as the generic kernel); rounding is done exactly as
//                  std::round: t = trunc(v), t += sign(v) where |v - t| >= 0.5
//                  (v - t is exact). Group sums of q are exact int32.
//   to_bf16:       round to nearest even on the integer bits (vcvtneps2bf16 would
//                  flush denormals), NaN -> quiet NaN with sign and top payload kept.
//   f16_to_f32 / f32_to_f16: vcvtph2ps (exact) / vcvtps2ph with round to nearest
//                  even (overflow -> inf, denormals kept, NaN quiet), the rules of
//                  the generic f16_scalar.h, for the activations of fp16 models.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/avx512/avx512_common.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

// exp(x) for every float x: +inf above ~88.7, 0 below ~-103.9, NaN for NaN.
inline __m512 exp_ps(__m512 x) {
  // Clamp keeps n finite and small; vmaxps/vminps return the 2nd operand (x)
  // when it is NaN, so NaN propagates.
  x = _mm512_max_ps(_mm512_set1_ps(-150.f), x);
  x = _mm512_min_ps(_mm512_set1_ps(150.f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  // e^r = 1 + r + r^2 * P(r), |r| <= ln2/2 (Cephes expf coefficients).
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// std::round semantics: half away from zero.
inline __m512 round_half_away(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  // sign(v) * 1.0: copy v's sign bit onto 1.0
  const __m512 one = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.f)), _mm512_set1_ps(1.f));
  return _mm512_mask_add_ps(t, up, t, one);
}

}  // namespace

namespace {

// tanh(x): Cephes tanhf's odd polynomial for |x| < 0.625, 1 - 2 / (exp(2|x|) + 1) above (+1 once exp
// overflows), x's sign copied back; NaN takes the polynomial (unordered compare), so it stays NaN.
inline __m512 tanh_ps(__m512 x) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  const __m512 ax = _mm512_andnot_ps(sign, x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp_ps(_mm512_add_ps(ax, ax));
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, one)));
  const __m512 signed_big = _mm512_or_ps(big, _mm512_and_ps(x, sign));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_NGE_UQ), signed_big, small);
}

inline __m512 silu_ps(__m512 g) {
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

inline __m512 clamp_ps(__m512 x, __m512 lim) {  // clamp(x, -lim, lim); NaN stays NaN
  return _mm512_min_ps(lim, _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), lim), x));
}

// h[i] = f(gate[i], up[i]) for i < n, 16 lanes at a time, masked tail.
template <class F>
inline void gated_map(const float* gate, const float* up, float* h, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = first_lanes(n - i);
    _mm512_mask_storeu_ps(h + i, mk, f(_mm512_maskz_loadu_ps(mk, gate + i), _mm512_maskz_loadu_ps(mk, up + i)));
  }
}

}  // namespace

// gate, up, h: [n] fp32; act: a row of gated_activation.h.
void gated_act(const Activation& act, const float* gate, const float* up, float* h, int64_t n) {
  const __m512 p0 = _mm512_set1_ps(act.p[0]), p1 = _mm512_set1_ps(act.p[1]), one = _mm512_set1_ps(1.f);
  switch (act.kind) {
    case GateActivation::kSilu:
      return gated_map(gate, up, h, n, [](__m512 g, __m512 u) { return _mm512_mul_ps(silu_ps(g), u); });
    case GateActivation::kSiluClamp:  // p0 = limit
      return gated_map(gate, up, h, n, [&](__m512 g, __m512 u) {
        return _mm512_mul_ps(silu_ps(_mm512_min_ps(p0, g)), clamp_ps(u, p0));
      });
    case GateActivation::kSiluClampAfter:  // p0 = limit
      return gated_map(gate, up, h, n, [&](__m512 g, __m512 u) {
        return _mm512_mul_ps(_mm512_min_ps(p0, silu_ps(g)), clamp_ps(u, p0));
      });
    case GateActivation::kSwigluOai:  // p0 = alpha, p1 = limit
      return gated_map(gate, up, h, n, [&](__m512 g, __m512 u) {
        g = _mm512_min_ps(p1, g);
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), p0), g))));
        return _mm512_mul_ps(s, _mm512_add_ps(clamp_ps(u, p1), one));
      });
    case GateActivation::kSwigluSoftcap:  // p0 = gate_softcap, p1 = up_softcap
      return gated_map(gate, up, h, n, [&](__m512 g, __m512 u) {
        const __m512 capped = _mm512_mul_ps(p0, tanh_ps(_mm512_div_ps(g, p0)));
        const __m512 a = _mm512_div_ps(capped, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        return _mm512_mul_ps(a, _mm512_mul_ps(p1, tanh_ps(_mm512_div_ps(u, p1))));
      });
  }
}

// x [m, ldx] (k valid) -> q [m, ldq] (kp written, zero past k), scale [m, kp / scale_group],
// gsum [m, gsum_ld] (kp / group sums). group and scale_group are multiples of 16 dividing kp.
void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t kp, int64_t group,
                   int64_t scale_group, int8_t* q, int64_t ldq, float* scale, int32_t* gsum, int64_t gsum_ld) {
  const int64_t nscales = kp / scale_group;
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * ldx;
    float* sr = scale + r * nscales;
    for (int64_t S = 0; S < nscales; ++S) {
      __m512 amax = _mm512_setzero_ps();
      __mmask16 nan = 0;
      for (int64_t c = S * scale_group; c < (S + 1) * scale_group && c < k; c += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(k - c), xr + c);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      }
      const float mx = _mm512_reduce_max_ps(amax);
      float s = mx / 127.f;
      if (!(s > 0.f)) s = 1.f;  // all-zero group, or max|x| so small that s underflows
      // NaN/Inf in the group: its row's result must not come out finite
      sr[S] = nan || !std::isfinite(mx) ? std::numeric_limits<float>::quiet_NaN() : s;
    }
    int8_t* qr = q + r * ldq;
    int32_t* gr = gsum + r * gsum_ld;
    __m512i gacc = _mm512_setzero_si512();
    for (int64_t c = 0; c < kp; c += 16) {
      const float s = sr[c / scale_group];
      const __mmask16 mk = c < k && !std::isnan(s) ? first_lanes(k - c) : 0;  // a NaN group: q = 0
      const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mk, xr + c), _mm512_set1_ps(s));
      __m512i qi = _mm512_maskz_cvtps_epi32(mk, round_half_away(v));  // integral: exact
      qi = _mm512_max_epi32(_mm512_min_epi32(qi, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + c), _mm512_cvtsepi32_epi8(qi));
      gacc = _mm512_add_epi32(gacc, qi);
      if ((c + 16) % group == 0) {
        gr[(c + 16) / group - 1] = _mm512_reduce_add_epi32(gacc);
        gacc = _mm512_setzero_si512();
      }
    }
  }
}

// y[i] = bf16(x[i]), round to nearest even, NaN stays NaN; i < n.
void to_bf16(const float* x, uint16_t* y, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i inf = _mm512_set1_epi32(0x7F800000);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = first_lanes(n - i);
    const __m512i b = _mm512_maskz_loadu_epi32(mk, x + i);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
    const __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(b, bias), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs_mask), inf);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    const __m512i r = _mm512_mask_mov_epi32(rne, nan, quiet);
    _mm256_mask_storeu_epi16(y + i, mk, _mm512_cvtepi32_epi16(r));
  }
}

// y[i] = fp32(x[i]) (x fp16 bits), i < n.
void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = first_lanes(n - i);
    _mm512_mask_storeu_ps(y + i, mk, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, x + i)));
  }
}

// y[i] = fp16(x[i]), round to nearest even, i < n.
void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = first_lanes(n - i);
    _mm256_mask_storeu_epi16(y + i, mk, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mk, x + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

}  // namespace avx512
}  // namespace ktmoe
