// [NOTE] The threads of the forward ops (moe_forward, moe_forward_ggml, linear): how many, and the loop
// that runs their phases on the library's work pool (common/work_pool.h, why not ATen's pool).
//
// How many: KTMOE_NUM_THREADS when set (> 0: the one override, read once per process); else
// min(torch.get_num_threads(), usable_cpus()): torch's count, capped by the CPUs this process may really
// use (its affinity mask and cgroup CPU quota, common/usable_cpus.h). Decided per call, never stored.
#pragma once
#include <string>

#include "common/parallel_for.h"

namespace ktmoe {

struct OpThreads {
  int threads;        // what the ops use now
  int torch_threads;  // at::get_num_threads()
  int usable_cpus;    // affinity mask capped by the cgroup quota
  int affinity_cpus;  // CPUs in the affinity mask
  double cgroup_quota;  // CPUs of quota, 0: none
  int override_threads; // KTMOE_NUM_THREADS, 0: unset
  int pool_workers;   // work-pool threads started so far
};

int op_threads();
OpThreads op_threads_report();

// parallel_for(n, grain, body) on the work pool with `threads` threads (the caller one of them).
ParallelFor pool_loop(int threads);

// The cgroup CPU quota read under a given root from a given /proc/self/cgroup text (tests: fake trees).
double cgroup_quota_for_test(const std::string& cgroup_root, const std::string& proc_cgroup);

}  // namespace ktmoe
