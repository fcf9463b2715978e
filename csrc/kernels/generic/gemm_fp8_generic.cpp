// [NOTE] Generic gemm_fp8 over packed kFP8 weights (portable C++17, the oracle).
//
// Computes, for rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1):
//     c[m*ldc + j] = Σ_G s[j,G] · Σ_{k∈G} a[m][k] · e4m3(W[16*b0 + j][k])
// by gemm_decoded (gemm_decoded_generic.h): each panel's 32-byte k-pairs are decoded
// once to fp32 (e4m3_to_float: exact); at a group's end each column's output gains
// s * acc (one multiply, one add).
#include "kernels/fp8_format.h"
#include "kernels/generic/gemm_decoded_generic.h"

namespace ktmoe {
namespace generic {
namespace {

struct Fp8PanelDecoder {
  static constexpr bool kRowSums = false;
  const uint8_t* data;
  const uint8_t* scales;
  int64_t kp, group;
  // panel[c][j] = e4m3(W[16*block + j][k0 + c]) for c < kc.
  void panel(int64_t block, int64_t k0, int64_t kc, float* out) const {
    const uint8_t* pairs = data + block * fp8_block_data_bytes(kp) + (k0 / 2) * 32;
    for (int64_t p = 0; p < kc / 2; ++p)
      for (int64_t j = 0; j < kBlockN; ++j) {
        out[(2 * p) * kBlockN + j] = e4m3_to_float(pairs[p * 32 + 2 * j]);
        out[(2 * p + 1) * kBlockN + j] = e4m3_to_float(pairs[p * 32 + 2 * j + 1]);
      }
  }
  void group_end(int64_t block, int64_t g, const float* acc, float, float* c) const {
    const float* s = reinterpret_cast<const float*>(scales + fp8_scale_offset(kp, group, block * kBlockN, g));
    for (int64_t j = 0; j < kBlockN; ++j) c[j] += s[j] * acc[j];
  }
};

}  // namespace

// w: kFP8 [np/16 blocks][kp/2][16][2] bytes + [np/16][kp/group][16] fp32 scales;
// a: bf16 [m, lda] (lda >= kp, zero past k); c: fp32 [m, ldc], columns [0, 16*(b1-b0)).
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  const Fp8PanelDecoder dec{packed_data(w), packed_scales(w), w->kp, w->group};
  gemm_decoded(w, dec, a, lda, m, b0, b1, c, ldc);
}

}  // namespace generic
}  // namespace ktmoe
