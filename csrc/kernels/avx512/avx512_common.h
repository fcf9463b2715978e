// [NOTE] Private helpers of the avx512 kernels: small vector helpers and the tile
// driver every gemm_* shares.
//
// A gemm call covers rows [0, M) x packed blocks [b0, b1). run_tiles cuts that
// into register tiles of MR rows x NB blocks (NB in {4, 2, 1}, 16 columns each)
// over a range of k steps and calls K::tile<MR, NB, kStride>(ctx, a, m0, b, s0, s1)
// for each. Each format (bf16, int8, int4) gives the rows that fit in registers
// per NB (K::kMaxRows[NB]), its activation bytes per step and its k-chunk.
// Loop order and the activation staging are explained at run_tiles. Every tile
// computes each output column with the same sequence of operations whatever MR,
// NB and the chunking are (k ascending, one accumulator per column for floats;
// integer sums are exact), so the result bits do not depend on the (b0, b1)
// split or on M.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace ktmoe {
namespace avx512 {

// 4 bytes at p broadcast to all 16 dword lanes (folds into an {1to16} operand).
inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// 16 bf16 at p -> 16 fp32 (exact: bf16 is the top half of an fp32).
inline __m512 bf16x16_to_f32(const void* p) {
  const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// A per-thread 64-byte aligned buffer that grows.
struct Scratch {
  uint8_t* p = nullptr;
  size_t cap = 0;
  ~Scratch() { std::free(p); }
  uint8_t* at_least(size_t n) {
    if (n <= cap) return p;
    std::free(p);
    cap = (n + 4095) / 4096 * 4096;
    p = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
    if (!p) throw std::bad_alloc();
    return p;
  }
};

// x, opaque to the optimizer: a product passed through it is rounded before any add (GCC would
// otherwise contract _mm512_mul_ps + _mm512_add_ps into one FMA under -ffp-contract=fast).
inline __m512 rounded(__m512 x) {
  asm("" : "+v"(x));
  return x;
}

// 16 E8M0 bytes at e -> their fp32 2^(e - 127), exact (e = 0, the subnormal 2^-127, by a masked
// move of its bits 0x00400000; e = 255 is never stored).
inline __m512 e8m0_to_f32x16(const uint8_t* e) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e)));
  return _mm512_castsi512_ps(
      _mm512_mask_mov_epi32(_mm512_slli_epi32(v, 23), _mm512_testn_epi32_mask(v, v), _mm512_set1_epi32(0x00400000)));
}

// Rows per row tile of the tile driver; every K::kMaxRows[NB] is at most this.
constexpr int kRowTile = 12;

// Lane mask of the first n (0..16) lanes.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// dst[0, n) = src[0, n) with zmm moves (n <= a few KiB; no call overhead).
inline void copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
  if (i < n) {
    const __mmask64 mk = (1ull << (n - i)) - 1;  // 0 < n - i < 64
    _mm512_mask_storeu_epi8(dst + i, mk, _mm512_maskz_loadu_epi8(mk, src + i));
  }
}

// Activations of a row tile as the tiles see them: row i, step s (one 64-byte
// zmm of a block: a k-pair / k-quad / k-octet) at
//   a + i * stride + (s - s0) * K::kABytesPerStep,
// stride = kStride when kStride > 0 (staged copy) else the caller's row stride.
struct ARows {
  const uint8_t* a;  // row m0, step s0
  int64_t stride;    // bytes
  int64_t s0;
};

template <int kStride>
inline const uint8_t* a_at(const ARows& r, int i, int64_t s, int64_t bytes_per_step) {
  const int64_t stride = kStride > 0 ? kStride : r.stride;
  return r.a + i * stride + (s - r.s0) * bytes_per_step;
}

// Row tiles of exactly MR rows; a remainder of r < MR rows is dispatched to the
// MR = r instantiation.
template <class K, int NB, int kStride, int MR>
inline void run_rows(const typename K::Ctx& ctx, const ARows& a, int64_t m0, int64_t rows,
                     int64_t b, int64_t s0, int64_t s1) {
  if constexpr (MR > 1) {
    if (rows < MR) return run_rows<K, NB, kStride, MR - 1>(ctx, a, m0, rows, b, s0, s1);
  }
  K::template tile<MR, NB, kStride>(ctx, a, m0, b, s0, s1);
}

// Decode row tiles: at most this many rows. A kernel with K::kOneBlockDecode reads
// one block per decode tile (one weight stream per thread) instead of 4 side by side.
constexpr int64_t kDecodeRows = 2;

