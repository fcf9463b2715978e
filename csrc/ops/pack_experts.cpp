// [NOTE] ktmoe::pack_experts / pack_experts_out: dense expert weights -> packed
// [E, bytes] tensors.
//
// Accepts the Hugging Face layout (gate_up_proj [E, 2I, H]: gate rows then up
// rows; down_proj [E, H, I]) or kt-kernel's separate gate/up [E, I, H]. fp32,
// bf16 or fp16; every format, fp8 quantized from them (an FP8 checkpoint's own e4m3
// bytes and scales go through pack_fp8_experts.cpp). pack_experts allocates its outputs on the default CPU
// allocator; pack_experts_out packs into outputs the caller allocated (Python
// takes them from a WeightArena: no op knows about arenas). Experts are packed
// in parallel, one expert matrix per task, straight into the output: no second
// copy of the layer is made.
// Order: checks -> shapes (plan_pack) -> allocation or output checks -> pack.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "kernels/pack.h"
#include "ops/ops.h"
#include "ops/pack_each_expert.h"
#include "ops/weight_format.h"
#include "ops/weight_bytes.h"

namespace ktmoe {
namespace {

void check_dense(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 ||
                  t.scalar_type() == at::kHalf,
              "ktmoe::pack_experts: ", name, " must be float32, bfloat16 or float16, got ",
              t.scalar_type(), t.scalar_type() == at::kFloat8_e4m3fn
                  ? " (an FP8 checkpoint's e4m3 weights and their scales: pack_fp8_experts)" : "");
}

// Packs experts' matrices into out [E, total_bytes]: rows of expert e come from
// parts (each [E, r_i, k]) in order. A non-finite weight is an error naming the
// lowest such expert (`what`: gate_up, gate/up or down).
void pack_role(const std::vector<at::Tensor>& parts, const PackedMatrixHeader& header, const at::Tensor& out,
               const char* what) {
  uint8_t* base = out.data_ptr<uint8_t>();
  const PackFailure bad = pack_each_expert(parts[0].size(0), [&](int64_t e) {
    std::vector<at::Tensor> dense;
    std::vector<const float*> rows;
    for (const at::Tensor& p : parts) {
      dense.push_back(p.select(0, e).to(at::kFloat).contiguous());
      const float* d = dense.back().data_ptr<float>();
      for (int64_t r = 0; r < p.size(1); ++r) rows.push_back(d + r * p.size(2));
    }
    pack_matrix(header, rows.data(), base + e * header.total_bytes);
  });
  TORCH_CHECK(bad.expert < 0, "ktmoe::pack_experts: non-finite weight (", bad.reason, ") in expert ", bad.expert,
              " of ", what, ": NaN/Inf weights are refused, they would silently poison (int8/int4/fp8: "
              "hide) every output of the expert");
}

}  // namespace

PackPlan plan_pack_shapes(const char* op, const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                          const at::Tensor& down, WeightFormat format, int64_t group_size) {
  for (const at::Tensor* t : {&gate_up, &down, up ? &*up : nullptr}) {
    if (!t) continue;
    const char* name = t == &down ? "down" : t == &gate_up ? (up ? "gate" : "gate_up") : "up";
    TORCH_CHECK(t->device().is_cpu(), op, ": ", name, " must be a CPU tensor");
    TORCH_CHECK(t->dim() == 3, op, ": ", name, " must be 3-D [E, rows, cols], got ", t->sizes());
  }
  TORCH_CHECK(group_size == 0 || (group_size > 0 && group_size % kAlignK == 0), op,
              ": group_size must be 0 (default) or a positive multiple of ", kAlignK, ", got ", group_size);
  PackPlan plan;
  plan.experts = gate_up.size(0);
  const int64_t hidden = gate_up.size(2);
  int64_t inter = 0;
  if (up) {
    inter = gate_up.size(1);
    TORCH_CHECK(up->sizes() == gate_up.sizes(), op, ": up ", up->sizes(), " must have the shape of gate ",
                gate_up.sizes());
  } else {
    TORCH_CHECK(gate_up.size(1) % 2 == 0, op, ": gate_up [E, 2I, H] needs an even row count, got ",
                gate_up.sizes());
    inter = gate_up.size(1) / 2;
  }
  TORCH_CHECK(plan.experts > 0 && inter > 0 && hidden > 0, op, ": empty weights ", gate_up.sizes());
  TORCH_CHECK(down.size(0) == plan.experts && down.size(1) == hidden && down.size(2) == inter, op,
              ": down must be [E, H, I] = [", plan.experts, ", ", hidden, ", ", inter, "], got ", down.sizes());
  plan.h13 = packed_matrix_header(format, MatrixRole::kGateUp, 2 * inter, hidden, group_size);
  plan.h2 = packed_matrix_header(format, MatrixRole::kDown, hidden, inter, group_size);
  return plan;
}

PackPlan plan_pack(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                   c10::string_view weight_format, int64_t group_size) {
  const WeightFormat format = parse_weight_format(std::string(weight_format));
  for (const at::Tensor* t : {&gate_up, &down, up ? &*up : nullptr})
    if (t) check_dense(*t, t == &down ? "down" : t == &gate_up ? (up ? "gate" : "gate_up") : "up");
  return plan_pack_shapes("ktmoe::pack_experts", gate_up, up, down, format, group_size);
}

void pack_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                      c10::string_view weight_format, int64_t group_size, const at::Tensor& w13,
                      const at::Tensor& w2) {
  const PackPlan plan = plan_pack(gate_up, up, down, weight_format, group_size);
  check_pack_output("ktmoe::pack_experts_out", w13, "w13", plan.experts, plan.h13.total_bytes);
  check_pack_output("ktmoe::pack_experts_out", w2, "w2", plan.experts, plan.h2.total_bytes);
  std::vector<at::Tensor> gate_up_parts = {gate_up};
  if (up) gate_up_parts.push_back(*up);
  pack_role(gate_up_parts, plan.h13, w13, up ? "gate/up" : "gate_up");
  pack_role({down}, plan.h2, w2, "down");
}

std::tuple<at::Tensor, at::Tensor> pack_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                const at::Tensor& down, c10::string_view weight_format,
                                                int64_t group_size) {
  const PackPlan plan = plan_pack(gate_up, up, down, weight_format, group_size);
  at::Tensor w13 = empty_weight_bytes({plan.experts, plan.h13.total_bytes});
  at::Tensor w2 = empty_weight_bytes({plan.experts, plan.h2.total_bytes});
  pack_experts_out(gate_up, up, down, weight_format, group_size, w13, w2);
  return {w13, w2};
}

int64_t packed_matrix_bytes(c10::string_view weight_format, c10::string_view role, int64_t n,
                            int64_t k, int64_t group_size) {
  const WeightFormat format = parse_weight_format(std::string(weight_format));
  MatrixRole r = MatrixRole::kPlain;
  if (role == "gate_up") r = MatrixRole::kGateUp;
  else if (role == "down") r = MatrixRole::kDown;
  else TORCH_CHECK(role == "plain", "ktmoe: role must be gate_up, down or plain, got '", role, "'");
  return packed_matrix_header(format, r, n, k, group_size).total_bytes;
}

}  // namespace ktmoe
