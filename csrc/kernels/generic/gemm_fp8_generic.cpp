// [NOTE] Generic gemm_fp8 over packed kFP8 weights (portable C++17, the oracle).
//
// Computes, for rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1):
//     c[m*ldc + j] = Σ_G s[j,G] · Σ_{k∈G} a[m][k] · e4m3(W[16*b0 + j][k])
// How: per block, per k-group, per panel of at most kPanelK inputs inside the group,
// the panel's 32-byte k-pairs are decoded once to an fp32 [kc][16] buffer
// (e4m3_to_float: exact), then each row adds it into its 16 group accumulators
// (panel_madd, k ascending; a bf16 times an e4m3 value is exact in fp32). At the
// group's end each column's output gains s * acc (one multiply, one add). The
// order of every operation depends only on the column's block and row, so any
// (b0, b1) split, M or thread gives the same bits.
#include <algorithm>
#include <vector>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/generic_kernels.h"
#include "kernels/fp8_format.h"

namespace ktmoe {
namespace generic {
namespace {

// panel[c][j] = e4m3(W[j][k0 + c]) for c < kc; `pairs` points at k-pair k0/2 of a block.
void decode_fp8_panel(const uint8_t* pairs, int64_t kc, float* panel) {
  for (int64_t p = 0; p < kc / 2; ++p)
    for (int64_t j = 0; j < kBlockN; ++j) {
      panel[(2 * p) * kBlockN + j] = e4m3_to_float(pairs[p * 32 + 2 * j]);
      panel[(2 * p + 1) * kBlockN + j] = e4m3_to_float(pairs[p * 32 + 2 * j + 1]);
    }
}

}  // namespace

// w: kFP8 [np/16 blocks][kp/2][16][2] bytes + [np/16][kp/group][16] fp32 scales;
// a: bf16 [m, lda] (lda >= kp, zero past k); c: fp32 [m, ldc], columns [0, 16*(b1-b0)).
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, group = w->group, ngroups = kp / group;
  const uint8_t* data = packed_data(w);
  const uint8_t* scales = packed_scales(w);
  alignas(64) float panel[kPanelK * kBlockN];
  alignas(64) float xf[kPanelK];
  std::vector<float> acc(static_cast<size_t>(m * kBlockN));
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* block = data + b * fp8_block_data_bytes(kp);
    float* cb = c + (b - b0) * kBlockN;
    for (int64_t r = 0; r < m; ++r) std::fill(cb + r * ldc, cb + r * ldc + kBlockN, 0.f);
    for (int64_t g = 0; g < ngroups; ++g) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += kPanelK) {
        const int64_t kc = std::min(kPanelK, (g + 1) * group - k0);
        decode_fp8_panel(block + (k0 / 2) * 32, kc, panel);
        for (int64_t r = 0; r < m; ++r) {
          const uint16_t* ar = a + r * lda + k0;
          for (int64_t i = 0; i < kc; ++i) xf[i] = bf16_to_f32(ar[i]);
          panel_madd(panel, xf, kc, &acc[size_t(r * kBlockN)]);
        }
      }
      const float* s = reinterpret_cast<const float*>(scales + fp8_scale_offset(kp, group, b * kBlockN, g));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < kBlockN; ++j) cb[r * ldc + j] += s[j] * acc[size_t(r * kBlockN + j)];
    }
  }
}

}  // namespace generic
}  // namespace ktmoe
