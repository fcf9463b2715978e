// [NOTE] The micro-kernel table: what one ISA provides to the MoE driver.
//
// Every ISA (generic, avx2, avx512, amx) fills one IsaKernels. The driver
// (moe_driver.cpp) owns routing, scratch and threading and calls only these
// functions, so an ISA is a set of small, separately compiled, torch-free
// functions over the layout of packed_format.h. generic is always built and is
// the oracle the others are tested against.
//
// Conventions: a "row" is one token's activations, padded to header.kp with
// zeros. gemm_* computes, for rows m < M and the output columns of packed blocks
// [b0, b1) of matrix w:
//     c[m * ldc + j] = Σ_k a[m][k] · W[16*b0 + j][k]       j < 16*(b1 - b0)
// fully dequantized (all scales applied), fp32, overwriting c. It must give the
// same bits whatever (b0, b1) split or thread calls it (no cross-call state).
#pragma once
#include <cstdint>

#include "kernels/gated_activation.h"
#include "kernels/ggml/ggml_types.h"
#include "kernels/packed_format.h"

namespace ktmoe {

// int8 activations of M rows (see packed_format.h): q [M, ldq] signed, kp used;
// scale [M, kp / scale_group] contiguous, the format's ActivationScale (weight_formats.h):
// kINT8 one per (row, weight group: scale_group = header.group), kINT4 one per row
// (scale_group = kp); gsum [M, gsum_ld] with kp / group sums per row.
struct QuantizedRows {
  const int8_t* q;
  int64_t ldq;
  const float* scale;
  const int32_t* gsum;
  int64_t gsum_ld;
};

struct IsaKernels {
  const char* name;  // "generic", "avx2", "avx2_vnni", "avx512", "amx"

  // a: bf16 rows [M, lda] (lda >= kp).
  void (*gemm_bf16)(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,
                    int64_t b0, int64_t b1, float* c, int64_t ldc);
  void (*gemm_int8)(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m,
                    int64_t b0, int64_t b1, float* c, int64_t ldc);
  void (*gemm_int4)(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m,
                    int64_t b0, int64_t b1, float* c, int64_t ldc);
  // kFP8 (fp8_format.h), a: bf16 rows [M, lda] (lda >= kp, zero past k): per column, each
  // k-group's partial sum in fp32, then one multiply-add by its scale.
  void (*gemm_fp8)(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,
                   int64_t b0, int64_t b1, float* c, int64_t ldc);

  // h[i] = act(gate[i], up[i]), i < n: the row act.kind of gated_activation.h with its parameters;
  // a NaN input gives NaN (the clamps as torch.clamp).
  void (*gated_act)(const Activation& act, const float* gate, const float* up, float* h, int64_t n);

  // Quantize M rows of x [M, ldx] (k valid columns) to int8, one scale per (row m, scale group
  // S of scale_group columns, S < kp / scale_group; scale_group = kp: one per row):
  // scale[m * (kp / scale_group) + S] = max|x| / 127 over the group's columns < k (1 if that is
  // not > 0), q[m][c] = round-half-away(x / its group's scale) for c < k, 0 for k <= c < kp;
  // a group holding a NaN or Inf gets scale NaN and q 0. gsum[m][G] = Σ q over columns
  // [G*group, (G+1)*group), G < kp/group. group and scale_group divide kp.
  void (*quantize_rows)(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t kp,
                        int64_t group, int64_t scale_group, int8_t* q, int64_t ldq, float* scale,
                        int32_t* gsum, int64_t gsum_ld);

  // y[i] = bf16(x[i]) with round-to-nearest-even (NaN stays NaN), i < n.
  void (*to_bf16)(const float* x, uint16_t* y, int64_t n);

  // fp16 activations in and out (fp16 models): y[i] = fp32(x[i]) exactly (NaN stays
  // NaN, made quiet), and y[i] = fp16(x[i]) with round-to-nearest-even (overflow ->
  // inf, denormals kept, NaN -> quiet NaN with sign and top payload kept), i < n.
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);

  // kINT4A (int4_affine_format.h), a: bf16 rows [M, lda] (lda >= kp, zero past k): per column
  // and k-group, acc = Σ a·q and xsum = Σ a in fp32, then c += s·acc + o·xsum (o = -s·z).
  void (*gemm_int4_affine)(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,
                           int64_t b0, int64_t b1, float* c, int64_t ldc);

  // kMXFP4 (mxfp4_format.h), a: bf16 rows [M, lda] (lda >= kp, zero past k): c = Σ_G 2^(e - 127)·Σ a·e2m1,
  // by fp32 group sums (avx512, amx prefill) or int16 activations and int32 block dots (generic, avx2, amx
  // decode rows; mxfp4_format.h).
  void (*gemm_mxfp4)(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                     int64_t b1, float* c, int64_t ldc);

  // A GGML matrix where it lies (a GGUF file's rows, kernels/ggml/ggml_types.h): n rows of k weights of a
  // decodable `type`, row i the row_bytes bytes at w + i * row_bytes (k / type.block_elems blocks; any
  // alignment). a: bf16 rows [M, lda] (lda >= k). c[m * ldc + i] = Σ_k a[m][k] · W[i][k], i < n, W the
  // type's exact weights (type.decode), fp32 sums; the same bits for any n split.
  void (*gemm_ggml)(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                    const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc);
};

// The entry points an ISA defines in its own namespace (ktmoe::generic, ::avx2,
// ::avx512), one per IsaKernels member; its kernels_<isa>.cpp puts them in the table.
#define KTMOE_DECLARE_ISA_ENTRY_POINTS()                                                          \
  void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,         \
                 int64_t b0, int64_t b1, float* c, int64_t ldc);                                  \
  void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,      \
                 int64_t b1, float* c, int64_t ldc);                                              \
  void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,      \
                 int64_t b1, float* c, int64_t ldc);                                              \
  void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,          \
                int64_t b0, int64_t b1, float* c, int64_t ldc);                                   \
  void gated_act(const Activation& act, const float* gate, const float* up, float* h, int64_t n); \
  void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t kp, int64_t group, \
                     int64_t scale_group, int8_t* q, int64_t ldq, float* scale, int32_t* gsum,    \
                     int64_t gsum_ld);                                                            \
  void to_bf16(const float* x, uint16_t* y, int64_t n);                                           \
  void f16_to_f32(const uint16_t* x, float* y, int64_t n);                                        \
  void f32_to_f16(const float* x, uint16_t* y, int64_t n);                                        \
  void gemm_int4_affine(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,  \
                        int64_t b0, int64_t b1, float* c, int64_t ldc);                           \
  void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,        \
                  int64_t b0, int64_t b1, float* c, int64_t ldc);                                  \
  void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, \
                 const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc)

// Tables, defined in generic/, avx2/, avx2_vnni/, avx512/, amx/. All but generic are compiled
// with their ISA flags and must only be *called* after cpu_features says so.
const IsaKernels& generic_kernels();
const IsaKernels& avx2_kernels();
const IsaKernels& avx2_vnni_kernels();  // kernels/avx2_vnni/: avx2's table with vpdpbusd int8 / int4 gemms
const IsaKernels& avx512_kernels();
const IsaKernels& amx_kernels();  // kernels/amx/: avx512's table with AMX tile gemms for prefill

}  // namespace ktmoe
