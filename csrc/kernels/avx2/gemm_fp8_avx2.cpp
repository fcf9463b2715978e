// [NOTE] avx2 gemm_fp8 (AVX2 + FMA + F16C): c[m, 16*(b - b0) + j] =
//   Σ_G s[16b + j, G] · Σ_{k∈G} a[m][k] · e4m3(W[16b + j][k])      (fp8_format.h)
//
// Decode of one k-pair of a block (32 bytes, word j = column j's even-k byte low,
// odd-k byte high) to fp32 e4m3 * 2^-8 (exact; the scale is taken * 2^8): the fp16
// with bits sign<<15 | magnitude<<7 is that value (fp16 exponent bias 15 instead of
// e4m3's 7, and fp16 subnormals are e4m3's), and vcvtph2ps converts it exactly:
//   even k: ((v << 8) >>arith 1) & 0xBF80,   odd k: (v >>arith 1) & 0xBF80
// (the arithmetic shift copies the sign into bit 15; the mask drops its copy in bit
// 14 and the other byte), then 4 vcvtph2ps (columns 0-7 / 8-15, even / odd k): no
// branch, subnormals included. ~13 vector uops + 4 FMAs per 32 weights and row, so a
// decode row is bound by these instructions: measured 17.6 GB/s of fp8 weights in L2
// and 13.7 out of cache (1 thread, loaded AVX-512 host, read roof 27 GB/s in that run).
//
// Accumulation, the same in every path, per column: for each k-group G, acc = +0,
// then acc = fma(w, a, acc) for k ascending (even then odd k of a pair; the product of
// a bf16 and an e4m3 value is exact in fp32, so this is the generic kernel's sum), then
// c = c + (s * 2^8) * acc (c = +0 before the first group), a multiply and an add.
// So the bits depend neither on the (b0, b1) split nor on M.
//
// Activations are widened to fp32 once per chunk of kRowChunk rows (broadcast from
// memory in the inner loops, as gemm_bf16_avx2).
//   decode (1 row): 4 blocks side by side, decoded in registers, read once: 8
//     independent FMA chains;
//   prefill: per block, per k-chunk of <= kPanelPairs k-pairs inside one group, the
//     chunk is decoded once into an fp32 panel (L1), then tiles of 4 rows x 16 columns
//     run over it; a group split over chunks keeps its exact partial acc in a buffer.
//     The decode prefetches the next chunk (measured: m = 4 / 8 from ~2.0 / 3.6 ms to
//     ~1.6 / 2.9 ms, 4 experts of 1536 x 2048, 1 thread, loaded host).
#include <vector>

#include "kernels/avx2/avx2_util.h"
#include "kernels/fp8_format.h"

namespace ktmoe {
namespace avx2 {
namespace {

constexpr int64_t kPanelPairs = 64;  // k-pairs per decoded panel: 64 x 128 B = 8 KiB

// w[0..3] = columns 0-7 even k, 8-15 even k, 0-7 odd k, 8-15 odd k of the k-pair at p.
inline void decode_pair(const uint8_t* p, __m256i mask, __m256 (&w)[4]) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i he = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), mask);
  const __m256i ho = _mm256_and_si256(_mm256_srai_epi16(v, 1), mask);
  w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(he));
  w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(he, 1));
  w[2] = _mm256_cvtph_ps(_mm256_castsi256_si128(ho));
  w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(ho, 1));
}

struct Fp8Ctx {
  const uint8_t* data;
  const uint8_t* scales;
  int64_t bstride;  // kp * 16
  int64_t ngroups;  // kp / group
  int64_t spg;      // k-pairs per group
};

// c[0..15] = (g == 0 ? +0 : c) + (s[b, g] * 2^8) * acc.
inline void group_end(const Fp8Ctx& x, int64_t b, int64_t g, const __m256 (&acc)[2], float* c) {
  const float* s = reinterpret_cast<const float*>(x.scales + (b * x.ngroups + g) * kFp8ScaleBytes);
  const __m256 k256 = _mm256_set1_ps(kE4m3KernelScale);
  for (int h = 0; h < 2; ++h) {
    const __m256 prev = g == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(c + 8 * h);
    const __m256 sh = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * h), k256);
    _mm256_storeu_ps(c + 8 * h, _mm256_add_ps(prev, _mm256_mul_ps(sh, acc[h])));
  }
}

