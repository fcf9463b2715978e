#include "common/cpu_features.h"

#include <cpuid.h>
#include <cstdint>

namespace ktmoe {
namespace {

uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;           // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return f;
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
  const bool avx2 = b7 & (1u << 5);
  const bool avx512f = b7 & (1u << 16), avx512dq = b7 & (1u << 17);
  const bool avx512bw = b7 & (1u << 30), avx512vl = b7 & (1u << 31);
  const bool avx512vnni = c7 & (1u << 11);
  const bool avx512bf16 = a71 & (1u << 5);
  f.avx2 = ymm_state && avx2 && fma && f16c;
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni &&
             avx512bf16;
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace ktmoe
