// [NOTE] Binds the packed sizes a caller allocates before pack_experts_out.
#include <pybind11/stl.h>

#include <vector>

#include "ops/ops.h"
#include "python_bindings.h"

namespace ktmoe {

void bind_packing(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("packed_sizes", [](const at::Tensor& gate_up, const c10::optional<at::Tensor>& up, const at::Tensor& down,
                           const std::string& weight_format, int64_t group_size,
                           const std::vector<c10::optional<at::Tensor>>& exact) {
    const PackPlan plan = plan_pack(gate_up, up, down, weight_format, group_size, exact);
    return py::make_tuple(py::make_tuple(plan.experts, plan.h13.total_bytes),
                          py::make_tuple(plan.experts, plan.h2.total_bytes));
  }, py::arg("gate_up"), py::arg("up"), py::arg("down"), py::arg("weight_format"), py::arg("group_size") = 0,
  py::arg("exact") = std::vector<c10::optional<at::Tensor>>(),
  "((E, B13), (E, B2)): the shapes pack_experts_out needs, after the same argument checks");
  m.def("packed_matrix_bytes", &packed_matrix_bytes, py::arg("weight_format"), py::arg("role"),
        py::arg("n"), py::arg("k"), py::arg("group_size") = 0);
}

}  // namespace ktmoe
