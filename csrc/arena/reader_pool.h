// [NOTE] ReaderPool: reads byte ranges of files into the page cache with several requests in flight.
//
// Why: one stream of faults or of read() gets one request's worth of the disk at a time (~0.7 GB/s
// buffered on the measured host); eight concurrent buffered preads got ~2.3 GB/s. Reads issued from the
// compute threads (MADV_WILLNEED per routed expert) stop whenever those threads are descheduled. The pool
// keeps the disk busy from its own I/O threads instead.
//
// What: a process-wide pool of I/O threads (default 8, set_threads()), started on the first read() — a
// model whose experts fit never starts one. A request (file, offset, bytes) is cut at kPiece-aligned file
// offsets into pieces, so several threads work on one expert. Each thread preads a piece into its own
// kPiece scratch buffer and discards it: the page cache stays the one copy of the data (no anonymous
// staging), and the copy is the CPU's first read of the pages (prefaulter.h says why that matters).
//   * Duplicates: a piece whose kPiece cell is already queued for the same file is merged into it (range
//     hull); one covered by a piece in flight is dropped.
//   * Bounded: at most kMaxQueuedPieces wait; beyond that the oldest are dropped (counted). read() never
//     blocks on the disk.
//   * Files: a request holds a ReadFile (the file reopened through /proc/self/fd with POSIX_FADV_RANDOM:
//     a piece reads exactly its bytes, no readahead past them; a plain dup where /proc is missing), so a file stays open while any of its
//     pieces is queued or in flight, whatever the arena that asked does meanwhile. drop_file() forgets the
//     queued pieces of a file (its arena is going).
//   * Errors: a failed pread, or end of file before a piece's end (a truncated file), ends that piece with
//     an error that is counted and kept (stats().last_error, the batch's error); never a retry or a wait.
//   * Batches: a caller that must know when its pieces ended (the prefaulter's warm) passes a ReadBatch and
//     waits on it; a piece dropped (duplicate, overflow, cancel, stop) counts as ended.
//   * Stop: stop() drops the queue and joins the threads (each ends within one kPiece pread); the next
//     read() starts them again. The Python module calls it at interpreter exit (atexit).
//   * fork: the child has no pool threads; an atfork handler (the pool's lock is held across fork())
//     forgets them, their queue and their state in the child; its next read() starts new threads.
// Torch-free; stats() reports bytes read and the wall time with at least one read in flight (busy_ns), so
// bytes_read / busy_ns is the disk rate the pool achieved.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ktmoe {

// A file the pool reads: its own descriptor of an fd's file, closed when the last request holding it ends.
class ReadFile {
 public:
  // The file of fd, reopened (POSIX_FADV_RANDOM on the new description) or else dup'd; nullptr with *error.
  static std::shared_ptr<const ReadFile> dup_of(int fd, std::string* error);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  int fd() const { return fd_; }

 private:
  explicit ReadFile(int fd) : fd_(fd) {}
  int fd_;
};

// The pieces of one or more read() calls a caller waits for. Thread-safe.
class ReadBatch {
 public:
  // True when every piece added has ended (read, failed or dropped); false when `timeout` passed first.
  bool wait_for(std::chrono::milliseconds timeout);
  std::string error() const;  // the first piece's error, "" if none

 private:
  friend class ReaderPool;
  void add(int64_t n);
  void end(const std::string& error);
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int64_t pending_ = 0;
  std::string error_;
};

struct ReaderPoolStats {
  int threads = 0;            // threads the pool starts (set_threads)
  int threads_running = 0;    // threads alive now
  int64_t requests = 0;       // read() calls that queued something
  int64_t pieces_queued = 0;  // pieces put in the queue
  int64_t pieces_read = 0;    // pieces read to their end
  int64_t bytes_read = 0;     // bytes pread returned
  int64_t duplicates = 0;     // pieces merged into a queued one or covered by one in flight
  int64_t dropped = 0;        // queued pieces dropped: overflow, cancel, drop_file, stop
  int64_t errors = 0;         // pieces that ended with an error
  std::string last_error;     // the latest error, "" if none
  int64_t queued_now = 0;     // pieces waiting now
  int64_t in_flight_now = 0;  // pieces being read now
  int64_t busy_ns = 0;        // wall time with at least one piece in flight
  int64_t thread_busy_ns = 0; // time summed over threads spent reading
};

class ReaderPool {
 public:
  static constexpr int64_t kPiece = int64_t(1) << 20;  // request size and scratch buffer of each thread
  static constexpr int64_t kMaxQueuedPieces = 8192;    // 8 GiB queued at most; then the oldest are dropped
  static constexpr int kDefaultThreads = 8;

  static ReaderPool& instance();  // the process's pool (never destroyed; starts no thread by itself)

  // Queues [offset, offset + bytes) of `file` (each range in `ranges`) for reading; returns at once.
  // Starts the threads on first use. batch (optional) counts the pieces queued for it.
  void read(const std::shared_ptr<const ReadFile>& file, const std::vector<std::pair<int64_t, int64_t>>& ranges,
            const std::shared_ptr<ReadBatch>& batch = nullptr);
  // Drops the queued pieces of `batch` (they count as ended); pieces in flight end on their own.
  void cancel(const ReadBatch* batch);
  // Drops the queued pieces of `file` (its owner goes); pieces in flight end on their own.
  void drop_file(const ReadFile* file);
  // Threads for the next start, n >= 0; a running pool is stopped first (its queue dropped). 0: the pool is
  // off: read() drops what it is given, and callers that have another way (ops/expert_reads.h: MADV_WILLNEED
  // from the calling thread) use it.
  void set_threads(int n);
  int threads() const;
  // Drops the queue, stops and joins the threads. The next read() starts them again.
  void stop();
  ReaderPoolStats stats() const;
  bool started() const;  // threads running

  // atfork handlers (registered by instance()).
  void lock_for_fork();
  void unlock_after_fork();
  void forget_after_fork();  // the child: no threads, no queue, fresh locks

 private:
  ReaderPool() = default;
  struct Piece {
    std::shared_ptr<const ReadFile> file;
    int64_t begin = 0, end = 0;
    std::vector<std::shared_ptr<ReadBatch>> batches;
  };
  using Key = std::pair<const ReadFile*, int64_t>;  // (file, piece cell)
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.first) ^ (std::hash<int64_t>()(k.second) * 0x9e3779b97f4a7c15ull);
    }
  };
  void worker();
  void start_locked();                     // mutex_ held
  void drop_locked(std::list<Piece>::iterator it, std::vector<Piece>* out);  // mutex_ held
  void stop_locked(std::unique_lock<std::mutex>& lock);  // mutex_ held on entry and exit
  bool in_flight_covers(const ReadFile* f, int64_t begin, int64_t end) const;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  int thread_count_ = kDefaultThreads;
  bool stopping_ = false;
  std::list<Piece> queue_;  // oldest first
  std::unordered_map<Key, std::list<Piece>::iterator, KeyHash> queued_;
  std::vector<std::pair<const ReadFile*, std::pair<int64_t, int64_t>>> in_flight_;
  std::chrono::steady_clock::time_point busy_since_;
  ReaderPoolStats stats_;
};

}  // namespace ktmoe
