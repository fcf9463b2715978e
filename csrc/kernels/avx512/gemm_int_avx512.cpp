// [NOTE] avx512 gemm_int8 / gemm_int4 over int8 activations (QuantizedRows):
//   kINT8, one group: c[m, j] = (sx[m] * s[n]) * (Σ_k u·xq − 128·Σ_k xq)
//   kINT8, groups:    c[m, j] = Σ_G (s[n,G]·sx[m,G])·( Σ_{k∈G} u·xq − 128·Σ_{k∈G} xq )  (fma per G;
//                     the activations have a scale per (row, group): kPerWeightGroup)
//   kINT4: c[m, j] = sx[m] * Σ_G d[n,G]·( Σ_{k∈G} u·xq − 64·Σ_{k∈G} xq )
// with n = 16b + j (packed_format.h).
//
// One tile loop serves both formats (IntGemm<Fmt>): a register tile of MR rows x
// NB blocks of int32 accumulators fed by vpdpbusd, the packed weights being the
// unsigned u8 operand and 4 activation bytes broadcast as the signed s8 dword
// ({1to16} memory operand). A "step" is one 64-byte zmm of a block:
//   kINT8: a k-quad (4 k), one vpdpbusd per row;
//   kINT4: a k-octet (8 k): low nibbles (and 0x0F) are quad 2j, high nibbles
//          (shift 4, and 0x0F) quad 2j+1, each looked up in the codebook's u
//          table (vpshufb), two vpdpbusd per row.
// The integer sums are exact (so their order is free); the float epilogue runs
// once per per-channel int8 matrix and once per group otherwise (subtract 128·Σxq or
// 64·Σxq, convert, fma s·sx or d into an fp32 accumulator) in the same order for every column, so the bits do not
// depend on the tile, the k-chunking or the (b0, b1) split. int32 is exact:
// vpdpbusd wraps mod 2^32 and the int8 result Σ (u − 128)·xq has |.| <= 127²·kp,
// which fits for kp < 130000 (int4 group sums are far smaller).
//
// Tiles: int8 like bf16 (NB = 4 -> MR <= 6, NB <= 2 -> MR <= 12); int4 holds an
// fp32 accumulator per int32 one and unpacks one block at a time, so NB = 4 ->
// MR <= 3, NB = 2 -> MR <= 6, NB = 1 -> MR <= 12 (measured: better than smaller
// tiles despite a few spills outside the inner loop); int4 decode rows take NB = 1
// tiles only (see kInt4PfSteps). Decode tiles (MR·NB <= 2;
// int4 also <= 4) split each column's int32 sum over 2 or 4 accumulator sets
// (even / odd step, low / high nibbles) so several vpdpbusd chains per column are
// in flight; the sets are added exactly, so the bits equal a single chain's.
#include <immintrin.h>

#include "kernels/avx512/avx512_common.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

struct IntCtx {
  const uint8_t* data;    // block 0 of the matrix
  int64_t bstride;        // bytes per block
  const uint8_t* scales;  // kINT8: float s[np]; kINT4: per (block, group) 16 bf16 d
  int64_t ngroups;        // kp / group
  int64_t steps_per_group;
  int64_t nsteps;         // steps of a block: kp / 4 (kINT8), kp / 8 (kINT4)
  QuantizedRows a;
  int64_t b0;
  float* c;
  int64_t ldc;
};

struct Int8Fmt {
  static constexpr WeightFormat kFormat = WeightFormat::kINT8;
  static constexpr int kKPerStep = 4;
  static constexpr bool kRowEpilogue = true;  // group = kp (per channel): finish() once per matrix
  static constexpr bool kRowScaleLast = false;  // groups: sx[m, G] is applied per group (group_end)
  static constexpr bool kOneBlockDecode = false;  // measured: one block per tile is no faster
  static constexpr int kMaxRows[5] = {0, 12, 12, 0, 6};
  template <int MR, int NB>
  static constexpr int kSets = MR * NB <= 2 ? 2 : 1;  // decode: even / odd quads

