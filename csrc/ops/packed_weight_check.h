// The ATen-side check of a packed [E, bytes] weight tensor before the forward
// reads it: layout, alignment and every field of every expert's header.
#pragma once
#include <ATen/ATen.h>

#include "kernels/packed_format.h"

namespace ktmoe {

// w: uint8 [E, bytes] from pack_experts. Checks the tensor and that expert 0's
// header is exactly the canonical header of its format/n/k/group with `role`
// (kernels/packed_header_check.h); a c10::Error names the tensor (`name`) and
// the field. Returns expert 0's header.
const PackedMatrixHeader& check_packed_weight(const at::Tensor& w, const char* name, MatrixRole role);

// Checks that the header of every expert that `ids` routes to (ids[i] in
// [0, E); others are skipped) equals expert 0's, naming the expert and field.
// Only routed experts: the forward reads no other, and touching every expert's
// header page on each call would fault cold experts back into memory.
void check_routed_headers(const at::Tensor& w, const char* name, const int64_t* ids, int64_t n);

}  // namespace ktmoe
