// [NOTE] The weight format traits table: one row per packed weight format.
//
// Like ggml's type_traits, every fact about a format that code outside its
// kernels needs is a field of its row (weight_formats.cpp), and every user reads
// the row instead of switching on the format:
//
//   name, id            parsing and naming (ops/weight_format.cpp), the cache key,
//                       the Python list (_C.weight_formats(), ops.WEIGHT_FORMATS)
//   code_bits, k_run,   the header and blob sizes (pack.cpp packed_matrix_header,
//   scales              packed_format.h block_data_bytes, packed_header_check.cpp)
//   activations,        what the driver feeds the format's gemm (bf16 or int8 rows, and for
//   activation_scale,   int8 rows one scale per row or per weight group) and which IsaKernels
//   gemm                entry it calls (moe_driver.cpp); every ISA fills every entry
//   codes, codebook,    how Python's unpack (torch_ktmoe/unpack.py) turns codes and
//   code_offset         scales back into weights
//   accuracy_bound      the error each format must meet in the tests (tests/conftest.py)
//   exact               what a checkpoint's exact codes come with (ExactFormat: the companion
//                       inputs' names, element types, None allowed) and the decoder that packs
//                       them as they are (ops/pack_exact.cpp checks them; nullptr: dense only)
//
// The byte layout of each format is specified in packed_format.h; the row packer
// of each is in pack.cpp (pack_matrix), its gemms under generic/, avx2/, avx512/.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ktmoe {

// The id stored in PackedMatrixHeader::format: never renumber (cache files keep it).
enum class WeightFormat : uint8_t { kBF16 = 0, kINT8 = 1, kINT4 = 2, kFP8 = 3, kINT4A = 4, kMXFP4 = 5 };

struct IsaKernels;
struct PackedMatrixHeader;
struct QuantizedRows;

// What header.group holds and how kp relates to it.
enum class GroupRule : uint8_t {
  kNone = 0,    // group 0: no scales (kp = round_up(k, 32))
  kRow = 1,     // group_size 0: group = kp, one scale per output row (kp = round_up(k, 32)); a
                // group_size > 0 (a multiple of 32) chooses groups along the input as kChosen does
  kChosen = 2,  // group = the caller's group_size (a multiple of 32; 0 -> default_group),
                // kp = round_up(k, group) so that groups tile kp
};

// Where the scales are and what one is.
enum class ScaleLayout : uint8_t {
  kNone = 0,
  kF32PerRow = 1,         // float s[np] (no row uses it: one group of kF32PerBlockGroup is this layout)
  kBF16PerBlockGroup = 2, // per (block, group): 16 bf16 d, one per column of the block
  kF32PerBlockGroup = 3,  // per (block, group): 16 fp32 s, one per column of the block
  kF32U8ZeroPerBlockGroup = 4,  // per (block, group): 16 fp32 s, then 16 u8 zero points z
  kE8M0PerBlockGroup = 5,       // per (block, group): 16 u8 E8M0 exponents e, s = 2^(e - 127) (mxfp4_format.h)
};

// The activation rows a format's gemm multiplies (prepared by the driver).
enum class ActivationRows : uint8_t {
  kBF16 = 0,  // bf16 rows [M, lda]
  kInt8 = 1,  // int8 rows + scales (ActivationScale) + per-group sums (QuantizedRows)
};

// The scales of kInt8 activation rows: the columns that share one (quantize_rows' scale_group).
enum class ActivationScale : uint8_t {
  kNone = 0,            // kBF16 rows
  kPerRow = 1,          // one fp32 scale per row (scale_group = kp)
  kPerWeightGroup = 2,  // one per (row, weight group of header.group inputs): scale_group = group, so a
                        // group's int32 sum is scaled by s_w[n, G] · s_x[row, G] (per channel: one group)
};

// How a stored code becomes a weight (before its scale).
enum class CodeValue : uint8_t {
  kBF16 = 0,      // the code is the bf16 weight itself
  kOffset = 1,    // code - code_offset
  kCodebook = 2,  // codebook[code]
  kE4m3 = 3,      // the code byte is an e4m3fn value (fp8_format.h)
  kAffine = 4,    // the code q itself, weight s * (q - z) (int4_affine_format.h)
  kE2m1 = 5,      // the 4-bit code is an FP4 e2m1 value (mxfp4_format.h)
};

// Element types of an exact checkpoint's tensors, as a mask (ops/pack_exact.cpp maps them to ATen's).
enum ElementTypes : uint32_t {
  kElemF32 = 1,
  kElemBF16 = 2,
  kElemF16 = 4,
  kElemU8 = 8,
  kElemE4m3 = 16,
  kElemInteger = 32,  // any integer type: range-checked, then narrowed to uint8
};

// What the decoder reads of a companion input: floats widened exactly to fp32, or bytes.
enum class ExactStorage : uint8_t { kF32 = 0, kU8 = 1 };