  // Step s of parity P (s & 1) accumulates into set P % S.
  template <int MR, int NB, int S, int kStride, int P>
  static inline void step(__m512i (&acc)[S][MR][NB], const uint8_t* w, int64_t bstride,
                          const ARows& a, int64_t s) {
    __m512i wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(w + j * bstride + s * 64);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512i xb = bcast32(a_at<kStride>(a, i, s, 4));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j)
        acc[P % S][i][j] = _mm512_dpbusd_epi32(acc[P % S][i][j], wv[j], xb);
    }
  }

  // acc[0] = Σ of the sets.
  template <int MR, int NB, int S>
  static inline void reduce(__m512i (&acc)[S][MR][NB]) {
#pragma GCC unroll 4
    for (int t = 1; t < S; ++t)
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)
          acc[0][i][j] = _mm512_add_epi32(acc[0][i][j], acc[t][i][j]);
  }

  // One group: y = (sx * s[n]) * float(Σ u·xq − 128·Σ xq)
  static inline __m512 finish(__m512i acc, float sx, int32_t gsum, const IntCtx& x,
                              int64_t block) {
    const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(x.scales) + block * 16);
    const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(gsum * 128)));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sx), s), dot);
  }

  // Groups: facc = fma(s[n,g] * sx[m,g], float(Σ u·xq − 128·Σ xq), facc) for rows m = m0 + i.
  template <int MR, int NB>
  static inline void group_end(__m512 (&facc)[MR][NB], const __m512i (&acc)[MR][NB],
                               const IntCtx& x, int64_t m0, const int32_t* gsum, int64_t gsum_ld,
                               int64_t b, int64_t g) {
    const float* sx = x.a.scale + m0 * x.ngroups;  // [MR, ngroups]
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(x.scales) + ((b + j) * x.ngroups + g) * 16);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512i off = _mm512_set1_epi32(128 * gsum[i * gsum_ld + g]);
        const __m512 sxs = _mm512_mul_ps(s, _mm512_set1_ps(sx[i * x.ngroups + g]));
        facc[i][j] = _mm512_fmadd_ps(sxs, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], off)), facc[i][j]);
      }
    }
  }
};

// int4 decode (rows <= kDecodeRows): a tile reads one block (kOneBlockDecode), one
// weight stream per thread, and prefetches it kInt4PfSteps steps (2 KiB) ahead. At
// 4.5 bits per weight one core decodes too slowly for 4 streams side by side to keep
// enough misses in flight. Measured (reference layer, T=1, Zen 5; ms per call, 1 / 2
// threads): 4 blocks 0.99 / 0.60, 4 blocks + prefetch 0.81-0.86 / 0.60, 1 block 0.76-0.79
// / 0.47-0.51, 1 block + prefetch 0.71-0.74 / 0.49-0.50 (2 blocks + prefetch 0.87-0.92 /
// 0.55-0.69). For bf16 one block per tile was 10-20 % slower, for int8 even.
constexpr int64_t kInt4PfSteps = 32;

struct Int4Fmt {
  static constexpr WeightFormat kFormat = WeightFormat::kINT4;
  static constexpr int kKPerStep = 8;
  static constexpr bool kRowEpilogue = false;
  static constexpr bool kRowScaleLast = true;  // y = sx[m] * Σ_G ... once all groups are in
  static constexpr bool kOneBlockDecode = true;  // see kInt4PfSteps
  static constexpr int kMaxRows[5] = {0, 12, 6, 0, 3};
  template <int MR, int NB>
  static constexpr int kSets = MR * NB <= 2 ? 4 : MR * NB <= 4 ? 2 : 1;

  // Low nibbles into set (2P) % S, high nibbles into set (2P + 1) % S, P = s & 1.
  // A nibble q becomes u = kInt4U8[q] with one vpshufb (the table in every lane).
  template <int MR, int NB, int S, int kStride, int P>
  static inline void step(__m512i (&acc)[S][MR][NB], const uint8_t* w, int64_t bstride,
                          const ARows& a, int64_t s) {
    // Block-outer: only one block's decoded levels are live (registers go to
    // the int32 + fp32 accumulators); the activation dwords are {1to16} operands.
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kInt4U8)));
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if constexpr (MR <= kDecodeRows)
        _mm_prefetch(reinterpret_cast<const char*>(w + j * bstride + (s + kInt4PfSteps) * 64), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(w + j * bstride + s * 64);
      const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nib));
      const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const uint8_t* xq = a_at<kStride>(a, i, s, 8);
        constexpr int kLo = (2 * P) % S, kHi = (2 * P + 1) % S;
        acc[kLo][i][j] = _mm512_dpbusd_epi32(acc[kLo][i][j], lo, bcast32(xq));
        acc[kHi][i][j] = _mm512_dpbusd_epi32(acc[kHi][i][j], hi, bcast32(xq + 4));
      }
    }
  }

  template <int MR, int NB, int S>
  static inline void reduce(__m512i (&acc)[S][MR][NB]) {
    Int8Fmt::reduce<MR, NB, S>(acc);
  }

  // facc += d · float(Σ u·xq − 64·Σ xq) (the row scales sx come last)
  template <int MR, int NB>
  static inline void group_end(__m512 (&facc)[MR][NB], const __m512i (&acc)[MR][NB],
                               const IntCtx& x, int64_t, const int32_t* gsum, int64_t gsum_ld,
                               int64_t b, int64_t g) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m512 d = bf16x16_to_f32(x.scales + ((b + j) * x.ngroups + g) * kInt4ScaleBytes);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512i off = _mm512_set1_epi32(kInt4Offset * gsum[i * gsum_ld + g]);
        facc[i][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], off)), facc[i][j]);
      }
    }
  }
};

