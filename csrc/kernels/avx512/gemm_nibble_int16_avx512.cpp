// [NOTE] avx512 int16 gemms of the nibble formats (kINT4A's data layout): kMXFP4 and kINT4A by
// int16 activations per block of 32 inputs and exact int32 dots (vpdpwssd). The amx table runs them
// for the rows below its tiles (kernels_amx.cpp).
//   kMXFP4 (gemm_mxfp4_int16): mxfp4_format.h's integer evaluation, the bits of generic's and avx2's:
//     c[m, n] = Σ_j (float(d_j) · 2^-(s_j + 1)) · 2^(e[n, G(j)] - 127),  d_j = Σ_{k∈j} x[m][k] · 2e2m1(q[n][k])
//     (each product rounded before the add, out from +0, blocks j ascending).
//   kINT4A (gemm_int4_affine_int16): w = s·(q - z) per (column, k-group G):
//     c[m, n] = Σ_G s[n,G] · acc_G,  acc_G = Σ_{j∈G} float(d_j - 2z[n,G]·X_j) · 2^-(s_j + 1)
//     with d_j = Σ_{k∈j} x·2q and X_j = Σ_{k∈j} x (exact int32; |d_j - 2z·X_j| <= 2^24, so exact
//     in fp32 too), acc_G from +0, out = fma(s, acc_G, out) from +0. Its own bits: avx512's bf16
//     kernel sums fp32 products of the unrounded activations (both within the tests' bound, which
//     adds the int16 activations' rounding).
// x = round_half_even(a · 2^s_j), s_j = mxfp4_block_shift (|x| <= 2^14: every |a| >= 2^-6 of the
// block's largest is exact, a smaller one rounded by at most 2^-14 of it); a block holding Inf or
// NaN: x = 0 and the scale NaN, so its row's outputs are NaN.
//
// Why: on Intel's AMX cores vdpbf16ps costs about 2 cycles of port 5 (12 independent ones: 25.7
// cycles; vpdpwssd 6.6: two a cycle), the port vpermw's decode needs too, so avx512's bf16 decode
// of these formats (one vdpbf16ps per 32 weights and row) is bound by its instructions there (12-13
// GB/s a core from L2, below). Here the dot is vpdpwssd (int16 pairs into int32), which leaves port
// 5 to the decode. Zen 4 keeps the bf16 decode (95 % of its read roof for mxfp4).
//
// Per k-quad (32 bytes, 16 columns x 4 inputs) and block of the tile:
//   vpmovzxbw   v = the bytes as words: word 2n + k%2 holds column n's inputs (4t + k%2) low
//               nibble and (4t + 2 + k%2) high nibble, the pair layout of a broadcast x pair
//   vpermw      lo = T[v & 31]; vpsrlw v >> 4, vpermw: hi = T[v >> 4]   (T[i] = 2e2m1(i % 16) or 2(i % 16))
//   per row     vpdpwssd dot += lo · (x[4t], x[4t+1]); vpdpwssd dot += hi · (x[4t+2], x[4t+3])
// Block end (every 8 k-quads): the format's (above), its scales built once per block and group.
// Tiles: MR rows x NB blocks with out in registers over all inputs, every weight byte read once;
// NB = 4 for one row, 2 for 2-4 rows (MR x NB int32 dots + fp32 outs (+ accs) + 2 NB decoded planes
// fit the 32 zmm). No software prefetch: benchmarks/micro/fp8_decode_micro.cpp (cold, M = 1,
// reference shape, 2-core Xeon with AMX, mxfp4) read at 79-81 % of the read roof without, 77-78 /
// 70-71 / 74-75 % with each stream's line 2 / 4 / 8 KiB ahead in L2 (gemm<P, kAhead> takes one); 2 or
// 1 blocks side by side instead of 4: 67-72 % / 55-71 %; avx512's bf16 decode 72-76 %. Hot (in L2)
// 19-20 GB/s a core against the bf16 decode's 12: port 5 still takes vpmovzxbw + 2 vpermw per 32
// bytes, the bound now.
#include <immintrin.h>

#include <algorithm>

