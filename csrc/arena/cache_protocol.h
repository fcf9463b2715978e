// [NOTE] The persistent cache protocol of one arena: validate-or-build its kept
// file `<dir>/<name>.ktmoe` in one call. Torch-free and MoE-free: what a load
// maps and what a build packs are the caller's callbacks (ops/packed_cache.h).
//
// Policies:
//   reuse    lock; remove the temp files of builds that did not finish; map a
//            valid kept file (load) or build and keep a new one;
//   rebuild  lock; remove stale temp files; always build and keep;
//   map      read-only: no lock file, no cleanup, no build, nothing created,
//            written or deleted; a missing or invalid file is the outcome's
//            reason, naming the file.
// The lock (cache_lock.h) is taken unless the arena already refuses the cache
// (an untrusted directory gets no lock file). A lock path that is hostile or
// another user's makes the arena refuse the cache; a lock held past its
// deadline does too, and the outcome then carries a warning. A refused cache
// still builds, into an unnamed file, keeping nothing.
// read_first_max_bytes > 0: a kept file of at most that size is read with
// read() before the load maps it (read_file_through_cache: sequential readahead,
// every page read once), for a warm-on-load that needs every page anyway.
// Log lines (Python logging levels: 20 info, 30 warning) go to `log` as they happen.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "arena/weight_arena.h"

namespace ktmoe {

enum class CachePolicy { kReuse, kRebuild, kMap };
// "reuse" | "rebuild" | "map"; throws std::invalid_argument naming the policies otherwise.
CachePolicy parse_cache_policy(const std::string& name);

struct CacheRequest {
  CachePolicy policy = CachePolicy::kReuse;
  int64_t read_first_max_bytes = 0;  // 0: never read the kept file before mapping it
  double lock_wait_seconds = 5.0;    // cache_lock_wait_seconds() by default at the caller
};

struct CacheOutcome {
  bool hit = false;     // the kept file was mapped
  std::string reason;   // "valid" on a hit, else why it was not mapped (and "; not kept: ..." after a build)
  std::string warning;  // non-empty: tell the user (a lock held past its deadline)
};

// load(): "" when the arena mapped its valid kept file, else why not.
// build(keep): packs into the arena; with keep, commits the build and returns
// "" or why the file was not kept (without keep it returns ""). Empty build:
// load only (a miss is then just the reason). An exception from build removes
// the temp file and propagates.
using CacheLoad = std::function<std::string()>;
using CacheBuild = std::function<std::string(bool keep)>;
using CacheLog = std::function<void(int level, const std::string& text)>;

CacheOutcome load_or_build_cache(WeightArena& arena, const CacheRequest& request, const CacheLoad& load,
                                 const CacheBuild& build, const CacheLog& log);

}  // namespace ktmoe
