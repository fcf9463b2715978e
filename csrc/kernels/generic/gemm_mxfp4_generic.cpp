// [NOTE] Generic gemm_mxfp4 over packed kMXFP4 weights (portable C++17, the oracle).
//
// Computes, for rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1):
//     c[m*ldc + j] = Σ_G 2^(e[j,G] - 127) · Σ_{k∈G} a[m][k] · e2m1(q[16*b0 + j][k])
// by gemm_decoded (gemm_decoded_generic.h): each panel's nibbles are decoded once to their
// fp32 e2m1 values (nibble_panel, exact); a bf16 times one is exact in fp32, so each group's
// sum is the k-ordered fp32 sum; at a group's end each column's output gains s * acc (the
// product of a power of two: exact unless it leaves fp32's normal range), then one add.
#include "kernels/generic/gemm_decoded_generic.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace generic {
namespace {

struct Mxfp4PanelDecoder {
  static constexpr bool kRowSums = false;
  const uint8_t* data;
  const uint8_t* scales;
  int64_t kp, group;
  // panel[c][j] = e2m1(W[16*block + j][k0 + c]) for c < kc (k0, kc multiples of 4).
  void panel(int64_t block, int64_t k0, int64_t kc, float* out) const {
    nibble_panel(data, kp, block, k0, kc, e2m1_to_float, out);
  }
  void group_end(int64_t block, int64_t g, const float* acc, float, float* c) const {
    const uint8_t* e = scales + mxfp4_scale_offset(kp, group, block * kBlockN, g);
    for (int64_t j = 0; j < kBlockN; ++j) c[j] += e8m0_to_float(e[j]) * acc[j];
  }
};

}  // namespace

// w: kMXFP4 [np/16 blocks][kp/4][32] nibble bytes + [np/16][kp/group][16] E8M0 bytes;
// a: bf16 [m, lda] (lda >= kp, zero past k); c: fp32 [m, ldc], columns [0, 16*(b1-b0)).
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  const Mxfp4PanelDecoder dec{packed_data(w), packed_scales(w), w->kp, w->group};
  gemm_decoded(w, dec, a, lda, m, b0, b1, c, ldc);
}

}  // namespace generic
}  // namespace ktmoe
