// Run-time CPU feature detection (cpuid + xgetbv), torch-free.
#pragma once
#include <string>

namespace ktmoe {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, with OS-saved YMM state
  bool avx512 = false;  // AVX-512 F/BW/VL/DQ + BF16 + VNNI, with OS-saved ZMM state
};

// Detected once, cached.
const CpuFeatures& cpu_features();

}  // namespace ktmoe
