// [NOTE] The work pool (see work_pool.h): one job published through one atomic word, chunks claimed from it,
// futex waits after a bounded spin, fork handling.
//
// state_ = generation (20 bits) | chunks (22 bits) | next chunk (22 bits), one word, so that a claim checks
// the generation and the chunk count of the same job: a late worker whose job has ended claims nothing,
// even while the caller is writing the next job's fields. A job's fields (body, n, grain, workers) are
// written before its state is published and rewritten only after every chunk of it was claimed and
// finished, so a thread that claims a chunk of its generation has read that job's fields. done_ counts
// finished chunks (the caller's futex word); wake_ is bumped once per job (the workers' futex word).
#include "common/work_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

namespace ktmoe {
namespace {

using Body = std::function<void(int64_t, int64_t)>;
// Spin before blocking: covers the gap between two phases of a step. KTMOE_POOL_SPIN_US sets it for tuning runs.
int64_t spin_ns() {
  static const int64_t ns = [] {
    const char* env = std::getenv("KTMOE_POOL_SPIN_US");
    return env ? int64_t(std::strtoll(env, nullptr, 10)) * 1000 : int64_t(50'000);
  }();
  return ns;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins (pause) until word != value or spin_ns() pass; true when it changed.
bool spin_until_changed(const std::atomic<uint32_t>& word, uint32_t value) {
  const int64_t deadline = now_ns() + spin_ns();
  for (int i = 0;; ++i) {
    if (word.load(std::memory_order_acquire) != value) return true;
    __builtin_ia32_pause();
    if ((i & 63) == 63 && now_ns() > deadline) return false;
  }
}

constexpr int kIdxBits = 22, kChunkBits = 22;
constexpr uint64_t kMaxChunks = (uint64_t(1) << kChunkBits) - 1;
uint32_t gen_of(uint64_t s) { return uint32_t(s >> (kIdxBits + kChunkBits)); }
uint64_t chunks_of(uint64_t s) { return (s >> kIdxBits) & kMaxChunks; }
uint64_t idx_of(uint64_t s) { return s & ((uint64_t(1) << kIdxBits) - 1); }

thread_local bool t_in_job = false;  // this thread runs a chunk (or a job's caller loop): nested calls run inline

class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = [] {
      Pool* p = new Pool();  // never destroyed: workers may outlive static destruction
      pthread_atfork([] { instance().submit_.lock(); }, [] { instance().submit_.unlock(); },
                     [] { instance().forget_after_fork(); });
      return p;
    }();
    return *pool;
  }

  void run(int threads, int64_t n, int64_t grain, const Body& body) {
    std::lock_guard<std::mutex> lock(submit_);
    start_workers(threads - 1);
    grain = std::max<int64_t>(grain, (n + int64_t(kMaxChunks) - 1) / int64_t(kMaxChunks));
    const uint32_t chunks = uint32_t((n + grain - 1) / grain);
    body_.store(&body, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    grain_.store(grain, std::memory_order_relaxed);
    workers_.store(threads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    caller_sleeps_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    const uint32_t gen = (gen_of(state_.load(std::memory_order_relaxed)) + 1) & ((1u << 20) - 1);
    state_.store((uint64_t(gen) << (kIdxBits + kChunkBits)) | (uint64_t(chunks) << kIdxBits),
                 std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(&wake_, INT_MAX);
    work(gen);
    wait_done(chunks);
    if (error_) std::rethrow_exception(error_);
  }

  int started() const { return started_.load(std::memory_order_relaxed); }

 private:
  Pool() = default;

  void start_workers(int wanted) {
    for (int i = started_.load(std::memory_order_relaxed); i < wanted; ++i) {
      std::thread([this, i] { worker(i); }).detach();
      started_.store(i + 1, std::memory_order_relaxed);
    }
  }

  // Claims and runs chunks of job `gen` until none is left (or gen is no longer the job).
  void work(uint32_t gen) {
    uint64_t s = state_.load(std::memory_order_acquire);
    const Body* body = body_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed), grain = grain_.load(std::memory_order_relaxed);
    t_in_job = true;
    while (gen_of(s) == gen && idx_of(s) < chunks_of(s)) {
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const uint32_t chunks = uint32_t(chunks_of(s));
      const int64_t begin = int64_t(idx_of(s)) * grain;
      try {
        (*body)(begin, std::min(n, begin + grain));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == chunks &&
          caller_sleeps_.load(std::memory_order_seq_cst))
        futex_wake(&done_, 1);
      s = state_.load(std::memory_order_acquire);
    }
    t_in_job = false;
  }

  void wait_done(uint32_t chunks) {
    uint32_t d = done_.load(std::memory_order_acquire);
    if (d == chunks) return;
    const int64_t deadline = now_ns() + spin_ns();
    for (int i = 0; d != chunks; ++i, d = done_.load(std::memory_order_acquire)) {
      __builtin_ia32_pause();
      if ((i & 63) == 63 && now_ns() > deadline) break;
    }
    caller_sleeps_.store(1, std::memory_order_seq_cst);
    while ((d = done_.load(std::memory_order_seq_cst)) != chunks) futex_wait(&done_, d);
  }

  void worker(int index) {
    pthread_setname_np(pthread_self(), "ktmoe-work");
    uint32_t seen = wake_.load(std::memory_order_acquire);
    for (;;) {
      if (!spin_until_changed(wake_, seen)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (wake_.load(std::memory_order_seq_cst) == seen) futex_wait(&wake_, seen);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = wake_.load(std::memory_order_acquire);
      const uint64_t s = state_.load(std::memory_order_acquire);
      if (index < workers_.load(std::memory_order_relaxed)) work(gen_of(s));
    }
  }

  // The child of a fork has none of the parent's workers (submit_ was held across fork: no job ran).
  void forget_after_fork() {
    new (&submit_) std::mutex();
    new (&error_mutex_) std::mutex();
    started_.store(0);
    sleepers_.store(0);
  }

  std::mutex submit_;                  // one job at a time
  std::atomic<int> started_{0};        // workers started (indices 0 .. started_ - 1)
  std::atomic<uint64_t> state_{0};     // generation | chunks | next chunk (see [NOTE])
  std::atomic<uint32_t> wake_{0};      // bumped per job: the workers' futex word
  std::atomic<uint32_t> done_{0};      // chunks finished: the caller's futex word
  std::atomic<uint32_t> caller_sleeps_{0};
  std::atomic<int> sleepers_{0};       // workers blocked in futex_wait(wake_)
  // the job (see [NOTE] for when these may be read)
  std::atomic<const Body*> body_{nullptr};
  std::atomic<int64_t> n_{0}, grain_{1};
  std::atomic<int> workers_{0};        // workers with index < workers_ join the job
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace

void pool_parallel_for(int threads, int64_t n, int64_t grain, const Body& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (threads <= 1 || n <= grain || t_in_job) {
    body(0, n);
    return;
  }
  Pool::instance().run(threads, n, grain, body);
}

int pool_workers_started() { return Pool::instance().started(); }

}  // namespace ktmoe
