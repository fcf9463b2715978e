// The avx2 gemm_int4 against the int16 range and the generic kernel's bits: codes at the
// ends of the u table (u = 120 and u = 0, q = 15 and q = 0) against activations of ±127, so
// every vpmaddubsw pair sum reaches ±30480; and random codes and activations. Every tile
// size (M = 1..9 rows) and groups 32, 64, 128. Checked: the exact integer sums (a double
// reference from the bytes decoded by packed_format.h's formulas, tolerance for the fp32
// epilogue only) and the same fp32 bits as generic's gemm_int4 (its [NOTE]: mul then add).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "check.h"
#include "kernels/pack.h"
#include "packed_reference.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

const IsaKernels* find_table(const std::vector<Isa>& isas, const char* name) {
  for (const Isa& isa : isas)
    if (isa.usable && std::strcmp(isa.k->name, name) == 0) return isa.k;
  return nullptr;
}

// xq [m][kp] (row stride kp) with its per-group sums; scale sx[r].
struct Rows {
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<int32_t> gsum;
  QuantizedRows view(int64_t kp, int64_t ng) const { return {q.data(), kp, s.data(), gsum.data(), ng}; }
};

Rows make_rows(int64_t m, int64_t kp, int64_t g, bool extreme, Rng& rng) {
  Rows a;
  a.q.resize(size_t(m * kp));
  a.s.resize(size_t(m));
  a.gsum.assign(size_t(m * (kp / g)), 0);
  for (int64_t r = 0; r < m; ++r) {
    a.s[r] = float(0.01 * (1 + r));
    for (int64_t c = 0; c < kp; ++c) {
      // extreme: row 0 all +127, row 1 all -127, then random signs of 127
      const int v = extreme ? (r == 0 ? 127 : r == 1 ? -127 : (rng.next() & 1 ? 127 : -127))
                            : int(rng.next() % 255) - 127;
      a.q[size_t(r * kp + c)] = int8_t(v);
      a.gsum[size_t(r * (kp / g) + c / g)] += v;
    }
  }
  return a;
}

}  // namespace

void test_int4_avx2(const std::vector<Isa>& isas, Rng& rng) {
  const IsaKernels* avx2 = find_table(isas, "avx2");
  const IsaKernels* gen = find_table(isas, "generic");
  if (!avx2 || !gen) {
    SKIP("gemm_int4 [avx2] range and generic bits: no usable avx2 table");
    return;
  }
  for (int64_t g : {32, 64, 128})
    for (bool extreme : {true, false}) {
      const int64_t n = 48, k = 256;  // 3 blocks
      const PackedMatrixHeader h = packed_matrix_header(WeightFormat::kINT4, MatrixRole::kPlain, n, k, g);
      AlignedBytes blob = pack(h, random_matrix(n, k, rng, false));
      const auto* hw = reinterpret_cast<const PackedMatrixHeader*>(blob.get());
      uint8_t* data = blob.get() + hw->data_offset;
      const int64_t data_bytes = int64_t(hw->np) * hw->kp / 2;
      for (int64_t i = 0; i < data_bytes; ++i)  // extreme: every nibble 15 or 0 (u = 120 / 0)
        data[i] = extreme ? uint8_t((rng.next() & 1 ? 0xF0 : 0x00) | (rng.next() % 5 ? 0x0F : 0x00))
                          : uint8_t(rng.next());
      const Decoded D = decode(blob.get());
      const int64_t kp = D.kp, nb = D.np / 16;
      double worst = 0;
      bool same_bits = true;
      for (int64_t m = 1; m <= 9; ++m) {
        const Rows a = make_rows(m, kp, g, extreme, rng);
        std::vector<float> c(size_t(m * D.np)), cg(size_t(m * D.np));
        avx2->gemm_int4(hw, a.view(kp, kp / g), m, 0, nb, c.data(), D.np);
        gen->gemm_int4(hw, a.view(kp, kp / g), m, 0, nb, cg.data(), D.np);
        same_bits = same_bits && std::memcmp(c.data(), cg.data(), c.size() * 4) == 0;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t pr = 0; pr < D.np; ++pr) {
            double s = 0, sa = 0;
            for (int64_t G = 0; G < D.ng; ++G) {
              int64_t I = 0;
              for (int64_t col = G * g; col < (G + 1) * g; ++col)
                I += int64_t(kInt4Levels[D.wi[size_t(pr * kp + col)]]) * a.q[size_t(r * kp + col)];
              const double t = double(D.d[size_t(pr * D.ng + G)]) * double(I);
              s += t, sa += std::fabs(t);
            }
            const double ref = a.s[r] * s, tol = 2.0 * (D.ng + 4) * 0x1.0p-24 * a.s[r] * sa + 1e-30;
            const double err = std::fabs(double(c[size_t(r * D.np + pr)]) - ref);
            worst = std::max(worst, std::isfinite(err) ? err / tol : 1e30);
          }
      }
      CHECK(worst <= 1.0 && same_bits,
            strf("gemm_int4 [avx2] %s codes g=%lld M=1..9: max err/tol %.3f (exact int sums), bits %s generic's",
                 extreme ? "u in {0, 120} x xq = +-127" : "random", (long long)g, worst,
                 same_bits ? "equal" : "DIFFER from"));
    }
}

}  // namespace ktmoe_test
