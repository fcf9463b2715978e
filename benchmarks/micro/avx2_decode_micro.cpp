// [NOTE] Microbenchmark of the avx2 int8 and int4 decode (gemm_int8_avx2.cpp,
// gemm_int4_avx2.cpp + gemm_int4_tile.h): variants timed alternately in one process,
// cold and hot.
//
// Build and run (from the repository root; flags = csrc/isa_flags.json's avx2 row and no
// host-tuned ones: the binary must run what an AVX2-only host runs):
//   $(python -m benchmarks.micro.build avx2_decode_micro) [rounds=15] [threads=1]
//     [variants: comma-separated substrings, "" = all] [M=1]
// It includes the kernel files themselves, so the variants run the library's dot loops,
// tiles and epilogues, with the weight prefetch (distance in bytes, cache level) as
// template arguments (0: none); the library's entry points are the "(library)" rows.
// Every variant is checked bit for bit against the library on expert 0 (M = 1, 2, 5).
//
// Working set: E = 64 experts of the reference shape (gate_up 1536 x 2048, down
// 2048 x 768, group 32) in each format (int8 4.7 + 0.6 MB, int4 2.4 + 0.3 MB of scales
// an expert: 340 / 170 MB, >> the L3). Cold: rounds of 8 forwards that walk all 64
// experts (every variant reads weights the others evicted), gate_up then down in the
// driver's decode items (about 256 KiB, a multiple of 4 blocks), taken by the threads
// from a shared counter. On 1 thread each expert is one sample (x 8: ms per forward),
// else each forward; the table gives p10 and median, GB/s of the format's bytes
// (weights and scales) at p10, and that against the read roof (a streaming read of the
// int8 experts with 256-bit loads in the same rounds, at p10). Hot: one 256 KiB item
// per thread (in L2) 64 times.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "decode_micro_harness.h"

// The library's avx2 int kernels themselves (their anonymous-namespace helpers become this file's), and
// the format table block_data_bytes reads.
#include "kernels/avx2/gemm_fp8_avx2.cpp"
#include "kernels/avx2/gemm_int4_affine_avx2.cpp"
#include "kernels/avx2/gemm_int4_avx2.cpp"
#include "kernels/avx2/gemm_int8_avx2.cpp"
#include "kernels/weight_formats.cpp"

using namespace ktmoe;
using namespace decode_micro;
using namespace ktmoe::avx2;

namespace {

using GemmFn = void (*)(const PackedMatrixHeader*, const QuantizedRows&, int64_t, int64_t, int64_t, float*, int64_t);
using Bf16Fn = void (*)(const PackedMatrixHeader*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);

// int8 and int4 (group 32, int8 activations), fp8 and int4_affine (group 128, bf16 activations).
enum Fmt { kI8 = 0, kI4 = 1, kF8 = 2, kI4A = 3 };
constexpr int kFormats = 4;
constexpr WeightFormat kWeightFormat[kFormats] = {WeightFormat::kINT8, WeightFormat::kINT4, WeightFormat::kFP8,
                                                  WeightFormat::kINT4A};
constexpr int64_t kGroupOf[kFormats] = {32, 32, 128, 128};
constexpr int64_t kGroup = 32;  // of the int8 activations

// fp8 / int4_affine with the decode tiles' prefetch kAhead bytes ahead (the entry points' bodies).
template <int64_t kAhead>
void fp8_ahead(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
               float* c, int64_t ldc) {
  const int64_t kp = w->kp, ngroups = kp / w->group;
  const decoded::Ctx x{packed_data(w), fp8_block_data_bytes(kp), ngroups, w->group / 2};
  decoded::gemm<Fp8Decoder, kAhead>(Fp8Decoder(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1, c, ldc);
}
template <int64_t kAhead>
void int4a_ahead(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                 float* c, int64_t ldc) {
  const int64_t kp = w->kp, ngroups = kp / w->group;
  const decoded::Ctx x{packed_data(w), int4a_block_data_bytes(kp), ngroups, w->group / 2};
  decoded::gemm<Int4AffineDecoder, kAhead>(Int4AffineDecoder(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1,
                                           c, ldc);
}

template <int64_t kAhead, int kHint>
void int4_ahead(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t m, int64_t b0, int64_t b1, float* c,
                int64_t ldc) {
  gemm_int4_with<MaddubsOctets, kAhead, kHint>(w, a, m, b0, b1, c, ldc);
}

// Reads blocks [b0, b1) of w in order with 256-bit loads; c[0] = a sum. With kAlu / kBroadcasts > 0 each
// 64-byte line also gets kAlu vector ALU operations (vpmaddubsw, vpmaddwd, vpaddd, vpxor on registers,
// independent of the loaded bytes) and kBroadcasts 32-bit broadcasts from the activations (in L1): the
// decode loop's instruction mix without its dependence on the weights.
template <Fmt F, int kAlu = 0, int kBroadcasts = 0>
void read_blocks(const PackedMatrixHeader* w, const QuantizedRows& a, int64_t, int64_t b0, int64_t b1, float* c,
                 int64_t) {
  const int64_t bstride = block_data_bytes(kWeightFormat[F], w->kp);
  const uint8_t* d = packed_data(w);
  __m256i s0 = _mm256_setzero_si256(), s1 = s0;
  __m256i r0 = s0, r1 = _mm256_set1_epi8(3), r2 = _mm256_set1_epi8(5), r3 = s0;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t o = b0 * bstride, line = 0; o < b1 * bstride; o += 64, ++line) {
    s0 = _mm256_add_epi32(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + o)));
    s1 = _mm256_add_epi32(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + o + 32)));
    for (int i = 0; i < kBroadcasts; ++i) r3 = _mm256_add_epi32(r3, broadcast32(a.q + ((line * 4 + i * 64) & 1023)));
    for (int i = 0; i < kAlu / 4; ++i) {
      r0 = _mm256_add_epi32(r0, _mm256_madd_epi16(_mm256_maddubs_epi16(r1, r2), ones));
      r2 = _mm256_xor_si256(r2, r1);
    }
  }
  c[0] = float(hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(r0, r3))));
}

