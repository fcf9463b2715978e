// [NOTE] WeightArena: the allocator behind every packed expert weight; its statistics and
// the process's list of live arenas.
//
// One arena per (layer, NUMA part). Two modes:
//   * anonymous (dir empty): an alloc of 2 MiB or more is its own 2 MiB-aligned
//     private mapping with MADV_HUGEPAGE (common/huge_pages.h; options.hugepage);
//     smaller ones, with hugepage off or when that mmap fails, aligned_alloc(64, n):
//     the plain heap. No file, no copy;
//   * file-backed (dir given): one backing file under dir, created and unlinked
//     at open (no crash leaves GiB-sized files behind). Each alloc reserves a
//     2 MiB-aligned, 2 MiB-rounded range of the file with fallocate (a full disk
//     is an error here, never a SIGBUS later) and maps it MAP_SHARED at a
//     2 MiB-aligned address, with MADV_RANDOM (no read-around on a cold refault)
//     and, optionally, MADV_HUGEPAGE. Written once at load, read-only after:
//     clean page cache the kernel can drop and refault without swap.
// Any failure in file-backed mode (missing or unwritable dir, tmpfs/hugetlbfs
// dir, invalid name, no space, mmap failure) falls back to an anonymous
// allocation, counts the fallback with its reason and returns file_backed=false;
// the first fallback of an arena is also reported by warn_once().
//
// NUMA: with numa_node >= 0 on a multi-node host, a new slice is first-touched
// from a thread bound to that node's CPUs (the kernel ignores mbind on shared
// file mappings; page-cache pages land on the node of the first faulting
// thread). One node: a no-op.
//
// The other jobs, each in its own file:
//   * kept_file.h: with options.persistent, the file is a kept cache file
//     `<dir>/<name>.ktmoe`, built atomically or mapped copy-on-write when valid,
//     or refused (trust); cache_protocol.h runs them under the lock;
//   * prefaulter.h: warming the file's slices (read, map, first CPU read), in the
//     background on request; prefault() starts it over the arena's slices;
//   * page_cache.h: mincore and read() helpers (resident_bytes, evict's check);
//   * reader_pool.h: reads with depth; holding() and file_range() turn a mapped range into
//     (the file, its offset) for it, read_file() is the pool's own handle of the file.
// Residency here: resident_bytes() (mincore), evict() (drop the file's pages).
//
// Parts: BackingFile (backing_file.h) owns the file (create, reserve, write
// back, keep atomically); MappedSlice (mapped_slice.h) owns each mapping;
// numa_first_touch.h the placement.
// Lifetime: the arena owns its slices until destruction (munmap / free, close).
// Tensors that view arena memory hold a shared_ptr to it (ops layer). live()
// lists the arenas still alive (memory_report), without keeping any.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arena/backing_file.h"
#include "arena/cache_file.h"
#include "arena/mapped_slice.h"
#include "arena/prefaulter.h"
#include "arena/reader_pool.h"
#include "common/huge_pages.h"
#include "common/parallel_for.h"

namespace ktmoe {

struct ArenaStats {
  int64_t allocations = 0;
  int64_t file_backed_bytes = 0;  // bytes of the mapped slices (2 MiB rounded)
  int64_t anon_bytes = 0;         // bytes of anonymous allocations (requested sizes)
  int64_t fallbacks = 0;
  std::vector<std::string> fallback_reasons;  // one per fallback, in order
};

// Process-wide totals: the ArenaStats fields summed over live arenas, except
// fallbacks (since process start) and fallback_reasons (distinct, first seen first).
struct ProcessArenaStats : ArenaStats {
  int64_t arenas = 0;  // live arenas
};

struct ArenaOptions {
  bool hugepage = true;    // MADV_HUGEPAGE on file-backed slices and on anonymous allocations of 2 MiB and more
  int numa_node = -1;      // first-touch node; -1: none
  bool persistent = false; // file from begin_build()/open_cached() (kept_file.h), not an unnamed one
  bool trust_others = false; // accept cache files/dirs of other users or writable by others
  bool map_only = false;   // persistent, and never creates a file: no build, no unnamed file on a refusal
};

// Checks the mapped tensors' contents (the caller's format); "" or why not (kept_file.h's open_cached).
using ContentCheck = std::function<std::string(const std::vector<void*>& tensors)>;

class WeightArena {
 public:
  static constexpr int64_t kSliceAlign = MappedSlice::kAlign;  // 2 MiB
  static constexpr int64_t kAnonAlign = 64;

  // dir empty: anonymous mode. Otherwise tries to create the backing file
  // `<dir>/<name>.ktmoe` (unlinked at once); on failure the arena is still
  // usable and every alloc falls back to anonymous memory with the reason.
  static std::shared_ptr<WeightArena> open(const std::string& dir, const std::string& name,
                                           const ArenaOptions& options = {});
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  // Thread-safe. Returns memory of at least n bytes, 64-byte aligned (2 MiB
  // aligned when file-backed, or anonymous and n >= 2 MiB with options.hugepage). File-backed memory reads as zero until written;
  // anonymous memory is uninitialised (packers write every byte). Throws
  // std::bad_alloc only if even the anonymous fallback fails.
  void* alloc(int64_t n, bool* file_backed);

  // Pushes the file's dirty pages to disk (sync_file_range) so they become clean,
  // reclaimable page cache; wait=false only starts the writeback. Packing more
  // than RAM (or a cgroup limit) must do this as it goes. No-op when anonymous.
  bool writeback(bool wait, std::string* error);

