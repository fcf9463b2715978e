// [NOTE] The amx micro-kernel table: avx512's (AVX-512 F/BW/VL/DQ + BF16 + VNNI) with the
// prefill gemms on AMX tiles (all but int4 and grouped int8); "auto" picks it where the CPU has AMX (docs/isa.md: bf16 prefill
// 1.4-2.5x avx512 at T = 256-512 on a 16-core Xeon, level below).
//   gemm_bf16_amx.cpp   tdpbf16ps over the kBF16 pair layout, m >= prefill_min_rows()
//   gemm_int_amx.cpp    tdpbsud over per-channel kINT8 k-quads, same rows; grouped kINT8 and kINT4: avx512
//   gemm_mxfp4_amx.cpp  kMXFP4 decoded per block to bf16 (scales folded in, exact), then as kBF16;
//                       below the tiles avx512's integer kernel (vpdpwssd, gemm_nibble_int16_avx512.cpp)
//   gemm_decoded_amx.cpp  kFP8 / kINT4A decoded per block to bf16 by avx512's decoders, tiles per k-group;
//                       below the tiles kINT4A runs the int16 kernel too
//   gemm_ggml_amx.cpp   GGML rows where they lie, weights as A tiles (ggml_tiles.h; ggml_tile_rows.cpp decodes
//                       q8_0 / q4_0 / q2_K..q6_K / iq4_xs / iq4_nl / mxfp4); below the tiles avx512's int16 decode
//                       rows for q4_K / q5_K / q6_K / iq4_xs (gemm_ggml_int16_avx512.cpp); other types avx512's
//   gemm_amx.h          the tile loop nest, a template over real tiles or the emulator
//   tile_ops_*.h        the instructions / their plain C++ emulator; tile_config.h the layout
// Call only when cpu_features().amx (which also holds the Linux tile-data permission).
#include "kernels/amx/prefill_rows.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace amx {
void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc);
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc);
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc);
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                int64_t b1, float* c, int64_t ldc);
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc);
void gemm_int4_affine(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc);
void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc);
}  // namespace amx

const IsaKernels& amx_kernels() {
  static const IsaKernels table = [] {
    amx::prefill_min_rows();  // a bad KTMOE_AMX_MIN_ROWS fails here, when amx is chosen
    IsaKernels t = avx512_kernels();
    t.name = "amx";
    t.gemm_bf16 = amx::gemm_bf16;
    t.gemm_int8 = amx::gemm_int8;
    t.gemm_int4 = amx::gemm_int4;
    t.gemm_mxfp4 = amx::gemm_mxfp4;
    t.gemm_fp8 = amx::gemm_fp8;
    t.gemm_int4_affine = amx::gemm_int4_affine;
    t.gemm_ggml = amx::gemm_ggml;
    return t;
  }();
  return table;
}

}  // namespace ktmoe
