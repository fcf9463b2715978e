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
// prefault(): warms the file so the first forward runs at steady speed. Three
//   things must happen before then, and MADV_POPULATE_READ alone does only the
//   first two: (1) the data is read into the page cache, (2) this process's page
//   tables map it, (3) the CPU has read the pages once. (3) is not free on a VM
//   whose free memory the host takes back (virtio-balloon free page reporting,
//   as on the Firecracker hosts this was measured on): the first CPU access to a
//   guest page that the disk filled by DMA costs about 2-6 us in the host,
//   serialised (two threads are no faster). Faults and MADV_POPULATE_READ only
//   map pages: after them, 768 MiB of experts were all in 2 MiB folios, all
//   PMD-mapped, no fault left, and the first full read of them still took
//   95-814 ms of CPU against 31-37 ms once read (decode: the first ~20-40 passes
//   2-15x slower). A load per 4 KiB page removed most of it, not all (first read
//   34-57 ms of CPU); a load per 64-byte line, or read()'s copy, all of it.
//   So, per 64 MiB step:
//     * pages not all in the page cache: read() them through a small buffer.
//       Sequential reads get the file's large-folio readahead, asynchronous and
//       ahead of the copy, and the copy is the CPU's first read: its cost
//       overlaps the next window's I/O instead of following all of it;
//     * already cached (e.g. faulted in, unread, by the cache check of a load):
//       one load per 64-byte line through the mapping, no copy;
//   then MADV_POPULATE_READ (Linux >= 5.14) maps them (minor faults, 2 MiB at a
//   time where the folios allow) and reports errors (EFAULT/EIO/ENOMEM); where it
//   is missing (EINVAL) falls back to MADV_WILLNEED. Background mode: one I/O
//   thread (not a compute thread: it blocks in read/madvise and streams pages),
//   working in 64 MiB steps so that stop_prefault() and the destructor stop it promptly; it
//   holds no reference to the arena (the destructor joins it before unmapping),
//   so it never keeps an arena alive, and a process that exits while it runs
//   simply ends it. A child forked while it runs has no such thread: the arena
//   forgets it there (status "error: stopped"; the fork note in weight_arena.cpp).
//   The caller decides whether warming is wise (torch_ktmoe.layer.KTMoE.warm
//   skips it when the file does not fit in the memory headroom: warming more
//   than RAM would evict the hot set to read cold experts).
// read_file_through_cache(): the same read() pass over a whole file by path,
//   before anything maps it (the read-first step of cache_protocol.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "arena/weight_arena.h"
#include "common/posix_text.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace ktmoe {
namespace {

constexpr int64_t kPrefaultStep = int64_t(64) << 20;
constexpr int64_t kReadChunk = int64_t(2) << 20;  // read() size: stays in the L2/L3, one syscall per 2 MiB

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

// Reads [offset, offset + bytes) of fd with read() into buf (contents discarded): through
// the page cache, with its readahead. Stops early at end of file. False with *error.
bool read_through(int fd, int64_t offset, int64_t bytes, char* buf, int64_t buf_bytes, std::string* error) {
  for (int64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min(buf_bytes, bytes - done));
    const ssize_t got = ::pread(fd, buf, n, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      *error = errno_text("pread");
      return false;
    }
    if (got == 0) break;  // end of file
    done += got;
  }
  return true;
}

// One load per 64-byte line: the CPU's first read of pages that nothing copied yet (a
// load per 4 KiB page is not always enough: see the note). Streams at memory speed.
void read_lines(const char* p, int64_t bytes) {
  uint64_t sink = 0;
  for (int64_t off = 0; off + 8 <= bytes; off += 64) sink ^= *reinterpret_cast<const volatile uint64_t*>(p + off);
  asm volatile("" : : "r"(sink));
}

bool all_resident(void* addr, int64_t bytes) { return mincore_resident(addr, bytes) >= bytes; }

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
  for (const MappedSlice& s : mapped_) spans.push_back({s.addr(), s.bytes(), s.offset()});
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

int64_t read_file_through_cache(const std::string& path, std::string* error) {
  const int fd = open_regular_file(path, error);  // no symlink, no FIFO
  if (fd < 0) return -1;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  std::vector<char> buf(static_cast<size_t>(kReadChunk));
  const bool ok = size >= 0 && read_through(fd, 0, size, buf.data(), kReadChunk, error);
  if (size < 0) *error = errno_text("lseek");
  ::close(fd);
  return ok ? static_cast<int64_t>(size) : -1;
}

// Prefaults the spans in steps (see the note); sets prefault_status_ to the method used or the error.
void KtWeightArena::run_prefault(const std::vector<Span>& spans, int fd) {
  int advice = MADV_POPULATE_READ;
  std::string status = "populate_read";
  std::vector<char> buf(static_cast<size_t>(kReadChunk));
  for (const Span& s : spans) {
    auto* p = static_cast<char*>(s.addr);
    for (int64_t off = 0; off < s.bytes; off += kPrefaultStep) {
      if (prefault_stop_.load()) {
        status = "error: stopped";
        goto done;
      }
      const int64_t n = std::min(kPrefaultStep, s.bytes - off);
      prefault_done_.fetch_add(n);  // counted as started: progress of a step in flight
      const bool cached = all_resident(p + off, n);
      std::string error;
      if (!cached && !read_through(fd, s.offset + off, n, buf.data(), kReadChunk, &error)) {
        status = "error: " + error;
        goto done;
      }
      if (::madvise(p + off, static_cast<size_t>(n), advice) != 0) {
        if (advice == MADV_POPULATE_READ && errno == EINVAL) {  // kernel < 5.14
          advice = MADV_WILLNEED;
          status = "willneed";
        }
        if (advice != MADV_WILLNEED || ::madvise(p + off, static_cast<size_t>(n), advice) != 0) {
          status = "error: " + errno_text(advice == MADV_WILLNEED ? "madvise(MADV_WILLNEED)"
                                                                  : "madvise(MADV_POPULATE_READ)");
          goto done;
        }
      }
      if (cached) read_lines(p + off, n);
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
  prefault_done_.store(0);
  std::vector<Span> spans = mapped_spans();
  const int fd = file_.fd();  // the file stays open (and the same) while slices are mapped
  if (!wait) {
    prefault_thread_ = std::thread([this, spans = std::move(spans), fd] { run_prefault(spans, fd); });
    return true;
  }
  run_prefault(spans, fd);
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

void KtWeightArena::stop_prefault() {
  prefault_stop_.store(true);
  join_prefault();  // takes prefault_mutex_: also waits for a wait=true run on another thread
  prefault_stop_.store(false);
}

void KtWeightArena::forget_prefault_after_fork() {
  // Placement new: the copies must be neither joined, unlocked nor destroyed (see weight_arena.cpp's fork note).
  new (&prefault_mutex_) std::mutex();
  new (&status_mutex_) std::mutex();
  if (prefault_thread_.joinable()) new (&prefault_thread_) std::thread();
  if (prefault_status_ == "running") prefault_status_ = "error: stopped";
  prefault_stop_.store(false);
}

std::string KtWeightArena::prefault_status() const {
  std::lock_guard<std::mutex> lock(status_mutex_);
  return prefault_status_;
}

}  // namespace ktmoe