// One companion input of an exact format. The op takes it per matrix, as
// exact[3 i + 0, 1, 2] = gate_up_<name> (gate_<name> beside separate up codes), up_<name>, down_<name>.
struct ExactInput {
  const char* name;       // "scale", "zero"
  uint32_t accepted;      // ElementTypes mask
  ExactStorage storage;
  int none_value;         // >= 0 (kU8 storage): may be None, meaning every value is this (int4_affine's z = 8);
                          // -1: required (up_<name> only with separate up codes)
  int max_value;          // kElemInteger: values must lie in [0, max_value] (checked before narrowing); else -1
  const char* what;       // "" or what the values are, in messages ("zero points", "E8M0 scale bytes")
  const char* range_note; // "" or a hint after a value out of range
};

// Row r's values of one input, in its storage (the other pointer nullptr).
struct ExactRows {
  const float* const* f32;
  const uint8_t* const* u8;
};

// Packs one expert matrix from its exact codes (codes[r]: dense row r's k code bytes, r < header.n) and inputs
// (inputs[i]: the rows of ExactFormat::inputs[i], each kp/group values) into out (header.total_bytes bytes,
// 64-byte aligned). Throws std::domain_error naming `expert`, row and column (or group) for a value the format
// cannot hold, before anything is written.
using ExactPackEntry = void (*)(const PackedMatrixHeader& header, const uint8_t* const* codes,
                                const ExactRows* inputs, int64_t expert, uint8_t* out);

constexpr int kMaxExactInputs = 2;

// A format that packs a checkpoint's exact codes: the codes' type, the companions, the decoder.
struct ExactFormat {
  uint32_t codes;          // ElementTypes of the codes (one byte each)
  const char* codes_what;  // what a code byte is, in messages
  int num_inputs;
  ExactInput inputs[kMaxExactInputs];
  ExactPackEntry pack;
  const char* refusal;     // "" or why the decoder's refusals matter, after its error
};

using GemmBF16Entry = void (*IsaKernels::*)(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda,
                                            int64_t m, int64_t b0, int64_t b1, float* c, int64_t ldc);
using GemmInt8Entry = void (*IsaKernels::*)(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m,
                                            int64_t b0, int64_t b1, float* c, int64_t ldc);

struct WeightFormatTraits {
  WeightFormat id;
  const char* name;            // "bf16": the name users pass and cache keys store (< 16 chars)
  int code_bits;               // bits of one stored weight code: a block is kp * 16 * code_bits / 8 bytes
  int k_run;                   // inputs of one column stored side by side in a block: 2 (pairs), 4 (quads),
                               // 8 (int4's octets: quads in the low, then the high nibbles)
  GroupRule group;
  int64_t default_group;       // kChosen: the group of group_size 0; kRow: the group the loaders pack
                               // dense weights with when none is given (group_size 0 is per row)
  ScaleLayout scales;
  int scale_bytes;             // bytes of one scale (0 without scales; int4_affine: 4 of s + 1 of z)
  ActivationRows activations;
  ActivationScale activation_scale;
  const char* gemm_name;       // the IsaKernels entry, by name
  GemmBF16Entry gemm_bf16;     // exactly one of the two is set, matching activations
  GemmInt8Entry gemm_int8;
  CodeValue codes;
  int code_offset;             // kOffset
  const int* codebook;         // kCodebook: 1 << code_bits levels
  double accuracy_bound;       // mean|out - ref| / mean|ref| against fp32 experts (tests)
  const ExactFormat* exact;    // a checkpoint's exact codes + companions, or nullptr (dense weights only)

  // The columns of a kp-column activation row one scale covers (kInt8 rows of a matrix of header.group).
  int64_t activation_scale_group(int64_t kp, int64_t group) const {
    return activation_scale == ActivationScale::kPerWeightGroup ? group : kp;
  }

  // Bits per weight including scales, at default_group (int8: 9, its scales per group of 32).
  double bits_per_weight() const {
    return code_bits + (default_group > 0 ? 8.0 * scale_bytes / double(default_group) : 0.0);
  }
};

// Every row, in id order (row i has id i).
const WeightFormatTraits* weight_format_table();
int weight_format_count();

// The row of a stored id, or nullptr for an id no row has (a forged header).
const WeightFormatTraits* find_format_traits(uint8_t id);
// The row of a name, or nullptr.
const WeightFormatTraits* find_format_traits(const std::string& name);
// The row of a valid format (std::invalid_argument for an id no row has).
const WeightFormatTraits& format_traits(WeightFormat format);

// "'bf16', 'int8', ... or 'int4_affine'" and "0 (bf16), 1 (int8), ... or 4 (int4_affine)": for error messages.
std::string weight_format_names();
std::string weight_format_ids();
// The names of an ElementTypes mask's types, in bit order: "float32", "bfloat16", "float16", "uint8",
// "float8_e4m3fn", "integer" (torch's dtype names; integer: any integer type).
std::vector<std::string> element_type_names(uint32_t types);
// "'fp8', 'int4_affine' or 'mxfp4'": the rows with an exact decoder (whose codes are of `codes`, an ElementTypes
// mask; 0: any).
std::string exact_format_names(uint32_t codes = 0);

}  // namespace ktmoe