struct Variant {
  const char* name;
  GemmFn fn;    // int8 activations, or
  Bf16Fn bfn;   // bf16 activations
  Fmt fmt;
};

// A hand-built header with the packer's offsets: the format's group, np = n, kp = k.
PackedMatrixHeader header(Fmt f, MatrixRole role, int64_t n, int64_t k) {
  PackedMatrixHeader h{};
  const int64_t g = kGroupOf[f];
  h.magic = kPackedMagic, h.version = kPackedVersion;
  h.format = uint8_t(kWeightFormat[f]);
  h.role = uint8_t(role), h.n = int32_t(n), h.k = int32_t(k), h.np = int32_t(n), h.kp = int32_t(k);
  h.group = int32_t(g), h.data_offset = 64;
  h.scale_offset = 64 + (n / 16) * block_data_bytes(kWeightFormat[f], k);
  const int64_t scale_bytes = f == kI8   ? n * (k / g) * 4
                              : f == kI4 ? (n / 16) * (k / g) * kInt4ScaleBytes
                              : f == kF8 ? fp8_scale_bytes(n, k, g)
                                         : int4a_scale_bytes(n, k, g);
  h.total_bytes = (h.scale_offset + scale_bytes + 63) / 64 * 64;
  return h;
}

// E experts x (gate_up, down) per format: random codes (fp8: finite e4m3), scales in [0.5, 1) * 1e-3
// (int4_affine: zero points 8).
struct Weights {
  int64_t E;
  PackedMatrixHeader hgu[kFormats], hdn[kFormats];
  uint8_t* buf[kFormats];
  int64_t expert_bytes[kFormats];
  const PackedMatrixHeader* at(Fmt f, int64_t e, bool down) const {
    return reinterpret_cast<const PackedMatrixHeader*>(buf[f] + e * expert_bytes[f] + (down ? hgu[f].total_bytes : 0));
  }
};

