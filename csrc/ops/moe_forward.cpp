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
// Order: checks -> shapes -> scratch (normalised inputs, output) -> dispatch to
// the torch-free driver with the active ISA's micro-kernels and ATen's pool.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/gated_activation.h"
#include "kernels/moe_driver.h"
#include "kernels/packed_format.h"
#include "ops/expert_reads.h"
#include "ops/isa_dispatch.h"
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

}  // namespace

at::Tensor moe_forward(const at::Tensor& hidden_states, const at::Tensor& topk_ids,
                       const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                       const c10::optional<at::Tensor>& w13_bias, const c10::optional<at::Tensor>& w2_bias,
                       c10::string_view activation, at::ArrayRef<double> activation_params, bool prefetch) {
  // checks
  TORCH_CHECK(hidden_states.device().is_cpu(), "ktmoe::moe_forward: hidden_states must be on CPU");
  const at::ScalarType xt = hidden_states.scalar_type();
  TORCH_CHECK(xt == at::kBFloat16 || xt == at::kFloat || xt == at::kHalf,
              "ktmoe::moe_forward: hidden_states must be bfloat16, float16 or float32, got ", xt);
  TORCH_CHECK(hidden_states.dim() == 2, "ktmoe::moe_forward: hidden_states must be [T, H], got ",
              hidden_states.sizes());
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong,
              "ktmoe::moe_forward: topk_ids must be int32 or int64, got ", topk_ids.scalar_type());
  TORCH_CHECK(topk_weights.scalar_type() == at::kFloat || topk_weights.scalar_type() == at::kBFloat16 ||
                  topk_weights.scalar_type() == at::kHalf,
              "ktmoe::moe_forward: topk_weights must be float32, bfloat16 or float16, got ",
              topk_weights.scalar_type());
  const int64_t tokens = hidden_states.size(0), hidden = hidden_states.size(1);
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == tokens,
              "ktmoe::moe_forward: topk_ids must be [T, k] with T = ", tokens, ", got ", topk_ids.sizes());
  TORCH_CHECK(topk_weights.sizes() == topk_ids.sizes(), "ktmoe::moe_forward: topk_weights ",
              topk_weights.sizes(), " must have the shape of topk_ids ", topk_ids.sizes());
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
  TORCH_CHECK(ids_max < experts, "ktmoe::moe_forward: topk_ids holds expert id ", ids_max,
              " but the packed weights have only ", experts, " experts (ids must be < ", experts,
              "; negative ids mean 'skip')");
  if (prefetch) advise_experts(w13, w2, ids.data_ptr<int64_t>(), ids.numel());  // before the headers fault
  check_routed_headers(w13, "w13", ids.data_ptr<int64_t>(), ids.numel());
  check_routed_headers(w2, "w2", ids.data_ptr<int64_t>(), ids.numel());
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
  p.w13 = w13.data_ptr<uint8_t>();
  p.w13_stride = w13.size(1);
  p.w2 = w2.data_ptr<uint8_t>();
  p.w2_stride = w2.size(1);
  p.out = out.data_ptr();
  p.act = act;
  p.w13_bias = b13.defined() ? b13.data_ptr<float>() : nullptr;
  p.w2_bias = b2.defined() ? b2.data_ptr<float>() : nullptr;
  p.threads = at::get_num_threads();
  moe_forward(p, active_isa(), [](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
    at::parallel_for(0, n, grain, body);
  });
  return out;
}

}  // namespace ktmoe
