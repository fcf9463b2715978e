// [NOTE] Packing dense expert weights into the layout of packed_format.h.
//
// Packing is a one-off at load time, portable C++ (no ISA flags), one expert
// matrix per call so callers can stream experts straight into arena memory.
#pragma once
#include <cstdint>

#include "kernels/packed_format.h"

namespace ktmoe {

// The full header (sizes, offsets, total_bytes) a matrix of this shape packs to.
// For kGateUp, n is 2*I (gate rows then up rows). group: int4 group size (0 ->
// kDefaultInt4Group); ignored for other formats.
PackedMatrixHeader packed_matrix_header(WeightFormat format, MatrixRole role, int64_t n,
                                        int64_t k, int64_t group);

// Packs one dense matrix into out (header.total_bytes bytes, 64-byte aligned).
// rows(r) gives a pointer to dense row r (k floats), r < n; for kGateUp rows
// 0..I-1 are gate rows and I..2I-1 up rows (so kt-kernel's separate gate/up
// tensors need no concatenation). Writes the header, data and scales, and zeroes
// every padded byte. Deterministic: same input, same bytes. A NaN or Inf weight
// throws std::domain_error ("nan at row r, column c") before anything is written.
void pack_matrix(const PackedMatrixHeader& header, const float* const* rows, uint8_t* out);

// The checks of an exact checkpoint packer (fp8, int4_affine, mxfp4): a header of `format` made
// by packed_matrix_header, with groups that tile kp; std::invalid_argument naming `who` otherwise.
void check_exact_header(const PackedMatrixHeader& h, WeightFormat format, const char* who);

}  // namespace ktmoe
