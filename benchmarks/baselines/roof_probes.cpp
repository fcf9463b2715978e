// [NOTE] The roofs of the benchmarks, on every ISA (built for benchmarks/baselines/roofs.py by
// benchmarks/micro/build.py with the active ISA's flags from csrc/isa_flags.json).
//
// read_roof_gbps(buf, bytes, threads, repeats): the best of `repeats` passes in which
// `threads` std::threads sum 1 MiB chunks of buf, taken from a shared counter (so a
// thread that a noisy VM deschedules reads less instead of holding the pass up, as the
// MoE driver's items do), read as one stream or as 4 side by side (the best counts), as
// 32-bit lanes with
// the widest loads the build's flags allow (64-byte zmm loads under avx512 / amx,
// 32-byte ymm loads under avx2, 8-byte loads under generic), 8 independent
// accumulators per thread so that enough loads stay in flight to reach the core's
// share of DRAM bandwidth. Integer adds: no float assists on arbitrary bits.
// A pass is timed from the moment every thread is running to the last one's end.
// read_seconds(bufs, bytes, n, threads): one such pass (one stream per chunk) over n
// buffers, e.g. the slices of a weight arena (benchmarks/memory/bench_arena.py).
//
// compute_roof_gflops(threads, seconds): the peak rate of the instruction our bf16 gemm
// multiplies with: vdpbf16ps (32 multiply-adds per instruction) on AVX-512 BF16 hosts,
// vfmadd231ps on 256-bit fp32 (8 per instruction) on AVX2 hosts (whose bf16 path widens to
// fp32). 12 independent accumulator chains per thread cover the latency x throughput product.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

namespace {

#if defined(__AVX512F__)
using Vec = __m512i;
constexpr int64_t kVec = 64;
inline Vec vzero() { return _mm512_setzero_si512(); }
inline Vec vadd(Vec a, const uint8_t* p) { return _mm512_add_epi32(a, _mm512_loadu_si512(p)); }
inline uint64_t vsum(Vec a) { return uint32_t(_mm512_reduce_add_epi32(a)); }
#elif defined(__AVX2__)
using Vec = __m256i;
constexpr int64_t kVec = 32;
inline Vec vzero() { return _mm256_setzero_si256(); }
inline Vec vadd(Vec a, const uint8_t* p) {
  return _mm256_add_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline uint64_t vsum(Vec a) {
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  uint64_t s = 0;
  for (uint32_t v : lanes) s += v;
  return s;
}
#else
using Vec = uint64_t;
constexpr int64_t kVec = 8;
inline Vec vzero() { return 0; }
inline Vec vadd(Vec a, const uint8_t* p) { return a + *reinterpret_cast<const uint64_t*>(p); }
inline uint64_t vsum(Vec a) { return a; }
#endif

// Sums [p, p + n) as S streams read side by side (the chunk's S equal parts, 8/S
// vectors of each per step, 8 accumulators): the kernels read 2-4 weight blocks at
// once, and several streams can draw more bandwidth from one core than one stream.
template <int S>
uint64_t sum_streams(const uint8_t* p, int64_t n) {
  constexpr int kPer = 8 / S;
  const int64_t part = n / S / (kPer * kVec) * (kPer * kVec);
  Vec acc[8];
  for (auto& a : acc) a = vzero();
  for (int64_t i = 0; i < part; i += kPer * kVec)
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) acc[u] = vadd(acc[u], p + (u / kPer) * part + i + (u % kPer) * kVec);
  uint64_t s = 0;
  for (auto& a : acc) s += vsum(a);
  for (int64_t i = S * part; i < n; ++i) s += p[i];
  return s;
}

}  // namespace

extern "C" const char* compute_roof_instruction() {
#if defined(__AVX512BF16__)
  return "vdpbf16ps zmm";
#elif defined(__AVX512F__)
  return "vfmadd231ps zmm";
#elif defined(__AVX2__) && defined(__FMA__)
  return "vfmadd231ps ymm";
#else
  return "scalar fma";
#endif
}

