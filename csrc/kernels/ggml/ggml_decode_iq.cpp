// [NOTE] The grid i-quants -> fp32: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s and iq1_m, exactly as the
// `gguf` package's gguf.quants.dequantize (and llama.cpp's dequantize_row_iq*) computes them.
//
// Format. A 256-weight super-block is 32 groups of 8 consecutive weights. A group's magnitudes are a row of a
// fixed codebook (iq_grids.h, generated from gguf.quants' own tables), picked by an 8- to 11-bit index: iq2
// rows are 8 values of {8, 25, 43}; iq3 rows 4 values of 8 levels, two rows a group; iq1 rows 8 values of
// {-1, 0, 1}. An iq2 / iq3 group has 8 sign bits (xxs / xs: a 7-bit index into kIQSigns, whose eighth bit is
// the parity of the seven; s: a byte of its own), an iq1 group a shift delta = +-1/8 instead. The block's fp16
// d is scaled by a small integer s per 32 or 16 weights:
//   iq2_*    (d * (0.5 + s)) * 0.25 * grid * sign   s: 4 bits per 32 weights (xxs), per 16 (xs, s)
//   iq3_xxs  (d * (0.5 + s)) * 0.5 * grid * sign    s: 4 bits per 32
//   iq3_s    (d * (1 + 2 s)) * grid * sign          s: 4 bits per 32
//   iq1_*    (d * (2 s + 1)) * (grid + delta)       s: 3 bits per 32 (s), per 16 (m; its d is the top
//                                                   nibbles of its four 16-bit scale words)
// left to right in fp32, as numpy evaluates gguf's expressions (every operand float32 there: the integer
// scales promote from uint8 / uint16 / uint32 to float32, the signs and deltas are float32).
//
// Exactness. Each of these operations is exact in fp32, so no order of evaluation or FMA contraction could
// change a bit: d is an fp16 value (at most 11 significant bits, |d| from 2^-24 to 65504), 0.5 + s,
// 1 + 2 s and 2 s + 1 have at most 5 significant bits, grid values at most 6 (43 = 101011b), grid + delta
// at most 4 (9/8), a sign, 0.25 and 0.5 one; so every product has at most 22 significant bits and lies
// between 2^-27 and 2^25 in magnitude, well inside fp32's normal range. The decoders keep gguf's order all
// the same. A zero scale gives zeros signed as the products are (gguf multiplies by +-1: here a sign flip),
// an infinite one infinities (no scale factor, grid value or grid + delta is zero), a NaN NaNs of its sign
// and payload (numpy's multiply returns its NaN operand, so a sign of -1 leaves it as it is here too).
// Subnormal fp16 scales widen exactly (f16_to_f32), never flushed.
#include <cstring>

#include "kernels/generic/f16_scalar.h"
#include "kernels/ggml/ggml_blocks.h"
#include "kernels/ggml/ggml_decode.h"
#include "kernels/ggml/iq_grids.h"

