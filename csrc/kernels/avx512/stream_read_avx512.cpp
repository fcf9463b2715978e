// [NOTE] stream_read_avx512: the read-bandwidth roof of the benchmarks.
//
// Sums `bytes` bytes of buf as int32 lanes with 64-byte loads into 8 independent
// accumulators (512 bytes per iteration), so the core keeps enough loads in flight
// to reach its share of DRAM bandwidth; integer adds avoid any float-assist cost on
// arbitrary bit patterns. Single-threaded: the caller splits the buffer over its
// threads. Returns the sum (as float) so the loads are not elided.
#include <immintrin.h>

#include <cstring>

#include "kernels/isa_kernels.h"

namespace ktmoe {

float stream_read_avx512(const void* buf, int64_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 512 <= bytes; i += 512) {
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u)
      acc[u] = _mm512_add_epi32(acc[u], _mm512_loadu_si512(p + i + 64 * u));
  }
  for (; i + 64 <= bytes; i += 64) acc[0] = _mm512_add_epi32(acc[0], _mm512_loadu_si512(p + i));
  for (int u = 1; u < 8; ++u) acc[0] = _mm512_add_epi32(acc[0], acc[u]);
  int32_t tail = 0;
  for (; i < bytes; ++i) tail += p[i];
  return static_cast<float>(_mm512_reduce_add_epi32(acc[0])) + static_cast<float>(tail);
}

}  // namespace ktmoe
