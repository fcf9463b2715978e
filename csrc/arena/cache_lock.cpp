// [NOTE] CacheLock (see cache_lock.h): create 0600 without following links,
// check the owner, flock LOCK_NB until the deadline (sleeping 1 ms, doubling to 50 ms).
#include "arena/cache_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "arena/cache_file.h"
#include "common/posix_text.h"

namespace ktmoe {

double cache_lock_wait_seconds() {
  const char* text = std::getenv("KTMOE_CACHE_LOCK_WAIT");
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    const double s = std::strtod(text, &end);
    if (end != text && *end == '\0' && s >= 0) return s;
  }
  return 5.0;
}

CacheLock::CacheLock(std::string dir, std::string name, bool trust_others, double wait_seconds)
    : path_(cache_lock_path(dir, name)), trust_others_(trust_others), wait_seconds_(wait_seconds) {}

CacheLock::~CacheLock() { release(); }

bool CacheLock::open_checked() {
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ELOOP) refused_ = "untrusted: lock file '" + path_ + "' is a symlink (not followed)";
    else if (errno == ENXIO || errno == EISDIR) refused_ = "untrusted: lock file '" + path_ + "' is not a regular file";
    else if (errno == EACCES && ::access(path_.c_str(), F_OK) == 0)  // there, but not ours to open
      refused_ = "untrusted: lock file '" + path_ + "' cannot be opened by this process (another user's?)";
    return false;  // otherwise no lock file can be made here: nothing to protect
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) refused_ = "untrusted: lock file '" + path_ + "' is not a regular file";
  else refused_ = check_trusted(st, "lock file '" + path_ + "'", trust_others_);
  if (!refused_.empty()) {
    ::close(fd);
    return false;
  }
  fd_ = fd;
  return true;
}

bool CacheLock::acquire() {
  if (fd_ >= 0) return true;
  refused_.clear();
  busy_.clear();
  if (!open_checked()) return false;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(wait_seconds_));
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) break;  // flock unsupported here: as if no lock file
    if (Clock::now() >= deadline) {
      std::ostringstream why;
      why << "lock busy: another process held '" << path_ << "' for more than " << wait_seconds_
          << " s (KTMOE_CACHE_LOCK_WAIT); this load uses an unnamed file and keeps nothing";
      busy_ = why.str();
      break;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  release();
  return false;
}

void CacheLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
  fd_ = -1;
}

}  // namespace ktmoe
