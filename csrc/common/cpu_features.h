// Run-time CPU feature detection (cpuid + xgetbv, and for AMX the Linux permission), torch-free.
#pragma once
#include <string>

namespace ktmoe {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, with OS-saved YMM state
  bool avx2_vnni = false;  // avx2 + AVX-VNNI (the 256-bit VEX vpdpbusd; cpuid 7.1 EAX bit 4)
  bool avx512 = false;  // AVX-512 F/BW/VL/DQ + BF16 + VNNI, with OS-saved ZMM state
  // AMX-TILE + AMX-BF16 + AMX-INT8 with palette 1 (8 tiles of 16 rows x 64 bytes), OS-saved
  // tile state (XCR0 XTILECFG + XTILEDATA) and this process's permission to use tile data
  // (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), requested by the detection).
  bool amx = false;
  std::string amx_missing;  // when !amx: the first missing piece, e.g. "AMX-TILE" ("" if amx)
};

// Detected once, cached.
const CpuFeatures& cpu_features();

}  // namespace ktmoe
