// [NOTE] amx gemm_mxfp4: kMXFP4 on tdpbf16ps tiles for prefill rows (m >= prefill_min_rows()),
// below them avx512's integer kernel (gemm_nibble_int16_avx512.cpp: vpdpwssd, since vdpbf16ps
// costs these cores 2 cycles of the decode's port; generic's bits). An MXFP4 weight e2m1(q) * 2^(e - 127) is exactly a bf16 (2
// significant bits), so each block is decoded once per call, scales folded in, to the kBF16
// k-pair rows (an L2 buffer of kp * 32 bytes) and the tiles run as for kBF16 (gemm_amx.h's
// BlockDecoder): no per-group epilogue, which is what keeps int4 / grouped int8 off the tiles.
//
// Decode per (block, group of 32 inputs): the 16 E8M0 bytes -> d = e - 127 per column; per
// k-quad (32 bytes: two k-pair rows) vpmovzxbw, vpermw of kMxfp4Bf16 for the low and high
// nibbles (the bf16 of e2m1(q), exponent field 126..129 where nonzero), then d << 7 added to
// the exponent of every nonzero word (vpaddw under a vptestmw mask): exact and normal while
// e is in [2, 252]. A block with a nonzero code under a scale outside that (a weight that
// would be a bf16 subnormal, which AMX reads as 0, or overflow to Inf, and 0 * Inf = NaN) runs
// avx512's kernel for the call's rows (padded rows have e = 0 and zero codes: they stay on
// tiles). Bits: tdpbf16ps's sums (tile_ops_emulated.h) over the decoded weights, i.e. amx
// gemm_bf16's bits for the kBF16 matrix of the same values; they differ from avx512's
// per-group fp32 sums within the fp32 sum's bound, and depend neither on (b0, b1) nor on the
// block pairing (each block is on tiles or not by its own scales).
#include <immintrin.h>

#include "kernels/amx/gemm_amx.h"
#include "kernels/amx/prefill_rows.h"
#include "kernels/amx/tile_ops_native.h"
#include "kernels/avx512/amx_entry_points.h"
#include "kernels/isa_kernels.h"
#include "kernels/mxfp4_format.h"

namespace ktmoe {
namespace avx512 {
KTMOE_DECLARE_ISA_ENTRY_POINTS();
}  // namespace avx512

namespace amx {

// BlockDecoder of kMXFP4 (AVX-512 BW): block `block` of w -> kp/2 k-pair rows of bf16 at out;
// false (out partly written) for a block with a nonzero code under a scale outside [2, 252].
bool mxfp4_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out) {
  const int64_t kp = w->kp, group = w->group, ngroups = kp / group;
  const uint8_t* q = packed_data(w) + block * int4a_block_data_bytes(kp);
  const uint8_t* e = packed_scales(w) + block * ngroups * kMxfp4ScaleRecordBytes;
  const __m512i table = _mm512_load_si512(kMxfp4Bf16.v), magnitude = _mm512_set1_epi16(0x7FFF);
  for (int64_t g = 0; g < ngroups; ++g, e += kMxfp4ScaleRecordBytes, q += group * 8, out += group * 32) {
    const __m512i e32 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e)));
    // columns whose scale is outside [2, 252]: their nonzero codes refuse the block
    const __mmask16 outside = _mm512_cmpgt_epu32_mask(_mm512_sub_epi32(e32, _mm512_set1_epi32(2)), _mm512_set1_epi32(250));
    const __m512i guard = _mm512_maskz_mov_epi32(outside, magnitude);
    const __m512i d = _mm512_slli_epi32(_mm512_sub_epi32(e32, _mm512_set1_epi32(kE8m0Bias)), 7);
    const __m512i add = _mm512_or_si512(_mm512_and_si512(d, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(d, 16));
    for (int64_t j = 0; j < group / 4; ++j) {
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j * 32)));
      const __m512i lo = _mm512_permutexvar_epi16(v, table);
      const __m512i hi = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table);
      if (outside && (_mm512_test_epi16_mask(lo, guard) | _mm512_test_epi16_mask(hi, guard))) return false;
      _mm512_store_si512(out + (2 * j) * 64, _mm512_mask_add_epi16(lo, _mm512_test_epi16_mask(lo, magnitude), lo, add));
      _mm512_store_si512(out + (2 * j + 1) * 64,
                         _mm512_mask_add_epi16(hi, _mm512_test_epi16_mask(hi, magnitude), hi, add));
    }
  }
  return true;
}

// w: kMXFP4 matrix [np, kp]; a: bf16 rows [m, lda] (kp used, zero padded);
// c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_mxfp4(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0, int64_t b1,
                float* c, int64_t ldc) {
  if (m < prefill_min_rows()) return avx512::gemm_mxfp4_int16(w, a, lda, m, b0, b1, c, ldc);
  gemm_bf16_tiles<NativeTileOps>(w, a, lda, m, b0, b1, c, ldc, mxfp4_block_to_bf16, avx512::gemm_mxfp4);
}

}  // namespace amx
}  // namespace ktmoe
