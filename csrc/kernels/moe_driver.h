// [NOTE] The MoE forward driver: routing, scratch and threading over a micro-kernel table.
//
// out[t] = Σ_j w[t,j] · (down_e(act(gate_e(x_t) + bg_e, up_e(x_t) + bu_e)) + bd_e),  e = ids[t,j];
// act is a row of the gated activation table (gated_activation.h); the biases (bg, bu: w13_bias,
// bd: w2_bias) are optional (absent = 0). ids < 0 are skipped; ids >= E must be
// rejected by the caller (ops layer).
//
// Phases, each a parallel loop over independent work items, so the result is the
// same bits for any thread count:
//   1. activations: x (fp32, bf16 or fp16) -> bf16 rows (kBF16) or int8 rows +
//      scales + group sums (fp16 is widened to fp32 row by row first);
//      gather each active expert's tokens into a contiguous block;
//   2. gate/up: items (expert, pair of blocks) -> (+ bias) h = act(gate, up), fp32;
//      then h -> bf16 / int8 rows per (expert, token);
//   3. down: items (expert, range of blocks) -> y (+ bias), one slot per (t, j);
//   4. combine: out[t] = Σ_j w[t,j] · y[t,j] in j order, written in out's dtype
//      (x's: fp32, or bf16 / fp16 rounded to nearest even).
// Decode (few tokens) splits every expert's blocks over all threads; prefill
// (many tokens) runs blocked GEMMs per (expert, block range) over all its tokens.
#pragma once
#include <cstdint>
#include <functional>

#include "common/parallel_for.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {


// One role's experts as a GGUF file stores them, where they lie: expert e's row i is the row_bytes bytes at
// data + e * expert_stride + i * row_bytes (blocks of `type`, a decodable row of kernels/ggml/ggml_types.h).
struct GgmlMatrices {
  const uint8_t* data;
  int64_t expert_stride;
  int64_t row_bytes;
  const GgmlTypeTraits* type;
};

// GGML experts in place of w13 / w2: gate and up [E, I, H], down [E, H, I] (I and H multiples of 16).
struct GgmlExperts {
  GgmlMatrices gate, up, down;
  int64_t inter;  // I
};

// The dtype of the activations x and of out (the model's dtype).
enum class ActDtype : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct MoeProblem {
  int64_t tokens;        // T
  int64_t hidden;        // H
  int64_t top_k;         // k
  int64_t num_experts;   // E
  const void* x;         // [T, H] contiguous, x_dtype
  ActDtype x_dtype;
  const int64_t* ids;    // [T, k] contiguous
  const float* weights;  // [T, k] contiguous
  const uint8_t* w13;    // [E, w13_stride] packed kGateUp matrices, n = 2I, k = H
  int64_t w13_stride;
  const uint8_t* w2;     // [E, w2_stride] packed kDown matrices, n = H, k = I
  int64_t w2_stride;
  const GgmlExperts* ggml = nullptr;  // GGML experts where they lie instead of w13 / w2 (then unused)
  void* out;             // [T, H] contiguous, same dtype as x
  Activation act;                   // the gated activation (gated_activation.h)
  const float* w13_bias = nullptr;  // [E, 2I] or null: gate bias [0, I), then up bias [I, 2I)
  const float* w2_bias = nullptr;   // [E, H] or null: added to down's output before weighting
  int64_t threads = 1;              // threads of parallel_for (sizes the decode items only)
};

// Runs the forward. Assumes the caller validated shapes, formats and ids (GGML: decodable types, whole
// blocks per row, I and H multiples of 16).
void moe_forward(const MoeProblem& p, const IsaKernels& isa, const ParallelFor& parallel_for);

}  // namespace ktmoe
