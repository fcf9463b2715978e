// [NOTE] int4 GEMM over packed kINT4 blocks, AVX2 + AVX-VNNI (exact int32 group dots).
//
// Computes what avx2/gemm_int4_avx2.cpp computes, c[m][16*(b-b0) + j] = sx[m] · Σ_G d[n,G] ·
// (Σ_{k∈G} u·xq − 64·Σ_{k∈G} xq), with the same tile loop (avx2/gemm_int4_tile.h: unpack,
// prefetch, the group epilogue with generic's rounding, so the same fp32 bits); only the dot
// differs: two vpdpbusd (vnni_dot.h) per row and 32 weight bytes, u (unsigned) times xq
// (signed), where avx2 takes 2 vpmaddubsw + 2 vpmaddwd + 2 vpaddd. Vector instructions per 64
// weight bytes at one row: 2 loads, 6 unpack, 4 vpshufb, 2 broadcasts, 4 vpdpbusd, 1 prefetch
// (2 KiB ahead into L1):
// 19 (avx2: 27). The one-row loop as GCC 12 emits it (objdump, benchmarks/micro/bench_avx2_vnni.py):
// 27 instructions per 64 weight bytes against avx2's 33 (both with the loop counters, each
// weight vector loaded twice and accumulator copies GCC adds).
// One-row tiles keep the low- and high-nibble sums in separate accumulators (4 vpdpbusd
// chains instead of 2, added exactly at the group's end); wider tiles have enough chains and
// no registers to spare.
#include "kernels/avx2/gemm_int4_tile.h"
#include "kernels/avx2_vnni/vnni_dot.h"

namespace ktmoe {
namespace KTMOE_AVX2_VNNI_NS {
namespace {

// The dot of gemm_int4_tile.h: per 32-bit lane (one column) Σ_{i<4} lo[i]·xl[i] + hi[i]·xh[i],
// exact, into one set (lo then hi) or two (lo into set 0, hi into set 1).
struct VnniOctets {
  template <int MR>
  static constexpr int kSets = MR == 1 ? 2 : 1;
  template <int S>
  static inline void add(__m256i (&dot)[S], __m256i lo, __m256i hi, __m256i xl, __m256i xh) {
    if constexpr (S == 1) {
      dot[0] = dot_u8s8(dot_u8s8(dot[0], lo, xl), hi, xh);
    } else {
      dot[0] = dot_u8s8(dot[0], lo, xl);
      dot[1] = dot_u8s8(dot[1], hi, xh);
    }
  }
};

}  // namespace

void gemm_int4(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
               int64_t ldc) {
  avx2::gemm_int4_with<VnniOctets, 2048, _MM_HINT_T0>(w, a, m, b0, b1, c, ldc);
}

}  // namespace KTMOE_AVX2_VNNI_NS
}  // namespace ktmoe
