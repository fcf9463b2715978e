// [NOTE] Microbenchmark of the avx512 fp8 decode (gemm_fp8_avx512.cpp): variants of the
// decode tile timed alternately in one process, cold and hot, M = 1 and M = 32.
//
// Build and run (from the repository root; flags = csrc/isa_flags.json's avx512 row):
//   g++ -O3 -std=c++17 -fopenmp -Icsrc $(python -c "import json;print(' '.join(json.load(
//     open('csrc/isa_flags.json'))['avx512']))") benchmarks/fp8_decode_micro.cpp
//     csrc/kernels/avx512/gemm_fp8_avx512.cpp -o build/fp8_decode_micro
//   build/fp8_decode_micro [rounds=15] [threads=1]
//
// Working set: E = 64 experts of the reference shape (gate_up 1536 x 2048, down
// 2048 x 768, group 128: 4.7 MB each, 300 MB in all, >> the 32 MiB L3), once in the
// pair layout the library packs (fp8_format.h) and once in the k-quad layout the
// "quad" variants read (64 bytes per 4 consecutive k of a block: byte (n%16)*4 + k%4).
// A cold forward is 8 experts, gate_up then down, in the driver's items (8 blocks of
// gate_up, 20 of down per gemm call, at T = 1 about 256 KiB each), the experts taken
// in turn so that a round of 8 forwards walks all 64: every variant reads weights the
// others evicted. A hot forward is one 512 KiB item (L2) again and again. Prefill: m =
// 32 rows (the driver's kTokenTile) over 512 KiB items of one expert. Each round runs
// every variant once; the table gives min and median ms per forward over the rounds,
// and GB/s of fp8 weights (+ scales) at the median.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/avx512/gemm_decoded_avx512.h"
#include "kernels/fp8_format.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
              float* c, int64_t ldc);
}
}  // namespace ktmoe

using namespace ktmoe;
using namespace ktmoe::avx512;

namespace {

struct SubnormalFix {
  alignas(64) uint16_t v[32] = {};
  constexpr SubnormalFix() {
    for (int m = 0; m < 8; ++m) v[m] = uint16_t(e4m3_subnormal_scaled_bf16(m) - (0x3800 | (m << 4)));
  }
};
constexpr SubnormalFix kFix;

inline __m512 scale16(const uint8_t* scales, int64_t ngroups, int64_t b, int64_t g) {
  const float* s = reinterpret_cast<const float*>(scales + (b * ngroups + g) * kFp8ScaleBytes);
  return _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(kE4m3KernelScale));
}

// The pair layout (as gemm_fp8_avx512.cpp's decoder).
struct PairDec {
  static constexpr bool kRowSums = false;
  static constexpr int64_t kStepBytes = 64;
  const uint8_t* scales;
  int64_t ngroups;
  __m512i keep = _mm512_set1_epi16(int16_t(0x87F0)), bias = _mm512_set1_epi16(0x3800);
  __m512i expo = _mm512_set1_epi16(0x0078), expo8 = _mm512_set1_epi8(0x78);
  __m512i fix = _mm512_load_si512(kFix.v);
  PairDec(const uint8_t* s, int64_t ng) : scales(s), ngroups(ng) {}
  static inline __m512i widen(const uint8_t* p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  inline __m512i normal(__m512i s) const {
    return _mm512_ternarylogic_epi32(_mm512_slli_epi16(s, 4), keep, bias, 0xEA);
  }
  template <int NB>
  struct Step {
    const uint8_t* w;
    int64_t bstride;
    bool any;
  };
  template <int NB>
  inline Step<NB> step(const uint8_t* w, int64_t bstride, int64_t p) const {
    __mmask64 any = 0;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) any |= _mm512_testn_epi8_mask(_mm512_loadu_si512(w + j * bstride + p * 32), expo8);
    return {w + p * 32, bstride, any != 0};
  }
  template <int NB>
  inline __m512i pair(const Step<NB>& st, int h, int j) const {
    const __m512i s = widen(st.w + j * st.bstride + h * 32);
    const __m512i r = normal(s);
    if (__builtin_expect(st.any, 0))
      return _mm512_mask_add_epi16(r, _mm512_testn_epi16_mask(s, expo), r, _mm512_permutexvar_epi16(s, fix));
    return r;
  }
  inline void pairs(const uint8_t* p, int64_t n, uint8_t* out) const {
    for (int64_t i = 0; i < n; i += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i * 32 + decoded::kPChunk * 32), _MM_HINT_T0);
      const bool any = _mm512_testn_epi8_mask(_mm512_loadu_si512(p + i * 32), expo8) != 0;
      for (int h = 0; h < 2; ++h) {
        const __m512i s = widen(p + (i + h) * 32);
        __m512i r = normal(s);
        if (__builtin_expect(any, 0))
          r = _mm512_mask_add_epi16(r, _mm512_testn_epi16_mask(s, expo), r, _mm512_permutexvar_epi16(s, fix));
        _mm512_store_si512(out + (i + h) * 64, r);
      }
    }
  }
  inline __m512 scale(int64_t b, int64_t g) const { return scale16(scales, ngroups, b, g); }
  inline __m512 offset(int64_t, int64_t) const { return _mm512_setzero_ps(); }
};

