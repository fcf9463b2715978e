// [NOTE] How many CPUs this process may really use: the affinity mask, capped by the cgroup's CPU quota.
//
// A container given 4 CPUs' worth of time on a 64-core host sees 64 cores (nproc counts the affinity mask,
// which a quota leaves alone): 64 threads there run 4 at a time, and each parallel loop waits for the ones
// descheduled. usable_cpus() = min(CPUs in sched_getaffinity, ceil(quota / period)) over the cgroup
// hierarchy of this process (v2 `cpu.max` "QUOTA PERIOD" or "max PERIOD"; v1 `cpu.cfs_quota_us` (-1: none)
// and `cpu.cfs_period_us`), the smallest quota from the process's cgroup up to the hierarchy's root.
// The affinity mask is read on every call (a later sched_setaffinity counts); the quota once per process,
// on first use (a fork inherits it; a quota changed later is not seen).
#pragma once
#include <string>

namespace ktmoe {

// CPUs in this thread's affinity mask (sched_getaffinity), at least 1.
int affinity_cpus();

// The CPU quota, in CPUs (e.g. 1.5), of the cgroup `proc_cgroup` (the text of /proc/self/cgroup) places
// this process in, read under `cgroup_root` (normally /sys/fs/cgroup; v1 controllers in subdirectories,
// v2 at the root or under `unified/`); 0 when no level has a quota. Tests pass fake trees.
double cgroup_cpu_quota(const std::string& cgroup_root, const std::string& proc_cgroup);

// min(affinity_cpus(), ceil(cgroup_cpu_quota of /sys/fs/cgroup and /proc/self/cgroup)), at least 1.
int usable_cpus();

}  // namespace ktmoe
