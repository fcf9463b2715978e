// The one way torch-free code runs work on threads: a callback the ATen layer fills, with the work pool
// for the forward ops (ops/op_threads.h: torch.set_num_threads capped by the usable CPUs) or with
// at::parallel_for for load-time work.
#pragma once
#include <cstdint>
#include <functional>

namespace ktmoe {

// parallel_for(n, grain, body): run body(begin, end) over a partition of [0, n), in chunks of about `grain`
// (the work pool hands chunks of exactly `grain` out dynamically; at::parallel_for splits statically).
// Bodies must write disjoint outputs per index, so the result does not depend on the partition.
using ParallelFor =
    std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>&)>;

}  // namespace ktmoe
