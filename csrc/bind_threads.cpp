// [NOTE] Binds the forward ops' thread count and where it comes from (ops/op_threads.h).
#include "ops/op_threads.h"
#include "python_bindings.h"

namespace ktmoe {

void bind_threads(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("op_threads", &op_threads,
        "threads of the next forward op: KTMOE_NUM_THREADS, else min(torch.get_num_threads(), usable CPUs)");
  m.def("thread_report", [] {
    const OpThreads t = op_threads_report();
    py::dict d;
    d["threads"] = t.threads;
    d["torch_threads"] = t.torch_threads;
    d["usable_cpus"] = t.usable_cpus;
    d["affinity_cpus"] = t.affinity_cpus;
    d["cgroup_cpu_quota"] = t.cgroup_quota;
    d["override"] = t.override_threads;
    d["pool_workers"] = t.pool_workers;
    return d;
  }, "the forward ops' threads and their sources (dict)");
  m.def("cgroup_cpu_quota", &cgroup_quota_for_test, py::arg("cgroup_root"), py::arg("proc_cgroup"),
        "CPUs of quota of the cgroup named by proc_cgroup (the text of /proc/self/cgroup) under cgroup_root; 0: none");
}

}  // namespace ktmoe
