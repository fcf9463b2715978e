// [NOTE] ktmoe::pack_int4_affine_experts / _out: an int4 checkpoint's experts (codes, scales,
// optional zero points) -> packed kINT4A [E, bytes] tensors, exactly (kernels/pack_int4_affine.h;
// no dense float copy of an expert is ever made).
//
// Codes: uint8, one 4-bit code 0..15 per byte: gate_up [E, 2I, H] (gate rows then up rows) or
// gate with up [E, I, H], and down [E, H, I]. Scales: fp32, bf16 or fp16 (widened to fp32,
// exactly), one per (row, k-group of g inputs), g = group_size (0: 128): gate_up_scale
// [E, 2I, ceil(H/g)] (or gate / up_scale [E, I, ceil(H/g)]), down_scale [E, H, ceil(I/g)].
// Zero points: an integer tensor of the scale's shape with values 0..16, w = s * (q - z), or
// None: symmetric, z = 8 (compressed-tensors pack-quantized). The checkpoint readers
// (torch_ktmoe/checkpoint) unpack int32 words into these.
// Order: checks -> shapes (plan_pack_shapes) -> allocation or output checks -> pack.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kernels/pack_int4_affine.h"
#include "ops/ops.h"
#include "ops/pack_each_expert.h"
#include "ops/weight_bytes.h"

namespace ktmoe {
namespace {

constexpr const char* kOp = "ktmoe::pack_int4_affine_experts";

void check_codes(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kByte, kOp, ": ", name, " must be uint8 (one 4-bit code 0..15 per byte), got ",
              t.scalar_type(), "; dense float weights are packed by pack_experts");
}

// [E, rows, ceil(k / group)] of weights w [E, rows, k], on the CPU.
void check_group_shape(const at::Tensor& t, const char* name, const at::Tensor& w, int64_t group) {
  const int64_t groups = (w.size(2) + group - 1) / group;
  TORCH_CHECK(t.device().is_cpu(), kOp, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 3 && t.size(0) == w.size(0) && t.size(1) == w.size(1) && t.size(2) == groups, kOp, ": ",
              name, " must be [", w.size(0), ", ", w.size(1), ", ", groups, "] (one per row and k-group of ", group,
              " inputs), got ", t.sizes());
}

at::Tensor checked_scale(const at::Tensor& s, const char* name, const at::Tensor& w, int64_t group) {
  TORCH_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == at::kBFloat16 || s.scalar_type() == at::kHalf,
              kOp, ": ", name, " must be float32, bfloat16 or float16, got ", s.scalar_type());
  check_group_shape(s, name, w, group);
  return s.to(at::kFloat);  // exact
}

// Zero points as uint8 (values checked 0..16 first: a wider integer would wrap), or undefined.
at::Tensor checked_zero(const c10::optional<at::Tensor>& z, const char* name, const at::Tensor& w, int64_t group) {
  if (!z) return at::Tensor();
  TORCH_CHECK(at::isIntegralType(z->scalar_type(), /*includeBool=*/false), kOp, ": ", name,
              " must be an integer tensor (zero points 0..16), got ", z->scalar_type());
  check_group_shape(*z, name, w, group);
  if (z->numel() > 0) {
    const int64_t lo = z->min().item<int64_t>(), hi = z->max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi <= kInt4AffineMaxZero, kOp, ": ", name, " holds ", lo < 0 ? lo : hi,
                ": zero points must be in [0, ", kInt4AffineMaxZero, "] (GPTQ v1 stores z - 1: add 1 first)");
  }
  return z->to(at::kByte);
}

struct Int4AffineInputs {
  PackPlan plan;
  std::vector<at::Tensor> codes13, scales13, zeros13;  // gate_up, or gate then up
  at::Tensor scale2, zero2;
};

Int4AffineInputs plan_int4_affine(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                  const at::Tensor& down, const at::Tensor& gate_up_scale,
                                  const c10::optional<at::Tensor>& up_scale, const at::Tensor& down_scale,
                                  const c10::optional<at::Tensor>& gate_up_zero, const c10::optional<at::Tensor>& up_zero,
                                  const c10::optional<at::Tensor>& down_zero, int64_t group_size) {
  Int4AffineInputs in;
  in.plan = plan_pack_shapes(kOp, gate_up, up, down, WeightFormat::kINT4A, group_size);
  const int64_t group = in.plan.h2.group;
  check_codes(gate_up, up ? "gate" : "gate_up");
  check_codes(down, "down");
  TORCH_CHECK(bool(up) == bool(up_scale), kOp, ": up and up_scale come together (separate gate / up codes)");
  TORCH_CHECK(up || !up_zero, kOp, ": up_zero without up");
  in.codes13 = {gate_up};
  in.scales13 = {checked_scale(gate_up_scale, up ? "gate_scale" : "gate_up_scale", gate_up, group)};
  in.zeros13 = {checked_zero(gate_up_zero, up ? "gate_zero" : "gate_up_zero", gate_up, group)};
  if (up) {
    check_codes(*up, "up");
    in.codes13.push_back(*up);
    in.scales13.push_back(checked_scale(*up_scale, "up_scale", *up, group));
    in.zeros13.push_back(checked_zero(up_zero, "up_zero", *up, group));
  }
  in.scale2 = checked_scale(down_scale, "down_scale", down, group);
  in.zero2 = checked_zero(down_zero, "down_zero", down, group);
  return in;
}

