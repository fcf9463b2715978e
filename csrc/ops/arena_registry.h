// Arenas reachable from ops by a string key, and tensors that view arena memory.
//
// Ops take an arena as its key (a plain string argument: opcheck and
// torch.compile handle strings, not handles). A tensor allocated here holds a
// shared_ptr to its arena in its deleter, so the memory lives exactly as long
// as any tensor using it, whatever order Python drops things in.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arena/weight_arena.h"

namespace ktmoe {

// Registers a new arena and returns it with its key set.
std::shared_ptr<KtWeightArena> open_registered_arena(const std::string& dir, const std::string& name,
                                                     const ArenaOptions& options, std::string* key);

// The live arena with this key; throws a clear error if it is gone or unknown.
std::shared_ptr<KtWeightArena> find_arena(const std::string& key);

// Every live registered arena with its key, in key order (thread-safe snapshot:
// memory_report's residency figures).
std::vector<std::pair<std::string, std::shared_ptr<KtWeightArena>>> live_arenas();

// A uint8 tensor of `sizes` (row-major, contiguous) in arena memory. An empty
// key means the default CPU allocator. Fallbacks are not reported here: the
// Python side turns the arena's warn_once() into a warning.
at::Tensor arena_empty(const std::string& key, at::IntArrayRef sizes);

// A uint8 tensor of `sizes` viewing `data` (memory of `arena`); keeps the arena alive.
at::Tensor arena_tensor(const std::shared_ptr<KtWeightArena>& arena, void* data, at::IntArrayRef sizes);
at::Tensor arena_empty(const std::shared_ptr<KtWeightArena>& arena, at::IntArrayRef sizes);

}  // namespace ktmoe
