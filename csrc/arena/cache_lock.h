// [NOTE] CacheLock: the lock that serialises validate-or-build of one cache file
// between processes (flock LOCK_EX on `<dir>/<name>.ktmoe.lock`), RAII.
//
// The lock file is opened with O_NOFOLLOW | O_NONBLOCK and must be a regular
// file: a symlink planted at the lock path is never followed (no file is
// created where it points) and a FIFO never blocks. Outcomes:
//   locked()             the lock is held until destruction (or release());
//   refused() non-empty  the path is hostile (symlink, not a regular file): the
//                        caller must not keep or map a cache file under this name;
//   otherwise            no lock file could be made (missing or read-only
//                        directory): there is nothing to protect, as the arena
//                        falls back too. error() says why.
// Torch-free; acquire() blocks (call it without the GIL).
#pragma once
#include <string>

namespace ktmoe {

class CacheLock {
 public:
  CacheLock(std::string dir, std::string name);
  ~CacheLock();
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

  bool acquire();  // opens and flocks; true when held
  void release();  // closes (drops the lock); idempotent
  bool locked() const { return fd_ >= 0; }
  const std::string& refused() const { return refused_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, refused_, error_;
  int fd_ = -1;
};

}  // namespace ktmoe
