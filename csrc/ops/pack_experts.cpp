// [NOTE] ktmoe::pack_experts / pack_experts_out: expert weights -> packed [E, bytes] tensors, for
// every format of the table (kernels/weight_formats.h).
//
// Accepts the Hugging Face layout (gate_up_proj [E, 2I, H]: gate rows then up
// rows; down_proj [E, H, I]) or kt-kernel's separate gate/up [E, I, H]. With an
// empty `exact`: dense fp32, bf16 or fp16 weights, quantized by the format's row
// packer (kernels/pack.cpp). With `exact`: a checkpoint's codes and the companions
// its format's row names, packed as they are by the row's decoder (ops/pack_exact.cpp).
// pack_experts allocates its outputs on the default CPU allocator; pack_experts_out
// packs into outputs the caller allocated (Python takes them from a WeightArena: no
// op knows about arenas). Experts are packed in parallel, one expert matrix per
// task, straight into the output: no second copy of the layer is made.
// Order: checks -> shapes (plan_pack) -> allocation or output checks -> pack.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "kernels/pack.h"
#include "ops/ops.h"
#include "ops/pack_each_expert.h"
#include "ops/pack_exact.h"
#include "ops/weight_format.h"
#include "ops/weight_bytes.h"

namespace ktmoe {
namespace {

constexpr const char* kOp = "ktmoe::pack_experts";

void check_dense(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 ||
                  t.scalar_type() == at::kHalf,
              kOp, ": ", name, " must be float32, bfloat16 or float16, got ", t.scalar_type(),
              t.scalar_type() == at::kFloat8_e4m3fn
                  ? std::string(" (a checkpoint's exact codes come with their companions in exact: ") +
                        exact_format_names(kElemE4m3) + ")"
                  : "");
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
  TORCH_CHECK(bad.expert < 0, kOp, ": non-finite weight (", bad.reason, ") in expert ", bad.expert,
              " of ", what, ": NaN/Inf weights are refused, they would silently poison (int8/int4/fp8: "
              "hide) every output of the expert");
}

// The shape checks and headers of a pack; dtypes are checked by the caller.
PackPlan plan_pack_shapes(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                          WeightFormat format, int64_t group_size) {
  for (const at::Tensor* t : {&gate_up, &down, up ? &*up : nullptr}) {
    if (!t) continue;
    const char* name = t == &down ? "down" : t == &gate_up ? (up ? "gate" : "gate_up") : "up";
    TORCH_CHECK(t->device().is_cpu(), kOp, ": ", name, " must be a CPU tensor");
    TORCH_CHECK(t->dim() == 3, kOp, ": ", name, " must be 3-D [E, rows, cols], got ", t->sizes());
  }
  TORCH_CHECK(group_size == 0 || (group_size > 0 && group_size % kAlignK == 0), kOp,
              ": group_size must be 0 (default) or a positive multiple of ", kAlignK, ", got ", group_size);
  PackPlan plan;
  plan.experts = gate_up.size(0);
  const int64_t hidden = gate_up.size(2);
  int64_t inter = 0;
  if (up) {
    inter = gate_up.size(1);
    TORCH_CHECK(up->sizes() == gate_up.sizes(), kOp, ": up ", up->sizes(), " must have the shape of gate ",
                gate_up.sizes());
  } else {
    TORCH_CHECK(gate_up.size(1) % 2 == 0, kOp, ": gate_up [E, 2I, H] needs an even row count, got ",
                gate_up.sizes());
    inter = gate_up.size(1) / 2;
  }
  TORCH_CHECK(plan.experts > 0 && inter > 0 && hidden > 0, kOp, ": empty weights ", gate_up.sizes());
  TORCH_CHECK(down.size(0) == plan.experts && down.size(1) == hidden && down.size(2) == inter, kOp,
              ": down must be [E, H, I] = [", plan.experts, ", ", hidden, ", ", inter, "], got ", down.sizes());
  plan.h13 = packed_matrix_header(format, MatrixRole::kGateUp, 2 * inter, hidden, group_size);
  plan.h2 = packed_matrix_header(format, MatrixRole::kDown, hidden, inter, group_size);
  return plan;
}

}  // namespace

PackPlan plan_pack(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                   c10::string_view weight_format, int64_t group_size,
                   const std::vector<c10::optional<at::Tensor>>& exact) {
  const WeightFormat format = parse_weight_format(std::string(weight_format));
  if (exact.empty())
    for (const at::Tensor* t : {&gate_up, &down, up ? &*up : nullptr})
      if (t) check_dense(*t, t == &down ? "down" : t == &gate_up ? (up ? "gate" : "gate_up") : "up");
  PackPlan plan = plan_pack_shapes(gate_up, up, down, format, group_size);
  plan.row = &format_traits(format);
  if (!exact.empty()) plan.exact = check_exact(kOp, *plan.row, gate_up, up, down, exact, plan.h2.group);
  return plan;
}

namespace {

// Packs plan's experts into w13 and w2 (checked outputs of its sizes).
void pack_planned(const PackPlan& plan, const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                  const at::Tensor& down, const at::Tensor& w13, const at::Tensor& w2) {
  if (!plan.exact.empty()) return pack_exact(kOp, plan, gate_up, up, down, w13, w2);
  std::vector<at::Tensor> gate_up_parts = {gate_up};
  if (up) gate_up_parts.push_back(*up);
  pack_role(gate_up_parts, plan.h13, w13, up ? "gate/up" : "gate_up");
  pack_role({down}, plan.h2, w2, "down");
}

}  // namespace

void pack_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                      c10::string_view weight_format, int64_t group_size,
                      const c10::List<c10::optional<at::Tensor>>& exact, const at::Tensor& w13, const at::Tensor& w2) {
  const PackPlan plan = plan_pack(gate_up, up, down, weight_format, group_size, exact.vec());
  check_pack_output("ktmoe::pack_experts_out", w13, "w13", plan.experts, plan.h13.total_bytes);
  check_pack_output("ktmoe::pack_experts_out", w2, "w2", plan.experts, plan.h2.total_bytes);
  pack_planned(plan, gate_up, up, down, w13, w2);
}

std::tuple<at::Tensor, at::Tensor> pack_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                const at::Tensor& down, c10::string_view weight_format,
                                                int64_t group_size, const c10::List<c10::optional<at::Tensor>>& exact) {
  const PackPlan plan = plan_pack(gate_up, up, down, weight_format, group_size, exact.vec());
  return pack_new(plan, [&](const at::Tensor& w13, const at::Tensor& w2) {
    pack_planned(plan, gate_up, up, down, w13, w2);
  });
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
