// [NOTE] pack_experts with `exact`: a quantized checkpoint's experts -> packed [E, bytes] tensors,
// codes and companions copied as they are (nothing is rounded, no dense float copy is ever made).
//
// The format's row says what comes (kernels/weight_formats.h, ExactFormat): the codes' element type
// (fp8: float8_e4m3fn bytes; int4_affine, mxfp4: uint8, one 4-bit code per byte) and its companion
// inputs, each given per matrix, exact[3 i + 0, 1, 2] = gate_up_<name> (gate_<name> beside separate
// up codes), up_<name>, down_<name>, of shape [E, rows, ceil(k / g)] (one value per row and k-group
// of g = the header's group inputs):
//   fp8          scale: fp32
//   int4_affine  scale: fp32 | bf16 | fp16 (widened exactly); zero: integers 0..16 or None (z = 8)
//   mxfp4        scale: uint8 E8M0 bytes
// This file checks them generically from the row (element types, devices, shapes, integer ranges
// before narrowing to bytes) and calls the row's decoder per expert matrix (kernels/pack_fp8.cpp,
// pack_int4_affine.cpp, pack_mxfp4.cpp), which refuses the values its format cannot hold (NaN bytes,
// non-finite scales, codes > 15, the E8M0 NaN 0xff) naming expert, row and column.
#include "ops/pack_exact.h"

#include <array>
#include <string>

#include "ops/pack_each_expert.h"

namespace ktmoe {
namespace {

constexpr const char* kSlotNames[] = {"gate_up", "up", "down"};

// The ElementTypes of an ATen dtype (uint8 is both a byte and an integer).
uint32_t element_types(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kElemF32;
    case at::kBFloat16: return kElemBF16;
    case at::kHalf: return kElemF16;
    case at::kByte: return kElemU8 | kElemInteger;
    case at::kFloat8_e4m3fn: return kElemE4m3;
    default: return at::isIntegralType(t, /*includeBool=*/false) ? kElemInteger : 0;
  }
}

// "float32, bfloat16 or float16", "uint8", "an integer tensor".
std::string describe(uint32_t accepted) {
  if (accepted & kElemInteger) return "an integer tensor";
  const std::vector<std::string> names = element_type_names(accepted);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// The op's name of input `in` in slot (gate_up / up / down): gate_up_scale, or gate_scale beside separate up codes.
std::string input_name(const ExactInput& in, int slot, bool separate_up) {
  return std::string(slot == 0 && separate_up ? "gate" : kSlotNames[slot]) + "_" + in.name;
}

// "[gate_up_scale, up_scale, down_scale, gate_up_zero, ...]": the layout of `exact` for format x.
std::string exact_layout(const ExactFormat& x) {
  std::string s;
  for (int i = 0; i < x.num_inputs; ++i)
    for (int slot = 0; slot < 3; ++slot) s += (s.empty() ? "" : ", ") + input_name(x.inputs[i], slot, false);
  return "[" + s + "]";
}

void check_codes(const char* op, const ExactFormat& x, const at::Tensor& t, const char* name) {
  TORCH_CHECK(element_types(t.scalar_type()) & x.codes, op, ": ", name, " must be ", describe(x.codes), " (",
              x.codes_what, "), got ", t.scalar_type(), "; dense float weights are packed by pack_experts with an "
              "empty exact");
}

// One companion tensor t of codes w [E, rows, k]: its element type, device, shape and range -> its storage.
at::Tensor checked_input(const char* op, const ExactInput& in, const std::string& name, const at::Tensor& t,
                         const at::Tensor& w, int64_t group) {
  const std::string what = *in.what ? std::string(" (") + in.what +
                                          (in.max_value >= 0 ? " 0.." + std::to_string(in.max_value) : "") + ")"
                                    : "";
  TORCH_CHECK(element_types(t.scalar_type()) & in.accepted, op, ": ", name, " must be ", describe(in.accepted), what,
              ", got ", t.scalar_type());
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
  const int64_t groups = (w.size(2) + group - 1) / group;
  TORCH_CHECK(t.dim() == 3 && t.size(0) == w.size(0) && t.size(1) == w.size(1) && t.size(2) == groups, op, ": ",
              name, " must be [", w.size(0), ", ", w.size(1), ", ", groups, "] (one per row and k-group of ", group,
              " inputs), got ", t.sizes());
  if (in.max_value >= 0 && t.numel() > 0) {  // before narrowing: a wider integer would wrap
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi <= in.max_value, op, ": ", name, " holds ", lo < 0 ? lo : hi, ": ", in.what,
                " must be in [0, ", in.max_value, "]", in.range_note);
  }
  return t.to(in.storage == ExactStorage::kF32 ? at::kFloat : at::kByte);  // exact (widening, or checked bytes)
}

// Packs every expert of one role: rows of expert e from codes[p] ([E, r_p, k] bytes) in order, with each input's
// rows from inputs[i][p] ([E, r_p, groups] in its storage; undefined: None, every value the input's none_value).
void pack_exact_role(const char* op, const ExactFormat& x, const std::vector<at::Tensor>& codes,
                     const std::vector<std::vector<at::Tensor>>& inputs, const PackedMatrixHeader& header,
                     const at::Tensor& out, const char* what) {
  uint8_t* base = out.data_ptr<uint8_t>();
  const int64_t groups = header.kp / header.group;
  const PackFailure bad = pack_each_expert(codes[0].size(0), [&](int64_t e) {
    std::vector<at::Tensor> keep;
    const std::vector<const uint8_t*> code_rows = expert_rows<uint8_t>(codes, e, keep);
    std::array<std::vector<const float*>, kMaxExactInputs> f32;
    std::array<std::vector<const uint8_t*>, kMaxExactInputs> u8;
    std::array<std::vector<uint8_t>, kMaxExactInputs> none;
    ExactRows rows[kMaxExactInputs] = {};
    for (int i = 0; i < x.num_inputs; ++i) {
      const ExactInput& in = x.inputs[i];
      for (size_t p = 0; p < codes.size(); ++p) {
        const at::Tensor& t = inputs[size_t(i)][p];
        if (in.storage == ExactStorage::kF32) {
          const std::vector<const float*> r = expert_rows<float>({t}, e, keep);
          f32[i].insert(f32[i].end(), r.begin(), r.end());
        } else if (t.defined()) {
          const std::vector<const uint8_t*> r = expert_rows<uint8_t>({t}, e, keep);
          u8[i].insert(u8[i].end(), r.begin(), r.end());
        } else {  // None: every row reads none_value
          if (none[i].empty()) none[i].assign(size_t(groups), uint8_t(in.none_value));
          u8[i].insert(u8[i].end(), size_t(codes[p].size(1)), none[i].data());
        }
      }
      rows[i] = {in.storage == ExactStorage::kF32 ? f32[i].data() : nullptr,
                 in.storage == ExactStorage::kU8 ? u8[i].data() : nullptr};
    }
    x.pack(header, code_rows.data(), rows, e, base + e * header.total_bytes);
  });
  TORCH_CHECK(bad.expert < 0, op, ": ", bad.reason, " (", what, ")", x.refusal);
}

}  // namespace

