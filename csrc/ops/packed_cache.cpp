// [NOTE] Cache keys with the kernels' packed shapes, and tensors over cache files.
// See packed_cache.h.
#include "ops/packed_cache.h"

#include <c10/util/Exception.h>

#include "kernels/pack.h"
#include "ops/arena_registry.h"
#include "ops/weight_format.h"

namespace ktmoe {

CacheKey packed_cache_key(const std::string& weight_format, int64_t group_size, int64_t experts,
                          int64_t hidden, int64_t inter, int64_t inter_lo, int64_t inter_hi,
                          int64_t numa_part, const std::string& fingerprint) {
  TORCH_CHECK(0 <= inter_lo && inter_lo < inter_hi && inter_hi <= inter,
              "ktmoe cache: bad intermediate range [", inter_lo, ", ", inter_hi, ") of ", inter);
  TORCH_CHECK(int64_t(fingerprint.size()) <= kMaxFingerprintBytes, "ktmoe cache: fingerprint longer than ",
              kMaxFingerprintBytes, " bytes");
  const WeightFormat format = parse_weight_format(weight_format);
  const int64_t part_inter = inter_hi - inter_lo;
  CacheKey key;
  key.weight_format = weight_format_name(format);
  key.group_size = group_size;
  key.experts = experts;
  key.hidden = hidden;
  key.inter = inter;
  key.inter_lo = inter_lo;
  key.inter_hi = inter_hi;
  key.numa_part = numa_part;
  key.packed_version = kPackedVersion;
  key.rows[0] = key.rows[1] = experts;
  key.cols[0] = packed_matrix_header(format, MatrixRole::kGateUp, 2 * part_inter, hidden, group_size).total_bytes;
  key.cols[1] = packed_matrix_header(format, MatrixRole::kDown, hidden, part_inter, group_size).total_bytes;
  key.fingerprint = fingerprint;
  return key;
}

std::string load_packed_cache(const std::shared_ptr<KtWeightArena>& arena, const CacheKey& key,
                              at::Tensor* w13, at::Tensor* w2) {
  void* data[kCacheTensors] = {nullptr, nullptr};
  std::string reason = arena->open_cached(key, data);
  if (!reason.empty()) return reason;
  *w13 = arena_tensor(arena, data[0], {key.rows[0], key.cols[0]});
  *w2 = arena_tensor(arena, data[1], {key.rows[1], key.cols[1]});
  return "";
}

std::string commit_packed_cache(const std::shared_ptr<KtWeightArena>& arena, const CacheKey& key,
                                const at::Tensor& w13, const at::Tensor& w2) {
  const at::Tensor* t[kCacheTensors] = {&w13, &w2};
  for (int i = 0; i < kCacheTensors; ++i)
    TORCH_CHECK(t[i]->is_contiguous() && t[i]->dim() == 2 && t[i]->size(0) == key.rows[i] &&
                    t[i]->size(1) == key.cols[i] && t[i]->scalar_type() == at::kByte,
                "ktmoe cache: packed tensor ", i, " has shape ", t[i]->sizes(), ", expected [", key.rows[i],
                ", ", key.cols[i], "] uint8");
  const void* const data[kCacheTensors] = {w13.data_ptr(), w2.data_ptr()};
  std::string error;
  arena->commit_build(key, data, &error);
  return error;
}

}  // namespace ktmoe
