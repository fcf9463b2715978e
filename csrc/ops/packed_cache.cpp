// [NOTE] Packed-expert cache keys, their bytes in a cache file, and tensors over
// cache files. See packed_cache.h.
#include "ops/packed_cache.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <tuple>

#include "arena/cache_inspect.h"
#include "arena/kept_file.h"
#include "arena/read_ahead.h"
#include "kernels/pack.h"
#include "kernels/packed_header_check.h"
#include "ops/arena_tensor.h"
#include "ops/weight_format.h"

namespace ktmoe {
namespace {

// The key bytes in a file: a fixed little-endian record.
#pragma pack(push, 1)
struct KeyRecord {
  char tag[8];  // "MOEKEY2\0"
  char weight_format[16];  // the format's name, NUL-padded (names are < 16 characters)
  uint32_t packed_version;
  uint32_t numa_part;
  int64_t group_size, experts, hidden, inter, inter_lo, inter_hi;
  uint32_t fingerprint_len;
  char fingerprint[kMaxFingerprintBytes];
};
#pragma pack(pop)
constexpr char kKeyTag[8] = {'M', 'O', 'E', 'K', 'E', 'Y', '2', '\0'};
static_assert(sizeof(KeyRecord) <= kMaxCacheKeyBytes, "packed cache key must fit the header");

std::string stale(const char* what, const std::string& have, const std::string& want) {
  return std::string("stale: ") + what + " is " + have + ", expected " + want;
}
std::string stale(const char* what, int64_t have, int64_t want) {
  return stale(what, std::to_string(have), std::to_string(want));
}

// "" if the stored key is `want`, else the first differing field.
std::string compare_keys(const PackedCacheKey& have, const PackedCacheKey& want) {
  if (have.packed_version != want.packed_version)
    return stale("packed layout version", have.packed_version, want.packed_version);
  if (have.weight_format != want.weight_format) return stale("weight format", have.weight_format, want.weight_format);
  if (have.group_size != want.group_size) return stale("group size", have.group_size, want.group_size);
  if (have.experts != want.experts) return stale("experts", have.experts, want.experts);
  if (have.hidden != want.hidden) return stale("hidden size", have.hidden, want.hidden);
  if (have.inter != want.inter) return stale("intermediate size", have.inter, want.inter);
  if (have.inter_lo != want.inter_lo || have.inter_hi != want.inter_hi)
    return stale("intermediate range", std::to_string(have.inter_lo) + ".." + std::to_string(have.inter_hi),
                 std::to_string(want.inter_lo) + ".." + std::to_string(want.inter_hi));
  if (have.numa_part != want.numa_part) return stale("NUMA part", have.numa_part, want.numa_part);
  if (have.fingerprint != want.fingerprint) return "stale: source fingerprint differs (the weights changed)";
  return "";
}

void aten_parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  at::parallel_for(0, n, grain, body);
}

// Every expert's packed header in the mapped tensors equals the one the key implies.
std::string check_expert_headers(const PackedCacheKey& key, const std::vector<void*>& tensors) {
  const WeightFormat format = parse_weight_format(key.weight_format);
  const int64_t part_inter = key.inter_hi - key.inter_lo;
  const PackedMatrixHeader want[2] = {
      packed_matrix_header(format, MatrixRole::kGateUp, 2 * part_inter, key.hidden, key.group_size),
      packed_matrix_header(format, MatrixRole::kDown, key.hidden, part_inter, key.group_size)};
  const int64_t row_bytes[2] = {key.w13_bytes, key.w2_bytes};
  // One page per header, each a disk read when the file is cold: a window of them is queued first
  // (asynchronous), so the checks wait for reads in flight together, not one page fault after
  // another. Window by window, so the work stops at the first bad header: a forged count of
  // experts costs what the file holds, not what its header claims.
  constexpr int64_t kWindow = 256;
  for (int t = 0; t < 2; ++t) {
    const auto* base = static_cast<const uint8_t*>(tensors[t]);
    for (int64_t lo = 0; lo < key.experts; lo += kWindow) {
      const int64_t hi = std::min(key.experts, lo + kWindow);
      for (int64_t e = lo; e < hi; ++e) read_ahead(base + e * row_bytes[t], sizeof(PackedMatrixHeader));
      for (int64_t e = lo; e < hi; ++e) {
        const auto* h = reinterpret_cast<const PackedMatrixHeader*>(base + e * row_bytes[t]);
        if (std::string bad = compare_packed_header(*h, want[t]); !bad.empty())
          return std::string("corrupt: ") + (t == 0 ? "w13" : "w2") + " expert " + std::to_string(e) +
                 " header: " + bad;
      }
    }
  }
  return "";
}

// What a load of `key` expects of a file: its shapes and key bytes, the stored key
// equal to `key` field by field, every expert's packed header the one `key` implies.
CacheLoadChecks load_checks(const PackedCacheKey& key) {
  const auto check_key = [key](const std::string& stored) {
    PackedCacheKey have;
    std::string why;
    return PackedCacheKey::from_bytes(stored, &have, &why) ? compare_keys(have, key) : why;
  };
  const auto check_content = [key](const std::vector<void*>& tensors) { return check_expert_headers(key, tensors); };
  return {key.arena_key(), check_key, check_content};
}

}  // namespace

