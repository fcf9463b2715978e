// [NOTE] The one instruction the avx2_vnni kernels add to AVX2: vpdpbusd on 256 bits.
//
//   dot_u8s8(acc, u, s): acc[i] + Σ_{t<4} u[4i+t]·s[4i+t] for each dword lane i (u unsigned
//   bytes, s signed bytes): exact, no int16 step and no saturation (wraps mod 2^32).
//
// Which encoding this file compiles to is the build's choice:
//   * the library (isa_flags.json "avx2_vnni": -mavxvnni): the VEX form, AVX-VNNI (Intel
//     client chips since Alder Lake, Zen 5; cpuid 7.1 EAX bit 4);
//   * the native tests (tests/test_native_kernels.py also compiles this directory with the
//     "avx2_vnni_evex" flags, -mavx512vnni -mavx512vl): the EVEX form, the same operation,
//     which runs on AVX-512 VNNI hosts that lack AVX-VNNI.
// Both copies link into the test binary, so the names this directory defines with external
// linkage take the build's namespace (KTMOE_AVX2_VNNI_NS: avx2_vnni / avx2_vnni_evex) and
// table function (KTMOE_AVX2_VNNI_TABLE: avx2_vnni_kernels / avx2_vnni_evex_kernels).
// Everything else in these files is plain AVX2 + FMA + F16C.
//
// Written as inline asm, not the intrinsic: GCC 12 moves a vpdpbusd intrinsic's accumulator
// out to another register and back at every step of a loop (4 vmovdqa per 4 vpdpbusd in the
// one-row int8 loop: 9 instructions per 64 weight bytes instead of 7); the asm operand
// ("+x": tied, registers 0-15 in both encodings) keeps it in place.
#pragma once
#include <immintrin.h>

#if defined(__AVXVNNI__)
#define KTMOE_AVX2_VNNI_NS avx2_vnni
#define KTMOE_AVX2_VNNI_TABLE avx2_vnni_kernels
#define KTMOE_AVX2_VNNI_NAME "avx2_vnni"
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KTMOE_AVX2_VNNI_NS avx2_vnni_evex
#define KTMOE_AVX2_VNNI_TABLE avx2_vnni_evex_kernels
#define KTMOE_AVX2_VNNI_NAME "avx2_vnni_evex"
#else
#error "csrc/kernels/avx2_vnni/ needs -mavxvnni (or, for the native tests, -mavx512vnni -mavx512vl)"
#endif

namespace ktmoe {
namespace KTMOE_AVX2_VNNI_NS {

inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
#else
  asm("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
#endif
  return acc;
}

}  // namespace KTMOE_AVX2_VNNI_NS
}  // namespace ktmoe
