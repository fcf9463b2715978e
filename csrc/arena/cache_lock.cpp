// [NOTE] CacheLock (see cache_lock.h): open without following links, flock.
#include "arena/cache_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "arena/cache_file.h"
#include "common/posix_text.h"

namespace ktmoe {

CacheLock::CacheLock(std::string dir, std::string name) : path_(cache_lock_path(dir, name)) {}

CacheLock::~CacheLock() { release(); }

bool CacheLock::acquire() {
  if (fd_ >= 0) return true;
  refused_.clear();
  error_.clear();
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ELOOP) refused_ = "untrusted: lock file '" + path_ + "' is a symlink (not followed)";
    else if (errno == ENXIO || errno == EISDIR) refused_ = "untrusted: lock file '" + path_ + "' is not a regular file";
    else error_ = errno_text("cannot create lock file '" + path_ + "'");
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    refused_ = "untrusted: lock file '" + path_ + "' is not a regular file";
    ::close(fd);
    return false;
  }
  int rc;
  do rc = ::flock(fd, LOCK_EX);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    error_ = errno_text("flock '" + path_ + "'");
    ::close(fd);
    return false;
  }
  fd_ = fd;
  return true;
}

void CacheLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
  fd_ = -1;
}

}  // namespace ktmoe
