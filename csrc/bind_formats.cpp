// [NOTE] torch_ktmoe._C.weight_formats() and the packed layout constants: the one
// place Python learns which weight formats exist and how their bytes decode.
//
// weight_formats() -> [dict], one per row of kernels/weight_formats.h, in id order:
//   name, id, code_bits, k_run, bits_per_weight, group ("none" | "row" | "chosen"),
//   default_group, scales ("none" | "f32_per_row" | "bf16_per_block_group" |
//   "f32_per_block_group" | "f32_u8_zero_per_block_group"), scale_bytes, activations ("bf16" | "int8"),
//   activation_scale ("none" | "row" | "weight_group": int8 rows' scale per row or per weight group),
//   gemm (the IsaKernels entry), codes ("bf16" | "offset" | "codebook" | "e4m3" | "affine" | "e2m1"), code_offset,
//   codebook (list of ints),
//   accuracy_bound,
//   exact: None (dense weights only) or {"codes": [dtype names], "inputs": [{"name", "dtypes": [dtype names;
//   "integer": any integer type], "optional": bool (None allowed)}, ...]}: pack_experts' `exact` holds per input,
//   in order, gate_up_<name>, up_<name>, down_<name>.
// gated_activations() -> [dict], one per row of kernels/gated_activation.h, in kind order:
//   name, formula, params (names, in the op's order), defaults, models;
// gated_activation_error(name, params) -> "" or the reason the op would refuse them.
// ggml_types() -> [dict], one per row of kernels/ggml/ggml_types.h (every type ggml defines), in id order:
//   id, name, block_elems, block_bytes, decodable (whether this library reads its blocks).
// Module attributes: packed_magic, packed_layout_version (the header's magic and
// version), matrix_roles ({"plain": 0, "gate_up": 1, "down": 2}).
// ops.WEIGHT_FORMATS, unpack.py and the tests' tolerance table read these.
#include "python_bindings.h"

#include <pybind11/stl.h>

#include <iterator>
#include <string>
#include <vector>

#include "kernels/gated_activation.h"
#include "ops/ggml_type.h"
#include "ops/weight_format.h"

namespace py = pybind11;

namespace {

// Python's names of the enums' values, indexed by value.
constexpr const char* kGroupRules[] = {"none", "row", "chosen"};
constexpr const char* kScaleLayouts[] = {"none", "f32_per_row", "bf16_per_block_group", "f32_per_block_group",
                                        "f32_u8_zero_per_block_group", "e8m0_per_block_group"};
constexpr const char* kActivationRows[] = {"bf16", "int8"};
constexpr const char* kActivationScales[] = {"none", "row", "weight_group"};
constexpr const char* kCodeValues[] = {"bf16", "offset", "codebook", "e4m3", "affine", "e2m1"};
static_assert(std::size(kGroupRules) == size_t(ktmoe::GroupRule::kChosen) + 1 &&
                  std::size(kScaleLayouts) == size_t(ktmoe::ScaleLayout::kE8M0PerBlockGroup) + 1 &&
                  std::size(kActivationRows) == size_t(ktmoe::ActivationRows::kInt8) + 1 &&
                  std::size(kActivationScales) == size_t(ktmoe::ActivationScale::kPerWeightGroup) + 1 &&
                  std::size(kCodeValues) == size_t(ktmoe::CodeValue::kE2m1) + 1,
              "a name for every value of the traits' enums");

py::dict row_dict(const ktmoe::WeightFormatTraits& r) {
  py::dict d;
  d["name"] = r.name;
  d["id"] = int(r.id);
  d["code_bits"] = r.code_bits;
  d["k_run"] = r.k_run;
  d["bits_per_weight"] = r.bits_per_weight();
  d["group"] = kGroupRules[int(r.group)];
  d["default_group"] = r.default_group;
  d["scales"] = kScaleLayouts[int(r.scales)];
  d["scale_bytes"] = r.scale_bytes;
  d["activations"] = kActivationRows[int(r.activations)];
  d["activation_scale"] = kActivationScales[int(r.activation_scale)];
  d["gemm"] = r.gemm_name;
  d["codes"] = kCodeValues[int(r.codes)];
  d["code_offset"] = r.code_offset;
  std::vector<int> codebook;
  if (r.codebook) codebook.assign(r.codebook, r.codebook + (1 << r.code_bits));
  d["codebook"] = codebook;
  d["accuracy_bound"] = r.accuracy_bound;
  if (r.exact) {
    py::list inputs;
    for (int i = 0; i < r.exact->num_inputs; ++i) {
      const ktmoe::ExactInput& in = r.exact->inputs[i];
      py::dict input;
      input["name"] = in.name;
      input["dtypes"] = ktmoe::element_type_names(in.accepted);
      input["optional"] = in.none_value >= 0;
      inputs.append(input);
    }
    py::dict exact;
    exact["codes"] = ktmoe::element_type_names(r.exact->codes);
    exact["inputs"] = inputs;
    d["exact"] = exact;
  } else {
    d["exact"] = py::none();
  }
  return d;
}

}  // namespace

namespace ktmoe {

void bind_weight_formats(py::module& m) {
  m.def("weight_formats", [] {
    py::list rows;
    for (int i = 0; i < ktmoe::weight_format_count(); ++i) rows.append(row_dict(ktmoe::weight_format_table()[i]));
    return rows;
  }, "the weight format traits table: one dict per format, in id order");
  m.def("gated_activations", [] {
    int count = 0;
    const ktmoe::GatedActivationRow* rows = ktmoe::gated_activation_rows(&count);
    py::list out;
    for (int i = 0; i < count; ++i) {
      const auto& r = rows[i];
      py::dict d;
      d["name"] = r.name;
      d["formula"] = r.formula;
      d["params"] = std::vector<std::string>(r.param_names, r.param_names + r.num_params);
      d["defaults"] = std::vector<float>(r.defaults, r.defaults + r.num_params);
      d["models"] = r.models;
      out.append(d);
    }
    return out;
  }, "the gated activation table: one dict per row (name, formula, params, defaults, models)");
  m.def("gated_activation_error", [](const std::string& name, const std::vector<double>& params) -> std::string {
    const ktmoe::GatedActivationRow* row = ktmoe::gated_activation_row(name);
    if (row == nullptr) return "unknown gated activation \"" + name + "\"";
    ktmoe::Activation act;
    return ktmoe::make_activation(*row, params.data(), int(params.size()), &act);
  }, "\"\" if the named activation takes these parameters (in its row's order; [] = defaults), else why not");
  m.def("ggml_types", [] {
    int count = 0;
    const ktmoe::GgmlTypeTraits* rows = ktmoe::ggml_type_table(&count);
    py::list out;
    for (int i = 0; i < count; ++i) {
      py::dict d;
      d["id"] = int(rows[i].id);
      d["name"] = rows[i].name;
      d["block_elems"] = rows[i].block_elems;
      d["block_bytes"] = rows[i].block_bytes;
      d["decodable"] = rows[i].decode != nullptr;
      out.append(d);
    }
    return out;
  }, "the GGML type table: one dict per type ggml defines (id, name, block_elems, block_bytes, decodable)");
  m.attr("packed_magic") = ktmoe::kPackedMagic;
  m.attr("packed_layout_version") = ktmoe::kPackedVersion;
  py::dict roles;
  roles["plain"] = int(ktmoe::MatrixRole::kPlain);
  roles["gate_up"] = int(ktmoe::MatrixRole::kGateUp);
  roles["down"] = int(ktmoe::MatrixRole::kDown);
  m.attr("matrix_roles") = roles;
}

}  // namespace ktmoe