// The k-quad layout: one 64-byte load per 4 k of a block; pair h = 0 is (k0, k2), h = 1
// is (k1, k3) of each column, so the activations are permuted per quad to (a0 a2 a1 a3).
// kTest false: no subnormal test (wrong for e = 0 bytes; only the bound of its cost).
template <bool kTest>
struct QuadDec {
  static constexpr bool kRowSums = false;
  static constexpr int64_t kStepBytes = 64;
  const uint8_t* scales;
  int64_t ngroups;
  __m512i keep = _mm512_set1_epi16(int16_t(0x87F0)), bias = _mm512_set1_epi16(0x3800);
  __m512i expo_lo = _mm512_set1_epi16(0x0078), expo_hi = _mm512_set1_epi16(0x7800), expo8 = _mm512_set1_epi8(0x78);
  __m512i fix = _mm512_load_si512(kFix.v);
  QuadDec(const uint8_t* s, int64_t ng) : scales(s), ngroups(ng) {}
  // bf16 of the high byte of every word (value * 2^-8), exact for e > 0.
  inline __m512i high(__m512i x) const {
    return _mm512_ternarylogic_epi32(_mm512_srai_epi16(x, 4), keep, bias, 0xEA);
  }
  inline __m512i lo(__m512i x, bool any) const {
    __m512i r = high(_mm512_slli_epi16(x, 8));
    if (__builtin_expect(any, 0))
      r = _mm512_mask_add_epi16(r, _mm512_testn_epi16_mask(x, expo_lo), r, _mm512_permutexvar_epi16(x, fix));
    return r;
  }
  inline __m512i hi(__m512i x, bool any) const {
    __m512i r = high(x);
    if (__builtin_expect(any, 0))
      r = _mm512_mask_add_epi16(r, _mm512_testn_epi16_mask(x, expo_hi), r,
                                _mm512_permutexvar_epi16(_mm512_srli_epi16(x, 8), fix));
    return r;
  }
  template <int NB>
  struct Step {
    __m512i x[NB];
    bool any;
  };
  template <int NB>
  inline Step<NB> step(const uint8_t* w, int64_t bstride, int64_t p) const {
    Step<NB> st;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) st.x[j] = _mm512_loadu_si512(w + j * bstride + p * 32);
    if constexpr (kTest) {
      uint64_t any = 0;
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) any |= _cvtmask64_u64(_mm512_testn_epi8_mask(st.x[j], expo8));
      st.any = any != 0;
    } else {
      st.any = false;
    }
    return st;
  }
  template <int NB>
  inline __m512i pair(const Step<NB>& st, int h, int j) const {
    return h == 0 ? lo(st.x[j], st.any) : hi(st.x[j], st.any);
  }
  inline void pairs(const uint8_t* p, int64_t n, uint8_t* out) const {
    for (int64_t i = 0; i < n; i += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i * 32 + decoded::kPChunk * 32), _MM_HINT_T0);
      const __m512i x = _mm512_loadu_si512(p + i * 32);
      const bool any = _mm512_testn_epi8_mask(x, expo8) != 0;
      _mm512_store_si512(out + i * 64, lo(x, any));
      _mm512_store_si512(out + (i + 1) * 64, hi(x, any));
    }
  }
  inline __m512 scale(int64_t b, int64_t g) const { return scale16(scales, ngroups, b, g); }
  inline __m512 offset(int64_t, int64_t) const { return _mm512_setzero_ps(); }
};

