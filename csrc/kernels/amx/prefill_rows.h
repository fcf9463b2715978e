// [NOTE] When the amx table runs a gemm on tiles: m >= prefill_min_rows() rows (default 4; the
// A tiles' rows past m are zero); fewer rows (decode) stay on the avx512 kernels. Measured on 2
// Xeon threads (docs/isa.md): 4 against 16 ran the reference layer at T = 64 / 128 / 256 in mxfp4
// 1.16 / 1.75 / 2.98x avx512 instead of 0.99 / 0.99 / 1.69x, bf16 1.11 / 1.48 / 2.14x instead of
// 0.99 / 1.00 / 1.48x, and no T from 1 to 32 slower; 2 and 1 made mxfp4 at T = 8-32 0.54-0.90x.
// KTMOE_AMX_MIN_ROWS=n overrides it (benchmarking the crossover); read once, when the amx table is
// first built.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ktmoe {
namespace amx {

constexpr int64_t kDefaultPrefillMinRows = 4;

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