namespace {

// Multiply-adds of one thread's `iters` iterations of 12 chains; the result is kept observable.
double fma_chains(int64_t iters, float* sink) {
  constexpr int kChains = 12;
#if defined(__AVX512BF16__)
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
  for (int c = 1; c < kChains; ++c) acc[0] = _mm512_add_ps(acc[0], acc[c]);
  *sink += _mm512_reduce_add_ps(acc[0]);
  return double(iters) * kChains * 32;
#elif defined(__AVX512F__)
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  for (int c = 1; c < kChains; ++c) acc[0] = _mm512_add_ps(acc[0], acc[c]);
  *sink += _mm512_reduce_add_ps(acc[0]);
  return double(iters) * kChains * 16;
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[kChains];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  alignas(32) float lanes[8];
  for (int c = 1; c < kChains; ++c) acc[0] = _mm256_add_ps(acc[0], acc[c]);
  _mm256_store_ps(lanes, acc[0]);
  for (float v : lanes) *sink += v;
  return double(iters) * kChains * 8;
#else
  float acc[kChains] = {};
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * 1.0001f + 0.9999f;
  for (float v : acc) *sink += v;
  return double(iters) * kChains;
#endif
}

}  // namespace

// GFLOP/s (2 per multiply-add) of `threads` threads each running fma_chains; best of 3 passes.
extern "C" double compute_roof_gflops(int threads, int64_t iters) {
  double best = 0.0;
  std::vector<float> sinks(size_t(threads) * 16, 0.f);
  for (int r = 0; r < 3; ++r) {
    std::vector<double> madds(size_t(threads), 0.0);
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { madds[t] = fma_chains(iters, &sinks[size_t(t) * 16]); });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double total = 0.0;
    for (double m : madds) total += m;
    if (2.0 * total / s / 1e9 > best) best = 2.0 * total / s / 1e9;
  }
  return best;
}

extern "C" const char* read_roof_isa() {
#if defined(__AVX512F__)
  return "avx512 (64-byte loads)";
#elif defined(__AVX2__)
  return "avx2 (32-byte loads)";
#else
  return "scalar (8-byte loads)";
#endif
}

// One pass of `threads` threads over the buffers (bufs[i], bytes[i]), S streams per
// 1 MiB chunk; returns the seconds from the moment every thread runs to the last one's end.
template <int S>
double read_pass(const void* const* bufs, const int64_t* bytes, int n, int threads, std::atomic<uint64_t>& sink) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<std::pair<const uint8_t*, int64_t>> chunks;
  for (int i = 0; i < n; ++i)
    for (int64_t lo = 0; lo < bytes[i]; lo += kChunk)
      chunks.emplace_back(static_cast<const uint8_t*>(bufs[i]) + lo, std::min(kChunk, bytes[i] - lo));
  const int64_t count = int64_t(chunks.size());
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::atomic<int64_t> next{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      uint64_t s = 0;
      for (int64_t c = next.fetch_add(1); c < count; c = next.fetch_add(1))
        s += sum_streams<S>(chunks[c].first, chunks[c].second);
      sink.fetch_add(s, std::memory_order_relaxed);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

extern "C" double read_roof_gbps(const void* buf, int64_t bytes, int threads, int repeats) {
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int r = 0; r < repeats; ++r)
    best = std::max({best, double(bytes) / read_pass<1>(&buf, &bytes, 1, threads, sink) / 1e9,
                     double(bytes) / read_pass<4>(&buf, &bytes, 1, threads, sink) / 1e9});
  return sink.load() == 0x5eed ? -best : best;  // keeps the sums observable
}

// Seconds of one streaming read (one stream per chunk) of n buffers, e.g. the slices of an arena.
extern "C" double read_seconds(const void* const* bufs, const int64_t* bytes, int n, int threads) {
  std::atomic<uint64_t> sink{0};
  const double s = read_pass<1>(bufs, bytes, n, threads, sink);
  return sink.load() == 0x5eed ? -s : s;
}
