// [NOTE] int4 GEMM over packed kINT4 blocks, AVX2 (exact int32 group dots).
//
// Computes c[m][16*(b-b0) + j] = sx[m] · Σ_G d[n,G] · ( Σ_{k∈G} u[n][k]·xq[m][k]
//                                                     − 64 · Σ_{k∈G} xq[m][k] ),  n = 16b + j,
// for rows m < M and packed blocks b in [b0, b1) (packed_format.h, kINT4: per block
// kp/8 k-octets of 64 bytes; byte (n%16)*4 + i of octet j holds k = 8j+i in its low
// nibble and k = 8j+4+i in its high nibble; per (block, group) 16 bf16 d), where
// u = kInt4U8[q] = L[q] + 64 in [0, 120].
//
// Dot. An octet is one 64-byte line: two 256-bit loads of 8 columns x 4 bytes. Each
// is unpacked once (`w & 0x0F`, `(w >> 4) & 0x0F`, one vpshufb each into u) and the
// four u vectors serve every row of the tile. Per row: vpmaddubsw(u, xq) sums pairs
// into int16, then vpmaddwd with ones widens to int32. One widening per vpmaddubsw is
// what the range allows: a pair sum reaches 2·120·127 = 30480, two of them overflow
// int16. Adding the low- and high-nibble pairs in 16 bits would need |weight| <= 64
// (u − 60, signed) against |xq| (unsigned), i.e. a vpsignb per u vector and row to
// move xq's sign onto the weights: as many instructions as the widenings it saves.
// The group's int32 dot starts at −64·Σxq, so the offset costs nothing per octet.
// Vector instructions per 64 weight bytes at one row (the decode loop): 2 loads,
// 6 unpack, 4 vpshufb, 2 broadcasts, 4 vpmaddubsw, 4 vpmaddwd, 4 vpaddd, 1 prefetch;
// per group (g/8 octets) 4 scale widenings, 2 converts, 2 mul + 2 add.
// Prefetch: kInt4Ahead = 8 KiB ahead on the tile's weight stream into L2 (prefetcht1). Measured
// (benchmarks/micro/avx2_decode_micro.cpp, cold, M = 1, 1 thread, p10 of 3840 samples, loaded
// 2-core Zen 5): 0.99 ms a forward of 8 experts against 1.08 with 2 KiB into L1 (the one
// before) and 1.15-1.18 with none; 1-4 KiB into L2 or 1 KiB into L1 no better than none;
// 12-16 KiB as 8 KiB. A one-row tile specialized for g = 32 (the octet loop unrolled at
// compile time) was no faster, hot or cold.
// The tile loop (unpack, prefetch on one weight stream, the group epilogue
// with generic's rounding: the same fp32 bits) is gemm_int4_tile.h, shared with
// avx2_vnni; this file gives it the vpmaddubsw dot.
#include "kernels/avx2/gemm_int4_tile.h"

namespace ktmoe {
namespace avx2 {
namespace {

// The dot of gemm_int4_tile.h: per 32-bit lane (one column) Σ_{i<4} lo[i]·xl[i] + hi[i]·xh[i]
// added to dot[0], exact in int32 (one set: the sum is already two independent chains).
struct MaddubsOctets {
  template <int MR>
  static constexpr int kSets = 1;
  static inline void add(__m256i (&dot)[1], __m256i lo, __m256i hi, __m256i xl, __m256i xh) {
    const __m256i ones = _mm256_set1_epi16(1);
    dot[0] = _mm256_add_epi32(dot[0], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones),
                                                       _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones)));
  }
};

constexpr int64_t kInt4Ahead = 8192;  // weight prefetch distance (bytes, into L2)

}  // namespace

void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  gemm_int4_with<MaddubsOctets, kInt4Ahead, _MM_HINT_T1>(w, a, m, b0, b1, c, ldc);
}

}  // namespace avx2
}  // namespace ktmoe
