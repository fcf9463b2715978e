// Asks the kernel to start reading a mapped range ahead of its use (torch-free).
//
// madvise(MADV_WILLNEED) on a file mapping queues asynchronous readahead of the
// file pages behind the range into the page cache and returns; the pages are not
// mapped (their first access is then a minor fault, not a disk read). A mapping
// made MADV_RANDOM (the arena's) still gets it: the advice is per range. On
// anonymous memory without swap it does nothing useful, so callers use it for
// file-backed experts only.
#pragma once
#include <cstdint>

namespace ktmoe {

// Best effort: the range is widened to whole pages and advised in 512 KiB pieces (the
// kernel reads at most max(read_ahead_kb, max_sectors_kb) per call); errors are ignored (the data
// is read on first use either way).
void read_ahead(const void* addr, int64_t bytes);

}  // namespace ktmoe
