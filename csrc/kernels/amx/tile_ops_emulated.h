// [NOTE] A plain C++ AMX emulator with the TileOps interface of tile_ops_native.h, so the
// amx gemm templates run (and are tested bit for bit) on any CPU. No ISA flags.
//
// State per thread, as the hardware's: the configuration and a register file of 8 tiles
// of 1 KiB (16 rows x 64 bytes). Semantics follow the pseudo-code of Intel's SDM:
//   ldtilecfg   palette 1 only; every tile zeroed. tilerelease: unconfigured, zeroed.
//   tileloadd   rows[t] rows of colsb[t] bytes from base + r*stride; the rest of the tile 0.
//   tilestored  rows[t] rows of colsb[t] bytes to base + r*stride.
//   tdpbf16ps   per row m of C: two fp32 temporaries per column n (even and odd bf16 of the
//               pairs), each an FMA chain over the k-pairs of A's row (k ascending),
//               then C[m][n] += (even + odd); every step RNE, DAZ on inputs, FTZ on
//               results, MXCSR ignored.
//   tdpbsud     C[m][n] += Σ_k Σ_{i<4} s8(A[m][4k+i]) · u8(B[k][4n+i]), int32 wrap-around.
// The operand shapes are checked as the instructions' #UD conditions (C rows = A rows,
// A colsb / 4 = B rows, B colsb = C colsb): a mismatch throws std::logic_error.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/amx/tile_config.h"

namespace ktmoe {
namespace amx {

struct EmulatedTileOps {
  struct State {
    TileConfig cfg;
    bool configured = false;
    alignas(64) uint8_t t[kTiles][kMaxRows * kMaxColsb];
  };
  static State& st() {
    static thread_local State s;
    return s;
  }
  [[noreturn]] static void fail(const std::string& what) {
    throw std::logic_error("amx emulator: " + what);
  }
  static void check_tile(int tile, const char* op) {
    if (!st().configured) fail(std::string(op) + " without a tile configuration (ldtilecfg)");
    if (st().cfg.rows[tile] == 0 || st().cfg.colsb[tile] == 0)
      fail(std::string(op) + ": tmm" + std::to_string(tile) + " is not configured");
  }

  static void configure(const TileConfig& c) {
    if (c.palette_id != 1) fail("palette " + std::to_string(c.palette_id) + " (only 1 is emulated)");
    if (c.start_row != 0) fail("start_row must be 0");
    for (int t = 0; t < 16; ++t) {
      const bool used = t < kTiles && c.rows[t] != 0;
      if (used && (c.rows[t] > kMaxRows || c.colsb[t] > kMaxColsb || c.colsb[t] == 0))
        fail("tmm" + std::to_string(t) + " shape " + std::to_string(c.rows[t]) + " x " +
             std::to_string(c.colsb[t]) + " bytes exceeds 16 x 64");
      if (!used && (c.colsb[t] != 0 || (t >= kTiles && c.rows[t] != 0)))
        fail("tile " + std::to_string(t) + ": unused tiles must have rows = colsb = 0");
    }
    st().cfg = c;
    st().configured = true;
    std::memset(st().t, 0, sizeof(st().t));
  }
  static void release() {
    st().configured = false;
    std::memset(st().t, 0, sizeof(st().t));
  }

  template <int T>
  static void zero() {
    check_tile(T, "tilezero");
    std::memset(st().t[T], 0, sizeof(st().t[T]));
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    check_tile(T, "tileloadd");
    uint8_t* t = st().t[T];
    std::memset(t, 0, sizeof(st().t[T]));
    for (int r = 0; r < st().cfg.rows[T]; ++r)
      std::memcpy(t + r * kMaxColsb, static_cast<const uint8_t*>(base) + r * stride, st().cfg.colsb[T]);
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    check_tile(T, "tilestored");
    for (int r = 0; r < st().cfg.rows[T]; ++r)
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, st().t[T] + r * kMaxColsb, st().cfg.colsb[T]);
  }

