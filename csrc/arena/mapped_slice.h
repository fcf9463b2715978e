// [NOTE] MappedSlice: one 2 MiB-aligned mapping of a file range, RAII.
//
// map() reserves an address range with PROT_NONE, maps [offset, offset + bytes)
// of the file at its first 2 MiB boundary (so large folios can be mapped a PMD at
// a time) and unmaps the slack; advice (MADV_RANDOM, optionally MADV_HUGEPAGE)
// is best effort. kShared: read-write, writes reach the file (a slice being
// packed). kPrivate: read-write copy on write, the file never changes (a kept
// cache file). remap_private() turns a shared slice into a private one at the
// same address (tensors keep their pointers). The destructor unmaps. Move-only.
#pragma once
#include <cstdint>
#include <string>

namespace ktmoe {

class MappedSlice {
 public:
  static constexpr int64_t kAlign = int64_t(2) << 20;  // 2 MiB
  enum class Mode { kShared, kPrivate };

  // An empty slice with *error set on failure.
  static MappedSlice map(int fd, int64_t offset, int64_t bytes, Mode mode, bool hugepage, std::string* error);
  MappedSlice() = default;
  ~MappedSlice();
  MappedSlice(MappedSlice&& other) noexcept;
  MappedSlice& operator=(MappedSlice&& other) noexcept;
  MappedSlice(const MappedSlice&) = delete;
  MappedSlice& operator=(const MappedSlice&) = delete;

  bool remap_private(int fd, bool hugepage);  // same address, same file range; false: left read-only
  void* addr() const { return addr_; }
  int64_t bytes() const { return bytes_; }
  int64_t offset() const { return offset_; }  // in the file
  bool contains(const void* p) const;

 private:
  void* addr_ = nullptr;
  int64_t bytes_ = 0, offset_ = 0;
};

}  // namespace ktmoe
