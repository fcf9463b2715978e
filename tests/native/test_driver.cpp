// The MoE driver (moe_forward): every format combination, fp32 and bf16 activations, T = 0 to
// 600, against the emulated pipeline (tight) and the dense fp32 MoE (the accuracy metric);
// masked tokens, ids out of range, the same bits for any thread partition; fp16 activations;
// and the accuracy metric alone (also `test_kernels --accuracy E H I K T`).
#include <cstring>
#include <stdexcept>
#include <string>

#include "check.h"
#include "moe_reference.h"
#include "tests.h"

namespace ktmoe_test {

using namespace ktmoe;

namespace {

struct Combo {
  WeightFormat f13;
  int64_t g13;
  WeightFormat f2;
  int64_t g2;
};

std::string combo_name(const Combo& c) {
  std::string s = fmt_name(c.f13);
  if (c.g13) s += strf("(g%lld)", (long long)c.g13);
  if (c.f2 != c.f13 || c.g2 != c.g13) {
    s += std::string("/") + fmt_name(c.f2);
    if (c.g2) s += strf("(g%lld)", (long long)c.g2);
  }
  return s;
}

}  // namespace

void test_driver(const std::vector<Isa>& isas, Rng& rng) {
  const int64_t E = 5, H = 200, I = 70, K = 3;
  const Combo combos[] = {{WeightFormat::kBF16, 0, WeightFormat::kBF16, 0},
                          {WeightFormat::kINT8, 0, WeightFormat::kINT8, 0},
                          {WeightFormat::kINT4, 32, WeightFormat::kINT4, 32},
                          {WeightFormat::kINT4, 64, WeightFormat::kINT8, 0},
                          {WeightFormat::kINT8, 32, WeightFormat::kINT8, 64},
                          {WeightFormat::kINT8, 64, WeightFormat::kINT4, 32}};
  for (const Combo& cb : combos) {
    const MoeWeights M = make_weights(E, H, I, cb.f13, cb.g13, cb.f2, cb.g2, rng);
    for (bool bf16 : {false, true}) {
      for (int64_t T : {0, 1, 7, 600}) {
        const MoeInput in = random_input(T, K, M, bf16, T == 1 ? 0.0 : 0.15, rng);
        std::vector<double> slack;
        const std::vector<double> emu = reference(M, in, true, &slack), dense = reference(M, in, false);
        const std::string what = strf("moe_forward %s x=%s E=%lld H=%lld I=%lld k=%lld T=%lld", combo_name(cb).c_str(),
                                      bf16 ? "bf16" : "fp32", (long long)E, (long long)H, (long long)I,
                                      (long long)K, (long long)T);
        for (const Isa& isa : isas) {
          const std::vector<float> out = run_driver(M, in, *isa.k, serial_pf());
          // per token: relative L1 vs the emulated pipeline; masked tokens exactly 0
          double worst_row = 0;
          bool masked_zero = true;
          for (int64_t t = 0; t < T; ++t) {
            bool all_masked = true;
            for (int64_t j = 0; j < K; ++j) all_masked = all_masked && in.ids[size_t(t * K + j)] < 0;
            if (all_masked) {
              for (int64_t c = 0; c < H; ++c) masked_zero = masked_zero && f32_bits(out[size_t(t * H + c)]) == 0;
            } else {
              worst_row = std::max(worst_row, rel_l1(out, emu, t * H, (t + 1) * H, &slack));
            }
          }
          const double row_tol = bf16 ? 4e-3 : 1e-4;
          const double metric = T ? rel_l1(out, dense, 0, T * H) : 0.0;
          const double bound = format_bound(cb.f13, cb.f2);  // a sanity bound: few pairs at small T are noisy
          const bool tail_ok = out.back() >= 0.f;
          CHECK(worst_row <= row_tol && masked_zero && tail_ok && metric <= bound * (T < 7 ? 2.0 : T < 600 ? 1.25 : 1.0),
                what + strf(" [%s]: worst token rel err vs emulated (beyond h rounding slack) %.2g (<= %.0e), vs dense fp32 %.4f, "
                            "masked tokens %s%s",
                            isa.k->name, worst_row, row_tol, metric, masked_zero ? "zero" : "NOT ZERO",
                            tail_ok ? "" : ", WROTE PAST THE END"));
          if (T == 7 || (T == 600 && !bf16)) {
            const std::vector<float> o2 = run_driver(M, in, *isa.k, two_thread_pf());
            const std::vector<float> o3 = run_driver(M, in, *isa.k, grain1_reverse_pf());
            const bool same = std::memcmp(out.data(), o2.data(), out.size() * 4) == 0 &&
                              std::memcmp(out.data(), o3.data(), out.size() * 4) == 0;
            CHECK(same, what + strf(" [%s]: bit-identical for serial / 2 threads / grain-1 reversed partitions",
                                    isa.k->name));
          }
        }
      }
    }
    // an id >= E is an error, not a read out of bounds
    if (cb.f13 == WeightFormat::kBF16) {
      MoeInput in = random_input(4, K, M, false, 0.0, rng);
      in.ids[5] = E;
      bool threw = false;
      try {
        run_driver(M, in, *isas[0].k, serial_pf());
      } catch (const std::out_of_range&) {
        threw = true;
      }
      CHECK(threw, "moe_forward: id >= num_experts throws std::out_of_range");
    }
  }
}

// The accuracy metric of each format: mean|out - ref| / mean|ref| against the
// dense fp32 MoE on Gaussian experts (weights ~ N(0, 1/fan_in)).
void test_accuracy(const std::vector<Isa>& isas, Rng& rng, int64_t E, int64_t H, int64_t I, int64_t K,
                   int64_t T) {
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4}) {
    const MoeWeights M = make_weights(E, H, I, f, 0, f, 0, rng);
    const MoeInput in = random_input(T, K, M, false, 0.0, rng);
    const std::vector<double> dense = reference(M, in, false);
    for (const Isa& isa : isas) {
      const std::vector<float> out = run_driver(M, in, *isa.k, serial_pf());
      const double metric = rel_l1(out, dense, 0, T * H);
      const double bound = format_bound(f);
      CHECK(metric <= bound, strf("accuracy %s [%s] E=%lld H=%lld I=%lld k=%lld T=%lld: mean|out-ref|/mean|ref| = %.4f (<= %.2f)",
                                  fmt_name(f), isa.k->name, (long long)E, (long long)H, (long long)I,
                                  (long long)K, (long long)T, metric, bound));
    }
  }
}