  // Bytes of the arena currently in RAM: mincore over the mapped slices plus every
  // anonymous allocation (anonymous memory counts as resident). Thread-safe.
  int64_t resident_bytes() const;

  // Drops the file's pages from memory: writeback (wait), MADV_DONTNEED on every
  // mapped slice (unmaps the pages from this process), then
  // posix_fadvise(POSIX_FADV_DONTNEED) (frees the now clean, unmapped page
  // cache). The data stays in the file and refaults on the next read (major
  // faults). For tests and benchmarks of cold starts. No-op when anonymous.
  // On Linux 6.18 / ext4 (tests/test_residency.py) fadvise alone cannot drop pages
  // that are still mapped, and dirty pages must be clean first; MADV_PAGEOUT would
  // reclaim through the LRU (slower, may skip pages): fadvise is deterministic.
  bool evict(std::string* error);

  // Warms the file's slices (prefaulter.h; map_only: MADV_POPULATE_READ alone); wait=false on
  // the prefaulter's background thread. No-op when no file is open.
  bool prefault(bool wait, std::string* error, bool map_only = false);
  Prefaulter& prefaulter() { return prefaulter_; }  // its status, progress, join and stop

  // The live arena whose mapped slices hold [p, p + bytes) whole, or nullptr (anonymous memory, another
  // mapping, a range across slices). Thread-safe; scans the live arenas (tens: microseconds).
  static std::shared_ptr<WeightArena> holding(const void* p, int64_t bytes);
  // The file behind [p, p + bytes) when it lies in one mapped slice: the pool's handle of the file and
  // *offset, the range's offset in it; nullptr otherwise (or when the file cannot be dup'd).
  std::shared_ptr<const ReadFile> file_range(const void* p, int64_t bytes, int64_t* offset);
  // The reader pool's handle of the backing file (its own dup, made once per file), nullptr with
  // *error when there is no file or dup fails.
  std::shared_ptr<const ReadFile> read_file(std::string* error);

  // Why this arena keeps and maps no cache file ("" if it may; kept_file.h).
  std::string cache_refusal() const;
  bool read_only() const { return read_only_; }  // a kept file is mapped: nothing more is allocated in it

  // Reason of the first fallback, once; empty afterwards or if none.
  std::string warn_once();

  bool file_mode() const { return file_.valid(); }   // backing file open
  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }
  const ArenaOptions& options() const { return options_; }
  std::string open_error() const { return open_error_; }  // why file mode is off
  int64_t file_bytes() const;                              // bytes reserved in the file
  ArenaStats stats() const;

  static ProcessArenaStats process_stats();
  // Every live arena, oldest first (a weak list: it keeps none alive).
  static std::vector<std::shared_ptr<WeightArena>> live();
  int64_t id() const { return id_; }  // creation order in this process (live()'s order)

 private:
  // The kept file's job (kept_file.cpp) works on the file and the slices.
  friend bool begin_build(WeightArena& arena, std::string* error);
  friend bool commit_build(WeightArena& arena, const CacheKey& key, const std::vector<const void*>& tensors,
                           const ParallelFor& parallel_for, std::string* error);
  friend void abort_build(WeightArena& arena);
  friend std::string open_cached(WeightArena& arena, const CacheKey& expect, const CacheKeyCheck& check_key,
                                 const ContentCheck& check, bool verify_data, const ParallelFor& parallel_for,
                                 std::vector<void*>* tensors);
  friend void refuse_cache(WeightArena& arena, const std::string& reason);

  WeightArena(std::string dir, std::string name, const ArenaOptions& options);
  void open_file();
  void open_unnamed_file();  // file_ = an unnamed file, or open_error_
  std::shared_ptr<const ReadFile> read_file_locked(std::string* error);  // mutex_ held
  void* map_slice(int64_t n, std::string* error);  // a new kShared slice at the file's end
  void count_allocation(int64_t n, bool in_file);  // stats_ and process totals; mutex_ held
  int64_t file_offset_locked(const void* p) const;  // -1: not in a mapped slice
  void* alloc_anonymous(int64_t n);
  void record_fallback(const std::string& reason);
  std::vector<FileSpan> mapped_spans() const;  // snapshot of the file-backed slices
  bool anonymous_mode() const { return dir_.empty(); }
  bool holds_memory() const { return !mapped_.empty() || !anon_.empty(); }

  struct AnonDelete {
    int64_t mapped = 0;  // bytes of a map_huge_pages mapping; 0: aligned_alloc'd
    void operator()(void* p) const { mapped ? unmap_huge_pages(p, mapped) : std::free(p); }
  };

  const std::string dir_, name_;
  const ArenaOptions options_;
  int64_t id_ = 0;
  BackingFile file_;        // the file behind the slices (unnamed, a temp build, or a kept cache file)
  std::shared_ptr<const ReadFile> read_file_;  // the reader pool's dup of file_'s fd, made on first use (file_
                                               // only ever goes from none to one file: it stays right)
  bool read_only_ = false; // a kept file: mapped copy-on-write, never written
  std::string open_error_;
  std::string cache_refusal_;  // why no cache file is kept or mapped ("" if one may be)
  mutable std::mutex mutex_;
  std::vector<MappedSlice> mapped_;                       // file-backed slices (munmap by RAII)
  std::vector<std::unique_ptr<void, AnonDelete>> anon_;  // anonymous allocations
  ArenaStats stats_;
  bool warned_ = false;
  Prefaulter prefaulter_;  // stopped by the destructor before the slices are unmapped
};

}  // namespace ktmoe
