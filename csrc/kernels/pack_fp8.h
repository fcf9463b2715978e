// [NOTE] Packing FP8 (e4m3fn) checkpoint weights into kFP8 (fp8_format.h), bytes and
// scales kept exactly. Portable C++ (no ISA flags), one expert matrix per call, like
// pack.h, so callers stream experts straight into arena memory.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/fp8_format.h"
#include "kernels/pack.h"

namespace ktmoe {

// A kFP8 matrix's header is packed_matrix_header(WeightFormat::kFP8, role, n, k, group)
// (pack.h): group a multiple of 32 (0: kFp8BlockGroup), kp = round_up(k, group). One scale
// per output row (FP8_PERCHANNEL) is group = round_up(k, 32) = kp (one k-group), or that
// row's scale repeated over the groups of any group.

// Scale row pointers for fp8_pack_matrix from a checkpoint's scale tensor s of `rows`
// weight rows: row r's kp/group scales are at s + (r / bn) * per_row.
//   block scales [ceil(n/bn), ceil(k/group)]: bn = 128, per_row = ceil(k/group);
//   per-channel scales [n]:                   bn = 1,   per_row = 1.
// kGateUp with separate gate and up tensors: the two lists one after the other.
std::vector<const float*> fp8_scale_rows(const float* s, int64_t rows, int64_t bn, int64_t per_row);

// Packs one matrix into out (header.total_bytes bytes, 64-byte aligned).
// q[r]: e4m3 bytes of dense row r (k bytes), r < n; for kGateUp rows 0..I-1 are gate
// rows and I..2I-1 up rows. scale[r]: row r's kp/group fp32 scales (fp8_scale_rows).
// Writes every byte (padding 0). A NaN byte (0x7F / 0xFF) or a non-finite scale throws
// std::domain_error naming `expert`, row and column (or group) before anything is written.
void fp8_pack_matrix(const PackedMatrixHeader& header, const uint8_t* const* q,
                     const float* const* scale, int64_t expert, uint8_t* out);

}  // namespace ktmoe
