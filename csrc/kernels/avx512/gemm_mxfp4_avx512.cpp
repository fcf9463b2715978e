// [NOTE] avx512 gemm_mxfp4 (AVX-512 BF16): c[m, 16*(b - b0) + j] =
//   Σ_G 2^(e[16b+j, G] - 127) · Σ_{k∈G} a[m][k] · e2m1(q[16b+j][k])      (mxfp4_format.h)
// by the tile loops of gemm_decoded_avx512.h (shared with gemm_fp8 and gemm_int4_affine).
//
// Decode, 32 bytes (one k-quad of a block: k-pair 2j in the low nibbles, 2j+1 in the high
// ones, each in the VNNI pair layout; kINT4A's data layout) -> two zmm of 32 bf16 e2m1 values,
// exact: NibbleSteps with T[i] = bf16(e2m1(i % 16)) (kMxfp4Bf16), a 16-entry LUT read by vpermw,
// 2 vector ops per 32 weights, then one vdpbf16ps per row and k-pair.
// Group end (every 32 inputs at the MX group): the 16 E8M0 bytes of the (block, group) become
// the fp32 2^(e - 127) in registers (vpmovzxbd, vpslld 23; e = 0, the subnormal 2^-127, by a
// masked move of its bits 0x00400000), and out = fma(s, acc, out): s * acc is exact in
// fp32's normal range, so this is generic's c + s * acc rounded once.
// The accumulation order is gemm_decoded_avx512.h's (a chain of vdpbf16ps per k-group, which
// adds each pair's odd product first): the bits depend neither on (b0, b1) nor on M, and
// differ from generic's k-ordered sum in the last places, within the tests' fp32 tolerance.
#include <immintrin.h>

#include "kernels/avx512/gemm_decoded_avx512.h"
#include "kernels/isa_kernels.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace avx512 {
namespace {

// The e2m1 decoder of gemm_decoded_avx512.h: NibbleSteps over the bf16 of e2m1 codes.
struct Mxfp4Decoder : decoded::NibbleSteps {
  static constexpr bool kRowSums = false;
  Mxfp4Decoder(const uint8_t* s, int64_t ng) : NibbleSteps(kMxfp4Bf16.v, s, ng, kMxfp4ScaleRecordBytes) {}

  // The 16 columns' 2^(e - 127) of block b, group g.
  inline __m512 scale(int64_t b, int64_t g) const { return e8m0_to_f32x16(record(b, g)); }
  inline __m512 offset(int64_t, int64_t) const { return _mm512_setzero_ps(); }
};

}  // namespace

// w: kMXFP4 matrix [np, kp] (+ 16 E8M0 bytes per 16 columns and k-group); a: bf16 rows [m, lda]
// (kp used, zero padded); c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  decoded::gemm_scaled<Mxfp4Decoder>(w, int4a_block_data_bytes(w->kp), a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx512
}  // namespace ktmoe
