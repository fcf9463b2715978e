// [NOTE] Packing kMXFP4 (mxfp4_format.h) matrices: an MXFP4 checkpoint's e2m1 codes and E8M0
// scales copied exactly, and the per-row writer that the dense packer (pack.cpp, OCP MX's
// rounding) shares. Portable C++ (no ISA flags), one expert matrix per call, like pack.h, so
// callers stream experts straight into arena memory.
#pragma once
#include <cstdint>

#include "kernels/mxfp4_format.h"
#include "kernels/pack.h"

namespace ktmoe {

// A kMXFP4 matrix's header is packed_matrix_header(WeightFormat::kMXFP4, role, n, k, group)
// (pack.h): group a multiple of 32 (0: kMxfp4Group, the MX block), kp = round_up(k, group).

// Writes packed row pr's codes q[c] (c < header.k, each 0..15) and its per-group E8M0 bytes
// e[G] (G < kp / group) into a zeroed blob's data and scales (no checks: the callers check).
void mxfp4_store_row(const PackedMatrixHeader& h, int64_t pr, const uint8_t* q, const uint8_t* e, uint8_t* data,
                     uint8_t* scales);

// Packs one matrix into out (header.total_bytes bytes, 64-byte aligned).
// q[r]: the e2m1 codes of dense row r (k bytes, one code 0..15 per byte: a checkpoint's nibbles,
// low nibble first, split), r < n; for kGateUp rows 0..I-1 are gate rows and I..2I-1 up rows.
// e[r]: row r's kp/group E8M0 scale bytes. Writes every byte (padding 0). A code > 15 or the
// NaN scale 0xFF throws std::domain_error naming `expert`, row and column (or group) before
// anything is written.
void mxfp4_pack_matrix(const PackedMatrixHeader& header, const uint8_t* const* q, const uint8_t* const* e,
                       int64_t expert, uint8_t* out);

}  // namespace ktmoe
