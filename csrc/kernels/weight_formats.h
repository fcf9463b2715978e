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
//
// The byte layout of each format is specified in packed_format.h; the row packer
// of each is in pack.cpp (pack_matrix), its gemms under generic/, avx2/, avx512/.
#pragma once
#include <cstdint>
#include <string>

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

}  // namespace ktmoe
