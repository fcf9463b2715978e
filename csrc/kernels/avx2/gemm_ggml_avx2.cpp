// [NOTE] avx2 gemm_ggml: a GGML matrix where it lies (isa_kernels.h's contract).
//
// q8_0, q4_K, q5_K, q6_K and iq4_xs run code kernels: per call the activation rows are widened to fp32
// once (and, for q4_K / q5_K, each 32-group's Σ x summed in a fixed order); per weight row and block the type
// gives its codes as int8 and its group scales (ggml_codes_avx2.h), then for each group g and
// activation row r (8 fp32 lanes, vpmovsxbd + vcvtdq2ps per 8 codes)
//     t = Σ_{lanes of g} x·q   (a multiply, then FMAs),     acc_r = fma(s_g, t, acc_r)
// on one of kChains accumulator chains, q4_K's / q5_K's mins as corr_r = fma(m, Σ_g x, corr_r) over its 8
// sub-blocks, and c[r][i] = (sum of the chains' lanes) − (sum of corr_r's lanes). A unit activation row
// reads back gguf's weight exactly (t = q, fma(s_g, q, 0) = round(s_g·q), corr = m_g, every other
// product an exact zero); random rows give fp32 sums. Activation rows go in passes of up to kRows over
// all weight rows (each block's codes built once per pass), and every row sees the same operations
// whatever shares its pass. Other types decode each weight row exactly (the type's
// decoder) into a thread-local fp32 row and dot it with every activation row: 8 lanes, two
// accumulators over k in steps of 16, a scalar tail for plain types whose k is no multiple of 8. The
// same bits for any split of n or m.
#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/avx2/avx2_util.h"
#include "kernels/avx2/ggml_codes_avx2.h"
#include "kernels/ggml/ggml_code_kernels.h"

namespace ktmoe {
namespace avx2 {
namespace {

using namespace ggml_codes;

constexpr int kRows = 2;       // activation rows per pass over a weight row
constexpr int kChains = 2;     // accumulator chains per activation row
constexpr int kAhead = 4096;   // bytes of the weight stream prefetched ahead (into L2)

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

template <class F, int... I>
inline void unrolled_seq(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
inline void unrolled(F&& f) {  // f(std::integral_constant<int, I>{}), I = 0 .. N-1
  unrolled_seq(f, std::make_integer_sequence<int, N>{});
}

// out[r] = row w (nb blocks of T) . activation row r, r < R: x rows [R][ldx] fp32, gs rows [R][ldg].
template <class T, int R>
void row_dot(const uint8_t* w, int64_t nb, const float* x, int64_t ldx, const float* gs, int64_t ldg, float* out) {
  constexpr int kGroups = T::kElems / T::kGroup;
  __m256 acc[R][kChains], corr[R];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kChains; ++j) acc[r][j] = _mm256_setzero_ps();
    corr[r] = _mm256_setzero_ps();
  }
  alignas(32) int8_t buf[T::kElems];
  alignas(32) float s[kGroups < 8 ? 8 : kGroups];
  auto block = [&](auto c0, int64_t b) {
    const uint8_t* blk = w + b * T::kBytes;
    for (int off = 0; off < T::kBytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(blk + kAhead + off), _MM_HINT_T1);
    const int8_t* q = T::codes(blk, buf);
    const __m256 mins = T::scales(blk, s);
    if (T::kGsum)
      for (int r = 0; r < R; ++r) corr[r] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(gs + r * ldg + b * T::kGsum), corr[r]);
    unrolled<kGroups>([&](auto g) {
      constexpr int e = g * T::kGroup, C = (decltype(c0)::value + g) % kChains;
      const __m256 sg = _mm256_broadcast_ss(s + g);
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * ldx + b * T::kElems + e;
        __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xr), s8x8_f32(q + e));
        for (int v = 8; v < T::kGroup; v += 8) t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + v), s8x8_f32(q + e + v), t);
        acc[r][C] = _mm256_fmadd_ps(sg, t, acc[r][C]);
      }
    });
  };
  int64_t b = 0;
  for (; b + kChains <= nb; b += kChains) unrolled<kChains>([&](auto u) { block(u, b + u); });
  for (; b < nb; ++b) block(std::integral_constant<int, 0>{}, b);
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) - hsum(corr[r]);
}

// w: n rows of row_bytes (k / T::kElems blocks), a: bf16 rows [m, lda], c[r * ldc + i].
template <class T>
void gemm_codes(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const uint16_t* a, int64_t lda, int64_t m,
                float* c, int64_t ldc) {
  const int64_t nb = k / T::kElems, ldg = nb * T::kGsum;
  float* x = static_cast<float*>(thread_scratch(size_t(m * (k + ldg)) * 4));
  bf16_rows_to_f32(a, lda, m, k, x);
  float* gs = x + m * k;  // Σ x of each 32-group (the k-quants' sub-blocks with mins), in k order
  for (int64_t r = 0; r < m && T::kGsum; ++r)
    for (int64_t g = 0; g < k / 32; ++g) {
      const float* xg = x + r * k + 32 * g;
      gs[r * ldg + g] = hsum(_mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xg), _mm256_loadu_ps(xg + 8)),
                                           _mm256_add_ps(_mm256_loadu_ps(xg + 16), _mm256_loadu_ps(xg + 24))));
    }
  float out[kRows];
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {  // a pass's activations stay in L1
    const int rows = int(std::min<int64_t>(kRows, m - r0));
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* row = w + i * row_bytes;
      if (rows == 1) row_dot<T, 1>(row, nb, x + r0 * k, k, gs + r0 * ldg, ldg, out);
      else row_dot<T, 2>(row, nb, x + r0 * k, k, gs + r0 * ldg, ldg, out);
      for (int r = 0; r < rows; ++r) c[(r0 + r) * ldc + i] = out[r];
    }
  }
}

// Any decodable type: each weight row decoded exactly, dotted with every activation row.
void gemm_decoded_rows(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                       const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  thread_local std::vector<float> row;
  row.resize(size_t(k));
  const int64_t k16 = k / 16 * 16, k8 = k / 8 * 8;
  for (int64_t i = 0; i < n; ++i) {
    type.decode(w + i * row_bytes, k / type.block_elems, row.data());
    const float* wr = row.data();
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t* ar = a + r * lda;
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int64_t kk = 0;
      for (; kk < k16; kk += 16) {
        acc0 = _mm256_fmadd_ps(bf16x8_to_f32(ar + kk), _mm256_loadu_ps(wr + kk), acc0);
        acc1 = _mm256_fmadd_ps(bf16x8_to_f32(ar + kk + 8), _mm256_loadu_ps(wr + kk + 8), acc1);
      }
      if (kk < k8) {
        acc0 = _mm256_fmadd_ps(bf16x8_to_f32(ar + kk), _mm256_loadu_ps(wr + kk), acc0);
        kk += 8;
      }
      float s = hsum(_mm256_add_ps(acc0, acc1));
      for (; kk < k; ++kk) {
        uint32_t bits = uint32_t(ar[kk]) << 16;
        float x;
        std::memcpy(&x, &bits, 4);
        s += x * wr[kk];
      }
      c[r * ldc + i] = s;
    }
  }
}

}  // namespace

void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  ggml::with_code_kernel<Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS>(
      type.id, [&](auto t) { gemm_codes<decltype(t)>(w, row_bytes, n, k, a, lda, m, c, ldc); },
      [&] { gemm_decoded_rows(type, w, row_bytes, n, k, a, lda, m, c, ldc); });
}

}  // namespace avx2
}  // namespace ktmoe
