// [NOTE] ktmoe::moe_forward: the ATen side of the fused MoE forward.
//
// out[t] = Σ_j topk_weights[t,j] · (down_e(act(gate_e x_t + bg_e, up_e x_t + bu_e)) + bd_e),
// e = topk_ids[t,j]; ids < 0 are skipped, ids >= E are an error. act is the row of the
// gated activation table (kernels/gated_activation.h) named by `activation`, with
// `activation_params` in the row's order (empty: its defaults); the biases
// w13_bias [E, 2I] (bg = [:, :I], bu = [:, I:]) and w2_bias [E, H] (bd) are
// optional, any float dtype (read as fp32). The packed weights describe their
// own format (packed_format.h headers), so the op takes no format argument.
// hidden_states may be fp32, bf16 or fp16 (converted row by row in the kernel's
// activation prep, never as a full copy here); out has its dtype.
// prefetch=true first asks the kernel to read every routed expert's packed rows
// (MADV_WILLNEED, asynchronous; ops/expert_reads.h says why this and not the
// reader pool here): cold experts of file-backed weights then come from disk
// together, as queued readahead, instead of one page fault at a time in the
// header checks and the gemms (KTMoE turns it on when its experts do not fit in
// RAM). Outputs do not depend on it.
// ktmoe::moe_forward_ggml: the same over GGML experts where they lie (a GGUF file's gate, up and down
// rows, each of its own decodable type, kernels/ggml/ggml_types.h), bf16 activation rows, the driver's
// gemm_ggml entry; its checks name the tensor and the type.
// Order: checks -> shapes -> scratch (normalised inputs, output) -> dispatch to
// the torch-free driver with the active ISA's micro-kernels and the work pool (ops/op_threads.h).
#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/gated_activation.h"
#include "kernels/moe_driver.h"
#include "kernels/packed_format.h"
#include "ops/expert_reads.h"
#include "ops/ggml_type.h"
#include "ops/isa_dispatch.h"
#include "ops/op_threads.h"
#include "ops/ops.h"
#include "ops/packed_weight_check.h"
#include "ops/weight_format.h"

namespace ktmoe {

namespace {

Activation parse_activation(c10::string_view name, at::ArrayRef<double> params) {
  const GatedActivationRow* row = gated_activation_row(std::string_view(name.data(), name.size()));
  if (row == nullptr) {
    int count = 0;
    const GatedActivationRow* rows = gated_activation_rows(&count);
    std::string names;
    for (int i = 0; i < count; ++i) names += std::string(i ? ", " : "") + rows[i].name;
    TORCH_CHECK(false, "ktmoe::moe_forward: activation must be one of ", names, ", got \"", std::string(name), "\"");
  }
  Activation act;
  const std::string error = make_activation(*row, params.data(), int(params.size()), &act);
  TORCH_CHECK(error.empty(), "ktmoe::moe_forward: ", error);
  return act;
}

// An optional bias as contiguous fp32 [rows, cols] (nullptr data when absent).
at::Tensor bias_as_f32(const c10::optional<at::Tensor>& bias, const char* name, int64_t rows, int64_t cols,
                       const char* shape) {
  if (!bias.has_value()) return at::Tensor();
  const at::Tensor& b = *bias;
  TORCH_CHECK(b.device().is_cpu(), "ktmoe::moe_forward: ", name, " must be on CPU");
  TORCH_CHECK(at::isFloatingType(b.scalar_type()), "ktmoe::moe_forward: ", name,
              " must be a float tensor, got ", b.scalar_type());
  TORCH_CHECK(b.dim() == 2 && b.size(0) == rows && b.size(1) == cols, "ktmoe::moe_forward: ", name, " must be ",
              shape, " = [", rows, ", ", cols, "], got ", b.sizes());
  return b.to(at::kFloat).contiguous();
}

// The checks of hidden_states, topk_ids and topk_weights every MoE forward op makes (op: its name in errors).
void check_routing_inputs(const char* op, const at::Tensor& hidden_states, const at::Tensor& topk_ids,
                          const at::Tensor& topk_weights) {
  TORCH_CHECK(hidden_states.device().is_cpu(), op, ": hidden_states must be on CPU");
  const at::ScalarType xt = hidden_states.scalar_type();
  TORCH_CHECK(xt == at::kBFloat16 || xt == at::kFloat || xt == at::kHalf, op,
              ": hidden_states must be bfloat16, float16 or float32, got ", xt);
  TORCH_CHECK(hidden_states.dim() == 2, op, ": hidden_states must be [T, H], got ", hidden_states.sizes());
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong, op,
              ": topk_ids must be int32 or int64, got ", topk_ids.scalar_type());
  TORCH_CHECK(topk_weights.scalar_type() == at::kFloat || topk_weights.scalar_type() == at::kBFloat16 ||
                  topk_weights.scalar_type() == at::kHalf,
              op, ": topk_weights must be float32, bfloat16 or float16, got ", topk_weights.scalar_type());
  const int64_t tokens = hidden_states.size(0);
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == tokens, op, ": topk_ids must be [T, k] with T = ", tokens,
              ", got ", topk_ids.sizes());
  TORCH_CHECK(topk_weights.sizes() == topk_ids.sizes(), op, ": topk_weights ", topk_weights.sizes(),
              " must have the shape of topk_ids ", topk_ids.sizes());
}

