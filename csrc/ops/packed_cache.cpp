// [NOTE] Cache keys with the kernels' packed shapes, and tensors over cache files.
// See packed_cache.h.
#include "ops/packed_cache.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <functional>

#include "kernels/pack.h"
#include "kernels/packed_header_check.h"
#include "ops/arena_tensor.h"
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

namespace {

void aten_parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  at::parallel_for(0, n, grain, body);
}

// Every expert's packed header in the mapped tensors equals the one the key implies.
std::string check_expert_headers(const CacheKey& key, void* const tensors[kCacheTensors]) {
  const WeightFormat format = parse_weight_format(key.weight_format);
  const int64_t part_inter = key.inter_hi - key.inter_lo;
  const PackedMatrixHeader want[kCacheTensors] = {
      packed_matrix_header(format, MatrixRole::kGateUp, 2 * part_inter, key.hidden, key.group_size),
      packed_matrix_header(format, MatrixRole::kDown, key.hidden, part_inter, key.group_size)};
  for (int t = 0; t < kCacheTensors; ++t) {
    if (want[t].total_bytes != key.cols[t]) return "corrupt: packed row size differs from the key";
    for (int64_t e = 0; e < key.rows[t]; ++e) {
      const auto* h = reinterpret_cast<const PackedMatrixHeader*>(static_cast<const uint8_t*>(tensors[t]) +
                                                                  e * key.cols[t]);
      if (std::string bad = compare_packed_header(*h, want[t]); !bad.empty())
        return std::string("corrupt: ") + (t == 0 ? "w13" : "w2") + " expert " + std::to_string(e) +
               " header: " + bad;
    }
  }
  return "";
}

}  // namespace

std::string load_packed_cache(const std::shared_ptr<KtWeightArena>& arena, const CacheKey& key,
                              bool verify_data, at::Tensor* w13, at::Tensor* w2) {
  void* data[kCacheTensors] = {nullptr, nullptr};
  const auto check = [&key](void* const tensors[kCacheTensors]) { return check_expert_headers(key, tensors); };
  std::string reason = arena->open_cached(key, check, verify_data, aten_parallel_for, data);
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
  arena->commit_build(key, data, aten_parallel_for, &error);
  return error;
}

std::string verify_packed_cache_file(const std::string& path, bool verify_data) {
  std::string reason;
  const int fd = open_regular_file(path, &reason);
  if (fd < 0) return reason;
  CacheHeader h;
  int64_t file_bytes = 0;
  reason = read_cache_header(fd, &h, &file_bytes);
  ::close(fd);
  if (reason.empty()) reason = check_cache_header(h, file_bytes);
  if (!reason.empty()) return reason;
  if (h.packed_version != kPackedVersion)
    return "stale: packed layout version " + std::to_string(h.packed_version) + ", this build reads " +
           std::to_string(kPackedVersion);
  const CacheKey key = cache_key_of(h);
  try {
    parse_weight_format(key.weight_format);
    (void)packed_cache_key(key.weight_format, key.group_size, key.experts, key.hidden, key.inter, key.inter_lo,
                           key.inter_hi, key.numa_part, key.fingerprint);
  } catch (const std::exception& e) {
    return std::string("corrupt: the header's layer key is invalid: ") + e.what();
  }
  // The same mapping and checks as a load, in a throwaway arena; a file of another
  // user is reported, not refused, here (inspect reads, it trusts nothing it maps).
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string suffix = ".ktmoe";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    name.resize(name.size() - suffix.size());
  ArenaOptions options;
  options.persistent = true;
  options.trust_others = true;
  options.hugepage = false;
  at::Tensor w13, w2;
  return load_packed_cache(KtWeightArena::open(dir, name, options), key, verify_data, &w13, &w2);
}

}  // namespace ktmoe
