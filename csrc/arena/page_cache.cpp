// [NOTE] Page-cache helpers (see page_cache.h): mincore, pread through the cache, line loads.
#include "arena/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "arena/cache_file.h"
#include "common/posix_text.h"

namespace ktmoe {
namespace {

int64_t page_size() {
  static const int64_t p = ::sysconf(_SC_PAGESIZE);
  return p;
}

}  // namespace

int64_t mincore_resident(void* addr, int64_t bytes) {
  const int64_t page = page_size();
  std::vector<unsigned char> vec(static_cast<size_t>((bytes + page - 1) / page), 0);
  if (::mincore(addr, static_cast<size_t>(bytes), vec.data()) != 0) return 0;
  int64_t resident = 0;
  for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  return resident;
}

bool range_in_page_cache(const void* addr, int64_t bytes) {
  const uintptr_t page = uintptr_t(page_size());
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(addr) + uintptr_t(bytes) + page - 1) & ~(page - 1);
  if (end <= begin) return true;
  return mincore_resident(reinterpret_cast<void*>(begin), int64_t(end - begin)) == int64_t(end - begin);
}

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

void read_lines(const char* p, int64_t bytes) {
  uint64_t sink = 0;
  for (int64_t off = 0; off + 8 <= bytes; off += 64) sink ^= *reinterpret_cast<const volatile uint64_t*>(p + off);
  asm volatile("" : : "r"(sink));
}

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

}  // namespace ktmoe
