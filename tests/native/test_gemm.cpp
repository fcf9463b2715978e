// The gemm micro-kernels (bf16, int8, int4) of one ISA table: every output against a tight
// double-precision reference from the decoded weights and the exact int8 activations, the
// accuracy against the dense fp32 weights, untouched guard columns, and the same bits for a
// block range called at once or one block at a time.
#include <string>
#include <utility>

#include "check.h"
#include "isa_tables.h"
#include "kernels/pack.h"
#include "packed_reference.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

struct ActQ {  // quantized activations in the layout QuantizedRows describes
  std::vector<int8_t> q;
  std::vector<float> s;  // [m, ns]
  std::vector<int32_t> gsum;
  int64_t ldq = 0, gld = 0, ns = 1;
  float sx(int64_t r, int64_t G) const { return s[size_t(r * ns + (ns == 1 ? 0 : G))]; }  // row r, group G
  QuantizedRows view(int64_t r0 = 0) const {
    return {q.data() + r0 * ldq, ldq, s.data() + r0 * ns, gsum.data() + r0 * gld, gld};
  }
};

// The format's activations: a scale per (row, weight group) for kINT8, per row for kINT4.
ActQ quantize_acts(const std::vector<float>& a, int64_t m, int64_t k, int64_t kp, int64_t group, WeightFormat f) {
  ActQ A;
  const int64_t scale_group = f == WeightFormat::kINT8 ? group : kp;
  A.ldq = kp + 32;
  A.gld = kp / group + 3;
  A.ns = kp / scale_group;
  A.q.assign(size_t(m * A.ldq), 0);
  A.s.assign(size_t(m * A.ns), 0.f);
  A.gsum.assign(size_t(m * A.gld), 0);
  for (int64_t r = 0; r < m; ++r) {
    ref_quantize_groups(a.data() + r * k, k, kp, scale_group, A.q.data() + r * A.ldq, A.s.data() + r * A.ns);
    for (int64_t G = 0; G < kp / group; ++G)
      for (int64_t c = G * group; c < (G + 1) * group; ++c) A.gsum[r * A.gld + G] += A.q[r * A.ldq + c];
  }
  return A;
}

}  // namespace

