#include "common/cpu_features.h"

#include <cpuid.h>
#include <cstdint>
#include <cstring>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace ktmoe {
namespace {

uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux keeps the 8 KiB tile data state off until a process asks for it; the first tile
// instruction without this permission raises SIGILL. The permission is process-wide.
// Returns "" when granted, else what failed.
std::string request_tile_permission() {
#if defined(__linux__)
  constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return std::string("permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  uint64_t granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0 ||
      !(granted & (uint64_t(1) << kXfeatureXtiledata)))
    return "permission for AMX tile data (arch_prctl ARCH_GET_XCOMP_PERM does not list XTILEDATA)";
  return "";
#else
  return "AMX support of this operating system (only Linux is handled)";
#endif
}

// "" when the CPU and OS run the amx kernels, else the first missing piece.
std::string amx_missing(uint64_t xcr0, unsigned d7) {
  if (!(d7 & (1u << 24))) return "AMX-TILE";
  if (!(d7 & (1u << 22))) return "AMX-BF16";
  if (!(d7 & (1u << 25))) return "AMX-INT8";
  if ((xcr0 & (uint64_t(3) << 17)) != (uint64_t(3) << 17))
    return "OS-saved tile state (XCR0 XTILECFG + XTILEDATA)";
  // Palette 1 (cpuid 0x1D.1): the kernels use 8 tiles of 16 rows x 64 bytes.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(0x1D, 0, &a, &b, &c, &d) || a < 1) return "AMX tile palette 1";
  __get_cpuid_count(0x1D, 1, &a, &b, &c, &d);
  const unsigned bytes_per_row = a >> 16, max_names = b >> 16, max_rows = c & 0xFFFF;
  if (bytes_per_row < 64 || max_names < 8 || max_rows < 16)
    return "AMX tile palette 1 with 8 tiles of 16 rows x 64 bytes";
  return request_tile_permission();
}

CpuFeatures detect() {
  CpuFeatures f;
  f.amx_missing = "AMX-TILE";
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
  const bool avx512bf16 = a71 & (1u << 5), avx_vnni = a71 & (1u << 4);
  f.avx2 = ymm_state && avx2 && fma && f16c;
  f.avx2_vnni = f.avx2 && avx_vnni;
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni &&
             avx512bf16;
  f.amx_missing = amx_missing(xcr0, d7);
  f.amx = f.amx_missing.empty();
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace ktmoe
