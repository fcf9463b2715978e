// [NOTE] usable_cpus(): the affinity mask and the cgroup CPU quota (see usable_cpus.h).
#include "common/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

namespace ktmoe {
namespace {

// The first line of `path`, or "" when it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// The quota in CPUs of the one cgroup directory `dir`, 0 when it has none (or no such files).
double quota_of_dir(const std::string& dir, bool v2) {
  if (v2) {  // "max 100000" or "200000 100000"
    std::istringstream in(first_line(dir + "/cpu.max"));
    std::string quota;
    double period = 0;
    if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
    const double q = std::strtod(quota.c_str(), nullptr);
    return q > 0 ? q / period : 0;
  }
  const std::string quota = first_line(dir + "/cpu.cfs_quota_us"), period = first_line(dir + "/cpu.cfs_period_us");
  const double q = std::strtod(quota.c_str(), nullptr), p = std::strtod(period.c_str(), nullptr);
  return q > 0 && p > 0 ? q / p : 0;
}

// The smallest quota from mount + path up to mount (levels without the files count as none).
double smallest_quota(const std::string& mount, std::string path, bool v2) {
  double best = 0;
  while (true) {
    const double q = quota_of_dir(mount + path, v2);
    if (q > 0 && (best == 0 || q < best)) best = q;
    if (path.empty() || path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == std::string::npos || slash == 0 ? std::string() : path.substr(0, slash);
  }
  return best;
}

}  // namespace

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

double cgroup_cpu_quota(const std::string& cgroup_root, const std::string& proc_cgroup) {
  double best = 0;
  auto take = [&](double q) {
    if (q > 0 && (best == 0 || q < best)) best = q;
  };
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {  // "ID:CONTROLLERS:PATH"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {  // v2: the root, or unified/ beside v1 controllers (hybrid)
      take(smallest_quota(cgroup_root, path, true));
      take(smallest_quota(cgroup_root + "/unified", path, true));
      continue;
    }
    std::vector<std::string> names;
    std::istringstream split(controllers);
    for (std::string c; std::getline(split, c, ',');) names.push_back(c);
    if (std::find(names.begin(), names.end(), "cpu") == names.end()) continue;
    take(smallest_quota(cgroup_root + "/" + controllers, path, false));  // "cpu,cpuacct" or "cpu"
    if (controllers != "cpu") take(smallest_quota(cgroup_root + "/cpu", path, false));
  }
  return best;
}

int usable_cpus() {
  static const int quota_cpus = [] {  // 0: no quota
    std::ifstream f("/proc/self/cgroup");
    std::stringstream text;
    text << f.rdbuf();
    const double quota = cgroup_cpu_quota("/sys/fs/cgroup", text.str());
    return quota > 0 ? std::max(1, int(std::ceil(quota - 1e-9))) : 0;
  }();
  const int affinity = affinity_cpus();
  return quota_cpus > 0 ? std::min(affinity, quota_cpus) : affinity;
}

}  // namespace ktmoe
