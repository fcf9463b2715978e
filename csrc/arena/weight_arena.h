// [NOTE] KtWeightArena: the allocator behind every packed expert weight.
//
// One arena per (layer, NUMA part). Two modes:
//   * anonymous (dir empty): each alloc is aligned_alloc(64, n): the plain heap
//     path, zero overhead;
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
// Lifetime: the arena owns its slices until destruction (munmap / free, close).
// Tensors that view arena memory hold a shared_ptr to it (ops layer).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ktmoe {

struct ArenaStats {
  int64_t allocations = 0;
  int64_t file_backed_bytes = 0;  // bytes of the mapped slices (2 MiB rounded)
  int64_t anon_bytes = 0;         // bytes of anonymous allocations (requested sizes)
  int64_t fallbacks = 0;
  std::vector<std::string> fallback_reasons;  // one per fallback, in order
};

// Process-wide totals over all arenas ever opened (arenas: currently alive).
struct ProcessArenaStats {
  int64_t arenas = 0;
  int64_t allocations = 0;
  int64_t file_backed_bytes = 0;  // alive arenas only
  int64_t anon_bytes = 0;         // alive arenas only
  int64_t fallbacks = 0;          // since process start
  std::vector<std::string> fallback_reasons;  // distinct reasons, first seen first
};

struct ArenaOptions {
  bool hugepage = true;    // MADV_HUGEPAGE on file-backed slices
  int numa_node = -1;      // first-touch node; -1: none
};

class KtWeightArena {
 public:
  static constexpr int64_t kSliceAlign = int64_t(2) << 20;  // 2 MiB
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
  // aligned when file-backed). File-backed memory reads as zero until written;
  // anonymous memory is uninitialised (packers write every byte). Throws
  // std::bad_alloc only if even the anonymous fallback fails.
  void* alloc(int64_t n, bool* file_backed);

  // Pushes the file's dirty pages to disk (sync_file_range) so they become clean,
  // reclaimable page cache; wait=false only starts the writeback. Packing more
  // than RAM (or a cgroup limit) must do this as it goes. No-op when anonymous.
  bool writeback(bool wait, std::string* error);

  // Reason of the first fallback, once; empty afterwards or if none.
  std::string warn_once();

  bool file_mode() const { return fd_ >= 0; }   // backing file open
  bool anonymous_mode() const { return dir_.empty(); }
  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }
  std::string open_error() const { return open_error_; }  // why file mode is off
  int64_t file_bytes() const;                              // bytes reserved in the file
  ArenaStats stats() const;

  static ProcessArenaStats process_stats();

 private:
  KtWeightArena(std::string dir, std::string name, const ArenaOptions& options);
  void open_file();
  void* map_slice(int64_t n, std::string* error);
  void* alloc_anonymous(int64_t n);
  void record_fallback(const std::string& reason);

  struct Slice {
    void* addr;
    int64_t bytes;
    bool mapped;  // munmap vs free
  };

  const std::string dir_, name_;
  const ArenaOptions options_;
  int fd_ = -1;
  std::string open_error_;
  int64_t file_size_ = 0;
  mutable std::mutex mutex_;
  std::vector<Slice> slices_;
  ArenaStats stats_;
  bool warned_ = false;
};

}  // namespace ktmoe
