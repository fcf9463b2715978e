// [NOTE] The checksum of a cache file's tensor data (torch-free).
//
// Built on CRC32C (Castagnoli), with the SSE4.2 crc32 instruction where the CPU
// has it (a table-driven fallback gives the same values). Definition:
//   * the data is cut into 1 MiB chunks (the last one shorter);
//   * a chunk is cut into 4 equal lanes (its length / 4 rounded down to 8 bytes;
//     the last lane takes the rest), each lane gets its CRC32C: four independent
//     chains keep the crc32 unit busy (one chain waits 3 cycles per 8 bytes);
//   * chunk value = CRC32C of its 4 lane CRCs (little-endian u32);
//   * data_checksum = CRC32C of all chunk values in order.
// Chunks run in parallel, so the value is the same for any thread count. It
// detects corruption (random bytes, a torn or overwritten region); it is no
// defence against a forger: the file's owner and permission checks are.
#pragma once
#include <cstdint>

#include "common/parallel_for.h"

namespace ktmoe {

// CRC32C of n bytes, continuing from crc (0 to start).
uint32_t crc32c(const void* data, int64_t n, uint32_t crc = 0);

// The chunked checksum above of n bytes.
uint32_t data_checksum(const void* data, int64_t n, const ParallelFor& parallel_for);

}  // namespace ktmoe
