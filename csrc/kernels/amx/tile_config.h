// [NOTE] The AMX tile configuration (LDTILECFG's 64-byte memory image, palette 1) and the one
// tile layout every amx gemm uses, shared by the real instructions (tile_ops_native.h) and
// the emulator (tile_ops_emulated.h). Plain C++, no ISA flags.
//
// Palette 1 has 8 tiles (tmm0..tmm7) of up to 16 rows x 64 bytes. The gemms use them as
// a 2 x 2 register tile of accumulators:
//   tmm0..3  C[i][j]: rows 16i..16i+15 of the row pair x packed block j of the block pair,
//            16 rows x 16 fp32 / int32 (64 bytes)
//   tmm4, 5  A[i]: 16 activation rows x kAColsb bytes (the k-slice of one step)
//   tmm6, 7  B[j]: kBRows rows of 64 bytes, one packed block's k-slice: a kBF16 k-pair row
//            (16 columns x 2 bf16) or a kINT8 k-quad row (16 columns x 4 u8), as stored
//            (packed_format.h), so B tiles load straight from the packed bytes.
// One step (one tdp* per C tile) covers kp/32 (bf16: 16 pairs, kAColsb 64, kBRows 16),
// 64 int8 k (kAColsb 64, kBRows 16) or 32 int8 k (kINT4 groups: kAColsb 32, kBRows 8).
#pragma once
#include <cstdint>

namespace ktmoe {
namespace amx {

struct TileConfig {  // LDTILECFG memory operand, palette 1
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved0[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tmm0..7 (8..15 reserved, 0)
  uint8_t rows[16] = {};    // rows of tmm0..7
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;
constexpr int tile_c(int i, int j) { return 2 * i + j; }  // i: row group, j: block
constexpr int tile_a(int i) { return 4 + i; }
constexpr int tile_b(int j) { return 6 + j; }

// The layout above with A tiles of a_colsb bytes per row and B tiles of b_rows rows.
inline TileConfig gemm_tile_config(int a_colsb, int b_rows) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.rows[t] = kMaxRows, c.colsb[t] = kMaxColsb;
  for (int i = 0; i < 2; ++i) c.rows[tile_a(i)] = kMaxRows, c.colsb[tile_a(i)] = uint16_t(a_colsb);
  for (int j = 0; j < 2; ++j) c.rows[tile_b(j)] = uint8_t(b_rows), c.colsb[tile_b(j)] = kMaxColsb;
  return c;
}

}  // namespace amx
}  // namespace ktmoe
