// [NOTE] Generic gemm_ggml: a GGML matrix where it lies (isa_kernels.h's contract), the oracle of the
// ISA kernels over GGML rows.
//
// w: n rows of row_bytes bytes (k / type.block_elems blocks of `type`), a: bf16 rows [m, lda].
// Each weight row is decoded once per call by the type's exact decoder (ggml_decode.cpp) into an fp32
// buffer (k floats, thread-local), then for every activation row
//     c[r][i] = Σ_{kk ascending} bf16(a[r][kk]) · W[i][kk]     (fp32, one product then one add each)
// Output (r, i) depends only on row r and weight row i: the same bits for any split of n.
#include <vector>

#include "kernels/generic/bf16_scalar.h"
#include "kernels/generic/generic_kernels.h"

namespace ktmoe {
namespace generic {

void gemm_ggml(const GgmlTypeTraits& type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, int64_t m, float* c, int64_t ldc) {
  thread_local std::vector<float> row;
  row.resize(size_t(k));
  for (int64_t i = 0; i < n; ++i) {
    type.decode(w + i * row_bytes, k / type.block_elems, row.data());
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t* ar = a + r * lda;
      float s = 0.f;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float p = bf16_to_f32(ar[kk]) * row[size_t(kk)];
        s += p;
      }
      c[r * ldc + i] = s;
    }
  }
}

}  // namespace generic
}  // namespace ktmoe
