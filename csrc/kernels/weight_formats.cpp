// [NOTE] The rows of the weight format traits table (see weight_formats.h).
//
// A new format is one row here (its id the next enum value), plus its kernels:
// its layout in packed_format.h, its row packer in pack.cpp, its gemm entry in
// every IsaKernels table; and its rounding in torch_ktmoe/reference.py (the
// tests' independent oracle). Accuracy bounds: mean|out - ref| / mean|ref| of a
// layer against the fp32 reference on Gaussian experts (weights ~ N(0, 1/fan_in)).
#include "kernels/weight_formats.h"

#include <stdexcept>
#include <string>

#include "kernels/fp8_format.h"
#include "kernels/int4_affine_format.h"
#include "kernels/isa_kernels.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace {

constexpr int64_t kDefaultInt8Group = 32;  // q8_0's block

// Columns in WeightFormatTraits order: id, name, code_bits, k_run, group, default_group, scales, scale_bytes,
// activations, activation_scale, gemm_name, gemm_bf16, gemm_int8, codes, code_offset, codebook, accuracy_bound.
// fp8 (fp8_format.h): group 128 is DeepSeek-V3's weight_block_size; packed from dense weights its
// scales are amax / 448 per (row, group), from an FP8 checkpoint the checkpoint's own (exact).
// int8: per (row, group of group_size inputs), or per output row with group_size 0 (group = kp);
// one group's (block, group) fp32 records are the per-row s[np] of files packed before groups
// existed. default_group 32 is the group the Python loaders pack dense weights with when none is
// given (ops.default_group_size): as accurate as q8_0 (benchmarks/RESULTS.md, Accuracy); its
// group_size 0 stays one group per row, so per-channel files and manifests read as written.
// Its activations are quantized per the same groups (as q8_0's): the heavy-tail error is the
// activations' as much as the weights'. Per channel that is one scale per row.
// int4 (codebook) keeps one activation scale per row: its 4-bit weights dominate its error.
// int4_affine (int4_affine_format.h): group 128 is GPTQ / AWQ's; from dense weights GPTQ's min/max
// rounded to nearest (no error feedback): layer error 0.16-0.18 at group 128, 0.14 at group 32.
// mxfp4 (mxfp4_format.h): group 32 is the MX block (every MXFP4 checkpoint's); from dense weights
// OCP MX's power-of-two scale and nearest e2m1: layer error ~0.20 (e2m1 has 15 levels, its scale
// only powers of two); from a checkpoint the codes and scales are the weights (exact).
constexpr WeightFormatTraits kRows[] = {
    {WeightFormat::kBF16, "bf16", 16, 2, GroupRule::kNone, 0, ScaleLayout::kNone, 0, ActivationRows::kBF16,
     ActivationScale::kNone, "gemm_bf16", &IsaKernels::gemm_bf16, nullptr, CodeValue::kBF16, 0, nullptr, 0.01},
    {WeightFormat::kINT8, "int8", 8, 4, GroupRule::kRow, kDefaultInt8Group, ScaleLayout::kF32PerBlockGroup, 4,
     ActivationRows::kInt8, ActivationScale::kPerWeightGroup, "gemm_int8", nullptr, &IsaKernels::gemm_int8,
     CodeValue::kOffset, 128, nullptr, 0.03},
    {WeightFormat::kINT4, "int4", 4, 8, GroupRule::kChosen, kDefaultInt4Group, ScaleLayout::kBF16PerBlockGroup, 2,
     ActivationRows::kInt8, ActivationScale::kPerRow, "gemm_int4", nullptr, &IsaKernels::gemm_int4,
     CodeValue::kCodebook, 0, kInt4Levels, 0.15},
    {WeightFormat::kFP8, "fp8", 8, 2, GroupRule::kChosen, kFp8BlockGroup, ScaleLayout::kF32PerBlockGroup, 4,
     ActivationRows::kBF16, ActivationScale::kNone, "gemm_fp8", &IsaKernels::gemm_fp8, nullptr, CodeValue::kE4m3, 0,
     nullptr, 0.08},
    {WeightFormat::kINT4A, "int4_affine", 4, 4, GroupRule::kChosen, kInt4AffineDefaultGroup,
     ScaleLayout::kF32U8ZeroPerBlockGroup, 5, ActivationRows::kBF16, ActivationScale::kNone, "gemm_int4_affine",
     &IsaKernels::gemm_int4_affine, nullptr, CodeValue::kAffine, 0, nullptr, 0.2},
    {WeightFormat::kMXFP4, "mxfp4", 4, 4, GroupRule::kChosen, kMxfp4Group, ScaleLayout::kE8M0PerBlockGroup, 1,
     ActivationRows::kBF16, ActivationScale::kNone, "gemm_mxfp4", &IsaKernels::gemm_mxfp4, nullptr,
     CodeValue::kE2m1, 0, nullptr, 0.25},
};
constexpr int kCount = int(sizeof(kRows) / sizeof(kRows[0]));

