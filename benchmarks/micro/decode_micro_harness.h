// [NOTE] The timing scaffolding the decode microbenchmarks share (fp8_decode_micro.cpp,
// avx2_decode_micro.cpp): page-aligned buffers, a clock, sample statistics, and the
// variant filter of their command lines. Header-only; each benchmark is one translation unit.
#pragma once
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/huge_pages.cpp"  // the library's allocation of packed weights

namespace decode_micro {

// The command line the decode microbenchmarks share: [rounds=15] [threads=1] [variants:
// comma-separated substrings of their names, "" = all] [M=1: rows of the cold and hot decode].
struct Args {
  int rounds = 15, threads = 1;
  const char* only = nullptr;
  int64_t m = 1;
  Args(int argc, char** argv) {
    if (argc > 1) rounds = std::atoi(argv[1]);
    if (argc > 2) threads = std::atoi(argv[2]);
    if (argc > 3 && argv[3][0]) only = argv[3];
    if (argc > 4) m = std::atoi(argv[4]);
  }
};

// n bytes as the library allocates packed weights: its own mapping on transparent huge pages
// (map_huge_pages), or with MICRO_4K_PAGES set a mapping without the advice; never freed; aborts when
// out of memory.
inline uint8_t* alloc_pages(size_t n) {
  void* p = std::getenv("MICRO_4K_PAGES")
                ? mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                : ktmoe::map_huge_pages(int64_t(n));
  if (p == nullptr || p == MAP_FAILED) std::abort();
  return static_cast<uint8_t*>(p);
}

// Seconds on the steady clock.
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Samples (ms) and their order statistics.
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

// Appends to cold the samples of E / topk forwards, forward f walking experts [f·topk,
// (f+1)·topk): on 1 thread one sample per expert (x topk: ms per forward; short samples are
// rarely preempted on a shared host), else one per forward. make(experts) returns the call
// to time (what it prepares is not timed).
template <class Make>
void time_cold(Stats& cold, int64_t E, int64_t topk, int threads, const Make& make) {
  for (int64_t f = 0; f < E / topk; ++f) {
    std::vector<std::vector<int64_t>> samples(threads == 1 ? size_t(topk) : 1);
    for (int64_t j = 0; j < topk; ++j) samples[threads == 1 ? size_t(j) : 0].push_back(f * topk + j);
    for (const auto& es : samples) {
      const auto run = make(es);
      const double t0 = now();
      run();
      cold.ms.push_back((now() - t0) * 1e3 * topk / int64_t(es.size()));
    }
  }
}

// Appends to roof the read roof's samples of one round over E experts, as the cold samples
// (ms per forward of topk experts): read(e, n) reads experts [e, e + n).
template <class Read>
void time_roof(Stats& roof, int64_t E, int64_t topk, int threads, const Read& read) {
  const int64_t n = threads == 1 ? 1 : topk;
  for (int64_t e = 0; e < E; e += n) {
    const double t0 = now();
    read(e, n);
    roof.ms.push_back((now() - t0) * 1e3 * topk / n);
  }
}

// The variants (anything with a `name`) whose name contains one of the comma-separated
// substrings of `only`; all of them when only is null.
template <class V>
std::vector<V> select_variants(const std::vector<V>& all, const char* only) {
  std::vector<V> vs;
  const std::string f = only ? only : "";
  for (const auto& v : all) {
    bool take = !only;
    for (size_t i = 0; !take && i <= f.size();) {
      const size_t j = std::min(f.find(',', i), f.size());
      take = j > i && std::strstr(v.name, f.substr(i, j - i).c_str());
      i = j + 1;
    }
    if (take) vs.push_back(v);
  }
  return vs;
}

}  // namespace decode_micro
