// [NOTE] avx512 gemm_ggml: a GGML matrix where it lies (isa_kernels.h's contract).
//
// Every weight of a GGML type is  scale_g · q − min_g  for its group g (16 or 32 weights of a block):
// q an exact small integer or level (q4_K's nibble, q6_K's 6 bits − 32, q8_0's byte), scale_g and
// min_g fp32 values that gguf's formula rounds once each (q4_K: d·sc_j and dmin·m_j). The types with a
// kernel here (q4_K, q6_K, q8_0: Q4_K_M's and Q8_0's) are computed without forming the weights:
//   per call      the activation rows widened to fp32 once, and (types with mins) each group's Σ x;
//   per block     its codes q as exact floats (vectorized: bytes -> int32 lanes -> fp32) in an L1
//                 buffer, its group scales and mins;
//   per row r     t = Σ_{lanes of the group} x·q  (a 16-lane product, exact for one nonzero x),
//                 acc_r = fma(scale_g, t, acc_r) lane-wise over all groups, corr_r += min_g · Σ_g x,
//                 c[r][i] = (sum of acc_r's lanes) − corr_r.
// So a unit activation row reads back gguf's weight exactly (round(round(scale·q) − min): every other
// product is an exact zero), and random rows give fp32 sums. Rows are taken kRows at a time, so a
// block's codes are extracted once for up to kRows rows. Other types decode each weight row exactly
// (the type's decoder, kernels/ggml/ggml_decode.cpp) into an fp32 row and dot it with every activation
// row. Output (r, i) depends only on rows r and i: the same bits for any split of n.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/avx512/avx512_common.h"
#include "kernels/generic/f16_scalar.h"
#include "kernels/ggml/ggml_blocks.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

constexpr int kRows = 4;  // activation rows per pass over a weight row

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// 16 bytes at p as 16 int32 lanes (unsigned / signed).
inline __m512i u8x16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i s8x16(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// The types' block splits: q[kElems] exact floats, scale[kGroups], min[kGroups] (kMins only).
struct Q8_0 {
  static constexpr int kElems = 32, kBytes = 34, kGroup = 32;
  static constexpr bool kMins = false;
  static void split(const uint8_t* b, float* q, float* scale, float*) {
    scale[0] = f16_at(b);
    _mm512_store_ps(q, _mm512_cvtepi32_ps(s8x16(b + 2)));
    _mm512_store_ps(q + 16, _mm512_cvtepi32_ps(s8x16(b + 18)));
  }
};

struct Q4_K {  // sub-block j = 2c + s: nibble s of qs[32c + l]
  static constexpr int kElems = 256, kBytes = 144, kGroup = 32;
  static constexpr bool kMins = true;
  static void split(const uint8_t* b, float* q, float* scale, float* min) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      ggml::q4k_scale_min(b + 4, j, &sc, &m);
      scale[j] = d * float(sc);
      min[j] = dmin * float(m);
    }
    const uint8_t* qs = b + 16;
    const __m512i low = _mm512_set1_epi32(0xF);
    for (int c = 0; c < 4; ++c)
      for (int h = 0; h < 2; ++h) {
        const __m512i v = u8x16(qs + 32 * c + 16 * h);
        _mm512_store_ps(q + 64 * c + 16 * h, _mm512_cvtepi32_ps(_mm512_and_si512(v, low)));
        _mm512_store_ps(q + 64 * c + 32 + 16 * h, _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)));
      }
  }
};

struct Q6_K {  // element 128 h + 64 s + l: nibble s of ql[64 h + l] | bits 2t of qh[32 h + l % 32] << 4, - 32
  static constexpr int kElems = 256, kBytes = 210, kGroup = 16;
  static constexpr bool kMins = false;
  static void split(const uint8_t* b, float* q, float* scale, float*) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const float d = f16_at(b + 208);
    for (int g = 0; g < 16; ++g) scale[g] = d * float(int8_t(b[192 + g]));
    const __m512i low = _mm512_set1_epi32(0xF), two = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
    for (int h = 0; h < 2; ++h)
      for (int quarter = 0; quarter < 4; ++quarter) {  // l = 16 quarter + lane
        const __m512i lo = u8x16(ql + 64 * h + 16 * quarter);
        const __m512i hi = u8x16(qh + 32 * h + 16 * (quarter % 2));
        for (int s = 0; s < 2; ++s) {
          const int t = 2 * s + quarter / 2;
          const __m512i nib = s ? _mm512_srli_epi32(lo, 4) : _mm512_and_si512(lo, low);
          const __m512i top = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2 * t), two), 4);
          const __m512i v = _mm512_sub_epi32(_mm512_or_si512(nib, top), bias);
          _mm512_store_ps(q + 128 * h + 64 * s + 16 * quarter, _mm512_cvtepi32_ps(v));
        }
      }
  }
};

// Per-thread scratch: fp32 activation rows, their group sums, one block's codes.
struct CallScratch {
  Scratch x, gsum;
};
thread_local CallScratch tl;

