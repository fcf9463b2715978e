// [NOTE] The rows of the GGML type table (ggml_types.h): ggml's ids, names and block sizes (ggml.c's
// type_traits; the same as gguf.GGML_QUANT_SIZES, which tests/test_ggml_types.py compares row by row),
// and the decoder of each type this library reads (ggml_decode.h).
#include "kernels/ggml/ggml_types.h"

#include "kernels/ggml/ggml_decode.h"

namespace ktmoe {
namespace {

constexpr GgmlTypeTraits kRows[] = {
    {GgmlType::kF32, "f32", 1, 4, &ggml_decode_f32},
    {GgmlType::kF16, "f16", 1, 2, &ggml_decode_f16},
    {GgmlType::kQ4_0, "q4_0", 32, 18, &ggml_decode_q4_0},
    {GgmlType::kQ4_1, "q4_1", 32, 20, &ggml_decode_q4_1},
    {GgmlType::kQ5_0, "q5_0", 32, 22, &ggml_decode_q5_0},
    {GgmlType::kQ5_1, "q5_1", 32, 24, &ggml_decode_q5_1},
    {GgmlType::kQ8_0, "q8_0", 32, 34, &ggml_decode_q8_0},
    {GgmlType::kQ8_1, "q8_1", 32, 40, nullptr},  // activations only in ggml
    {GgmlType::kQ2_K, "q2_K", 256, 84, &ggml_decode_q2_k},
    {GgmlType::kQ3_K, "q3_K", 256, 110, &ggml_decode_q3_k},
    {GgmlType::kQ4_K, "q4_K", 256, 144, &ggml_decode_q4_k},
    {GgmlType::kQ5_K, "q5_K", 256, 176, &ggml_decode_q5_k},
    {GgmlType::kQ6_K, "q6_K", 256, 210, &ggml_decode_q6_k},
    {GgmlType::kQ8_K, "q8_K", 256, 292, nullptr},  // activations only in ggml
    {GgmlType::kIQ2_XXS, "iq2_xxs", 256, 66, &ggml_decode_iq2_xxs},
    {GgmlType::kIQ2_XS, "iq2_xs", 256, 74, &ggml_decode_iq2_xs},
    {GgmlType::kIQ3_XXS, "iq3_xxs", 256, 98, &ggml_decode_iq3_xxs},
    {GgmlType::kIQ1_S, "iq1_s", 256, 50, &ggml_decode_iq1_s},
    {GgmlType::kIQ4_NL, "iq4_nl", 32, 18, &ggml_decode_iq4_nl},
    {GgmlType::kIQ3_S, "iq3_s", 256, 110, &ggml_decode_iq3_s},
    {GgmlType::kIQ2_S, "iq2_s", 256, 82, &ggml_decode_iq2_s},
    {GgmlType::kIQ4_XS, "iq4_xs", 256, 136, &ggml_decode_iq4_xs},
    {GgmlType::kI8, "i8", 1, 1, nullptr},
    {GgmlType::kI16, "i16", 1, 2, nullptr},
    {GgmlType::kI32, "i32", 1, 4, nullptr},
    {GgmlType::kI64, "i64", 1, 8, nullptr},
    {GgmlType::kF64, "f64", 1, 8, nullptr},
    {GgmlType::kIQ1_M, "iq1_m", 256, 56, &ggml_decode_iq1_m},
    {GgmlType::kBF16, "bf16", 1, 2, &ggml_decode_bf16},
    {GgmlType::kTQ1_0, "tq1_0", 256, 54, nullptr},
    {GgmlType::kTQ2_0, "tq2_0", 256, 66, nullptr},
    {GgmlType::kMXFP4, "mxfp4", 32, 17, &ggml_decode_mxfp4},
    {GgmlType::kNVFP4, "nvfp4", 64, 36, nullptr},
    {GgmlType::kQ1_0, "q1_0", 128, 18, nullptr},
};
constexpr int kCount = int(sizeof(kRows) / sizeof(kRows[0]));

constexpr bool rows_ascend() {
  for (int i = 1; i < kCount; ++i)
    if (uint32_t(kRows[i - 1].id) >= uint32_t(kRows[i].id) || kRows[i].block_elems < 1 || kRows[i].block_bytes < 1)
      return false;
  return true;
}
static_assert(rows_ascend(), "GGML type rows: ids ascending, blocks of at least one element and one byte");

}  // namespace

const GgmlTypeTraits* find_ggml_type(uint32_t id) {
  for (const GgmlTypeTraits& row : kRows)
    if (uint32_t(row.id) == id) return &row;
  return nullptr;
}

const GgmlTypeTraits* ggml_type_table(int* count) {
  *count = kCount;
  return kRows;
}

}  // namespace ktmoe
