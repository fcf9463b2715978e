// ATen entry points of the ktmoe ops (registered in torch_bindings.cpp).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

#include "kernels/packed_format.h"

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

// What pack_experts will make of its inputs (after every argument check): E and
// the packed headers of w13 (gate_up) and w2 (down); each output is [E, total_bytes].
struct PackPlan {
  int64_t experts = 0;
  PackedMatrixHeader h13{}, h2{};
};
PackPlan plan_pack(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                   c10::string_view weight_format, int64_t group_size);
// The shape checks and headers of any pack op (`op` names it in errors); dtypes are the op's own.
PackPlan plan_pack_shapes(const char* op, const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                          const at::Tensor& down, WeightFormat format, int64_t group_size);

// gate_up [E, 2I, H] (or gate [E, I, H] with up [E, I, H]), down [E, H, I]
// -> (w13 [E, B13], w2 [E, B2]) uint8 on the default CPU allocator.
std::tuple<at::Tensor, at::Tensor> pack_experts(const at::Tensor& gate_up,
                                                const c10::optional<at::Tensor>& up,
                                                const at::Tensor& down, c10::string_view weight_format,
                                                int64_t group_size);

// The same into outputs the caller allocated (e.g. from a WeightArena):
// w13 [E, B13], w2 [E, B2] uint8, contiguous, 64-byte aligned; written in full.
void pack_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                      c10::string_view weight_format, int64_t group_size, const at::Tensor& w13,
                      const at::Tensor& w2);

// An FP8 checkpoint's experts, bytes and scales kept: gate_up [E, 2I, H] (or gate with up
// [E, I, H]), down [E, H, I] float8_e4m3fn; scales fp32 per (row, k-group of group_size
// inputs, 0 -> 128): gate_up_scale [E, 2I, ceil(H/g)] (or gate / up_scale [E, I, ceil(H/g)]),
// down_scale [E, H, ceil(I/g)] -> (w13 [E, B13], w2 [E, B2]) uint8 in kFP8.
std::tuple<at::Tensor, at::Tensor> pack_fp8_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                    const at::Tensor& down, const at::Tensor& gate_up_scale,
                                                    const c10::optional<at::Tensor>& up_scale,
                                                    const at::Tensor& down_scale, int64_t group_size);
// The same into outputs the caller allocated (as pack_experts_out).
void pack_fp8_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                          const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale,
                          const at::Tensor& down_scale, int64_t group_size, const at::Tensor& w13,
                          const at::Tensor& w2);

// An int4 checkpoint's experts, codes, scales and zero points kept: gate_up [E, 2I, H] (or gate
// with up [E, I, H]), down [E, H, I] uint8 codes 0..15; scales fp32 | bf16 | fp16 per (row,
// k-group of group_size inputs, 0 -> 128) [E, rows, ceil(k/g)]; zero points integer 0..16 of the
// scales' shape, or None (symmetric: z = 8) -> (w13 [E, B13], w2 [E, B2]) uint8 in kINT4A.
std::tuple<at::Tensor, at::Tensor> pack_int4_affine_experts(
    const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
    const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale, const at::Tensor& down_scale,
    const c10::optional<at::Tensor>& gate_up_zero, const c10::optional<at::Tensor>& up_zero,
    const c10::optional<at::Tensor>& down_zero, int64_t group_size);
// The same into outputs the caller allocated (as pack_experts_out).
void pack_int4_affine_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                  const at::Tensor& down, const at::Tensor& gate_up_scale,
                                  const c10::optional<at::Tensor>& up_scale, const at::Tensor& down_scale,
                                  const c10::optional<at::Tensor>& gate_up_zero,
                                  const c10::optional<at::Tensor>& up_zero,
                                  const c10::optional<at::Tensor>& down_zero, int64_t group_size,
                                  const at::Tensor& w13, const at::Tensor& w2);

// An MXFP4 checkpoint's experts, codes and scales kept: gate_up [E, 2I, H] (or gate with up
// [E, I, H]), down [E, H, I] uint8 e2m1 codes 0..15; uint8 E8M0 scales per (row, k-group of
// group_size inputs, 0 -> 32) [E, rows, ceil(k/g)] -> (w13 [E, B13], w2 [E, B2]) uint8 in kMXFP4.
std::tuple<at::Tensor, at::Tensor> pack_mxfp4_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                      const at::Tensor& down, const at::Tensor& gate_up_scale,
                                                      const c10::optional<at::Tensor>& up_scale,
                                                      const at::Tensor& down_scale, int64_t group_size);
// The same into outputs the caller allocated (as pack_experts_out).
void pack_mxfp4_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                            const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale,
                            const at::Tensor& down_scale, int64_t group_size, const at::Tensor& w13,
                            const at::Tensor& w2);

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

}  // namespace ktmoe
