// [NOTE] Torch-free tests of csrc/arena: anonymous and file-backed allocation (statistics,
// fallback, the process registry), commit then reopen of a kept file, refusals (missing,
// foreign, truncated, stale key, symlink, untrusted directory, refuse_cache), and the
// prefaulter (wait, background, stop). Built and run by tests/test_native_arena.py:
// `test_arena DIR` works under DIR (a directory on a real filesystem, not tmpfs); one line
// per check and a final "N passed, M failed" (the check macros of tests/native/check.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../native/check.h"
#include "arena/cache_file.h"
#include "arena/kept_file.h"
#include "arena/page_cache.h"
#include "arena/weight_arena.h"

using namespace ktmoe;
using namespace ktmoe_test;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

bool aligned(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(a) == 0; }

void fill(void* p, int64_t n, unsigned seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (int64_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
}

bool filled(const void* p, int64_t n, unsigned seed) {
  std::vector<unsigned char> want(static_cast<size_t>(n));
  fill(want.data(), n, seed);
  return std::memcmp(p, want.data(), static_cast<size_t>(n)) == 0;
}

const ParallelFor kSerial = [](int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& f) {
  if (begin < end) f(begin, end);
};

ArenaOptions persistent() {
  ArenaOptions o;
  o.persistent = true;
  return o;
}

CacheKey key_of(const std::string& key) { return CacheKey{key, {{3, 1000}, {2, 5 * kMiB / 2}}}; }
const CacheKeyCheck kSameKey = [](const std::string& stored) { return stored == "key-1" ? "" : "stale: key"; };

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

void test_anonymous() {
  const int64_t before = WeightArena::process_stats().arenas;
  auto arena = WeightArena::open("", "anon");
  bool file_backed = true;
  void* small = arena->alloc(100, &file_backed);
  CHECK(small && !file_backed && aligned(small, WeightArena::kAnonAlign), "anonymous: a small alloc is 64-byte aligned heap");
  void* big = arena->alloc(3 * kMiB, &file_backed);
  CHECK(big && !file_backed && aligned(big, kHugePageBytes), "anonymous: 3 MiB is its own 2 MiB-aligned mapping");
  fill(big, 3 * kMiB, 1);
  const ArenaStats s = arena->stats();
  CHECK(s.allocations == 2 && s.anon_bytes == 100 + 3 * kMiB && s.file_backed_bytes == 0 && s.fallbacks == 0,
        strf("anonymous: stats count both (%lld allocations, %lld anon bytes)", (long long)s.allocations,
             (long long)s.anon_bytes));
  CHECK(!arena->file_mode() && arena->warn_once().empty(), "anonymous: no file, no warning");
  CHECK(arena->resident_bytes() == s.anon_bytes, "anonymous: resident_bytes counts anonymous memory");
  CHECK(WeightArena::process_stats().arenas == before + 1, "registry: process_stats counts the live arena");
  bool listed = false;
  for (const auto& a : WeightArena::live()) listed |= a.get() == arena.get();
  CHECK(listed, "registry: live() lists the arena");
  arena.reset();
  CHECK(WeightArena::process_stats().arenas == before, "registry: a freed arena leaves the totals");
}

void test_file_backed(const std::string& dir) {
  auto arena = WeightArena::open(dir, "unnamed");
  CHECK(arena->file_mode() && arena->open_error().empty(), "file-backed: an unnamed file opens in " + dir);
  bool file_backed = false;
  void* p = arena->alloc(kMiB + 1, &file_backed);
  CHECK(p && file_backed && aligned(p, WeightArena::kSliceAlign), "file-backed: a 2 MiB-aligned slice of the file");
  CHECK(arena->file_bytes() == 2 * kMiB && arena->stats().file_backed_bytes == kMiB + 1,
        "file-backed: the slice is 2 MiB in the file, its request in the stats");
  fill(p, kMiB + 1, 2);
  std::string error;
  CHECK(arena->writeback(true, &error), "file-backed: writeback " + error);
  CHECK(arena->resident_bytes() >= kMiB, "file-backed: written pages are resident");
  CHECK(arena->evict(&error) && arena->resident_bytes() < kMiB, "file-backed: evict drops the pages " + error);
  CHECK(filled(p, kMiB + 1, 2), "file-backed: evicted data refaults from the file");
  bool none_left = true;
  for (const std::string& n : cache_temp_files(dir, "")) none_left &= n.find("unnamed") == std::string::npos;
  CHECK(none_left && ::access(cache_file_path(dir, "unnamed").c_str(), F_OK) != 0,
        "file-backed: the unnamed file has no name in the directory");

  auto missing = WeightArena::open(dir + "/missing", "fallback");
  void* q = missing->alloc(4096, &file_backed);
  const std::string warning = missing->warn_once();
  CHECK(q && !file_backed && missing->stats().fallbacks == 1 && warning.find("No such file") != std::string::npos,
        "fallback: a missing directory falls back to anonymous memory with the reason: " + warning);
  missing->alloc(4096, &file_backed);
  CHECK(missing->warn_once().empty() && missing->stats().fallbacks == 2, "fallback: counted each time, warned once");
  CHECK(!WeightArena::open(dir, "a/b")->file_mode(), "fallback: a name with '/' opens no file");
}

// Builds `<dir>/<name>.ktmoe` holding key_of("key-1"): two tensors, filled with seeds 3 and 4.
bool build_kept(const std::string& dir, const std::string& name) {
  auto arena = WeightArena::open(dir, name, persistent());
  std::string error;
  if (!begin_build(*arena, &error)) return false;
  const CacheKey key = key_of("key-1");
  std::vector<const void*> tensors;
  unsigned seed = 3;
  for (const auto& [rows, cols] : key.shapes) {
    bool file_backed = false;
    void* t = arena->alloc(rows * cols, &file_backed);
    fill(t, rows * cols, seed++);
    tensors.push_back(t);
  }
  const bool ok = commit_build(*arena, key, tensors, kSerial, &error);
  return ok && arena->read_only() && filled(tensors[0], 3000, 3);
}

std::string reopen(const std::string& dir, const std::string& name, std::vector<void*>* tensors,
                   std::shared_ptr<WeightArena>* keep = nullptr, const CacheKeyCheck& check_key = kSameKey) {
  auto arena = WeightArena::open(dir, name, persistent());
  std::vector<void*> mapped;
  const std::string reason = open_cached(*arena, key_of("key-1"), check_key, nullptr, true, kSerial,
                                         tensors ? tensors : &mapped);
  if (keep) *keep = arena;
  return reason;
}

void test_commit_then_reopen(const std::string& dir) {
  CHECK(build_kept(dir, "kept"), "kept file: begin, allocate, commit");
  CHECK(::access(cache_file_path(dir, "kept").c_str(), F_OK) == 0 && cache_temp_files(dir, "kept").empty(),
        "kept file: renamed to its name, no temp file left");
  std::vector<void*> tensors;
  std::shared_ptr<WeightArena> arena;
  const std::string reason = reopen(dir, "kept", &tensors, &arena);
  CHECK(reason.empty() && tensors.size() == 2 && filled(tensors[0], 3000, 3) && filled(tensors[1], 5 * kMiB, 4),
        "kept file: a new arena maps the same bytes (data checksums verified) " + reason);
  CHECK(arena && arena->read_only() && arena->stats().file_backed_bytes == 3000 + 5 * kMiB,
        "kept file: mapped read-only, counted as file-backed");
  bool file_backed = true;
  arena->alloc(4096, &file_backed);
  CHECK(!file_backed, "kept file: nothing more is allocated in it");
  static_cast<unsigned char*>(tensors[0])[0] ^= 0xff;  // copy on write: stays in this process
  std::vector<void*> again;
  std::shared_ptr<WeightArena> second;
  CHECK(reopen(dir, "kept", &again, &second).empty() && filled(again[0], 3000, 3),
        "kept file: a write never reaches the file");

  auto aborted = WeightArena::open(dir, "aborted", persistent());
  std::string error;
  CHECK(begin_build(*aborted, &error) && cache_temp_files(dir, "aborted").size() == 1, "build: a temp file while building");
  abort_build(*aborted);
  CHECK(cache_temp_files(dir, "aborted").empty() && ::access(cache_file_path(dir, "aborted").c_str(), F_OK) != 0,
        "build: abort removes the temp file and keeps nothing");
}

void write_file(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    (void)!::write(fd, bytes.data(), bytes.size());
    ::close(fd);
  }
}