template <class F>
struct IntGemm {
  using Ctx = IntCtx;
  static constexpr const int (&kMaxRows)[5] = F::kMaxRows;
  static constexpr int64_t kABytesPerStep = F::kKPerStep;
  static constexpr bool kOneBlockDecode = F::kOneBlockDecode;
  // kChunkABytes of activations, rounded down to whole groups (at least one).
  static int64_t chunk_steps(const Ctx& x) {
    const int64_t g = x.steps_per_group, c = kChunkABytes / kABytesPerStep;
    return c > g ? c / g * g : g;
  }

  template <int MR, int NB, int S>
  static inline void zero(__m512i (&acc)[S][MR][NB]) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[s][i][j] = _mm512_setzero_si512();
  }

  // steps [s0, s1) into acc[0] (F::reduce folds the S accumulator sets into set
  // 0; s0 and s1 are even: kp / 4, group / 8 and the chunks are multiples of 4).
  template <int MR, int NB, int S, int kStride>
  static inline void steps(__m512i (&acc)[S][MR][NB], const uint8_t* w, const Ctx& x,
                           const ARows& a, int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s += 2) {
      F::template step<MR, NB, S, kStride, 0>(acc, w, x.bstride, a, s);
      F::template step<MR, NB, S, kStride, 1>(acc, w, x.bstride, a, s + 1);
    }
    F::reduce(acc);
  }

  // Rows [m0, m0+MR) x blocks [b, b+NB) x steps [s0, s1). Partials between
  // k-chunks live in c: int32 bits of Σ u·xq (kINT8), the fp32 group sum (kINT4).
  template <int MR, int NB, int kStride>
  __attribute__((noinline)) static void tile(const Ctx& x, const ARows& a, int64_t m0, int64_t b,
                                             int64_t s0, int64_t s1) {
    constexpr int S = F::template kSets<MR, NB>;
    const uint8_t* w = x.data + b * x.bstride;
    const int32_t* gsum = x.a.gsum + m0 * x.a.gsum_ld;
    float* c = x.c + m0 * x.ldc + (b - x.b0) * 16;
    const bool last = s1 == x.nsteps;

    if (F::kRowEpilogue && x.ngroups == 1) {  // the per-row epilogue (int8 per channel)
      __m512i acc[S][MR][NB];
      zero(acc);
      if (s0 > 0) {
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[0][i][j] = _mm512_loadu_si512(c + i * x.ldc + j * 16);
      }
      steps<MR, NB, S, kStride>(acc, w, x, a, s0, s1);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          float* cij = c + i * x.ldc + j * 16;
          if constexpr (F::kRowEpilogue) {
            if (last)
              _mm512_storeu_ps(cij, F::finish(acc[0][i][j], x.a.scale[m0 + i], gsum[i * x.a.gsum_ld],
                                              x, b + j));
            else
              _mm512_storeu_si512(cij, acc[0][i][j]);
          }
        }
      }
    } else {
      __m512 facc[MR][NB];
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)
          facc[i][j] = s0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * x.ldc + j * 16);
      const int64_t spg = x.steps_per_group;
      for (int64_t g = s0 / spg; g < s1 / spg; ++g) {
        __m512i acc[S][MR][NB];
        zero(acc);
        steps<MR, NB, S, kStride>(acc, w, x, a, g * spg, (g + 1) * spg);
        F::template group_end<MR, NB>(facc, acc[0], x, m0, gsum, x.a.gsum_ld, b, g);
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const bool scale_row = F::kRowScaleLast && last;
        const __m512 sx = _mm512_set1_ps(scale_row ? x.a.scale[m0 + i] : 1.f);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)  // kRowScaleLast: y = sx * facc once all groups are in
          _mm512_storeu_ps(c + i * x.ldc + j * 16,
                           scale_row ? _mm512_mul_ps(sx, facc[i][j]) : facc[i][j]);
      }
    }
  }
};

template <class F>
void gemm_int(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp;
  const int64_t group = w->group;  // kINT8 per channel: kp
  const IntCtx ctx{packed_data(w), block_data_bytes(F::kFormat, kp), packed_scales(w), kp / group,
                   group / F::kKPerStep, kp / F::kKPerStep, a, b0, c, ldc};
  run_tiles<IntGemm<F>>(ctx, reinterpret_cast<const uint8_t*>(a.q), a.ldq, m, b0, b1);
}

}  // namespace

// w: kINT8 matrix; a: M int8 rows (kp columns) with scales and group sums per (row,
// group); c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_int8(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  gemm_int<Int8Fmt>(w, a, m, b0, b1, c, ldc);
}

// w: kINT4 matrix (group = w->group); a: M int8 rows with kp / group sums per row.
void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  gemm_int<Int4Fmt>(w, a, m, b0, b1, c, ldc);
}

}  // namespace avx512
}  // namespace ktmoe
