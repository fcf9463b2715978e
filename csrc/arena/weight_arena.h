// [NOTE] KtWeightArena: the allocator behind every packed expert weight.
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
// Persistence (weight_arena_cache.cpp), with options.persistent: no unnamed
// file at open; instead begin_build() creates `<dir>/<name>.ktmoe.tmp.<pid>`,
// allocations go into it, and commit_build() writes the cache header last
// (with a checksum of each tensor's data), fsyncs, renames it to
// `<name>.ktmoe` and fsyncs the directory (abort_build() or the destructor
// remove an uncommitted temp file). open_cached() instead validates an existing
// `<name>.ktmoe` against a CacheKey (tensor shapes + opaque key bytes the caller
// judges; the arena knows nothing of MoE), runs the caller's check of the mapped
// contents and, on request, the data checksums, and maps its tensors. The
// protocol around them (lock between processes, stale temp files, which to call
// when) is load_or_build_cache (cache_protocol.h).
// Trust: a persistent arena never follows a symlink or opens a non-regular
// file, and refuses a directory or cache file owned by another user or writable
// by others (unless options.trust_others); a refused directory, or
// refuse_cache(reason), turns the arena into an unnamed-file arena: still
// file-backed, nothing kept, every cache call answers with the reason.
// options.map_only (the cache's read-only "map" policy) creates no file at
// all, not even an unnamed one: it maps a kept file or nothing, and follows a
// symlink to it (it writes nothing a link could redirect; a Hugging Face hub
// snapshot's files are links into its blobs/, confined by the packed-directory loader).
// Kept files are mapped MAP_PRIVATE, PROT_READ|PROT_WRITE: reads share the
// clean page cache, a write into a tensor copies that page privately (it
// becomes anonymous memory) and never reaches the file. Truncating the file
// under a live mapping makes reads past the new end raise SIGBUS (mmap's rule).
//
// Residency (weight_arena_residency.cpp): resident_bytes() (mincore), evict()
// (drop the file's pages from memory), prefault() (warm the file, optionally
// on one background I/O thread that stop_prefault() and the destructor stop and join).
//
// Parts: BackingFile (backing_file.h) owns the file (create, reserve, write
// back, keep atomically); MappedSlice (mapped_slice.h) owns each mapping;
// cache_file.h the kept file's header, names and safe opening; cache_lock.h the
// lock; cache_protocol.h validate-or-build;
// numa_first_touch.h the placement; weight_arena_residency.cpp the residency
// helpers (mincore, evict, prefault); weight_arena_cache.cpp persistence.
// Lifetime: the arena owns its slices until destruction (munmap / free, close).
// Tensors that view arena memory hold a shared_ptr to it (ops layer). live()
// lists the arenas still alive (memory_report), without keeping any.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "arena/backing_file.h"
#include "arena/cache_file.h"
#include "arena/mapped_slice.h"
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
  bool persistent = false; // file from begin_build()/open_cached(), not an unnamed one
  bool trust_others = false; // accept cache files/dirs of other users or writable by others
  bool map_only = false;   // persistent, and never creates a file: no build, no unnamed file on a refusal
};

// Bytes of the file at `path` in the page cache (mincore over a read-only map);
// -1 with *error when it cannot be opened or mapped.
int64_t file_resident_bytes(const std::string& path, std::string* error);
// Reads the whole file at `path` with read() (a regular file, no symlink): into the
// page cache with its large-folio readahead, every page read once by the copy (see
// prefault). Returns the file's size, or -1 with *error.
int64_t read_file_through_cache(const std::string& path, std::string* error);

class KtWeightArena {
 public:
  static constexpr int64_t kSliceAlign = MappedSlice::kAlign;  // 2 MiB
  static constexpr int64_t kAnonAlign = 64;

  // dir empty: anonymous mode. Otherwise tries to create the backing file
  // `<dir>/<name>.ktmoe` (unlinked at once); on failure the arena is still
  // usable and every alloc falls back to anonymous memory with the reason.
  static std::shared_ptr<KtWeightArena> open(const std::string& dir, const std::string& name,
                                             const ArenaOptions& options = {});
  ~KtWeightArena();
  KtWeightArena(const KtWeightArena&) = delete;
  KtWeightArena& operator=(const KtWeightArena&) = delete;

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
  bool evict(std::string* error);

  // Reads the file's slices into memory so that the first forward runs at steady
  // speed: read() for pages not yet cached (readahead; the copy reads every
  // page), one load per 64-byte line for cached ones (a VM may charge the first
  // read of a page the disk filled: weight_arena_residency.cpp), then
  // MADV_POPULATE_READ (Linux >= 5.14, synchronous, reports errors) maps them,
  // falling back to MADV_WILLNEED where the kernel lacks it. wait=false runs it on one
  // background thread (in 64 MiB steps; the destructor stops and joins it) and
  // returns at once; a call first joins a previous background prefault.
  // Returns false with *error on failure (wait=true only); a background error
  // is kept in prefault_status(). No-op when anonymous.
  bool prefault(bool wait, std::string* error);
  void join_prefault();          // waits for a background prefault, if any
  // Stops a running prefault (background, or wait=true on another thread) at its next
  // 64 MiB step and waits for it (its status: "error: stopped"); later prefaults run.
  void stop_prefault();
  // "" (never run), "running", "populate_read", "willneed" (method that
  // completed) or "error: ..." (what failed).
  std::string prefault_status() const;
  // In the child of fork() only (its one thread, from the atfork handler): forgets a
  // prefault thread that runs in the parent only, and the prefault locks a parent
  // thread may hold; a prefault that was running reads "error: stopped".
  void forget_prefault_after_fork();
  // Bytes of the slices the current (or last) prefault has gone through: its progress.
  int64_t prefault_done_bytes() const { return prefault_done_.load(); }

