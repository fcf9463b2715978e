// [NOTE] Symmetric int8 quantization of activations per (row, scale group), AVX2.
//
// For each row m and scale group of scale_group columns (kp: the whole row): scale =
// max|x| / 127 over its columns < k (1 if that is not > 0: an all-zero group, or
// a max so small the quotient underflows), q[c] = round-half-away-from-zero(x[c] /
// scale) clamped to [-127, 127] for c < k, 0 for k <= c < kp, and
// gsum[G] = Σ q over columns [G·group, (G+1)·group). The quotient is a true
// division (vdivps), like the scalar definition, so every ISA gives the same bytes.
// Rounding: t = x/scale, r = trunc(t); t − r is exact, and |t − r| >= 0.5 adds
// sign(t): exactly std::round. A group holding a NaN or Inf (vmaxps drops NaN, so
// an unordered compare finds it) gets scale = NaN and q = 0, as in the
// generic kernel: that token's output is non-finite. 32 columns per step: 4 x 8 int32 are narrowed with
// vpackssdw / vpacksswb and one cross-lane permute. Group sums use vpmaddubsw with
// ones (u8 1 · s8 q, pairs ≤ 254) then vpmaddwd with ones to int32.
#include <cmath>
#include <limits>

#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

inline __m256i round_half_away_epi32(__m256 t) {
  const __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 sign = _mm256_and_ps(t, _mm256_set1_ps(-0.0f));
  const __m256 frac_abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(t, r));
  const __m256 half = _mm256_cmp_ps(frac_abs, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_and_ps(half, _mm256_or_ps(sign, _mm256_set1_ps(1.0f)));
  const __m256i i = _mm256_cvttps_epi32(_mm256_add_ps(r, step));
  return _mm256_max_epi32(_mm256_min_epi32(i, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

// max|x| of x[0, k), or NaN when it holds a NaN or Inf.
float row_absmax(const float* x, int64_t k) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    const __m256 a = _mm256_loadu_ps(x + c), b = _mm256_loadu_ps(x + c + 8);
    m0 = _mm256_max_ps(_mm256_and_ps(abs_mask, a), m0);
    m1 = _mm256_max_ps(_mm256_and_ps(abs_mask, b), m1);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  float amax = hmax8(_mm256_max_ps(m0, m1));
  bool finite = _mm256_movemask_ps(nan) == 0;
  for (; c < k; ++c) {
    amax = std::max(amax, std::fabs(x[c]));
    finite &= !std::isnan(x[c]);
  }
  return finite && std::isfinite(amax) ? amax : std::numeric_limits<float>::quiet_NaN();
}

// q[c] for c < k (x/scale rounded), 0 for k <= c < kp.
void quantize_row(const float* x, int64_t k, int64_t kp, float scale, int8_t* q) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t c = 0;
  for (; c + 32 <= k; c += 32) {
    __m256i v[4];
    for (int i = 0; i < 4; ++i)
      v[i] = round_half_away_epi32(_mm256_div_ps(_mm256_loadu_ps(x + c + 8 * i), s));
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                         _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + c), _mm256_permutevar8x32_epi32(b, order));
  }
  for (; c < k; ++c) {
    const float t = x[c] / scale;
    const float r = std::round(t);
    q[c] = int8_t(std::isnan(t) ? -127 : std::min(127.0f, std::max(-127.0f, r)));
  }
  for (; c < kp; ++c) q[c] = 0;
}

int32_t sum_int8(const int8_t* q, int64_t n) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
  }
  int32_t sum = hsum8_epi32(acc);
  for (; c < n; ++c) sum += q[c];
  return sum;
}

}  // namespace

// x: fp32 [M, ldx] (k valid); q: s8 [M, ldq] (kp written); scale: [M, kp / scale_group];
// gsum: int32 [M, gsum_ld] (kp / group written).
void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t kp, int64_t group,
                   int64_t scale_group, int8_t* q, int64_t ldq, float* scale, int32_t* gsum, int64_t gsum_ld) {
  const int64_t nscales = kp / scale_group;
  for (int64_t r = 0; r < m; ++r) {
    int8_t* qr = q + r * ldq;
    for (int64_t S = 0; S < nscales; ++S) {
      const int64_t c0 = S * scale_group, left = k - c0;
      const int64_t valid = left <= 0 ? 0 : left < scale_group ? left : scale_group;  // columns < k
      const float amax = row_absmax(x + r * ldx + c0, valid);
      float& s = scale[r * nscales + S];
      if (std::isnan(amax)) {  // NaN/Inf in the group: its row's result must not come out finite
        s = amax;
        for (int64_t c = c0; c < c0 + scale_group; ++c) qr[c] = 0;  // a plain loop: no std:: template
        continue;                                                   // copies in ISA objects
      }
      s = amax / 127.0f;
      if (!(s > 0.0f)) s = 1.0f;
      quantize_row(x + r * ldx + c0, valid, scale_group, s, qr + c0);
    }
    for (int64_t G = 0; G < kp / group; ++G) gsum[r * gsum_ld + G] = sum_int8(qr + G * group, group);
  }
}

}  // namespace avx2
}  // namespace ktmoe