// Prefetch policies of the decode tile: none; the next tile's NB block starts (kStartLines
// lines each, spread over the tile's first steps); a stream kDist bytes ahead that wraps
// into the next tile's block j.
enum Pf { kNone = 0, kNextStarts = 1, kAhead = 2, kAheadL2 = 3, kAheadL2NoWrap = 4, kAheadL2Matrix = 5 };

template <class Dec, int MR, int NB, int PF, int kDist>
__attribute__((noinline)) void dtile(const Dec& dec, const decoded::Ctx& x, const uint8_t* a, int64_t astride,
                                     int64_t b, bool last, float* c, int64_t ldc) {
  const uint8_t* w = x.data + b * x.bstride;
  const uint8_t* nxt = w + NB * x.bstride;
  const int64_t np = x.ngroups * x.spg;
  for (int64_t g = 0; g < x.ngroups; ++g) {
    __m512 acc[MR][NB];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t p = g * x.spg; p < (g + 1) * x.spg; p += 2) {
      if constexpr (PF == kNextStarts) {
        // lines l < kDist/64 of each next block, one line per step per block
        const int64_t l = p / 2;
        if (l < kDist / 64 && !last) {
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(nxt + j * x.bstride + l * 64), _MM_HINT_T0);
        }
      } else if constexpr (PF == kAhead || PF == kAheadL2 || PF == kAheadL2NoWrap || PF == kAheadL2Matrix) {
        constexpr auto hint = PF == kAhead ? _MM_HINT_T0 : _MM_HINT_T1;
        const int64_t o = p * 32 + kDist;
        if (o < x.bstride) {
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + j * x.bstride + o), hint);
        } else if (PF != kAheadL2NoWrap && !last) {
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j)
            _mm_prefetch(reinterpret_cast<const char*>(nxt + j * x.bstride + (o - x.bstride)), hint);
        }
      }
      const auto st = dec.template step<NB>(w, x.bstride, p);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i wv[NB];
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) wv[j] = dec.pair(st, h, j);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh av = (__m512bh)bcast32(a + i * astride + (p + h) * 4);
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, (__m512bh)wv[j]);
        }
      }
    }
    decoded::group_end<Dec, MR, NB>(dec, x, nullptr, b, g, acc, c, ldc);
  }
  (void)np;
}

template <class Dec, int MR, int NBMAX, int PF, int kDist>
void decode_rows(const Dec& dec, const decoded::Ctx& x, const uint8_t* a, int64_t astride, int64_t b0, int64_t b1,
                 float* c, int64_t ldc, int64_t nbt) {
  const int64_t lim = PF == kAheadL2Matrix ? nbt : b1;  // the next tile is prefetched up to here
  int64_t b = b0;
  if constexpr (NBMAX >= 8)
    for (; b + 8 <= b1; b += 8) dtile<Dec, MR, 8, PF, kDist>(dec, x, a, astride, b, b + 16 > lim, c + (b - b0) * 16, ldc);
  for (; b + 4 <= b1; b += 4) dtile<Dec, MR, 4, PF, kDist>(dec, x, a, astride, b, b + 8 > lim, c + (b - b0) * 16, ldc);
  for (; b + 2 <= b1; b += 2) dtile<Dec, MR, 2, PF, kDist>(dec, x, a, astride, b, true, c + (b - b0) * 16, ldc);
  for (; b < b1; ++b) dtile<Dec, MR, 1, PF, kDist>(dec, x, a, astride, b, true, c + (b - b0) * 16, ldc);
}