namespace ktmoe {
namespace {

using namespace ggml;

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Nibble i of a byte array, the low nibble of each byte first.
inline int nibble_at(const uint8_t* p, int i) { return (p[i / 2] >> (4 * (i % 2))) & 0xF; }

// The iq2 / iq3_xxs scale of a group: (d * (0.5 + s)) * step.
inline float half_odd_scale(float d, int s, float step) { return d * (0.5f + float(s)) * step; }

// 8 weights: (db * grid byte j) * (bit j of signs ? -1 : 1); grid's bytes little-endian, unsigned. The
// multiply by -1 is a sign flip, except that a NaN keeps its sign, as numpy's multiply leaves it (a compiler
// would fold x * -1.f into -x, which flips it).
inline void put_signed(float* out, float db, uint64_t grid, int signs) {
  for (int j = 0; j < 8; ++j) {
    const float v = db * float(uint8_t(grid >> (8 * j)));
    const uint32_t flip = uint32_t((signs >> j) & 1) << 31;
    out[j] = f32_from_bits(f32_bits(v) ^ (v == v ? flip : 0u));
  }
}

// 8 iq1 weights: dl * (grid byte j + delta), the row's bytes int8, delta -1/8 when `negative`, else 1/8.
inline void put_iq1(float* out, float dl, int row, bool negative) {
  const uint64_t grid = kIQ1SGrid[row];
  const float delta = negative ? -0.125f : 0.125f;
  for (int j = 0; j < 8; ++j) out[j] = dl * (float(int8_t(uint8_t(grid >> (8 * j)))) + delta);
}

// An iq3 group: its two 4-value rows as one 8-value row.
inline uint64_t iq3_rows(const uint32_t* grid, int first, int second) {
  return uint64_t(grid[first]) | uint64_t(grid[second]) << 32;
}

// The fp16 scale d of a super-block; iq1_m's is the top nibbles of its four u16 scale words, the first lowest.
template <class Block>
float block_d(const Block& b) { return f16_to_f32(b.d); }

float block_d(const BlockIQ1_M& b) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, sizeof(sc));
  return f16_to_f32(uint16_t(sc[0] >> 12 | (sc[1] >> 8 & 0xF0) | (sc[2] >> 4 & 0xF00) | (sc[3] & 0xF000)));
}

// Every super-block of a run: half h (16 weights) has the factor scale_of(b, d, h), and group k (the 8
// weights at 8 k, in half k / 2) is written by put_group(b, out + 8 k, that factor, k).
template <class Block, class ScaleOf, class PutGroup>
void decode_superblocks(const uint8_t* blocks, int64_t n, float* out, ScaleOf scale_of, PutGroup put_group) {
  for (int64_t i = 0; i < n; ++i, out += kQK_K) {
    const auto b = load_block<Block>(blocks, i);
    const float d = block_d(b);
    for (int h = 0; h < 16; ++h) {
      const float f = scale_of(b, d, h);
      put_group(b, out + 16 * h, f, 2 * h);
      put_group(b, out + 16 * h + 8, f, 2 * h + 1);
    }
  }
}

// iq2_xxs / iq3_xxs: sub-block ib (32 weights) has a u32 aux whose top 4 bits are the scale s and whose four
// 7-bit fields from bit 0 are its groups' sign indices.
inline float xxs_scale(float d, uint32_t aux, float step) { return half_odd_scale(d, int(aux >> 28), step); }
inline int xxs_signs(uint32_t aux, int k) { return kIQSigns[(aux >> (7 * (k % 4))) & 0x7F]; }

}  // namespace

// Sub-block ib: its groups' rows are the bytes qs[8 ib .. 8 ib + 3], its aux the u32 at qs[8 ib + 4].
void ggml_decode_iq2_xxs(const uint8_t* blocks, int64_t n, float* out) {
  const auto aux = [](const BlockIQ2_XXS& b, int ib) { return load_u32(b.qs + 8 * ib + 4); };
  decode_superblocks<BlockIQ2_XXS>(
      blocks, n, out, [&](const auto& b, float d, int h) { return xxs_scale(d, aux(b, h / 2), 0.25f); },
      [&](const auto& b, float* y, float db, int k) {
        put_signed(y, db, kIQ2XXSGrid[b.qs[8 * (k / 4) + k % 4]], xxs_signs(aux(b, k / 4), k));
      });
}

// Half h has the scale nibble h of `scales`; group k the u16 q at qs[2 k]: its low 9 bits the row, its top 7
// the sign index.
void ggml_decode_iq2_xs(const uint8_t* blocks, int64_t n, float* out) {
  decode_superblocks<BlockIQ2_XS>(
      blocks, n, out, [](const auto& b, float d, int h) { return half_odd_scale(d, nibble_at(b.scales, h), 0.25f); },
      [](const auto& b, float* y, float db, int k) {
        const int q = load_u16(b.qs + 2 * k);
        put_signed(y, db, kIQ2XSGrid[q & 511], kIQSigns[q >> 9]);
      });
}

