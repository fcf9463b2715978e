// [NOTE] CRC32C and the chunked data checksum (see data_checksum.h).
// The SSE4.2 path is compiled with a target attribute and chosen by cpuid at run
// time, so this file needs no ISA flags; the table path is the portable oracle.
#include "common/data_checksum.h"

#include <cpuid.h>
#include <nmmintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace ktmoe {
namespace {

constexpr int64_t kChunk = int64_t(1) << 20;
constexpr int kLanes = 4;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}

uint32_t crc32c_table(const uint8_t* p, int64_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_table();
  crc = ~crc;
  for (int64_t i = 0; i < n; ++i) crc = (crc >> 8) ^ table[(crc ^ p[i]) & 0xFFu];
  return ~crc;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const uint8_t* p, int64_t n, uint32_t crc) {
  uint64_t c = ~crc & 0xFFFFFFFFu;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    c = _mm_crc32_u64(c, v);
  }
  for (; i < n; ++i) c = _mm_crc32_u8(uint32_t(c), p[i]);
  return ~uint32_t(c);
}

// The 4 lanes of one chunk in one loop: independent crc32 chains.
__attribute__((target("sse4.2"))) void lanes_hw(const uint8_t* const lane[kLanes], int64_t len, uint32_t out[kLanes]) {
  uint64_t c0 = 0xFFFFFFFFu, c1 = c0, c2 = c0, c3 = c0;
  for (int64_t i = 0; i + 8 <= len; i += 8) {
    uint64_t v0, v1, v2, v3;
    std::memcpy(&v0, lane[0] + i, 8);
    std::memcpy(&v1, lane[1] + i, 8);
    std::memcpy(&v2, lane[2] + i, 8);
    std::memcpy(&v3, lane[3] + i, 8);
    c0 = _mm_crc32_u64(c0, v0);
    c1 = _mm_crc32_u64(c1, v1);
    c2 = _mm_crc32_u64(c2, v2);
    c3 = _mm_crc32_u64(c3, v3);
  }
  out[0] = ~uint32_t(c0);
  out[1] = ~uint32_t(c1);
  out[2] = ~uint32_t(c2);
  out[3] = ~uint32_t(c3);
}

bool has_sse42() {
  static const bool yes = [] {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2);
  }();
  return yes;
}

uint32_t chunk_value(const uint8_t* p, int64_t n) {
  const int64_t lane_len = n / kLanes / 8 * 8;
  uint32_t crc[kLanes];
  const uint8_t* lane[kLanes] = {p, p + lane_len, p + 2 * lane_len, p + 3 * lane_len};
  if (has_sse42()) {
    lanes_hw(lane, lane_len, crc);  // lanes 0..2 whole; lane 3 continues below
    crc[kLanes - 1] = crc32c(lane[kLanes - 1] + lane_len, n - kLanes * lane_len, crc[kLanes - 1]);
  } else {
    for (int l = 0; l < kLanes; ++l) crc[l] = crc32c_table(lane[l], l + 1 < kLanes ? lane_len : n - 3 * lane_len, 0);
  }
  uint8_t bytes[4 * kLanes];
  for (int l = 0; l < kLanes; ++l)
    for (int b = 0; b < 4; ++b) bytes[4 * l + b] = uint8_t(crc[l] >> (8 * b));
  return crc32c(bytes, sizeof(bytes));
}

}  // namespace

uint32_t crc32c(const void* data, int64_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  return has_sse42() ? crc32c_hw(p, n, crc) : crc32c_table(p, n, crc);
}

uint32_t data_checksum(const void* data, int64_t n, const ParallelFor& parallel_for) {
  const auto* p = static_cast<const uint8_t*>(data);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<uint8_t> values(size_t(chunks) * 4);
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const uint32_t v = chunk_value(p + c * kChunk, std::min(kChunk, n - c * kChunk));
      for (int b = 0; b < 4; ++b) values[size_t(4 * c + b)] = uint8_t(v >> (8 * b));
    }
  });
  return crc32c(values.data(), int64_t(values.size()));
}

}  // namespace ktmoe
