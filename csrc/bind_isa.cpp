// [NOTE] Binds ISA selection and the NUMA node count.
#include "arena/numa_first_touch.h"
#include "ops/isa_dispatch.h"
#include "python_bindings.h"

namespace ktmoe {

void bind_isa(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("set_isa", &set_isa, py::arg("name"), "the ISA of every later op call of the process");
  m.def("set_thread_isa", &set_thread_isa, py::arg("name"),
        "the ISA of this thread's later op calls ('' : the process's); returns the thread's previous choice");
  m.def("active_isa", [] { return std::string(active_isa().name); }, "the ISA of this thread's next op call");
  m.def("available_isas", &available_isas);
  m.def("default_isa", &default_isa);
  m.def("numa_node_count", &numa_node_count);
}

}  // namespace ktmoe
