// [NOTE] Private helpers of the avx2 kernels (AVX2 + FMA + F16C only).
//
// Shared by the files of this directory and nothing else: the entry points that
// kernels_avx2.cpp puts in the table, a per-thread scratch buffer (the gemms
// re-lay activations once per call so the inner loops broadcast straight from
// memory), and a few register-level conversions. Every file here is compiled
// with -O3 -std=c++17 -mavx2 -mfma -mf16c; nothing here may need more.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx2 {

// ---- entry points (signatures of IsaKernels, see isa_kernels.h) ----
KTMOE_DECLARE_ISA_ENTRY_POINTS();

// ---- shared constants ----
constexpr int64_t kRowChunk = 64;  // rows re-laid into scratch at a time (bounds scratch)

// Per-thread scratch of at least `bytes` bytes, 64-byte aligned. Its contents
// never carry from one call to the next (every user writes before reading).
inline void* thread_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

// Calls f(std::integral_constant<int, MR>{}, r) over rows [0, rows) in tiles of
// MR = 4 rows and one last tile of 1..3 rows: the row blocking every gemm uses.
template <class F>
inline void for_row_tiles(int64_t rows, F&& f) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) f(std::integral_constant<int, 4>{}, r);
  switch (rows - r) {
    case 3: f(std::integral_constant<int, 3>{}, r); break;
    case 2: f(std::integral_constant<int, 2>{}, r); break;
    case 1: f(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}

// The 4 bytes at p broadcast to all 8 dword lanes (a load-port vpbroadcastd).
inline __m256i broadcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// x, opaque to the optimizer: a product passed through it is rounded before any add (GCC would
// otherwise contract _mm256_mul_ps + _mm256_add_ps into one FMA, -ffp-contract=fast, and differ from generic).
inline __m256 rounded(__m256 x) {
  asm("" : "+x"(x));
  return x;
}

// 8 bf16 -> 8 fp32 (exact: bf16 is the top half of fp32).
inline __m256 bf16x8_to_f32(const uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// rows bf16 rows a[r * lda + k] -> fp32 out[r * kp + k], k < kp (kp a multiple of 8, out 32-byte aligned).
inline void bf16_rows_to_f32(const uint16_t* a, int64_t lda, int64_t rows, int64_t kp, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kp; k += 8) _mm256_store_ps(out + r * kp + k, bf16x8_to_f32(a + r * lda + k));
}

// Horizontal ops are avoided in hot loops; this one is for row reductions only.
inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace avx2
}  // namespace ktmoe
