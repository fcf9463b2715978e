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

KTMOE_DECLARE_ISA_ENTRY_POINTS();

}  // namespace generic
}  // namespace ktmoe