// a: bf16 rows; quad: permute every 4 k to (0 2 1 3) first (a thread-local copy).
inline const uint16_t* quad_activations(const uint16_t* a, int64_t lda, int64_t m, int64_t kp, int64_t* ld_out) {
  static thread_local decoded::Scratch buf;
  const int64_t ld = kp + 32;
  uint16_t* out = reinterpret_cast<uint16_t*>(buf.at_least(size_t(m * ld) * 2));
  alignas(64) static const uint16_t idx[32] = {0,  2,  1,  3,  4,  6,  5,  7,  8,  10, 9,  11, 12, 14, 13, 15,
                                               16, 18, 17, 19, 20, 22, 21, 23, 24, 26, 25, 27, 28, 30, 29, 31};
  const __m512i perm = _mm512_load_si512(idx);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t k = 0; k < kp; k += 32)
      _mm512_storeu_si512(out + r * ld + k, _mm512_permutexvar_epi16(perm, _mm512_loadu_si512(a + r * lda + k)));
  *ld_out = ld;
  return out;
}

template <int kQuad, int NBMAX, int PF, int kDist>
void gemm_variant(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                  float* c, int64_t ldc) {
  const int64_t kp = w->kp, ngroups = kp / w->group;
  const decoded::Ctx x{packed_data(w), fp8_block_data_bytes(kp), ngroups, w->group / 2, nullptr};
  using Dec = std::conditional_t<kQuad != 0, QuadDec<kQuad == 1>, PairDec>;
  const Dec dec(packed_scales(w), ngroups);
  if constexpr (kQuad) a = quad_activations(a, lda, m, kp, &lda);
  const auto* ab = reinterpret_cast<const uint8_t*>(a);
  if (m == 1) return decode_rows<Dec, 1, NBMAX, PF, kDist>(dec, x, ab, lda * 2, b0, b1, c, ldc, w->np / 16);
  if (m == 2) return decode_rows<Dec, 2, 4, PF, kDist>(dec, x, ab, lda * 2, b0, b1, c, ldc, w->np / 16);
  decoded::gemm_prefill(dec, x, kp, a, lda, m, b0, b1, c, ldc);
}

// Reads only (no decode): blocks [b0, b1) of w as the decode tiles walk them (NB streams
// bstride apart per tile, one 64-byte load per block per step) or as one sequential
// stream; c[0] = a sum. The roof of the access pattern itself.
template <int NB, bool kSequential>
void read_pattern(const PackedMatrixHeader* w, const uint16_t*, int64_t, int64_t, int64_t b0, int64_t b1, float* c,
                  int64_t) {
  const int64_t bstride = fp8_block_data_bytes(w->kp);
  const uint8_t* d = packed_data(w);
  __m512i s[NB];
  for (int j = 0; j < NB; ++j) s[j] = _mm512_setzero_si512();
  if constexpr (kSequential) {
    for (int64_t o = b0 * bstride; o < b1 * bstride; o += 64 * NB)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) s[j] = _mm512_add_epi32(s[j], _mm512_loadu_si512(d + o + 64 * j));
  } else {
    int64_t b = b0;
    for (; b + NB <= b1; b += NB)
      for (int64_t o = 0; o < bstride; o += 64)
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) s[j] = _mm512_add_epi32(s[j], _mm512_loadu_si512(d + (b + j) * bstride + o));
    for (; b < b1; ++b)
      for (int64_t o = 0; o < bstride; o += 64) s[0] = _mm512_add_epi32(s[0], _mm512_loadu_si512(d + b * bstride + o));
  }
  for (int j = 1; j < NB; ++j) s[0] = _mm512_add_epi32(s[0], s[j]);
  c[0] = float(_mm512_reduce_add_epi32(s[0]));
}

