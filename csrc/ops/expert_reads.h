// [NOTE] Reads of routed experts ahead of their use: the ATen side of the reader pool (arena/reader_pool.h).
//
// read_ahead_experts queues each listed expert's packed rows (w13 [E, B13] and w2 [E, B2], uint8) for
// reading into the page cache and returns at once. Where the tensors view a file-backed arena's slice
// (WeightArena::holding), the rows become (file, offset, bytes) requests to the reader pool, whose I/O
// threads keep several in flight whatever the compute threads do. Where they do not (anonymous memory,
// another mapping), it does nothing: nothing to read. With the pool off (ReaderPool::set_threads(0)) it
// falls back to MADV_WILLNEED from the calling thread (arena/read_ahead.h). moe_forward(prefetch=true)
// calls it before the routed headers are checked; Python calls it as _C.read_ahead_experts.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace ktmoe {

// ids [n]: each id once, ids < 0 skipped; every id must be < E (checked by the caller). w13 and w2
// contiguous uint8 [E, B] (checked by the caller).
void read_ahead_experts(const at::Tensor& w13, const at::Tensor& w2, const int64_t* ids, int64_t n);

// The checked entry point: w13 [E, B13] and w2 [E, B2] contiguous CPU uint8 with one E, expert_ids any
// integer tensor (its elements in any shape). A bad shape, dtype or id >= E is an error.
void read_ahead_experts(const at::Tensor& w13, const at::Tensor& w2, const at::Tensor& expert_ids);

}  // namespace ktmoe
