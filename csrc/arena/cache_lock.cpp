// [NOTE] CacheLock (see cache_lock.h): create 0600 without following links,
// check the owner, replace a lock of ours that others can open (0644, an older
// release's) with a 0600 one, flock LOCK_NB until the deadline (sleeping 1 ms,
// doubling to 50 ms; none for inf) and keep the flock only if the file is still
// the one at the path (it may have been replaced while we waited).
#include "arena/cache_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "arena/cache_file.h"
#include "common/posix_text.h"

namespace ktmoe {
namespace {

// A wait longer than this has no deadline: a steady_clock time point (int64 ns) ends in 292 years.
constexpr double kForeverSeconds = 1e9;

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

}  // namespace

double cache_lock_wait_seconds() {
  const char* text = std::getenv("KTMOE_CACHE_LOCK_WAIT");
  if (text == nullptr || *text == '\0') return 5.0;
  char* end = nullptr;
  const double s = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(s >= 0))  // !(s >= 0): NaN too
    throw std::invalid_argument(std::string("KTMOE_CACHE_LOCK_WAIT='") + text +
                                "': expected a number of seconds >= 0, or inf to wait as long as the lock is held");
  return s;
}

CacheLock::CacheLock(std::string dir, std::string name, bool trust_others, double wait_seconds)
    : path_(cache_lock_path(dir, name)), trust_others_(trust_others), wait_seconds_(wait_seconds) {}

CacheLock::~CacheLock() { release(); }

bool CacheLock::open_checked() {
  for (int replaced = 0;; ++replaced) {
    struct stat st;
    const int fd = open_trusted(&st);
    if (fd < 0 || trust_others_ || (st.st_mode & 077) == 0) {
      fd_ = fd;
      return fd >= 0;
    }
    ::close(fd);  // ours, but others can open it (and hold flock on it: flock needs no write access)
    if (replaced == 2) {
      refused_ = "untrusted: lock file '" + path_ + "' stays open to other users (mode " + mode_text(st) +
                 ") after being replaced twice";
      return false;
    }
    if (!replace_with_private(st)) return false;
  }
}

std::string CacheLock::mode_text(const struct stat& st) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return buf;
}

bool CacheLock::replace_with_private(const struct stat& st) {
  std::string tmp = path_ + ".new.XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);  // mode 0600
  if (fd < 0) {
    refused_ = "untrusted: lock file '" + path_ + "' is open to other users (mode " + mode_text(st) +
               ") and cannot be replaced (" + errno_text("mkostemp") + ")";
    return false;
  }
  ::close(fd);
  struct stat now;
  if (::lstat(path_.c_str(), &now) == 0 && !same_file(now, st)) {  // another process replaced it first
    ::unlink(tmp.c_str());
    return true;
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    refused_ = "untrusted: lock file '" + path_ + "' is open to other users (mode " + mode_text(st) +
               ") and cannot be replaced (" + errno_text("rename") + ")";
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

bool CacheLock::held_file_is_at_path() const {
  struct stat held, now;
  return ::fstat(fd_, &held) == 0 && ::lstat(path_.c_str(), &now) == 0 && same_file(held, now);
}

int CacheLock::open_trusted(struct stat* st) {
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ELOOP) refused_ = "untrusted: lock file '" + path_ + "' is a symlink (not followed)";
    else if (errno == ENXIO || errno == EISDIR) refused_ = "untrusted: lock file '" + path_ + "' is not a regular file";
    else if (errno == EACCES && ::access(path_.c_str(), F_OK) == 0)  // there, but not ours to open
      refused_ = "untrusted: lock file '" + path_ + "' cannot be opened by this process (another user's?)";
    return -1;  // otherwise no lock file can be made here: nothing to protect
  }
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) refused_ = "untrusted: lock file '" + path_ + "' is not a regular file";
  else refused_ = check_trusted(*st, "lock file '" + path_ + "'", trust_others_);
  if (!refused_.empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool CacheLock::acquire() {
  if (fd_ >= 0) return true;
  refused_.clear();
  busy_.clear();
  if (!open_checked()) return false;
  using Clock = std::chrono::steady_clock;
  const bool forever = !(wait_seconds_ < kForeverSeconds);  // inf: no deadline (its nanoseconds would overflow)
  const auto deadline = forever ? Clock::time_point::max()
                                : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(wait_seconds_));
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      if (held_file_is_at_path()) return true;
      release();  // replaced while we waited (a lock open to others made private): lock the file now there
      if (!open_checked()) return false;
      continue;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) break;  // flock unsupported here: as if no lock file
    if (!forever && Clock::now() >= deadline) {
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
