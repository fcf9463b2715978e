// [NOTE] Microbenchmark of the avx512 decode tiles of fp8, int4_affine (gemm_decoded_avx512.h)
// and mxfp4 (those tiles with bf16 dots), and gemm_nibble_int16_avx512.cpp's int16 dots for both
// nibble formats (the amx table's decode rows): variants
// timed alternately in one process, cold and hot.
//
// Build and run (from the repository root; flags = csrc/isa_flags.json's avx512 row):
//   $(python -m benchmarks.micro.build fp8_decode_micro) [rounds=15] [threads=1]
//     [variants: comma-separated substrings, "" = all] [M=1]
// It includes the two kernel files themselves, so the variants run the library's
// decoders and tile loops, with the decode tiles' prefetch distance as a template
// argument (0: none; the entry points gemm_fp8 / gemm_int4_affine: kDecodeAhead).
//
// Variants: the library with and without its prefetch and at other distances; the
// same accesses with no decode ("READ ONLY": the access pattern's own roof); fp8 in a
// k-quad layout (64 bytes per 4 consecutive k of a block, byte (n%16)*4 + k%4: one
// load, vpsraw / vpsllw + vpternlogd, 5 ops per 64 weights instead of 6 plus two more
// loads; the activations permuted per quad), with and without its subnormal test (the
// test's cost bound; "wrong" for e = 0 bytes); mxfp4 (the int4_affine nibbles with E8M0
// bytes 117..137, group 32) by avx512's bf16 decode and by the int16 kernel amx runs for
// decode rows, with and without a prefetch.
//
// Working set: E = 64 experts of the reference shape (gate_up 1536 x 2048, down
// 2048 x 768, group 128 (mxfp4 32); fp8 4.7 MB an expert, 300 MB in all, >> the 32 MiB L3), in
// each layout. Cold: rounds of 8 forwards that walk all 64 experts (every variant
// reads weights the others evicted), gate_up then down in the driver's decode items
// (about 256 KiB, a multiple of 4 blocks), taken by the threads from a shared counter.
// On 1 thread each expert is one sample (x 8: ms per forward; short samples are rarely
// preempted on a shared host), else each forward; the table gives p10 and median, GB/s
// of the layout's bytes at p10, and that against the read roof (a streaming read of
// the same fp8 weights in the same rounds, at p10). Hot: one 512 KiB item per thread
// (in L2) 64 times. M = 32: 512 KiB items of 2 experts (the driver's prefill tiles).
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

#include "decode_micro_harness.h"

// The library's avx512 decoders themselves (their anonymous-namespace structs become this file's).
#include "kernels/avx512/gemm_fp8_avx512.cpp"
#include "kernels/avx512/gemm_int4_affine_avx512.cpp"
#include "kernels/avx512/gemm_mxfp4_avx512.cpp"
#include "kernels/avx512/gemm_nibble_int16_avx512.cpp"

using namespace ktmoe;
using namespace decode_micro;
using namespace ktmoe::avx512;

namespace {

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
  __m512i fix = _mm512_load_si512(kSubnormalFix.v);
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
  inline __m512 scale(int64_t b, int64_t g) const {
    const float* s = reinterpret_cast<const float*>(scales + (b * ngroups + g) * kFp8ScaleBytes);
    return _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(kE4m3KernelScale));
  }
  inline __m512 offset(int64_t, int64_t) const { return _mm512_setzero_ps(); }
};

