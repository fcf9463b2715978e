// The ATen-side check of a packed [E, bytes] weight tensor before the forward
// reads it: layout, alignment and every field of every expert's header.
#pragma once
#include <ATen/ATen.h>

#include "kernels/packed_format.h"

namespace ktmoe {

// w: uint8 [E, bytes] from pack_experts. Checks the tensor, that expert 0's
// header is exactly the canonical header of its format/n/k/group with `role`
// (kernels/packed_header_check.h) and that every expert's header equals it;
// a c10::Error names the tensor (`name`), the expert and the field. Returns
// expert 0's header.
const PackedMatrixHeader& check_packed_weight(const at::Tensor& w, const char* name, MatrixRole role);

}  // namespace ktmoe
