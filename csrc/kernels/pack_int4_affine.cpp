// [NOTE] int4a_pack_matrix / int4a_store_row: codes, fp32 scales and u8 zero points in the
// kINT4A layout (int4_affine_format.h).
//
// Nothing is rounded: code q[r][c] lands in its nibble at int4a_data_offset, each of the
// row's kp/group (s, z) pairs in its block's record. The blob is zeroed first, so padded
// inputs hold q = 0, padded rows s = 0 and z = 0, and every alignment gap is 0. Dense row r
// goes to packed row int4a_packed_row(h, r) (kGateUp: gate and up blocks interleaved).
// Checked first, so a refused matrix leaves out untouched: codes > 15, zero points > 16,
// non-finite scales.
#include "kernels/pack_int4_affine.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ktmoe {
namespace {

std::string where(int64_t expert, int64_t r) {
  return "int4_affine weights of expert " + std::to_string(expert) + ": row " + std::to_string(r);
}

void check_int4a_inputs(const PackedMatrixHeader& h, const uint8_t* const* q, const float* const* scale,
                        const uint8_t* const* zero, int64_t expert) {
  check_exact_header(h, WeightFormat::kINT4A, "int4a_pack_matrix");
  const int64_t ngroups = h.kp / h.group;
  for (int64_t r = 0; r < h.n; ++r) {
    for (int64_t c = 0; c < h.k; ++c)
      if (q[r][c] > 15)
        throw std::domain_error(where(expert, r) + ", column " + std::to_string(c) + ": code " +
                                std::to_string(int(q[r][c])) + " is not a 4-bit code (0..15)");
    for (int64_t g = 0; g < ngroups; ++g) {
      if (!std::isfinite(scale[r][g]))
        throw std::domain_error(where(expert, r) + ": scale of k-group " + std::to_string(g) + " is not finite");
      if (zero && zero[r][g] > kInt4AffineMaxZero)
        throw std::domain_error(where(expert, r) + ": zero point " + std::to_string(int(zero[r][g])) +
                                " of k-group " + std::to_string(g) + " is out of range (0..16)");
    }
  }
}

}  // namespace

void int4a_store_row(const PackedMatrixHeader& h, int64_t pr, const uint8_t* q, const float* s, const uint8_t* z,
                     uint8_t* data, uint8_t* scales) {
  for (int64_t c = 0; c < h.k; ++c) data[int4a_data_offset(h.kp, pr, c)] |= uint8_t(q[c] << int4a_nibble_shift(c));
  for (int64_t g = 0; g < h.kp / h.group; ++g) {
    uint8_t* rec = scales + int4a_record_offset(h.kp, h.group, pr, g);
    std::memcpy(rec + (pr % kBlockN) * 4, &s[g], 4);
    rec[kInt4AffineZeroAt + pr % kBlockN] = z[g];
  }
}

void int4a_pack_matrix(const PackedMatrixHeader& h, const uint8_t* const* q, const float* const* scale,
                       const uint8_t* const* zero, int64_t expert, uint8_t* out) {
  check_int4a_inputs(h, q, scale, zero, expert);
  std::memset(out, 0, static_cast<size_t>(h.total_bytes));
  std::memcpy(out, &h, sizeof(h));
  const std::string symmetric(static_cast<size_t>(h.kp / h.group), char(kInt4AffineSymmetricZero));
  for (int64_t r = 0; r < h.n; ++r)
    int4a_store_row(h, int4a_packed_row(h, r), q[r], scale[r],
                    zero ? zero[r] : reinterpret_cast<const uint8_t*>(symmetric.data()), out + h.data_offset,
                    out + h.scale_offset);
}

}  // namespace ktmoe
