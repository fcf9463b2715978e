// [NOTE] The avx2 micro-kernel table (AVX2 + FMA + F16C, no AVX-512).
//
// Only assembles the table; each entry lives in its own file of this directory
// (gemm_bf16 / gemm_int8 / gemm_int4 / gemm_fp8 / gemm_int4_affine / gemm_mxfp4 / gemm_ggml / gated_act / quantize_rows / to_bf16 / f16 _avx2.cpp),
// all compiled with -O3 -std=c++17 -mavx2 -mfma -mf16c. Call only when
// cpu_features().avx2 is true.
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {

const IsaKernels& avx2_kernels() {
  static const IsaKernels table{"avx2",         avx2::gemm_bf16, avx2::gemm_int8,
                                avx2::gemm_int4, avx2::gemm_fp8, avx2::gated_act, avx2::quantize_rows,
                                avx2::to_bf16,   avx2::f16_to_f32, avx2::f32_to_f16, avx2::gemm_int4_affine,
                                avx2::gemm_mxfp4, avx2::gemm_ggml};
  return table;
}

}  // namespace ktmoe
