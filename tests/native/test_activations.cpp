// gated_act, every row (against double, edge values, NaN) and quantize_rows (exact: q, scale, group sums, ties,
// zero and non-finite rows, nothing written past the ends).
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "check.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

// A row of gated_activation.h in double precision, written from its formula (NaN: the caller skips).
double ref_gated(const Activation& a, double g, double u) {
  const double p0 = a.p[0], p1 = a.p[1];
  const auto clamp = [](double x, double lim) { return std::min(std::max(x, -lim), lim); };
  switch (a.kind) {
    case GateActivation::kSilu: return ref_silu(g) * u;
    case GateActivation::kSiluClamp: return ref_silu(std::min(g, p0)) * clamp(u, p0);
    case GateActivation::kSiluClampAfter: return std::min(ref_silu(g), p0) * clamp(u, p0);
    case GateActivation::kSwigluOai: {
      const double gc = std::min(g, p1);
      return gc / (1 + std::exp(-p0 * gc)) * (clamp(u, p1) + 1);
    }
    case GateActivation::kSwigluSoftcap:
      return p0 * std::tanh(g / p0) / (1 + std::exp(-g)) * p1 * std::tanh(u / p1);
  }
  return 0;
}

// Every row of the gated activation table against ref_gated, including values at and around the
// clamps and caps, +-0, +-88, +-100, +-1e30 and NaN (must stay NaN); nothing written past n. The
// tolerance is relative to the size of the factors (an fp32 (u + 1) or a tanh rounds there).
void test_gated_activations(const IsaKernels& isa, Rng& rng) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> g = {0.f, -0.f, 1e-3f, -1e-3f, 1.f, -1.f, 6.99f, 7.f, 7.01f, -7.01f, 10.f, -10.f, 20.f, -20.f,
                          50.f, -50.f, 88.f, -88.f, 100.f, -100.f, 1e30f, -1e30f, nan, 1.f, 0.3f, -0.3f};
  std::vector<float> u = {0.f, 7.01f, -7.01f, 1e30f, -1e30f, -1.f, 6.99f, -6.99f, 3.f, -3.f, 0.5f, nan, 1.f, nan,
                          1e-3f, -0.2f};
  while (g.size() < 1037) g.push_back(float(rng.gauss() * 6));
  while (u.size() < g.size()) u.push_back(float(rng.gauss() * 6));
  int count = 0;
  const GatedActivationRow* rows = gated_activation_rows(&count);
  for (int r = 0; r < count; ++r) {
    Activation act;
    const double softcaps[2] = {3.0, 5.0};
    const bool softcap = rows[r].kind == GateActivation::kSwigluSoftcap;
    CHECK(make_activation(rows[r], softcap ? softcaps : nullptr, softcap ? 2 : 0, &act).empty(), "activation row");
    double worst = 0;
    bool nan_kept = true;
    for (int64_t n : {int64_t(1), int64_t(16), int64_t(37), int64_t(g.size())}) {
      std::vector<float> h(static_cast<size_t>(n) + 1, -7.f);
      isa.gated_act(act, g.data(), u.data(), h.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(g[i]) || std::isnan(u[i])) {
          nan_kept &= std::isnan(h[i]);
          continue;
        }
        const double ref = ref_gated(act, g[i], u[i]);
        if (std::fabs(ref) > std::numeric_limits<float>::max()) {  // overflows fp32: an infinity of its sign
          if (!(std::isinf(h[i]) && std::signbit(h[i]) == std::signbit(ref))) worst = 1e30;
          continue;
        }
        // the factors' sizes (|act(g)| times |u|-side): a rounding in either factor is within tolerance
        const double scale = std::fabs(ref_gated(act, g[i], 1.0)) * (std::fabs(double(u[i])) + 1.0);
        const double tol = 1e-5 * (std::fabs(ref) + scale) + 1e-30;
        const double err = std::fabs(h[i] - ref);
        worst = std::max(worst, std::isfinite(err) ? err / tol : 1e30);
      }
      if (h[n] != -7.f) worst = 1e30;
    }
    CHECK(worst <= 1.0 && nan_kept,
          strf("gated_act %s [%s] n={1,16,37,1037} incl. the clamps, +-0, +-88, +-1e30: max err/tol %.3f (rel tol "
               "1e-5), NaN %s", rows[r].name, isa.name, worst, nan_kept ? "kept" : "LOST"));
  }
}