using GemmFn = void (*)(const PackedMatrixHeader*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*,
                        int64_t);

struct Variant {
  const char* name;
  GemmFn fn;
  bool quad;
};

uint8_t* alloc64(size_t n) {
  void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  if (!p) std::abort();
  return static_cast<uint8_t*>(p);
}

PackedMatrixHeader header(MatrixRole role, int64_t n, int64_t k) {
  PackedMatrixHeader h{};
  h.magic = kPackedMagic, h.version = kPackedVersion, h.format = uint8_t(WeightFormat::kFP8);
  h.role = uint8_t(role), h.n = int32_t(n), h.k = int32_t(k), h.np = int32_t(n), h.kp = int32_t(k);
  h.group = 128, h.data_offset = 64;
  h.scale_offset = 64 + n * k;
  h.total_bytes = h.scale_offset + fp8_scale_bytes(n, k, 128);
  return h;
}

// E experts x (gate_up, down), pair and quad layouts of the same bytes.
struct Weights {
  int64_t E;
  PackedMatrixHeader hgu, hdn;
  uint8_t *pair, *quad;
  int64_t expert_bytes;
  const PackedMatrixHeader* gu(bool q, int64_t e) const {
    return reinterpret_cast<const PackedMatrixHeader*>((q ? quad : pair) + e * expert_bytes);
  }
  const PackedMatrixHeader* dn(bool q, int64_t e) const {
    return reinterpret_cast<const PackedMatrixHeader*>((q ? quad : pair) + e * expert_bytes + hgu.total_bytes);
  }
};

void fill_matrix(const PackedMatrixHeader& h, const std::vector<uint8_t>& pool, std::mt19937_64& rng, uint8_t* pair,
                 uint8_t* quad) {
  std::memcpy(pair, &h, 64);
  std::memcpy(quad, &h, 64);
  const int64_t data = int64_t(h.np) * h.kp;
  const int64_t off = int64_t(rng() % (pool.size() - data));
  std::memcpy(pair + 64, pool.data() + off, size_t(data));
  const int64_t kp = h.kp, nb = h.np / 16;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* src = pair + 64 + b * kp * 16;
    uint8_t* dst = quad + 64 + b * kp * 16;
    for (int64_t k = 0; k < kp; ++k)
      for (int64_t n = 0; n < 16; ++n) dst[(k / 4) * 64 + n * 4 + k % 4] = src[(k / 2) * 32 + n * 2 + k % 2];
  }
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  float* s = reinterpret_cast<float*>(pair + h.scale_offset);
  const int64_t ns = fp8_scale_bytes(h.np, h.kp, h.group) / 4;
  for (int64_t i = 0; i < ns; ++i) s[i] = u(rng) * 1e-3f;
  std::memcpy(quad + h.scale_offset, pair + h.scale_offset, size_t(ns) * 4);
}

Weights make_weights(int64_t E) {
  Weights W;
  W.E = E;
  W.hgu = header(MatrixRole::kGateUp, 1536, 2048);
  W.hdn = header(MatrixRole::kDown, 2048, 768);
  W.expert_bytes = W.hgu.total_bytes + W.hdn.total_bytes;
  W.pair = alloc64(size_t(E * W.expert_bytes));
  W.quad = alloc64(size_t(E * W.expert_bytes));
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> pool(8 << 20);
  for (auto& b : pool) b = e4m3_from_float(nd(rng) * 100.f);  // N(0,1) weights, max |q| ~ 448 at 4.5 sigma
  for (int64_t e = 0; e < E; ++e) {
    uint8_t* p = W.pair + e * W.expert_bytes;
    uint8_t* q = W.quad + e * W.expert_bytes;
    fill_matrix(W.hgu, pool, rng, p, q);
    fill_matrix(W.hdn, pool, rng, p + W.hgu.total_bytes, q + W.hgu.total_bytes);
  }
  return W;
}

