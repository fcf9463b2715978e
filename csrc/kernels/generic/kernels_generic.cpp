// The generic IsaKernels table: portable C++17 kernels, always built, compiled
// without ISA flags (runs on any x86-64), and the oracle the other ISAs are
// tested against. The kernels live in gemm_bf16_generic.cpp,
// gemm_quant_generic.cpp, gemm_fp8_generic.cpp, gemm_int4_affine_generic.cpp, gemm_mxfp4_generic.cpp
// (the last three share gemm_decoded_generic.h), gemm_ggml_generic.cpp and elementwise_generic.cpp.
#include "kernels/generic/generic_kernels.h"

namespace ktmoe {

const IsaKernels& generic_kernels() {
  static const IsaKernels table{
      "generic",          generic::gemm_bf16, generic::gemm_int8,     generic::gemm_int4,
      generic::gemm_fp8,  generic::gated_act, generic::quantize_rows, generic::to_bf16,
      generic::f16_to_f32, generic::f32_to_f16, generic::gemm_int4_affine, generic::gemm_mxfp4,
      generic::gemm_ggml,
  };
  return table;
}

}  // namespace ktmoe