Weights make_weights(int64_t E) {
  Weights W;
  W.E = E;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  for (int f = 0; f < kFormats; ++f) {
    W.hgu[f] = header(Fmt(f), MatrixRole::kGateUp, 1536, 2048);
    W.hdn[f] = header(Fmt(f), MatrixRole::kDown, 2048, 768);
    W.expert_bytes[f] = W.hgu[f].total_bytes + W.hdn[f].total_bytes;
    W.buf[f] = alloc_pages(size_t(E * W.expert_bytes[f]));
    for (int64_t e = 0; e < E; ++e)
      for (bool down : {false, true}) {
        const PackedMatrixHeader& h = down ? W.hdn[f] : W.hgu[f];
        uint8_t* m = const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(W.at(Fmt(f), e, down)));
        std::memcpy(m, &h, 64);
        for (int64_t i = 64; i < h.scale_offset; i += 8) {
          uint64_t v = rng();
          if (f == kI8)  // u in [1, 255]: wq in [-127, 127]
            v |= 0x0101010101010101ull;
          if (f == kF8)  // no NaN (S.1111.111): clear each byte's lowest bit
            v &= 0xFEFEFEFEFEFEFEFEull;
          std::memcpy(m + i, &v, 8);
        }
        if (f == kI8) {
          float* s = reinterpret_cast<float*>(m + h.scale_offset);
          for (int64_t i = 0; i < int64_t(h.np) * (h.kp / kGroup); ++i) s[i] = u(rng) * 1e-3f;
        } else if (f == kF8) {
          float* s = reinterpret_cast<float*>(m + h.scale_offset);
          for (int64_t i = 0; i < fp8_scale_bytes(h.np, h.kp, h.group) / 4; ++i) s[i] = u(rng) * 1e-3f;
        } else if (f == kI4A) {
          for (int64_t r = 0; r < int64_t(h.np) / 16 * (h.kp / h.group); ++r) {
            uint8_t* rec = m + h.scale_offset + r * kInt4AffineRecordBytes;
            for (int j = 0; j < 16; ++j) {
              const float v = u(rng) * 1e-3f;
              std::memcpy(rec + 4 * j, &v, 4);
              rec[kInt4AffineZeroAt + j] = kInt4AffineSymmetricZero;
            }
          }
        } else {
          uint16_t* s = reinterpret_cast<uint16_t*>(m + h.scale_offset);
          for (int64_t i = 0; i < int64_t(h.np) * (h.kp / kGroup); ++i) {
            const float v = u(rng) * 1e-3f;
            uint32_t b;
            std::memcpy(&b, &v, 4);
            s[i] = uint16_t(b >> 16);
          }
        }
      }
  }
  return W;
}

// int8 activations of 32 rows (xq in [-127, 127]) for kp columns, in both formats' scale
// layouts: int8 one scale per (row, group), int4 one per row; gsum per (row, group); and bf16
// rows (xq / 32, row stride kp).
struct Acts {
  int64_t kp;
  std::vector<int8_t> q;
  std::vector<float> s8, s4;
  std::vector<int32_t> gsum;
  std::vector<uint16_t> bf16;
  QuantizedRows rows(Fmt f) const {
    return {q.data(), kp, f == kI8 ? s8.data() : s4.data(), gsum.data(), kp / kGroup};
  }
};

Acts make_acts(int64_t kp, uint64_t seed) {
  Acts a{kp, std::vector<int8_t>(size_t(32 * kp)), std::vector<float>(size_t(32 * kp / kGroup)),
         std::vector<float>(32), std::vector<int32_t>(size_t(32 * kp / kGroup)), std::vector<uint16_t>(size_t(32 * kp))};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 40.f);
  for (auto& x : a.q) x = int8_t(std::max(-127.f, std::min(127.f, nd(rng))));
  for (size_t i = 0; i < a.q.size(); ++i) {
    const float f = float(a.q[i]) / 32.f;  // exact in bf16
    uint32_t b;
    std::memcpy(&b, &f, 4);
    a.bf16[i] = uint16_t(b >> 16);
  }
  for (auto& s : a.s8) s = 1e-2f + float(rng() % 100) * 1e-4f;
  for (auto& s : a.s4) s = 1e-2f + float(rng() % 100) * 1e-4f;
  for (int64_t r = 0; r < 32; ++r)
    for (int64_t G = 0; G < kp / kGroup; ++G) {
      int32_t t = 0;
      for (int64_t k = G * kGroup; k < (G + 1) * kGroup; ++k) t += a.q[size_t(r * kp + k)];
      a.gsum[size_t(r * (kp / kGroup) + G)] = t;
    }
  return a;
}

struct Item {
  const PackedMatrixHeader* w;
  int64_t b0, b1;
};

// The items of one phase (gate_up or down) for experts es: blocks of about `bytes`, a multiple of 4.
std::vector<Item> items(const Weights& W, Fmt f, const std::vector<int64_t>& es, bool down, int64_t bytes = 256 << 10) {
  std::vector<Item> out;
  for (int64_t e : es) {
    const PackedMatrixHeader* h = W.at(f, e, down);
    const int64_t blk = block_data_bytes(kWeightFormat[f], h->kp);
    const int64_t nblocks = h->np / 16, nb = std::max<int64_t>(4, bytes / blk / 4 * 4);
    for (int64_t b = 0; b < nblocks; b += nb) out.push_back({h, b, std::min(b + nb, nblocks)});
  }
  return out;
}

