// [NOTE] The avx512 tile loops of the bf16-activation formats whose weights are decoded
// to bf16 in registers and scaled per (column, k-group): kFP8 (gemm_fp8_avx512.cpp), kINT4A
// (gemm_int4_affine_avx512.cpp) and kMXFP4 (gemm_mxfp4_avx512.cpp). One set of templates, one
// decoder per format; the two nibble formats share their decode half (NibbleSteps).
//
// A decoder turns one "step" of a block (2 k-pairs: 64 bytes of e4m3, 32 bytes of nibbles)
// into 2 zmm of bf16 in the VNNI pair layout vdpbf16ps reads, and gives each (block,
// group) its 16 scales (and, with kRowSums, 16 offsets o, multiplied by the row's Σ a of
// the group). Its interface:
//   kRowSums                        whether group_end adds o * xsum[row][g]
//   kStepBytes                      bytes of one step of a block (2 k-pairs)
//   Step<NB> step(w, bstride, p)    the step at k-pair p (even) of blocks w, w + bstride, ...
//   __m512i pair(st, h, j)          k-pair p + h (h = 0, 1) of block j, as bf16
//   void pairs(w, n, out)           n (even) k-pairs of one block from w -> n zmm at out
//   __m512 scale(b, g), offset(b, g)  the 16 columns' s (and o) of block b, group g
//
// Accumulation, identical in every path, per column: for each k-group G, acc = +0, one
// vdpbf16ps per k-pair of G in k order (a chain), then out = fma(s, acc, out) (out = +0
// before the first group) and, with kRowSums, out = fma(o, xsum_G, out). So the bits
// depend neither on (b0, b1) nor on M.
//
// Decode rows (m <= 8): register tiles of m rows x NB blocks side by side (NB = 4 for
// m <= 4, else 2; then 2 / 1 for the last blocks), the weights decoded in registers and
// read exactly once, NB weight streams and m x NB accumulator chains in flight; a
// column's output stays in c between k-groups (exact fp32). Each step prefetches every
// stream kDecodeAhead = 2 KiB ahead into L2 (prefetcht1), running on into the next
// tile's blocks near a block's end: without it the decode and the DRAM reads barely
// overlap (the hardware prefetcher restarts on each block's stream, 32 KiB of gate_up,
// 12 KiB of down). Measured by benchmarks/micro/fp8_decode_micro.cpp, cold, M = 1, 1 thread:
// fp8 from 76 % of the read roof to 85 % (10-11 % less time), int4_affine from 56-61 %
// to 79-83 % (27-29 % less); an L1 prefetch (prefetcht0) 2 KiB ahead was 20 % slower
// than none, 1 KiB into L2 slower than 2 KiB, 3-4 KiB no better (gemm_fp8_avx512.cpp).
// Prefill (m > 8), as gemm_bf16_avx512's prefill: per group of NB blocks, per k-chunk of
// at most kPChunk k-pairs inside one k-group, the chunk is decoded once into an L1 buffer
// of bf16 (NB x 4 KiB; the decoders prefetch the next chunk of each block, which the row
// tiles' time then hides), then row tiles of <= kPMaxRows[NB] rows run vdpbf16ps over it
// (MR x NB accumulators, the same tile shape as bf16). A group split over chunks leaves
// its exact fp32 partial acc in a per-thread buffer between chunks.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "kernels/avx512/avx512_common.h"
#include "kernels/packed_format.h"