// What both ops hand the driver once their weights are checked: the activation, the biases, then (for a
// call with work) the normalised inputs, the id range check, `set_weights` (the op's experts into p, after
// the ids are known), and the dispatch to the active ISA on the work pool.
at::Tensor run_forward(const at::Tensor& hidden_states, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                       int64_t experts, int64_t inter, const c10::optional<at::Tensor>& w13_bias,
                       const c10::optional<at::Tensor>& w2_bias, c10::string_view activation,
                       at::ArrayRef<double> activation_params, const char* weights_name,
                       const std::function<void(MoeProblem&, const at::Tensor& ids)>& set_weights) {
  const int64_t tokens = hidden_states.size(0), hidden = hidden_states.size(1);
  const at::ScalarType xt = hidden_states.scalar_type();
  const Activation act = parse_activation(activation, activation_params);
  const at::Tensor b13 = bias_as_f32(w13_bias, "w13_bias", experts, 2 * inter, "[E, 2I]");
  const at::Tensor b2 = bias_as_f32(w2_bias, "w2_bias", experts, hidden, "[E, H]");
  at::Tensor out = at::empty({tokens, hidden}, hidden_states.options());
  if (tokens == 0) return out;
  if (topk_ids.size(1) == 0) return out.zero_();
  // scratch: normalised inputs
  const at::Tensor x = hidden_states.contiguous();
  const at::Tensor ids = topk_ids.to(at::kLong).contiguous();
  const at::Tensor weights = topk_weights.to(at::kFloat).contiguous();
  const auto ids_max = ids.max().item<int64_t>();
  TORCH_CHECK(ids_max < experts, "ktmoe::moe_forward: topk_ids holds expert id ", ids_max, " but the ",
              weights_name, " have only ", experts, " experts (ids must be < ", experts,
              "; negative ids mean 'skip')");
  // dispatch
  MoeProblem p;
  p.tokens = tokens;
  p.hidden = hidden;
  p.top_k = ids.size(1);
  p.num_experts = experts;
  p.x = x.data_ptr();
  p.x_dtype = xt == at::kBFloat16 ? ActDtype::kBF16 : xt == at::kHalf ? ActDtype::kF16 : ActDtype::kF32;
  p.ids = ids.data_ptr<int64_t>();
  p.weights = weights.data_ptr<float>();
  p.out = out.data_ptr();
  p.act = act;
  p.w13_bias = b13.defined() ? b13.data_ptr<float>() : nullptr;
  p.w2_bias = b2.defined() ? b2.data_ptr<float>() : nullptr;
  p.threads = op_threads();
  set_weights(p, ids);
  moe_forward(p, active_isa(), pool_loop(int(p.threads)));
  return out;
}

}  // namespace

at::Tensor moe_forward(const at::Tensor& hidden_states, const at::Tensor& topk_ids,
                       const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                       const c10::optional<at::Tensor>& w13_bias, const c10::optional<at::Tensor>& w2_bias,
                       c10::string_view activation, at::ArrayRef<double> activation_params, bool prefetch) {
  // checks
  check_routing_inputs("ktmoe::moe_forward", hidden_states, topk_ids, topk_weights);
  const int64_t hidden = hidden_states.size(1);
  const PackedMatrixHeader& h13 = check_packed_weight(w13, "w13", MatrixRole::kGateUp);
  const PackedMatrixHeader& h2 = check_packed_weight(w2, "w2", MatrixRole::kDown);
  // shapes
  const int64_t experts = w13.size(0), inter = h13.n / 2;
  TORCH_CHECK(w2.size(0) == experts, "ktmoe::moe_forward: w13 has ", experts, " experts but w2 has ",
              w2.size(0));
  TORCH_CHECK(h13.format == h2.format, "ktmoe::moe_forward: w13 is ",
              weight_format_name(WeightFormat(h13.format)), " but w2 is ",
              weight_format_name(WeightFormat(h2.format)));
  TORCH_CHECK(h13.k == hidden, "ktmoe::moe_forward: hidden_states has H = ", hidden,
              " but the packed experts were packed for H = ", h13.k);
  TORCH_CHECK(h2.n == hidden && h2.k == inter, "ktmoe::moe_forward: w2 is packed for [H, I] = [",
              h2.n, ", ", h2.k, "] but w13 implies [", hidden, ", ", inter, "]");
  return run_forward(hidden_states, topk_ids, topk_weights, experts, inter, w13_bias, w2_bias, activation,
                     activation_params, "packed weights", [&](MoeProblem& p, const at::Tensor& ids) {
    if (prefetch) advise_experts(w13, w2, ids.data_ptr<int64_t>(), ids.numel());  // before the headers fault
    check_routed_headers(w13, "w13", ids.data_ptr<int64_t>(), ids.numel());
    check_routed_headers(w2, "w2", ids.data_ptr<int64_t>(), ids.numel());
    p.w13 = w13.data_ptr<uint8_t>();
    p.w13_stride = w13.size(1);
    p.w2 = w2.data_ptr<uint8_t>();
    p.w2_stride = w2.size(1);
  });
}