struct Item {
  const PackedMatrixHeader* w;
  int64_t b0, b1;
};

// The items of one phase (gate_up or down) for experts es, blocks per item nb.
std::vector<Item> items(const Weights& W, bool q, const std::vector<int64_t>& es, bool down, int64_t nb) {
  std::vector<Item> out;
  for (int64_t e : es) {
    const PackedMatrixHeader* h = down ? W.dn(q, e) : W.gu(q, e);
    for (int64_t b = 0; b < h->np / 16; b += nb) out.push_back({h, b, std::min<int64_t>(b + nb, h->np / 16)});
  }
  return out;
}

// Runs the items on `threads` threads, contiguous halves (as at::parallel_for with grain 1).
void run_items(const std::vector<Item>& its, GemmFn fn, const uint16_t* a, int64_t lda, int64_t m, float* c,
               int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t n = int64_t(its.size()), i0 = n * t / nt, i1 = n * (t + 1) / nt;
    float* ct = c + size_t(t) * (64 << 10);
    for (int64_t i = i0; i < i1; ++i) fn(its[i].w, a, lda, m, its[i].b0, its[i].b1, ct, 16 * (its[i].b1 - its[i].b0));
  }
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Stats {
  std::vector<double> ms;
  double min() const { return *std::min_element(ms.begin(), ms.end()); }
  double q(double f) const {
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s[size_t(f * double(s.size() - 1))];
  }
  double median() const { return q(0.5); }
};

