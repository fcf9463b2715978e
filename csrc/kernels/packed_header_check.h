// [NOTE] Validation of packed expert headers (packed_format.h) read from memory
// or a file, torch-free.
//
// A header is trusted only if it is *exactly* the header packed_matrix_header()
// derives from its own format, role, n, k and (int4) group: then np, kp,
// data_offset, scale_offset and total_bytes are consistent by construction, and
// every offset a kernel computes stays inside the blob. A forged field (kp = 1<<24,
// a negative data_offset, an unknown format, ...) is named in the reason.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/packed_format.h"

namespace ktmoe {

// "" if h is the canonical header of its own format/role/n/k/group, has role
// `role` and a blob of row_bytes; else "<field> is <value>, expected <value>".
std::string check_packed_header(const PackedMatrixHeader& h, MatrixRole role, int64_t row_bytes);

// "" if have == want byte for byte; else the first differing field, named.
std::string compare_packed_header(const PackedMatrixHeader& have, const PackedMatrixHeader& want);

}  // namespace ktmoe
