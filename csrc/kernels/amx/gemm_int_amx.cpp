// [NOTE] amx gemm_int8 / gemm_int4. Per-channel kINT8 (group = kp) runs tdpbsud tiles (gemm_amx.h over
// NativeTileOps) for prefill rows, avx512's vpdpbusd register tiles below prefill_min_rows() (prefill_rows.h):
// tdpbsud multiplies the signed int8 activations (tile A) by the unsigned weight bytes (tile B), and a kINT8
// k-quad row of a block (16 columns x 4 u8) is one 64-byte tile row as stored.
// kINT8 with groups (group < kp, the default 32) runs avx512's kernel: its activations carry a scale per
// (row, group), and a group of 32 is half of an int8 tile step (64 k), so the tiles would need int4's half
// steps and an epilogue per group through the C buffer.
// kINT4 runs avx512's kernel whatever m: its tile version (codes unpacked per block to u = kInt4U8[q] in the
// k-quad layout, one 8-row B tile per 32-k group) ends every 32-k step in the per-group epilogue over the C tiles
// (a tile store and a pass over 16 x 16 values per group). With that epilogue scalar it took 63 / 153 ms at
// T = 256 / 512 on the reference layer against avx512's 9.1 / 15.9 ms on a 16-core Xeon with AMX (2026-12-04,
// benchmarks/measured/device_amx_2026-12-04.log); vectorized, 86.8 ms against avx512's 79.7 at T = 512 on 2 Xeon
// threads (2026-12-06, `bench_amx --tokens 512 --formats int4`): still slower. The tile code stays
// (gemm_int_tiles<TileFormat::kINT4>, tested on the emulator and, where the CPU has AMX, on tiles).
#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_native.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();
}  // namespace avx512

namespace amx {

// w: kINT8 matrix; a: M int8 rows (kp columns) with scales and group sums per (row, group);
// c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  if (m < prefill_min_rows() || w->group != w->kp) return avx512::gemm_int8(w, a, m, b0, b1, c, ldc);
  gemm_int_tiles<NativeTileOps>(TileFormat::kINT8, w, a, m, b0, b1, c, ldc);
}

// w: kINT4 matrix (group = w->group); a: M int8 rows with kp / group sums per row. avx512's (see the note).
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  avx512::gemm_int4(w, a, m, b0, b1, c, ldc);
}

}  // namespace amx
}  // namespace ktmoe