constexpr int name_length(const char* s) {
  int n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

constexpr bool rows_are_consistent() {
  for (int i = 0; i < kCount; ++i) {
    const WeightFormatTraits& r = kRows[i];
    if (name_length(r.name) == 0 || name_length(r.name) >= 16) return false;  // the cache key's char[16]
    const bool bf16_gemm = r.gemm_bf16 != nullptr, int8_gemm = r.gemm_int8 != nullptr;
    if (int(r.id) != i || bf16_gemm == int8_gemm || bf16_gemm != (r.activations == ActivationRows::kBF16) ||
        bf16_gemm != (r.activation_scale == ActivationScale::kNone) ||
        (r.scales == ScaleLayout::kNone) != (r.scale_bytes == 0) ||
        (r.group == GroupRule::kNone) != (r.default_group == 0) ||
        (r.codes == CodeValue::kCodebook) != (r.codebook != nullptr) ||
        (r.codes == CodeValue::kE4m3 && r.scales != ScaleLayout::kF32PerBlockGroup) ||
        (r.codes == CodeValue::kAffine) != (r.scales == ScaleLayout::kF32U8ZeroPerBlockGroup) ||
        (r.codes == CodeValue::kE2m1) != (r.scales == ScaleLayout::kE8M0PerBlockGroup) || r.k_run < 2)
      return false;
  }
  return true;
}
static_assert(rows_are_consistent(),
              "weight format rows: names of 1..15 characters, in id order, the gemm entry of their activations (int8 rows with "
              "a scale rule), scales / group / codebook "
              "fields that agree");

}  // namespace

const WeightFormatTraits* weight_format_table() { return kRows; }
int weight_format_count() { return kCount; }

const WeightFormatTraits* find_format_traits(uint8_t id) { return id < kCount ? &kRows[id] : nullptr; }

const WeightFormatTraits* find_format_traits(const std::string& name) {
  for (const WeightFormatTraits& row : kRows)
    if (name == row.name) return &row;
  return nullptr;
}

const WeightFormatTraits& format_traits(WeightFormat format) {
  const WeightFormatTraits* row = find_format_traits(uint8_t(format));
  if (!row) throw std::invalid_argument("unknown weight format id " + std::to_string(int(format)));
  return *row;
}

namespace {
// "a, b or c" over the rows, each written by `item`.
template <class F>
std::string list_rows(const F& item) {
  std::string s;
  for (int i = 0; i < kCount; ++i) s += (i == 0 ? "" : i + 1 == kCount ? " or " : ", ") + item(kRows[i]);
  return s;
}
}  // namespace

std::string weight_format_names() {
  return list_rows([](const WeightFormatTraits& r) { return "'" + std::string(r.name) + "'"; });
}

std::string weight_format_ids() {
  return list_rows([](const WeightFormatTraits& r) { return std::to_string(int(r.id)) + " (" + r.name + ")"; });
}

}  // namespace ktmoe
