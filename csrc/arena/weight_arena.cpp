// [NOTE] WeightArena (see weight_arena.h): allocation, fallback, statistics, the registry of live
// arenas and its fork handler, resident_bytes / evict / prefault over the mapped slices.
#include "arena/weight_arena.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <new>

#include "arena/numa_first_touch.h"
#include "arena/page_cache.h"
#include "common/posix_text.h"

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif
#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif

namespace ktmoe {
namespace {

// Why a name cannot be a file name under dir ("" if it can).
std::string check_name(const std::string& name) {
  if (name.empty()) return "invalid arena name: empty";
  if (name == "." || name == "..") return "invalid arena name '" + name + "'";
  if (name.size() > 200) return "invalid arena name: longer than 200 characters";
  for (char c : name)
    if (c == '/' || c == '\0') return "invalid arena name '" + name + "': contains '/' or NUL";
  return "";
}

// Why dir cannot hold reclaimable file-backed weights ("" if it can).
std::string check_dir(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return errno_text(("directory '" + dir + "'").c_str());
  if (!S_ISDIR(st.st_mode)) return "'" + dir + "' is not a directory";
  struct statfs fs;
  if (statfs(dir.c_str(), &fs) != 0) return errno_text(("statfs '" + dir + "'").c_str());
  const auto type = static_cast<unsigned long>(fs.f_type);
  if (type == TMPFS_MAGIC || type == RAMFS_MAGIC)
    return "'" + dir + "' is on tmpfs/ramfs: its pages are swap-backed, no reclaim benefit";
  if (type == HUGETLBFS_MAGIC)
    return "'" + dir + "' is on hugetlbfs: its pages are never reclaimed";
  return "";
}

// Process-wide statistics; every arena updates them under one lock.
struct ProcessTotals {
  std::mutex mutex;
  ProcessArenaStats stats;
  int64_t next_id = 0;
  std::vector<std::weak_ptr<WeightArena>> arenas;  // creation order
};
ProcessTotals& totals();

// [NOTE] fork: a forked child has one thread. An arena's background prefault
// runs on in the parent only: in the child its std::thread is a stale handle
// (joining it is undefined; glibc may hand its stack to the child's next thread),
// its status would read "running" forever, and a prefaulter lock a parent thread
// held (join, a wait=true run) stays held, so the child's stop and destructor
// could wait forever. The child handler lets every live arena's prefaulter forget
// them (Prefaulter::forget_after_fork); the list's own lock is taken around
// fork() so the child sees the list whole.
void lock_totals_for_fork() { totals().mutex.lock(); }
void unlock_totals_after_fork() { totals().mutex.unlock(); }
void forget_prefaults_in_child() {
  for (const auto& w : totals().arenas)
    if (auto a = w.lock()) a->prefaulter().forget_after_fork();
  totals().mutex.unlock();
}

ProcessTotals& totals() {
  static ProcessTotals* t = [] {
    auto* made = new ProcessTotals();  // never destroyed: arenas may outlive statics
    ::pthread_atfork(lock_totals_for_fork, unlock_totals_after_fork, forget_prefaults_in_child);
    return made;
  }();
  return *t;
}

}  // namespace

std::shared_ptr<WeightArena> WeightArena::open(const std::string& dir, const std::string& name,
                                                   const ArenaOptions& options) {
  std::shared_ptr<WeightArena> arena(new WeightArena(dir, name, options));
  if (!dir.empty()) arena->open_file();
  std::lock_guard<std::mutex> lock(totals().mutex);
  auto& list = totals().arenas;
  list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w.expired(); }), list.end());
  list.push_back(arena);
  return arena;
}

std::vector<std::shared_ptr<WeightArena>> WeightArena::live() {
  std::lock_guard<std::mutex> lock(totals().mutex);
  std::vector<std::shared_ptr<WeightArena>> out;
  for (const auto& w : totals().arenas)
    if (auto a = w.lock()) out.push_back(std::move(a));
  return out;
}

WeightArena::WeightArena(std::string dir, std::string name, const ArenaOptions& options)
    : dir_(std::move(dir)), name_(std::move(name)), options_(options) {
  std::lock_guard<std::mutex> lock(totals().mutex);
  totals().stats.arenas += 1;
  id_ = totals().next_id++;
}

