// ATen entry points of the ktmoe ops (registered in torch_bindings.cpp).
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <tuple>
#include <vector>

#include "kernels/packed_format.h"
#include "kernels/weight_formats.h"

namespace ktmoe {

// hidden_states [T, H] bf16|fp16|fp32, topk_ids [T, k] int32|int64, topk_weights [T, k]
// fp32|bf16|fp16, w13 [E, B13] uint8 (packed gate_up), w2 [E, B2] uint8 (packed down),
// w13_bias [E, 2I] (gate then up) / w2_bias [E, H] optional, float dtypes;
// activation a row of kernels/gated_activation.h by name, activation_params its parameters in
// the row's order (empty: the row's defaults);
// prefetch: read ahead the routed experts' rows first (MADV_WILLNEED)
// -> [T, H], dtype of hidden_states.
at::Tensor moe_forward(const at::Tensor& hidden_states, const at::Tensor& topk_ids,
                       const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                       const c10::optional<at::Tensor>& w13_bias, const c10::optional<at::Tensor>& w2_bias,
                       c10::string_view activation, at::ArrayRef<double> activation_params, bool prefetch);

// One exact input's tensors (ops/pack_exact.h): of gate_up (or gate), up (undefined without up), down.
using ExactSlots = std::array<at::Tensor, 3>;

// What pack_experts will make of its inputs (after every argument check): E, the format's row, the
// packed headers of w13 (gate_up) and w2 (down), each output [E, total_bytes]; and a checkpoint's
// exact companions, checked and in their decoder's storage, by input (empty: dense weights).
struct PackPlan {
  int64_t experts = 0;
  const WeightFormatTraits* row = nullptr;
  PackedMatrixHeader h13{}, h2{};
  std::vector<ExactSlots> exact;
};
PackPlan plan_pack(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                   c10::string_view weight_format, int64_t group_size,
                   const std::vector<c10::optional<at::Tensor>>& exact);

// Dense weights: gate_up [E, 2I, H] (or gate [E, I, H] with up [E, I, H]), down [E, H, I], fp32 | bf16 | fp16,
// quantized by the format; exact empty. Or a checkpoint's exact codes in the same shapes, exact = the format's
// companions (its row's ExactFormat: exact[3 i + 0, 1, 2] = gate_up_<name> [E, 2I, ceil(H/g)] (or gate_<name>
// [E, I, ceil(H/g)]), up_<name> (None without up), down_<name> [E, H, ceil(I/g)], g the format's group), packed
// as they are (ops/pack_exact.cpp)
// -> (w13 [E, B13], w2 [E, B2]) uint8 in new memory (ops/weight_bytes.h).
std::tuple<at::Tensor, at::Tensor> pack_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                const at::Tensor& down, c10::string_view weight_format,
                                                int64_t group_size, const c10::List<c10::optional<at::Tensor>>& exact);

// The same into outputs the caller allocated (e.g. from a WeightArena):
// w13 [E, B13], w2 [E, B2] uint8, contiguous, 64-byte aligned; written in full.
void pack_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                      c10::string_view weight_format, int64_t group_size,
                      const c10::List<c10::optional<at::Tensor>>& exact, const at::Tensor& w13, const at::Tensor& w2);

// Bytes of one packed expert matrix (the row stride of pack_experts' outputs).
int64_t packed_matrix_bytes(c10::string_view weight_format, c10::string_view role, int64_t n,
                            int64_t k, int64_t group_size);

// A dense nn.Linear weight [N, K] fp32 | bf16 | fp16 -> uint8 [B]: one kBF16 matrix in the kPlain
// role (header first), on the default CPU allocator (ops/linear.cpp).
at::Tensor pack_linear(const at::Tensor& weight);
// x [..., K] bf16 | fp16 | fp32, w_packed [B] from pack_linear, out_features = N (checked against
// the header), bias [N] float or None -> [..., N] in x's dtype: bf16(x) · bf16(W)ᵀ in fp32 (+ bias).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w_packed, int64_t out_features,
                  const c10::optional<at::Tensor>& bias);

// GGML experts where they lie (a GGUF's rows): gate [E, I, Bg], up [E, I, Bu], down [E, H, Bd] uint8 (each row
// whole blocks of its type, rows contiguous), ggml_types = their type ids [gate, up, down] (decodable rows of
// kernels/ggml/ggml_types.h; I and H multiples of 16); the rest, prefetch too, as moe_forward -> [T, H],
// hidden_states' dtype.
at::Tensor moe_forward_ggml(const at::Tensor& hidden_states, const at::Tensor& topk_ids,
                            const at::Tensor& topk_weights, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& down, at::IntArrayRef ggml_types,
                            const c10::optional<at::Tensor>& w13_bias, const c10::optional<at::Tensor>& w2_bias,
                            c10::string_view activation, at::ArrayRef<double> activation_params, bool prefetch);

// blocks uint8 [..., B] (rows of GGML blocks as a GGUF file stores them, B a multiple of the type's block
// bytes), ggml_type an id of kernels/ggml/ggml_types.h whose blocks this library reads
// -> float32 [..., B / block_bytes * block_elems]: bit for bit gguf.quants.dequantize (ops/ggml_dequantize.cpp).
at::Tensor ggml_dequantize(const at::Tensor& blocks, int64_t ggml_type);

}  // namespace ktmoe
