// [NOTE] ReaderPool (see reader_pool.h): the queue of pieces, the I/O threads, their stop and fork handling.
#include "arena/reader_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <new>
#include <stdexcept>

#include "common/posix_text.h"

namespace ktmoe {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// Reads [offset, offset + bytes) of fd into buf (kPiece bytes, contents discarded). Bytes read; *error set
// when pread fails or the file ends first (a truncated file): never a retry beyond EINTR.
int64_t read_piece(int fd, int64_t offset, int64_t bytes, char* buf, std::string* error) {
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, buf, static_cast<size_t>(bytes - done), static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      *error = errno_text(("pread at offset " + std::to_string(offset + done)).c_str());
      break;
    }
    if (got == 0) {
      *error = "end of file at offset " + std::to_string(offset + done) + ", " + std::to_string(bytes - done) +
               " bytes before the end of the range read (the file was truncated?)";
      break;
    }
    done += got;
  }
  return done;
}

void lock_pool_for_fork() { ReaderPool::instance().lock_for_fork(); }
void unlock_pool_after_fork() { ReaderPool::instance().unlock_after_fork(); }
void forget_pool_in_child() { ReaderPool::instance().forget_after_fork(); }

}  // namespace

// ------------------------------------------------------------------ ReadFile, ReadBatch

std::shared_ptr<const ReadFile> ReadFile::dup_of(int fd, std::string* error) {
  // A description of its own (reopened through /proc, which also works for an unlinked file): its
  // POSIX_FADV_RANDOM turns off the kernel's readahead for the pool's reads only, so a piece reads
  // exactly its bytes (with the shared description, each 1 MiB pread also read ahead past the expert:
  // ~1.8x the bytes on the decode benchmark) and the arena's own descriptor keeps its mode.
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  int copy = ::open(link.c_str(), O_RDONLY | O_CLOEXEC);
  if (copy >= 0) {
    ::posix_fadvise(copy, 0, 0, POSIX_FADV_RANDOM);
  } else {
    copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);  // no /proc: a shared description, with its readahead
  }
  if (copy < 0) {
    if (error) *error = errno_text("dup of the arena's file");
    return nullptr;
  }
  return std::shared_ptr<const ReadFile>(new ReadFile(copy));
}

ReadFile::~ReadFile() { ::close(fd_); }

void ReadBatch::add(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_ += n;
}

void ReadBatch::end(const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_.empty()) error_ = error;
  if (--pending_ == 0) cv_.notify_all();
}

bool ReadBatch::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return pending_ <= 0; });
}

std::string ReadBatch::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

// ------------------------------------------------------------------ ReaderPool

ReaderPool& ReaderPool::instance() {
  static ReaderPool* pool = [] {
    auto* made = new ReaderPool();  // never destroyed: threads may run while statics go at exit
    ::pthread_atfork(lock_pool_for_fork, unlock_pool_after_fork, forget_pool_in_child);
    return made;
  }();
  return *pool;
}

bool ReaderPool::in_flight_covers(const ReadFile* f, int64_t begin, int64_t end) const {
  for (const auto& [file, range] : in_flight_)
    if (file == f && range.first <= begin && end <= range.second) return true;
  return false;
}

void ReaderPool::read(const std::shared_ptr<const ReadFile>& file,
                      const std::vector<std::pair<int64_t, int64_t>>& ranges,
                      const std::shared_ptr<ReadBatch>& batch) {
  if (!file) return;
  std::vector<Piece> dropped;  // destroyed after the lock (a file's close)
  std::lock_guard<std::mutex> lock(mutex_);
  bool queued_any = false;
  for (const auto& [offset, bytes] : ranges) {
    for (int64_t begin = std::max<int64_t>(offset, 0), stop = offset + bytes; begin < stop;) {
      const int64_t cell = begin / kPiece, end = std::min(stop, (cell + 1) * kPiece);
      const auto q = queued_.find(Key{file.get(), cell});
      if (q != queued_.end()) {  // same cell queued: one piece covering both
        Piece& p = *q->second;
        p.begin = std::min(p.begin, begin);
        p.end = std::max(p.end, end);
        if (batch && std::find(p.batches.begin(), p.batches.end(), batch) == p.batches.end()) {
          batch->add(1);
          p.batches.push_back(batch);
        }
        stats_.duplicates += 1;
      } else if (in_flight_covers(file.get(), begin, end)) {
        stats_.duplicates += 1;
      } else {
        Piece p{file, begin, end, {}};
        if (batch) {
          batch->add(1);
          p.batches.push_back(batch);
        }
        queue_.push_back(std::move(p));
        queued_[Key{file.get(), cell}] = std::prev(queue_.end());
        stats_.pieces_queued += 1;
        queued_any = true;
        if (int64_t(queue_.size()) > kMaxQueuedPieces) drop_locked(queue_.begin(), &dropped);
      }
      begin = end;
    }
  }
  if (!queued_any) return;
  stats_.requests += 1;
  if (stopping_) {  // a stop() is joining the threads: nothing would read these
    while (!queue_.empty()) drop_locked(queue_.begin(), &dropped);
    return;
  }
  start_locked();
  cv_.notify_all();
}