  // Persistent arenas only (see the note). begin_build: false with *error when
  // the temp file cannot be made (allocations then fall back with that reason).
  bool begin_build(std::string* error);
  // Writes the header for the tensors at `tensors` (key.shapes[i] bytes each,
  // all in the file) with their data checksums and the key bytes, fsyncs,
  // renames over the final name, fsyncs the directory. The slices become private
  // copy-on-write mappings of the kept file. False with *error (temp file removed).
  bool commit_build(const CacheKey& key, const std::vector<const void*>& tensors,
                    const ParallelFor& parallel_for, std::string* error);
  void abort_build();  // removes an uncommitted temp file; no-op otherwise
  // Checks the mapped tensors' contents (the caller's format); "" or why not.
  using ContentCheck = std::function<std::string(const std::vector<void*>& tensors)>;
  // "" and *tensors set when `<dir>/<name>.ktmoe` is a trusted regular file
  // holding expect.shapes, check_key accepts its key, check accepts its contents
  // and, with verify_data, every tensor's data checksum matches; else why not
  // ("missing", "stale: ...", "corrupt: ...", "untrusted: ...", "not a regular
  // file: ..."), nothing mapped.
  std::string open_cached(const CacheKey& expect, const CacheKeyCheck& check_key, const ContentCheck& check,
                          bool verify_data, const ParallelFor& parallel_for, std::vector<void*>* tensors);
  // Gives up the cache for this arena (e.g. its lock path is a planted symlink):
  // allocations go to an unnamed file; later cache calls answer `reason`.
  void refuse_cache(const std::string& reason);
  // Why this arena keeps and maps no cache file ("" if it may).
  std::string cache_refusal() const;
  bool read_only() const { return read_only_; }

  // Reason of the first fallback, once; empty afterwards or if none.
  std::string warn_once();

  bool file_mode() const { return file_.valid(); }   // backing file open
  bool anonymous_mode() const { return dir_.empty(); }
  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }
  const ArenaOptions& options() const { return options_; }
  std::string open_error() const { return open_error_; }  // why file mode is off
  int64_t file_bytes() const;                              // bytes reserved in the file
  ArenaStats stats() const;

  static ProcessArenaStats process_stats();
  // Every live arena, oldest first (a weak list: it keeps none alive).
  static std::vector<std::shared_ptr<KtWeightArena>> live();
  int64_t id() const { return id_; }  // creation order in this process (live()'s order)

 private:
  KtWeightArena(std::string dir, std::string name, const ArenaOptions& options);
  void open_file();
  void open_unnamed_file();  // file_ = an unnamed file, or open_error_
  void* map_slice(int64_t n, std::string* error);  // a new kShared slice at the file's end
  void count_allocation(int64_t n, bool in_file);  // stats_ and process totals; mutex_ held
  int64_t file_offset_locked(const void* p) const;  // -1: not in a mapped slice
  void* alloc_anonymous(int64_t n);
  void record_fallback(const std::string& reason);
  struct Span {
    void* addr;
    int64_t bytes;
    int64_t offset;  // in the file
  };
  std::vector<Span> mapped_spans() const;  // snapshot of the file-backed slices
  void run_prefault(const std::vector<Span>& spans, int fd);

  struct AnonDelete {
    int64_t mapped = 0;  // bytes of a map_huge_pages mapping; 0: aligned_alloc'd
    void operator()(void* p) const { mapped ? unmap_huge_pages(p, mapped) : std::free(p); }
  };
  bool holds_memory() const { return !mapped_.empty() || !anon_.empty(); }

  const std::string dir_, name_;
  const ArenaOptions options_;
  int64_t id_ = 0;
  BackingFile file_;        // the file behind the slices (unnamed, a temp build, or a kept cache file)
  bool read_only_ = false; // a kept file: mapped copy-on-write, never written
  std::string open_error_;
  std::string cache_refusal_;  // why no cache file is kept or mapped ("" if one may be)
  mutable std::mutex mutex_;
  std::vector<MappedSlice> mapped_;                       // file-backed slices (munmap by RAII)
  std::vector<std::unique_ptr<void, AnonDelete>> anon_;  // anonymous allocations
  ArenaStats stats_;
  bool warned_ = false;
  // background prefault (weight_arena_residency.cpp)
  std::mutex prefault_mutex_;        // serialises prefault()/join_prefault()
  std::thread prefault_thread_;
  std::atomic<bool> prefault_stop_{false};
  std::atomic<int64_t> prefault_done_{0};
  mutable std::mutex status_mutex_;
  std::string prefault_status_;
};

}  // namespace ktmoe
