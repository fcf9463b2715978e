// [NOTE] Microbenchmark: avx2's gemm_int8 / gemm_int4 against avx2_vnni's, one thread, decode.
//
// Built by benchmarks/micro/bench_avx2_vnni.py through benchmarks/micro/build.py; the avx2_vnni
// kernels are the "avx2_vnni_evex" build (the EVEX vpdpbusd), so it runs on AVX-512 hosts
// without AVX-VNNI, as a proxy for a real AVX-VNNI host (say so when quoting it).
//
// One pass = the expert gemms of one token of the reference layer (Qwen3-30B-A3B: H 2048,
// I 768, top-8): for each of 8 experts, gate_up [2I, H] then down [H, I], M = 1 row.
//   cold: 128 experts' matrices (int8 604 MB, int4 ~320 MB), consecutive passes (of either
//         kernel) take the next 8, so every pass reads weights last read 15 passes ago;
//   hot:  one expert's matrices, 8 times per pass (int8 4.7 MB, int4 2.4 MB: L3-resident).
// The two kernels alternate pass by pass (which goes first alternates too), so load from
// other processes falls on both alike. Prints, per format, mode and kernel: min and median
// ms per pass and GB/s of weight bytes at the min, and the bits of both kernels' outputs
// compared (they must be equal).
// Usage: avx2_vnni_gemm PASSES (default 300).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "kernels/isa_kernels.h"
#include "kernels/pack.h"

namespace ktmoe {
const IsaKernels& avx2_vnni_evex_kernels();  // csrc/kernels/avx2_vnni/ built as "avx2_vnni_evex"
}  // namespace ktmoe

using namespace ktmoe;