// rows [m0, m0 + rows) (rows <= kRowTile) x blocks [b0, b1) x steps [s0, s1):
// block groups of 4, then 2, then 1, each in row tiles of K::kMaxRows[NB] (only 1 for
// a K::kOneBlockDecode kernel's decode rows).
template <class K, int kStride>
inline void run_blocks(const typename K::Ctx& ctx, const ARows& a, int64_t m0, int64_t rows,
                       int64_t b0, int64_t b1, int64_t s0, int64_t s1) {
  auto group = [&](auto nb_tag, int64_t b) {
    constexpr int NB = decltype(nb_tag)::value;
    constexpr int kMR = K::kMaxRows[NB];
    for (int64_t r = 0; r < rows; r += kMR) {
      const ARows ar{a.a + r * (kStride > 0 ? kStride : a.stride), a.stride, a.s0};
      run_rows<K, NB, kStride, kMR>(ctx, ar, m0 + r, rows - r < kMR ? rows - r : kMR, b, s0, s1);
    }
  };
  int64_t b = b0;
  if (!(K::kOneBlockDecode && rows <= kDecodeRows)) {
    for (; b + 4 <= b1; b += 4) group(std::integral_constant<int, 4>{}, b);
    for (; b + 2 <= b1; b += 2) group(std::integral_constant<int, 2>{}, b);
  }
  for (; b < b1; ++b) group(std::integral_constant<int, 1>{}, b);
}

// Rows [0, m) x blocks [b0, b1) of a gemm whose activation row m, step s is at
// a0 + m * lda_bytes + s * K::kABytesPerStep.
//
// Up to one row tile (m <= 12, decode and small experts): tiles straight over
// the caller's rows, all k at once, so every weight byte is read exactly once.
//
// Otherwise k-chunks of K::chunk_steps(ctx) steps (kChunkABytes of activations
// per row) are the outer loop, then row tiles of kRowTile rows, then block
// groups. Each row tile's chunk of activations is first copied to a stack buffer
// with a fixed row stride of kChunkABytes + 64: the caller's rows are often a
// multiple of 4 KiB apart (kp = 2048 bf16), which puts all 12 rows in one L1 set
// (8 ways) and costs ~1/3 of the throughput; the fixed stride also turns the 12
// row addresses into constant offsets of one register. The copy (12 KiB) is
// reused by every block group; the weights of the chunk stay in L2 across row
// tiles. A tile continues a column's accumulation from c when s0 > 0 and leaves
// a partial in c when s1 < nsteps (fp32 / int32 bits, exact), so neither the
// chunking nor the tiling changes the result bits.
constexpr int64_t kChunkABytes = 1024;
constexpr int kStageStride = kChunkABytes + 64;
constexpr int64_t kStageMinRows = kRowTile + 1;  // measured: staging a lone row tile costs ~10%

template <class K>
inline void run_tiles(const typename K::Ctx& ctx, const uint8_t* a0, int64_t lda_bytes, int64_t m,
                      int64_t b0, int64_t b1) {
  const int64_t nsteps = ctx.nsteps;
  const int64_t chunk = K::chunk_steps(ctx);
  if (m < kStageMinRows || chunk * K::kABytesPerStep > kChunkABytes) {
    for (int64_t m0 = 0; m0 < m; m0 += kRowTile) {
      const ARows a{a0 + m0 * lda_bytes, lda_bytes, 0};
      run_blocks<K, 0>(ctx, a, m0, m - m0 < kRowTile ? m - m0 : kRowTile, b0, b1, 0, nsteps);
    }
    return;
  }
  alignas(64) uint8_t stage[kRowTile * kStageStride];
  for (int64_t s0 = 0; s0 < nsteps; s0 += chunk) {
    const int64_t s1 = s0 + chunk < nsteps ? s0 + chunk : nsteps;
    const int64_t bytes = (s1 - s0) * K::kABytesPerStep;
    for (int64_t m0 = 0; m0 < m; m0 += kRowTile) {
      const int64_t rows = m - m0 < kRowTile ? m - m0 : kRowTile;
      for (int64_t i = 0; i < rows; ++i)
        copy_bytes(stage + i * kStageStride, a0 + (m0 + i) * lda_bytes + s0 * K::kABytesPerStep,
                   bytes);
      run_blocks<K, kStageStride>(ctx, ARows{stage, kStageStride, s0}, m0, rows, b0, b1, s0, s1);
    }
  }
}

}  // namespace avx512
}  // namespace ktmoe
