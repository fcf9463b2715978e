// [NOTE] The ops side of the persistent packed cache: what a layer part's cache
// file must contain (CacheKey with the packed shapes the kernels expect) and the
// tensors it maps to. The file format itself is csrc/arena/cache_file.h; the
// atomic build / read-only map is KtWeightArena (weight_arena_cache.cpp).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "arena/cache_file.h"
#include "arena/weight_arena.h"

namespace ktmoe {

// The key of NUMA part `part` (intermediate columns [inter_lo, inter_hi)) of a
// layer with E experts, hidden H, intermediate I, packed as `weight_format`.
CacheKey packed_cache_key(const std::string& weight_format, int64_t group_size, int64_t experts,
                          int64_t hidden, int64_t inter, int64_t inter_lo, int64_t inter_hi,
                          int64_t numa_part, const std::string& fingerprint);

// "" and (w13, w2) viewing the arena's valid cache file, or why it is not usable.
// Always checks every expert's packed header against the key (a forged field is
// "corrupt: w13 expert e header: <field> ..."); verify_data also compares the
// data checksums (reads every byte).
std::string load_packed_cache(const std::shared_ptr<KtWeightArena>& arena, const CacheKey& key,
                              bool verify_data, at::Tensor* w13, at::Tensor* w2);

// "" if the cache file at `path` is valid as it describes itself (its header's
// own key: what `inspect` checks, with the same checks as a load), else why not.
std::string verify_packed_cache_file(const std::string& path, bool verify_data);

// Commits a build whose w13/w2 were packed into the arena; "" or the error.
std::string commit_packed_cache(const std::shared_ptr<KtWeightArena>& arena, const CacheKey& key,
                                const at::Tensor& w13, const at::Tensor& w2);

}  // namespace ktmoe