namespace ktmoe {
namespace avx512 {
namespace decoded {

constexpr int64_t kPChunk = 64;  // prefill: k-pairs per decoded chunk, NB x 4 KiB of bf16
constexpr int kPMaxRows[5] = {0, 12, 12, 0, 6};

struct Ctx {
  const uint8_t* data;  // block 0
  int64_t bstride;      // bytes of one block's data
  int64_t ngroups;      // kp / group
  int64_t spg;          // k-pairs per group: group / 2
  const float* xsum;    // kRowSums: [m][ngroups] Σ a per row and group (row 0 of the call)
  int64_t nblocks;      // blocks of the matrix (np / 16)
};

// Writes (g == 0 ? 0 : c) + s * acc (+ o * xsum) for rows [0, MR) x blocks [b, b + NB) of group g.
template <class Dec, int MR, int NB>
inline void group_end(const Dec& dec, const Ctx& x, const float* xs, int64_t b, int64_t g, const __m512 (&acc)[MR][NB],
                      float* c, int64_t ldc) {
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const __m512 s = dec.scale(b + j, g);
    __m512 o = _mm512_setzero_ps();
    if constexpr (Dec::kRowSums) o = dec.offset(b + j, g);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* cij = c + i * ldc + j * 16;
      const __m512 prev = g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(cij);
      __m512 out = _mm512_fmadd_ps(s, acc[i][j], prev);
      if constexpr (Dec::kRowSums) out = _mm512_fmadd_ps(o, _mm512_set1_ps(xs[i * x.ngroups + g]), out);
      _mm512_storeu_ps(cij, out);
    }
  }
}

// Decode tiles: bytes ahead of each block's stream that a tile prefetches into L2 (0: none).
constexpr int64_t kDecodeAhead = 2048;

// Decode tile: rows [0, MR) of a (row stride astride bytes) x blocks [b, b+NB), all k;
// xs: row 0's group sums (kRowSums). Each step prefetches block j's line kAhead bytes
// ahead into L2, past the block's end the same offset of block j + NB (the next tile's)
// when wrap, else nothing.
template <class Dec, int MR, int NB, int64_t kAhead>
__attribute__((noinline)) void dtile(const Dec& dec, const Ctx& x, const uint8_t* a, int64_t astride,
                                     const float* xs, int64_t b, bool wrap, float* c, int64_t ldc) {
  const uint8_t* w = x.data + b * x.bstride;
  for (int64_t g = 0; g < x.ngroups; ++g) {
    __m512 acc[MR][NB];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t p = g * x.spg; p < (g + 1) * x.spg; p += 2) {  // spg is a multiple of 16
      if constexpr (kAhead > 0) {
        const int64_t o = (p / 2) * Dec::kStepBytes + kAhead;
        const uint8_t* f = o < x.bstride ? w + o : wrap ? w + NB * x.bstride + (o - x.bstride) : nullptr;
        if (f)
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(f + j * x.bstride), _MM_HINT_T1);
      }
      const auto st = dec.template step<NB>(w, x.bstride, p);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i wv[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) wv[j] = dec.pair(st, h, j);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh av = (__m512bh)bcast32(a + i * astride + (p + h) * 4);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, (__m512bh)wv[j]);
        }
      }
    }
    group_end<Dec, MR, NB>(dec, x, xs, b, g, acc, c, ldc);
  }
}

// Rows [0, MR) x blocks [b0, b1) in decode tiles: 4 blocks side by side for MR <= 4,
// 2 for MR <= 8 (MR x NB accumulators + NB decoded k-pairs fit the 32 zmm). A tile's
// prefetch runs on into the next NB blocks while they lie in the matrix, past b1 too:
// the driver's next item usually starts there (on this thread, or on another, which
// then finds those lines in this core's L2 instead of DRAM).
template <class Dec, int MR, int64_t kAhead>
void gemm_decode(const Dec& dec, const Ctx& x, const uint8_t* a, int64_t astride, int64_t b0, int64_t b1, float* c,
                 int64_t ldc) {
  // wrap(NB): the next NB blocks lie in the matrix, and the wrapped offsets (< kAhead) inside them
  const auto wrap = [&](int64_t b, int64_t nb) { return x.bstride >= kAhead && b + 2 * nb <= x.nblocks; };
  const float* xs = x.xsum;
  int64_t b = b0;
  if constexpr (MR <= 4)
    for (; b + 4 <= b1; b += 4)
      dtile<Dec, MR, 4, kAhead>(dec, x, a, astride, xs, b, wrap(b, 4), c + (b - b0) * 16, ldc);
  for (; b + 2 <= b1; b += 2)
    dtile<Dec, MR, 2, kAhead>(dec, x, a, astride, xs, b, wrap(b, 2), c + (b - b0) * 16, ldc);
  for (; b < b1; ++b) dtile<Dec, MR, 1, kAhead>(dec, x, a, astride, xs, b, wrap(b, 1), c + (b - b0) * 16, ldc);
}

// Where a prefill tile's k-chunk [s0, s1) sits in its k-group g.
struct ChunkPos {
  int64_t s0, s1, g;
  bool first, last;  // the group's first / last chunk
};