void WeightArena::open_file() {
  open_error_ = check_name(name_);
  if (open_error_.empty()) open_error_ = check_dir(dir_);
  if (!open_error_.empty()) return;
  if (options_.persistent) {
    struct stat st;
    if (::stat(dir_.c_str(), &st) == 0)
      cache_refusal_ = check_trusted(st, "directory '" + dir_ + "'", options_.trust_others);
    if (cache_refusal_.empty() || options_.map_only) return;  // the file comes from begin_build() / open_cached()
  }
  open_unnamed_file();
}

void WeightArena::open_unnamed_file() { file_ = BackingFile::unnamed(dir_, name_, &open_error_); }

std::string WeightArena::cache_refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_refusal_;
}

WeightArena::~WeightArena() {
  prefaulter_.stop();  // a background prefault reads slices that are unmapped below
  if (read_file_) ReaderPool::instance().drop_file(read_file_.get());  // pieces in flight hold their own dup
  mapped_.clear();  // munmap
  anon_.clear();    // free
  file_ = BackingFile();  // close; an unkept temp build file is removed
  std::lock_guard<std::mutex> lock(totals().mutex);
  totals().stats.arenas -= 1;
  totals().stats.allocations -= stats_.allocations;
  totals().stats.file_backed_bytes -= stats_.file_backed_bytes;
  totals().stats.anon_bytes -= stats_.anon_bytes;
}

void* WeightArena::map_slice(int64_t n, std::string* error) {
  const int64_t bytes = round_up_to(n, kSliceAlign);
  const int64_t offset = file_.size();
  // Reserve the blocks first: a full disk fails here, not as SIGBUS on a write fault.
  if (!file_.reserve(offset, bytes, error)) return nullptr;
  MappedSlice slice = MappedSlice::map(file_.fd(), offset, bytes, MappedSlice::Mode::kShared, options_.hugepage, error);
  if (!slice.addr()) {
    file_.resize(offset);
    return nullptr;
  }
  void* addr = slice.addr();
  mapped_.push_back(std::move(slice));
  if (options_.numa_node >= 0) first_touch_on_node(addr, bytes, options_.numa_node, nullptr);
  return addr;
}

void* WeightArena::alloc_anonymous(int64_t n) {
  anon_.reserve(anon_.size() + 1);  // the push below cannot throw and leak the memory
  // from 2 MiB up its own mapping, on huge pages unless they are off (its own either way: a heap range may carry
  // the advice of whatever held it before); below that, or when mmap fails, the heap
  void* p = n >= kHugePageBytes ? map_huge_pages(n, options_.hugepage) : nullptr;
  const int64_t mapped = p ? n : 0;
  if (!p) p = std::aligned_alloc(kAnonAlign, static_cast<size_t>(round_up_to(n, kAnonAlign)));
  if (!p) throw std::bad_alloc();
  anon_.emplace_back(p, AnonDelete{mapped});
  return p;
}

void WeightArena::record_fallback(const std::string& reason) {
  stats_.fallbacks += 1;
  stats_.fallback_reasons.push_back(reason);
  std::lock_guard<std::mutex> lock(totals().mutex);
  auto& t = totals().stats;
  t.fallbacks += 1;
  for (const auto& r : t.fallback_reasons)
    if (r == reason) return;
  t.fallback_reasons.push_back(reason);
}

void* WeightArena::alloc(int64_t n, bool* file_backed) {
  if (n <= 0) n = 1;
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = nullptr;
  if (!anonymous_mode()) {
    std::string error = open_error_;
    if (file_.valid() && !read_only_) p = map_slice(n, &error);
    else if (error.empty()) error = read_only_ ? "the cache file is read-only" : "no cache file is being built";
    if (!p) record_fallback("arena '" + name_ + "': " + error + "; using anonymous memory");
  }
  const bool in_file = p != nullptr;
  if (!p) p = alloc_anonymous(n);
  if (file_backed) *file_backed = in_file;
  count_allocation(n, in_file);
  return p;
}