// Runs the items on `threads` threads that take them from a shared counter (the driver's for_each_item).
void run_items(const std::vector<Item>& its, const Variant& v, const Acts& acts, int64_t m, float* c, int threads) {
  int64_t next = 0;
  const QuantizedRows a = acts.rows(v.fmt);
#pragma omp parallel num_threads(threads)
  {
    float* ct = c + size_t(omp_get_thread_num()) * (64 << 10);
    for (int64_t i; (i = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < int64_t(its.size());) {
      const Item& it = its[size_t(i)];
      if (v.fn)
        v.fn(it.w, a, m, it.b0, it.b1, ct, 16 * (it.b1 - it.b0));
      else
        v.bfn(it.w, acts.bf16.data(), acts.kp, m, it.b0, it.b1, ct, 16 * (it.b1 - it.b0));
    }
  }
}

// A streaming read of the same weights (256-bit loads, 4 streams), the roof.
double read_pass(const uint8_t* p, int64_t bytes, int threads) {
  uint64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = bytes * t / nt / 128 * 128, hi = bytes * (t + 1) / nt / 128 * 128;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = lo; i < hi; i += 128) {
      s0 = _mm256_add_epi32(s0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
      s1 = _mm256_add_epi32(s1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
      s2 = _mm256_add_epi32(s2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
      s3 = _mm256_add_epi32(s3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
    }
    sink += uint32_t(hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3))));
  }
  return double(sink);
}

