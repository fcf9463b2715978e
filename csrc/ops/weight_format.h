// Parsing and naming of weight formats at the ATen boundary.
#pragma once
#include <string>

#include "kernels/packed_format.h"

namespace ktmoe {

WeightFormat parse_weight_format(const std::string& name);  // "bf16" | "int8" | "int4"
const char* weight_format_name(WeightFormat format);

}  // namespace ktmoe
