// [NOTE] mxfp4_pack_matrix / mxfp4_store_row: e2m1 codes and E8M0 bytes in the kMXFP4 layout
// (mxfp4_format.h).
//
// Nothing is rounded: code q[r][c] lands in its nibble at int4a_data_offset (kINT4A's data
// layout), each of the row's kp/group E8M0 bytes in its block's 16-byte record. The blob is
// zeroed first, so padded inputs hold code 0 (+0), padded rows e = 0, and every alignment gap
// is 0. Dense row r goes to packed row int4a_packed_row(h, r) (kGateUp: gate and up blocks
// interleaved). Checked first, so a refused matrix leaves out untouched: codes > 15 and the
// E8M0 NaN 0xFF (it would poison every output of the expert).
#include "kernels/pack_mxfp4.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace ktmoe {
namespace {

std::string where(int64_t expert, int64_t r) {
  return "mxfp4 weights of expert " + std::to_string(expert) + ": row " + std::to_string(r);
}

void check_mxfp4_inputs(const PackedMatrixHeader& h, const uint8_t* const* q, const uint8_t* const* e,
                        int64_t expert) {
  check_exact_header(h, WeightFormat::kMXFP4, "mxfp4_pack_matrix");
  for (int64_t r = 0; r < h.n; ++r) {
    for (int64_t c = 0; c < h.k; ++c)
      if (q[r][c] > 15)
        throw std::domain_error(where(expert, r) + ", column " + std::to_string(c) + ": code " +
                                std::to_string(int(q[r][c])) + " is not a 4-bit e2m1 code (0..15)");
    for (int64_t g = 0; g < h.kp / h.group; ++g)
      if (e[r][g] == kE8m0Nan)
        throw std::domain_error(where(expert, r) + ": scale of k-group " + std::to_string(g) +
                                " is the E8M0 NaN (0xff)");
  }
}

}  // namespace

void mxfp4_store_row(const PackedMatrixHeader& h, int64_t pr, const uint8_t* q, const uint8_t* e, uint8_t* data,
                     uint8_t* scales) {
  for (int64_t c = 0; c < h.k; ++c) data[int4a_data_offset(h.kp, pr, c)] |= uint8_t(q[c] << int4a_nibble_shift(c));
  for (int64_t g = 0; g < h.kp / h.group; ++g) scales[mxfp4_scale_offset(h.kp, h.group, pr, g)] = e[g];
}

void mxfp4_pack_matrix(const PackedMatrixHeader& h, const uint8_t* const* q, const uint8_t* const* e,
                       int64_t expert, uint8_t* out) {
  check_mxfp4_inputs(h, q, e, expert);
  std::memset(out, 0, static_cast<size_t>(h.total_bytes));
  std::memcpy(out, &h, sizeof(h));
  for (int64_t r = 0; r < h.n; ++r)
    mxfp4_store_row(h, int4a_packed_row(h, r), q[r], e[r], out + h.data_offset, out + h.scale_offset);
}

}  // namespace ktmoe
