// [NOTE] Residency of a KtWeightArena's backing file: measure, drop, warm.
//
// resident_bytes(): mincore() over every mapped slice (a page counts if it is in
//   the page cache, whether or not this process has it mapped), plus the bytes of
//   anonymous allocations, which are resident by construction (no swap assumed).
// evict(): makes the file's pages leave RAM, as a cold start would find them.
//   On Linux 6.18 / ext4 (checked by tests/test_residency.py) the sequence is
//     sync_file_range(WAIT) -> madvise(MADV_DONTNEED) -> posix_fadvise(DONTNEED):
//   fadvise alone cannot drop pages that are still mapped, and dirty pages must
//   be clean first. MADV_DONTNEED on a MAP_SHARED file mapping only zaps this
//   process's page-table entries; the data stays in the file and refaults on
//   the next touch (a major fault when the page cache no longer has it).
//   MADV_PAGEOUT would also work for pages mapped only by this process, but it
//   reclaims through the LRU (slower, may skip pages); fadvise is deterministic.
// prefault(): warms the file so the first forward runs at steady speed.
//   MADV_POPULATE_READ (Linux >= 5.14) faults every page in synchronously and
//   reports errors (EFAULT/EIO/ENOMEM); where it is missing (EINVAL) falls back
//   to MADV_WILLNEED, which only starts readahead. Background mode: one I/O
//   thread (not a compute thread: it only blocks in madvise), working in 64 MiB
//   steps so that the destructor can stop it promptly; it holds no reference to
//   the arena (the destructor joins it before unmapping), so it never keeps an
//   arena alive, and a process that exits while it runs simply ends it.
//   The caller decides whether warming is wise (torch_ktmoe.layer.KTMoE.warm
//   skips it when the file does not fit in the memory headroom: warming more
//   than RAM would evict the hot set to read cold experts).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "arena/weight_arena.h"
#include "common/posix_text.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace ktmoe {
namespace {

constexpr int64_t kPrefaultStep = int64_t(64) << 20;

int64_t page_size() {
  static const int64_t p = ::sysconf(_SC_PAGESIZE);
  return p;
}

int64_t mincore_resident(void* addr, int64_t bytes) {
  const int64_t page = page_size();
  std::vector<unsigned char> vec(static_cast<size_t>((bytes + page - 1) / page), 0);
  if (::mincore(addr, static_cast<size_t>(bytes), vec.data()) != 0) return 0;
  int64_t resident = 0;
  for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  return resident;
}

}  // namespace

int64_t file_resident_bytes(const std::string& path, std::string* error) {
  const int fd = open_regular_file(path, error);  // no symlink, no FIFO
  if (fd < 0) return -1;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  int64_t resident = 0;
  if (size > 0) {
    void* addr = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      *error = errno_text("mmap");
      resident = -1;
    } else {
      resident = mincore_resident(addr, size);
      ::munmap(addr, static_cast<size_t>(size));
    }
  }
  ::close(fd);
  return resident;
}

std::vector<KtWeightArena::Span> KtWeightArena::mapped_spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Span> spans;
  for (const MappedSlice& s : mapped_) spans.push_back({s.addr(), s.bytes()});
  return spans;
}

int64_t KtWeightArena::resident_bytes() const {
  int64_t anon = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    anon = stats_.anon_bytes;
  }
  int64_t resident = 0;
  for (const Span& s : mapped_spans()) resident += mincore_resident(s.addr, s.bytes);  // mapped until destruction
  return resident + anon;
}

bool KtWeightArena::evict(std::string* error) {
  if (!file_.valid()) return true;
  if (!writeback(/*wait=*/true, error)) return false;
  for (const Span& s : mapped_spans()) {
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

// Prefaults the spans in steps; sets prefault_status_ to the method used or the error.
void KtWeightArena::run_prefault(const std::vector<Span>& spans) {
  int advice = MADV_POPULATE_READ;
  std::string status = "populate_read";
  for (const Span& s : spans) {
    auto* p = static_cast<char*>(s.addr);
    for (int64_t off = 0; off < s.bytes; off += kPrefaultStep) {
      if (prefault_stop_.load()) {
        status = "error: stopped";
        goto done;
      }
      const size_t n = static_cast<size_t>(std::min(kPrefaultStep, s.bytes - off));
      if (::madvise(p + off, n, advice) == 0) continue;
      if (advice == MADV_POPULATE_READ && errno == EINVAL) {  // kernel < 5.14
        advice = MADV_WILLNEED;
        status = "willneed";
        if (::madvise(p + off, n, advice) == 0) continue;
      }
      status = "error: " + errno_text(advice == MADV_WILLNEED ? "madvise(MADV_WILLNEED)"
                                                              : "madvise(MADV_POPULATE_READ)");
      goto done;
    }
  }
done:
  std::lock_guard<std::mutex> lock(status_mutex_);
  prefault_status_ = status;
}

bool KtWeightArena::prefault(bool wait, std::string* error) {
  std::lock_guard<std::mutex> lock(prefault_mutex_);
  if (prefault_thread_.joinable()) prefault_thread_.join();
  if (!file_.valid()) return true;
  {
    std::lock_guard<std::mutex> status_lock(status_mutex_);
    prefault_status_ = "running";
  }
  std::vector<Span> spans = mapped_spans();
  if (!wait) {
    prefault_thread_ = std::thread([this, spans = std::move(spans)] { run_prefault(spans); });
    return true;
  }
  run_prefault(spans);
  const std::string status = prefault_status();
  if (status.rfind("error: ", 0) == 0) {
    if (error) *error = status.substr(7);
    return false;
  }
  return true;
}

void KtWeightArena::join_prefault() {
  std::lock_guard<std::mutex> lock(prefault_mutex_);
  if (prefault_thread_.joinable()) prefault_thread_.join();
}

std::string KtWeightArena::prefault_status() const {
  std::lock_guard<std::mutex> lock(status_mutex_);
  return prefault_status_;
}

}  // namespace ktmoe
