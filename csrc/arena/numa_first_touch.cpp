#include "arena/numa_first_touch.h"

#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace ktmoe {
namespace {

// Parses a /sys cpulist such as "0-3,8,10-11" into a cpu_set_t.
bool parse_cpulist(const std::string& text, cpu_set_t* set) {
  CPU_ZERO(set);
  std::stringstream ss(text);
  std::string range;
  bool any = false;
  while (std::getline(ss, range, ',')) {
    if (range.empty() || range == "\n") continue;
    int lo = 0, hi = 0;
    if (sscanf(range.c_str(), "%d-%d", &lo, &hi) == 2) {
    } else if (sscanf(range.c_str(), "%d", &lo) == 1) {
      hi = lo;
    } else {
      return false;
    }
    for (int c = lo; c <= hi && c < CPU_SETSIZE; ++c) CPU_SET(c, set), any = true;
  }
  return any;
}

}  // namespace

int numa_node_count() {
  std::ifstream f("/sys/devices/system/node/online");
  std::string text;
  if (!(f >> text)) return 1;
  cpu_set_t nodes;  // same list syntax
  if (!parse_cpulist(text, &nodes)) return 1;
  const int n = CPU_COUNT(&nodes);
  return n > 0 ? n : 1;
}

bool first_touch_on_node(void* addr, int64_t bytes, int node, std::string* error) {
  if (node < 0 || numa_node_count() <= 1) return true;
  std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::string text;
  cpu_set_t cpus;
  if (!(f >> text) || !parse_cpulist(text, &cpus)) {
    if (error) *error = "cannot read the CPUs of NUMA node " + std::to_string(node);
    return false;
  }
  bool bound = false;
  std::thread toucher([&] {
    bound = sched_setaffinity(0, sizeof(cpus), &cpus) == 0;
    if (!bound) return;
    const int64_t page = sysconf(_SC_PAGESIZE);
    volatile const char* p = static_cast<const char*>(addr);
    for (int64_t off = 0; off < bytes; off += page) (void)p[off];
  });
  toucher.join();
  if (!bound && error) *error = "cannot bind a thread to NUMA node " + std::to_string(node);
  return bound;
}

}  // namespace ktmoe
