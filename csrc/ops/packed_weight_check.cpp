// [NOTE] check_packed_weight (see packed_weight_check.h): a forged header field
// must be an error here, never an out-of-bounds read in a kernel.
#include "ops/packed_weight_check.h"

#include <cstring>
#include <vector>

#include "kernels/packed_header_check.h"

namespace ktmoe {

const PackedMatrixHeader& check_packed_weight(const at::Tensor& w, const char* name, MatrixRole role) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2,
              "ktmoe::moe_forward: ", name, " must be a packed uint8 CPU tensor [E, bytes] from ",
              "ktmoe::pack_experts, got ", w.scalar_type(), " ", w.sizes());
  TORCH_CHECK(w.size(0) > 0 && w.size(1) >= int64_t(sizeof(PackedMatrixHeader)) && w.stride(1) == 1 &&
                  w.stride(0) == w.size(1) && w.size(1) % 64 == 0,
              "ktmoe::moe_forward: ", name, " must be a contiguous [E, bytes] packed tensor, got ",
              w.sizes(), " strides ", w.strides());
  const auto* base = w.data_ptr<uint8_t>();
  const auto* h = reinterpret_cast<const PackedMatrixHeader*>(base);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(base) % 64 == 0, "ktmoe::moe_forward: ", name,
              " must be 64-byte aligned");
  const std::string bad = check_packed_header(*h, role, w.size(1));
  TORCH_CHECK(bad.empty(), "ktmoe::moe_forward: ", name, " expert 0 has a bad packed header: ", bad);
  return *h;
}

void check_routed_headers(const at::Tensor& w, const char* name, const int64_t* ids, int64_t n) {
  const int64_t experts = w.size(0), stride = w.size(1);
  const auto* base = w.data_ptr<uint8_t>();
  const auto* h0 = reinterpret_cast<const PackedMatrixHeader*>(base);
  std::vector<uint8_t> seen(size_t(experts), 0);
  seen[0] = 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = ids[i];
    if (e < 0 || e >= experts || seen[e]) continue;
    seen[e] = 1;
    const auto* he = reinterpret_cast<const PackedMatrixHeader*>(base + e * stride);
    TORCH_CHECK(std::memcmp(he, h0, sizeof(PackedMatrixHeader)) == 0, "ktmoe::moe_forward: ", name, " expert ", e,
                " has a header that differs from expert 0: ", compare_packed_header(*he, *h0));
  }
}

}  // namespace ktmoe
