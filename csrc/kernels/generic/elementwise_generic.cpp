// [NOTE] Generic element-wise kernels (portable C++17, the oracle):
//   gated_act      h = act(gate, up), fp32, each row of gated_activation.h written as its
//                  formula with libm's exp and tanh (silu(x) = x / (1 + exp(-x))); the
//                  comparisons of the clamps are written so that NaN stays NaN, as torch.clamp.
//   quantize_rows  per (row, scale group of columns; one per row when scale_group = kp):
//                  scale = max|x| / 127 (1 if the group is all zero), q =
//                  round-half-away-from-zero(x / scale) in [-127, 127], zero padding
//                  to kp, and the int32 sums of q per group of columns. A group holding
//                  a NaN or Inf gets scale = NaN, q = 0, so that token's output is
//                  non-finite as in bf16 (every ISA alike).
//   to_bf16        fp32 -> bf16, round-to-nearest-even, NaN stays (quiet) NaN.
//   f16_to_f32     fp16 -> fp32 (exact), f32_to_f16 fp32 -> fp16 (RNE): the
//                  activation prep and output of fp16 models (f16_scalar.h).
// Round-half-away is done as trunc + exact fraction test (v - trunc(v) is exact
// in fp32), which is the same as std::round but vectorizes with SSE2.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/f16_scalar.h"
#include "kernels/generic/generic_kernels.h"

namespace ktmoe {
namespace generic {

namespace {

inline float min_keep_nan(float x, float hi) { return x > hi ? hi : x; }
inline float clamp_keep_nan(float x, float lim) { return x > lim ? lim : x < -lim ? -lim : x; }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

// h[i] = f(gate[i], up[i]), i < n.
template <class F>
void gated_map(const float* gate, const float* up, float* h, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; ++i) h[i] = f(gate[i], up[i]);
}

}  // namespace

// gate, up, h: [n] fp32.
void gated_act(const Activation& act, const float* gate, const float* up, float* h, int64_t n) {
  const float p0 = act.p[0], p1 = act.p[1];
  switch (act.kind) {
    case GateActivation::kSilu:
      return gated_map(gate, up, h, n, [](float g, float u) { return silu(g) * u; });
    case GateActivation::kSiluClamp:  // p0 = limit
      return gated_map(gate, up, h, n,
                       [=](float g, float u) { return silu(min_keep_nan(g, p0)) * clamp_keep_nan(u, p0); });
    case GateActivation::kSiluClampAfter:  // p0 = limit
      return gated_map(gate, up, h, n,
                       [=](float g, float u) { return min_keep_nan(silu(g), p0) * clamp_keep_nan(u, p0); });
    case GateActivation::kSwigluOai:  // p0 = alpha, p1 = limit
      return gated_map(gate, up, h, n, [=](float g, float u) {
        g = min_keep_nan(g, p1);
        return g / (1.f + std::exp(-p0 * g)) * (clamp_keep_nan(u, p1) + 1.f);
      });
    case GateActivation::kSwigluSoftcap:  // p0 = gate_softcap, p1 = up_softcap
      return gated_map(gate, up, h, n, [=](float g, float u) {
        return p0 * std::tanh(g / p0) / (1.f + std::exp(-g)) * (p1 * std::tanh(u / p1));
      });
  }
}

// x: fp32 [m, ldx] (k valid columns); q: int8 [m, ldq] (kp written); scale: [m, kp / scale_group];
// gsum: int32 [m, gsum_ld] (kp / group written).
void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t kp, int64_t group,
                   int64_t scale_group, int8_t* q, int64_t ldq, float* scale, int32_t* gsum, int64_t gsum_ld) {
  const int64_t nscales = kp / scale_group;
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * ldx;
    int8_t* qr = q + r * ldq;
    for (int64_t S = 0; S < nscales; ++S) {
      const int64_t c0 = S * scale_group, c1 = std::min(k, c0 + scale_group);
      float amax = 0.f;
      bool finite = true;
      for (int64_t c = c0; c < c1; ++c) {
        amax = std::max(amax, std::fabs(xr[c]));
        finite &= std::isfinite(xr[c]);
      }
      float& s = scale[r * nscales + S];
      std::fill(qr + c0, qr + c0 + scale_group, int8_t{0});  // padding (and a non-finite group) stay 0
      if (!finite) {  // NaN/Inf: the row's result must not come out finite
        s = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      s = amax / 127.f;
      if (!(s > 0.f)) s = 1.f;  // all-zero group (or max|x| so small that s underflows)
      for (int64_t c = c0; c < c1; ++c) {
        const float v = xr[c] / s;
        int32_t i = static_cast<int32_t>(v);  // trunc
        const float frac = v - static_cast<float>(i);
        i += static_cast<int32_t>(frac >= 0.5f) - static_cast<int32_t>(frac <= -0.5f);
        qr[c] = static_cast<int8_t>(std::min(127, std::max(-127, i)));
      }
    }
    for (int64_t G = 0; G < kp / group; ++G) {
      int32_t sum = 0;
      for (int64_t c = G * group; c < (G + 1) * group; ++c) sum += qr[c];
      gsum[r * gsum_ld + G] = sum;
    }
  }
}

// x: fp32 [n]; y: bf16 [n].
void to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16_rne(x[i]);
}

// x: fp16 [n]; y: fp32 [n].
void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ktmoe::f16_to_f32(x[i]);
}

// x: fp32 [n]; y: fp16 [n].
void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16_rne(x[i]);
}

}  // namespace generic
}  // namespace ktmoe
