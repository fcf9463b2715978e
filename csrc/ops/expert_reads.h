// [NOTE] Reads of routed experts ahead of their use: the ATen side of the reader pool (arena/reader_pool.h).
//
// read_ahead_experts queues each listed expert's packed rows (w13 [E, B13] and w2 [E, B2], uint8) for
// reading into the page cache and returns at once. Where the tensors view a file-backed arena's slice
// (WeightArena::holding), the rows become (file, offset, bytes) requests to the reader pool, whose I/O
// threads keep several in flight whatever the compute threads do. Where they do not (anonymous memory,
// another mapping), it does nothing: nothing to read. With the pool off (ReaderPool::set_threads(0)) it
// falls back to MADV_WILLNEED from the calling thread (arena/read_ahead.h). Python calls it as
// _C.read_ahead_experts (torch_ktmoe.expert_reads): for reads issued ahead of a layer's compute.
//
// advise_experts is moe_forward(prefetch=true)'s read-ahead, issued right before the routed headers are
// checked: MADV_WILLNEED over the rows, from the calling thread. Measured against queueing them to the
// pool there (benchmarks/memory/bench_reader_pool.py, 24 int8 layers of 32 experts, 1 GiB cgroup, load
// ~2): WILLNEED 2.19 tok/s, 582 MB read per token; the pool 1.50 tok/s, 814 MB per token. WILLNEED queues
// every routed row's I/O at once before the compute touches them, so the kernel's own depth is there;
// the pool's pieces start only as its threads get to them, so the compute thread's faults (which read
// whole 2 MiB folios on the arena's MADV_HUGEPAGE mappings) come first and read neighbours' bytes too.
// The pool pays off where reads are issued ahead of the compute (the warm, a next layer's experts).
//
// advise_experts skips a forward whose routed experts cover at least 3/4 of the layer (a prefill, a
// batch): the gemms' own faults then read nearly the same bytes, and faster. Measured
// (bench_disk_bound --prefill T, the stack above from a dropped page cache, uniform routing, alternated,
// 2 rounds): T=512 (every expert) 2.74-2.82 s without WILLNEED against 3.22-3.35 s with it; T=8 and 16
// (~90 % and ~100 % of the experts) 1.38-1.59 s against 1.66-1.89 s; T=4 (~70 %) the other way, 1.41-1.55
// s against 1.24-1.27 s, WILLNEED reading 1.87 GB instead of 2.54; decode (T=1, 25 %) 2.2-2.3 tok/s with
// it, 1.4-1.5 without. Where the share is high WILLNEED saves few bytes and costs the calling thread
// the page allocations (and the cgroup's reclaim) before any compute starts; the faults read whole
// 2 MiB folios from both compute threads. Advising from every compute thread at once was no faster.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>

namespace ktmoe {

// Whether the distinct ids >= 0 among ids[0, n) are at least 3/4 of num_experts (a prefill: see above; the
// same test decides a prefill's streaming of the next layer, torch_ktmoe/layer.py).
bool routed_to_most(int64_t num_experts, const int64_t* ids, int64_t n);
// The checked form for Python: topk_ids any integer CPU tensor, ids < num_experts.
bool routed_to_most(int64_t num_experts, const at::Tensor& topk_ids);

// MADV_WILLNEED over the listed experts' rows, from this thread (ids as below), unless routed_to_most.
void advise_experts(const at::Tensor& w13, const at::Tensor& w2, const int64_t* ids, int64_t n);
// The same over any expert tensors [E, ...] whose experts' bytes are each contiguous, stride(0) apart (a GGUF
// layer's gate, up and down [E, rows, row bytes]).
void advise_experts(std::initializer_list<const at::Tensor*> tensors, const int64_t* ids, int64_t n);

// ids [n]: each id once, ids < 0 skipped; every id must be < E (checked by the caller). w13 and w2
// contiguous uint8 [E, B] (checked by the caller).
void read_ahead_experts(const at::Tensor& w13, const at::Tensor& w2, const int64_t* ids, int64_t n);

// The checked entry point: w13 [E, B13] and w2 [E, B2] contiguous CPU uint8 with one E, expert_ids any
// integer tensor (its elements in any shape). A bad shape, dtype or id >= E is an error.
void read_ahead_experts(const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& expert_ids);

}  // namespace ktmoe