void test_refusals(const std::string& dir) {
  CHECK(reopen(dir, "nothing", nullptr) == "missing", "refusal: a missing file is 'missing'");
  write_file(cache_file_path(dir, "foreign"), std::string(8192, 'x'));
  CHECK(starts_with(reopen(dir, "foreign", nullptr), "foreign:"), "refusal: a foreign file");
  CHECK(build_kept(dir, "short"), "refusal: a kept file to truncate");
  CHECK(::truncate(cache_file_path(dir, "short").c_str(), 3 * kMiB) == 0, "refusal: truncated");
  CHECK(starts_with(reopen(dir, "short", nullptr), "truncated:"), "refusal: a truncated file");
  CHECK(build_kept(dir, "stale"), "refusal: a kept file with another key");
  const CacheKeyCheck other = [](const std::string&) { return std::string("stale: another key"); };
  CHECK(reopen(dir, "stale", nullptr, nullptr, other) == "stale: another key", "refusal: the caller's key check");
  CHECK(::symlink(cache_file_path(dir, "stale").c_str(), cache_file_path(dir, "link").c_str()) == 0, "symlink made");
  CHECK(starts_with(reopen(dir, "link", nullptr), "not a regular file"), "refusal: a symlink is never followed");

  auto refused = WeightArena::open(dir, "refused", persistent());
  refuse_cache(*refused, "lock refused: test");
  std::string error;
  CHECK(refused->cache_refusal() == "lock refused: test" && refused->file_mode() && !begin_build(*refused, &error) &&
            error == "lock refused: test",
        "refusal: refuse_cache leaves an unnamed file and answers every cache call with the reason");

  const std::string open_dir = dir + "/writable_by_others";
  ::mkdir(open_dir.c_str(), 0777);
  ::chmod(open_dir.c_str(), 0777);
  auto untrusted = WeightArena::open(open_dir, "layer", persistent());
  CHECK(starts_with(untrusted->cache_refusal(), "untrusted:") && untrusted->file_mode(),
        "refusal: a directory writable by others is untrusted: " + untrusted->cache_refusal());
  ArenaOptions trusting = persistent();
  trusting.trust_others = true;
  CHECK(WeightArena::open(open_dir, "layer", trusting)->cache_refusal().empty(), "trust_others accepts it");
}

