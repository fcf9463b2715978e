// The dispatch of gemm_ggml to an ISA's code kernels (avx512 / avx2 ggml_codes_<isa>.h): each kernel is an
// empty struct of static functions naming its type as kType. Header-only templates: each ISA file
// instantiates them with its own types and lambdas, so no ISA-flagged copy is shared between objects.
#pragma once
#include "kernels/ggml/ggml_types.h"

namespace ktmoe {
namespace ggml {

// f(T{}) for the first T of Kernels with T::kType == id, else fallback().
template <class... Kernels, class F, class Fallback>
inline void with_code_kernel(GgmlType id, F&& f, Fallback&& fallback) {
  const bool found = ((id == Kernels::kType && (f(Kernels{}), true)) || ...);
  if (!found) fallback();
}

}  // namespace ggml
}  // namespace ktmoe
