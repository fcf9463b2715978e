// Tensors that view arena memory.
//
// A tensor made here holds a shared_ptr to its arena in its deleter, so the
// memory lives exactly as long as any tensor using it, whatever order Python
// drops things in. No op takes an arena: Python allocates outputs with
// WeightArena.empty() and passes them to the out-variant ops.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "arena/weight_arena.h"

namespace ktmoe {

// A uint8 tensor of `sizes` viewing `data` (memory of `arena`); keeps the arena alive.
at::Tensor arena_tensor(const std::shared_ptr<WeightArena>& arena, void* data, at::IntArrayRef sizes);

// A uint8 tensor of `sizes` (row-major, contiguous) in new arena memory.
// Fallbacks are not reported here: the Python side turns the arena's
// warn_once() into a warning.
at::Tensor arena_empty(const std::shared_ptr<WeightArena>& arena, at::IntArrayRef sizes);

}  // namespace ktmoe
