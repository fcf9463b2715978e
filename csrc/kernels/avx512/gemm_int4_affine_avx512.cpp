// [NOTE] avx512 gemm_int4_affine (AVX-512 BF16): c[m, 16*(b - b0) + j] =
//   Σ_G ( s[16b+j, G] · Σ_{k∈G} a[m][k]·q[16b+j][k]  +  o[16b+j, G] · Σ_{k∈G} a[m][k] ),  o = -s·z
// (int4_affine_format.h), by the tile loops of gemm_decoded_avx512.h (shared with gemm_fp8).
//
// Decode, 32 bytes (one k-quad of a block: k-pair 2j in the low nibbles, 2j+1 in the high
// ones, each in the VNNI pair layout) -> two zmm of 32 bf16 codes, exact: gemm_decoded_avx512.h's
// NibbleSteps with T[i] = bf16(i % 16), 2 vector ops per 32 weights before the vdpbf16ps of each
// row (fp8's decode takes 3.5).
// The row sums xsum_G = Σ_{k∈G} a[m][k] are computed once per call (vdpbf16ps against bf16
// ones, then a horizontal add: m x kp / 32 instructions), and each (block, group) of a
// tile ends with out = fma(s, acc, out), out = fma(o, xsum_G, out), where o = -(s * z)
// (z widened from its byte: exact for bf16 / fp16 s). Those bits depend neither on (b0, b1)
// nor on M; they differ from generic's (which rounds s * acc and o * xsum before adding) in
// the last place, within the bf16 bound the tests hold every ISA to.
// The decode tiles prefetch each block's stream 2 KiB ahead into L2 (gemm_decoded_avx512.h).
// Measured by benchmarks/micro/fp8_decode_micro.cpp (group 128, 64 experts x 2.4 MB walked in the
// driver's items, M = 1, 1 thread, ms per forward of 8 experts at p10 / median, % of the
// read roof): without 1.233 / 1.356 (56 %), 1.253 / 1.522 (61 %); with 0.874 / 0.995 (79 %),
// 0.909 / 1.099 (83 %); 2 threads 0.759 -> 0.617 ms; M = 4 1.970 -> 1.768 ms. Hot
// (512 KiB in L2) 18.7 us either way: this kernel is bound by its ops at ~26 GB/s.
#include <immintrin.h>

#include "kernels/avx512/amx_entry_points.h"
#include "kernels/avx512/gemm_decoded_avx512.h"
#include "kernels/int4_affine_format.h"
#include "kernels/isa_kernels.h"

namespace ktmoe {
namespace avx512 {
namespace {

// The nibble decoder of gemm_decoded_avx512.h: NibbleSteps over the bf16 of codes 0..15.
struct Int4AffineDecoder : decoded::NibbleSteps {
  static constexpr bool kRowSums = true;
  Int4AffineDecoder(const uint8_t* s, int64_t ng) : NibbleSteps(kInt4AffineBf16.v, s, ng, kInt4AffineRecordBytes) {}

  inline __m512 scale(int64_t b, int64_t g) const { return _mm512_loadu_ps(record(b, g)); }
  // o = -(s * z): the product is exact for bf16 / fp16 s, the sign flip always is.
  inline __m512 offset(int64_t b, int64_t g) const {
    const uint8_t* r = record(b, g);
    const __m128i z8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + kInt4AffineZeroAt));
    const __m512 sz = _mm512_mul_ps(_mm512_loadu_ps(r), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(z8)));
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(sz), _mm512_set1_epi32(int32_t(0x80000000u))));
  }
};

// xs[r * ngroups + g] = Σ_{k∈g} a[r][k] (fp32), r < m: pairs against bf16 ones, then one horizontal add.
void row_group_sums(const uint16_t* a, int64_t lda, int64_t m, int64_t group, int64_t ngroups, float* xs) {
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < ngroups; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = g * group; k < (g + 1) * group; k += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a + r * lda + k), ones);
      xs[r * ngroups + g] = _mm512_reduce_add_ps(acc);
    }
}

}  // namespace

// The amx tiles' view of kINT4A (amx/gemm_decoded_amx.cpp, gemm_amx.h's BlockDecoder / GroupScales):
// block `block` as kBF16 k-pair rows of its codes q (exact; never refused), (block, g)'s 16 s and
// o = -(s * z), and the rows' group sums xs [m, kp / group] (row_group_sums).
bool int4a_block_to_bf16(const PackedMatrixHeader* w, int64_t block, uint8_t* out) {
  const Int4AffineDecoder dec(packed_scales(w), w->kp / w->group);
  dec.pairs(packed_data(w) + block * int4a_block_data_bytes(w->kp), w->kp / 2, out);
  return true;
}
void int4a_group_scales(const PackedMatrixHeader* w, int64_t block, int64_t g, float* s, float* o) {
  const Int4AffineDecoder dec(packed_scales(w), w->kp / w->group);
  _mm512_storeu_ps(s, dec.scale(block, g));
  _mm512_storeu_ps(o, dec.offset(block, g));
}
void int4a_row_group_sums(const uint16_t* a, int64_t lda, int64_t m, int64_t group, int64_t ngroups, float* xs) {
  row_group_sums(a, lda, m, group, ngroups, xs);
}

// w: kINT4A matrix [np, kp] (+ an (s, z) record per 16 columns and k-group); a: bf16 rows
// [m, lda] (kp used, zero padded); c: [m, ldc] fp32, columns 0 .. 16*(b1-b0) written.
void gemm_int4_affine(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc) {
  if (m <= 0 || b1 <= b0) return;
  const int64_t kp = w->kp, group = w->group, ngroups = kp / group;
  static thread_local Scratch xbuf;
  float* xs = reinterpret_cast<float*>(xbuf.at_least(size_t(m * ngroups) * 4));
  row_group_sums(a, lda, m, group, ngroups, xs);
  const decoded::Ctx x{packed_data(w), int4a_block_data_bytes(kp), ngroups, group / 2, xs, w->np / kBlockN};
  decoded::gemm(Int4AffineDecoder(packed_scales(w), ngroups), x, kp, a, lda, m, b0, b1, c, ldc);
}

}  // namespace avx512
}  // namespace ktmoe
