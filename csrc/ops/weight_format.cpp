// [NOTE] Weight format names at the ATen boundary, from the traits table
// (kernels/weight_formats.h): an unknown name is an error listing the rows.
#include "ops/weight_format.h"

#include <c10/util/Exception.h>

namespace ktmoe {

WeightFormat parse_weight_format(const std::string& name) {
  const WeightFormatTraits* row = find_format_traits(name);
  TORCH_CHECK(row, "ktmoe: weight_format must be ", weight_format_names(), ", got '", name, "'");
  return row->id;
}

const char* weight_format_name(WeightFormat format) {
  const WeightFormatTraits* row = find_format_traits(uint8_t(format));
  return row ? row->name : "unknown";
}

}  // namespace ktmoe