void test_prefaulter(const std::string& dir) {
  auto arena = WeightArena::open(dir, "prefault");
  bool file_backed = false;
  const int64_t n = 130 * kMiB;  // three 64 MiB steps
  void* p = arena->alloc(n, &file_backed);
  fill(p, 4096, 5);
  std::string error;
  CHECK(file_backed && arena->evict(&error) && arena->resident_bytes() < kMiB, "prefault: an evicted file " + error);
  const bool ok = arena->prefault(true, &error);
  const std::string status = arena->prefaulter().status();
  CHECK(ok && (status == "populate_read" || status == "willneed"), "prefault: wait=true completes: " + status + error);
  CHECK(arena->prefaulter().done_bytes() == arena->file_bytes() && arena->resident_bytes() >= n,
        "prefault: every slice went through and is resident");
  CHECK(arena->evict(&error) && arena->prefault(false, &error), "prefault: wait=false starts");
  arena->prefaulter().join();
  CHECK(arena->resident_bytes() >= n && arena->prefaulter().status() != "running", "prefault: joined background run");
  CHECK(arena->evict(&error) && arena->prefault(false, &error), "prefault: another background run");
  arena->prefaulter().stop();
  const std::string stopped = arena->prefaulter().status();
  CHECK(stopped == "error: stopped" || stopped == "populate_read" || stopped == "willneed",
        "prefault: stop ends it at a step: " + stopped);
  CHECK(filled(p, 4096, 5), "prefault: the data is unchanged");
  auto anon = WeightArena::open("", "anon-prefault");
  CHECK(anon->prefault(true, &error) && anon->prefaulter().status().empty(), "prefault: a no-op when anonymous");
  arena->prefault(false, &error);
  arena.reset();  // the destructor stops and joins a running prefault before unmapping
  CHECK(true, "prefault: an arena freed while its prefault runs");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_arena DIR (a scratch directory, not on tmpfs)\n");
    return 2;
  }
  const std::string dir = argv[1];
  test_anonymous();
  test_file_backed(dir);
  test_commit_then_reopen(dir);
  test_refusals(dir);
  test_prefaulter(dir);
  return finish();
}