namespace {

constexpr int64_t kH = 2048, kI = 768, kTopK = 8, kExperts = 128;

struct Blob {
  std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
  int64_t bytes = 0;
  const PackedMatrixHeader* h() const { return reinterpret_cast<const PackedMatrixHeader*>(p.get()); }
};

Blob pack_random(WeightFormat f, MatrixRole role, int64_t n, int64_t k, std::mt19937& rng) {
  const PackedMatrixHeader h = packed_matrix_header(f, role, n, k, 0);
  std::normal_distribution<float> gauss(0.f, 1.f / 45.f);
  std::vector<float> w(size_t(n * k));
  for (float& v : w) v = gauss(rng);
  std::vector<const float*> rows(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) rows[size_t(r)] = w.data() + r * k;
  Blob b;
  b.bytes = h.total_bytes;
  b.p.reset(static_cast<uint8_t*>(std::aligned_alloc(64, size_t(h.total_bytes))));
  pack_matrix(h, rows.data(), b.p.get());
  return b;
}

Blob copy_of(const Blob& src) {
  Blob b;
  b.bytes = src.bytes;
  b.p.reset(static_cast<uint8_t*>(std::aligned_alloc(64, size_t(src.bytes))));
  std::memcpy(b.p.get(), src.p.get(), size_t(src.bytes));
  return b;
}

// One int8 activation row padded to kp, its scale and group sums over `group`.
struct Row {
  std::vector<int8_t> q;
  std::vector<int32_t> gsum;
  float scale = 0.01f;
  QuantizedRows view() const { return {q.data(), int64_t(q.size()), &scale, gsum.data(), int64_t(gsum.size())}; }
};

Row random_row(int64_t kp, int64_t group, std::mt19937& rng) {
  Row r;
  r.q.resize(size_t(kp));
  r.gsum.assign(size_t(kp / group), 0);
  for (int64_t c = 0; c < kp; ++c) {
    r.q[size_t(c)] = int8_t(int(rng() % 255) - 127);
    r.gsum[size_t(c / group)] += r.q[size_t(c)];
  }
  return r;
}

using Gemm = void (*)(const PackedMatrixHeader*, const QuantizedRows&, int64_t, int64_t, int64_t, float*, int64_t);

struct Layer {
  std::vector<Blob> w13, w2;  // per expert
  Row x, h;                   // gate_up's and down's input rows
};

// One pass: experts first, first + 1, ... (mod the layer's count) -> out13 / out2 (last expert's).
double pass(Gemm gemm, const Layer& L, int64_t first, std::vector<float>& out13, std::vector<float>& out2) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t j = 0; j < kTopK; ++j) {
    const int64_t e = (first + j) % int64_t(L.w13.size());
    const PackedMatrixHeader* a = L.w13[size_t(e)].h();
    const PackedMatrixHeader* b = L.w2[size_t(e)].h();
    gemm(a, L.x.view(), 1, 0, a->np / 16, out13.data(), a->np);
    gemm(b, L.h.view(), 1, 0, b->np / 16, out2.data(), b->np);
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void run(WeightFormat f, const char* name, int passes) {
  std::mt19937 rng(7);
  Layer L;
  const Blob w13 = pack_random(f, MatrixRole::kGateUp, 2 * kI, kH, rng);
  const Blob w2 = pack_random(f, MatrixRole::kDown, kH, kI, rng);
  for (int64_t e = 0; e < kExperts; ++e) {
    L.w13.push_back(copy_of(w13));
    L.w2.push_back(copy_of(w2));
  }
  L.x = random_row(w13.h()->kp, w13.h()->group, rng);
  L.h = random_row(w2.h()->kp, w2.h()->group, rng);
  const double pass_bytes = double(kTopK) * double(int64_t(w13.h()->np) * w13.h()->kp + int64_t(w2.h()->np) * w2.h()->kp) *
                            (f == WeightFormat::kINT8 ? 1.0 : 0.5);
  const Gemm gemms[2] = {f == WeightFormat::kINT8 ? avx2_kernels().gemm_int8 : avx2_kernels().gemm_int4,
                         f == WeightFormat::kINT8 ? avx2_vnni_evex_kernels().gemm_int8
                                                  : avx2_vnni_evex_kernels().gemm_int4};
  const char* names[2] = {"avx2", "avx2_vnni (EVEX)"};
  std::vector<float> o13[2], o2[2];
  for (int k = 0; k < 2; ++k) o13[k].resize(size_t(w13.h()->np)), o2[k].resize(size_t(w2.h()->np));
  for (const bool cold : {true, false}) {
    Layer hot;  // one expert
    if (!cold) {
      hot.w13.push_back(copy_of(w13));
      hot.w2.push_back(copy_of(w2));
      hot.x = L.x, hot.h = L.h;
    }
    const Layer& use = cold ? L : hot;
    std::vector<double> ms[2];
    for (int p = -8; p < passes; ++p)  // 8 warm-up passes
      for (int i = 0; i < 2; ++i) {
        const int k = (p + i) & 1;  // alternate which kernel goes first
        const double t = pass(gemms[k], use, cold ? (2 * int64_t(p + 8) + i) * kTopK : 0, o13[k], o2[k]);
        if (p >= 0) ms[k].push_back(t);
      }
    const bool same = o13[0] == o13[1] && o2[0] == o2[1];
    for (int k = 0; k < 2; ++k) {
      std::sort(ms[k].begin(), ms[k].end());
      const double mn = ms[k].front(), med = ms[k][ms[k].size() / 2];
      std::printf("%-5s %-4s %-17s min %7.3f ms  median %7.3f ms  %6.1f GB/s at min  (%d passes)\n", name,
                  cold ? "cold" : "hot", names[k], mn, med, pass_bytes / (mn * 1e-3) / 1e9, passes);
    }
    std::printf("%-5s %-4s outputs: %s\n", name, cold ? "cold" : "hot", same ? "bit-identical" : "DIFFER");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cpu_features().avx512) {
    std::printf("this CPU lacks AVX-512 VNNI + VL: the EVEX build of the avx2_vnni kernels cannot run here\n");
    return 2;
  }
  const int passes = argc > 1 ? std::atoi(argv[1]) : 300;
  run(WeightFormat::kINT8, "int8", passes);
  run(WeightFormat::kINT4, "int4", passes);
  return 0;
}
