// The ktmoe op library: every op's schema (TORCH_LIBRARY) and its CPU kernel
// (TORCH_LIBRARY_IMPL), nothing else. Entry points: ops/ops.h; fake (meta)
// kernels: torch_ktmoe/ops.py. The Python module torch_ktmoe._C (arenas, ISA,
// cache helpers) is python_module.cpp.
#include <torch/library.h>

#include "ops/ops.h"

TORCH_LIBRARY(ktmoe, m) {
  // Fused MoE forward over packed experts (format read from the packed headers); optional
  // expert biases and the gated activation (a row of kernels/gated_activation.h by name, its parameters in the
  // row's order, empty: the defaults); prefetch: start
  // reading the routed experts' packed rows first (file-backed experts that may be cold).
  m.def("moe_forward(Tensor hidden_states, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2, "
        "Tensor? w13_bias=None, Tensor? w2_bias=None, str activation=\"silu\", float[] activation_params=[], "
        "bool prefetch=False) -> Tensor");
  // HF (gate_up [E,2I,H]) or kt-kernel (gate, up [E,I,H]) experts -> packed (w13, w2) in new memory (from 2 MiB
  // up on huge pages, ops/weight_bytes.h): dense weights quantized by the format (exact []), or a checkpoint's
  // codes with the companions its format's row names (exact: scales, zero points), packed as they are. exact
  // has no default: a schema's list default may only hold numbers.
  m.def("pack_experts(Tensor gate_up, Tensor? up, Tensor down, str weight_format, int group_size, "
        "Tensor?[] exact) -> (Tensor, Tensor)");
  // The same into caller-allocated outputs (Python takes them from a WeightArena).
  m.def("pack_experts_out(Tensor gate_up, Tensor? up, Tensor down, str weight_format, int group_size, "
        "Tensor?[] exact, Tensor(a!) w13, Tensor(b!) w2) -> ()");
  // A dense [N, K] weight -> one packed bf16 matrix (uint8 [B], header first); x [..., K] times it (+ bias) ->
  // [..., out_features] (N is an argument, checked against the header: the fake kernel cannot read the header).
  m.def("pack_linear(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor w_packed, int out_features, Tensor? bias=None) -> Tensor");
  // The same over GGML experts where they lie (a GGUF file's gate / up / down rows, each of its own type id).
  m.def("moe_forward_ggml(Tensor hidden_states, Tensor topk_ids, Tensor topk_weights, Tensor gate, Tensor up, "
        "Tensor down, int[] ggml_types, Tensor? w13_bias=None, Tensor? w2_bias=None, str activation=\"silu\", "
        "float[] activation_params=[], bool prefetch=False) -> Tensor");
  // Rows of GGML blocks (a GGUF tensor's bytes) of a type of kernels/ggml/ggml_types.h -> fp32 weights, exactly.
  m.def("ggml_dequantize(Tensor blocks, int ggml_type) -> Tensor");
}

TORCH_LIBRARY_IMPL(ktmoe, CPU, m) {
  m.impl("moe_forward", &ktmoe::moe_forward);
  m.impl("pack_experts", &ktmoe::pack_experts);
  m.impl("pack_experts_out", &ktmoe::pack_experts_out);
  m.impl("pack_linear", &ktmoe::pack_linear);
  m.impl("linear", &ktmoe::linear);
  m.impl("moe_forward_ggml", &ktmoe::moe_forward_ggml);
  m.impl("ggml_dequantize", &ktmoe::ggml_dequantize);
}