namespace {

// One role's GGML experts: uint8 [E, rows, row_bytes] whose rows are whole blocks of a decodable type; the
// inner two dimensions contiguous (rows apart by row_bytes), experts any stride (a GGUF tensor is contiguous).
// Returns the weights' columns (row_bytes / block_bytes * block_elems).
int64_t check_ggml_matrices(const at::Tensor& t, const char* name, int64_t type_id, int64_t rows,
                            GgmlMatrices* out) {
  const GgmlTypeTraits& type = decodable_ggml_type(type_id, "ktmoe::moe_forward_ggml");
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.dim() == 3, "ktmoe::moe_forward_ggml: ",
              name, " must be a uint8 CPU tensor [E, rows, row bytes] of GGML blocks, got ", t.scalar_type(), " ",
              t.sizes(), " on ", t.device());
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2), "ktmoe::moe_forward_ggml: ", name,
              "'s rows must be contiguous (each expert a GGUF tensor's rows), got strides ", t.strides());
  TORCH_CHECK(t.size(2) % type.block_bytes == 0, "ktmoe::moe_forward_ggml: ", name, "'s rows of ", t.size(2),
              " bytes are not whole ", type.name, " blocks (", type.block_bytes, " bytes each)");
  TORCH_CHECK(rows < 0 || t.size(1) == rows, "ktmoe::moe_forward_ggml: ", name, " has ", t.size(1),
              " rows, expected ", rows);
  *out = {t.data_ptr<uint8_t>(), t.stride(0), t.size(2), &type};
  return t.size(2) / type.block_bytes * type.block_elems;
}

}  // namespace

at::Tensor moe_forward_ggml(const at::Tensor& hidden_states, const at::Tensor& topk_ids,
                            const at::Tensor& topk_weights, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& down, at::IntArrayRef ggml_types,
                            const c10::optional<at::Tensor>& w13_bias, const c10::optional<at::Tensor>& w2_bias,
                            c10::string_view activation, at::ArrayRef<double> activation_params, bool prefetch) {
  // checks
  check_routing_inputs("ktmoe::moe_forward_ggml", hidden_states, topk_ids, topk_weights);
  TORCH_CHECK(ggml_types.size() == 3, "ktmoe::moe_forward_ggml: ggml_types must be [gate, up, down] type ids, got ",
              ggml_types.size());
  const int64_t hidden = hidden_states.size(1);
  GgmlExperts g{};
  const int64_t gate_cols = check_ggml_matrices(gate, "gate", ggml_types[0], -1, &g.gate);
  g.inter = gate.size(1);
  const int64_t up_cols = check_ggml_matrices(up, "up", ggml_types[1], g.inter, &g.up);
  const int64_t down_cols = check_ggml_matrices(down, "down", ggml_types[2], -1, &g.down);
  // shapes
  const int64_t experts = gate.size(0);
  TORCH_CHECK(up.size(0) == experts && down.size(0) == experts, "ktmoe::moe_forward_ggml: gate, up and down have ",
              experts, ", ", up.size(0), " and ", down.size(0), " experts");
  TORCH_CHECK(gate_cols == hidden && up_cols == hidden, "ktmoe::moe_forward_ggml: hidden_states has H = ", hidden,
              " but gate / up rows hold ", gate_cols, " / ", up_cols, " weights");
  TORCH_CHECK(down.size(1) == hidden, "ktmoe::moe_forward_ggml: down has ", down.size(1), " rows, expected H = ",
              hidden);
  TORCH_CHECK(down_cols == g.inter, "ktmoe::moe_forward_ggml: down rows hold ", down_cols,
              " weights but gate has I = ", g.inter, " rows");
  TORCH_CHECK(g.inter % 16 == 0 && hidden % 16 == 0, "ktmoe::moe_forward_ggml: I = ", g.inter, " and H = ", hidden,
              " must be multiples of 16");
  return run_forward(hidden_states, topk_ids, topk_weights, experts, g.inter, w13_bias, w2_bias, activation,
                     activation_params, "GGML experts", [&](MoeProblem& p, const at::Tensor& ids) {
    if (prefetch) advise_experts({&gate, &up, &down}, ids.data_ptr<int64_t>(), ids.numel());
    p.ggml = &g;
  });
}

}  // namespace ktmoe
