// [NOTE] avx512 gemm_fp8 (AVX-512 BF16): c[m, 16*(b - b0) + j] =
//   Σ_G s[16b + j, G] · Σ_{k∈G} a[m][k] · e4m3(W[16b + j][k])      (fp8_format.h)
//
// Decode, 32 e4m3 bytes (one k-pair of a block) -> one zmm of 32 bf16 in the pair
// layout vdpbf16ps reads, each = e4m3 * 2^-8 exactly (the scale is taken * 2^8):
//   vpmovsxbw   s = the bytes sign-extended to words (low byte = the e4m3 byte)
//   vpsllw      s << 4: sign in bits 15..11, the 7 magnitude bits in 10..4
//   vpternlogd  r = (s<<4 & 0x87F0) | 0x3800: sign, bf16 exponent e + 112, mantissa m<<4
// That is exact for every byte with e > 0. Bytes with e = 0 (zero and subnormals)
// are found by one vptestnmb (byte & 0x78 == 0) per 64 bytes (2 k-pairs) of a block;
// only when one of the decode step's windows has any (rare in real weights: |q| <
// 2^-6 of 448, exact zeros, padding) every k-pair of the step is fixed up:
//   vptestnmw   k = its lanes with e = 0
//   vpermw      d = kSubnormalFix[byte & 31] (= [m] on those lanes)
//   vpaddw{k}   r += d on those lanes: the exact bf16 of ±m * 2^-17 (the sign bit is
//               kept: both magnitudes are below 0x8000).
// So ~3.5 vector ops per 32 weights, then one vdpbf16ps per row. Measured (1 thread,
// weights in L2, loaded 2-core host, N(0,1)-shaped e4m3 bytes, GB/s of fp8 weights):
// always fixing up (6 ops) 30, a vptestnmw + branch per k-pair 38, the byte test per
// 64 bytes 46 (bf16's kernel: 90 GB/s of its 2-byte weights).
//
// Out of cache the decode tiles prefetch into L2 (gemm_decoded_avx512.h). Measured by
// benchmarks/micro/fp8_decode_micro.cpp (Zen 5, loaded shared host; 64 experts x 4.7 MB
// walked in the driver's items; ms per forward of 8 experts at p10 / median of 1920-2560
// samples, % of a streaming read of the same bytes in the same run, two runs):
//   M = 1, 1 thread:  none 1.743 / 1.975 (76 %), 1.896 / 2.288 (76 %);
//                     L2 2 KiB ahead 1.563 / 1.763 (85 %), 1.710 / 1.967 (85 %);
//                     (a run that stopped at the call's last block: 2 KiB 1.643, 1 KiB 1.703,
//                     3 KiB 1.662, 4 KiB 1.659; an L1 prefetch (prefetcht0) 2 KiB ahead: 20 %
//                     slower than none)
//   M = 1, 2 threads: none 1.230 (80 %), 2 KiB 1.049 (94 %) (p10);  M = 4: 2.522 -> 2.169 ms.
// Hot (512 KiB in L2): 12.6 us either way. The other ideas, same benchmark, cold M = 1:
//   - a k-quad layout (4 consecutive k of a column in a dword: one 64-byte load, then
//     vpsraw / vpsllw + vpternlogd, 5 ops per 64 weights instead of 6 + 2 loads): hot
//     10.3 us (+20 %), cold 1.721 / 1.937 without prefetch, 1.655 / 1.845 with it: no
//     better than this layout cold; without the subnormal test (wrong, the bound) 9.3 us hot;
//   - NB = 8 blocks per tile at M = 1: 5-10 % slower cold, hot unchanged;
//   - prefetching only the next tile's block starts: within noise (2 %).
// So the decode was memory-bound in effect (the reads of one tile's 4 streams did not
// overlap the compute), not bound by its ops; the same prefetch takes int4_affine from
// 56-61 % to 79-83 % of the read roof.
//
// The tile loops (decode tiles for m <= 8, decoded L1 chunks for the prefill) and the
// accumulation order are gemm_decoded_avx512.h's, shared with gemm_int4_affine: per column
// and k-group, a chain of vdpbf16ps in k order, then out = fma(s * 2^8, acc, out).
// Measured (1 thread, 4 experts of 1536 x 2048, loaded host; ms, fp8 / bf16 kernel):
// m = 1: 0.33 / 1.0, m = 4: 0.6 / 1.0, m = 8: 1.2-1.7 / 1.3-1.9, m = 12: 1.9-2.7 / 1.7,
// m = 128: 17 / 16. (With register tiles only up to m = 2 and no prefetch in the
// prefill decode, m = 3..12 took 2-2.8 ms.)
#include <immintrin.h>

#include "kernels/avx512/amx_entry_points.h"
#include "kernels/avx512/gemm_decoded_avx512.h"
#include "kernels/fp8_format.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

// kSubnormalFix[m] (m < 8) = bf16 bits of m * 2^-17 minus (0x3800 | m << 4), mod 2^16.
struct SubnormalFix {
  alignas(64) uint16_t v[32] = {};
  constexpr SubnormalFix() {
    for (int m = 0; m < 8; ++m) v[m] = uint16_t(e4m3_subnormal_scaled_bf16(m) - (0x3800 | (m << 4)));
  }
};
constexpr SubnormalFix kSubnormalFix;

