// [NOTE] A checkpoint's exact codes and companions (pack_experts' `exact` argument), checked against
// the format's row (kernels/weight_formats.h: ExactFormat) and packed by the row's decoder.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "kernels/weight_formats.h"
#include "ops/ops.h"

namespace ktmoe {

// Checks the codes gate_up [E, 2I, H] (or gate with up [E, I, H]) and down [E, H, I] and `exact` (inputs i of
// row.exact as exact[3 i + 0, 1, 2] = gate_up_<name>, up_<name>, down_<name>, None where absent) after the shape
// checks: element types, devices, [E, rows, ceil(k / group)] shapes, integer value ranges. Returns each input's
// tensors in its storage (fp32 or uint8; undefined: None), by input then slot.
std::vector<ExactSlots> check_exact(const char* op, const WeightFormatTraits& row, const at::Tensor& gate_up,
                                    const c10::optional<at::Tensor>& up, const at::Tensor& down,
                                    const std::vector<c10::optional<at::Tensor>>& exact, int64_t group);

// Packs plan's experts (plan.exact from check_exact) into w13 and w2 with the row's decoder.
void pack_exact(const char* op, const PackPlan& plan, const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                const at::Tensor& down, const at::Tensor& w13, const at::Tensor& w2);

}  // namespace ktmoe
