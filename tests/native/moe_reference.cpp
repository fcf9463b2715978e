// The MoE driver's references (see moe_reference.h).
#include "moe_reference.h"

#include <functional>
#include <thread>

#include "kernels/pack.h"

namespace ktmoe_test {

using namespace ktmoe;

ParallelFor serial_pf() {
  return [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& f) {
    if (n > 0) f(0, n);
  };
}
ParallelFor two_thread_pf() {  // uneven split, second part on another thread
  return [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& f) {
    if (n <= 0) return;
    const int64_t mid = n / 3;
    std::thread t([&] { if (mid < n) f(mid, n); });
    if (mid > 0) f(0, mid);
    t.join();
  };
}
ParallelFor grain1_reverse_pf() {
  return [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& f) {
    for (int64_t i = n - 1; i >= 0; --i) f(i, i + 1);
  };
}

MoeWeights make_weights(int64_t E, int64_t H, int64_t I, WeightFormat f13, int64_t g13, WeightFormat f2,
                        int64_t g2, Rng& rng) {
  MoeWeights M{E, H, I, f13, f2, {}, {}, nullptr, nullptr, 0, 0, {}, {}};
  const PackedMatrixHeader h13 = packed_matrix_header(f13, MatrixRole::kGateUp, 2 * I, H, g13);
  const PackedMatrixHeader h2 = packed_matrix_header(f2, MatrixRole::kDown, H, I, g2);
  M.s13 = h13.total_bytes, M.s2 = h2.total_bytes;
  M.p13 = std::make_unique<AlignedBytes>(size_t(E * M.s13));
  M.p2 = std::make_unique<AlignedBytes>(size_t(E * M.s2));
  for (int64_t e = 0; e < E; ++e) {
    std::vector<float> a = random_matrix(2 * I, H, rng, false), b = random_matrix(H, I, rng, false);
    M.w13.insert(M.w13.end(), a.begin(), a.end());
    M.w2.insert(M.w2.end(), b.begin(), b.end());
    const AlignedBytes pa = pack(h13, a), pb = pack(h2, b);
    std::memcpy(M.p13->get() + e * M.s13, pa.get(), pa.n);
    std::memcpy(M.p2->get() + e * M.s2, pb.get(), pb.n);
    M.d13.push_back(decode(M.p13->get() + e * M.s13));
    M.d2.push_back(decode(M.p2->get() + e * M.s2));
  }
  return M;
}

std::vector<double> reference(const MoeWeights& M, const MoeInput& in, bool emulate,
                              std::vector<double>* slack) {
  const int64_t H = M.H, I = M.I;
  std::vector<double> out(static_cast<size_t>(in.T * H), 0.0);
  if (slack) slack->assign(out.size(), 0.0);
  std::vector<double> step(static_cast<size_t>(I));  // ambiguous h: its rounding step, else 0
  std::vector<double> gu(static_cast<size_t>(2 * I)), y(static_cast<size_t>(H));
  std::vector<float> hf(static_cast<size_t>(I));
  std::vector<int8_t> q(static_cast<size_t>(round_up(std::max(H, I), 256)));
  std::vector<float> qs(q.size() / 32);  // the scales of q: per row, or per group (of 32 or more)
  std::vector<double> xa(static_cast<size_t>(H)), ha(static_cast<size_t>(I));
  for (int64_t t = 0; t < in.T; ++t) {
    const float* x = in.x.data() + t * H;
    for (int64_t j = 0; j < in.K; ++j) {
      const int64_t e = in.ids[size_t(t * in.K + j)];
      if (e < 0) continue;
      // activations of gate/up
      if (!emulate || M.f13 == WeightFormat::kBF16) {
        for (int64_t c = 0; c < H; ++c) xa[c] = emulate ? ref_bf16_value(x[c]) : x[c];
      } else {  // int8 rows: a scale per (row, group) for kINT8, per row for kINT4
        const Decoded& D = M.d13[e];
        const int64_t sg = M.f13 == WeightFormat::kINT8 ? D.g : D.kp;
        ref_quantize_groups(x, H, D.kp, sg, q.data(), qs.data());
        for (int64_t c = 0; c < H; ++c) xa[c] = double(qs[c / sg]) * q[c];
      }
      for (int64_t r = 0; r < 2 * I; ++r) {
        double s = 0;
        if (emulate) {
          const Decoded& D = M.d13[e];
          const double* wr = D.w.data() + D.packed_of[r] * D.kp;
          for (int64_t c = 0; c < H; ++c) s += xa[c] * wr[c];
        } else {
          const float* wr = M.w13.data() + (e * 2 * I + r) * H;
          for (int64_t c = 0; c < H; ++c) s += xa[c] * wr[c];
        }
        gu[r] = s;
      }
      for (int64_t i = 0; i < I; ++i) hf[i] = float(ref_silu(gu[i]) * gu[I + i]);
      std::fill(step.begin(), step.end(), 0.0);
      if (!emulate) {
        for (int64_t i = 0; i < I; ++i) ha[i] = ref_silu(gu[i]) * gu[I + i];
      } else if (M.f2 == WeightFormat::kBF16) {
        for (int64_t i = 0; i < I; ++i) {
          ha[i] = ref_bf16_value(hf[i]);
          const float a = ref_bf16_value(float(hf[i] * (1 - kHMargin)));
          const float b = ref_bf16_value(float(hf[i] * (1 + kHMargin)));
          step[i] = std::fabs(double(a) - double(b));
        }
      } else {
        const Decoded& D = M.d2[e];
        const int64_t sg = M.f2 == WeightFormat::kINT8 ? D.g : D.kp;
        ref_quantize_groups(hf.data(), I, D.kp, sg, q.data(), qs.data());
        for (int64_t i = 0; i < I; ++i) {
          const float s = qs[i / sg];
          ha[i] = double(s) * q[i];
          const double lo = std::round(hf[i] * (1 - kHMargin) / s), hi = std::round(hf[i] * (1 + kHMargin) / s);
          step[i] = lo != hi ? double(s) : 0.0;
        }
      }
      for (int64_t r = 0; r < H; ++r) {
        double s = 0;
        if (emulate) {
          const Decoded& D = M.d2[e];
          const double* wr = D.w.data() + D.packed_of[r] * D.kp;
          for (int64_t c = 0; c < I; ++c) s += ha[c] * wr[c];
        } else {
          const float* wr = M.w2.data() + (e * H + r) * I;
          for (int64_t c = 0; c < I; ++c) s += ha[c] * wr[c];
        }
        y[r] = s;
      }
      const double wt = in.wts[size_t(t * in.K + j)];
      for (int64_t r = 0; r < H; ++r) out[size_t(t * H + r)] += wt * y[r];
      if (emulate && slack)
        for (int64_t i = 0; i < I; ++i) {
          if (step[i] == 0) continue;
          const Decoded& D = M.d2[e];
          for (int64_t r = 0; r < H; ++r)
            (*slack)[size_t(t * H + r)] += std::fabs(wt) * step[i] * std::fabs(D.w[size_t(D.packed_of[r] * D.kp + i)]);
        }
    }
  }
  return out;
}

MoeInput random_input(int64_t T, int64_t K, const MoeWeights& M, bool bf16, double mask_frac, Rng& rng) {
  MoeInput in{T, K, bf16, {}, {}, {}, {}};
  in.x.resize(size_t(T * M.H));
  for (auto& v : in.x) v = float(rng.gauss());
  if (bf16) {
    in.xb.resize(in.x.size());
    for (size_t i = 0; i < in.x.size(); ++i) {
      in.xb[i] = ref_bf16(in.x[i]);
      in.x[i] = bf16_value(in.xb[i]);
    }
  }
  in.ids.resize(size_t(T * K));
  in.wts.resize(size_t(T * K));
  std::vector<int64_t> perm(static_cast<size_t>(M.E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < M.E; ++e) perm[e] = e;
    for (int64_t j = 0; j < K; ++j) {
      std::swap(perm[j], perm[j + rng.below(M.E - j)]);
      in.ids[size_t(t * K + j)] = rng.uniform() < mask_frac ? -1 : perm[j];
      in.wts[size_t(t * K + j)] = float(0.1 + rng.uniform());
    }
  }
  if (T >= 3)
    for (int64_t j = 0; j < K; ++j) in.ids[size_t(1 * K + j)] = -1;  // token 1 fully masked
  return in;
}

std::vector<float> run_driver(const MoeWeights& M, const MoeInput& in, const IsaKernels& isa,
                              const ParallelFor& pf, std::vector<uint16_t>* raw_bf16) {
  MoeProblem p{};
  p.tokens = in.T, p.hidden = M.H, p.top_k = in.K, p.num_experts = M.E;
  p.x = in.bf16 ? static_cast<const void*>(in.xb.data()) : static_cast<const void*>(in.x.data());
  p.x_dtype = in.bf16 ? ActDtype::kBF16 : ActDtype::kF32;
  p.ids = in.ids.data(), p.weights = in.wts.data();
  p.w13 = M.p13->get(), p.w13_stride = M.s13, p.w2 = M.p2->get(), p.w2_stride = M.s2;
  std::vector<float> out(static_cast<size_t>(in.T * M.H) + 1, 0.f);
  std::vector<uint16_t> ob(static_cast<size_t>(in.T * M.H) + 1, 0);
  if (in.bf16) {
    ob.back() = 0x5A5A;
    p.out = ob.data();
  } else {
    out.back() = 7.f;
    p.out = out.data();
  }
  moe_forward(p, isa, pf);
  if (in.bf16) {
    if (ob.back() != 0x5A5A) out.back() = -1.f;  // wrote past the end
    for (size_t i = 0; i + 1 < ob.size(); ++i) out[i] = bf16_value(ob[i]);
    if (raw_bf16) *raw_bf16 = ob;
  }
  if (!in.bf16 && out.back() != 7.f) out.back() = -1.f;
  return out;
}

double rel_l1(const std::vector<float>& got, const std::vector<double>& ref, int64_t begin, int64_t end,
              const std::vector<double>* slack) {
  double num = 0, den = 0;
  for (int64_t i = begin; i < end; ++i) {
    const double err = std::fabs(got[size_t(i)] - ref[size_t(i)]) - (slack ? (*slack)[size_t(i)] : 0.0);
    num += err > 0 || std::isnan(err) ? err : 0.0;
    den += std::fabs(ref[size_t(i)]);
  }
  if (!std::isfinite(num)) return std::numeric_limits<double>::infinity();  // NaN / inf output
  return den > 0 ? num / den : num;
}

}  // namespace ktmoe_test