// Half h has the scale nibble h of `scales`; group k the row qs[k] with bits 2 (k % 4) .. +1 of qh[k / 4] as
// bits 8..9, and the sign byte signs[k].
void ggml_decode_iq2_s(const uint8_t* blocks, int64_t n, float* out) {
  decode_superblocks<BlockIQ2_S>(
      blocks, n, out, [](const auto& b, float d, int h) { return half_odd_scale(d, nibble_at(b.scales, h), 0.25f); },
      [](const auto& b, float* y, float db, int k) {
        put_signed(y, db, kIQ2SGrid[b.qs[k] | ((b.qh[k / 4] >> (2 * (k % 4))) & 3) << 8], b.signs[k]);
      });
}

// Sub-block ib: group k's two rows are qs[2 k] and qs[2 k + 1], its aux the u32 scales_signs[4 ib].
void ggml_decode_iq3_xxs(const uint8_t* blocks, int64_t n, float* out) {
  const auto aux = [](const BlockIQ3_XXS& b, int ib) { return load_u32(b.scales_signs + 4 * ib); };
  decode_superblocks<BlockIQ3_XXS>(
      blocks, n, out, [&](const auto& b, float d, int h) { return xxs_scale(d, aux(b, h / 2), 0.5f); },
      [&](const auto& b, float* y, float db, int k) {
        put_signed(y, db, iq3_rows(kIQ3XXSGrid, b.qs[2 * k], b.qs[2 * k + 1]), xxs_signs(aux(b, k / 4), k));
      });
}

// Sub-block ib (32 weights) has the scale nibble ib of `scales`; row r (0..63, 4 weights) is qs[r] with bit r % 8
// of qh[r / 8] as bit 8; group k has rows 2 k, 2 k + 1 and the sign byte signs[k].
void ggml_decode_iq3_s(const uint8_t* blocks, int64_t n, float* out) {
  const auto row = [](const BlockIQ3_S& b, int r) { return b.qs[r] | ((b.qh[r / 8] >> (r % 8)) & 1) << 8; };
  decode_superblocks<BlockIQ3_S>(
      blocks, n, out, [](const auto& b, float d, int h) { return d * float(1 + 2 * nibble_at(b.scales, h / 2)); },
      [&](const auto& b, float* y, float db, int k) {
        put_signed(y, db, iq3_rows(kIQ3SGrid, row(b, 2 * k), row(b, 2 * k + 1)), b.signs[k]);
      });
}

// Sub-block ib: the u16 w at qh[2 ib] holds its groups' 3 high row bits (bits 3 l .. 3 l + 2 over qs[4 ib + l]),
// the scale (bits 12..14) and the delta's sign (bit 15).
void ggml_decode_iq1_s(const uint8_t* blocks, int64_t n, float* out) {
  const auto word = [](const BlockIQ1_S& b, int ib) { return int(load_u16(b.qh + 2 * ib)); };
  decode_superblocks<BlockIQ1_S>(
      blocks, n, out, [&](const auto& b, float d, int h) { return d * float(2 * ((word(b, h / 2) >> 12) & 7) + 1); },
      [&](const auto& b, float* y, float dl, int k) {
        const int w = word(b, k / 4);
        put_iq1(y, dl, b.qs[k] | ((w >> (3 * (k % 4))) & 7) << 8, w >> 15);
      });
}

// Half h has the 3-bit scale at bit 3 (h % 4) of u16 scale word h / 4; group k takes nibble k % 2 of qh[k / 2]:
// its low 3 bits over qs[k] as the row, bit 3 the delta's sign.
void ggml_decode_iq1_m(const uint8_t* blocks, int64_t n, float* out) {
  decode_superblocks<BlockIQ1_M>(
      blocks, n, out,
      [](const auto& b, float d, int h) {
        return d * float(2 * ((load_u16(b.scales + 2 * (h / 4)) >> (3 * (h % 4))) & 7) + 1);
      },
      [](const auto& b, float* y, float dl, int k) {
        const int v = b.qh[k / 2] >> (4 * (k % 2));
        put_iq1(y, dl, b.qs[k] | (v & 7) << 8, v & 8);
      });
}

}  // namespace ktmoe
