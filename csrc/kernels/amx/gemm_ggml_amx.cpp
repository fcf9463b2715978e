// [NOTE] amx gemm_ggml: GGML rows where they lie (isa_kernels.h's contract) on tdpbf16ps tiles for prefill
// rows (m >= ggml_prefill_min_rows(), 10: prefill_rows.h says why) of the types ggml_tile_rows.cpp decodes
// (q8_0, q4_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_xs, iq4_nl, mxfp4); below them, and for the other types,
// avx512's gemm_ggml_int16 (q4_K, q5_K, q6_K, iq4_xs on int16 activations by vpdpwssd, whose [NOTE]
// says why; the rest avx512's gemm_ggml).
// Per pass of up to 32 activation rows: the rows as k-pair B tiles (a 16 x 16 dword transpose per 32 inputs
// of 16 tokens) and, for types with mins, their group sums (ggml_tiles.h's activation_group_sums); then
// ggml_tiles.h's loop nest decodes each pair of 16 weight rows once and runs them against both token groups.
// Bits: ggml_tiles.h's (per output, its weight row and token row only).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/amx/ggml_tiles.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_native.h"
#include "kernels/avx512/amx_entry_points.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();
}  // namespace avx512

namespace amx {
namespace {

// r[i] = row i of a 16 x 16 dword matrix -> r[j] = its column j.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + q], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + q
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i a0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), a1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xDD);
    const __m512i b0 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88);
    const __m512i b1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xDD);
    r[q] = _mm512_shuffle_i32x4(a0, b0, 0x88);
    r[4 + q] = _mm512_shuffle_i32x4(a1, b1, 0x88);
    r[8 + q] = _mm512_shuffle_i32x4(a0, b0, 0xDD);
    r[12 + q] = _mm512_shuffle_i32x4(a1, b1, 0xDD);
  }
}

struct TilesScratch {
  std::vector<__m512i> pairs;
  std::vector<float> xsum;
};
thread_local TilesScratch tl;

// a: bf16 rows [m <= 32, lda] -> the ActivationTiles of ggml_tiles.h (k a multiple of 32).
ActivationTiles activation_tiles(const uint16_t* a, int64_t lda, int64_t m, int64_t k, const GgmlTileRows& type) {
  const int64_t ntg = (m + 15) / 16, ngroups = k / type.group;
  tl.pairs.resize(size_t(ntg * k / 2));
  uint8_t* pairs = reinterpret_cast<uint8_t*>(tl.pairs.data());
  const int64_t tg_bytes = k / 2 * 64;
  for (int64_t tg = 0; tg < ntg; ++tg)
    for (int64_t j0 = 0; j0 < k / 2; j0 += 16) {  // 16 k-pairs (32 inputs) of 16 tokens
      __m512i r[16];
      for (int t = 0; t < 16; ++t) {
        const int64_t tok = 16 * tg + t;
        r[t] = tok < m ? _mm512_loadu_si512(a + tok * lda + 2 * j0) : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_store_si512(pairs + tg * tg_bytes + (j0 + j) * 64, r[j]);
    }
  float* xsum = nullptr;
  if (type.mins) {
    tl.xsum.resize(size_t(ntg * ngroups * 16));
    xsum = tl.xsum.data();
    activation_group_sums(pairs, tg_bytes, ntg, k, type.group, xsum);
  }
  return {pairs, tg_bytes, xsum, ntg};
}

}  // namespace

// w: n rows of row_bytes (k inputs of `type`); a: bf16 rows [m, lda]; c[r * ldc + i], r < m, i < n.
void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  const GgmlTileRows* rows = m >= ggml_prefill_min_rows() ? ggml_tile_rows(type.id) : nullptr;
  if (rows == nullptr) return avx512::gemm_ggml_int16(type, w, row_bytes, n, k, a, lda, m, c, ldc);
  for (int64_t r0 = 0; r0 < m; r0 += 32) {
    const int64_t mt = std::min<int64_t>(32, m - r0);
    const ActivationTiles x = activation_tiles(a + r0 * lda, lda, mt, k, *rows);
    gemm_ggml_tiles<NativeTileOps>(*rows, w, row_bytes, n, k, x, mt, c + r0 * ldc, ldc);
  }
}

}  // namespace amx
}  // namespace ktmoe
