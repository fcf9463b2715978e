// [NOTE] The generic tile loop of the bf16-activation formats whose weights are decoded
// to fp32 and scaled per (column, k-group): kFP8 and kINT4A. One template, one decoder per format
// (gemm_fp8_generic.cpp, gemm_int4_affine_generic.cpp).
//
// For rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1):
//   per block, per k-group g, per panel of at most kPanelK inputs inside the group, the
//   decoder writes the panel's weights (before scales) to an fp32 [kc][16] buffer once,
//   then each row adds it into its 16 group accumulators (panel_madd, k ascending; a bf16
//   times a decoded weight is exact in fp32). With Decoder::kRowSums, each row's
//   Σ_{k∈g} a[m][k] (k ascending, fp32) is summed beside it. At the group's end the
//   decoder's group_end adds the scaled group into the row's 16 outputs (c starts at +0).
// The order of every operation depends only on the column's block and the row, so any
// (b0, b1) split, M or thread gives the same bits.
//
// Decoder: kRowSums; panel(block, k0, kc, float* panel [kc][16]);
//   group_end(block, g, const float* acc [16], float xsum, float* c [16]).
#pragma once
#include <algorithm>
#include <vector>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/generic_kernels.h"
#include "kernels/int4_affine_format.h"

namespace ktmoe {
namespace generic {

// A panel of kINT4A's nibble layout: panel[c][j] = value(code of W[16*block + j][k0 + c])
// for c < kc (k0, kc multiples of 4); out: fp32 [kc][16].
template <class Value>
void nibble_panel(const uint8_t* data, int64_t kp, int64_t block, int64_t k0, int64_t kc, const Value& value,
                  float* out) {
  const uint8_t* quads = data + block * int4a_block_data_bytes(kp) + (k0 / 4) * 32;
  for (int64_t t = 0; t < kc / 4; ++t)
    for (int64_t j = 0; j < kBlockN; ++j)
      for (int64_t h = 0; h < 2; ++h) {  // byte 2j + h: k = 4t + h (low nibble), 4t + 2 + h (high)
        const uint8_t byte = quads[t * 32 + 2 * j + h];
        out[(4 * t + h) * kBlockN + j] = value(uint8_t(byte & 15));
        out[(4 * t + 2 + h) * kBlockN + j] = value(uint8_t(byte >> 4));
      }
}

// a: bf16 [m, lda] (lda >= kp, zero past k); c: fp32 [m, ldc], columns [0, 16*(b1-b0)).
template <class Decoder>
void gemm_decoded(const PackedMatrixHeader* w, const Decoder& dec, const uint16_t* a, int64_t lda, int64_t m,
                  int64_t b0, int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, group = w->group, ngroups = kp / group;
  alignas(64) float panel[kPanelK * kBlockN];
  alignas(64) float xf[kPanelK];
  std::vector<float> acc(static_cast<size_t>(m * kBlockN)), xsum(static_cast<size_t>(m));
  for (int64_t b = b0; b < b1; ++b) {
    float* cb = c + (b - b0) * kBlockN;
    for (int64_t r = 0; r < m; ++r) std::fill(cb + r * ldc, cb + r * ldc + kBlockN, 0.f);
    for (int64_t g = 0; g < ngroups; ++g) {
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(xsum.begin(), xsum.end(), 0.f);
      for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += kPanelK) {
        const int64_t kc = std::min(kPanelK, (g + 1) * group - k0);
        dec.panel(b, k0, kc, panel);
        for (int64_t r = 0; r < m; ++r) {
          const uint16_t* ar = a + r * lda + k0;
          for (int64_t i = 0; i < kc; ++i) xf[i] = bf16_to_f32(ar[i]);
          panel_madd(panel, xf, kc, &acc[size_t(r * kBlockN)]);
          if constexpr (Decoder::kRowSums)
            for (int64_t i = 0; i < kc; ++i) xsum[size_t(r)] += xf[i];
        }
      }
      for (int64_t r = 0; r < m; ++r) dec.group_end(b, g, &acc[size_t(r * kBlockN)], xsum[size_t(r)], cb + r * ldc);
    }
  }
}

}  // namespace generic
}  // namespace ktmoe
