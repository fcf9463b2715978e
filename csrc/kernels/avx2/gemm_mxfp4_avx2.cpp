// [NOTE] avx2 gemm_mxfp4 (AVX2): mxfp4_format.h's integer evaluation, the bits of generic's:
//   c[m, 16*(b - b0) + n] = Σ_j (float(d_j) · 2^-(s_j + 1)) · 2^(e[n, G(j)] - 127),
//   d_j = Σ_{k∈j} x[m][k] · 2e2m1(q[n][k]) over blocks j of 32 inputs, x = the int16 activations.
//
// Why integers: AVX2 has no bf16 dot, and the exact fp32 route (decode each code to fp32, one FMA
// per 8 weights) cost ~20 vector ops per 32 weights: 0.50x llama.cpp's MXFP4 x q8_0 at T=1 (reference
// shape). Here a k-quad (32 bytes, 16 columns x 4 inputs, kINT4A's nibble layout) costs 18 ops:
// 1 load; its two nibble planes (vpand; vpsrlw + vpand); one vpshufb each into u = 2e2m1 + 12 in
// [0, 24] (kMxfp4U8); per plane vpunpcklbw / vpunpckhbw with zero give 16-bit u, one dword per
// column holding its (k even, k odd) pair, the layout of the activation pair a vpbroadcastd loads;
// 4 vpmaddwd + 4 vpaddd into int32. Unpacking per 128-bit lane puts columns 0-3, 8-11 in one
// accumulator and 4-7, 12-15 in the other; the block end permutes them back.
// Range: |x| <= 2^14, u <= 24: a block's Σ x·u < 2^25 (int32), and d = Σ x·u - 12·Σ x (the dot
// starts at -12·Σx), |d| < 2^24, converts to fp32 exactly.
//   activations (quantize): per row and block, the largest |a| as int bits (vpmaxud), the shift of
//     mxfp4_block_shift, x = vcvtps2dq(a · 2^s) (round half even: MXCSR's default, as generic's
//     nearbyint), packed to int16; Σ x for the offset. About 1.5 % of a T=1 layer.
//   decode (1 row): one packed block at a time, its out[2] in registers over all inputs, the weight
//     stream prefetched kDecodeAhead bytes ahead into L2. Measured (reference layer, T=1, Zen 4,
//     KTMOE_ISA=avx2, 1 / 2 threads, medians of 500 calls): 4 blocks side by side with c in memory
//     1.62 / 0.91 ms (their 8 accumulators spill), 3 blocks 1.61 / 0.89, 2 blocks 1.85 / 0.98; one
//     block with out in registers 1.29 / 0.69 with no prefetch, 1.29 / 0.76 at 4 KiB, 1.26 / 0.68
//     at 8 KiB, 1.25 / 0.68 at 16 KiB.
//   prefill: per packed block and input block, the 16 u planes (1 KiB) decoded once into L1, then
//     tiles of 4 rows x 16 columns over them, c read and written per input block.
// Block end (either): vcvtdq2ps, x 2^-(s + 1), x 2^(e - 127) (built in registers once per block and
// group: vpmovzxbd, vpslld 23, e = 0 blended to 2^-127's bits), each product rounded before the add
// (never contracted to an FMA): out = (j == 0 ? +0 : out) + term.
#include "kernels/avx2/avx2_util.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace avx2 {
namespace {

constexpr int64_t kQuadsPerBlock = kMxfp4Group / 4;  // k-quads in a block of 32 inputs
constexpr int64_t kDecodeAhead = 8192;                // decode: weight prefetch distance (bytes, into L2)

// Rows quantized for the dot: x int16 [rows][kp]; per (row, block) the scale 2^-(s + 1) and 12·Σx.
struct QuantRows {
  int16_t* x;
  float* scale;
  int32_t* offset;
  int64_t kp, nj;  // nj = kp / 32
};

// a: bf16 rows [rows, lda] -> q (kp a multiple of 32).
void quantize(const uint16_t* a, int64_t lda, int64_t rows, const QuantRows& q) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), ones = _mm256_set1_epi16(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < q.nj; ++j) {
      const uint16_t* src = a + r * lda + j * kMxfp4Group;
      __m256 v[4];
      __m256i mx = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        v[i] = bf16x8_to_f32(src + 8 * i);
        mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_castps_si256(v[i]), abs_mask));
      }
      __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
      m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4E));
      m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xB1));
      const int s = mxfp4_block_shift(uint32_t(_mm_cvtsi128_si32(m4)));
      const int64_t row_j = r * q.nj + j;
      q.scale[row_j] = mxfp4_block_scale(s);
      int16_t* x = q.x + r * q.kp + j * kMxfp4Group;
      if (s == kMxfp4NonFinite) {
        std::memset(x, 0, kMxfp4Group * sizeof(int16_t));
        q.offset[row_j] = 0;
        continue;
      }
      const __m256 f = _mm256_set1_ps(mxfp4_pow2(s));
      __m256i i32[4];
      for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], f));
      // packs interleaves per 128-bit lane; vpermq 0xD8 puts inputs back in order
      const __m256i x0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[0], i32[1]), 0xD8);
      const __m256i x1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[2], i32[3]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), x0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 16), x1);
      const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(x0, ones), _mm256_madd_epi16(x1, ones));
      q.offset[row_j] = kMxfp4U8Offset * hsum8_epi32(sum);
    }
}

