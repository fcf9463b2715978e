// Internal: the generic (portable C++17) micro-kernels that kernels_generic.cpp
// puts in the generic IsaKernels table, and the decoded-panel helpers the two
// gemm files share. See isa_kernels.h for the contract of each entry.
#pragma once
#include <cstdint>

#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace generic {

// k values per decoded panel: a panel is kPanelK x 16 fp32 (8 KiB, L1-resident).
// 128 also keeps every integer partial sum of a panel exact in fp32 (see [NOTE]
// of gemm_quant_generic.cpp): 128 * 127 * 127 < 2^24.
constexpr int64_t kPanelK = 128;
// Rows per tile of the quantized gemms (their int32 / fp32 accumulators live on the stack).
constexpr int64_t kRowTile = 32;

// acc[j] += Σ_{c < kc} x[c] * panel[c][j], j < 16, c in increasing order.
// The j loop is 16 independent lanes: the compiler keeps acc in 4 SSE registers.
inline void panel_madd(const float* panel, const float* x, int64_t kc, float* acc) {
  float a[kBlockN];
  for (int64_t j = 0; j < kBlockN; ++j) a[j] = acc[j];
  for (int64_t c = 0; c < kc; ++c) {
    const float xv = x[c];
    const float* w = panel + c * kBlockN;
    for (int64_t j = 0; j < kBlockN; ++j) a[j] += xv * w[j];
  }
  for (int64_t j = 0; j < kBlockN; ++j) acc[j] = a[j];
}

void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc);
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc);
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc);
void silu_mul(const float* gate, const float* up, float* h, int64_t n);
void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t kp, int64_t group,
                   int8_t* q, int64_t ldq, float* scale, int32_t* gsum, int64_t gsum_ld);
void to_bf16(const float* x, uint16_t* y, int64_t n);

}  // namespace generic
}  // namespace ktmoe
