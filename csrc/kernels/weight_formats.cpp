// [NOTE] The rows of the weight format traits table (see weight_formats.h).
//
// A new format is one row here (its id the next enum value), plus its kernels:
// its layout in packed_format.h, its row packer in pack.cpp, its gemm entry in
// every IsaKernels table; and its rounding in torch_ktmoe/reference.py (the
// tests' independent oracle). A format that also packs a checkpoint's exact codes
// names its companion inputs and its decoder in an ExactFormat (below), the decoder
// in kernels/pack_<format>.cpp. Accuracy bounds: mean|out - ref| / mean|ref| of a
// layer against the fp32 reference on Gaussian experts (weights ~ N(0, 1/fan_in)).
#include "kernels/weight_formats.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/fp8_format.h"
#include "kernels/int4_affine_format.h"
#include "kernels/isa_kernels.h"
#include "kernels/mxfp4_format.h"
#include "kernels/pack_fp8.h"
#include "kernels/pack_int4_affine.h"
#include "kernels/pack_mxfp4.h"

namespace ktmoe {
namespace {

constexpr int64_t kDefaultInt8Group = 32;  // q8_0's block

// The exact decoders behind the rows (ExactPackEntry): kernels/pack_fp8.h, pack_int4_affine.h, pack_mxfp4.h.
void fp8_exact(const PackedMatrixHeader& h, const uint8_t* const* q, const ExactRows* in, int64_t e, uint8_t* out) {
  fp8_pack_matrix(h, q, in[0].f32, e, out);
}
void int4a_exact(const PackedMatrixHeader& h, const uint8_t* const* q, const ExactRows* in, int64_t e,
                 uint8_t* out) {
  int4a_pack_matrix(h, q, in[0].f32, in[1].u8, e, out);  // zero points None: symmetric
}
void mxfp4_exact(const PackedMatrixHeader& h, const uint8_t* const* q, const ExactRows* in, int64_t e,
                 uint8_t* out) {
  mxfp4_pack_matrix(h, q, in[0].u8, e, out);
}

constexpr uint32_t kFloats = kElemF32 | kElemBF16 | kElemF16;

// An FP8 checkpoint: e4m3 bytes + fp32 scales per (row, k-group) (checkpoint/fp8.py makes them from 128 x 128
// block or per-row scales).
constexpr ExactFormat kFp8Exact = {
    kElemE4m3, "an FP8 checkpoint's weights", 1,
    {{"scale", kElemF32, ExactStorage::kF32, -1, -1, "", ""}}, &fp8_exact,
    ": e4m3 NaN bytes and non-finite scales are refused, they would poison every output of the expert"};
// A GPTQ / AWQ / compressed-tensors int4 checkpoint: codes 0..15 + scales (widened exactly) + zero points
// 0..16 or None (symmetric, z = 8).
constexpr ExactFormat kInt4AffineExact = {
    kElemU8, "one 4-bit code 0..15 per byte", 2,
    {{"scale", kFloats, ExactStorage::kF32, -1, -1, "", ""},
     {"zero", kElemInteger, ExactStorage::kU8, kInt4AffineSymmetricZero, kInt4AffineMaxZero, "zero points",
      " (GPTQ v1 stores z - 1: add 1 first)"}},
    &int4a_exact, ""};
// An MXFP4 checkpoint: e2m1 codes 0..15 (its nibbles split, checkpoint/mxfp4.py) + E8M0 scale bytes.
constexpr ExactFormat kMxfp4Exact = {
    kElemU8, "one e2m1 code 0..15 per byte", 1,
    {{"scale", kElemU8, ExactStorage::kU8, -1, -1, "E8M0 scale bytes", ""}}, &mxfp4_exact, ""};

// Columns in WeightFormatTraits order: id, name, code_bits, k_run, group, default_group, scales, scale_bytes,
// activations, activation_scale, gemm_name, gemm_bf16, gemm_int8, codes, code_offset, codebook, accuracy_bound,
// exact.
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
     ActivationScale::kNone, "gemm_bf16", &IsaKernels::gemm_bf16, nullptr, CodeValue::kBF16, 0, nullptr, 0.01,
     nullptr},
    {WeightFormat::kINT8, "int8", 8, 4, GroupRule::kRow, kDefaultInt8Group, ScaleLayout::kF32PerBlockGroup, 4,
     ActivationRows::kInt8, ActivationScale::kPerWeightGroup, "gemm_int8", nullptr, &IsaKernels::gemm_int8,
     CodeValue::kOffset, 128, nullptr, 0.03, nullptr},
    {WeightFormat::kINT4, "int4", 4, 8, GroupRule::kChosen, kDefaultInt4Group, ScaleLayout::kBF16PerBlockGroup, 2,
     ActivationRows::kInt8, ActivationScale::kPerRow, "gemm_int4", nullptr, &IsaKernels::gemm_int4,
     CodeValue::kCodebook, 0, kInt4Levels, 0.15, nullptr},
    {WeightFormat::kFP8, "fp8", 8, 2, GroupRule::kChosen, kFp8BlockGroup, ScaleLayout::kF32PerBlockGroup, 4,
     ActivationRows::kBF16, ActivationScale::kNone, "gemm_fp8", &IsaKernels::gemm_fp8, nullptr, CodeValue::kE4m3, 0,
     nullptr, 0.08, &kFp8Exact},
    {WeightFormat::kINT4A, "int4_affine", 4, 4, GroupRule::kChosen, kInt4AffineDefaultGroup,
     ScaleLayout::kF32U8ZeroPerBlockGroup, 5, ActivationRows::kBF16, ActivationScale::kNone, "gemm_int4_affine",
     &IsaKernels::gemm_int4_affine, nullptr, CodeValue::kAffine, 0, nullptr, 0.2, &kInt4AffineExact},
    {WeightFormat::kMXFP4, "mxfp4", 4, 4, GroupRule::kChosen, kMxfp4Group, ScaleLayout::kE8M0PerBlockGroup, 1,
     ActivationRows::kBF16, ActivationScale::kNone, "gemm_mxfp4", &IsaKernels::gemm_mxfp4, nullptr,
     CodeValue::kE2m1, 0, nullptr, 0.25, &kMxfp4Exact},
};
constexpr int kCount = int(sizeof(kRows) / sizeof(kRows[0]));

