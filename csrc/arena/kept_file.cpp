// [NOTE] The kept file of a persistent WeightArena (see kept_file.h): build, map, refuse.
#include "arena/kept_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/data_checksum.h"
#include "common/posix_text.h"

namespace ktmoe {

bool begin_build(WeightArena& a, std::string* error) {
  std::lock_guard<std::mutex> lock(a.mutex_);
  if (!a.options_.persistent || a.options_.map_only) {
    *error = "begin_build: arena '" + a.name_ + "' is " + (a.options_.map_only ? "map-only" : "not persistent");
    return false;
  }
  if (!a.open_error_.empty() || !a.cache_refusal_.empty()) {
    *error = !a.open_error_.empty() ? a.open_error_ : a.cache_refusal_;
    return false;
  }
  if (a.file_.valid() || a.holds_memory()) {
    *error = "begin_build: arena '" + a.name_ + "' already holds a file or allocations";
    return false;
  }
  const std::string tmp = cache_tmp_path(a.dir_, a.name_);
  BackingFile file = BackingFile::create_temp(tmp, error);
  if (file.valid() && !file.reserve(0, kCacheHeaderBytes, error)) {
    *error = "'" + tmp + "': " + *error;
    file = BackingFile();  // removes the temp file
  }
  if (!file.valid()) {
    a.open_error_ = *error;  // every allocation falls back with this reason
    return false;
  }
  file.resize(WeightArena::kSliceAlign);  // slices start 2 MiB in: the header page, then a hole
  a.file_ = std::move(file);
  return true;
}

bool commit_build(WeightArena& a, const CacheKey& key, const std::vector<const void*>& tensors,
                  const ParallelFor& parallel_for, std::string* error) {
  std::lock_guard<std::mutex> lock(a.mutex_);
  if (!a.file_.is_temp()) {
    *error = "commit_build: no build in progress for arena '" + a.name_ + "'";
    return false;
  }
  auto fail = [&](const std::string& why) {
    *error = "arena '" + a.name_ + "': " + why;
    a.file_.discard_temp();
    return false;
  };
  if (tensors.size() != key.shapes.size()) return fail("commit_build: one pointer per tensor of the key");
  std::vector<int64_t> offsets(tensors.size());
  std::vector<uint32_t> checksums(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    offsets[t] = a.file_offset_locked(tensors[t]);
    if (offsets[t] < 0) return fail("tensor " + std::to_string(t) + " is not in the file (anonymous fallback)");
    checksums[t] = data_checksum(tensors[t], key.shapes[t].first * key.shapes[t].second, parallel_for);
  }
  CacheHeader h;
  try {
    h = make_cache_header(key, offsets, checksums, a.file_.size());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::string why;
  if (!a.file_.keep_as(&h, sizeof(h), 0, cache_file_path(a.dir_, a.name_), a.dir_, &why)) return fail(why);
  // The data is in the file and the page cache: the same bytes, mapped private.
  for (MappedSlice& s : a.mapped_) s.remap_private(a.file_.fd(), a.options_.hugepage);
  a.read_only_ = true;
  return true;
}

void abort_build(WeightArena& a) {
  std::lock_guard<std::mutex> lock(a.mutex_);
  a.file_.discard_temp();
}

std::string open_cached(WeightArena& a, const CacheKey& expect, const CacheKeyCheck& check_key,
                        const ContentCheck& check, bool verify_data, const ParallelFor& parallel_for,
                        std::vector<void*>* tensors) {
  std::lock_guard<std::mutex> lock(a.mutex_);
  if (!a.options_.persistent) return "arena '" + a.name_ + "' is not persistent";
  if (!a.open_error_.empty()) return "unusable directory: " + a.open_error_;
  if (!a.cache_refusal_.empty()) return a.cache_refusal_;
  if (a.file_.valid() || a.holds_memory()) return "arena '" + a.name_ + "' already holds a file or allocations";
  const std::string path = cache_file_path(a.dir_, a.name_);
  std::string reason;
  const int fd = open_regular_file(path, &reason, a.options_.map_only);  // map-only: see the note
  if (fd < 0) return reason;
  struct stat st;
  if (::fstat(fd, &st) != 0) reason = errno_text("unreadable: fstat '" + path + "'");
  if (reason.empty()) reason = check_trusted(st, "'" + path + "'", a.options_.trust_others);
  CacheHeader h;
  int64_t file_bytes = 0;
  if (reason.empty()) reason = read_cache_header(fd, &h, &file_bytes);
  if (reason.empty()) reason = validate_cache_header(h, file_bytes, expect, check_key);
  const size_t count = expect.shapes.size();
  std::vector<int64_t> bytes(count, 0);
  tensors->assign(count, nullptr);
  for (size_t t = 0; t < count && reason.empty(); ++t) {
    bytes[t] = h.tensors[t].rows * h.tensors[t].cols;
    MappedSlice slice = MappedSlice::map(fd, h.tensors[t].offset, round_up_to(bytes[t], WeightArena::kSliceAlign),
                                         MappedSlice::Mode::kPrivate, a.options_.hugepage, &reason);
    (*tensors)[t] = slice.addr();
    if (slice.addr()) a.mapped_.push_back(std::move(slice));
  }
  if (reason.empty() && check) reason = check(*tensors);
  for (size_t t = 0; t < count && reason.empty() && verify_data; ++t)
    if (data_checksum((*tensors)[t], bytes[t], parallel_for) != h.tensors[t].data_checksum)
      reason = "corrupt: data checksum of tensor " + std::to_string(t) + " differs";
  if (!reason.empty()) {  // nothing counted yet: unmap what was mapped and forget it
    a.mapped_.clear();
    ::close(fd);
    return reason;
  }
  for (size_t t = 0; t < count; ++t) a.count_allocation(bytes[t], /*in_file=*/true);
  a.file_ = BackingFile::adopt(fd, file_bytes);
  a.read_only_ = true;
  return "";
}

void refuse_cache(WeightArena& a, const std::string& reason) {
  std::lock_guard<std::mutex> lock(a.mutex_);
  if (!a.cache_refusal_.empty() || a.anonymous_mode()) return;
  a.cache_refusal_ = reason;
  if (!a.file_.valid() && a.open_error_.empty() && !a.holds_memory() && !a.options_.map_only) a.open_unnamed_file();
}

}  // namespace ktmoe
