// The packing loop the pack ops share: experts in parallel, each straight into its row of
// an output [E, bytes], and the error of the lowest failing expert (the same message for
// any thread count), plus the checks of an output the caller allocated.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace ktmoe {

// pack(e) for e < experts; returns the lowest e whose pack threw std::domain_error and its
// message (expert -1: none did).
struct PackFailure {
  int64_t expert = -1;
  std::string reason;
};
template <class F>
PackFailure pack_each_expert(int64_t experts, const F& pack) {
  std::mutex mutex;
  PackFailure bad;
  at::parallel_for(0, experts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      try {
        pack(e);
      } catch (const std::domain_error& err) {
        std::lock_guard<std::mutex> lock(mutex);
        if (bad.expert < 0 || e < bad.expert) bad = {e, err.what()};
      }
    }
  });
  return bad;
}

// An output the caller allocated: uint8 CPU [E, bytes], contiguous, 64-byte aligned.
inline void check_pack_output(const char* op, const at::Tensor& out, const char* name, int64_t experts,
                              int64_t bytes) {
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kByte && out.dim() == 2 &&
                  out.size(0) == experts && out.size(1) == bytes && out.is_contiguous(),
              op, ": ", name, " must be a contiguous uint8 CPU tensor [", experts, ", ", bytes, "], got ",
              out.scalar_type(), " ", out.sizes(), " on ", out.device());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 64 == 0, op, ": ", name, " must be 64-byte aligned");
}

}  // namespace ktmoe
