// The packing loop the pack ops share: experts in parallel, each straight into its row of
// an output [E, bytes], and the error of the lowest failing expert (the same message for
// any thread count), plus the checks of an output the caller allocated.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "ops/weight_bytes.h"

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

// The row pointers of expert e of parts (each [E, r_i, cols_i] of element type T) in order: rows of
// part 0, then of part 1, ...; each part's expert made contiguous into keep (which must outlive them).
template <class T>
std::vector<const T*> expert_rows(const std::vector<at::Tensor>& parts, int64_t e, std::vector<at::Tensor>& keep) {
  std::vector<const T*> rows;
  for (const at::Tensor& part : parts) {
    keep.push_back(part.select(0, e).contiguous());
    const T* p = keep.back().data_ptr<T>();
    for (int64_t r = 0; r < part.size(1); ++r) rows.push_back(p + r * part.size(2));
  }
  return rows;
}

// The allocating form of a pack op: new [E, total_bytes] outputs for plan's h13 and h2 (a PackPlan),
// filled by pack_out(w13, w2) (the op's _out form).
template <class Plan, class F>
std::tuple<at::Tensor, at::Tensor> pack_new(const Plan& plan, const F& pack_out) {
  at::Tensor w13 = empty_weight_bytes({plan.experts, plan.h13.total_bytes});
  at::Tensor w2 = empty_weight_bytes({plan.experts, plan.h2.total_bytes});
  pack_out(w13, w2);
  return {w13, w2};
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
