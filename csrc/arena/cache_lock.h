// [NOTE] CacheLock: the lock that serialises validate-or-build of one cache file
// between processes (flock LOCK_EX on `<dir>/<name>.ktmoe.lock`), RAII.
//
// The lock file is created mode 0600, opened with O_NOFOLLOW | O_NONBLOCK and
// must be a regular file owned by this user and not writable by others (the
// trust rule of cache files, check_trusted; trust_others skips it): a symlink
// planted at the lock path is never followed, a FIFO never blocks, and a lock
// file another user made is not used. A lock file of ours that others can open
// (0644: made by a release before locks were 0600) is replaced by a new 0600
// one (rename), since any user who can open it can hold flock on it; a flock
// won on a file no longer at the path is dropped and the new file locked. The
// flock is tried with LOCK_NB until a deadline (wait_seconds; inf: none), so no
// other process, running or stopped, can make a load wait longer. Outcomes of acquire():
//   locked()             the lock is held until destruction (or release());
//   refused() non-empty  the path is hostile (symlink, not a regular file, not
//                        ours): the caller must not keep or map a cache file
//                        under this name;
//   busy() non-empty     another process held the lock past the deadline: the
//                        caller must not keep or map the file either (it may be
//                        half built);
//   otherwise            no lock file could be made (missing or read-only
//                        directory): there is nothing to protect, as the arena
//                        falls back too.
// Torch-free; acquire() may sleep up to wait_seconds (call it without the GIL).
#pragma once
#include <sys/stat.h>

#include <string>

namespace ktmoe {

// Seconds a load waits for another process's lock: $KTMOE_CACHE_LOCK_WAIT (a
// number >= 0, inf: as long as it is held), 5 when unset; std::invalid_argument
// naming the variable for anything else.
double cache_lock_wait_seconds();

class CacheLock {
 public:
  CacheLock(std::string dir, std::string name, bool trust_others, double wait_seconds);
  ~CacheLock();
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

  bool acquire();  // opens and flocks; true when held
  void release();  // closes (drops the lock); idempotent
  bool locked() const { return fd_ >= 0; }
  const std::string& refused() const { return refused_; }
  const std::string& busy() const { return busy_; }

 private:
  bool open_checked();  // fd_ = the trusted lock file (made private first), or refused_ / nothing
  int open_trusted(struct stat* st);  // the lock file if it is ours (or trusted), else -1 (refused_ / nothing)
  bool replace_with_private(const struct stat& st);  // renames a new 0600 file over the one of `st`
  bool held_file_is_at_path() const;  // fd_ is still the file at path_
  static std::string mode_text(const struct stat& st);
  std::string path_, refused_, busy_;
  bool trust_others_;
  double wait_seconds_;
  int fd_ = -1;
};

}  // namespace ktmoe