// fp16 activations: the driver on fp16 x must give exactly fp16(the fp32 driver's output on the same
// values), since fp16 -> fp32 is exact and the combine rounds its fp32 sum once.
void test_driver_f16(const std::vector<Isa>& isas, Rng& rng) {
  const int64_t E = 5, H = 200, I = 70, K = 3;
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kINT8, WeightFormat::kINT4}) {
    const MoeWeights M = make_weights(E, H, I, f, 0, f, 0, rng);
    for (int64_t T : {1, 7, 40}) {
      MoeInput in = random_input(T, K, M, false, 0.15, rng);
      std::vector<uint16_t> xh(in.x.size());
      for (size_t i = 0; i < in.x.size(); ++i) {
        xh[i] = ref_f16(in.x[i]);
        in.x[i] = float(ref_f16_value(xh[i]));
      }
      for (const Isa& isa : isas) {
        const std::vector<float> ref = run_driver(M, in, *isa.k, serial_pf());
        MoeProblem p{};
        p.tokens = T, p.hidden = H, p.top_k = K, p.num_experts = E;
        p.x = xh.data(), p.x_dtype = ActDtype::kF16;
        p.ids = in.ids.data(), p.weights = in.wts.data();
        p.w13 = M.p13->get(), p.w13_stride = M.s13, p.w2 = M.p2->get(), p.w2_stride = M.s2;
        std::vector<uint16_t> out(size_t(T * H) + 1, 0x5A5A);
        p.out = out.data();
        moe_forward(p, *isa.k, two_thread_pf());
        int64_t bad = out.back() != 0x5A5A;
        for (int64_t i = 0; i < T * H; ++i) bad += out[size_t(i)] != ref_f16(ref[size_t(i)]);
        CHECK(bad == 0, strf("moe_forward x=fp16 %s T=%lld [%s]: out == fp16(fp32 driver on the same values) "
                             "(mismatches %lld)", fmt_name(f), (long long)T, isa.k->name, (long long)bad));
      }
    }
  }
}

}  // namespace ktmoe_test
