// [NOTE] Prefaulter: warms a mapped file so that the first forward runs at steady speed.
//
// Three things must happen before then, and MADV_POPULATE_READ alone does only the first
// two: (1) the data is read into the page cache, (2) this process's page tables map it,
// (3) the CPU has read the pages once. (3) is not free on a VM whose free memory the host
// takes back (virtio-balloon free page reporting, as on the Firecracker hosts this was
// measured on): the first CPU access to a guest page that the disk filled by DMA costs about
// 2-6 us in the host, serialised (two threads are no faster). Faults and MADV_POPULATE_READ
// only map pages: after them, 768 MiB of experts were all in 2 MiB folios, all PMD-mapped, no
// fault left, and the first full read of them still took 95-814 ms of CPU against 31-37 ms
// once read (decode: the first ~20-40 passes 2-15x slower). A load per 4 KiB page removed
// most of it, not all (first read 34-57 ms of CPU); a load per 64-byte line, or read()'s
// copy, all of it. So, per 64 MiB step:
//   * pages not all in the page cache: the reader pool (reader_pool.h) preads them, in 1 MiB pieces
//     on its I/O threads, several in flight, while the next step is already queued: the disk runs at
//     its concurrent rate, not one stream's, and the pool's copy is the CPU's first read of the pages;
//   * already cached (e.g. faulted in, unread, by the cache check of a load): one load per
//     64-byte line through the mapping, no copy;
// then MADV_POPULATE_READ (Linux >= 5.14) maps them (minor faults, 2 MiB at a time where the
// folios allow) and reports errors (EFAULT/EIO/ENOMEM); where it is missing (EINVAL) it falls
// back to MADV_WILLNEED.
//
// Map-only runs (map_only=true: a prefill streaming a model's next layer, torch_ktmoe/experts_dir.py) skip
// the pool's reads and the CPU's first read: MADV_POPULATE_READ alone, step by step, so the kernel reads each
// step in whole 2 MiB folios on the arena's MADV_HUGEPAGE mapping and maps them while the compute threads
// work on another layer. Measured (bench_disk_bound --prefill 512, 24 int8 layers of 110 MiB from a dropped
// page cache under a 1 GiB cgroup, 2 compute threads): the next layer streamed this way 1.74-1.86 s a forward
// against 2.68-2.86 s without and 1.6 s with every layer cached; MADV_WILLNEED over the same ranges 2.81-3.01
// s (order-0 folios, and the compute threads fault them in 4 KiB at a time); 2 or 4 threads, or 8 MiB
// instead of 64 MiB steps, no faster than one thread.
//
// Background mode: one thread (not a compute thread: it waits on the pool's reads and blocks in
// madvise), working in 64 MiB steps so that stop() and the destructor stop it promptly (within
// ~20 ms while it waits on the pool: the queued pieces of its steps are cancelled; the pool's
// reads hold their own handle of the file, never the mapping). Its
// owner (WeightArena) stops it before unmapping the spans, so it holds no reference to the
// owner and never keeps it alive; a process that exits while it runs simply ends it. A child
// forked while it runs has no such thread: forget_after_fork() (weight_arena.cpp's fork note).
// The caller decides whether warming is wise (warming more than RAM would evict the hot set
// to read cold experts: torch_ktmoe/layer_arenas.py checks the memory headroom first).
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "arena/reader_pool.h"

namespace ktmoe {

// A mapped range of a file: [addr, addr + bytes) maps the file from `offset`.
struct FileSpan {
  void* addr;
  int64_t bytes;
  int64_t offset;
};

class Prefaulter {
 public:
  Prefaulter() = default;
  ~Prefaulter() { stop(); }
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Warms `spans` of `file` (the spans must stay mapped until the run ends), after joining a
  // previous background run. wait=false: on the background thread, returning at once. False with *error
  // when a wait=true run failed; a background error is kept in status().
  // map_only: MADV_POPULATE_READ only (see above), and never a wait: while another run holds or runs the
  // prefaulter it starts nothing and returns true (the caller is a compute thread).
  bool run(std::vector<FileSpan> spans, std::shared_ptr<const ReadFile> file, bool wait, std::string* error,
           bool map_only = false);
  void join();  // waits for a background run, if any
  // Stops a running prefault (background, or wait=true on another thread) at its next 64 MiB
  // step and waits for it (its status: "error: stopped"); later runs go on.
  void stop();
  // "" (never run), "running", "populate_read", "willneed" (the method that completed) or
  // "error: ..." (what failed).
  std::string status() const;
  // Bytes of the spans the current (or last) run has gone through: its progress.
  int64_t done_bytes() const { return done_.load(); }
  // In the child of fork() only (its one thread, from the atfork handler): forgets a thread that
  // runs in the parent only, and the locks a parent thread may hold; a run that was going on
  // reads "error: stopped".
  void forget_after_fork();

 private:
  // sets status_ to the method used or the error
  void work(const std::vector<FileSpan>& spans, const std::shared_ptr<const ReadFile>& file, bool map_only);
  // Waits for a step's reads, "" or "stopped" or the pool's error.
  std::string wait_reads(const std::shared_ptr<ReadBatch>& batch);
  std::mutex run_mutex_;  // serialises run()/join()
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> done_{0};
  mutable std::mutex status_mutex_;
  std::string status_;
};

}  // namespace ktmoe