std::string PackedCacheKey::to_bytes() const {
  KeyRecord r;
  std::memset(&r, 0, sizeof(r));
  std::memcpy(r.tag, kKeyTag, sizeof(r.tag));
  std::memcpy(r.weight_format, weight_format.data(), std::min(weight_format.size(), sizeof(r.weight_format) - 1));
  r.packed_version = packed_version;
  r.numa_part = uint32_t(numa_part);
  r.group_size = group_size;
  r.experts = experts;
  r.hidden = hidden;
  r.inter = inter;
  r.inter_lo = inter_lo;
  r.inter_hi = inter_hi;
  r.fingerprint_len = uint32_t(fingerprint.size());
  std::memcpy(r.fingerprint, fingerprint.data(), fingerprint.size());
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

bool PackedCacheKey::from_bytes(const std::string& bytes, PackedCacheKey* key, std::string* why) {
  KeyRecord r;
  if (bytes.size() != sizeof(r) || std::memcmp(bytes.data(), kKeyTag, sizeof(kKeyTag)) != 0) {
    *why = "stale: the file's key is not a packed-experts key of this version";
    return false;
  }
  std::memcpy(&r, bytes.data(), sizeof(r));
  if (r.fingerprint_len > kMaxFingerprintBytes) {
    *why = "corrupt: fingerprint length";
    return false;
  }
  key->weight_format = std::string(r.weight_format, strnlen(r.weight_format, sizeof(r.weight_format)));
  key->packed_version = r.packed_version;
  key->numa_part = r.numa_part;
  key->group_size = r.group_size;
  key->experts = r.experts;
  key->hidden = r.hidden;
  key->inter = r.inter;
  key->inter_lo = r.inter_lo;
  key->inter_hi = r.inter_hi;
  key->fingerprint.assign(r.fingerprint, r.fingerprint_len);
  return true;
}

CacheKey PackedCacheKey::arena_key() const {
  return CacheKey{to_bytes(), {{experts, w13_bytes}, {experts, w2_bytes}}};
}

PackedCacheKey packed_cache_key(const std::string& weight_format, int64_t group_size, int64_t experts,
                                int64_t hidden, int64_t inter, int64_t inter_lo, int64_t inter_hi,
                                int64_t numa_part, const std::string& fingerprint) {
  TORCH_CHECK(experts > 0 && hidden > 0 && 0 <= inter_lo && inter_lo < inter_hi && inter_hi <= inter,
              "ktmoe cache: bad layer shape E=", experts, ", H=", hidden, " or intermediate range [", inter_lo,
              ", ", inter_hi, ") of ", inter);
  TORCH_CHECK(int64_t(fingerprint.size()) <= kMaxFingerprintBytes, "ktmoe cache: fingerprint longer than ",
              kMaxFingerprintBytes, " bytes");
  const WeightFormat format = parse_weight_format(weight_format);
  const int64_t part_inter = inter_hi - inter_lo;
  PackedCacheKey key;
  key.weight_format = weight_format_name(format);
  key.group_size = group_size;
  key.experts = experts;
  key.hidden = hidden;
  key.inter = inter;
  key.inter_lo = inter_lo;
  key.inter_hi = inter_hi;
  key.numa_part = numa_part;
  key.packed_version = kPackedVersion;
  key.fingerprint = fingerprint;
  try {
    key.w13_bytes = packed_matrix_header(format, MatrixRole::kGateUp, 2 * part_inter, hidden, group_size).total_bytes;
    key.w2_bytes = packed_matrix_header(format, MatrixRole::kDown, hidden, part_inter, group_size).total_bytes;
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "ktmoe cache: ", e.what());
  }
  return key;
}

