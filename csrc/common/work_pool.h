// [NOTE] The library's own threads for its parallel loops (the MoE driver's phases, the packed linear).
//
// Why not ATen's pool (at::parallel_for, libgomp under torch): an OpenMP region ends in a barrier that
// every thread of the team must reach, even one that took no work; on shared cores (a co-tenant, a build,
// sglang's own processes) a thread descheduled for a timeslice (several ms) holds up the whole region, and
// libgomp's waiting threads spin (OMP_WAIT_POLICY, read once when torch loads), burning the timeslice the
// thread they wait for needs. A decode step is dozens of regions of ~0.1-1 ms: it collapsed 10-40x beside
// two busy processes on 2 cores (issue 54).
//
// This pool instead:
//   * lets the caller work: it publishes a job and takes chunks itself; it then waits only for chunks
//     that were taken and are still running, never for a worker that has not arrived (a late worker finds
//     no chunk left and goes back to sleep);
//   * hands out chunks from one shared counter (dynamic): a descheduled thread's share is taken by the
//     threads that run;
//   * waits with a bounded spin (50 µs, ~the gap between two phases of a decode step), then blocks on a
//     futex, in the workers (for the next job) and in the caller (for the last chunks).
// Results do not depend on which thread ran a chunk: callers write disjoint outputs per chunk, so the
// bits are the same for any thread count and schedule (reductions stay inside one chunk, in a fixed order).
//
// One job at a time (a second caller waits for the first); a call from inside a chunk, or with
// threads <= 1, or with a single chunk, runs body(0, n) on the calling thread. Workers start on first use
// (threads - 1 of them, the caller being one more) and live for the process; a forked child starts its own.
// An exception thrown by a chunk is rethrown by the caller after the job (the first one).
#pragma once
#include <cstdint>
#include <functional>

namespace ktmoe {

// body(begin, end) over [0, n) in chunks of `grain` items (the last one shorter), on the calling thread
// and up to threads - 1 pool workers.
void pool_parallel_for(int threads, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Worker threads the pool has started in this process (tests, `info`).
int pool_workers_started();

}  // namespace ktmoe
