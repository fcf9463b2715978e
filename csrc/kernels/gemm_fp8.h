// The gemm_fp8 micro-kernel of each ISA (kFP8 weights, fp8_format.h), declared outside
// isa_kernels.h until the formats table gives it an IsaKernels member.
//
// Contract, as gemm_bf16's (isa_kernels.h): w a kFP8 matrix; a bf16 rows [m, lda]
// (lda >= kp, zero past k); for rows r < m and the columns of packed blocks [b0, b1):
//   c[r*ldc + j] = Σ_G scale[16*b0 + j, G] · Σ_{k∈G} a[r][k] · e4m3(w[16*b0 + j][k]),
// j < 16*(b1 - b0), fp32, overwriting c; the bits depend neither on the (b0, b1) split
// nor on m.
#pragma once
#include <cstdint>

#include "kernels/fp8_format.h"

#define KTMOE_DECLARE_FP8_ENTRY_POINT()                                                    \
  void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,    \
                int64_t b0, int64_t b1, float* c, int64_t ldc)

namespace ktmoe {
namespace generic {
KTMOE_DECLARE_FP8_ENTRY_POINT();
}
namespace avx2 {
KTMOE_DECLARE_FP8_ENTRY_POINT();
}
namespace avx512 {
KTMOE_DECLARE_FP8_ENTRY_POINT();
}
}  // namespace ktmoe
