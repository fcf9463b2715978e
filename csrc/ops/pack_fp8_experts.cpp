// [NOTE] ktmoe::pack_fp8_experts / pack_fp8_experts_out: an FP8 checkpoint's experts ->
// packed kFP8 [E, bytes] tensors, the e4m3 bytes and the fp32 scales copied exactly
// (kernels/pack_fp8.h; nothing is rounded, no dense float copy is ever made).
//
// Weights: gate_up [E, 2I, H] (gate rows then up rows) or gate with up [E, I, H], and
// down [E, H, I], all float8_e4m3fn. Scales: fp32, one per (row, k-group of g inputs),
// g = group_size (0: 128): gate_up_scale [E, 2I, ceil(H/g)] (or gate_scale / up_scale
// [E, I, ceil(H/g)]), down_scale [E, H, ceil(I/g)]. A checkpoint's 128 x 128 block or
// per-row scales become these in torch_ktmoe.checkpoint.fp8 (group_scales).
// Order: checks -> shapes (plan_pack_shapes) -> allocation or output checks -> pack.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kernels/pack_fp8.h"
#include "ops/ops.h"
#include "ops/pack_each_expert.h"
#include "ops/weight_bytes.h"

namespace ktmoe {
namespace {

constexpr const char* kOp = "ktmoe::pack_fp8_experts";

void check_e4m3(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat8_e4m3fn, kOp, ": ", name, " must be float8_e4m3fn (an FP8 "
              "checkpoint's weights), got ", t.scalar_type(), "; dense float weights are packed by pack_experts");
}

// A scale tensor of weights w [E, rows, k]: fp32 CPU [E, rows, ceil(k / group)].
void check_scale(const at::Tensor& s, const char* name, const at::Tensor& w, int64_t group) {
  const int64_t groups = (w.size(2) + group - 1) / group;
  TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kFloat, kOp, ": ", name,
              " must be a float32 CPU tensor, got ", s.scalar_type(), " on ", s.device());
  TORCH_CHECK(s.dim() == 3 && s.size(0) == w.size(0) && s.size(1) == w.size(1) && s.size(2) == groups, kOp, ": ",
              name, " must be [", w.size(0), ", ", w.size(1), ", ", groups, "] (one scale per row and k-group of ",
              group, " inputs), got ", s.sizes());
}

PackPlan plan_fp8(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                  const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale,
                  const at::Tensor& down_scale, int64_t group_size) {
  const PackPlan plan = plan_pack_shapes(kOp, gate_up, up, down, WeightFormat::kFP8, group_size);
  const int64_t group = plan.h2.group;
  check_e4m3(gate_up, up ? "gate" : "gate_up");
  check_e4m3(down, "down");
  TORCH_CHECK(bool(up) == bool(up_scale), kOp, ": up and up_scale come together (separate gate / up weights)");
  check_scale(gate_up_scale, up ? "gate_scale" : "gate_up_scale", gate_up, group);
  check_scale(down_scale, "down_scale", down, group);
  if (up) {
    check_e4m3(*up, "up");
    check_scale(*up_scale, "up_scale", *up, group);
  }
  return plan;
}

// Packs every expert of one role: rows of expert e from parts (each [E, r_i, k], e4m3) in
// order, with their scales (each [E, r_i, groups]).
void pack_fp8_role(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& scales,
                   const PackedMatrixHeader& header, const at::Tensor& out, const char* what) {
  uint8_t* base = out.data_ptr<uint8_t>();
  const PackFailure bad = pack_each_expert(parts[0].size(0), [&](int64_t e) {
    std::vector<at::Tensor> keep;
    std::vector<const uint8_t*> rows;
    std::vector<const float*> scale_rows;
    for (size_t i = 0; i < parts.size(); ++i) {
      keep.push_back(parts[i].select(0, e).contiguous().view(at::kByte));
      keep.push_back(scales[i].select(0, e).contiguous());
      const uint8_t* q = keep[keep.size() - 2].data_ptr<uint8_t>();
      const float* s = keep.back().data_ptr<float>();
      const int64_t k = parts[i].size(2), groups = scales[i].size(2);
      for (int64_t r = 0; r < parts[i].size(1); ++r) {
        rows.push_back(q + r * k);
        scale_rows.push_back(s + r * groups);
      }
    }
    fp8_pack_matrix(header, rows.data(), scale_rows.data(), e, base + e * header.total_bytes);
  });
  TORCH_CHECK(bad.expert < 0, kOp, ": ", bad.reason, " (", what, "): e4m3 NaN bytes and non-finite scales are "
              "refused, they would poison every output of the expert");
}

}  // namespace

void pack_fp8_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                          const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale,
                          const at::Tensor& down_scale, int64_t group_size, const at::Tensor& w13,
                          const at::Tensor& w2) {
  const PackPlan plan = plan_fp8(gate_up, up, down, gate_up_scale, up_scale, down_scale, group_size);
  check_pack_output("ktmoe::pack_fp8_experts_out", w13, "w13", plan.experts, plan.h13.total_bytes);
  check_pack_output("ktmoe::pack_fp8_experts_out", w2, "w2", plan.experts, plan.h2.total_bytes);
  std::vector<at::Tensor> parts = {gate_up}, scales = {gate_up_scale};
  if (up) parts.push_back(*up), scales.push_back(*up_scale);
  pack_fp8_role(parts, scales, plan.h13, w13, up ? "gate/up" : "gate_up");
  pack_fp8_role({down}, {down_scale}, plan.h2, w2, "down");
}

std::tuple<at::Tensor, at::Tensor> pack_fp8_experts(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                                    const at::Tensor& down, const at::Tensor& gate_up_scale,
                                                    const c10::optional<at::Tensor>& up_scale,
                                                    const at::Tensor& down_scale, int64_t group_size) {
  const PackPlan plan = plan_fp8(gate_up, up, down, gate_up_scale, up_scale, down_scale, group_size);
  at::Tensor w13 = empty_weight_bytes({plan.experts, plan.h13.total_bytes});
  at::Tensor w2 = empty_weight_bytes({plan.experts, plan.h2.total_bytes});
  pack_fp8_experts_out(gate_up, up, down, gate_up_scale, up_scale, down_scale, group_size, w13, w2);
  return {w13, w2};
}

}  // namespace ktmoe
