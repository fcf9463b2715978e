// [NOTE] When the amx table runs a gemm on tiles: m >= prefill_min_rows() rows (default 16,
// one full A tile); fewer rows (decode) stay on the avx512 kernels. KTMOE_AMX_MIN_ROWS=n
// overrides it (benchmarking the crossover); read once, when the amx table is first built.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ktmoe {
namespace amx {

constexpr int64_t kDefaultPrefillMinRows = 16;

// Throws std::invalid_argument naming the variable for a value that is not an integer >= 1.
inline int64_t parse_prefill_min_rows(const char* text) {
  if (!text || !*text) return kDefaultPrefillMinRows;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*end != '\0' || v < 1)
    throw std::invalid_argument(std::string("KTMOE_AMX_MIN_ROWS='") + text +
                                "' is not a row count (an integer >= 1)");
  return v;
}

inline int64_t prefill_min_rows() {
  static const int64_t rows = parse_prefill_min_rows(std::getenv("KTMOE_AMX_MIN_ROWS"));
  return rows;
}

}  // namespace amx
}  // namespace ktmoe
