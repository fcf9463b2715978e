// GGML types at the ATen boundary: the rows of kernels/ggml/ggml_types.h (bind_formats.cpp exports the
// table as torch_ktmoe._C.ggml_types()) and the check every op taking a type id makes.
#pragma once
#include <cstdint>

#include "kernels/ggml/ggml_types.h"

namespace ktmoe {

// The row of `id` when this library decodes its blocks; else a c10::Error from `op` naming the id (unknown to
// ggml, or known and not read here, with the types that are).
const GgmlTypeTraits& decodable_ggml_type(int64_t id, const char* op);

}  // namespace ktmoe