// The 16 u planes' halves of k-quad `quad` of a block: u[0], u[1] = low plane (inputs 4t, 4t+1),
// columns 0-3 | 8-11 and 4-7 | 12-15; u[2], u[3] = high plane (4t+2, 4t+3).
inline void decode_quad(const uint8_t* quad, __m256i table, __m256i (&u)[4]) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad));
  const __m256i nibble = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
  const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nibble));
  const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
  u[0] = _mm256_unpacklo_epi8(lo, zero), u[1] = _mm256_unpackhi_epi8(lo, zero);
  u[2] = _mm256_unpacklo_epi8(hi, zero), u[3] = _mm256_unpackhi_epi8(hi, zero);
}

// The 16 columns' 2^(e - 127) from their E8M0 bytes at rec (h = 0: columns 0-7, 1: 8-15).
inline __m256 e8m0_scale(const uint8_t* rec, int h) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 8 * h)));
  const __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000),
                                          _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  return _mm256_castsi256_ps(bits);
}

// out[0..1] (columns 0-7, 8-15) += (float(dot) · scale) · sw: dot[0] columns 0-3 | 8-11, dot[1] columns
// 4-7 | 12-15 (the offset already in them), sw[0..1]: the columns' 2^(e - 127) (e8m0_scale).
inline void block_end(const __m256i (&dot)[2], float scale, const __m256 (&sw)[2], __m256 (&out)[2]) {
  const __m256 f0 = _mm256_cvtepi32_ps(dot[0]), f1 = _mm256_cvtepi32_ps(dot[1]);
  const __m256 cols[2] = {_mm256_permute2f128_ps(f0, f1, 0x20), _mm256_permute2f128_ps(f0, f1, 0x31)};
  const __m256 t = _mm256_set1_ps(scale);
  for (int h = 0; h < 2; ++h) {
    const __m256 scaled = rounded(_mm256_mul_ps(cols[h], t));
    out[h] = _mm256_add_ps(out[h], rounded(_mm256_mul_ps(scaled, sw[h])));
  }
}

struct Weights {
  const uint8_t* data;    // block 0
  const uint8_t* scales;  // block 0, group 0
  int64_t bstride;        // bytes of one packed block's data
  int64_t ngroups, blocks_per_group;  // group g holds input blocks [g, g + 1) * blocks_per_group (group / 32)
  inline const uint8_t* record(int64_t b, int64_t g) const { return scales + (b * ngroups + g) * kMxfp4ScaleRecordBytes; }
};

// Row r of q x packed block b, all inputs: one stream, its line kAhead bytes ahead prefetched into L2
// once per 64 bytes; c: the row's 16 outputs.
template <int64_t kAhead>
void decode_tile(const Weights& w, const QuantRows& q, int64_t r, int64_t b, float* c) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4U8.v)));
  const uint8_t* wb = w.data + b * w.bstride;
  const int16_t* x = q.x + r * q.kp;
  __m256 out[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < w.ngroups; ++g)
    for (int64_t j = g * w.blocks_per_group; j < (g + 1) * w.blocks_per_group; ++j) {
      const __m256i off = _mm256_set1_epi32(-q.offset[r * q.nj + j]);
      __m256i dot[2] = {off, off};
      for (int64_t t = j * kQuadsPerBlock; t < (j + 1) * kQuadsPerBlock; ++t) {
        if constexpr (kAhead > 0)
          if (t % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(wb + t * 32 + kAhead), _MM_HINT_T1);
        const __m256i xl = broadcast32(x + 4 * t), xh = broadcast32(x + 4 * t + 2);
        __m256i u[4];
        decode_quad(wb + t * 32, table, u);
        dot[0] = _mm256_add_epi32(dot[0], _mm256_add_epi32(_mm256_madd_epi16(u[0], xl), _mm256_madd_epi16(u[2], xh)));
        dot[1] = _mm256_add_epi32(dot[1], _mm256_add_epi32(_mm256_madd_epi16(u[1], xl), _mm256_madd_epi16(u[3], xh)));
      }
      const __m256 sw[2] = {e8m0_scale(w.record(b, g), 0), e8m0_scale(w.record(b, g), 1)};
      block_end(dot, q.scale[r * q.nj + j], sw, out);
    }
  _mm256_storeu_ps(c, out[0]);
  _mm256_storeu_ps(c + 8, out[1]);
}

