// The avx512 functions the amx table calls besides avx512's IsaKernels entry points (kernels_amx.cpp):
// the int16 decode rows of the nibble formats and of GGUF's and the block decoders / group scales its tiles read.
// Defined in this directory (AVX-512 BW / VNNI); call only where the CPU runs avx512.
#pragma once
#include <cstdint>

#include "kernels/ggml/ggml_types.h"
#include "kernels/packed_format.h"

namespace ktmoe {
namespace avx512 {

// gemm_nibble_int16_avx512.cpp. w: kMXFP4 / kINT4A matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero past
// k); c: fp32 [m, ldc], columns 0 .. 16*(b1-b0) written.
void gemm_mxfp4_int16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc);
void gemm_int4_affine_int16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                            int64_t b1, float* c, int64_t ldc);

// gemm_ggml_int16_avx512.cpp: gemm_ggml's contract (isa_kernels.h) on int16 activations for q4_K, q5_K,
// q6_K and iq4_xs, avx512's gemm_ggml for the other types. Meant for decode rows.
void gemm_ggml_int16(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                     const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc);

// gemm_fp8_avx512.cpp / gemm_int4_affine_avx512.cpp: amx/gemm_amx.h's BlockDecoder (a block as kBF16 k-pair
// rows, never refused) and GroupScales of kFP8 and kINT4A, and kINT4A's row group sums xs [m, ngroups].
bool fp8_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out);
void fp8_group_scales(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float* o);
bool int4a_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out);
void int4a_group_scales(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float* o);
void int4a_row_group_sums(const uint16_t* a, int64_t lda, int64_t m, int64_t group, int64_t ngroups, float* xs);

}  // namespace avx512
}  // namespace ktmoe
