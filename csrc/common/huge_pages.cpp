// [NOTE] map_huge_pages (see huge_pages.h): reserve bytes + 2 MiB, keep the 2 MiB-aligned part,
// unmap the slack on both sides, advise the whole 2 MiB pages inside.
#include "common/huge_pages.h"

#include <sys/mman.h>

namespace ktmoe {
namespace {

uintptr_t page_rounded(int64_t bytes) { return (uintptr_t(bytes) + 4095) & ~uintptr_t(4095); }

}  // namespace

void* map_huge_pages(int64_t bytes, bool advise) {
  const uintptr_t huge = uintptr_t(kHugePageBytes), size = page_rounded(bytes);
  void* reserve = ::mmap(nullptr, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reserve == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(reserve), start = (base + huge - 1) & ~(huge - 1);
  if (start > base) ::munmap(reserve, start - base);
  ::munmap(reinterpret_cast<void*>(start + size), base + huge - start);  // the tail: start - base < huge
  const uintptr_t whole = uintptr_t(bytes) & ~(huge - 1);
  if (advise && whole > 0) ::madvise(reinterpret_cast<void*>(start), whole, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(start);
}

void unmap_huge_pages(void* p, int64_t bytes) {
  if (p) ::munmap(p, page_rounded(bytes));
}

}  // namespace ktmoe