// A streaming read of the same weights (512-bit loads, 4 streams), the roof.
double read_pass(const uint8_t* p, int64_t bytes, int threads) {
  uint64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = bytes * t / nt / 256 * 256, hi = bytes * (t + 1) / nt / 256 * 256;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = lo; i < hi; i += 256) {
      s0 = _mm512_add_epi32(s0, _mm512_load_si512(p + i));
      s1 = _mm512_add_epi32(s1, _mm512_load_si512(p + i + 64));
      s2 = _mm512_add_epi32(s2, _mm512_load_si512(p + i + 128));
      s3 = _mm512_add_epi32(s3, _mm512_load_si512(p + i + 192));
    }
    sink += uint32_t(_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3))));
  }
  return double(sink);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const char* only = argc > 3 ? argv[3] : nullptr;
  const int64_t E = 64, topk = 8;
  const Weights W = make_weights(E);
  const std::vector<Variant> all = {
      {"real (pair, NB4)", &avx512::gemm_fp8, false},
      {"READ ONLY: 4 streams/tile", &read_pattern<4, false>, false},
      {"READ ONLY: sequential", &read_pattern<4, true>, false},
      {"pair NB4", &gemm_variant<0, 4, kNone, 0>, false},
      {"pair NB4 next-starts 16l", &gemm_variant<0, 4, kNextStarts, 1024>, false},
      {"pair NB4 ahead 2K", &gemm_variant<0, 4, kAhead, 2048>, false},
      {"pair NB4 aheadL2 1K", &gemm_variant<0, 4, kAheadL2, 1024>, false},
      {"pair NB4 aheadL2 1.5K", &gemm_variant<0, 4, kAheadL2, 1536>, false},
      {"pair NB4 aheadL2 2K", &gemm_variant<0, 4, kAheadL2, 2048>, false},
      {"pair NB4 aheadL2 3K", &gemm_variant<0, 4, kAheadL2, 3072>, false},
      {"pair NB4 aheadL2 4K", &gemm_variant<0, 4, kAheadL2, 4096>, false},
      {"pair NB4 aheadL2 8K", &gemm_variant<0, 4, kAheadL2, 8192>, false},
      {"pair NB4 aheadL2-nowrap 2K", &gemm_variant<0, 4, kAheadL2NoWrap, 2048>, false},
      {"pair NB4 aheadL2-matrix 2K", &gemm_variant<0, 4, kAheadL2Matrix, 2048>, false},
      {"pair NB8", &gemm_variant<0, 8, kNone, 0>, false},
      {"pair NB8 aheadL2 2K", &gemm_variant<0, 8, kAheadL2, 2048>, false},
      {"quad NB4", &gemm_variant<1, 4, kNone, 0>, true},
      {"quad NB4 aheadL2 2K", &gemm_variant<1, 4, kAheadL2, 2048>, true},
      {"quad NB4 aheadL2-matrix 2K", &gemm_variant<1, 4, kAheadL2Matrix, 2048>, true},
      {"quad NB4 aheadL2 4K", &gemm_variant<1, 4, kAheadL2, 4096>, true},
      {"quad NB8", &gemm_variant<1, 8, kNone, 0>, true},
      {"quad NB4 no test (wrong)", &gemm_variant<2, 4, kNone, 0>, true},
      {"quad NB4 no test aheadL2 2K", &gemm_variant<2, 4, kAheadL2, 2048>, true},
  };
  std::vector<Variant> vs;
  for (const auto& v : all)
    if (!only || v.fn == &avx512::gemm_fp8 || [&] {
          std::string f(only);  // comma-separated substrings
          for (size_t i = 0; i <= f.size();) {
            const size_t j = std::min(f.find(',', i), f.size());
            if (j > i && std::strstr(v.name, f.substr(i, j - i).c_str())) return true;
            i = j + 1;
          }
          return false;
        }())
      vs.push_back(v);

  // activations: x [32][2048 + 32], h [32][768 + 32] bf16 ~ N(0, 1)
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t ldx = 2048 + 32, ldh = 768 + 32;
  std::vector<uint16_t> x(size_t(32 * ldx), 0), hh(size_t(32 * ldh), 0);
  auto bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  };
  for (int64_t r = 0; r < 32; ++r) {
    for (int64_t k = 0; k < 2048; ++k) x[size_t(r * ldx + k)] = bf16(nd(rng));
    for (int64_t k = 0; k < 768; ++k) hh[size_t(r * ldh + k)] = bf16(nd(rng));
  }
  std::vector<float> c(size_t(threads) * (64 << 10) * 32 / 16 * 2);

  // correctness: every variant against the real kernel on expert 0 (M = 1, 2, 32)
  for (const auto& v : vs)
    for (int64_t m : {1, 2, 32}) {
      for (int down = 0; down < 2; ++down) {
        const PackedMatrixHeader* hr = down ? W.dn(false, 0) : W.gu(false, 0);
        const PackedMatrixHeader* hv = down ? W.dn(v.quad, 0) : W.gu(v.quad, 0);
        const uint16_t* a = down ? hh.data() : x.data();
        const int64_t lda = down ? ldh : ldx, nb = hr->np / 16, n = hr->np;
        std::vector<float> want(size_t(m * n)), got(size_t(m * n));
        avx512::gemm_fp8(hr, a, lda, m, 0, nb, want.data(), n);
        v.fn(hv, a, lda, m, 0, nb, got.data(), n);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, double(std::fabs(want[i])));
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / scale);
        if (worst > 1e-5 && !std::strstr(v.name, "wrong") && !std::strstr(v.name, "READ")) std::printf("MISMATCH %s m=%lld down=%d: %.3g\n", v.name, (long long)m, down, worst);
      }
    }

  const int64_t fwd_bytes = topk * W.expert_bytes;
  std::vector<Stats> cold(vs.size()), hot(vs.size()), pre(vs.size());
  Stats roof;
  const int64_t hot_blocks = 16;  // 512 KiB of gate_up
  for (int r = 0; r < rounds; ++r) {
    for (int64_t e = 0; e < E; e += threads == 1 ? 1 : topk) {  // the same samples as cold
      const int64_t n = threads == 1 ? 1 : topk;
      const double t0 = now();
      read_pass(W.pair + e * W.expert_bytes, n * W.expert_bytes, threads);
      roof.ms.push_back((now() - t0) * 1e3 * topk / n);
    }
    for (size_t vi = 0; vi < vs.size(); ++vi) {
      const Variant& v = vs[vi];
      // cold: E / topk forwards walk all experts; one sample per expert on 1 thread (x topk:
      // ms per forward; short samples are rarely preempted on a shared host), per forward else
      for (int64_t f = 0; f < E / topk; ++f) {
        std::vector<int64_t> es;
        for (int64_t j = 0; j < topk; ++j) es.push_back(f * topk + j);
        if (threads == 1) {
          for (int64_t e : es) {
            const auto gu = items(W, v.quad, {e}, false, 8), dn = items(W, v.quad, {e}, true, 20);
            const double t0 = now();
            run_items(gu, v.fn, x.data(), ldx, 1, c.data(), threads);
            run_items(dn, v.fn, hh.data(), ldh, 1, c.data(), threads);
            cold[vi].ms.push_back((now() - t0) * 1e3 * topk);
          }
          continue;
        }
        const auto gu = items(W, v.quad, es, false, 8), dn = items(W, v.quad, es, true, 20);
        const double t0 = now();
        run_items(gu, v.fn, x.data(), ldx, 1, c.data(), threads);
        run_items(dn, v.fn, hh.data(), ldh, 1, c.data(), threads);
        cold[vi].ms.push_back((now() - t0) * 1e3);
      }
      // hot: one 512 KiB item per thread, 64 times
      {
        std::vector<Item> its;
        for (int t2 = 0; t2 < threads; ++t2) its.push_back({W.gu(v.quad, t2), 0, hot_blocks});
        run_items(its, v.fn, x.data(), ldx, 1, c.data(), threads);
        const double t0 = now();
        for (int i = 0; i < 64; ++i) run_items(its, v.fn, x.data(), ldx, 1, c.data(), threads);
        hot[vi].ms.push_back((now() - t0) * 1e3 / 64);
      }
      // prefill: m = 32 over 512 KiB items of 2 experts' gate_up and down
      {
        std::vector<int64_t> es = {r % E, (r + 1) % E};
        const auto gu = items(W, v.quad, es, false, 16), dn = items(W, v.quad, es, true, 40);
        const double t0 = now();
        run_items(gu, v.fn, x.data(), ldx, 32, c.data(), threads);
        run_items(dn, v.fn, hh.data(), ldh, 32, c.data(), threads);
        pre[vi].ms.push_back((now() - t0) * 1e3);
      }
    }
  }
  const double hot_bytes = double(threads) * hot_blocks * 2048 * 16;
  std::printf("threads %d, rounds %d; ms per forward of 8 experts (37.6 MB), cold: p10 / median of %zu samples\n",
              threads, rounds, roof.ms.size());
  std::printf("read roof (a streaming read of the same weights): p10 %.3f (%.1f GB/s), median %.3f (%.1f GB/s)\n",
              roof.q(0.1), fwd_bytes / roof.q(0.1) / 1e6, roof.median(), fwd_bytes / roof.median() / 1e6);
  std::printf("%-28s %17s %6s %5s | %17s %6s | %17s\n", "variant", "cold p10/median", "GB/s", "roof%",
              "hot us min/med", "GB/s", "M=32 ms min/med");
  for (size_t vi = 0; vi < vs.size(); ++vi)
    std::printf("%-28s %8.3f %8.3f %6.1f %4.0f%% | %8.1f %8.1f %6.1f | %8.2f %8.2f\n", vs[vi].name, cold[vi].q(0.1),
                cold[vi].median(), fwd_bytes / cold[vi].q(0.1) / 1e6, 100 * roof.q(0.1) / cold[vi].q(0.1),
                hot[vi].min() * 1e3, hot[vi].median() * 1e3, hot_bytes / hot[vi].median() / 1e6, pre[vi].min(),
                pre[vi].median());
  return 0;
}
