// [NOTE] The GGML type table: what a GGUF file's tensor type ids mean, one row per type.
//
// A GGUF tensor is rows of blocks along its innermost dimension: `block_elems` weights in
// `block_bytes` bytes (ggml's type_traits blck_size / type_size; gguf.GGML_QUANT_SIZES). Every id
// ggml defines has a row, so a reader can size any tensor of a file and bound-check it, decodable or
// not; `decode` is set for the types whose blocks this library reads (ggml_decode.h), nullptr for
// the others (a file of those is refused by name where its weights are needed).
//
//   decode(blocks, nblocks, out): out[nblocks * block_elems] = the weights of `nblocks` consecutive
//   blocks as fp32, bit for bit what the `gguf` package's gguf.quants.dequantize gives (and
//   llama.cpp's dequantize_row_*): the same operations in the same order, each rounded once
//   (ggml_decode.cpp is compiled without FMA so that `d * q - m` is two roundings, as numpy does).
//   Scales that are fp16 subnormals stay subnormal; nothing is flushed.
//
// Ids are ggml's (enum ggml_type): never renumber. Python reads the table through
// torch_ktmoe._C.ggml_types() (checkpoint/gguf.py).
#pragma once
#include <cstdint>

namespace ktmoe {

enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22,
  kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30,
  kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39, kNVFP4 = 40, kQ1_0 = 41,
};

// blocks: nblocks * block_bytes bytes (any alignment); out: nblocks * block_elems floats.
using GgmlDecodeFn = void (*)(const uint8_t* blocks, int64_t nblocks, float* out);

struct GgmlTypeTraits {
  GgmlType id;
  const char* name;      // ggml's name: "q4_K", "iq4_xs", "bf16"
  int block_elems;       // weights per block (1 for plain types)
  int block_bytes;       // bytes per block
  GgmlDecodeFn decode;   // nullptr: blocks this library does not read
};

// The row of an id, or nullptr for an id ggml does not define (a corrupt or newer file).
const GgmlTypeTraits* find_ggml_type(uint32_t id);
// Every row, in id order.
const GgmlTypeTraits* ggml_type_table(int* count);

}  // namespace ktmoe
