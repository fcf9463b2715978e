// [NOTE] bf16 GEMM over packed kBF16 blocks, AVX2 + FMA.
//
// Computes c[m][16*(b-b0) + j] = Σ_k a[m][k] · W[16b + j][k] for rows m < M and
// packed blocks b in [b0, b1) (packed_format.h, kBF16: per block, kp/2 k-pairs of
// 16 columns x 2 bf16 = 64 bytes).
//
// Weights. One 256-bit load of a k-pair covers 8 columns x (k even, k odd). bf16
// is the top half of an fp32, so `w << 16` gives the even-k fp32 values and
// `w & 0xFFFF0000` the odd-k ones: 2 loads + 4 integer ops per k-pair and block.
//
// Activations. Each chunk of up to kRowChunk rows is first widened once to fp32
// in per-thread scratch, so the inner loop broadcasts them straight from memory
// (vbroadcastss from memory is a load-port op, it costs no ALU slot).
//
// Register blocking: a tile of MR rows x NB blocks keeps MR*NB*2 ymm fp32
// accumulators (16 columns = 2 ymm per row and block):
//   prefill  MR=4, NB=1: 8 accumulators + 4 weight vectors; per k-pair 16 FMAs
//            against 2 weight loads + 8 broadcasts, so the FMA ports bound it.
//   decode   MR=1, NB=4: streams 4 blocks side by side so 8 independent FMA
//            chains hide the FMA latency; each weight byte is read once. No
//            software prefetch: each stream's line 512 B / 1 / 2 / 4 KiB ahead into
//            L2 (or 512 B / 1 KiB into L1), alternated with none (bench_moe, reference
//            layer, T=1, Zen 4, 2026-12-05, load < 1.5), gave on 1 thread 2-3 % less
//            time at best (1 KiB into L2, 512 B into L1), 6-16 % more at worst,
//            and on 2 threads nothing better: within the noise, so none.
// Every output is accumulated in the same order (k ascending, even then odd k of a
// pair, one fp32 chain) whatever MR, NB, (b0, b1) or thread: same bits. The product
// of two bf16 is exact in fp32, so each FMA rounds exactly like the scalar
// acc + w·a: the bits match a k-ascending scalar loop (the generic kernel's).
#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace {

// One tile: rows [0, MR) of a32 (fp32 [MR, ld32]) x blocks [0, NB) starting at wblk.
template <int MR, int NB>
inline void bf16_tile(const uint8_t* wblk, int64_t blk_bytes, int64_t kp, const float* a32,
                      int64_t ld32, float* c, int64_t ldc) {
  __m256 acc[MR][NB][2];
  for (int r = 0; r < MR; ++r)
    for (int nb = 0; nb < NB; ++nb) acc[r][nb][0] = acc[r][nb][1] = _mm256_setzero_ps();
  const __m256i odd_mask = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  for (int64_t kk = 0; kk < kp / 2; ++kk) {
    for (int nb = 0; nb < NB; ++nb) {
      const __m256i* p = reinterpret_cast<const __m256i*>(wblk + nb * blk_bytes + kk * 64);
      const __m256i w0 = _mm256_loadu_si256(p), w1 = _mm256_loadu_si256(p + 1);
      const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
      const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
      const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, odd_mask));
      const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, odd_mask));
      for (int r = 0; r < MR; ++r) {
        const __m256 ae = _mm256_broadcast_ss(a32 + r * ld32 + 2 * kk);
        acc[r][nb][0] = _mm256_fmadd_ps(e0, ae, acc[r][nb][0]);
        acc[r][nb][1] = _mm256_fmadd_ps(e1, ae, acc[r][nb][1]);
        const __m256 ao = _mm256_broadcast_ss(a32 + r * ld32 + 2 * kk + 1);
        acc[r][nb][0] = _mm256_fmadd_ps(o0, ao, acc[r][nb][0]);
        acc[r][nb][1] = _mm256_fmadd_ps(o1, ao, acc[r][nb][1]);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int nb = 0; nb < NB; ++nb) {
      _mm256_storeu_ps(c + r * ldc + nb * 16, acc[r][nb][0]);
      _mm256_storeu_ps(c + r * ldc + nb * 16 + 8, acc[r][nb][1]);
    }
}

// MR rows x blocks [0, nblk): NB blocks side by side, then single blocks.
template <int MR, int NB>
void bf16_rows(const uint8_t* wblk, int64_t blk_bytes, int64_t nblk, int64_t kp,
               const float* a32, int64_t ld32, float* c, int64_t ldc) {
  int64_t b = 0;
  for (; b + NB <= nblk; b += NB)
    bf16_tile<MR, NB>(wblk + b * blk_bytes, blk_bytes, kp, a32, ld32, c + b * 16, ldc);
  for (; b < nblk; ++b)
    bf16_tile<MR, 1>(wblk + b * blk_bytes, blk_bytes, kp, a32, ld32, c + b * 16, ldc);
}

}  // namespace

// w: packed kBF16; a: bf16 [M, lda] (kp columns used); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m,
               int64_t b0, int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, nblk = b1 - b0;
  const int64_t blk_bytes = block_data_bytes(WeightFormat::kBF16, kp);
  const uint8_t* wblk = packed_data(w) + b0 * blk_bytes;
  if (m <= 0 || nblk <= 0) return;
  float* a32 = static_cast<float*>(thread_scratch(size_t(std::min(m, kRowChunk) * kp) * 4));
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    bf16_rows_to_f32(a + r0 * lda, lda, rows, kp, a32);
    float* cr = c + r0 * ldc;
    if (rows == 1) {  // decode: stream the blocks once, 4 side by side
      bf16_rows<1, 4>(wblk, blk_bytes, nblk, kp, a32, kp, cr, ldc);
      continue;
    }
    // prefill: a block's weights stay in cache while every 4-row tile passes over them
    for (int64_t b = 0; b < nblk; ++b) {
      for_row_tiles(rows, [&](auto mr, int64_t r) {
        bf16_tile<decltype(mr)::value, 1>(wblk + b * blk_bytes, blk_bytes, kp, a32 + r * kp, kp,
                                          cr + r * ldc + b * 16, ldc);
      });
    }
  }
}

}  // namespace avx2
}  // namespace ktmoe