std::vector<ExactSlots> check_exact(const char* op, const WeightFormatTraits& row, const at::Tensor& gate_up,
                                    const c10::optional<at::Tensor>& up, const at::Tensor& down,
                                    const std::vector<c10::optional<at::Tensor>>& exact, int64_t group) {
  TORCH_CHECK(row.exact, op, ": weight_format '", row.name, "' packs dense weights only, so exact must be empty "
              "(got ", exact.size(), " tensors); a checkpoint's exact codes are packed by ", exact_format_names());
  const ExactFormat& x = *row.exact;
  TORCH_CHECK(int64_t(exact.size()) == 3 * x.num_inputs, op, ": weight_format '", row.name, "' takes exact = ",
              exact_layout(x), " (", 3 * x.num_inputs, " tensors, None where absent), got ", exact.size());
  const bool separate = up.has_value();
  const at::Tensor* codes[3] = {&gate_up, separate ? &*up : nullptr, &down};
  for (int slot = 0; slot < 3; ++slot)
    if (codes[slot]) check_codes(op, x, *codes[slot], slot == 0 && separate ? "gate" : kSlotNames[slot]);
  std::vector<ExactSlots> checked(size_t(x.num_inputs));
  for (int i = 0; i < x.num_inputs; ++i) {
    const ExactInput& in = x.inputs[i];
    for (int slot = 0; slot < 3; ++slot) {
      const c10::optional<at::Tensor>& t = exact[size_t(3 * i + slot)];
      const std::string name = input_name(in, slot, separate);
      if (slot == 1) {
        TORCH_CHECK(separate || !t, op, ": ", name, " without up (separate gate / up codes)");
        TORCH_CHECK(!separate || t || in.none_value >= 0, op, ": up and ", name,
                    " come together (separate gate / up codes)");
      }
      TORCH_CHECK(!codes[slot] || t || in.none_value >= 0, op, ": weight_format '", row.name, "' needs ", name,
                  " (None given)");
      if (t) checked[size_t(i)][size_t(slot)] = checked_input(op, in, name, *t, *codes[slot], group);
    }
  }
  return checked;
}

void pack_exact(const char* op, const PackPlan& plan, const at::Tensor& gate_up, const c10::optional<at::Tensor>& up,
                const at::Tensor& down, const at::Tensor& w13, const at::Tensor& w2) {
  const ExactFormat& x = *plan.row->exact;
  std::vector<at::Tensor> codes13 = {gate_up.view(at::kByte)};
  if (up) codes13.push_back(up->view(at::kByte));
  std::vector<std::vector<at::Tensor>> inputs13, inputs2;
  for (const ExactSlots& slots : plan.exact) {
    inputs13.push_back({slots[0]});
    if (up) inputs13.back().push_back(slots[1]);
    inputs2.push_back({slots[2]});
  }
  pack_exact_role(op, x, codes13, inputs13, plan.h13, w13, up ? "gate/up" : "gate_up");
  pack_exact_role(op, x, {down.view(at::kByte)}, inputs2, plan.h2, w2, "down");
}

}  // namespace ktmoe
