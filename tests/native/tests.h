// The native test groups, one file each, called in this order by main.cpp (one random stream
// runs through all of them, so the order fixes the data).
#pragma once

#include <cstdint>
#include <vector>

#include "isa_tables.h"
#include "reference.h"

namespace ktmoe_test {

using namespace ktmoe;

// test_pack.cpp: headers, every byte of packed blobs, the int4 group search, bad arguments.
void test_pack(WeightFormat f, MatrixRole role, int64_t n, int64_t k, int64_t group, Rng& rng);
void test_pack_errors();
void test_int4_codebook();

// test_gemm.cpp: the gemm micro-kernels of one ISA table, one format and shape.
void test_gemm(const IsaKernels& isa, WeightFormat f, MatrixRole role, int64_t n, int64_t k,
               int64_t group, Rng& rng);
// test_gemm.cpp: gemm_int8 of every usable ISA equals generic's, bit for bit (isas[0] is generic).
void test_int8_isas_agree(const std::vector<Isa>& isas, MatrixRole role, int64_t n, int64_t k, int64_t group,
                          Rng& rng);

// test_activations.cpp: every row of the gated activation table and quantize_rows.
void test_gated_activations(const IsaKernels& isa, Rng& rng);
void test_quantize(const IsaKernels& isa, Rng& rng);

// test_conversions.cpp: to_bf16, f32_to_f16 and f16_to_f32.
void test_to_bf16(const IsaKernels& isa, Rng& rng);
void test_f16(const IsaKernels& isa, Rng& rng);

// test_driver.cpp: moe_forward against its references, fp16 activations, the accuracy metric.
void test_driver(const std::vector<Isa>& isas, Rng& rng);
void test_driver_f16(const std::vector<Isa>& isas, Rng& rng);
void test_accuracy(const std::vector<Isa>& isas, Rng& rng, int64_t E = 4, int64_t H = 512, int64_t I = 256,
                   int64_t K = 2, int64_t T = 48);
void test_fp8(const std::vector<Isa>& isas, Rng& rng);  // test_fp8.cpp: e4m3 decode, kFP8 packing, gemm_fp8
// test_int4_affine.cpp: kINT4A exact and dense packing, gemm_int4_affine
void test_int4_affine(const std::vector<Isa>& isas, Rng& rng);
// test_ggml.cpp: gemm_ggml of every ISA over GGML rows: the decoder's weights exactly, fp32 sums, any split
void test_ggml(const std::vector<Isa>& isas, Rng& rng);
// n rows of k weights of a GGML type: random bytes with sane fp16 scales (edge values first), `skew` bytes in.
std::vector<uint8_t> random_ggml_rows(GgmlType type, int64_t n, int64_t k, int skew, Rng& rng);
// The worst |c - Σ a·w| over fp32 summation's bound k · 2^-23 · Σ|a·w| (1 = at the bound): a bf16 rows [m, lda],
// wv the decoded weights [n, k], c [m, n]. int16_activations: the bound adds their rounding (int16_activations.h:
// half a step of 2^(E - 13) per input, E the exponent of its block of 32's largest |a|) times |w|.
double ggml_sum_error(const std::vector<uint16_t>& a, int64_t lda, int64_t m, const std::vector<float>& wv, int64_t n,
                      int64_t k, const std::vector<float>& c, bool int16_activations = false);
// test_ggml_tiles.cpp: GGML rows on AMX tiles (amx/ggml_tiles.h): emulated over portable decoders on every host,
// the avx512 decoders' bytes, the real tiles' bits
void test_ggml_tiles(const std::vector<Isa>& isas, Rng& rng);
// test_mxfp4.cpp: e2m1 / E8M0 values, kMXFP4 exact and dense packing, gemm_mxfp4 of every ISA
void test_mxfp4(const std::vector<Isa>& isas, Rng& rng);

// test_amx.cpp: the AMX tile emulator, and the amx gemm templates run on it (every host).
void test_amx_emulator(Rng& rng);
// kFP8 / kINT4A on tiles (test_amx_scaled.cpp): hw packed, wv its dequantized weights [np][kp] by packed
// row, row_mag each packed row's magnitude for the fp32 bound (fp8: max |w|; int4_affine: 32 max |s|).
void test_amx_scaled_tiles(const std::vector<Isa>& isas, const PackedMatrixHeader* hw, const std::vector<double>& wv,
                           const std::vector<double>& row_mag, Rng& rng);
void test_amx_gemm(const std::vector<Isa>& isas, WeightFormat f, MatrixRole role, int64_t n, int64_t k,
                   int64_t group, Rng& rng);
// test_int4_avx2.cpp: avx2 gemm_int4 at the int16 range ends, and its bits against generic's.
void test_int4_avx2(const std::vector<Isa>& isas, Rng& rng);
// test_avx2_vnni.cpp: the avx2_vnni gemms (both vpdpbusd encodings) against generic's bits, and its choice.
void test_avx2_vnni(Rng& rng);

}  // namespace ktmoe_test
