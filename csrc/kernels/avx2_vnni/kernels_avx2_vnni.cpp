// [NOTE] The avx2_vnni micro-kernel table: avx2's (AVX2 + FMA + F16C) with the int8 and int4
// gemms on vpdpbusd (AVX-VNNI, vnni_dot.h):
//   gemm_int8_avx2_vnni.cpp   u8 weights x s8 activations, one vpdpbusd per 32 weight bytes and row
//   gemm_int4_avx2_vnni.cpp   avx2's int4 tile loop (unpack, epilogue) with the vpdpbusd dot
// Both give generic's bits, as avx2's do. "auto" picks it on a CPU with AVX-VNNI and without
// the avx512 table's features (isa_select.cpp). Call only when cpu_features().avx2_vnni.
#include "kernels/avx2/avx2_util.h"
#include "kernels/avx2_vnni/vnni_dot.h"

namespace ktmoe {
namespace KTMOE_AVX2_VNNI_NS {
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
               int64_t ldc);
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
               int64_t ldc);
}  // namespace KTMOE_AVX2_VNNI_NS

const IsaKernels& KTMOE_AVX2_VNNI_TABLE() {
  static const IsaKernels table = [] {
    IsaKernels t = avx2_kernels();
    t.name = KTMOE_AVX2_VNNI_NAME;
    t.gemm_int8 = KTMOE_AVX2_VNNI_NS::gemm_int8;
    t.gemm_int4 = KTMOE_AVX2_VNNI_NS::gemm_int4;
    return t;
  }();
  return table;
}

}  // namespace ktmoe
