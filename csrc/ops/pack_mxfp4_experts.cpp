// [NOTE] ktmoe::pack_mxfp4_experts / pack_mxfp4_experts_out: an MXFP4 checkpoint's experts ->
// packed kMXFP4 [E, bytes] tensors, the e2m1 codes and E8M0 scale bytes copied exactly
// (kernels/pack_mxfp4.h; nothing is rounded, no dense float copy is ever made).
//
// Codes: uint8, one e2m1 code 0..15 per byte (a checkpoint's `_blocks` nibbles split, low
// nibble first: torch_ktmoe.checkpoint.mxfp4): gate_up [E, 2I, H] (gate rows then up rows) or
// gate with up [E, I, H], and down [E, H, I]. Scales: uint8 E8M0 bytes, one per (row, k-group
// of g inputs), g = group_size (0: 32, the MX block): gate_up_scale [E, 2I, ceil(H/g)] (or
// gate_scale / up_scale [E, I, ceil(H/g)]), down_scale [E, H, ceil(I/g)].
// Order: checks -> shapes (plan_pack_shapes) -> allocation or output checks -> pack.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kernels/pack_mxfp4.h"
#include "ops/ops.h"
#include "ops/pack_each_expert.h"

namespace ktmoe {
namespace {

constexpr const char* kOp = "ktmoe::pack_mxfp4_experts";

void check_bytes(const at::Tensor& t, const char* name, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte, kOp, ": ", name, " must be a uint8 CPU tensor (",
              what, "), got ", t.scalar_type(), " on ", t.device(), "; dense float weights are packed by pack_experts");
}

// A scale tensor of codes q [E, rows, k]: uint8 [E, rows, ceil(k / group)].
void check_scale(const at::Tensor& s, const char* name, const at::Tensor& q, int64_t group) {
  const int64_t groups = (q.size(2) + group - 1) / group;
  check_bytes(s, name, "E8M0 scale bytes");
  TORCH_CHECK(s.dim() == 3 && s.size(0) == q.size(0) && s.size(1) == q.size(1) && s.size(2) == groups, kOp, ": ",
              name, " must be [", q.size(0), ", ", q.size(1), ", ", groups, "] (one per row and k-group of ", group,
              " inputs), got ", s.sizes());
}

PackPlan plan_mxfp4(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                    const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale,
                    const at::Tensor& down_scale, int64_t group_size) {
  const PackPlan plan = plan_pack_shapes(kOp, gate_up, up, down, WeightFormat::kMXFP4, group_size);
  const int64_t group = plan.h2.group;
  const char* codes = "one e2m1 code 0..15 per byte";
  check_bytes(gate_up, up ? "gate" : "gate_up", codes);
  check_bytes(down, "down", codes);
  TORCH_CHECK(bool(up) == bool(up_scale), kOp, ": up and up_scale come together (separate gate / up codes)");
  check_scale(gate_up_scale, up ? "gate_scale" : "gate_up_scale", gate_up, group);
  check_scale(down_scale, "down_scale", down, group);
  if (up) {
    check_bytes(*up, "up", codes);
    check_scale(*up_scale, "up_scale", *up, group);
  }
  return plan;
}

// Packs every expert of one role: rows of expert e from parts (codes [E, r_i, k]) in order, with
// their scales (each [E, r_i, groups]).
void pack_mxfp4_role(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& scales,
                     const PackedMatrixHeader& header, const at::Tensor& out, const char* what) {
  uint8_t* base = out.data_ptr<uint8_t>();
  const PackFailure bad = pack_each_expert(parts[0].size(0), [&](int64_t e) {
    std::vector<at::Tensor> keep;
    const std::vector<const uint8_t*> rows = expert_rows<uint8_t>(parts, e, keep);
    const std::vector<const uint8_t*> scale_rows = expert_rows<uint8_t>(scales, e, keep);
    mxfp4_pack_matrix(header, rows.data(), scale_rows.data(), e, base + e * header.total_bytes);
  });
  TORCH_CHECK(bad.expert < 0, kOp, ": ", bad.reason, " (", what, ")");
}

}  // namespace

void pack_mxfp4_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                            const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale,
                            const at::Tensor& down_scale, int64_t group_size, const at::Tensor& w13,
                            const at::Tensor& w2) {
  const PackPlan plan = plan_mxfp4(gate_up, up, down, gate_up_scale, up_scale, down_scale, group_size);
  check_pack_output("ktmoe::pack_mxfp4_experts_out", w13, "w13", plan.experts, plan.h13.total_bytes);
  check_pack_output("ktmoe::pack_mxfp4_experts_out", w2, "w2", plan.experts, plan.h2.total_bytes);
  if (up)
    pack_mxfp4_role({gate_up, *up}, {gate_up_scale, *up_scale}, plan.h13, w13, "gate/up");
  else
    pack_mxfp4_role({gate_up}, {gate_up_scale}, plan.h13, w13, "gate_up");
  pack_mxfp4_role({down}, {down_scale}, plan.h2, w2, "down");
}

// The same into new memory.
std::tuple<at::Tensor, at::Tensor> pack_mxfp4_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                      const at::Tensor& down, const at::Tensor& gate_up_scale,
                                                      const c10::optional<at::Tensor>& up_scale,
                                                      const at::Tensor& down_scale, int64_t group_size) {
  return pack_new(plan_mxfp4(gate_up, up, down, gate_up_scale, up_scale, down_scale, group_size),
                  [&](const at::Tensor& w13, const at::Tensor& w2) {
                    pack_mxfp4_experts_out(gate_up, up, down, gate_up_scale, up_scale, down_scale, group_size, w13, w2);
                  });
}

}  // namespace ktmoe
