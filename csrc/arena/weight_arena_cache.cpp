// [NOTE] Persistent arenas: build a kept cache file atomically, or map a valid one.
//
// Build:  begin_build()  creates `<dir>/<name>.ktmoe.tmp.<pid>` and reserves the
//         header page; allocations then land in 2 MiB-aligned slices from 2 MiB on.
//         commit_build() checksums each tensor's data, writes the header LAST,
//         fsyncs the file, renames it over `<name>.ktmoe` (atomic: a reader sees
//         the old file or the complete new one) and fsyncs the directory so the
//         rename survives a crash. The slices are then remapped private
//         copy-on-write at the same addresses (tensors keep their pointers; a
//         write stays in this process). abort_build() / the destructor unlink a
//         temp file that was never committed.
// Reuse:  open_cached() opens `<name>.ktmoe` without following symlinks or
//         blocking, requires a regular file this user owns and others cannot
//         write, validates the header against the caller's CacheKey and the file
//         size (cache_file.h), maps each tensor MAP_PRIVATE, runs the caller's
//         content check (the ops layer: every packed expert header) and, with
//         verify_data, compares every tensor's data checksum. Nothing is written;
//         the pages are clean page cache from the first fault on.
// The lock that serialises validate-or-build between processes, and the order
// of these calls, are load_or_build_cache's (cache_protocol.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "arena/weight_arena.h"
#include "common/data_checksum.h"
#include "common/posix_text.h"

namespace ktmoe {

bool KtWeightArena::begin_build(std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!options_.persistent || options_.map_only) {
    *error = "begin_build: arena '" + name_ + "' is " + (options_.map_only ? "map-only" : "not persistent");
    return false;
  }
  if (!open_error_.empty() || !cache_refusal_.empty()) {
    *error = !open_error_.empty() ? open_error_ : cache_refusal_;
    return false;
  }
  if (file_.valid() || holds_memory()) {
    *error = "begin_build: arena '" + name_ + "' already holds a file or allocations";
    return false;
  }
  const std::string tmp = cache_tmp_path(dir_, name_);
  BackingFile file = BackingFile::create_temp(tmp, error);
  if (file.valid() && !file.reserve(0, kCacheHeaderBytes, error)) {
    *error = "'" + tmp + "': " + *error;
    file = BackingFile();  // removes the temp file
  }
  if (!file.valid()) {
    open_error_ = *error;  // every allocation falls back with this reason
    return false;
  }
  file.resize(kSliceAlign);  // slices start 2 MiB in: the header page, then a hole
  file_ = std::move(file);
  return true;
}

bool KtWeightArena::commit_build(const CacheKey& key, const std::vector<const void*>& tensors,
                                 const ParallelFor& parallel_for, std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!file_.is_temp()) {
    *error = "commit_build: no build in progress for arena '" + name_ + "'";
    return false;
  }
  auto fail = [&](const std::string& why) {
    *error = "arena '" + name_ + "': " + why;
    file_.discard_temp();
    return false;
  };
  if (tensors.size() != key.shapes.size()) return fail("commit_build: one pointer per tensor of the key");
  std::vector<int64_t> offsets(tensors.size());
  std::vector<uint32_t> checksums(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    offsets[t] = file_offset_locked(tensors[t]);
    if (offsets[t] < 0) return fail("tensor " + std::to_string(t) + " is not in the file (anonymous fallback)");
    checksums[t] = data_checksum(tensors[t], key.shapes[t].first * key.shapes[t].second, parallel_for);
  }
  CacheHeader h;
  try {
    h = make_cache_header(key, offsets, checksums, file_.size());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::string why;
  if (!file_.keep_as(&h, sizeof(h), 0, cache_file_path(dir_, name_), dir_, &why)) return fail(why);
  // The data is in the file and the page cache: the same bytes, mapped private.
  for (MappedSlice& s : mapped_) s.remap_private(file_.fd(), options_.hugepage);
  read_only_ = true;
  return true;
}

void KtWeightArena::abort_build() {
  std::lock_guard<std::mutex> lock(mutex_);
  file_.discard_temp();
}

std::string KtWeightArena::open_cached(const CacheKey& expect, const CacheKeyCheck& check_key,
                                       const ContentCheck& check, bool verify_data, const ParallelFor& parallel_for,
                                       std::vector<void*>* tensors) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!options_.persistent) return "arena '" + name_ + "' is not persistent";
  if (!open_error_.empty()) return "unusable directory: " + open_error_;
  if (!cache_refusal_.empty()) return cache_refusal_;
  if (file_.valid() || holds_memory()) return "arena '" + name_ + "' already holds a file or allocations";
  const std::string path = cache_file_path(dir_, name_);
  std::string reason;
  const int fd = open_regular_file(path, &reason);
  if (fd < 0) return reason;
  struct stat st;
  if (::fstat(fd, &st) != 0) reason = errno_text("unreadable: fstat '" + path + "'");
  if (reason.empty()) reason = check_trusted(st, "'" + path + "'", options_.trust_others);
  CacheHeader h;
  int64_t file_bytes = 0;
  if (reason.empty()) reason = read_cache_header(fd, &h, &file_bytes);
  if (reason.empty()) reason = validate_cache_header(h, file_bytes, expect, check_key);
  const size_t count = expect.shapes.size();
  std::vector<int64_t> bytes(count, 0);
  tensors->assign(count, nullptr);
  for (size_t t = 0; t < count && reason.empty(); ++t) {
    bytes[t] = h.tensors[t].rows * h.tensors[t].cols;
    MappedSlice slice = MappedSlice::map(fd, h.tensors[t].offset, round_up_to(bytes[t], kSliceAlign),
                                         MappedSlice::Mode::kPrivate, options_.hugepage, &reason);
    (*tensors)[t] = slice.addr();
    if (slice.addr()) mapped_.push_back(std::move(slice));
  }
  if (reason.empty() && check) reason = check(*tensors);
  for (size_t t = 0; t < count && reason.empty() && verify_data; ++t)
    if (data_checksum((*tensors)[t], bytes[t], parallel_for) != h.tensors[t].data_checksum)
      reason = "corrupt: data checksum of tensor " + std::to_string(t) + " differs";
  if (!reason.empty()) {  // nothing counted yet: unmap what was mapped and forget it
    mapped_.clear();
    ::close(fd);
    return reason;
  }
  for (size_t t = 0; t < count; ++t) count_allocation(bytes[t], /*in_file=*/true);
  file_ = BackingFile::adopt(fd, file_bytes);
  read_only_ = true;
  return "";
}

}  // namespace ktmoe
