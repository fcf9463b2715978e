// [NOTE] fp8_pack_matrix: e4m3 bytes and fp32 scales copied into the kFP8 layout.
//
// Nothing is rounded: each byte of a dense row lands at fp8_data_offset, each of the
// row's kp/group scales is written at fp8_scale_offset of its packed row. The blob is
// zeroed first, so padded weights are 0x00 (+0.0), padded rows have scale 0 and every
// alignment gap is 0. Dense row r goes to packed row
//   kGateUp: gate row r < I -> 32*(r/16) + r%16, up row I + r -> 32*(r/16) + 16 + r%16;
//   kPlain / kDown: r.
// Checked first, so a refused matrix leaves out untouched: NaN bytes (0x7F, 0xFF;
// e4m3fn has no infinity) and non-finite scales.
#include "kernels/pack_fp8.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ktmoe {
namespace {

int64_t packed_row_of(const PackedMatrixHeader& h, int64_t r) {
  if (h.role != static_cast<uint8_t>(MatrixRole::kGateUp)) return r;
  const int64_t inter = h.n / 2, up = r >= inter, i = up ? r - inter : r;
  return 2 * kBlockN * (i / kBlockN) + up * kBlockN + i % kBlockN;
}

std::string where(int64_t expert, int64_t r) {
  return "fp8 weights of expert " + std::to_string(expert) + ": row " + std::to_string(r);
}

void check_fp8_inputs(const PackedMatrixHeader& h, const uint8_t* const* q, const float* const* scale,
                      int64_t expert) {
  check_exact_header(h, WeightFormat::kFP8, "fp8_pack_matrix");
  const int64_t ngroups = h.kp / h.group;
  for (int64_t r = 0; r < h.n; ++r) {
    for (int64_t c = 0; c < h.k; ++c)
      if (e4m3_is_nan(q[r][c]))
        throw std::domain_error(where(expert, r) + ", column " + std::to_string(c) +
                                " is an e4m3 NaN byte (0x" + (q[r][c] & 0x80 ? "ff" : "7f") + ")");
    for (int64_t g = 0; g < ngroups; ++g)
      if (!std::isfinite(scale[r][g]))
        throw std::domain_error(where(expert, r) + ": scale of k-group " + std::to_string(g) +
                                " is not finite");
  }
}

}  // namespace

std::vector<const float*> fp8_scale_rows(const float* s, int64_t rows, int64_t bn, int64_t per_row) {
  if (bn <= 0 || per_row <= 0) throw std::invalid_argument("fp8_scale_rows: bn and per_row must be > 0");
  std::vector<const float*> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) out[size_t(r)] = s + (r / bn) * per_row;
  return out;
}

void fp8_pack_matrix(const PackedMatrixHeader& h, const uint8_t* const* q, const float* const* scale,
                     int64_t expert, uint8_t* out) {
  check_fp8_inputs(h, q, scale, expert);
  std::memset(out, 0, static_cast<size_t>(h.total_bytes));
  std::memcpy(out, &h, sizeof(h));
  uint8_t* data = out + h.data_offset;
  uint8_t* scales = out + h.scale_offset;
  const int64_t ngroups = h.kp / h.group;
  for (int64_t r = 0; r < h.n; ++r) {
    const int64_t pr = packed_row_of(h, r);
    for (int64_t c = 0; c < h.k; ++c) data[fp8_data_offset(h.kp, pr, c)] = q[r][c];
    for (int64_t g = 0; g < ngroups; ++g)
      std::memcpy(scales + fp8_scale_offset(h.kp, h.group, pr, g), &scale[r][g], 4);
  }
}

}  // namespace ktmoe