void ReaderPool::drop_locked(std::list<Piece>::iterator it, std::vector<Piece>* out) {
  queued_.erase(Key{it->file.get(), it->begin / kPiece});
  for (const auto& b : it->batches) b->end("");
  stats_.dropped += 1;
  out->push_back(std::move(*it));
  queue_.erase(it);
}

void ReaderPool::cancel(const ReadBatch* batch) {
  std::vector<Piece> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    const auto next = std::next(it);
    auto& bs = it->batches;
    const auto mine = std::find_if(bs.begin(), bs.end(), [&](const auto& b) { return b.get() == batch; });
    if (mine != bs.end()) {
      if (bs.size() == 1) {
        drop_locked(it, &dropped);
      } else {  // another batch still wants it
        (*mine)->end("");
        bs.erase(mine);
      }
    }
    it = next;
  }
}

void ReaderPool::drop_file(const ReadFile* file) {
  std::vector<Piece> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    const auto next = std::next(it);
    if (it->file.get() == file) drop_locked(it, &dropped);
    it = next;
  }
}

void ReaderPool::start_locked() {
  if (!threads_.empty()) return;
  for (int i = 0; i < thread_count_; ++i) {
    try {
      threads_.emplace_back([this] { worker(); });
    } catch (const std::exception& e) {  // no thread: the queue would never drain
      stats_.errors += 1;
      stats_.last_error = std::string("starting a reader thread: ") + e.what();
      break;
    }
  }
  if (threads_.empty()) {
    std::vector<Piece> dropped;
    while (!queue_.empty()) drop_locked(queue_.begin(), &dropped);
  }
}

void ReaderPool::worker() {
  ::pthread_setname_np(::pthread_self(), "ktmoe-read");
  std::vector<char> buf(static_cast<size_t>(kPiece));  // scratch: what pread copies is discarded
  std::unique_lock<std::mutex> lock(mutex_);
  stats_.threads_running += 1;
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) break;
    Piece p = std::move(queue_.front());
    queue_.pop_front();
    queued_.erase(Key{p.file.get(), p.begin / kPiece});
    const auto start = Clock::now();
    if (in_flight_.empty()) busy_since_ = start;
    in_flight_.push_back({p.file.get(), {p.begin, p.end}});
    lock.unlock();
    std::string error;
    const int64_t got = read_piece(p.file->fd(), p.begin, p.end - p.begin, buf.data(), &error);
    const auto finish = Clock::now();
    lock.lock();
    const auto me = std::find(in_flight_.begin(), in_flight_.end(),
                              std::make_pair(p.file.get(), std::make_pair(p.begin, p.end)));
    if (me != in_flight_.end()) in_flight_.erase(me);
    if (in_flight_.empty()) stats_.busy_ns += ns_between(busy_since_, finish);
    stats_.thread_busy_ns += ns_between(start, finish);
    stats_.bytes_read += got;
    if (error.empty()) {
      stats_.pieces_read += 1;
    } else {
      stats_.errors += 1;
      stats_.last_error = error;
    }
    for (const auto& b : p.batches) b->end(error);
  }
  stats_.threads_running -= 1;
}

void ReaderPool::stop_locked(std::unique_lock<std::mutex>& lock) {
  std::vector<Piece> dropped;
  while (!queue_.empty()) drop_locked(queue_.begin(), &dropped);
  std::vector<std::thread> threads;
  threads.swap(threads_);
  stopping_ = true;
  cv_.notify_all();
  lock.unlock();
  for (auto& t : threads) t.join();
  dropped.clear();
  lock.lock();
  stopping_ = false;
}

void ReaderPool::stop() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) {  // another stop() is joining: wait for it
    lock.unlock();
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard<std::mutex> again(mutex_);
      if (!stopping_) return;
    }
  }
  stop_locked(lock);
}

void ReaderPool::set_threads(int n) {
  if (n < 0 || n > 256) throw std::invalid_argument("reader pool: threads must be in [0, 256], got " + std::to_string(n));
  stop();
  std::lock_guard<std::mutex> lock(mutex_);
  thread_count_ = n;
}

int ReaderPool::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return thread_count_;
}

bool ReaderPool::started() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !threads_.empty();
}

ReaderPoolStats ReaderPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ReaderPoolStats s = stats_;
  s.threads = thread_count_;
  s.queued_now = int64_t(queue_.size());
  s.in_flight_now = int64_t(in_flight_.size());
  if (!in_flight_.empty()) s.busy_ns += ns_between(busy_since_, Clock::now());
  return s;
}

void ReaderPool::lock_for_fork() { mutex_.lock(); }
void ReaderPool::unlock_after_fork() { mutex_.unlock(); }

void ReaderPool::forget_after_fork() {
  // The child's one thread: the parent's threads are not here. Placement new: the copies must be neither
  // joined, unlocked nor destroyed (weight_arena.cpp's fork note).
  new (&mutex_) std::mutex();
  new (&cv_) std::condition_variable();
  for (auto& t : threads_) new (&t) std::thread();
  threads_.clear();
  queued_.clear();
  queue_.clear();  // the child's copies of the files close; nobody here waits on their batches
  in_flight_.clear();
  stopping_ = false;
  stats_.threads_running = 0;
}

}  // namespace ktmoe