void test_gemm(const IsaKernels& isa, WeightFormat f, MatrixRole role, int64_t n, int64_t k,
               int64_t group, Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(f, role, n, k, group);
  const std::vector<float> w = random_matrix(n, k, rng, false);
  const AlignedBytes blob = pack(h, w);
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const Decoded D = decode(blob.get());
  const int64_t kp = D.kp, nb = D.np / 16;
  const float sentinel = f32_from_bits(0x7FC12345u);
  double worst = 0, dense_num = 0, dense_den = 0;
  bool guards = true, splits = true;
  for (int64_t m : {1, 3, 8, 17, 64}) {
    std::vector<float> a(static_cast<size_t>(m * k));
    for (auto& v : a) v = float(rng.gauss());
    // activations as the kernel sees them
    const int64_t lda = kp + 16;
    std::vector<uint16_t> abf(static_cast<size_t>(m * lda), 0);
    ActQ aq;
    if (f == WeightFormat::kBF16) {
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) abf[size_t(r * lda + c)] = ref_bf16(a[size_t(r * k + c)]);
    } else {
      aq = quantize_acts(a, m, k, kp, D.g, f);
    }
    // tight reference per (row, packed column)
    std::vector<double> ref(static_cast<size_t>(m * D.np)), tol(size_t(m * D.np));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t pr = 0; pr < D.np; ++pr) {
        const size_t e = size_t(r * D.np + pr);
        const int64_t base = pr * kp;
        if (f == WeightFormat::kBF16) {
          double s = 0, sa = 0;
          for (int64_t c = 0; c < kp; ++c) {
            const double t = double(bf16_value(abf[size_t(r * lda + c)])) * D.w[size_t(base + c)];
            s += t, sa += std::fabs(t);
          }
          ref[e] = s, tol[e] = (2.0 * kp + 8) * 0x1.0p-24 * sa + 1e-30;
        } else if (f == WeightFormat::kINT8) {  // Σ_G s[pr,G] · sx[r,G] · I_G (one group: s · sx · I)
          double sum = 0, sa = 0;
          for (int64_t G = 0; G < D.ng; ++G) {
            int64_t I = 0;
            for (int64_t c = G * D.g; c < (G + 1) * D.g; ++c)
              I += int64_t(D.wi[size_t(base + c)]) * aq.q[size_t(r * aq.ldq + c)];
            const double t = double(D.d[size_t(pr * D.ng + G)]) * double(aq.sx(r, G)) * double(I);
            sum += t, sa += std::fabs(t);
          }
          ref[e] = sum;
          tol[e] = 2.0 * (D.ng + 4) * 0x1.0p-24 * sa + 1e-30;
        } else {
          double s = 0, sa = 0;
          for (int64_t G = 0; G < D.ng; ++G) {
            int64_t I = 0;
            for (int64_t c = G * D.g; c < (G + 1) * D.g; ++c)
              I += int64_t(kInt4Levels[D.wi[size_t(base + c)]]) * aq.q[size_t(r * aq.ldq + c)];
            const double t = double(D.d[pr * D.ng + G]) * I;
            s += t, sa += std::fabs(t);
          }
          ref[e] = aq.sx(r, 0) * s;
          tol[e] = 2.0 * (D.ng + 4) * 0x1.0p-24 * aq.sx(r, 0) * sa + 1e-30;
        }
      }
    auto run = [&](int64_t b0, int64_t b1, float* c, int64_t ldc) {
      if (f == WeightFormat::kBF16) isa.gemm_bf16(hw, abf.data(), lda, m, b0, b1, c, ldc);
      else if (f == WeightFormat::kINT8) isa.gemm_int8(hw, aq.view(), m, b0, b1, c, ldc);
      else isa.gemm_int4(hw, aq.view(), m, b0, b1, c, ldc);
    };
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, nb}, {nb - 1, nb}};
    if (nb > 2) ranges.push_back({1, nb - 1});
    std::vector<float> full;
    for (auto [b0, b1] : ranges) {
      const int64_t cols = 16 * (b1 - b0), ldc = cols + 5;
      std::vector<float> c(static_cast<size_t>(m * ldc), sentinel);
      run(b0, b1, c.data(), ldc);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          const size_t e = size_t(r * D.np + 16 * b0 + j);
          const double err = std::fabs(double(c[size_t(r * ldc + j)]) - ref[e]);
          worst = std::max(worst, std::isfinite(err) ? err / tol[e] : 1e30);
        }
        for (int64_t j = cols; j < ldc; ++j) guards = guards && f32_bits(c[size_t(r * ldc + j)]) == f32_bits(sentinel);
      }
      if (b0 == 0 && b1 == nb) {
        full.assign(size_t(m * cols), 0.f);
        for (int64_t r = 0; r < m; ++r) std::memcpy(&full[size_t(r * cols)], &c[size_t(r * ldc)], size_t(cols) * 4);
        if (m == 64)  // accuracy vs the dense fp32 weights and fp32 activations
          for (int64_t r = 0; r < m; ++r)
            for (int64_t lr = 0; lr < n; ++lr) {
              double s = 0;
              for (int64_t q = 0; q < k; ++q) s += double(a[size_t(r * k + q)]) * w[size_t(lr * k + q)];
              dense_num += std::fabs(full[size_t(r * D.np + D.packed_of[lr])] - s);
              dense_den += std::fabs(s);
            }
      }
    }
    if (m == 17 || m == 1) {  // one call per block gives the same bits as one call for all
      for (int64_t b = 0; b < nb; ++b) {
        std::vector<float> c(static_cast<size_t>(m * 16));
        run(b, b + 1, c.data(), 16);
        for (int64_t r = 0; r < m; ++r)
          splits = splits && std::memcmp(&c[size_t(r * 16)], &full[size_t(r * 16 * nb + 16 * b)], 64) == 0;
      }
    }
  }
  const double dense_rel = dense_num / dense_den;
  const double bound = format_bound(f);
  CHECK(worst <= 1.0 && guards && splits && dense_rel <= bound,
        strf("gemm_%s [%s] %s n=%lld k=%lld g=%lld M={1,3,8,17,64}: max err/tol %.3f, "
             "rel err vs dense %.4f (<= %.2f), guards %s, block splits %s",
             fmt_name(f), isa.name, role_name(role), (long long)n, (long long)k, (long long)D.g, worst,
             dense_rel, bound, guards ? "intact" : "OVERWRITTEN", splits ? "bit-identical" : "DIFFER"));
}

// int8 (per channel and per group, the activations' scales per the same groups): every ISA gives
// the bits of generic's gemm_int8 for the same packed weights and activations (exact int32 sums,
// the same fp32 epilogue), any row count.
void test_int8_isas_agree(const std::vector<Isa>& isas, MatrixRole role, int64_t n, int64_t k, int64_t group,
                          Rng& rng) {
  const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT8, role, n, k, group);
  const AlignedBytes blob = pack(h, random_matrix(n, k, rng, true));
  const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
  const int64_t nb = h.np / 16, cols = h.np;
  for (int64_t m : {1, 2, 5, 13, 70}) {
    std::vector<float> a(size_t(m * k));
    for (auto& v : a) v = float(rng.gauss());
    const ActQ aq = quantize_acts(a, m, k, h.kp, h.group, WeightFormat::kINT8);
    std::vector<float> want(size_t(m * cols));
    isas[0].k->gemm_int8(hw, aq.view(), m, 0, nb, want.data(), cols);
    for (size_t i = 1; i < isas.size(); ++i) {
      if (!isas[i].usable) continue;
      std::vector<float> got(size_t(m * cols), -1.f);
      isas[i].k->gemm_int8(hw, aq.view(), m, 0, nb, got.data(), cols);
      CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0,
            strf("gemm_int8 [%s] %s n=%lld k=%lld g=%d M=%lld: the bits of generic's", isas[i].k->name,
                 role_name(role), (long long)n, (long long)k, h.group, (long long)m));
    }
  }
}

}  // namespace ktmoe_test
