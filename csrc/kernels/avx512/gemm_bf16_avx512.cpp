// [NOTE] avx512 gemm_bf16: c[m, 16*(b - b0) + j] = Σ_k a[m][k] · W[16b + j][k].
//
// Weights are in the kBF16 VNNI pair layout (packed_format.h): per block, k-pair p
// is one 64-byte zmm of 16 columns x 2 bf16, exactly what vdpbf16ps multiplies
// against an activation pair broadcast as one dword ({1to16} memory operand).
//
// Register tile MR rows x NB blocks of fp32 accumulators (avx512_common.h; a
// 12-row tile runs as 2 x 6 rows for NB = 4):
// NB = 4 -> MR <= 6, NB = 2 or 1 -> MR <= 12 (24 accumulators + NB weight
// registers of the 32 zmm). Per k-pair: NB weight loads, MR broadcasts, MR*NB
// vdpbf16ps. Decode (M = 1) is memory bound: NB independent weight streams and
// accumulator chains per step keep the loads in flight; prefill is compute bound
// at ~1 vdpbf16ps per cycle (Zen4).
//
// Each column is one accumulator chain over k ascending, whatever the tile or the
// k-chunk (a chunk resumes from the exact fp32 partial left in c), so the bits
// depend neither on the (b0, b1) split nor on M. vdpbf16ps treats bf16 denormals
// as zero and rounds each step to fp32 (nearest even).
#include <immintrin.h>

#include "kernels/avx512/avx512_common.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

struct Bf16Gemm {
  struct Ctx {
    const uint8_t* data;  // block 0 of the matrix
    int64_t bstride;      // bytes per block: kp * 32
    int64_t nsteps;       // k-pairs: kp / 2
    int64_t b0;
    float* c;
    int64_t ldc;
  };
  static constexpr int kMaxRows[5] = {0, 12, 12, 0, 6};
  static constexpr int64_t kABytesPerStep = 4;  // one bf16 pair per row
  static int64_t chunk_steps(const Ctx&) { return kChunkABytes / kABytesPerStep; }

  // Rows [m0, m0+MR) x blocks [b, b+NB) x k-pairs [s0, s1); c holds the partial
  // sums of k-pairs [0, s0) when s0 > 0.
  template <int MR, int NB, int kStride>
  __attribute__((noinline)) static void tile(const Ctx& x, const ARows& a, int64_t m0, int64_t b,
                                             int64_t s0, int64_t s1) {
    const uint8_t* w = x.data + b * x.bstride;
    float* c = x.c + m0 * x.ldc + (b - x.b0) * 16;
    __m512 acc[MR][NB];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j)
        acc[i][j] = s0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * x.ldc + j * 16);

    for (int64_t p = s0; p < s1; ++p) {
      __m512bh wv[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j)
        wv[j] = (__m512bh)_mm512_loadu_si512(w + j * x.bstride + p * 64);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512bh av = (__m512bh)bcast32(a_at<kStride>(a, i, p, kABytesPerStep));
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, wv[j]);
      }
    }

#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + i * x.ldc + j * 16, acc[i][j]);
  }
};

}  // namespace

// w: kBF16 matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero padded);
// c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp;
  const Bf16Gemm::Ctx ctx{packed_data(w), kp * 32, kp / 2, b0, c, ldc};
  run_tiles<Bf16Gemm>(ctx, reinterpret_cast<const uint8_t*>(a), lda * 2, m, b0, b1);
}

}  // namespace avx512
}  // namespace ktmoe
