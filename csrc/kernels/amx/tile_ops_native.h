// [NOTE] The real AMX instructions behind the TileOps interface (see tile_ops_emulated.h for
// the semantics and tile_config.h for the layout). Include only from csrc/kernels/amx/*.cpp,
// compiled with the amx flags, and run only when cpu_features().amx (CPUID, XCR0 and the
// Linux tile-data permission, requested by the detection).
//
// The tile numbers are template arguments printed into the instruction ("n" operands with
// the %c modifier): tile registers are named by the encoding, never by a value at run time.
// Operand order in AT&T syntax is reversed: `tdpbf16ps %tmmB, %tmmA, %tmmC` is Intel's
// `tdpbf16ps tmmC, tmmA, tmmB` (C += A · B).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/amx/tile_config.h"

namespace ktmoe {
namespace amx {

struct NativeTileOps {
  static void configure(const TileConfig& c) { _tile_loadconfig(&c); }
  static void release() { _tile_release(); }

  template <int T>
  static void zero() {
    __asm__ volatile("{tilezero\t%%tmm%c0|tilezero\ttmm%c0}" ::"n"(T));
  }
  template <int T>
  static void load(const void* base, int64_t stride) {
    __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm%c2|tileloadd\ttmm%c2, [%0+%1*1]}" ::"r"(base),
                     "r"(stride), "n"(T)
                     : "memory");
  }
  template <int T>
  static void store(void* base, int64_t stride) {
    __asm__ volatile("{tilestored\t%%tmm%c2, (%0,%1,1)|tilestored\t[%0+%1*1], tmm%c2}" ::"r"(base),
                     "r"(stride), "n"(T)
                     : "memory");
  }
  template <int C, int A, int B>
  static void dpbf16ps() {
    __asm__ volatile("{tdpbf16ps\t%%tmm%c2, %%tmm%c1, %%tmm%c0|tdpbf16ps\ttmm%c0, tmm%c1, tmm%c2}" ::"n"(C),
                     "n"(A), "n"(B));
  }
  template <int C, int A, int B>
  static void dpbsud() {
    __asm__ volatile("{tdpbsud\t%%tmm%c2, %%tmm%c1, %%tmm%c0|tdpbsud\ttmm%c0, tmm%c1, tmm%c2}" ::"n"(C),
                     "n"(A), "n"(B));
  }
};

}  // namespace amx
}  // namespace ktmoe
