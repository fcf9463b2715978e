// Parsing and naming of weight formats at the ATen boundary (the rows of
// kernels/weight_formats.h; bind_formats.cpp exports the table itself).
#pragma once
#include <string>

#include "kernels/packed_format.h"
#include "kernels/weight_formats.h"

namespace ktmoe {

WeightFormat parse_weight_format(const std::string& name);  // a row's name, e.g. "int8"
const char* weight_format_name(WeightFormat format);

}  // namespace ktmoe