constexpr int name_length(const char* s) {
  int n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

// An exact format's inputs: 1..kMaxExactInputs, named, an integer input narrowed to bytes with its range, a None
// default only in bytes.
constexpr bool exact_is_consistent(const ExactFormat* x) {
  if (!x) return true;
  if (x->pack == nullptr || x->codes == 0 || x->num_inputs < 1 || x->num_inputs > kMaxExactInputs) return false;
  for (int i = 0; i < x->num_inputs; ++i) {
    const ExactInput& in = x->inputs[i];
    const bool integer = (in.accepted & kElemInteger) != 0;
    if (name_length(in.name) == 0 || in.accepted == 0 || integer != (in.max_value >= 0) ||
        (integer && in.storage != ExactStorage::kU8) ||
        ((in.accepted & kFloats) != 0 && in.storage != ExactStorage::kF32) ||
        (in.none_value >= 0 && (in.storage != ExactStorage::kU8 || in.none_value > 255)))
      return false;
  }
  return true;
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
        (r.codes == CodeValue::kE2m1) != (r.scales == ScaleLayout::kE8M0PerBlockGroup) || r.k_run < 2 ||
        !exact_is_consistent(r.exact))
      return false;
  }
  return true;
}
static_assert(rows_are_consistent(),
              "weight format rows: names of 1..15 characters, in id order, the gemm entry of their activations (int8 rows with "
              "a scale rule), scales / group / codebook "
              "fields that agree, exact inputs that are named, typed and stored as their types allow");

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

std::vector<std::string> element_type_names(uint32_t types) {
  static constexpr const char* kNames[] = {"float32", "bfloat16", "float16", "uint8", "float8_e4m3fn", "integer"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == 6 && kElemInteger == 1u << 5, "a name for every element type");
  std::vector<std::string> names;
  for (int bit = 0; bit < 6; ++bit)
    if (types & (1u << bit)) names.push_back(kNames[bit]);
  return names;
}

std::string exact_format_names(uint32_t codes) {
  std::vector<std::string> names;
  for (const WeightFormatTraits& r : kRows)
    if (r.exact && (codes == 0 || (r.exact->codes & codes))) names.push_back("'" + std::string(r.name) + "'");
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

std::string weight_format_ids() {
  return list_rows([](const WeightFormatTraits& r) { return std::to_string(int(r.id)) + " (" + r.name + ")"; });
}

}  // namespace ktmoe