#include "kernels/avx512/amx_entry_points.h"
#include "kernels/avx512/avx512_common.h"
#include "kernels/avx512/int16_activations.h"
#include "kernels/int4_affine_format.h"
#include "kernels/isa_kernels.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace avx512 {
namespace {

constexpr int64_t kQuadsPerBlock = kMxfp4Group / 4;  // k-quads in a block of 32 inputs
constexpr int64_t kInt16Ahead = 0;                    // weight prefetch distance (bytes, into L2; 0: none)
constexpr int64_t kRowChunk = 64;                     // rows quantized at a time (bounds the scratch)

// The weights as the tiles read them.
struct NibbleMatrix {
  const uint8_t* data;    // block 0
  const uint8_t* scales;  // block 0, group 0
  int64_t bstride;        // bytes of one packed block's data
  int64_t ngroups, blocks_per_group;  // group g holds input blocks [g, g + 1) * blocks_per_group (group / 32)
};

// A format's policy: its table (entry i: the int16 weight of code i % 16), its (block, group) scale
// record and what a block's and a group's end do with the dots (see the note).
struct Mxfp4Int16 {
  static constexpr int64_t kRecordBytes = kMxfp4ScaleRecordBytes;
  static const int16_t* table() { return kMxfp4I16.v; }
  struct Scales {
    __m512 sw;  // 2^(e - 127)
  };
  static Scales scales(const uint8_t* rec) { return {e8m0_to_f32x16(rec)}; }
  static void block_end(const Scales& g, __m512i dot, __m512 sx, int32_t, __m512&, __m512& out) {
    out = _mm512_add_ps(out, rounded(_mm512_mul_ps(rounded(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), sx)), g.sw)));
  }
  static void group_end(const Scales&, __m512&, __m512&) {}
};

struct Int4AffineInt16 {
  static constexpr int64_t kRecordBytes = kInt4AffineRecordBytes;
  static const int16_t* table() { return kInt4AffineI16.v; }
  struct Scales {
    __m512 s;
    __m512i z2;  // 2z
  };
  static Scales scales(const uint8_t* rec) {
    const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kInt4AffineZeroAt));
    return {_mm512_loadu_ps(rec), _mm512_slli_epi32(_mm512_cvtepu8_epi32(z), 1)};
  }
  static void block_end(const Scales& g, __m512i dot, __m512 sx, int32_t xsum, __m512& acc, __m512&) {
    const __m512i d = _mm512_sub_epi32(dot, _mm512_mullo_epi32(g.z2, _mm512_set1_epi32(xsum)));
    acc = _mm512_add_ps(acc, rounded(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sx)));
  }
  static void group_end(const Scales& g, __m512& acc, __m512& out) {
    out = _mm512_fmadd_ps(g.s, acc, out);
    acc = _mm512_setzero_ps();
  }
};

// Rows [r, r + MR) of q x packed blocks [b, b + NB), all inputs; c: row r's 16·NB outputs, rows ldc apart.
template <class P, int MR, int NB, int64_t kAhead>
__attribute__((noinline)) void tile(const NibbleMatrix& w, const QuantRows& q, int64_t r, int64_t b, float* c,
                                    int64_t ldc) {
  const __m512i table = _mm512_load_si512(P::table());
  const uint8_t* wb = w.data + b * w.bstride;
  const int16_t* x = q.x + r * q.kp;
  __m512 out[MR][NB], acc[MR][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int jb = 0; jb < NB; ++jb) out[i][jb] = acc[i][jb] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.ngroups; ++g) {
    typename P::Scales sc[NB];
#pragma GCC unroll 4
    for (int jb = 0; jb < NB; ++jb) sc[jb] = P::scales(w.scales + ((b + jb) * w.ngroups + g) * P::kRecordBytes);
    for (int64_t j = g * w.blocks_per_group; j < (g + 1) * w.blocks_per_group; ++j) {
      __m512i dot[MR][NB];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int jb = 0; jb < NB; ++jb) dot[i][jb] = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int64_t t = j * kQuadsPerBlock; t < (j + 1) * kQuadsPerBlock; ++t) {
        const uint8_t* wt = wb + t * 32;
        if (kAhead > 0 && t % 2 == 0)
#pragma GCC unroll 4
          for (int jb = 0; jb < NB; ++jb)
            _mm_prefetch(reinterpret_cast<const char*>(wt + jb * w.bstride + kAhead), _MM_HINT_T1);
        __m512i lo[NB], hi[NB];
#pragma GCC unroll 4
        for (int jb = 0; jb < NB; ++jb) {
          const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + jb * w.bstride)));
          lo[jb] = _mm512_permutexvar_epi16(v, table);
          hi[jb] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table);
        }
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512i xl = bcast32(x + i * q.kp + 4 * t), xh = bcast32(x + i * q.kp + 4 * t + 2);
#pragma GCC unroll 4
          for (int jb = 0; jb < NB; ++jb)
            dot[i][jb] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(dot[i][jb], lo[jb], xl), hi[jb], xh);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512 sx = _mm512_set1_ps(q.scale[(r + i) * q.nj + j]);
        const int32_t xsum = q.xsum[(r + i) * q.nj + j];
