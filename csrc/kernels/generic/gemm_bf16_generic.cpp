// [NOTE] Generic bf16 gemm over packed kBF16 weights (portable C++17, the oracle).
//
// Computes, for rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1):
//     c[m*ldc + j] = Σ_{k < kp} a[m][k] · W[16*b0 + j][k]      (fp32 accumulation)
// How: for each block, walk K in panels of kPanelK. A panel's bf16 k-pairs are
// widened once to an fp32 [kPanelK][16] buffer (bf16 -> fp32 is a 16-bit shift:
// the even k of a pair is the low half of the 32-bit word, the odd k the high
// half), then every row multiplies it into its 16 accumulators, which live in
// the output row itself between panels. Products of two bf16 are exact in fp32;
// the sum runs over k in increasing order, so a column's value depends only on
// its block and row: any (b0, b1) split or thread gives the same bits.
#include <algorithm>
#include <cstring>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/generic_kernels.h"

namespace ktmoe {
namespace generic {
namespace {

// panel[c][j] = W[j][k0 + c] for c < kc; `pairs` points at k-pair k0/2 of a block.
void decode_bf16_panel(const uint8_t* pairs, int64_t kc, float* panel) {
  uint32_t v[kBlockN];  // column j's two bf16: even k in the low half, odd k in the high half
  for (int64_t p = 0; p < kc / 2; ++p) {
    std::memcpy(v, pairs + p * 64, sizeof(v));
    float* even = panel + (2 * p) * kBlockN;
    float* odd = even + kBlockN;
    for (int64_t j = 0; j < kBlockN; ++j) even[j] = f32_from_bits(v[j] << 16);
    for (int64_t j = 0; j < kBlockN; ++j) odd[j] = f32_from_bits(v[j] & 0xFFFF0000u);
  }
}

}  // namespace

// w: kBF16 [np/16 blocks][kp/2][16][2]; a: bf16 [m, lda] (lda >= kp, zero past k);
// c: fp32 [m, ldc], columns [0, 16*(b1-b0)) written.
void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp;
  const uint8_t* data = packed_data(w);
  alignas(64) float panel[kPanelK * kBlockN];
  alignas(64) float xf[kPanelK];
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* block = data + b * block_data_bytes(WeightFormat::kBF16, kp);
    float* cb = c + (b - b0) * kBlockN;
    for (int64_t r = 0; r < m; ++r) std::fill(cb + r * ldc, cb + r * ldc + kBlockN, 0.f);
    for (int64_t k0 = 0; k0 < kp; k0 += kPanelK) {
      const int64_t kc = std::min(kPanelK, kp - k0);
      decode_bf16_panel(block + (k0 / 2) * 64, kc, panel);
      for (int64_t r = 0; r < m; ++r) {
        const uint16_t* ar = a + r * lda + k0;
        for (int64_t i = 0; i < kc; ++i) xf[i] = bf16_to_f32(ar[i]);
        panel_madd(panel, xf, kc, cb + r * ldc);
      }
    }
  }
}

}  // namespace generic
}  // namespace ktmoe
