// [NOTE] The avx2 tile loops of the bf16-activation formats whose weights are decoded to
// fp32 in registers and scaled per (column, k-group): kFP8 (gemm_fp8_avx2.cpp) and kINT4A
// (gemm_int4_affine_avx2.cpp). One set of templates, one decoder per format:
//   kRowSums                      whether group_end takes the row's Σ a of the group
//   kPairBytes                    bytes of one k-pair of a block (32 for e4m3, 16 for nibbles)
//   pair(block, p, w[4])          k-pair p of a block -> fp32: columns 0-7 / 8-15 of the even k,
//                                 then of the odd k
//   group_end(b, g, acc[2], xsum, c)  c[0..15] = (g == 0 ? +0 : c) + the scaled group
//
// Accumulation, the same in every path, per column: for each k-group G, acc = +0, then
// acc = fma(w, a, acc) for k ascending (even then odd k of a pair; a bf16 times a decoded
// weight is exact in fp32, so this is the generic kernel's sum), then the decoder's group
// end (a multiply and an add per term, as generic's). With kRowSums the row sums
// xsum_G = Σ_{k∈G} a[k] are added in k order, as generic's. So the bits depend neither on
// the (b0, b1) split nor on M.
//
// Activations are widened to fp32 once per chunk of kRowChunk rows (broadcast from
// memory in the inner loops, as gemm_bf16_avx2).
//   decode (1 row): 4 blocks side by side, decoded in registers, read once: 8
//     independent FMA chains;
//   prefill: per block, per k-chunk of <= kPanelPairs k-pairs inside one group, the
//     chunk is decoded once into an fp32 panel (L1), then tiles of 4 rows x 16 columns
//     run over it; a group split over chunks keeps its exact partial acc in a buffer.
//     The decode prefetches the next chunk (measured with fp8: m = 4 / 8 from ~2.0 / 3.6 ms
//     to ~1.6 / 2.9 ms, 4 experts of 1536 x 2048, 1 thread, loaded host).
#pragma once
#include <vector>

#include "kernels/avx2/avx2_util.h"

