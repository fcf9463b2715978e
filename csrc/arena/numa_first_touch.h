// NUMA first-touch placement for shared file mappings (torch-free, no libnuma).
//
// The kernel ignores mbind()/numa_tonode_memory() on MAP_SHARED file mappings:
// a page-cache page lands on the node of the thread that first faults it. So a
// part's pages are placed by reading them once from a thread bound to the CPUs
// of its node. With a single node (or an unknown node) this does nothing.
#pragma once
#include <cstdint>
#include <string>

namespace ktmoe {

// Number of online NUMA nodes (1 when /sys does not say).
int numa_node_count();

// Faults every page of [addr, addr + bytes) by reading it from a thread bound
// to node's CPUs. Returns false (and sets *error) if the node's CPUs cannot be
// read or bound; the memory stays usable either way.
bool first_touch_on_node(void* addr, int64_t bytes, int node, std::string* error);

}  // namespace ktmoe
