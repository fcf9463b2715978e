// [NOTE] Prefaulter (see prefaulter.h): the 64 MiB steps of a warm, on this thread or one background
// thread; the reads of a step not in the page cache go to the reader pool, one step ahead.
#include "arena/prefaulter.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
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

std::string Prefaulter::wait_reads(const std::shared_ptr<ReadBatch>& batch) {
  while (!batch->wait_for(std::chrono::milliseconds(20)))
    if (stop_.load()) return "stopped";
  return batch->error();
}

void Prefaulter::work(const std::vector<FileSpan>& spans, const std::shared_ptr<const ReadFile>& file,
                      bool map_only) {
  struct Step {
    char* addr;
    int64_t bytes, offset;
    std::shared_ptr<ReadBatch> reads;  // queued to the pool; nullptr: all cached when looked at
  };
  std::vector<Step> steps;
  for (const FileSpan& s : spans)
    for (int64_t off = 0; off < s.bytes; off += kPrefaultStep)
      steps.push_back({static_cast<char*>(s.addr) + off, std::min(kPrefaultStep, s.bytes - off), s.offset + off, nullptr});
  ReaderPool& pool = ReaderPool::instance();
  const auto queue_reads = [&](Step& st) {  // the pool reads the step's pieces, several at once
    if (map_only || mincore_resident(st.addr, st.bytes) >= st.bytes) return;
    st.reads = std::make_shared<ReadBatch>();
    pool.read(file, {{st.offset, st.bytes}}, st.reads);
  };
  int advice = MADV_POPULATE_READ;
  std::string status = "populate_read";
  if (!steps.empty()) queue_reads(steps[0]);
  for (size_t i = 0; i < steps.size(); ++i) {
    Step& st = steps[i];
    if (stop_.load()) {
      status = "error: stopped";
      break;
    }
    done_.fetch_add(st.bytes);  // counted as started: progress of a step in flight
    if (i + 1 < steps.size()) queue_reads(steps[i + 1]);  // one step ahead: the disk never waits on madvise
    if (st.reads) {
      const std::string error = wait_reads(st.reads);
      if (!error.empty()) {
        status = "error: " + error;
        break;
      }
    }
    if (::madvise(st.addr, static_cast<size_t>(st.bytes), advice) != 0) {
      if (advice == MADV_POPULATE_READ && errno == EINVAL) {  // kernel < 5.14
        if (map_only) {  // WILLNEED would be slower than no stream
          status = "error: MADV_POPULATE_READ unsupported (Linux < 5.14): no map-only run";
          break;
        }
        advice = MADV_WILLNEED;
        status = "willneed";
      }
      if (advice != MADV_WILLNEED || ::madvise(st.addr, static_cast<size_t>(st.bytes), advice) != 0) {
        status = "error: " + errno_text(advice == MADV_WILLNEED ? "madvise(MADV_WILLNEED)"
                                                                : "madvise(MADV_POPULATE_READ)");
        break;
      }
    }
    if (!st.reads && !map_only) read_lines(st.addr, st.bytes);  // cached, unread: the CPU's first read
  }
  for (const Step& st : steps)  // a stop or an error: the disk need not read the rest
    if (st.reads) pool.cancel(st.reads.get());
  std::lock_guard<std::mutex> lock(status_mutex_);
  status_ = status;
}

bool Prefaulter::run(std::vector<FileSpan> spans, std::shared_ptr<const ReadFile> file, bool wait,
                     std::string* error, bool map_only) {
  std::unique_lock<std::mutex> lock(run_mutex_, std::defer_lock);
  if (!map_only) {
    lock.lock();
  } else if (!lock.try_lock() || status() == "running") {
    return true;  // a warm (or another stream) runs: it maps the file too; a compute thread never waits on it
  }
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> status_lock(status_mutex_);
    status_ = "running";
  }
  done_.store(0);
  if (!wait) {
    thread_ = std::thread([this, spans = std::move(spans), file = std::move(file), map_only] {
      work(spans, file, map_only);
    });
    return true;
  }
  work(spans, file, map_only);
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
