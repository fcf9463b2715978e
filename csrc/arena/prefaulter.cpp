// [NOTE] Prefaulter (see prefaulter.h): the 64 MiB steps of a warm, on this thread or one I/O thread.
#include "arena/prefaulter.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <new>

#include "arena/page_cache.h"
#include "common/posix_text.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace ktmoe {
namespace {

constexpr int64_t kPrefaultStep = int64_t(64) << 20;

}  // namespace

void Prefaulter::work(const std::vector<FileSpan>& spans, int fd) {
  int advice = MADV_POPULATE_READ;
  std::string status = "populate_read";
  std::vector<char> buf(static_cast<size_t>(kReadChunk));
  for (const FileSpan& s : spans) {
    auto* p = static_cast<char*>(s.addr);
    for (int64_t off = 0; off < s.bytes; off += kPrefaultStep) {
      if (stop_.load()) {
        status = "error: stopped";
        goto done;
      }
      const int64_t n = std::min(kPrefaultStep, s.bytes - off);
      done_.fetch_add(n);  // counted as started: progress of a step in flight
      const bool cached = mincore_resident(p + off, n) >= n;
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
  status_ = status;
}

bool Prefaulter::run(std::vector<FileSpan> spans, int fd, bool wait, std::string* error) {
  std::lock_guard<std::mutex> lock(run_mutex_);
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> status_lock(status_mutex_);
    status_ = "running";
  }
  done_.store(0);
  if (!wait) {
    thread_ = std::thread([this, spans = std::move(spans), fd] { work(spans, fd); });
    return true;
  }
  work(spans, fd);
  const std::string s = status();
  if (s.rfind("error: ", 0) == 0) {
    if (error) *error = s.substr(7);
    return false;
  }
  return true;
}

void Prefaulter::join() {
  std::lock_guard<std::mutex> lock(run_mutex_);
  if (thread_.joinable()) thread_.join();
}

void Prefaulter::stop() {
  stop_.store(true);
  join();  // takes run_mutex_: also waits for a wait=true run on another thread
  stop_.store(false);
}

void Prefaulter::forget_after_fork() {
  // Placement new: the copies must be neither joined, unlocked nor destroyed (weight_arena.cpp's fork note).
  new (&run_mutex_) std::mutex();
  new (&status_mutex_) std::mutex();
  if (thread_.joinable()) new (&thread_) std::thread();
  if (status_ == "running") status_ = "error: stopped";
  stop_.store(false);
}

std::string Prefaulter::status() const {
  std::lock_guard<std::mutex> lock(status_mutex_);
  return status_;
}

}  // namespace ktmoe
