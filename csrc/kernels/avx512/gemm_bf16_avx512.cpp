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
// Prefill (m > 12 rows) takes gemm_bf16_prefill below: block group, k-chunk of
// 64 steps, then row tiles, so the chunk's weights are read once from memory
// (software-prefetched one chunk ahead) and from L1 by every row tile.
//
// Each column is one accumulator chain over k ascending, whatever the tile or the
// k-chunk (a chunk resumes from the exact fp32 partial left in c), so the bits
// depend neither on the (b0, b1) split nor on M. vdpbf16ps treats bf16 denormals
// as zero and rounds each step to fp32 (nearest even).
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <type_traits>

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
  static constexpr bool kOneBlockDecode = false;  // measured: 4 blocks side by side are faster
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

// Prefill path (m > kRowTile): rows whose stride could alias in L1 (a multiple
// of 1 KiB or more, e.g. kp = 2048 unpadded) are first staged with a padded row
// stride (kp*2 + 64 bytes); the driver's rows are padded and used in place. Then
//   for each group of NB blocks, for each k-chunk of kPChunk steps, for each
//   row tile (balanced, <= kPMaxRows[NB] rows):
// so the chunk's weights (NB x kPChunk x 64 B = 16 KiB for NB = 4) are read from
// memory once and from L1 by every row tile. Partials of a column stay in c
// between chunks (exact fp32), so every column is still one vdpbf16ps chain over
// k ascending: the same bits as the tiles above.
constexpr int64_t kPChunk = 64;
constexpr auto kPfHint = _MM_HINT_T0;  // measured: better than T1 (next chunk fits L1)
constexpr int kPMaxRows[5] = {0, 12, 12, 0, 6};

template <int MR, int NB>
__attribute__((noinline)) void ptile(const uint8_t* w, int64_t bstride, const uint8_t* a,
                                     int64_t astride, float* c, int64_t ldc, int64_t s0,
                                     int64_t s1, const uint8_t* pf, int64_t npf) {
  __m512 acc[MR][NB];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      acc[i][j] = s0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + j * 16);
  const uint8_t* ap[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ap[i] = a + i * astride;
  for (int64_t p = s0; p < s1; ++p) {
    if (p - s0 < npf) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(pf + j * bstride + (p - s0) * 64), kPfHint);
    }
    __m512bh wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * bstride + p * 64);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)bcast32(ap[i] + p * 4);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, wv[j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(c + i * ldc + j * 16, acc[i][j]);
}

template <int NB, int MR = kPMaxRows[NB]>
inline void ptile_rows(int64_t rows, const uint8_t* w, int64_t bstride, const uint8_t* a,
                       int64_t astride, float* c, int64_t ldc, int64_t s0, int64_t s1,
                       const uint8_t* pf, int64_t npf) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return ptile_rows<NB, MR - 1>(rows, w, bstride, a, astride, c, ldc, s0, s1, pf, npf);
  }
  ptile<MR, NB>(w, bstride, a, astride, c, ldc, s0, s1, pf, npf);
}

struct StageBuf {
  uint8_t* p = nullptr;
  size_t cap = 0;
  ~StageBuf() { std::free(p); }
  uint8_t* get(size_t n) {
    if (n > cap) {
      std::free(p);
      cap = (n + 4095) / 4096 * 4096;
      p = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
      if (!p) throw std::bad_alloc();
    }
    return p;
  }
};

void gemm_bf16_prefill(const PackedMatrixHeader* wh, const uint16_t* a, int64_t lda, int64_t m,
                       int64_t b0, int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = wh->kp, nsteps = kp / 2, bstride = kp * 32;
  // Rows whose stride has at most 512 B in common with 4 KiB already spread over
  // >= 8 L1 set positions: used in place.
  const uint8_t* st = reinterpret_cast<const uint8_t*>(a);
  int64_t astride = lda * 2;
  if ((astride & 4095 & -astride) == 0 || (astride & -astride) > 512) {
    static thread_local StageBuf buf;
    astride = kp * 2 + 64;
    uint8_t* stw = buf.get(size_t(m) * astride);
    for (int64_t i = 0; i < m; ++i)
      copy_bytes(stw + i * astride, reinterpret_cast<const uint8_t*>(a + i * lda), kp * 2);
    st = stw;
  }
  const uint8_t* data = packed_data(wh);
  auto group = [&](auto nb_tag, int64_t b) {
    constexpr int NB = decltype(nb_tag)::value;
    constexpr int kMR = kPMaxRows[NB];
    const int64_t nt = (m + kMR - 1) / kMR;
    const uint8_t* w = data + b * bstride;
    float* cb = c + (b - b0) * 16;
    for (int64_t s0 = 0; s0 < nsteps; s0 += kPChunk) {
      const int64_t s1 = s0 + kPChunk < nsteps ? s0 + kPChunk : nsteps;
      // Next chunk's weights (or the next group's first chunk), spread over the row tiles.
      const uint8_t* pf = nullptr;
      int64_t pf_steps = 0;
      if (s1 < nsteps) {
        pf = w + s1 * 64;
        pf_steps = std::min<int64_t>(kPChunk, nsteps - s1);
      } else if (b + 2 * NB <= b1) {
        pf = w + NB * bstride;
        pf_steps = std::min<int64_t>(kPChunk, nsteps);
      }
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t r0 = t * m / nt, r1 = (t + 1) * m / nt;
        const int64_t q0 = t * pf_steps / nt, q1 = (t + 1) * pf_steps / nt;
        ptile_rows<NB>(r1 - r0, w, bstride, st + r0 * astride, astride, cb + r0 * ldc, ldc, s0,
                       s1, pf + q0 * 64, q1 - q0);
      }
    }
  };
  int64_t b = b0;
  for (; b + 4 <= b1; b += 4) group(std::integral_constant<int, 4>{}, b);
  for (; b + 2 <= b1; b += 2) group(std::integral_constant<int, 2>{}, b);
  for (; b < b1; ++b) group(std::integral_constant<int, 1>{}, b);
}

}  // namespace

// w: kBF16 matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero padded);
// c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_bf16(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
               int64_t b1, float* c, int64_t ldc) {
  if (m > kRowTile) return gemm_bf16_prefill(w, a, lda, m, b0, b1, c, ldc);
  const int64_t kp = w->kp;
  const Bf16Gemm::Ctx ctx{packed_data(w), kp * 32, kp / 2, b0, c, ldc};
  run_tiles<Bf16Gemm>(ctx, reinterpret_cast<const uint8_t*>(a), lda * 2, m, b0, b1);
}

}  // namespace avx512
}  // namespace ktmoe