#pragma GCC unroll 4
        for (int jb = 0; jb < NB; ++jb) P::block_end(sc[jb], dot[i][jb], sx, xsum, acc[i][jb], out[i][jb]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int jb = 0; jb < NB; ++jb) P::group_end(sc[jb], acc[i][jb], out[i][jb]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int jb = 0; jb < NB; ++jb) _mm512_storeu_ps(c + i * ldc + jb * 16, out[i][jb]);
}

// Rows [r, r + MR) x blocks [b0, b1): tiles of 4 blocks for one row, then 2, then 1.
template <class P, int MR, int64_t kAhead>
void row_tile(const NibbleMatrix& w, const QuantRows& q, int64_t r, int64_t b0, int64_t b1, float* c, int64_t ldc) {
  int64_t b = b0;
  if constexpr (MR == 1)
    for (; b + 4 <= b1; b += 4) tile<P, MR, 4, kAhead>(w, q, r, b, c + (b - b0) * 16, ldc);
  for (; b + 2 <= b1; b += 2) tile<P, MR, 2, kAhead>(w, q, r, b, c + (b - b0) * 16, ldc);
  for (; b < b1; ++b) tile<P, MR, 1, kAhead>(w, q, r, b, c + (b - b0) * 16, ldc);
}

// The gemm of format P with the weight prefetch kAhead bytes ahead (benchmarks/micro/fp8_decode_micro.cpp
// varies it). w: a P matrix [np, kp]; a: bf16 rows [m, lda]; c: fp32 [m, ldc].
template <class P, int64_t kAhead>
void gemm(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1, float* c,
          int64_t ldc) {
  if (m <= 0 || b1 <= b0) return;
  const int64_t kp = w->kp, chunk = std::min(m, kRowChunk);
  const NibbleMatrix wt{packed_data(w), packed_scales(w), int4a_block_data_bytes(kp), kp / w->group,
                        w->group / kMxfp4Group};
  static thread_local Scratch buf;
  const QuantRows q = quant_rows(buf, chunk, kp);
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    quantize(a + r0 * lda, lda, rows, q);
    float* cr = c + r0 * ldc;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) row_tile<P, 4, kAhead>(wt, q, r, b0, b1, cr + r * ldc, ldc);
    switch (rows - r) {
      case 3: row_tile<P, 3, kAhead>(wt, q, r, b0, b1, cr + r * ldc, ldc); break;
      case 2: row_tile<P, 2, kAhead>(wt, q, r, b0, b1, cr + r * ldc, ldc); break;
      case 1: row_tile<P, 1, kAhead>(wt, q, r, b0, b1, cr + r * ldc, ldc); break;
      default: break;
    }
  }
}

}  // namespace

// w: kMXFP4 matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero past k); c: fp32 [m, ldc], columns
// 0 .. 16*(b1-b0) written. Every weight byte is read once per 4 rows: meant for decode rows.
void gemm_mxfp4_int16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc) {
  gemm<Mxfp4Int16, kInt16Ahead>(w, a, lda, m, b0, b1, c, ldc);
}

// w: kINT4A matrix [np, kp]; a, c as gemm_mxfp4_int16.
void gemm_int4_affine_int16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                            int64_t b1, float* c, int64_t ldc) {
  gemm<Int4AffineInt16, kInt16Ahead>(w, a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx512
}  // namespace ktmoe
