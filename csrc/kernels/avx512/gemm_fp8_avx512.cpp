// [NOTE] avx512 gemm_fp8 (AVX-512 BF16): c[m, 16*(b - b0) + j] =
//   Σ_G s[16b + j, G] · Σ_{k∈G} a[m][k] · e4m3(W[16b + j][k])      (fp8_format.h)
//
// Decode, 32 e4m3 bytes (one k-pair of a block) -> one zmm of 32 bf16 in the pair
// layout vdpbf16ps reads, each = e4m3 * 2^-8 exactly (the scale is taken * 2^8):
//   vpmovsxbw   s = the bytes sign-extended to words (low byte = the e4m3 byte)
//   vpsllw      s << 4: sign in bits 15..11, the 7 magnitude bits in 10..4
//   vpternlogd  r = (s<<4 & 0x87F0) | 0x3800: sign, bf16 exponent e + 112, mantissa m<<4
// That is exact for every byte with e > 0. Bytes with e = 0 (zero and subnormals)
// are found by one vptestnmb (byte & 0x78 == 0) per 64 bytes (2 k-pairs) of a block;
// only when one of the decode step's windows has any (rare in real weights: |q| <
// 2^-6 of 448, exact zeros, padding) every k-pair of the step is fixed up:
//   vptestnmw   k = its lanes with e = 0
//   vpermw      d = kSubnormalFix[byte & 31] (= [m] on those lanes)
//   vpaddw{k}   r += d on those lanes: the exact bf16 of ±m * 2^-17 (the sign bit is
//               kept: both magnitudes are below 0x8000).
// So ~3.5 vector ops per 32 weights, then one vdpbf16ps per row. Measured (1 thread,
// weights in L2, loaded 2-core host, N(0,1)-shaped e4m3 bytes, GB/s of fp8 weights):
// always fixing up (6 ops) 30, a vptestnmw + branch per k-pair 38, the byte test per
// 64 bytes 46 (bf16's kernel: 90 GB/s of its 2-byte weights). Out of cache (64
// experts x 6 MiB, M = 1) the decode read 18-24 GB/s against a streaming read of
// 15-27 GB/s in the same runs (the host's load varied), at or near the roof.
// A software prefetch 1-2 KiB ahead in the decode tiles was slower (-10 to -25 %).
//
// Accumulation, identical in every path, per column: for each k-group G, acc = +0,
// one vdpbf16ps per k-pair of G in k order (a chain), then out = fma(s * 2^8, acc, out)
// (out = +0 before the first group). So the bits depend neither on (b0, b1) nor on M.
//
// Decode rows (m <= 8): register tiles of m rows x NB blocks side by side (NB = 4 for
// m <= 4, else 2; then 2 / 1 for the last blocks), the weights decoded in registers
// and read exactly once, NB weight streams and m x NB accumulator chains in flight;
// a column's output stays in c between k-groups (exact fp32).
// Prefill (m > 8), as gemm_bf16_avx512's prefill: per group of NB blocks, per k-chunk
// of at most kPChunk k-pairs inside one k-group, the chunk is decoded once into an L1
// buffer of bf16 (NB x 4 KiB; the decode prefetches the next chunk of each block, which
// the row tiles' time then hides), then row tiles of <= kPMaxRows[NB] rows run
// vdpbf16ps over it (MR x NB accumulators, the same tile shape as bf16). A group split
// over chunks leaves its exact fp32 partial acc in a per-thread buffer between chunks.
// Measured (1 thread, 4 experts of 1536 x 2048, loaded host; ms, fp8 / bf16 kernel):
// m = 1: 0.33 / 1.0, m = 4: 0.6 / 1.0, m = 8: 1.2-1.7 / 1.3-1.9, m = 12: 1.9-2.7 / 1.7,
// m = 128: 17 / 16. (With register tiles only up to m = 2 and no prefetch in the
// prefill decode, m = 3..12 took 2-2.8 ms.)
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "kernels/avx512/avx512_common.h"
#include "kernels/fp8_format.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

