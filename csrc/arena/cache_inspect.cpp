// [NOTE] inspect_cache_file: header, load checks and residency of one cache file (see cache_inspect.h).
#include "arena/cache_inspect.h"

#include <unistd.h>

#include <cstring>

#include "arena/kept_file.h"
#include "arena/page_cache.h"

namespace ktmoe {
namespace {

// Reads and checks the header of the file at path; "" or why not.
std::string read_header(const std::string& path, CacheHeader* h, int64_t* file_bytes) {
  std::memset(h, 0, sizeof(*h));
  std::string reason;
  const int fd = open_regular_file(path, &reason);
  if (fd < 0) return reason;
  reason = read_cache_header(fd, h, file_bytes);
  ::close(fd);
  return reason.empty() ? check_cache_header(*h, *file_bytes) : reason;
}

// The file's directory and arena name (`<dir>/<name>.ktmoe`).
std::pair<std::string, std::string> arena_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t n = std::strlen(kCacheSuffix);
  if (name.size() > n && name.compare(name.size() - n, n, kCacheSuffix) == 0) name.resize(name.size() - n);
  return {dir, name};
}

// The checks of a load, run on a throwaway arena that trusts the file's owner.
std::string check_as_load(const std::string& path, const CacheLoadChecks& checks, bool verify_data,
                          const ParallelFor& parallel_for) {
  const auto [dir, name] = arena_of(path);
  ArenaOptions options;
  options.persistent = true;
  options.trust_others = true;
  options.hugepage = false;
  std::vector<void*> mapped;
  return open_cached(*WeightArena::open(dir, name, options), checks.expect, checks.check_key, checks.check_content,
                     verify_data, parallel_for, &mapped);
}

}  // namespace

CacheFileInspection inspect_cache_file(const std::string& path, bool verify_data, const CacheKeyReader& read_key,
                                       const ParallelFor& parallel_for) {
  CacheFileInspection out;
  CacheHeader h;
  out.reason = read_header(path, &h, &out.file_bytes);
  if (out.reason.empty()) {
    out.header_ok = true;
    for (uint32_t t = 0; t < h.tensor_count; ++t) out.shapes.emplace_back(h.tensors[t].rows, h.tensors[t].cols);
    out.stored_key = stored_key(h);
    CacheLoadChecks checks;
    out.reason = read_key(out.stored_key, &checks);
    if (out.reason.empty()) out.reason = check_as_load(path, checks, verify_data, parallel_for);
  }
  std::string error;
  out.resident_bytes = file_resident_bytes(path, &error);  // after the checks, which fault pages in
  return out;
}

}  // namespace ktmoe
