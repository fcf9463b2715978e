// [NOTE] MappedSlice (see mapped_slice.h): aligned file mappings, unmapped by RAII.
#include "arena/mapped_slice.h"

#include <sys/mman.h>

#include <utility>

#include "common/posix_text.h"

namespace ktmoe {
namespace {

void advise(void* addr, int64_t bytes, bool hugepage) {
  // Best effort: a kernel without THP for files still maps the slice.
  ::madvise(addr, size_t(bytes), MADV_RANDOM);
  if (hugepage) ::madvise(addr, size_t(bytes), MADV_HUGEPAGE);
}

}  // namespace

MappedSlice MappedSlice::map(int fd, int64_t offset, int64_t bytes, Mode mode, bool hugepage, std::string* error) {
  void* reserve = ::mmap(nullptr, size_t(bytes + kAlign), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
  if (reserve == MAP_FAILED) {
    *error = errno_text("mmap (address reservation)");
    return {};
  }
  const auto base = reinterpret_cast<uintptr_t>(reserve);
  const uintptr_t aligned = (base + kAlign - 1) & ~uintptr_t(kAlign - 1);
  const int share = mode == Mode::kShared ? MAP_SHARED : MAP_PRIVATE;
  void* addr = ::mmap(reinterpret_cast<void*>(aligned), size_t(bytes), PROT_READ | PROT_WRITE, share | MAP_FIXED,
                      fd, offset);
  if (addr == MAP_FAILED) {
    *error = errno_text(mode == Mode::kShared ? "mmap (MAP_SHARED)" : "mmap (MAP_PRIVATE)");
    ::munmap(reserve, size_t(bytes + kAlign));
    return {};
  }
  if (aligned > base) ::munmap(reserve, aligned - base);
  const uintptr_t tail = aligned + bytes, end = base + bytes + kAlign;
  if (end > tail) ::munmap(reinterpret_cast<void*>(tail), end - tail);
  advise(addr, bytes, hugepage);
  MappedSlice s;
  s.addr_ = addr;
  s.bytes_ = bytes;
  s.offset_ = offset;
  return s;
}

MappedSlice::~MappedSlice() {
  if (addr_) ::munmap(addr_, size_t(bytes_));
}

MappedSlice::MappedSlice(MappedSlice&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), bytes_(other.bytes_), offset_(other.offset_) {}

MappedSlice& MappedSlice::operator=(MappedSlice&& other) noexcept {
  if (this != &other) {
    if (addr_) ::munmap(addr_, size_t(bytes_));
    addr_ = std::exchange(other.addr_, nullptr);
    bytes_ = other.bytes_;
    offset_ = other.offset_;
  }
  return *this;
}

bool MappedSlice::remap_private(int fd, bool hugepage) {
  if (!addr_) return false;
  if (::mmap(addr_, size_t(bytes_), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, offset_) == MAP_FAILED) {
    ::mprotect(addr_, size_t(bytes_), PROT_READ);  // at worst: writes fault, the file stays safe
    return false;
  }
  advise(addr_, bytes_, hugepage);
  return true;
}

bool MappedSlice::contains(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(addr_);
  return addr_ && a >= b && a < b + uintptr_t(bytes_);
}

}  // namespace ktmoe
