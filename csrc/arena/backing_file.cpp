// [NOTE] BackingFile (see backing_file.h): create, reserve, write back, keep.
#include "arena/backing_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/posix_text.h"

namespace ktmoe {

BackingFile::~BackingFile() {
  discard_temp();
  if (fd_ >= 0) ::close(fd_);
}

BackingFile::BackingFile(BackingFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), temp_path_(std::move(other.temp_path_)) {
  other.temp_path_.clear();
}

BackingFile& BackingFile::operator=(BackingFile&& other) noexcept {
  if (this != &other) {
    discard_temp();
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    temp_path_ = std::move(other.temp_path_);
    other.temp_path_.clear();
  }
  return *this;
}

BackingFile BackingFile::unnamed(const std::string& dir, const std::string& name, std::string* error) {
  // An unnamed file (O_TMPFILE) needs no unlink; where the filesystem lacks it,
  // create the named file and unlink it at once.
  BackingFile f;
  f.fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (f.fd_ < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    const std::string path = dir + "/" + name + ".ktmoe." + std::to_string(getpid());
    f.fd_ = ::open(path.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR | O_CLOEXEC, 0600);
    if (f.fd_ >= 0) ::unlink(path.c_str());
  }
  if (f.fd_ < 0) *error = errno_text("cannot create a file in '" + dir + "'");
  return f;
}

BackingFile BackingFile::create_temp(const std::string& path, std::string* error) {
  ::unlink(path.c_str());  // a leftover of a crashed process that had our pid
  BackingFile f;
  f.fd_ = ::open(path.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR | O_CLOEXEC, 0644);
  if (f.fd_ < 0) *error = errno_text("cannot create '" + path + "'");
  else f.temp_path_ = path;
  return f;
}

BackingFile BackingFile::adopt(int fd, int64_t size) {
  BackingFile f;
  f.fd_ = fd;
  f.size_ = size;
  return f;
}

bool BackingFile::reserve(int64_t offset, int64_t bytes, std::string* error) {
  if (int rc = ::posix_fallocate(fd_, offset, bytes); rc != 0) {
    errno = rc;
    *error = errno_text("fallocate");
    if (::ftruncate(fd_, offset) != 0) { /* the file only keeps a hole past offset */ }
    return false;
  }
  if (offset + bytes > size_) size_ = offset + bytes;
  return true;
}

void BackingFile::resize(int64_t size) {
  if (::ftruncate(fd_, size) != 0) { /* the file only keeps a hole past size */ }
  size_ = size;
}

bool BackingFile::writeback(bool wait, std::string* error) {
  if (fd_ < 0 || size_ == 0) return true;
  const unsigned flags = SYNC_FILE_RANGE_WRITE |
                         (wait ? SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WAIT_AFTER : 0u);
  if (::sync_file_range(fd_, 0, size_, flags) != 0) {
    if (error) *error = errno_text("sync_file_range");
    return false;
  }
  return true;
}

bool BackingFile::keep_as(const void* data, int64_t bytes, int64_t offset, const std::string& final_path,
                          const std::string& dir, std::string* error) {
  auto fail = [&](const std::string& why) {
    *error = why;
    discard_temp();
    return false;
  };
  if (temp_path_.empty()) return fail("no temporary build file to keep");
  // Header last, then one fsync of data + header, then the atomic rename.
  if (::pwrite(fd_, data, size_t(bytes), offset) != ssize_t(bytes)) return fail(errno_text("pwrite header"));
  if (::fsync(fd_) != 0) return fail(errno_text("fsync"));
  if (::rename(temp_path_.c_str(), final_path.c_str()) != 0)
    return fail(errno_text("rename to '" + final_path + "'"));
  temp_path_.clear();
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    *error = errno_text("fsync directory '" + dir + "'");
    if (dir_fd >= 0) ::close(dir_fd);
    return false;  // the file is in place; only its durability across a crash is in doubt
  }
  ::close(dir_fd);
  return true;
}

void BackingFile::discard_temp() {
  if (temp_path_.empty()) return;
  ::unlink(temp_path_.c_str());
  temp_path_.clear();
}

}  // namespace ktmoe