// Every variant against its format's library kernel on expert 0 (M = 1, 2, 5): the same bits.
void check(const Weights& W, const std::vector<Variant>& vs, const Acts& x, const Acts& h) {
  for (const auto& v : vs) {
    if (std::strstr(v.name, "READ")) continue;
    const Variant lib = v.fmt == kI8   ? Variant{"", &avx2::gemm_int8, nullptr, kI8}
                        : v.fmt == kI4 ? Variant{"", &avx2::gemm_int4, nullptr, kI4}
                        : v.fmt == kF8 ? Variant{"", nullptr, &avx2::gemm_fp8, kF8}
                                       : Variant{"", nullptr, &avx2::gemm_int4_affine, kI4A};
    for (int64_t m : {1, 2, 5})
      for (bool down : {false, true}) {
        const PackedMatrixHeader* hw = W.at(v.fmt, 0, down);
        const int64_t nb = hw->np / 16, n = hw->np;
        std::vector<float> want(size_t(m * n)), got(size_t(m * n));
        run_items({{hw, 0, nb}}, lib, down ? h : x, m, want.data(), 1);
        run_items({{hw, 0, nb}}, v, down ? h : x, m, got.data(), 1);
        if (std::memcmp(want.data(), got.data(), want.size() * 4) != 0)
          std::printf("MISMATCH %s m=%lld down=%d\n", v.name, (long long)m, int(down));
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
  constexpr int T0 = _MM_HINT_T0, T1 = _MM_HINT_T1, T2 = _MM_HINT_T2;
  const std::vector<Variant> all = {
      {"READ ONLY: int8 blocks", &read_blocks<kI8>, nullptr, kI8},
      {"READ ONLY: int4 blocks", &read_blocks<kI4>, nullptr, kI4},
      {"READ + 12 ALU, 2 bcast: int8", &read_blocks<kI8, 12, 2>, nullptr, kI8},
      {"int8 (library)", &avx2::gemm_int8, nullptr, kI8},
      {"int8 no prefetch", &gemm_int8_ahead<0, T0>, nullptr, kI8},
      {"int8 L1 ahead 1K", &gemm_int8_ahead<1024, T0>, nullptr, kI8},
      {"int8 L2 ahead 1K", &gemm_int8_ahead<1024, T1>, nullptr, kI8},
      {"int8 L2 ahead 2K", &gemm_int8_ahead<2048, T1>, nullptr, kI8},
      {"int8 L2 ahead 4K", &gemm_int8_ahead<4096, T1>, nullptr, kI8},
      {"int8 L2 ahead 8K", &gemm_int8_ahead<8192, T1>, nullptr, kI8},
      {"int8 L2 ahead 16K", &gemm_int8_ahead<16384, T1>, nullptr, kI8},
      {"int8 T2 ahead 4K", &gemm_int8_ahead<4096, T2>, nullptr, kI8},
      {"int8 T2 ahead 16K", &gemm_int8_ahead<16384, T2>, nullptr, kI8},
      {"int4 (library)", &avx2::gemm_int4, nullptr, kI4},
      {"int4 no prefetch", &int4_ahead<0, T0>, nullptr, kI4},
      {"int4 L1 ahead 1K", &int4_ahead<1024, T0>, nullptr, kI4},
      {"int4 L1 ahead 2K", &int4_ahead<2048, T0>, nullptr, kI4},
      {"int4 L2 ahead 1K", &int4_ahead<1024, T1>, nullptr, kI4},
      {"int4 L2 ahead 2K", &int4_ahead<2048, T1>, nullptr, kI4},
      {"int4 L2 ahead 4K", &int4_ahead<4096, T1>, nullptr, kI4},
      {"int4 L2 ahead 8K", &int4_ahead<8192, T1>, nullptr, kI4},
      {"int4 L2 ahead 12K", &int4_ahead<12288, T1>, nullptr, kI4},
      {"int4 L2 ahead 16K", &int4_ahead<16384, T1>, nullptr, kI4},
      {"READ ONLY: fp8 blocks", &read_blocks<kF8>, nullptr, kF8},
      {"fp8 (library)", nullptr, &avx2::gemm_fp8, kF8},
      {"fp8 no prefetch", nullptr, &fp8_ahead<0>, kF8},
      {"fp8 L2 ahead 1K", nullptr, &fp8_ahead<1024>, kF8},
      {"fp8 L2 ahead 2K", nullptr, &fp8_ahead<2048>, kF8},
      {"fp8 L2 ahead 4K", nullptr, &fp8_ahead<4096>, kF8},
      {"int4a (library)", nullptr, &avx2::gemm_int4_affine, kI4A},
      {"int4a no prefetch", nullptr, &int4a_ahead<0>, kI4A},
      {"int4a L2 ahead 1K", nullptr, &int4a_ahead<1024>, kI4A},
      {"int4a L2 ahead 2K", nullptr, &int4a_ahead<2048>, kI4A},
      {"int4a L2 ahead 4K", nullptr, &int4a_ahead<4096>, kI4A},
  };
  const std::vector<Variant> vs = select_variants(all, only);

  const Acts x = make_acts(2048, 11), hh = make_acts(768, 12);
  std::vector<float> c(size_t(threads) * (64 << 10));
  check(W, vs, x, hh);

  std::vector<Stats> cold(vs.size()), hot(vs.size());
  Stats roof;
  for (int r = 0; r < rounds; ++r) {
    time_roof(roof, E, topk, threads, [&](int64_t e, int64_t n) {
      read_pass(W.buf[kI8] + e * W.expert_bytes[kI8], n * W.expert_bytes[kI8], threads);
    });
    for (size_t vi = 0; vi < vs.size(); ++vi) {
      const Variant& v = vs[vi];
      time_cold(cold[vi], E, topk, threads, [&](const std::vector<int64_t>& es) {
        return [&, gu = items(W, v.fmt, es, false), dn = items(W, v.fmt, es, true)] {
          run_items(gu, v, x, mc, c.data(), threads);
          run_items(dn, v, hh, mc, c.data(), threads);
        };
      });
      {  // hot: one 256 KiB item per thread (L2), 64 times
        std::vector<Item> its;
        for (int t = 0; t < threads; ++t) its.push_back(items(W, v.fmt, {t}, false)[0]);
        run_items(its, v, x, mc, c.data(), threads);
        const double t0 = now();
        for (int i = 0; i < 64; ++i) run_items(its, v, x, mc, c.data(), threads);
        hot[vi].ms.push_back((now() - t0) * 1e3 / 64);
      }
    }
  }
  const double roof_gbs = topk * W.expert_bytes[kI8] / roof.q(0.1) / 1e6;
  std::printf("threads %d, rounds %d, M = %lld; cold: ms per forward of 8 experts, p10 / median of %zu samples; read "
              "roof (256-bit streaming read of the int8 weights) p10 %.1f GB/s, median %.1f GB/s\n",
              threads, rounds, (long long)mc, cold.empty() ? size_t(0) : cold[0].ms.size(), roof_gbs,
              topk * W.expert_bytes[kI8] / roof.median() / 1e6);
  std::printf("%-28s %17s %6s %5s | %15s %6s\n", "variant", "cold p10/median", "GB/s", "roof", "hot us min/med",
              "GB/s");
  for (size_t vi = 0; vi < vs.size(); ++vi) {
    const double fwd = double(topk * W.expert_bytes[vs[vi].fmt]);
    const Item it = items(W, vs[vi].fmt, {0}, false)[0];
    const double hot_bytes = double(threads) * double((it.b1 - it.b0) * block_data_bytes(kWeightFormat[vs[vi].fmt], it.w->kp));
    std::printf("%-28s %8.3f %8.3f %6.1f %4.0f%% | %7.1f %7.1f %6.1f\n", vs[vi].name, cold[vi].q(0.1),
                cold[vi].median(), fwd / cold[vi].q(0.1) / 1e6, 100 * fwd / cold[vi].q(0.1) / 1e6 / roof_gbs,
                hot[vi].min() * 1e3, hot[vi].median() * 1e3, hot_bytes / hot[vi].median() / 1e6);
  }
  return 0;
}