// "" and (w13, w2) viewing the arena's valid cache file, or why it is not usable.
// Always checks every expert's packed header against the key (a forged field is
// "corrupt: w13 expert e header: <field> ..."); verify_data also compares the
// data checksums (reads every byte).
static std::string load_packed_cache(const std::shared_ptr<WeightArena>& arena, const PackedCacheKey& key,
                                     bool verify_data, at::Tensor* w13, at::Tensor* w2) {
  const CacheLoadChecks checks = load_checks(key);
  std::vector<void*> data;
  std::string reason = open_cached(*arena, checks.expect, checks.check_key, checks.check_content, verify_data,
                                   aten_parallel_for, &data);
  if (!reason.empty()) return reason;
  *w13 = arena_tensor(arena, data[0], {key.experts, key.w13_bytes});
  *w2 = arena_tensor(arena, data[1], {key.experts, key.w2_bytes});
  return "";
}

// Commits a build whose w13/w2 were packed into the arena; "" or the error.
static std::string commit_packed_cache(const std::shared_ptr<WeightArena>& arena, const PackedCacheKey& key,
                                const at::Tensor& w13, const at::Tensor& w2) {
  const at::Tensor* t[2] = {&w13, &w2};
  const int64_t cols[2] = {key.w13_bytes, key.w2_bytes};
  for (int i = 0; i < 2; ++i)
    TORCH_CHECK(t[i]->is_contiguous() && t[i]->dim() == 2 && t[i]->size(0) == key.experts &&
                    t[i]->size(1) == cols[i] && t[i]->scalar_type() == at::kByte,
                "ktmoe cache: packed tensor ", i, " has shape ", t[i]->sizes(), ", expected [", key.experts, ", ",
                cols[i], "] uint8");
  std::string error;
  commit_build(*arena, key.arena_key(), {w13.data_ptr(), w2.data_ptr()}, aten_parallel_for, &error);
  return error;
}

PackedCacheResult load_or_build_packed_cache(const std::shared_ptr<WeightArena>& arena, const PackedCacheKey& key,
                                             const CacheRequest& request, bool verify_data, const PackExperts& pack,
                                             const CacheLog& log) {
  PackedCacheResult out;
  const CacheLoad load = [&] { return load_packed_cache(arena, key, verify_data, &out.w13, &out.w2); };
  CacheBuild build;
  if (pack)
    build = [&](bool keep) -> std::string {
      std::tie(out.w13, out.w2) = pack();
      return keep ? commit_packed_cache(arena, key, out.w13, out.w2) : "";
    };
  out.outcome = load_or_build_cache(*arena, request, load, build, log);
  return out;
}

PackedCacheInspection inspect_packed_cache_file(const std::string& path, bool verify_data) {
  PackedCacheInspection out;
  // The file's own key, decoded, becomes the key of the load the inspection runs.
  const auto read_key = [&out](const std::string& stored, CacheLoadChecks* checks) -> std::string {
    std::string why;
    if (!PackedCacheKey::from_bytes(stored, &out.key, &why)) return why;
    out.key_ok = true;
    if (out.key.packed_version != kPackedVersion)
      return "stale: packed layout version " + std::to_string(out.key.packed_version) + ", this build reads " +
             std::to_string(kPackedVersion);
    try {
      const PackedCacheKey& k = out.key;
      out.key = packed_cache_key(k.weight_format, k.group_size, k.experts, k.hidden, k.inter, k.inter_lo, k.inter_hi,
                                 k.numa_part, k.fingerprint);
    } catch (const std::exception& e) {
      return std::string("corrupt: the file's key is not a valid layer: ") + e.what();
    }
    *checks = load_checks(out.key);
    return "";
  };
  out.file = inspect_cache_file(path, verify_data, read_key, aten_parallel_for);
  return out;
}

}  // namespace ktmoe