// kSubnormalFix[m] (m < 8) = bf16 bits of m * 2^-17 minus (0x3800 | m << 4), mod 2^16.
struct SubnormalFix {
  alignas(64) uint16_t v[32] = {};
  constexpr SubnormalFix() {
    for (int m = 0; m < 8; ++m) v[m] = uint16_t(e4m3_subnormal_scaled_bf16(m) - (0x3800 | (m << 4)));
  }
};
constexpr SubnormalFix kSubnormalFix;

constexpr int64_t kPChunk = 64;  // prefill: k-pairs per decoded chunk, NB x 4 KiB of bf16

struct Fp8Decoder {
  __m512i keep = _mm512_set1_epi16(int16_t(0x87F0));
  __m512i bias = _mm512_set1_epi16(0x3800);
  __m512i expo = _mm512_set1_epi16(0x0078);  // the exponent bits of a sign-extended byte
  __m512i expo8 = _mm512_set1_epi8(0x78);     // the exponent bits of every byte
  __m512i fix = _mm512_load_si512(kSubnormalFix.v);
  // The 32 e4m3 bytes at p sign-extended to words.
  static inline __m512i widen(const uint8_t* p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // bf16 of value * 2^-8 for the lanes of normal bytes (e > 0).
  inline __m512i normal(__m512i s) const {
    return _mm512_ternarylogic_epi32(_mm512_slli_epi16(s, 4), keep, bias, 0xEA);  // (A & B) | C
  }
  // Lanes with e = 0 (zero and subnormals).
  inline __mmask32 subnormal(__m512i s) const { return _mm512_testn_epi16_mask(s, expo); }
  // Bytes with e = 0 among the 64 at p.
  inline __mmask64 subnormal_bytes(const uint8_t* p) const {
    return _mm512_testn_epi8_mask(_mm512_loadu_si512(p), expo8);
  }
  // r with the lanes k made exact (+ kSubnormalFix[m]).
  inline __m512i fixed(__m512i r, __mmask32 k, __m512i s) const {
    return _mm512_mask_add_epi16(r, k, r, _mm512_permutexvar_epi16(s, fix));
  }
  // n (even) k-pairs of a block at p -> n zmm of bf16 (value * 2^-8) at out: the
  // fix-up only for 64-byte windows that hold e = 0 bytes.
  inline void pairs(const uint8_t* p, int64_t n, uint8_t* out) const {
    for (int64_t i = 0; i < n; i += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i * 32 + kPChunk * 32), _MM_HINT_T0);
      const bool any = subnormal_bytes(p + i * 32) != 0;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i s = widen(p + (i + h) * 32);
        __m512i r = normal(s);
        if (__builtin_expect(any, 0)) r = fixed(r, subnormal(s), s);
        _mm512_store_si512(out + (i + h) * 64, r);
      }
    }
  }
};

struct Fp8Ctx {
  const uint8_t* data;    // block 0
  const uint8_t* scales;  // block 0, group 0
  int64_t bstride;        // kp * 16
  int64_t ngroups;        // kp / group
  int64_t spg;            // k-pairs per group: group / 2
};

// 16 scales of block b, group g, times 2^8 (kernels use e4m3 * 2^-8).
inline __m512 scale256(const Fp8Ctx& x, int64_t b, int64_t g) {
  const float* s = reinterpret_cast<const float*>(x.scales + (b * x.ngroups + g) * kFp8ScaleBytes);
  return _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(kE4m3KernelScale));
}


