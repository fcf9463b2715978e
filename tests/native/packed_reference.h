// [NOTE] Packed blobs read back by the byte-offset formulas of packed_format.h, never by the
// packer's or the kernels' code; `touched` marks every byte a formula covers, so a test can
// check that every other byte is zero. Also the int4 group search's spec, a random dense
// matrix and packing one.
#pragma once

#include <cstdint>
#include <vector>

#include "reference.h"

namespace ktmoe_test {

using namespace ktmoe;

// Values by *packed* row pr (np rows) and column c (kp columns), read with the
// byte-offset formulas of packed_format.h; `touched` marks every byte read.
struct Decoded {
  PackedMatrixHeader h{};
  int64_t n = 0, k = 0, np = 0, kp = 0, g = 0, ng = 0;
  WeightFormat f = WeightFormat::kBF16;
  std::vector<int64_t> packed_of;   // logical row -> packed row
  std::vector<int64_t> logical_of;  // packed row -> logical row or -1
  std::vector<double> w;            // [np][kp] dequantized
  std::vector<int32_t> wi;          // [np][kp] int8: u - 128, int4: q (the level is kInt4Levels[q])
  std::vector<uint16_t> wb;         // [np][kp] bf16 bits
  std::vector<float> s;             // int8 [np]: the first group's scale (the row's, per channel)
  std::vector<float> d;             // int4 [np][ng] bf16 d, int8 [np][ng] fp32 s
  std::vector<uint8_t> touched;     // [total_bytes]
};

Decoded decode(const uint8_t* blob);

// Spec of the int4 group search, reimplemented: the smallest squared error over
// the candidate scales.
double ref_int4_best_err(const float* v, int64_t len);

// A dense matrix [n][k] ~ N(0, 1/k), with a few constant and zero groups for int4's edge paths.
std::vector<float> random_matrix(int64_t n, int64_t k, Rng& rng, bool with_constants);

// `w` [n][k] packed as `h` says into a new 64-byte aligned blob first filled with `fill`.
AlignedBytes pack(const PackedMatrixHeader& h, const std::vector<float>& w, uint8_t fill = 0);

}  // namespace ktmoe_test
