// [NOTE] The MoE driver's references: random packed experts and routed inputs, the dense fp32
// MoE and a double-precision emulation of the driver's pipeline (its exact quantization steps,
// with the slack an ambiguous rounding of h allows), the driver run on them, and the
// thread partitions whose bits must not differ.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/moe_driver.h"
#include "packed_reference.h"

namespace ktmoe_test {

using namespace ktmoe;

// ParallelFor partitions: one call; an uneven split with a second thread; grain 1, reversed.
ParallelFor serial_pf();
ParallelFor two_thread_pf();
ParallelFor grain1_reverse_pf();

struct MoeWeights {
  int64_t E, H, I;
  WeightFormat f13, f2;
  std::vector<float> w13, w2;       // dense [E][2I][H], [E][H][I]
  std::unique_ptr<AlignedBytes> p13, p2;
  int64_t s13 = 0, s2 = 0;
  std::vector<Decoded> d13, d2;
};

MoeWeights make_weights(int64_t E, int64_t H, int64_t I, WeightFormat f13, int64_t g13, WeightFormat f2,
                        int64_t g2, Rng& rng);

struct MoeInput {
  int64_t T, K;
  bool bf16;
  std::vector<float> x;       // values (bf16-representable when bf16)
  std::vector<uint16_t> xb;   // bf16 bits when bf16
  std::vector<int64_t> ids;
  std::vector<float> wts;
};

// out[t] (double) of the dense fp32 MoE (`emulate` false) or of the packed
// pipeline emulated in double with exactly the driver's quantization steps.
// The driver computes h = silu(gate)*up in fp32, so an h within fp32 noise of a
// rounding boundary of its bf16 / int8 step may round the other way there: for
// every such ambiguous h (relative margin kHMargin) `slack` gets the effect of
// one step on each output, |w| * step * |W2[r][i]|.
constexpr double kHMargin = 2e-5;
std::vector<double> reference(const MoeWeights& M, const MoeInput& in, bool emulate,
                              std::vector<double>* slack = nullptr);

// T tokens, top-K distinct experts each (a fraction mask_frac of ids -1, token 1 fully masked when T >= 3).
MoeInput random_input(int64_t T, int64_t K, const MoeWeights& M, bool bf16, double mask_frac, Rng& rng);

// moe_forward on `in` (fp32 or bf16 x) -> fp32 values, one extra element last: -1 if it wrote past the end.
std::vector<float> run_driver(const MoeWeights& M, const MoeInput& in, const IsaKernels& isa,
                              const ParallelFor& pf, std::vector<uint16_t>* raw_bf16 = nullptr);

// Σ max(0, |got - ref| - slack) / Σ |ref| over [begin, end).
double rel_l1(const std::vector<float>& got, const std::vector<double>& ref, int64_t begin, int64_t end,
              const std::vector<double>* slack = nullptr);

}  // namespace ktmoe_test