void test_quantize(const IsaKernels& isa, Rng& rng) {
  int64_t bad = 0, cases = 0;
  for (int64_t k : {1, 31, 200}) {
    const int64_t kp = round_up(k, 32);
    // (sum group, scale group): a scale per row (kINT4; kINT8 per channel) or per sum group (kINT8)
    const std::pair<int64_t, int64_t> groups[] = {{32, kp}, {kp, kp}, {32, 32}};
    for (auto [group, scale_group] : groups) {
      for (int64_t m : {1, 3, 17}) {
        const int64_t ldx = k + 3, ldq = kp + 16, ng = kp / group, gld = ng + 2, ns = kp / scale_group;
        std::vector<float> x(static_cast<size_t>(m * ldx), 1e9f);  // junk past k must be ignored
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < k; ++c) x[size_t(r * ldx + c)] = float(rng.gauss() * (r + 1));
        if (m > 1)  // an all-zero row: scale 1, q 0
          for (int64_t c = 0; c < k; ++c) x[size_t(1 * ldx + c)] = 0.f;
        if (m > 4) {  // non-finite rows: a NaN in the last (tail) column, an Inf in the first
          x[size_t(3 * ldx + k - 1)] = std::numeric_limits<float>::quiet_NaN();
          x[size_t(4 * ldx)] = -std::numeric_limits<float>::infinity();
        }
        if (m > 2 && k >= 31) {  // ties: scale exactly 1, x = +-n.5 round away from zero
          const float ties[] = {127.f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -1.5f, 126.5f, -126.5f, 0.49999997f};
          for (int i = 0; i < 10; ++i) x[size_t(2 * ldx + i)] = ties[i];
          for (int64_t c = 10; c < k; ++c) x[size_t(2 * ldx + c)] = float(c % 7) - 3.f;
        }
        std::vector<int8_t> q(static_cast<size_t>(m * ldq), int8_t(99));
        std::vector<float> s(static_cast<size_t>(m * ns) + 1, -1.f);
        std::vector<int32_t> gs(static_cast<size_t>(m * gld), 12345);
        isa.quantize_rows(x.data(), ldx, m, k, kp, group, scale_group, q.data(), ldq, s.data(), gs.data(), gld);
        for (int64_t r = 0; r < m; ++r) {
          std::vector<int8_t> rq(static_cast<size_t>(kp));
          std::vector<float> rs(static_cast<size_t>(ns));
          ref_quantize_groups(x.data() + r * ldx, k, kp, scale_group, rq.data(), rs.data());
          for (int64_t S = 0; S < ns; ++S) bad += f32_bits(s[size_t(r * ns + S)]) != f32_bits(rs[S]);
          for (int64_t c = 0; c < kp; ++c) bad += q[size_t(r * ldq + c)] != rq[c];
          for (int64_t c = kp; c < ldq; ++c) bad += q[size_t(r * ldq + c)] != 99;
          for (int64_t G = 0; G < ng; ++G) {
            int32_t sum = 0;
            for (int64_t c = G * group; c < (G + 1) * group; ++c) sum += rq[c];
            bad += gs[size_t(r * gld + G)] != sum;
          }
          for (int64_t G = ng; G < gld; ++G) bad += gs[size_t(r * gld + G)] != 12345;
        }
        bad += s[size_t(m * ns)] != -1.f;
        ++cases;
      }
    }
  }
  CHECK(bad == 0, strf("quantize_rows [%s] %lld shapes (k={1,31,200}, group={32,kp}, scales per row or per group, "
                       "M={1,3,17}, zero row, .5 ties, NaN/Inf groups): q, scales, group sums exact (mismatches %lld)",
                       isa.name, (long long)cases, (long long)bad));
}

}  // namespace ktmoe_test