// Packs every expert of one role: rows of expert e from parts (codes [E, r_i, k]) in order,
// with their scales and zero points (each [E, r_i, groups]; an undefined zero tensor: z = 8).
void pack_int4_affine_role(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& scales,
                           const std::vector<at::Tensor>& zeros, const PackedMatrixHeader& header,
                           const at::Tensor& out, const char* what) {
  uint8_t* base = out.data_ptr<uint8_t>();
  const int64_t groups = header.kp / header.group;
  const PackFailure bad = pack_each_expert(parts[0].size(0), [&](int64_t e) {
    std::vector<at::Tensor> keep;
    std::vector<const uint8_t*> rows, zero_rows;
    std::vector<const float*> scale_rows;
    std::vector<uint8_t> symmetric;
    for (size_t i = 0; i < parts.size(); ++i) {
      keep.push_back(parts[i].select(0, e).contiguous());
      const uint8_t* q = keep.back().data_ptr<uint8_t>();
      keep.push_back(scales[i].select(0, e).contiguous());
      const float* s = keep.back().data_ptr<float>();
      const uint8_t* z = nullptr;
      if (zeros[i].defined()) {
        keep.push_back(zeros[i].select(0, e).contiguous());
        z = keep.back().data_ptr<uint8_t>();
      } else if (symmetric.empty()) {
        symmetric.assign(size_t(groups), uint8_t(kInt4AffineSymmetricZero));
      }
      const int64_t k = parts[i].size(2);
      for (int64_t r = 0; r < parts[i].size(1); ++r) {
        rows.push_back(q + r * k);
        scale_rows.push_back(s + r * groups);
        zero_rows.push_back(z ? z + r * groups : symmetric.data());
      }
    }
    int4a_pack_matrix(header, rows.data(), scale_rows.data(), zero_rows.data(), e, base + e * header.total_bytes);
  });
  TORCH_CHECK(bad.expert < 0, kOp, ": ", bad.reason, " (", what, ")");
}

}  // namespace

void pack_int4_affine_experts_out(const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                                  const at::Tensor& down, const at::Tensor& gate_up_scale,
                                  const c10::optional<at::Tensor>& up_scale, const at::Tensor& down_scale,
                                  const c10::optional<at::Tensor>& gate_up_zero,
                                  const c10::optional<at::Tensor>& up_zero,
                                  const c10::optional<at::Tensor>& down_zero, int64_t group_size,
                                  const at::Tensor& w13, const at::Tensor& w2) {
  const Int4AffineInputs in = plan_int4_affine(gate_up, up, down, gate_up_scale, up_scale, down_scale, gate_up_zero,
                                               up_zero, down_zero, group_size);
  check_pack_output("ktmoe::pack_int4_affine_experts_out", w13, "w13", in.plan.experts, in.plan.h13.total_bytes);
  check_pack_output("ktmoe::pack_int4_affine_experts_out", w2, "w2", in.plan.experts, in.plan.h2.total_bytes);
  pack_int4_affine_role(in.codes13, in.scales13, in.zeros13, in.plan.h13, w13, up ? "gate/up" : "gate_up");
  pack_int4_affine_role({down}, {in.scale2}, {in.zero2}, in.plan.h2, w2, "down");
}

std::tuple<at::Tensor, at::Tensor> pack_int4_affine_experts(
    const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
    const at::Tensor& gate_up_scale, const c10::optional<at::Tensor>& up_scale, const at::Tensor& down_scale,
    const c10::optional<at::Tensor>& gate_up_zero, const c10::optional<at::Tensor>& up_zero,
    const c10::optional<at::Tensor>& down_zero, int64_t group_size) {
  const PackPlan plan = plan_pack_shapes(kOp, gate_up, up, down, WeightFormat::kINT4A, group_size);
  at::Tensor w13 = empty_weight_bytes({plan.experts, plan.h13.total_bytes});
  at::Tensor w2 = empty_weight_bytes({plan.experts, plan.h2.total_bytes});
  pack_int4_affine_experts_out(gate_up, up, down, gate_up_scale, up_scale, down_scale, gate_up_zero, up_zero,
                               down_zero, group_size, w13, w2);
  return {w13, w2};
}

}  // namespace ktmoe
