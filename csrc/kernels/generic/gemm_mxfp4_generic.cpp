// [NOTE] Generic gemm_mxfp4 over packed kMXFP4 weights (portable C++17, the oracle of the integer kernels).
//
// Computes, for rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1), mxfp4_format.h's value
// by its integer evaluation (the avx2 kernel gives the same bits):
//   per row, per block j of 32 inputs: x = the int16 activations (round_half_even(a · 2^s_j)), scale
//   t_j = 2^-(s_j + 1) (NaN for a block holding Inf / NaN);
//   per column n: d = Σ_{k∈j} x[k] · 2e2m1(q[n][k]) in int32 (exact), then
//   c[n] = (j == 0 ? +0 : c[n]) + (float(d) · t_j) · 2^(e[n, G(j)] - 127), j ascending.
// Each product is a separate statement, so nothing is contracted into an FMA.
#include <cmath>
#include <vector>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/generic_kernels.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace generic {
namespace {

// 2·e2m1(code): the integer weights of the dot.
constexpr int32_t kTwiceE2m1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// One row's 32 bf16 inputs -> x[32] (int16 values) and the block's scale t.
float quantize_block(const uint16_t* a, int32_t* x) {
  uint32_t max_bits = 0;
  for (int i = 0; i < kMxfp4Group; ++i) max_bits = std::max(max_bits, f32_bits(bf16_to_f32(a[i])) & 0x7FFFFFFFu);
  const int s = mxfp4_block_shift(max_bits);
  const float f = s == kMxfp4NonFinite ? 0.f : mxfp4_pow2(s);
  for (int i = 0; i < kMxfp4Group; ++i) {
    const float v = s == kMxfp4NonFinite ? 0.f : bf16_to_f32(a[i]) * f;
    x[i] = int32_t(std::nearbyint(v));
  }
  return mxfp4_block_scale(s);
}

}  // namespace

// w: kMXFP4 [np/16 blocks][kp/4][32] nibble bytes + [np/16][kp/group][16] E8M0 bytes;
// a: bf16 [m, lda] (lda >= kp, zero past k); c: fp32 [m, ldc], columns [0, 16*(b1-b0)).
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  const int64_t kp = w->kp, group = w->group, nj = kp / kMxfp4Group;
  const uint8_t* data = packed_data(w);
  const uint8_t* scales = packed_scales(w);
  std::vector<int32_t> x(static_cast<size_t>(kp));
  std::vector<float> t(static_cast<size_t>(nj));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < nj; ++j) t[size_t(j)] = quantize_block(a + r * lda + j * kMxfp4Group, &x[size_t(j * kMxfp4Group)]);
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* quads = data + b * int4a_block_data_bytes(kp);
      float* cb = c + r * ldc + (b - b0) * kBlockN;
      for (int64_t j = 0; j < nj; ++j) {
        int32_t d[kBlockN] = {};
        for (int64_t q = j * 8; q < (j + 1) * 8; ++q)  // the block's 8 k-quads
          for (int64_t n = 0; n < kBlockN; ++n)
            for (int64_t h = 0; h < 2; ++h) {  // byte 2n + h: k = 4q + h (low nibble), 4q + 2 + h (high)
              const uint8_t byte = quads[q * 32 + 2 * n + h];
              d[n] += x[size_t(4 * q + h)] * kTwiceE2m1[byte & 15] + x[size_t(4 * q + 2 + h)] * kTwiceE2m1[byte >> 4];
            }
        const uint8_t* e = scales + mxfp4_scale_offset(kp, group, b * kBlockN, j * kMxfp4Group / group);
        for (int64_t n = 0; n < kBlockN; ++n) {
          const float scaled = float(d[n]) * t[size_t(j)];
          const float term = scaled * e8m0_to_float(e[n]);
          cb[n] = (j == 0 ? 0.f : cb[n]) + term;
        }
      }
    }
  }
}

}  // namespace generic
}  // namespace ktmoe