namespace ktmoe {
namespace avx2 {
namespace decoded {

constexpr int64_t kPanelPairs = 64;  // k-pairs per decoded panel: 64 x 128 B = 8 KiB
// Decode tiles: bytes ahead of each block's stream prefetched into L2 (0: none). None: these
// decode rows are bound by their instructions, not by the reads (benchmarks/micro/avx2_decode_micro.cpp,
// M = 1, 1 thread, loaded 2-core Zen 5: fp8 decodes 18 GB/s hot in L2 and 13 GB/s cold against a
// 20-23 GB/s read; 1-4 KiB ahead into L2 left cold within 2 % and made hot 20 % slower;
// int4_affine, 8 GB/s hot, within 6 % cold and slower hot).
constexpr int64_t kDecodeAhead = 0;

// A decoder's (block, group) scale records, record_bytes each, from the start of the scales.
struct GroupRecords {
  const uint8_t* scales;  // block 0, group 0
  int64_t ngroups, record_bytes;
  inline const uint8_t* record(int64_t b, int64_t g) const { return scales + (b * ngroups + g) * record_bytes; }
};

struct Ctx {
  const uint8_t* data;  // block 0
  int64_t bstride;      // bytes of one block's data
  int64_t ngroups;      // kp / group
  int64_t spg;          // k-pairs per group
};

// One fp32 row a32 x blocks [b, b+NB), all k, weights decoded in registers; xs: the row's group sums.
// Once per 64 bytes of each stream, its line kAhead bytes ahead goes into L2; past the block's
// end, the same offset of block j + NB (the next tile's; past the matrix a harmless hint).
template <class Dec, int NB, int64_t kAhead>
void dtile(const Dec& dec, const Ctx& x, const float* a32, const float* xs, int64_t b, float* c) {
  const uint8_t* w = x.data + b * x.bstride;
  for (int64_t g = 0; g < x.ngroups; ++g) {
    __m256 acc[NB][2];
    for (int j = 0; j < NB; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t p = g * x.spg; p < (g + 1) * x.spg; ++p) {
      if constexpr (kAhead > 0)
        if ((p * Dec::kPairBytes) % 64 == 0) {
          const int64_t o = p * Dec::kPairBytes + kAhead;
          const uint8_t* f = o < x.bstride ? w + o : w + NB * x.bstride + (o - x.bstride);
          for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(f + j * x.bstride), _MM_HINT_T1);
        }
      const __m256 ae = _mm256_broadcast_ss(a32 + 2 * p), ao = _mm256_broadcast_ss(a32 + 2 * p + 1);
      for (int j = 0; j < NB; ++j) {
        __m256 wv[4];
        dec.pair(w + j * x.bstride, p, wv);
        acc[j][0] = _mm256_fmadd_ps(wv[0], ae, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(wv[1], ae, acc[j][1]);
        acc[j][0] = _mm256_fmadd_ps(wv[2], ao, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(wv[3], ao, acc[j][1]);
      }
    }
    for (int j = 0; j < NB; ++j) dec.group_end(b + j, g, acc[j], xs ? xs[g] : 0.f, c + 16 * j);
  }
}

// Rows [0, MR) of a32 (stride ld32) x block b x k-pairs [s0, s1) of group g over the
// decoded panel ([s1 - s0][4] ymm); part: the rows' partial sums ([MR][16]); xs: row 0's
// group sums (stride ngroups).
template <class Dec, int MR>
void ptile(const Dec& dec, const Ctx& x, const float* panel, const float* a32, int64_t ld32, const float* xs,
           int64_t b, int64_t g, int64_t s0, int64_t s1, bool first, bool last, float* part, float* c, int64_t ldc) {
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
      dec.group_end(b, g, acc[r], xs ? xs[r * x.ngroups + g] : 0.f, c + r * ldc);
    else
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(part + r * 16 + 8 * h, acc[r][h]);
  }
}

// xs[r * ngroups + g] = Σ_{k∈g} a32[r][k], k ascending (generic's order), r < rows.
inline void row_group_sums(const float* a32, int64_t kp, int64_t rows, int64_t group, float* xs) {
  const int64_t ngroups = kp / group;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < ngroups; ++g) {
      float s = 0.f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) s += a32[r * kp + k];
      xs[r * ngroups + g] = s;
    }
}

// a: bf16 [M, lda] (kp columns used); c: fp32 [M, ldc], 16*(b1-b0) columns. kAhead: the decode
// tiles' prefetch distance (benchmarks/micro/avx2_decode_micro.cpp varies it).
template <class Dec, int64_t kAhead = kDecodeAhead>
void gemm(const Dec& dec, const Ctx& x, int64_t kp, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
          int64_t b1, float* c, int64_t ldc) {
  const int64_t nblk = b1 - b0;
  if (m <= 0 || nblk <= 0) return;
  float* a32 = static_cast<float*>(thread_scratch(size_t(std::min(m, kRowChunk) * kp) * 4));
  thread_local std::vector<float> panel_buf, part_buf, xs_buf;
  panel_buf.resize(size_t(kPanelPairs * 32 + 16));
  part_buf.resize(size_t(kRowChunk * 16));
  if (Dec::kRowSums) xs_buf.resize(size_t(kRowChunk * x.ngroups));
  float* panel = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(panel_buf.data()) + 63) & ~uintptr_t(63));
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    bf16_rows_to_f32(a + r0 * lda, lda, rows, kp, a32);
    const float* xs = nullptr;
    if (Dec::kRowSums) {
      row_group_sums(a32, kp, rows, kp / x.ngroups, xs_buf.data());
      xs = xs_buf.data();
    }
    float* cr = c + r0 * ldc;
    if (rows == 1) {  // decode: stream the blocks once, 4 side by side
      int64_t b = 0;
      for (; b + 4 <= nblk; b += 4) dtile<Dec, 4, kAhead>(dec, x, a32, xs, b0 + b, cr + b * 16);
      for (; b < nblk; ++b) dtile<Dec, 1, kAhead>(dec, x, a32, xs, b0 + b, cr + b * 16);
      continue;
    }
    for (int64_t b = 0; b < nblk; ++b) {
      const uint8_t* wb = x.data + (b0 + b) * x.bstride;
      for (int64_t g = 0; g < x.ngroups; ++g)
        for (int64_t s0 = g * x.spg; s0 < (g + 1) * x.spg; s0 += kPanelPairs) {
          const int64_t s1 = std::min(s0 + kPanelPairs, (g + 1) * x.spg);
          for (int64_t p = s0; p < s1; ++p) {
            if ((p * Dec::kPairBytes) % 64 == 0)  // the next panel's line: its load overlaps this panel's tiles
              _mm_prefetch(reinterpret_cast<const char*>(wb + (p + kPanelPairs) * Dec::kPairBytes), _MM_HINT_T0);
            __m256 wv[4];
            dec.pair(wb, p, wv);
            for (int q = 0; q < 4; ++q) _mm256_store_ps(panel + (p - s0) * 32 + 8 * q, wv[q]);
          }
          const bool first = s0 == g * x.spg, last = s1 == (g + 1) * x.spg;
          for_row_tiles(rows, [&](auto mr, int64_t r) {
            ptile<Dec, decltype(mr)::value>(dec, x, panel, a32 + r * kp, kp, xs ? xs + r * x.ngroups : nullptr,
                                            b0 + b, g, s0, s1, first, last, part_buf.data() + r * 16,
                                            cr + r * ldc + b * 16, ldc);
          });
        }
    }
  }
}

// The gemm of w with the decoder Dec(scales, ngroups); bstride: the bytes of one block's data.
template <class Dec>
void gemm_of(const PackedMatrixHeader* w, int64_t bstride, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
             int64_t b1, float* c, int64_t ldc) {
  const int64_t kp = w->kp, ngroups = kp / w->group;
  gemm(Dec(packed_scales(w), ngroups), Ctx{packed_data(w), bstride, ngroups, w->group / 2}, kp, a, lda, m, b0, b1, c,
       ldc);
}

}  // namespace decoded
}  // namespace avx2
}  // namespace ktmoe