// One fp32 row a32 x blocks [b, b+NB), all k, weights decoded in registers.
template <int NB>
void dtile(const Fp8Ctx& x, const float* a32, int64_t b, float* c) {
  const __m256i mask = _mm256_set1_epi16(int16_t(0xBF80));
  const uint8_t* w = x.data + b * x.bstride;
  for (int64_t g = 0; g < x.ngroups; ++g) {
    __m256 acc[NB][2];
    for (int j = 0; j < NB; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t p = g * x.spg; p < (g + 1) * x.spg; ++p) {
      const __m256 ae = _mm256_broadcast_ss(a32 + 2 * p), ao = _mm256_broadcast_ss(a32 + 2 * p + 1);
      for (int j = 0; j < NB; ++j) {
        __m256 wv[4];
        decode_pair(w + j * x.bstride + p * 32, mask, wv);
        acc[j][0] = _mm256_fmadd_ps(wv[0], ae, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(wv[1], ae, acc[j][1]);
        acc[j][0] = _mm256_fmadd_ps(wv[2], ao, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(wv[3], ao, acc[j][1]);
      }
    }
    for (int j = 0; j < NB; ++j) group_end(x, b + j, g, acc[j], c + 16 * j);
  }
}

// Rows [0, MR) of a32 (stride ld32) x block b x k-pairs [s0, s1) of group g over the
// decoded panel ([s1 - s0][4] ymm); part: the rows' partial sums ([MR][16]).
template <int MR>
void ptile(const Fp8Ctx& x, const float* panel, const float* a32, int64_t ld32, int64_t b, int64_t g,
           int64_t s0, int64_t s1, bool first, bool last, float* part, float* c, int64_t ldc) {
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h)
      acc[r][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + r * 16 + 8 * h);
  for (int64_t p = s0; p < s1; ++p) {
    const float* wp = panel + (p - s0) * 32;
    const __m256 e0 = _mm256_load_ps(wp), e1 = _mm256_load_ps(wp + 8);
    const __m256 o0 = _mm256_load_ps(wp + 16), o1 = _mm256_load_ps(wp + 24);
    for (int r = 0; r < MR; ++r) {
      const __m256 ae = _mm256_broadcast_ss(a32 + r * ld32 + 2 * p);
      acc[r][0] = _mm256_fmadd_ps(e0, ae, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(e1, ae, acc[r][1]);
      const __m256 ao = _mm256_broadcast_ss(a32 + r * ld32 + 2 * p + 1);
      acc[r][0] = _mm256_fmadd_ps(o0, ao, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(o1, ao, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (last)
      group_end(x, b, g, acc[r], c + r * ldc);
    else
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(part + r * 16 + 8 * h, acc[r][h]);
  }
}

}  // namespace

// w: kFP8 matrix; a: bf16 [M, lda] (kp columns used); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, nblk = b1 - b0;
  if (m <= 0 || nblk <= 0) return;
  const Fp8Ctx x{packed_data(w), packed_scales(w), fp8_block_data_bytes(kp), kp / w->group, w->group / 2};
  float* a32 = static_cast<float*>(thread_scratch(size_t(std::min(m, kRowChunk) * kp) * 4));
  thread_local std::vector<float> panel_buf, part_buf;
  panel_buf.resize(size_t(kPanelPairs * 32 + 16));
  part_buf.resize(size_t(kRowChunk * 16));
  float* panel = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(panel_buf.data()) + 63) & ~uintptr_t(63));
  const __m256i mask = _mm256_set1_epi16(int16_t(0xBF80));
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    bf16_rows_to_f32(a + r0 * lda, lda, rows, kp, a32);
    float* cr = c + r0 * ldc;
    if (rows == 1) {  // decode: stream the blocks once, 4 side by side
      int64_t b = 0;
      for (; b + 4 <= nblk; b += 4) dtile<4>(x, a32, b0 + b, cr + b * 16);
      for (; b < nblk; ++b) dtile<1>(x, a32, b0 + b, cr + b * 16);
      continue;
    }
    for (int64_t b = 0; b < nblk; ++b) {
      const uint8_t* wb = x.data + (b0 + b) * x.bstride;
      for (int64_t g = 0; g < x.ngroups; ++g)
        for (int64_t s0 = g * x.spg; s0 < (g + 1) * x.spg; s0 += kPanelPairs) {
          const int64_t s1 = std::min(s0 + kPanelPairs, (g + 1) * x.spg);
          for (int64_t p = s0; p < s1; ++p) {
            if ((p & 1) == 0)  // the next panel's line: its load overlaps this panel's tiles
              _mm_prefetch(reinterpret_cast<const char*>(wb + (p + kPanelPairs) * 32), _MM_HINT_T0);
            __m256 wv[4];
            decode_pair(wb + p * 32, mask, wv);
            for (int q = 0; q < 4; ++q) _mm256_store_ps(panel + (p - s0) * 32 + 8 * q, wv[q]);
          }
          const bool first = s0 == g * x.spg, last = s1 == (g + 1) * x.spg;
          for_row_tiles(rows, [&](auto mr, int64_t r) {
            ptile<decltype(mr)::value>(x, panel, a32 + r * kp, kp, b0 + b, g, s0, s1, first, last,
                                       part_buf.data() + r * 16, cr + r * ldc + b * 16, ldc);
          });
        }
    }
  }
}

}  // namespace avx2
}  // namespace ktmoe