// a: bf16 rows; quad: permute every 4 k to (0 2 1 3) first (a thread-local copy).
inline const uint16_t* quad_activations(const uint16_t* a, int64_t lda, int64_t m, int64_t kp, int64_t* ld_out) {
  static thread_local Scratch buf;
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

// fp8 (the library's decoder and tiles) with the decode tiles' prefetch kAhead bytes ahead.
template <int64_t kAhead>
void fp8_ahead(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
               float* c, int64_t ldc) {
  const int64_t kp = w->kp, ngroups = kp / w->group;
  const decoded::Ctx x{packed_data(w), fp8_block_data_bytes(kp), ngroups, w->group / 2, nullptr, w->np / 16};
  decoded::gemm<Fp8Decoder, kAhead>(Fp8Decoder(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1, c, ldc);
}

// fp8 in the k-quad layout (kTest false: no subnormal test, the bound of its cost).
template <bool kTest, int64_t kAhead>
void quad_ahead(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  const int64_t kp = w->kp, ngroups = kp / w->group;
  const decoded::Ctx x{packed_data(w), fp8_block_data_bytes(kp), ngroups, w->group / 2, nullptr, w->np / 16};
  a = quad_activations(a, lda, m, kp, &lda);
  decoded::gemm<QuadDec<kTest>, kAhead>(QuadDec<kTest>(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1, c, ldc);
}

// int4_affine (the library's decoder, row sums and tiles) with the prefetch kAhead bytes ahead.
template <int64_t kAhead>
void int4a_ahead(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                 float* c, int64_t ldc) {
  const int64_t kp = w->kp, group = w->group, ngroups = kp / group;
  static thread_local Scratch xbuf;
  float* xs = reinterpret_cast<float*>(xbuf.at_least(size_t(m * ngroups) * 4));
  row_group_sums(a, lda, m, group, ngroups, xs);
  const decoded::Ctx x{packed_data(w), int4a_block_data_bytes(kp), ngroups, group / 2, xs, w->np / 16};
  decoded::gemm<Int4AffineDecoder, kAhead>(Int4AffineDecoder(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1, c,
                                           ldc);
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

// Weight layouts of the variants.
enum Layout { kPair = 0, kQuad = 1, kInt4A = 2, kMx = 3 };
constexpr int kLayouts = 4;
inline bool nibbles(int l) { return l == kInt4A || l == kMx; }

struct Variant {
  const char* name;
  GemmFn fn;
  Layout layout;
};

// A hand-built header with the packer's offsets: group 128, np = n, kp = k.
PackedMatrixHeader header(Layout layout, MatrixRole role, int64_t n, int64_t k) {
  PackedMatrixHeader h{};
  h.magic = kPackedMagic, h.version = kPackedVersion;
  h.format = uint8_t(layout == kInt4A ? WeightFormat::kINT4A : layout == kMx ? WeightFormat::kMXFP4 : WeightFormat::kFP8);
  h.role = uint8_t(role), h.n = int32_t(n), h.k = int32_t(k), h.np = int32_t(n), h.kp = int32_t(k);
  h.group = layout == kMx ? 32 : 128, h.data_offset = 64;
  h.scale_offset = 64 + (nibbles(layout) ? n * k / 2 : n * k);
  h.total_bytes = h.scale_offset + (layout == kInt4A ? int4a_scale_bytes(n, k, 128)
                                    : layout == kMx  ? n * k / 32  // 16 E8M0 bytes per block and group of 32
                                                     : fp8_scale_bytes(n, k, 128));
  return h;
}

// E experts x (gate_up, down) in each layout: fp8 pair and quad hold the same bytes.
struct Weights {
  int64_t E;
  PackedMatrixHeader hgu[kLayouts], hdn[kLayouts];
  uint8_t* buf[kLayouts];
  int64_t expert_bytes[kLayouts];
  const PackedMatrixHeader* gu(Layout l, int64_t e) const {
    return reinterpret_cast<const PackedMatrixHeader*>(buf[l] + e * expert_bytes[l]);
  }
  const PackedMatrixHeader* dn(Layout l, int64_t e) const {
    return reinterpret_cast<const PackedMatrixHeader*>(buf[l] + e * expert_bytes[l] + hgu[l].total_bytes);
  }
};

// One matrix in the four layouts: e4m3 bytes from pool (pair, and the same bytes as
// k-quads), random nibbles (int4_affine and mxfp4 the same); fp32 scales in [0.5, 1) * 1e-3,
// int4_affine zero points 8; mxfp4 E8M0 bytes 117..137, a scale per 32 inputs.
void fill_matrix(const Weights& W, bool down, int64_t e, const std::vector<uint8_t>& pool, std::mt19937_64& rng) {
  uint8_t* m[kLayouts];
  for (int l = 0; l < kLayouts; ++l) {
    const PackedMatrixHeader& h = down ? W.hdn[l] : W.hgu[l];
    m[l] = const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(down ? W.dn(Layout(l), e) : W.gu(Layout(l), e)));
    std::memcpy(m[l], &h, 64);
  }
  const PackedMatrixHeader& h = down ? W.hdn[0] : W.hgu[0];
  const int64_t data = int64_t(h.np) * h.kp, kp = h.kp, nb = h.np / 16;
  std::memcpy(m[kPair] + 64, pool.data() + rng() % (pool.size() - data), size_t(data));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* src = m[kPair] + 64 + b * kp * 16;
    uint8_t* dst = m[kQuad] + 64 + b * kp * 16;
    for (int64_t k = 0; k < kp; ++k)
      for (int64_t n = 0; n < 16; ++n) dst[(k / 4) * 64 + n * 4 + k % 4] = src[(k / 2) * 32 + n * 2 + k % 2];
  }
  for (int64_t i = 0; i < data / 2; ++i) m[kInt4A][64 + i] = uint8_t(rng());
  std::memcpy(m[kMx] + 64, m[kInt4A] + 64, size_t(data / 2));
  const PackedMatrixHeader& hm = down ? W.hdn[kMx] : W.hgu[kMx];
  for (int64_t i = 0; i < data / 32; ++i) m[kMx][hm.scale_offset + i] = uint8_t(117 + rng() % 21);  // E8M0 117..137
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  float* s = reinterpret_cast<float*>(m[kPair] + h.scale_offset);
  const int64_t ns = fp8_scale_bytes(h.np, h.kp, h.group) / 4;
  for (int64_t i = 0; i < ns; ++i) s[i] = u(rng) * 1e-3f;
  std::memcpy(m[kQuad] + h.scale_offset, s, size_t(ns) * 4);
  const PackedMatrixHeader& h4 = down ? W.hdn[kInt4A] : W.hgu[kInt4A];
  for (int64_t r = 0; r < nb * (kp / 128); ++r) {
    uint8_t* rec = m[kInt4A] + h4.scale_offset + r * kInt4AffineRecordBytes;
    for (int j = 0; j < 16; ++j) {
      const float v = u(rng) * 1e-3f;
      std::memcpy(rec + 4 * j, &v, 4);
      rec[kInt4AffineZeroAt + j] = kInt4AffineSymmetricZero;
    }
  }
}

Weights make_weights(int64_t E) {
  Weights W;
  W.E = E;
  for (int l = 0; l < kLayouts; ++l) {
    W.hgu[l] = header(Layout(l), MatrixRole::kGateUp, 1536, 2048);
    W.hdn[l] = header(Layout(l), MatrixRole::kDown, 2048, 768);
    W.expert_bytes[l] = W.hgu[l].total_bytes + W.hdn[l].total_bytes;
    W.buf[l] = alloc_pages(size_t(E * W.expert_bytes[l]));
  }
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> pool(8 << 20);
  for (auto& b : pool) b = e4m3_from_float(nd(rng) * 100.f);  // N(0,1) weights, max |q| ~ 448 at 4.5 sigma
  for (int64_t e = 0; e < E; ++e)
    for (bool down : {false, true}) fill_matrix(W, down, e, pool, rng);
  return W;
}

struct Item {
  const PackedMatrixHeader* w;
  int64_t b0, b1;
};

// The items of one phase (gate_up or down) for experts es: blocks of about 256 KiB, a
// multiple of 4 (the driver's decode items), or of `bytes`.
std::vector<Item> items(const Weights& W, Layout l, const std::vector<int64_t>& es, bool down,
                        int64_t bytes = 256 << 10) {
  std::vector<Item> out;
  for (int64_t e : es) {
    const PackedMatrixHeader* h = down ? W.dn(l, e) : W.gu(l, e);
    const int64_t nblocks = h->np / 16, nb = std::max<int64_t>(4, bytes / (h->kp * 16 * (nibbles(l) ? 1 : 2) / 2) / 4 * 4);
    for (int64_t b = 0; b < nblocks; b += nb) out.push_back({h, b, std::min(b + nb, nblocks)});
  }
  return out;
}

// Runs the items on `threads` threads that take them from a shared counter (the driver's for_each_item).
void run_items(const std::vector<Item>& its, GemmFn fn, const uint16_t* a, int64_t lda, int64_t m, float* c,
               int threads) {
  int64_t next = 0;
#pragma omp parallel num_threads(threads)
  {
    float* ct = c + size_t(omp_get_thread_num()) * (64 << 10);
    for (int64_t i; (i = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < int64_t(its.size());)
      fn(its[i].w, a, lda, m, its[i].b0, its[i].b1, ct, 16 * (its[i].b1 - its[i].b0));
  }
}

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

// Every variant against its layout's library kernel on expert 0 (M = 1, 2, 32): the
// prefetch variants must give the same bits, the k-quad ones agree within 1e-5 (another
// pairing of the k in vdpbf16ps), the reads and "wrong" ones are not checked.
void check(const Weights& W, const std::vector<Variant>& vs, const uint16_t* x, int64_t ldx, const uint16_t* h,
           int64_t ldh) {
  for (const auto& v : vs) {
    if (std::strstr(v.name, "READ") || std::strstr(v.name, "wrong")) continue;
    const Layout ref = v.layout == kQuad ? kPair : v.layout;
    const GemmFn lib = v.layout == kInt4A ? &avx512::gemm_int4_affine
                       : v.layout == kMx  ? &avx512::gemm_mxfp4_int16
                                          : &avx512::gemm_fp8;
    for (int64_t m : {1, 2, 32})
      for (bool down : {false, true}) {
        const PackedMatrixHeader* hr = down ? W.dn(ref, 0) : W.gu(ref, 0);
        const PackedMatrixHeader* hv = down ? W.dn(v.layout, 0) : W.gu(v.layout, 0);
        const int64_t nb = hr->np / 16, n = hr->np;
        std::vector<float> want(size_t(m * n)), got(size_t(m * n));
        lib(hr, down ? h : x, down ? ldh : ldx, m, 0, nb, want.data(), n);
        v.fn(hv, down ? h : x, down ? ldh : ldx, m, 0, nb, got.data(), n);
        double worst = 0, scale = 0;
        for (float f : want) scale = std::max(scale, double(std::fabs(f)));
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / scale);
        const bool same = std::memcmp(want.data(), got.data(), want.size() * 4) == 0;
        // fp32 sums of the bf16 activations against the int16 ones' rounding: within 1e-3
        const bool other_sums = std::strstr(v.name, "mxfp4 bf16") || std::strstr(v.name, "int4a int16");
        if (v.layout == kQuad ? worst > 1e-5 : other_sums ? worst > 1e-3 : !same)
          std::printf("MISMATCH %s m=%lld down=%d: %.3g\n", v.name, (long long)m, int(down), worst);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args(argc, argv);
  const int rounds = args.rounds, threads = args.threads;
  const char* only = args.only;
  const int64_t mc = args.m;
  const int64_t E = 64, topk = 8;
  const Weights W = make_weights(E);
  const std::vector<Variant> all = {
      {"READ ONLY: 4 streams/tile", &read_pattern<4, false>, kPair},
      {"READ ONLY: sequential", &read_pattern<4, true>, kPair},
      {"fp8 no prefetch", &fp8_ahead<0>, kPair},
      {"fp8 L2 ahead 1K", &fp8_ahead<1024>, kPair},
      {"fp8 L2 ahead 2K (library)", &avx512::gemm_fp8, kPair},
      {"fp8 L2 ahead 3K", &fp8_ahead<3072>, kPair},
      {"fp8 L2 ahead 4K", &fp8_ahead<4096>, kPair},
      {"quad no prefetch", &quad_ahead<true, 0>, kQuad},
      {"quad L2 ahead 2K", &quad_ahead<true, 2048>, kQuad},
      {"quad no test (wrong)", &quad_ahead<false, 0>, kQuad},
      {"quad no test (wrong) L2 ahead 2K", &quad_ahead<false, 2048>, kQuad},
      {"int4a no prefetch", &int4a_ahead<0>, kInt4A},
      {"int4a L2 ahead 1K", &int4a_ahead<1024>, kInt4A},
      {"int4a L2 ahead 2K (library)", &avx512::gemm_int4_affine, kInt4A},
      {"int4a L2 ahead 4K", &int4a_ahead<4096>, kInt4A},
      {"int4a int16 (library, amx rows)", &avx512::gemm_int4_affine_int16, kInt4A},
      {"mxfp4 bf16 dots (avx512 library)", &avx512::gemm_mxfp4, kMx},
      {"mxfp4 int16 no prefetch (library)", &avx512::gemm_mxfp4_int16, kMx},
      {"mxfp4 int16 L2 ahead 2K", &avx512::gemm<avx512::Mxfp4Int16, 2048>, kMx},
      {"mxfp4 int16 L2 ahead 4K", &avx512::gemm<avx512::Mxfp4Int16, 4096>, kMx},
      {"mxfp4 int16 L2 ahead 8K", &avx512::gemm<avx512::Mxfp4Int16, 8192>, kMx},
  };
  const std::vector<Variant> vs = select_variants(all, only);

  // activations: x [32][2048 + 32], h [32][768 + 32] bf16 ~ N(0, 1) (the driver's row stride kp + 32)
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
  std::vector<float> c(size_t(threads) * (64 << 10));
  check(W, vs, x.data(), ldx, hh.data(), ldh);

  std::vector<Stats> cold(vs.size()), hot(vs.size()), pre(vs.size());
  Stats roof;
  for (int r = 0; r < rounds; ++r) {
    time_roof(roof, E, topk, threads, [&](int64_t e, int64_t n) {
      read_pass(W.buf[kPair] + e * W.expert_bytes[kPair], n * W.expert_bytes[kPair], threads);
    });
    for (size_t vi = 0; vi < vs.size(); ++vi) {
      const Variant& v = vs[vi];
      // cold: E / topk forwards walk all experts
      time_cold(cold[vi], E, topk, threads, [&](const std::vector<int64_t>& es) {
        return [&, gu = items(W, v.layout, es, false), dn = items(W, v.layout, es, true)] {
          run_items(gu, v.fn, x.data(), ldx, mc, c.data(), threads);
          run_items(dn, v.fn, hh.data(), ldh, mc, c.data(), threads);
        };
      });
      // hot: one 512 KiB item per thread (L2), 64 times
      {
        std::vector<Item> its;
        for (int t = 0; t < threads; ++t) its.push_back(items(W, v.layout, {t}, false, 512 << 10)[0]);
        run_items(its, v.fn, x.data(), ldx, mc, c.data(), threads);
        const double t0 = now();
        for (int i = 0; i < 64; ++i) run_items(its, v.fn, x.data(), ldx, mc, c.data(), threads);
        hot[vi].ms.push_back((now() - t0) * 1e3 / 64);
      }
      // prefill: m = 32 rows (the driver's token tile) over 512 KiB items of 2 experts
      {
        const std::vector<int64_t> es = {r % E, (r + 1) % E};
        const auto gu = items(W, v.layout, es, false, 512 << 10), dn = items(W, v.layout, es, true, 512 << 10);
        const double t0 = now();
        run_items(gu, v.fn, x.data(), ldx, 32, c.data(), threads);
        run_items(dn, v.fn, hh.data(), ldh, 32, c.data(), threads);
        pre[vi].ms.push_back((now() - t0) * 1e3);
      }
    }
  }
  const double roof_gbs = topk * W.expert_bytes[kPair] / roof.q(0.1) / 1e6;
  std::printf("threads %d, rounds %d, M = %lld; cold: ms per forward of 8 experts, p10 / median of %zu samples; read "
              "roof (a streaming read of the fp8 weights) p10 %.1f GB/s, median %.1f GB/s\n",
              threads, rounds, (long long)mc, cold.empty() ? size_t(0) : cold[0].ms.size(), roof_gbs,
              topk * W.expert_bytes[kPair] / roof.median() / 1e6);
  std::printf("%-34s %17s %6s %5s | %15s %6s | %15s\n", "variant", "cold p10/median", "GB/s", "roof", "hot us min/med",
              "GB/s", "M=32 ms min/med");
  for (size_t vi = 0; vi < vs.size(); ++vi) {
    const double fwd = double(topk * W.expert_bytes[vs[vi].layout]), hot_bytes = double(threads) * (512 << 10);
    std::printf("%-34s %8.3f %8.3f %6.1f %4.0f%% | %7.1f %7.1f %6.1f | %7.2f %7.2f\n", vs[vi].name, cold[vi].q(0.1),
                cold[vi].median(), fwd / cold[vi].q(0.1) / 1e6, 100 * fwd / cold[vi].q(0.1) / 1e6 / roof_gbs,
                hot[vi].min() * 1e3, hot[vi].median() * 1e3, hot_bytes / hot[vi].median() / 1e6, pre[vi].min(),
                pre[vi].median());
  }
  return 0;
}
