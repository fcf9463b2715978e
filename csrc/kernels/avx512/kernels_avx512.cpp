// [NOTE] The avx512 micro-kernel table (AVX-512 F/BW/VL/DQ + BF16 + VNNI).
//
// Only collects the entry points; each lives in its own file:
//   gemm_bf16_avx512.cpp   vdpbf16ps register tiles over the kBF16 pair layout
//   gemm_int_avx512.cpp    vpdpbusd register tiles, shared by kINT8 and kINT4
//   gemm_fp8_avx512.cpp    e4m3 decoded to bf16 in registers, vdpbf16ps tiles (kFP8)
//   gemm_int4_affine_avx512.cpp  nibbles decoded to bf16 the same way (kINT4A)
//   gemm_mxfp4_avx512.cpp  e2m1 nibbles decoded by a 16-entry vpermw LUT (kMXFP4); all three run
//                          the tile loops of gemm_decoded_avx512.h
//   gemm_nibble_int16_avx512.cpp  kMXFP4 (generic's bits) and kINT4A by int16 activations and
//                          vpdpwssd: not in this table; the amx table's decode rows (kernels_amx.cpp)
//   gemm_ggml_avx512.cpp   GGML rows where they lie: q8_0 / q4_K / q6_K / iq4_xs on their codes
//                          (ggml_codes_avx512.h), other types each row decoded exactly, then fp32 dots
//   elementwise_avx512.cpp gated_act, quantize_rows, to_bf16, f16_to_f32, f32_to_f16
// Compiled with the AVX-512 flags; call only when cpu_features().avx512.
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();
}  // namespace avx512

const IsaKernels& avx512_kernels() {
  static const IsaKernels table{"avx512",          avx512::gemm_bf16, avx512::gemm_int8,
                                avx512::gemm_int4, avx512::gemm_fp8, avx512::gated_act, avx512::quantize_rows,
                                avx512::to_bf16,   avx512::f16_to_f32, avx512::f32_to_f16, avx512::gemm_int4_affine,
                                avx512::gemm_mxfp4, avx512::gemm_ggml};
  return table;
}

}  // namespace ktmoe