// Decode tile: rows [0, MR) of a (row stride astride bytes) x blocks [b, b+NB), all k.
template <int MR, int NB>
__attribute__((noinline)) void dtile(const Fp8Ctx& x, const uint8_t* a, int64_t astride, int64_t b,
                                     float* c, int64_t ldc) {
  const Fp8Decoder dec;
  const uint8_t* w = x.data + b * x.bstride;
  for (int64_t g = 0; g < x.ngroups; ++g) {
    __m512 acc[MR][NB];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t p = g * x.spg; p < (g + 1) * x.spg; p += 2) {  // spg is a multiple of 16
      // One byte test per 64 bytes (2 k-pairs) of each block finds the e = 0 bytes.
      __mmask64 any = 0;
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) any |= dec.subnormal_bytes(w + j * x.bstride + p * 32);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i sv[NB], wv[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          sv[j] = Fp8Decoder::widen(w + j * x.bstride + (p + h) * 32);
          wv[j] = dec.normal(sv[j]);
        }
        if (__builtin_expect(any != 0, 0)) {  // rare in real weights: zeros, |q| < 2^-6, padding
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) wv[j] = dec.fixed(wv[j], dec.subnormal(sv[j]), sv[j]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh av = (__m512bh)bcast32(a + i * astride + (p + h) * 4);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, (__m512bh)wv[j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {  // the output's partial sum lives in c between groups
      const __m512 s = scale256(x, b + j, g);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        float* cij = c + i * ldc + j * 16;
        const __m512 prev = g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(cij);
        _mm512_storeu_ps(cij, _mm512_fmadd_ps(s, acc[i][j], prev));
      }
    }
  }
}

// Rows [0, MR) x blocks [b0, b1) in decode tiles: 4 blocks side by side for MR <= 4,
// 2 for MR <= 8 (MR x NB accumulators + NB decoded k-pairs fit the 32 zmm).
template <int MR>
void gemm_fp8_decode(const Fp8Ctx& x, const uint8_t* a, int64_t astride, int64_t b0, int64_t b1,
                     float* c, int64_t ldc) {
  int64_t b = b0;
  if constexpr (MR <= 4)
    for (; b + 4 <= b1; b += 4) dtile<MR, 4>(x, a, astride, b, c + (b - b0) * 16, ldc);
  for (; b + 2 <= b1; b += 2) dtile<MR, 2>(x, a, astride, b, c + (b - b0) * 16, ldc);
  for (; b < b1; ++b) dtile<MR, 1>(x, a, astride, b, c + (b - b0) * 16, ldc);
}

// ---- prefill ----
constexpr int kPMaxRows[5] = {0, 12, 12, 0, 6};

// Where a prefill tile's k-chunk [s0, s1) sits in its k-group g.
struct ChunkPos {
  int64_t s0, s1, g;
  bool first, last;  // the group's first / last chunk
};

// Rows [0, MR) x blocks [b, b+NB) x k-pairs [s0, s1) of group g over the decoded
// chunk wd ([NB][kPChunk] zmm). part: this tile's rows of the per-thread partial
// sums ([rows][64] fp32, column 16j + lane).
template <int MR, int NB>
__attribute__((noinline)) void ptile(const Fp8Ctx& x, const uint8_t* wd, const uint8_t* a,
                                     int64_t astride, int64_t b, const ChunkPos& q, float* part,
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
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const __m512 s = scale256(x, b + j, q.g);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* cij = c + i * ldc + j * 16;
      const __m512 prev = q.g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(cij);
      _mm512_storeu_ps(cij, _mm512_fmadd_ps(s, acc[i][j], prev));
    }
  }
}

// ptile with MR = rows (1 <= rows <= MaxMR).
template <int NB, int MaxMR>
inline void ptile_n(int64_t rows, const Fp8Ctx& x, const uint8_t* wd, const uint8_t* a, int64_t astride,
                    int64_t b, const ChunkPos& q, float* part, float* c, int64_t ldc) {
  if constexpr (MaxMR > 1)
    if (rows < MaxMR) return ptile_n<NB, MaxMR - 1>(rows, x, wd, a, astride, b, q, part, c, ldc);
  ptile<MaxMR, NB>(x, wd, a, astride, b, q, part, c, ldc);
}

