// [NOTE] The ops side of the persistent packed cache: what a layer part's cache
// file must contain and the tensors it maps to. The arena's file format
// (csrc/arena/cache_file.h) holds tensor entries and opaque key bytes; this file
// defines those bytes for packed experts (PackedCacheKey: weight format, group,
// E/H/I, the part's intermediate range, NUMA part, packed-layout version, source
// fingerprint), judges a stored key against the wanted one field by field
// ("stale: weight format is ..."), and checks every expert's packed header in a
// mapped file; inspection decodes a file's own key and runs the same checks
// (arena/cache_inspect.h does the file side). The atomic build / copy-on-write
// map is the arena's kept file (arena/kept_file.h).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "arena/cache_file.h"
#include "arena/cache_inspect.h"
#include "arena/cache_protocol.h"
#include "arena/weight_arena.h"

namespace ktmoe {

constexpr int64_t kMaxFingerprintBytes = 256;

// What a layer part's cache file must hold (the MoE meaning of the key bytes).
struct PackedCacheKey {
  std::string weight_format;   // a row name of kernels/weight_formats.h
  int64_t group_size = 0;      // as given to pack_experts (0: default)
  int64_t experts = 0, hidden = 0, inter = 0;  // E, H, I of the whole layer
  int64_t inter_lo = 0, inter_hi = 0;          // this part's intermediate columns
  int64_t numa_part = 0;
  uint32_t packed_version = 0;                 // kPackedVersion of the kernels
  std::string fingerprint;                     // <= kMaxFingerprintBytes
  int64_t w13_bytes = 0, w2_bytes = 0;         // packed row sizes (derived)

  std::string to_bytes() const;
  // The key stored in a file; false (and *why) if the bytes are not one.
  static bool from_bytes(const std::string& bytes, PackedCacheKey* key, std::string* why);
  CacheKey arena_key() const;  // key bytes + [E, w13_bytes], [E, w2_bytes]
};

// The key of NUMA part `part` (intermediate columns [inter_lo, inter_hi)) of a
// layer with E experts, hidden H, intermediate I, packed as `weight_format`.
PackedCacheKey packed_cache_key(const std::string& weight_format, int64_t group_size, int64_t experts,
                                int64_t hidden, int64_t inter, int64_t inter_lo, int64_t inter_hi,
                                int64_t numa_part, const std::string& fingerprint);

// One layer part's validate-or-build (arena/cache_protocol.h) with packed
// experts. The load maps (w13, w2) copy-on-write from a valid kept file and
// checks every expert's packed header against the key (a forged field is
// "corrupt: w13 expert e header: <field> ..."; verify_data: the data checksums
// too, reading every byte). The build is `pack` (it packs into the arena and
// returns (w13, w2)), then its commit. `pack` empty: load only.
using PackExperts = std::function<std::pair<at::Tensor, at::Tensor>()>;
struct PackedCacheResult {
  CacheOutcome outcome;
  at::Tensor w13, w2;  // undefined after a miss without a build
};
PackedCacheResult load_or_build_packed_cache(const std::shared_ptr<WeightArena>& arena, const PackedCacheKey& key,
                                             const CacheRequest& request, bool verify_data, const PackExperts& pack,
                                             const CacheLog& log);

// What `inspect` shows of the cache file at `path`: arena/cache_inspect.h's
// inspection (header, validity, residency) with the stored key decoded as a
// packed-experts key. Valid (file.reason "") when the file passes the checks of
// a load against its own key (verify_data: data checksums too).
struct PackedCacheInspection {
  CacheFileInspection file;
  bool key_ok = false;  // the stored key decoded: `key` holds the file's fields
  PackedCacheKey key;
};
PackedCacheInspection inspect_packed_cache_file(const std::string& path, bool verify_data);

}  // namespace ktmoe