// Rows [0, MR) x blocks [b, b+NB) x k-pairs [s0, s1) of group g over the decoded
// chunk wd ([NB][kPChunk] zmm). part: this tile's rows of the per-thread partial
// sums ([rows][64] fp32, column 16j + lane).
template <class Dec, int MR, int NB>
__attribute__((noinline)) void ptile(const Dec& dec, const Ctx& x, const uint8_t* wd, const uint8_t* a,
                                     int64_t astride, const float* xs, int64_t b, const ChunkPos& q, float* part,
                                     float* c, int64_t ldc) {
  __m512 acc[MR][NB];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      acc[i][j] = q.first ? _mm512_setzero_ps() : _mm512_load_ps(part + i * 64 + j * 16);
  for (int64_t p = q.s0; p < q.s1; ++p) {
    __m512bh wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_load_si512(wd + (j * kPChunk + p - q.s0) * 64);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)bcast32(a + i * astride + p * 4);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, wv[j]);
    }
  }
  if (!q.last) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) _mm512_store_ps(part + i * 64 + j * 16, acc[i][j]);
    return;
  }
  group_end<Dec, MR, NB>(dec, x, xs, b, q.g, acc, c, ldc);
}

// ptile with MR = rows (1 <= rows <= MaxMR).
template <class Dec, int NB, int MaxMR>
inline void ptile_n(int64_t rows, const Dec& dec, const Ctx& x, const uint8_t* wd, const uint8_t* a,
                    int64_t astride, const float* xs, int64_t b, const ChunkPos& q, float* part, float* c,
                    int64_t ldc) {
  if constexpr (MaxMR > 1)
    if (rows < MaxMR) return ptile_n<Dec, NB, MaxMR - 1>(rows, dec, x, wd, a, astride, xs, b, q, part, c, ldc);
  ptile<Dec, MaxMR, NB>(dec, x, wd, a, astride, xs, b, q, part, c, ldc);
}

template <class Dec>
void gemm_prefill(const Dec& dec, const Ctx& x, int64_t kp, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                  int64_t b1, float* c, int64_t ldc) {
  static thread_local Scratch wbuf, pbuf, abuf;
  uint8_t* wd = wbuf.at_least(4 * kPChunk * 64);
  float* part = reinterpret_cast<float*>(pbuf.at_least(size_t(m) * 64 * 4));
  // Rows a multiple of 1 KiB apart share L1 sets: copy them with a stride of kp*2 + 64.
  const uint8_t* ar = reinterpret_cast<const uint8_t*>(a);
  int64_t astride = lda * 2;
  if (astride % 1024 == 0) {
    uint8_t* st = abuf.at_least(size_t(m) * (kp * 2 + 64));
    for (int64_t i = 0; i < m; ++i) copy_bytes(st + i * (kp * 2 + 64), ar + i * astride, kp * 2);
    ar = st, astride = kp * 2 + 64;
  }
  auto group = [&](auto nb_tag, int64_t b) {
    constexpr int NB = decltype(nb_tag)::value, kMR = kPMaxRows[NB];
    const int64_t nt = (m + kMR - 1) / kMR;
    const uint8_t* w = x.data + b * x.bstride;
    for (int64_t g = 0; g < x.ngroups; ++g)
      for (int64_t s0 = g * x.spg; s0 < (g + 1) * x.spg; s0 += kPChunk) {
        const int64_t s1 = std::min(s0 + kPChunk, (g + 1) * x.spg);
        const ChunkPos q{s0, s1, g, s0 == g * x.spg, s1 == (g + 1) * x.spg};
        for (int j = 0; j < NB; ++j)
          dec.pairs(w + j * x.bstride + (s0 / 2) * Dec::kStepBytes, s1 - s0, wd + j * kPChunk * 64);
        for (int64_t t = 0; t < nt; ++t) {
          const int64_t r0 = t * m / nt, r1 = (t + 1) * m / nt;
          ptile_n<Dec, NB, kMR>(r1 - r0, dec, x, wd, ar + r0 * astride, astride,
                                x.xsum ? x.xsum + r0 * x.ngroups : nullptr, b, q, part + r0 * 64,
                                c + r0 * ldc + (b - b0) * 16, ldc);
        }
      }
  };
  int64_t b = b0;
  for (; b + 4 <= b1; b += 4) group(std::integral_constant<int, 4>{}, b);
  for (; b + 2 <= b1; b += 2) group(std::integral_constant<int, 2>{}, b);
  for (; b < b1; ++b) group(std::integral_constant<int, 1>{}, b);
}

