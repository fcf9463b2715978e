#include "ops/weight_format.h"

#include <c10/util/Exception.h>

namespace ktmoe {

WeightFormat parse_weight_format(const std::string& name) {
  if (name == "bf16") return WeightFormat::kBF16;
  if (name == "int8") return WeightFormat::kINT8;
  if (name == "int4") return WeightFormat::kINT4;
  TORCH_CHECK(false, "ktmoe: weight_format must be 'bf16', 'int8' or 'int4', got '", name, "'");
}

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kINT8: return "int8";
    case WeightFormat::kINT4: return "int4";
  }
  return "unknown";
}

}  // namespace ktmoe
