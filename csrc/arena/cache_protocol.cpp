// [NOTE] load_or_build_cache (see cache_protocol.h): lock, clean, read first,
// load, else build under the lock; the map policy only loads.
#include "arena/cache_protocol.h"

#include <sys/stat.h>

#include <stdexcept>

#include "arena/cache_file.h"
#include "arena/cache_lock.h"
#include "arena/kept_file.h"
#include "arena/page_cache.h"

namespace ktmoe {
namespace {

constexpr int kInfo = 20, kWarning = 30;

// Reads the kept file once with read() when it is a regular file within the limit (errors: the load says).
void read_first(const WeightArena& arena, int64_t max_bytes) {
  if (max_bytes <= 0 || !arena.cache_refusal().empty() || !arena.open_error().empty()) return;
  const std::string path = cache_file_path(arena.dir(), arena.name());
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > max_bytes) return;
  std::string ignored;
  read_file_through_cache(path, &ignored);
}

// Removes the temp file of an unfinished build however the build ends (a no-op after a commit).
struct AbortUncommitted {
  WeightArena& arena;
  ~AbortUncommitted() { abort_build(arena); }
};

CacheOutcome map_only(WeightArena& arena, const CacheRequest& request, const CacheLoad& load) {
  CacheOutcome out;
  read_first(arena, request.read_first_max_bytes);
  const std::string why = load();
  out.hit = why.empty();
  out.reason = out.hit ? "valid" : "'" + cache_file_path(arena.dir(), arena.name()) + "': " + why;
  return out;
}

}  // namespace

CachePolicy parse_cache_policy(const std::string& name) {
  if (name == "reuse") return CachePolicy::kReuse;
  if (name == "rebuild") return CachePolicy::kRebuild;
  if (name == "map") return CachePolicy::kMap;
  throw std::invalid_argument("cache policy must be 'reuse', 'rebuild' or 'map', got '" + name + "'");
}

CacheOutcome load_or_build_cache(WeightArena& arena, const CacheRequest& request, const CacheLoad& load,
                                 const CacheBuild& build, const CacheLog& log) {
  if (request.policy == CachePolicy::kMap) return map_only(arena, request, load);
  CacheOutcome out;
  // An untrusted directory gets no lock file either: nothing is created under a name there.
  CacheLock lock(arena.dir(), arena.name(), arena.options().trust_others, request.lock_wait_seconds);
  if (arena.cache_refusal().empty()) {
    lock.acquire();
    if (!lock.refused().empty()) refuse_cache(arena, lock.refused());
    if (!lock.busy().empty()) {
      refuse_cache(arena, lock.busy());
      out.warning = "ktmoe cache: " + arena.name() + ": " + lock.busy();
    }
    if (lock.locked())  // builds run under this lock: a temp file of this name is a crash's
      for (const std::string& n : remove_stale_temp_files(arena.dir(), arena.name()))
        log(kInfo, "ktmoe cache: removed " + n + ", left by a build that did not finish");
  }
  const std::string refusal = arena.cache_refusal();
  out.reason = refusal.empty() ? "cache='rebuild'" : refusal;
  if (request.policy == CachePolicy::kReuse && refusal.empty()) {
    read_first(arena, request.read_first_max_bytes);
    out.reason = load();
    if (out.reason.empty()) {
      out.hit = true;
      out.reason = "valid";
      return out;
    }
  }
  if (!build) return out;
  log(kInfo, "ktmoe cache: building " + arena.name() + " in " + arena.dir() + " (" + out.reason + ")");
  std::string error;
  if (refusal.empty() && !begin_build(arena, &error))
    log(kInfo, "ktmoe cache: " + arena.name() + " cannot be kept: " + error);
  {
    AbortUncommitted abort{arena};
    const std::string not_kept = build(refusal.empty() && error.empty());
    if (!not_kept.empty()) {
      log(kWarning, "ktmoe cache: " + arena.name() + " was not kept: " + not_kept);
      error = not_kept;
    }
  }
  if (!error.empty()) out.reason += "; not kept: " + error;
  return out;
}

}  // namespace ktmoe