// The decode half of the decoders of kINT4A's nibble layout (kINT4A, kMXFP4): a step is one
// k-quad (32 bytes) of a block, its low nibbles k-pair p and its high nibbles k-pair p + 1 in
// the pair layout, each turned into 32 bf16 by one vpermw of `table` (entry i: the bf16 of code
// i % 16, so the other nibble's bit in a word index's bit 4 is ignored):
//   vpmovzxbw   v = the bytes zero-extended to words (a load operand)
//   vpermw      lo = T[v & 31];   vpsrlw v >> 4, vpermw: hi = T[v >> 4]
// 2 vector ops per 32 weights. A format's decoder derives from it, adding kRowSums, scale, offset
// (read from record(b, g): the format's (block, group) scale record of record_bytes).
struct NibbleSteps {
  static constexpr int64_t kStepBytes = 32;
  __m512i table;
  const uint8_t* scales;  // block 0, group 0
  int64_t ngroups, record_bytes;
  NibbleSteps(const uint16_t* t, const uint8_t* s, int64_t ng, int64_t rb)
      : table(_mm512_load_si512(t)), scales(s), ngroups(ng), record_bytes(rb) {}
  inline const uint8_t* record(int64_t b, int64_t g) const { return scales + (b * ngroups + g) * record_bytes; }

  static inline __m512i widen(const uint8_t* p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  inline __m512i low(__m512i v) const { return _mm512_permutexvar_epi16(v, table); }
  inline __m512i high(__m512i v) const { return _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table); }

  template <int NB>
  struct Step {
    __m512i v[NB];
  };
  template <int NB>
  inline Step<NB> step(const uint8_t* w, int64_t bstride, int64_t p) const {
    Step<NB> st;
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) st.v[j] = widen(w + j * bstride + (p / 2) * 32);
    return st;
  }
  template <int NB>
  inline __m512i pair(const Step<NB>& st, int h, int j) const {
    return h == 0 ? low(st.v[j]) : high(st.v[j]);
  }
  // n (even) k-pairs of a block at p -> n zmm of bf16 codes at out (prefetching the next chunk).
  inline void pairs(const uint8_t* p, int64_t n, uint8_t* out) const {
    for (int64_t i = 0; i < n; i += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + (i / 2) * 32 + (kPChunk / 2) * 32), _MM_HINT_T0);
      const __m512i v = widen(p + (i / 2) * 32);
      _mm512_store_si512(out + i * 64, low(v));
      _mm512_store_si512(out + (i + 1) * 64, high(v));
    }
  }
};

// The gemm of a format without row sums whose decoder is Dec(scales, ngroups) (kFP8, kMXFP4); bstride: the
// bytes of one block's data. a: bf16 rows [m, lda]; c: fp32 [m, ldc], columns 0 .. 16*(b1-b0) written.
template <class Dec>
void gemm_scaled(const PackedMatrixHeader* w, int64_t bstride, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                 int64_t b1, float* c, int64_t ldc);

// The whole gemm: decode tiles for m <= 8, else the prefill. a: bf16 rows [m, lda].
// kAhead: the decode tiles' prefetch distance (benchmarks/micro/fp8_decode_micro.cpp varies it).
template <class Dec, int64_t kAhead = kDecodeAhead>
void gemm(const Dec& dec, const Ctx& x, int64_t kp, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
          float* c, int64_t ldc) {
  const auto* ab = reinterpret_cast<const uint8_t*>(a);
  switch (m) {
    case 1: return gemm_decode<Dec, 1, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 2: return gemm_decode<Dec, 2, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 3: return gemm_decode<Dec, 3, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 4: return gemm_decode<Dec, 4, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 5: return gemm_decode<Dec, 5, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 6: return gemm_decode<Dec, 6, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 7: return gemm_decode<Dec, 7, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    case 8: return gemm_decode<Dec, 8, kAhead>(dec, x, ab, lda * 2, b0, b1, c, ldc);
    default: break;
  }
  gemm_prefill(dec, x, kp, a, lda, m, b0, b1, c, ldc);
}

template <class Dec>
void gemm_scaled(const PackedMatrixHeader* w, int64_t bstride, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                 int64_t b1, float* c, int64_t ldc) {
  if (m <= 0 || b1 <= b0) return;
  const int64_t kp = w->kp, ngroups = kp / w->group;
  const Ctx x{packed_data(w), bstride, ngroups, w->group / 2, nullptr, w->np / kBlockN};
  gemm(Dec(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1, c, ldc);
}

}  // namespace decoded
}  // namespace avx512
}  // namespace ktmoe