// The e4m3 decoder of gemm_decoded_avx512.h: a step is 2 k-pairs (64 bytes) of a block.
struct Fp8Decoder {
  static constexpr bool kRowSums = false;
  static constexpr int64_t kStepBytes = 64;
  const uint8_t* scales;  // block 0, group 0
  int64_t ngroups;
  __m512i keep = _mm512_set1_epi16(int16_t(0x87F0));
  __m512i bias = _mm512_set1_epi16(0x3800);
  __m512i expo = _mm512_set1_epi16(0x0078);  // the exponent bits of a sign-extended byte
  __m512i expo8 = _mm512_set1_epi8(0x78);     // the exponent bits of every byte
  __m512i fix = _mm512_load_si512(kSubnormalFix.v);
  Fp8Decoder(const uint8_t* s, int64_t ng) : scales(s), ngroups(ng) {}

  // The 32 e4m3 bytes at p sign-extended to words.
  static inline __m512i widen(const uint8_t* p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // bf16 of value * 2^-8 for the lanes of normal bytes (e > 0).
  inline __m512i normal(__m512i s) const {
    return _mm512_ternarylogic_epi32(_mm512_slli_epi16(s, 4), keep, bias, 0xEA);  // (A & B) | C
  }
  // Lanes with e = 0 (zero and subnormals).
  inline __mmask32 subnormal(__m512i s) const { return _mm512_testn_epi16_mask(s, expo); }
  // Bytes with e = 0 among the 64 at p.
  inline __mmask64 subnormal_bytes(const uint8_t* p) const {
    return _mm512_testn_epi8_mask(_mm512_loadu_si512(p), expo8);
  }
  // r with the lanes k made exact (+ kSubnormalFix[m]).
  inline __m512i fixed(__m512i r, __mmask32 k, __m512i s) const {
    return _mm512_mask_add_epi16(r, k, r, _mm512_permutexvar_epi16(s, fix));
  }

  template <int NB>
  struct Step {
    const uint8_t* w;  // block 0's k-pair p
    int64_t bstride;
    bool any;  // a byte with e = 0 among the NB x 64 bytes: fix up every pair of the step
  };
  // One byte test per 64 bytes (2 k-pairs) of each block finds the e = 0 bytes.
  template <int NB>
  inline Step<NB> step(const uint8_t* w, int64_t bstride, int64_t p) const {
    __mmask64 any = 0;
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) any |= subnormal_bytes(w + j * bstride + p * 32);
    return {w + p * 32, bstride, any != 0};
  }
  template <int NB>
  inline __m512i pair(const Step<NB>& st, int h, int j) const {
    const __m512i s = widen(st.w + j * st.bstride + h * 32);
    const __m512i r = normal(s);
    if (__builtin_expect(st.any, 0)) return fixed(r, subnormal(s), s);  // rare: zeros, |q| < 2^-6, padding
    return r;
  }
  // n (even) k-pairs of a block at p -> n zmm of bf16 (value * 2^-8) at out: the
  // fix-up only for 64-byte windows that hold e = 0 bytes.
  inline void pairs(const uint8_t* p, int64_t n, uint8_t* out) const {
    for (int64_t i = 0; i < n; i += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i * 32 + decoded::kPChunk * 32), _MM_HINT_T0);
      const bool any = subnormal_bytes(p + i * 32) != 0;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i s = widen(p + (i + h) * 32);
        __m512i r = normal(s);
        if (__builtin_expect(any, 0)) r = fixed(r, subnormal(s), s);
        _mm512_store_si512(out + (i + h) * 64, r);
      }
    }
  }
  // 16 scales of block b, group g, times 2^8 (kernels use e4m3 * 2^-8).
  inline __m512 scale(int64_t b, int64_t g) const {
    const float* s = reinterpret_cast<const float*>(scales + (b * ngroups + g) * kFp8ScaleBytes);
    return _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(kE4m3KernelScale));
  }
  inline __m512 offset(int64_t, int64_t) const { return _mm512_setzero_ps(); }
};

}  // namespace

// The amx tiles' view of kFP8 (amx/gemm_decoded_amx.cpp, gemm_amx.h's BlockDecoder / GroupScales):
// block `block` as kBF16 k-pair rows of e4m3 * 2^-8 (exact; never refused), and (block, g)'s 16
// scales * 2^8 (no offsets).
bool fp8_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out) {
  const Fp8Decoder dec(packed_scales(w), w->kp / w->group);
  dec.pairs(packed_data(w) + block * fp8_block_data_bytes(w->kp), w->kp / 2, out);
  return true;
}
void fp8_group_scales(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float*) {
  _mm512_storeu_ps(s, Fp8Decoder(packed_scales(w), w->kp / w->group).scale(block, g));
}

// w: kFP8 matrix [np, kp] (+ scales per 16 columns and k-group); a: bf16 rows [m, lda]
// (kp used, zero padded); c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_fp8(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
              int64_t b1, float* c, int64_t ldc) {
  decoded::gemm_scaled<Fp8Decoder>(w, fp8_block_data_bytes(w->kp), a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx512
}  // namespace ktmoe
