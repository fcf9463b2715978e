// The decoders of the GGML type table's rows (ggml_types.h's GgmlDecodeFn contract): portable,
// exact (bit for bit gguf.quants.dequantize), the oracle of every GGML kernel.
#pragma once
#include <cstdint>

namespace ktmoe {

void ggml_decode_f32(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_f16(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_bf16(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q4_0(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q4_1(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q5_0(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q5_1(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q8_0(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q2_k(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q3_k(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q4_k(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q5_k(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_q6_k(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq4_nl(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq4_xs(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_mxfp4(const uint8_t* blocks, int64_t nblocks, float* out);
// The grid i-quants (ggml_decode_iq.cpp).
void ggml_decode_iq2_xxs(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq2_xs(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq2_s(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq3_xxs(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq3_s(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq1_s(const uint8_t* blocks, int64_t nblocks, float* out);
void ggml_decode_iq1_m(const uint8_t* blocks, int64_t nblocks, float* out);

}  // namespace ktmoe