// A per-thread 64-byte aligned buffer that grows.
struct Fp8Scratch {
  uint8_t* p = nullptr;
  size_t cap = 0;
  ~Fp8Scratch() { std::free(p); }
  uint8_t* at_least(size_t n) {
    if (n <= cap) return p;
    std::free(p);
    cap = (n + 4095) / 4096 * 4096;
    p = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
    if (!p) throw std::bad_alloc();
    return p;
  }
};

void gemm_fp8_prefill(const Fp8Ctx& x, int64_t kp, const uint16_t* a, int64_t lda, int64_t m,
                      int64_t b0, int64_t b1, float* c, int64_t ldc) {
  static thread_local Fp8Scratch wbuf, pbuf, abuf;
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
  const Fp8Decoder dec;
  auto group = [&](auto nb_tag, int64_t b) {
    constexpr int NB = decltype(nb_tag)::value, kMR = kPMaxRows[NB];
    const int64_t nt = (m + kMR - 1) / kMR;
    const uint8_t* w = x.data + b * x.bstride;
    for (int64_t g = 0; g < x.ngroups; ++g)
      for (int64_t s0 = g * x.spg; s0 < (g + 1) * x.spg; s0 += kPChunk) {
        const int64_t s1 = std::min(s0 + kPChunk, (g + 1) * x.spg);
        const ChunkPos q{s0, s1, g, s0 == g * x.spg, s1 == (g + 1) * x.spg};
        for (int j = 0; j < NB; ++j)
          dec.pairs(w + j * x.bstride + s0 * 32, s1 - s0, wd + j * kPChunk * 64);
        for (int64_t t = 0; t < nt; ++t) {
          const int64_t r0 = t * m / nt, r1 = (t + 1) * m / nt;
          ptile_n<NB, kMR>(r1 - r0, x, wd, ar + r0 * astride, astride, b, q, part + r0 * 64,
                           c + r0 * ldc + (b - b0) * 16, ldc);
        }
      }
  };
  int64_t b = b0;
  for (; b + 4 <= b1; b += 4) group(std::integral_constant<int, 4>{}, b);
  for (; b + 2 <= b1; b += 2) group(std::integral_constant<int, 2>{}, b);
  for (; b < b1; ++b) group(std::integral_constant<int, 1>{}, b);
}

}  // namespace

// w: kFP8 matrix [np, kp] (+ scales per 16 columns and k-group); a: bf16 rows [m, lda]
// (kp used, zero padded); c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  if (m <= 0 || b1 <= b0) return;
  const int64_t kp = w->kp;
  const Fp8Ctx x{packed_data(w), packed_scales(w), fp8_block_data_bytes(kp), kp / w->group, w->group / 2};
  const auto* ab = reinterpret_cast<const uint8_t*>(a);
  switch (m) {
    case 1: return gemm_fp8_decode<1>(x, ab, lda * 2, b0, b1, c, ldc);
    case 2: return gemm_fp8_decode<2>(x, ab, lda * 2, b0, b1, c, ldc);
    case 3: return gemm_fp8_decode<3>(x, ab, lda * 2, b0, b1, c, ldc);
    case 4: return gemm_fp8_decode<4>(x, ab, lda * 2, b0, b1, c, ldc);
    case 5: return gemm_fp8_decode<5>(x, ab, lda * 2, b0, b1, c, ldc);
    case 6: return gemm_fp8_decode<6>(x, ab, lda * 2, b0, b1, c, ldc);
    case 7: return gemm_fp8_decode<7>(x, ab, lda * 2, b0, b1, c, ldc);
    case 8: return gemm_fp8_decode<8>(x, ab, lda * 2, b0, b1, c, ldc);
    default: break;
  }
  gemm_fp8_prefill(x, kp, a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx512
}  // namespace ktmoe