// c[r][i] for rows r0 .. r0 + R of x, weight rows [0, n).
template <class T, int R>
void rows_pass(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t nblocks, const float* x, int64_t ldx,
               const float* gsum, int64_t ldg, float* c, int64_t ldc) {
  constexpr int kGroups = T::kElems / T::kGroup;
  alignas(64) float q[T::kElems];
  float scale[kGroups], min[kGroups];
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = w + i * row_bytes;
    __m512 acc[R];
    float corr[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_setzero_ps();
      corr[r] = 0.f;
    }
    for (int64_t b = 0; b < nblocks; ++b) {
      T::split(row + b * T::kBytes, q, scale, min);
      for (int g = 0; g < kGroups; ++g) {
        const __m512 sv = _mm512_set1_ps(scale[g]);
        const __m512 q0 = _mm512_load_ps(q + g * T::kGroup);
        const __m512 q1 = T::kGroup == 32 ? _mm512_load_ps(q + g * T::kGroup + 16) : q0;
        for (int r = 0; r < R; ++r) {
          const float* xr = x + r * ldx + b * T::kElems + g * T::kGroup;
          __m512 t = _mm512_mul_ps(_mm512_loadu_ps(xr), q0);
          if (T::kGroup == 32) t = _mm512_fmadd_ps(_mm512_loadu_ps(xr + 16), q1, t);
          acc[r] = _mm512_fmadd_ps(sv, t, acc[r]);
        }
      }
      if (T::kMins)
        for (int r = 0; r < R; ++r) {
          const float* gs = gsum + r * ldg + b * kGroups;
          for (int g = 0; g < kGroups; ++g) corr[r] += min[g] * gs[g];
        }
    }
    for (int r = 0; r < R; ++r) c[r * ldc + i] = _mm512_reduce_add_ps(acc[r]) - corr[r];
  }
}

template <class T>
void gemm_split(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const uint16_t* a, int64_t lda, int64_t m,
                float* c, int64_t ldc) {
  const int64_t nblocks = k / T::kElems, ngroups = k / T::kGroup;
  float* x = reinterpret_cast<float*>(tl.x.at_least(size_t(m * k) * 4));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t kk = 0; kk < k; kk += 16) _mm512_storeu_ps(x + r * k + kk, bf16x16_to_f32(a + r * lda + kk));
  float* gsum = nullptr;
  if (T::kMins) {
    gsum = reinterpret_cast<float*>(tl.gsum.at_least(size_t(m * ngroups) * 4));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t g = 0; g < ngroups; ++g) {
        float s = 0.f;
        for (int l = 0; l < T::kGroup; ++l) s += x[r * k + g * T::kGroup + l];
        gsum[r * ngroups + g] = s;
      }
  }
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const float* xr = x + r0 * k;
    const float* gr = gsum ? gsum + r0 * ngroups : nullptr;
    float* cr = c + r0 * ldc;
    switch (std::min<int64_t>(kRows, m - r0)) {
      case 1: rows_pass<T, 1>(w, row_bytes, n, nblocks, xr, k, gr, ngroups, cr, ldc); break;
      case 2: rows_pass<T, 2>(w, row_bytes, n, nblocks, xr, k, gr, ngroups, cr, ldc); break;
      case 3: rows_pass<T, 3>(w, row_bytes, n, nblocks, xr, k, gr, ngroups, cr, ldc); break;
      default: rows_pass<T, 4>(w, row_bytes, n, nblocks, xr, k, gr, ngroups, cr, ldc); break;
    }
  }
}

// Any decodable type: each weight row decoded exactly into an fp32 row, dotted with every activation row
// (16 lanes, two accumulators over k, a masked tail for plain types whose k is no multiple of 16).
void gemm_decoded_rows(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                       const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  thread_local std::vector<float> row;
  row.resize(size_t(k));
  const int64_t k32 = k / 32 * 32, k16 = k / 16 * 16;
  const __mmask16 tail = first_lanes(k - k16);
  for (int64_t i = 0; i < n; ++i) {
    type.decode(w + i * row_bytes, k / type.block_elems, row.data());
    const float* wr = row.data();
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t* ar = a + r * lda;
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      int64_t kk = 0;
      for (; kk < k32; kk += 32) {
        acc0 = _mm512_fmadd_ps(bf16x16_to_f32(ar + kk), _mm512_loadu_ps(wr + kk), acc0);
        acc1 = _mm512_fmadd_ps(bf16x16_to_f32(ar + kk + 16), _mm512_loadu_ps(wr + kk + 16), acc1);
      }
      if (kk < k16) {
        acc0 = _mm512_fmadd_ps(bf16x16_to_f32(ar + kk), _mm512_loadu_ps(wr + kk), acc0);
        kk += 16;
      }
      if (tail) {
        const __m256i h = _mm256_maskz_loadu_epi16(tail, ar + kk);
        const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        acc1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, wr + kk), acc1);
      }
      c[r * ldc + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    }
  }
}

}  // namespace

void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  switch (type.id) {
    case GgmlType::kQ8_0: return gemm_split<Q8_0>(w, row_bytes, n, k, a, lda, m, c, ldc);
    case GgmlType::kQ4_K: return gemm_split<Q4_K>(w, row_bytes, n, k, a, lda, m, c, ldc);
    case GgmlType::kQ6_K: return gemm_split<Q6_K>(w, row_bytes, n, k, a, lda, m, c, ldc);
    default: return gemm_decoded_rows(type, w, row_bytes, n, k, a, lda, m, c, ldc);
  }
}

}  // namespace avx512
}  // namespace ktmoe
