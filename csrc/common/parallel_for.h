// The one way torch-free code runs work on threads: a callback the ATen layer
// fills with at::parallel_for, so torch.set_num_threads governs everything.
#pragma once
#include <cstdint>
#include <functional>

namespace ktmoe {

// parallel_for(n, grain, body): run body(begin, end) over a partition of [0, n).
using ParallelFor =
    std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>&)>;

}  // namespace ktmoe
