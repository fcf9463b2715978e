// [NOTE] Packing kINT4A (int4_affine_format.h) matrices: an int4 checkpoint's codes,
// scales and zero points copied exactly, and the per-row writer that the dense packer
// (pack.cpp, GPTQ's min/max rounding) shares. Portable C++ (no ISA flags), one expert
// matrix per call, like pack.h, so callers stream experts straight into arena memory.
#pragma once
#include <cstdint>

#include "kernels/int4_affine_format.h"
#include "kernels/pack.h"

namespace ktmoe {

// A kINT4A matrix's header is packed_matrix_header(WeightFormat::kINT4A, role, n, k, group)
// (pack.h): group a multiple of 32 (0: kInt4AffineDefaultGroup), kp = round_up(k, group).

// Writes packed row pr's codes q[c] (c < header.k, each 0..15) and its per-group s[G], z[G]
// (G < kp / group) into a zeroed blob's data and scales (no checks: the callers check).
void int4a_store_row(const PackedMatrixHeader& h, int64_t pr, const uint8_t* q, const float* s, const uint8_t* z,
                     uint8_t* data, uint8_t* scales);

// Packs one matrix into out (header.total_bytes bytes, 64-byte aligned).
// q[r]: the codes of dense row r (k bytes, one code 0..15 per byte), r < n; for kGateUp rows
// 0..I-1 are gate rows and I..2I-1 up rows. scale[r]: row r's kp/group fp32 scales;
// zero[r]: its kp/group zero points (0..16), or zero == nullptr for a symmetric checkpoint
// (z = 8 everywhere). Writes every byte (padding 0). A code > 15, a zero point > 16 or a
// non-finite scale throws std::domain_error naming `expert`, row and column (or group)
// before anything is written.
void int4a_pack_matrix(const PackedMatrixHeader& header, const uint8_t* const* q, const float* const* scale,
                       const uint8_t* const* zero, int64_t expert, uint8_t* out);

}  // namespace ktmoe
