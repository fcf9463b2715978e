// [NOTE] The forward ops' thread count and pool loop (see op_threads.h).
#include "ops/op_threads.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/usable_cpus.h"
#include "common/work_pool.h"

namespace ktmoe {
namespace {

int override_threads() {
  static const int n = [] {
    const char* env = std::getenv("KTMOE_NUM_THREADS");
    const long v = env ? std::strtol(env, nullptr, 10) : 0;
    return v > 0 ? int(std::min<long>(v, 4096)) : 0;
  }();
  return n;
}

}  // namespace

int op_threads() {
  if (const int n = override_threads()) return n;
  return std::max(1, std::min(at::get_num_threads(), usable_cpus()));
}

OpThreads op_threads_report() {
  std::ifstream f("/proc/self/cgroup");
  std::stringstream text;
  text << f.rdbuf();
  return {op_threads(), at::get_num_threads(), usable_cpus(), affinity_cpus(),
          cgroup_cpu_quota("/sys/fs/cgroup", text.str()), override_threads(), pool_workers_started()};
}

ParallelFor pool_loop(int threads) {
  return [threads](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
    pool_parallel_for(threads, n, grain, body);
  };
}

double cgroup_quota_for_test(const std::string& cgroup_root, const std::string& proc_cgroup) {
  return cgroup_cpu_quota(cgroup_root, proc_cgroup);
}

}  // namespace ktmoe