void WeightArena::count_allocation(int64_t n, bool in_file) {
  stats_.allocations += 1;
  (in_file ? stats_.file_backed_bytes : stats_.anon_bytes) += n;
  std::lock_guard<std::mutex> total_lock(totals().mutex);
  totals().stats.allocations += 1;
  (in_file ? totals().stats.file_backed_bytes : totals().stats.anon_bytes) += n;
}

int64_t WeightArena::file_offset_locked(const void* p) const {
  for (const MappedSlice& s : mapped_)
    if (s.contains(p))
      return s.offset() + int64_t(static_cast<const char*>(p) - static_cast<const char*>(s.addr()));
  return -1;
}

bool WeightArena::writeback(bool wait, std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  return read_only_ || file_.writeback(wait, error);
}

std::string WeightArena::warn_once() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (warned_ || stats_.fallback_reasons.empty()) return "";
  warned_ = true;
  return stats_.fallback_reasons.front();
}

int64_t WeightArena::file_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_.size();
}

ArenaStats WeightArena::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<FileSpan> WeightArena::mapped_spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FileSpan> spans;
  for (const MappedSlice& s : mapped_) spans.push_back({s.addr(), s.bytes(), s.offset()});
  return spans;
}

int64_t WeightArena::resident_bytes() const {
  int64_t anon = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    anon = stats_.anon_bytes;
  }
  int64_t resident = 0;
  for (const FileSpan& s : mapped_spans()) resident += mincore_resident(s.addr, s.bytes);  // mapped until destruction
  return resident + anon;
}

bool WeightArena::evict(std::string* error) {
  if (!file_.valid()) return true;
  if (!writeback(/*wait=*/true, error)) return false;
  for (const FileSpan& s : mapped_spans()) {
    if (::madvise(s.addr, static_cast<size_t>(s.bytes), MADV_DONTNEED) != 0) {
      if (error) *error = errno_text("madvise(MADV_DONTNEED)");
      return false;
    }
  }
  if (int rc = ::posix_fadvise(file_.fd(), 0, 0, POSIX_FADV_DONTNEED); rc != 0) {
    errno = rc;
    if (error) *error = errno_text("posix_fadvise(POSIX_FADV_DONTNEED)");
    return false;
  }
  return true;
}

bool WeightArena::prefault(bool wait, std::string* error, bool map_only) {
  if (!file_.valid()) {
    prefaulter_.join();
    return true;
  }
  // the file stays open (and the same) while slices are mapped
  std::shared_ptr<const ReadFile> file = read_file(error);  // the pool's handle; the fd stays open while mapped
  if (!file) return false;
  return prefaulter_.run(mapped_spans(), std::move(file), wait, error, map_only);
}

std::shared_ptr<WeightArena> WeightArena::holding(const void* p, int64_t bytes) {
  for (auto& arena : live()) {  // (not under totals' lock: an arena's lock is taken before it elsewhere)
    std::lock_guard<std::mutex> lock(arena->mutex_);
    for (const MappedSlice& s : arena->mapped_)
      if (s.contains(p) && s.contains(static_cast<const char*>(p) + bytes - 1)) return std::move(arena);
  }
  return nullptr;
}

std::shared_ptr<const ReadFile> WeightArena::read_file_locked(std::string* error) {
  if (!file_.valid()) {
    if (error) *error = "arena '" + name_ + "' has no file";
    return nullptr;
  }
  if (!read_file_) read_file_ = ReadFile::dup_of(file_.fd(), error);
  return read_file_;
}

std::shared_ptr<const ReadFile> WeightArena::read_file(std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  return read_file_locked(error);
}

std::shared_ptr<const ReadFile> WeightArena::file_range(const void* p, int64_t bytes, int64_t* offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t at = file_offset_locked(p);
  if (at < 0 || bytes <= 0 || file_offset_locked(static_cast<const char*>(p) + bytes - 1) != at + bytes - 1)
    return nullptr;  // not mapped here, or across two slices
  *offset = at;
  return read_file_locked(nullptr);
}

ProcessArenaStats WeightArena::process_stats() {
  std::lock_guard<std::mutex> lock(totals().mutex);
  return totals().stats;
}

}  // namespace ktmoe
