// [NOTE] GGML's block structs: the bytes of one block of each type this library reads, as a GGUF
// file stores them (little-endian; fp16 fields as their bits). Sizes are asserted against ggml's
// (ggml_types.cpp's table). Blocks in a file may sit at any byte offset (17-byte mxfp4 blocks, 18-byte
// q4_0 ones): read one by memcpy into the struct, never by casting the file's pointer.
//
// Element order inside a block, as ggml's dequantize_row_* writes it (ggml_decode.cpp follows it):
//   q4_0 / q4_1 / iq4_nl / mxfp4: element j < 16 is the low nibble of qs[j], element 16 + j the high one;
//   q5_0 / q5_1: as q4_0 with bit j of the little-endian qh word as the fifth bit of element j;
//   k-quants and i-quants (256 elements): see each decoder.
#pragma once
#include <cstdint>
#include <cstring>

namespace ktmoe {
namespace ggml {

constexpr int kQK = 32;     // elements of a q4_0 / q8_0 / iq4_nl / mxfp4 block
constexpr int kQK_K = 256;  // elements of a k-quant / iq4_xs super-block

struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[kQK / 2]; };
struct BlockIQ4_NL { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
struct BlockIQ4_XS { uint16_t d, scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };
// The grid i-quants (ggml_decode_iq.cpp): byte arrays where ggml has wider words, read little-endian.
struct BlockIQ2_XXS { uint16_t d; uint8_t qs[kQK_K / 4]; };  // 8 x (4 grid bytes, a u32 of signs and scale)
struct BlockIQ2_XS { uint16_t d; uint8_t qs[kQK_K / 4]; uint8_t scales[kQK_K / 32]; };  // qs: 32 u16
struct BlockIQ2_S { uint16_t d; uint8_t qs[kQK_K / 8]; uint8_t signs[kQK_K / 8]; uint8_t qh[kQK_K / 32];
                    uint8_t scales[kQK_K / 32]; };
struct BlockIQ3_XXS { uint16_t d; uint8_t qs[kQK_K / 4]; uint8_t scales_signs[kQK_K / 8]; };  // 8 u32 after qs
struct BlockIQ3_S { uint16_t d; uint8_t qs[kQK_K / 4]; uint8_t qh[kQK_K / 32]; uint8_t signs[kQK_K / 8];
                    uint8_t scales[kQK_K / 64]; };
struct BlockIQ1_S { uint16_t d; uint8_t qs[kQK_K / 8]; uint8_t qh[kQK_K / 16]; };  // qh: 8 u16
struct BlockIQ1_M { uint8_t qs[kQK_K / 8]; uint8_t qh[kQK_K / 16]; uint8_t scales[kQK_K / 32]; };  // 4 u16

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
                  sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockMXFP4) == 17 &&
                  sizeof(BlockIQ4_NL) == 18,
              "32-element GGML blocks have ggml's sizes");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
                  sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockIQ4_XS) == 136,
              "256-element GGML super-blocks have ggml's sizes");
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82 &&
                  sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110 && sizeof(BlockIQ1_S) == 50 &&
                  sizeof(BlockIQ1_M) == 56,
              "grid i-quant super-blocks have ggml's sizes");

// Block i of a run of `Block`s at any byte offset.
template <class Block>
Block load_block(const uint8_t* blocks, int64_t i) {
  Block b;
  std::memcpy(&b, blocks + i * int64_t(sizeof(Block)), sizeof(Block));
  return b;
}

// iq4_nl / iq4_xs's 16 levels (ggml's kvalues_iq4nl).
constexpr int8_t kIQ4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// mxfp4's e2m1 levels doubled (ggml's kvalues_mxfp4); the block's scale is 2^(e - 128) (half of E8M0's).
constexpr int8_t kMXFP4Levels2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K super-block (ggml's get_scale_min_k4).
inline void q4k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = uint8_t((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *m = uint8_t((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

}  // namespace ggml
}  // namespace ktmoe
