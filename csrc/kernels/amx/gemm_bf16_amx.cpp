// [NOTE] amx gemm_bf16: tdpbf16ps tiles (gemm_amx.h over NativeTileOps) for prefill rows,
// avx512's register tiles below prefill_min_rows() (prefill_rows.h). The B tiles are the
// packed kBF16 bytes as stored: a k-pair row of a block (16 columns x 2 bf16) is one
// 64-byte tile row, 16 k-pairs (1 KiB) per step.
#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_native.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();
}  // namespace avx512

namespace amx {

// w: kBF16 matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero padded);
// c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  if (m < prefill_min_rows()) return avx512::gemm_bf16(w, a, lda, m, b0, b1, c, ldc);
  gemm_bf16_tiles<NativeTileOps>(w, a, lda, m, b0, b1, c, ldc);
}

}  // namespace amx
}  // namespace ktmoe
