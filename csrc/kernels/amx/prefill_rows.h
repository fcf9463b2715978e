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

// kFP8 goes on tiles from 8 rows (or prefill_min_rows(), if more): below, avx512's fp8 decode tiles
// (weights read once, 3.5 ops per 32 weights) beat decoding whole blocks for the tiles. Reference
// layer, 2 Xeon threads, avx512 / amx at T = 32: 0.95-0.96x from 4 rows, 0.97-1.00x from 8 or 16;
// T = 128: 1.24 from 4, 1.34 from 8 (KTMOE_AMX_MIN_ROWS=r python -m benchmarks.micro.bench_amx).
constexpr int64_t kFp8PrefillMinRows = 8;
inline int64_t fp8_prefill_min_rows() {
  return prefill_min_rows() > kFp8PrefillMinRows ? prefill_min_rows() : kFp8PrefillMinRows;
}

// GGML rows (gemm_ggml_amx.cpp) go on tiles from 10 rows (or prefill_min_rows(), if more): a call decodes every
// weight row it covers into tile codes and ends each k-group in an epilogue, whatever its row count, while the
// avx512 code kernels cost in proportion to the rows. Reference layer with every expert given exactly r rows,
// 2 Xeon threads, avx512 ms / amx ms at r = 4, 6, 8, 10, 12, 16: q4_K 0.52, 0.72, 0.83, 1.09, 1.28, 1.61; q6_K
// 0.46, 0.71, 0.82, 1.14, 1.22, 1.67; q8_0 0.45, 0.70, 0.81, 1.07, 1.16, 1.46 (benchmarks/micro/bench_ggml_rows.py).
constexpr int64_t kGgmlPrefillMinRows = 10;
inline int64_t ggml_prefill_min_rows() {
  return prefill_min_rows() > kGgmlPrefillMinRows ? prefill_min_rows() : kGgmlPrefillMinRows;
}

}  // namespace amx
}  // namespace ktmoe
