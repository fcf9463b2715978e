// Packed weights outside an arena (the pack ops' outputs).
#pragma once
#include <ATen/ATen.h>

namespace ktmoe {

// A new uint8 tensor of `sizes`; from 2 MiB up on its own mapping of transparent huge pages
// (common/huge_pages.h): the weights a decode step streams. Its storage frees the mapping.
at::Tensor empty_weight_bytes(at::IntArrayRef sizes);

}  // namespace ktmoe