// Rows [r, r + MR) of q x input block j of packed block b, over its decoded planes (panel: 8 quads x 4 ymm).
template <int MR>
void prefill_tile(const Weights& w, const QuantRows& q, const __m256i* panel, int64_t r, int64_t b, int64_t j,
                  int64_t g, float* c, int64_t ldc) {
  __m256i dot[MR][2];
  for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = _mm256_set1_epi32(-q.offset[(r + i) * q.nj + j]);
  for (int64_t t = 0; t < kQuadsPerBlock; ++t) {
    const __m256i* u = panel + 4 * t;
    const int16_t* x = q.x + r * q.kp + j * kMxfp4Group + 4 * t;
    for (int i = 0; i < MR; ++i) {
      const __m256i xl = broadcast32(x + i * q.kp), xh = broadcast32(x + i * q.kp + 2);
      dot[i][0] = _mm256_add_epi32(dot[i][0], _mm256_add_epi32(_mm256_madd_epi16(u[0], xl), _mm256_madd_epi16(u[2], xh)));
      dot[i][1] = _mm256_add_epi32(dot[i][1], _mm256_add_epi32(_mm256_madd_epi16(u[1], xl), _mm256_madd_epi16(u[3], xh)));
    }
  }
  const __m256 sw[2] = {e8m0_scale(w.record(b, g), 0), e8m0_scale(w.record(b, g), 1)};
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    __m256 out[2] = {j == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(ci), j == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(ci + 8)};
    block_end(dot[i], q.scale[(r + i) * q.nj + j], sw, out);
    _mm256_storeu_ps(ci, out[0]);
    _mm256_storeu_ps(ci + 8, out[1]);
  }
}

}  // namespace

// w: kMXFP4 matrix; a: bf16 [M, lda] (kp columns used, zero past k); c: fp32 [M, ldc], 16*(b1-b0) columns.
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  const int64_t kp = w->kp, nblk = b1 - b0, nj = kp / kMxfp4Group;
  if (m <= 0 || nblk <= 0) return;
  const Weights wt{packed_data(w), packed_scales(w), int4a_block_data_bytes(kp), kp / w->group, w->group / kMxfp4Group};
  const int64_t chunk = std::min(m, kRowChunk);
  // scratch: x [chunk][kp] int16, then scale [chunk][nj] fp32 and offset [chunk][nj] int32
  uint8_t* s = static_cast<uint8_t*>(thread_scratch(size_t(chunk * (kp * 2 + nj * 8))));
  const QuantRows q{reinterpret_cast<int16_t*>(s), reinterpret_cast<float*>(s + chunk * kp * 2),
                    reinterpret_cast<int32_t*>(s + chunk * kp * 2 + chunk * nj * 4), kp, nj};
  alignas(32) __m256i panel[kQuadsPerBlock * 4];
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4U8.v)));
  for (int64_t r0 = 0; r0 < m; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, m - r0);
    quantize(a + r0 * lda, lda, rows, q);
    float* cr = c + r0 * ldc;
    if (rows == 1) {  // decode: stream the blocks once, 4 side by side
      for (int64_t b = 0; b < nblk; ++b) decode_tile<kDecodeAhead>(wt, q, 0, b0 + b, cr + b * 16);
      continue;
    }
    for (int64_t b = 0; b < nblk; ++b) {
      const uint8_t* wb = wt.data + (b0 + b) * wt.bstride;
      for (int64_t j = 0; j < nj; ++j) {
        for (int64_t t = 0; t < kQuadsPerBlock; ++t) {
          __m256i u[4];
          decode_quad(wb + (j * kQuadsPerBlock + t) * 32, table, u);
          for (int h = 0; h < 4; ++h) _mm256_store_si256(panel + 4 * t + h, u[h]);
        }
        for_row_tiles(rows, [&](auto mr, int64_t r) {
          prefill_tile<decltype(mr)::value>(wt, q, panel, r, b0 + b, j, j / wt.blocks_per_group, cr + r * ldc + b * 16,
                                            ldc);
        });
      }
    }
  }
}

}  // namespace avx2
}  // namespace ktmoe
