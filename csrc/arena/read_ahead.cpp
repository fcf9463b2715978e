#include "arena/read_ahead.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace ktmoe {

// Linux reads at most max(read_ahead_kb, max_sectors_kb) of the device per
// MADV_WILLNEED call (force_page_cache_ra): 128 KiB and 512-1280 KiB on common
// defaults. So the range is advised in 512 KiB pieces, which most devices'
// max_sectors_kb covers whole.
constexpr uintptr_t kPiece = uintptr_t(512) << 10;

void read_ahead(const void* addr, int64_t bytes) {
  if (addr == nullptr || bytes <= 0) return;
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + uintptr_t(bytes);
  for (uintptr_t p = reinterpret_cast<uintptr_t>(addr) & ~(page - 1); p < end; p += kPiece)
    ::madvise(reinterpret_cast<void*>(p), size_t(std::min(kPiece, end - p)), MADV_WILLNEED);
}

}  // namespace ktmoe