  // Denormal inputs read as zero (DAZ); denormal results flush to zero (FTZ).
  static float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x; }
  static float bf16_in(const uint8_t* p) {
    uint32_t u = uint32_t(p[0] | (p[1] << 8)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return daz(f);
  }
  static float f32_at(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }

  template <int C, int A, int B>
  static void dpbf16ps() {
    const int m_rows = shapes<C, A, B>("tdpbf16ps");
    const TileConfig& cfg = st().cfg;
    const int kpairs = cfg.colsb[A] / 4, ncols = cfg.colsb[C] / 4;
    for (int m = 0; m < m_rows; ++m) {
      float even[16] = {}, odd[16] = {};
      for (int k = 0; k < kpairs; ++k)
        for (int n = 0; n < ncols; ++n) {
          const uint8_t* a = st().t[A] + m * kMaxColsb + 4 * k;
          const uint8_t* b = st().t[B] + k * kMaxColsb + 4 * n;
          even[n] = daz(std::fma(bf16_in(a), bf16_in(b), even[n]));
          odd[n] = daz(std::fma(bf16_in(a + 2), bf16_in(b + 2), odd[n]));
        }
      uint8_t* row = st().t[C] + m * kMaxColsb;
      for (int n = 0; n < ncols; ++n) {
        const float sum = daz(even[n] + odd[n]);
        const float out = daz(daz(f32_at(row + 4 * n)) + sum);
        std::memcpy(row + 4 * n, &out, 4);
      }
      std::memset(row + 4 * ncols, 0, size_t(kMaxColsb - 4 * ncols));
    }
    std::memset(st().t[C] + m_rows * kMaxColsb, 0, size_t((kMaxRows - m_rows) * kMaxColsb));
  }

  template <int C, int A, int B>
  static void dpbsud() {
    const int m_rows = shapes<C, A, B>("tdpbsud");
    const TileConfig& cfg = st().cfg;
    const int kquads = cfg.colsb[A] / 4, ncols = cfg.colsb[C] / 4;
    for (int m = 0; m < m_rows; ++m) {
      uint8_t* row = st().t[C] + m * kMaxColsb;
      for (int n = 0; n < ncols; ++n) {
        uint32_t acc;
        std::memcpy(&acc, row + 4 * n, 4);
        for (int k = 0; k < kquads; ++k) {
          const uint8_t* a = st().t[A] + m * kMaxColsb + 4 * k;
          const uint8_t* b = st().t[B] + k * kMaxColsb + 4 * n;
          int32_t dot = 0;  // |4 products| <= 4 * 128 * 255: exact
          for (int i = 0; i < 4; ++i) dot += int32_t(int8_t(a[i])) * int32_t(b[i]);
          acc += uint32_t(dot);
        }
        std::memcpy(row + 4 * n, &acc, 4);
      }
      std::memset(row + 4 * ncols, 0, size_t(kMaxColsb - 4 * ncols));
    }
    std::memset(st().t[C] + m_rows * kMaxColsb, 0, size_t((kMaxRows - m_rows) * kMaxColsb));
  }

 private:
  // The #UD shape checks of the tile dot products; returns C's rows.
  template <int C, int A, int B>
  static int shapes(const char* op) {
    static_assert(C != A && C != B && A != B, "tile dot operands must be distinct tiles");
    check_tile(C, op), check_tile(A, op), check_tile(B, op);
    const TileConfig& c = st().cfg;
    if (c.rows[A] != c.rows[C] || c.colsb[A] / 4 != c.rows[B] || c.colsb[B] != c.colsb[C] ||
        c.colsb[A] % 4 || c.colsb[C] % 4)
      fail(std::string(op) + ": shapes C " + std::to_string(c.rows[C]) + "x" + std::to_string(c.colsb[C]) +
           ", A " + std::to_string(c.rows[A]) + "x" + std::to_string(c.colsb[A]) + ", B " +
           std::to_string(c.rows[B]) + "x" + std::to_string(c.colsb[B]) + " do not chain");
    return c.rows[C];
  }
};

}  // namespace amx
}  // namespace ktmoe
