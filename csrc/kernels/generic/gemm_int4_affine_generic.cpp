// [NOTE] Generic gemm_int4_affine over packed kINT4A weights (portable C++17, the oracle).
//
// Computes, for rows m < M and the 16*(b1-b0) output columns of blocks [b0, b1):
//     c[m*ldc + j] = Σ_G ( s[j,G] · Σ_{k∈G} a[m][k]·q[j][k]  +  o[j,G] · Σ_{k∈G} a[m][k] ),  o = -s·z
// by gemm_decoded (gemm_decoded_generic.h): each panel's nibbles are decoded once to
// fp32 codes q (exact), the row sums Σ a ride along (kRowSums); at a group's end each
// column's output gains s * acc, then o * xsum (each a multiply and an add; o = -(s * z)
// is exact for a bf16 / fp16 s, see int4_affine_format.h).
#include "kernels/generic/gemm_decoded_generic.h"
#include "kernels/int4_affine_format.h"

namespace ktmoe {
namespace generic {
namespace {

struct Int4AffinePanelDecoder {
  static constexpr bool kRowSums = true;
  const uint8_t* data;
  const uint8_t* scales;
  int64_t kp, group;
  // panel[c][j] = q(W[16*block + j][k0 + c]) for c < kc (k0, kc multiples of 4).
  void panel(int64_t block, int64_t k0, int64_t kc, float* out) const {
    nibble_panel(data, kp, block, k0, kc, [](uint8_t q) { return float(q); }, out);
  }
  void group_end(int64_t block, int64_t g, const float* acc, float xsum, float* c) const {
    const uint8_t* rec = scales + int4a_record_offset(kp, group, block * kBlockN, g);
    const float* s = reinterpret_cast<const float*>(rec);
    for (int64_t j = 0; j < kBlockN; ++j) {
      const float o = -(s[j] * float(rec[kInt4AffineZeroAt + j]));
      c[j] += s[j] * acc[j];
      c[j] += o * xsum;
    }
  }
};

}  // namespace

// w: kINT4A [np/16 blocks][kp/4][32] bytes + [np/16][kp/group] 80-byte (s, z) records;
// a: bf16 [m, lda] (lda >= kp, zero past k); c: fp32 [m, ldc], columns [0, 16*(b1-b0)).
void gemm_int4_affine(const PackedMatrixHeader* w, const uint16_t* a, int64_t lda, int64_t m, int64_t b0,
                      int64_t b1, float* c, int64_t ldc) {
  const Int4AffinePanelDecoder dec{packed_data(w), packed_scales(w), w->kp, w->group};
  gemm_decoded(w, dec, a, lda, m, b0, b1, c, ldc);
}

}  // namespace generic
}  // namespace ktmoe
