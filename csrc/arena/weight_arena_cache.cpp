// [NOTE] Persistent arenas: build a kept cache file atomically, or map a valid one.
//
// Build:  begin_build()  creates `<dir>/<name>.ktmoe.tmp.<pid>` and reserves the
//         header page; allocations then land in 2 MiB-aligned slices from 2 MiB on.
//         commit_build() writes the header LAST, fsyncs the file, renames it over
//         `<name>.ktmoe` (atomic: a reader sees the old file or the complete new
//         one) and fsyncs the directory so the rename survives a crash. Slices are
//         made read-only afterwards. abort_build() / the destructor unlink a temp
//         file that was never committed.
// Reuse:  open_cached() opens `<name>.ktmoe` O_RDONLY, validates the header
//         against the caller's CacheKey and the file size (cache_file.h), and maps
//         each tensor PROT_READ, MAP_SHARED. Nothing is written; the pages are clean
//         page cache from the first fault on.
// The flock that serialises validate-or-build between processes is the caller's.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "arena/weight_arena.h"

namespace ktmoe {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

int64_t round_up_to(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

bool KtWeightArena::begin_build(std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!options_.persistent) {
    *error = "begin_build: arena '" + name_ + "' is not persistent";
    return false;
  }
  if (!open_error_.empty()) {
    *error = open_error_;
    return false;
  }
  if (fd_ >= 0 || !slices_.empty()) {
    *error = "begin_build: arena '" + name_ + "' already holds a file or allocations";
    return false;
  }
  const std::string tmp = cache_tmp_path(dir_, name_);
  ::unlink(tmp.c_str());  // a leftover of a crashed process that had our pid
  int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = errno_text("cannot create '" + tmp + "'");
  } else if (int rc = ::posix_fallocate(fd, 0, kCacheHeaderBytes); rc != 0) {
    errno = rc;
    *error = errno_text("fallocate '" + tmp + "'");
    ::close(fd);
    ::unlink(tmp.c_str());
    fd = -1;
  }
  if (fd < 0) {
    open_error_ = *error;  // every allocation falls back with this reason
    return false;
  }
  fd_ = fd;
  tmp_path_ = tmp;
  file_size_ = kSliceAlign;  // slices start 2 MiB in: the header page, then a hole
  return true;
}

bool KtWeightArena::commit_build(const CacheKey& key, const void* const tensors[kCacheTensors],
                                 std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0 || tmp_path_.empty()) {
    *error = "commit_build: no build in progress for arena '" + name_ + "'";
    return false;
  }
  auto fail = [&](const std::string& why) {
    *error = "arena '" + name_ + "': " + why;
    ::unlink(tmp_path_.c_str());
    tmp_path_.clear();
    return false;
  };
  int64_t offsets[kCacheTensors];
  for (int t = 0; t < kCacheTensors; ++t) {
    offsets[t] = file_offset_locked(tensors[t]);
    if (offsets[t] < 0) return fail("packed tensor " + std::to_string(t) + " is not in the file (anonymous fallback)");
  }
  CacheHeader h;
  try {
    h = make_cache_header(key, offsets, file_size_);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // Header last, then one fsync of data + header, then the atomic rename.
  if (::pwrite(fd_, &h, sizeof(h), 0) != ssize_t(sizeof(h))) return fail(errno_text("pwrite header"));
  if (::fsync(fd_) != 0) return fail(errno_text("fsync"));
  const std::string final_path = cache_file_path(dir_, name_);
  if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0)
    return fail(errno_text("rename to '" + final_path + "'"));
  tmp_path_.clear();
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    *error = errno_text("fsync directory '" + dir_ + "'");
    if (dir_fd >= 0) ::close(dir_fd);
    return false;  // the file is in place; only its durability across a crash is in doubt
  }
  ::close(dir_fd);
  for (const Slice& s : slices_)
    if (s.mapped) ::mprotect(s.addr, s.bytes, PROT_READ);
  return true;
}

void KtWeightArena::abort_build() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (tmp_path_.empty()) return;
  ::unlink(tmp_path_.c_str());
  tmp_path_.clear();
}

std::string KtWeightArena::open_cached(const CacheKey& expect, void* tensors[kCacheTensors]) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!options_.persistent) return "arena '" + name_ + "' is not persistent";
  if (!open_error_.empty()) return "unusable directory: " + open_error_;
  if (fd_ >= 0 || !slices_.empty()) return "arena '" + name_ + "' already holds a file or allocations";
  const std::string path = cache_file_path(dir_, name_);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? "missing" : errno_text("unreadable: open '" + path + "'");
  CacheHeader h;
  int64_t file_bytes = 0;
  std::string reason = read_cache_header(fd, &h, &file_bytes);
  if (reason.empty()) reason = validate_cache_header(h, file_bytes, expect);
  int64_t bytes[kCacheTensors] = {0, 0};
  for (int t = 0; t < kCacheTensors && reason.empty(); ++t) {
    bytes[t] = h.tensors[t].rows * h.tensors[t].cols;
    tensors[t] = map_range(fd, h.tensors[t].offset, round_up_to(bytes[t], kSliceAlign), /*writable=*/false, &reason);
  }
  if (!reason.empty()) {  // nothing counted yet: unmap what was mapped and forget it
    for (const Slice& s : slices_) ::munmap(s.addr, s.bytes);
    slices_.clear();
    ::close(fd);
    return reason;
  }
  for (int t = 0; t < kCacheTensors; ++t) count_allocation(bytes[t], /*in_file=*/true);
  fd_ = fd;
  read_only_ = true;
  file_size_ = file_bytes;
  return "";
}

}  // namespace ktmoe
