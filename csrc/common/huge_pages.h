// Anonymous memory on transparent huge pages, for packed weights.
//
// A decode step streams tens of MB of weights from DRAM; on 4 KiB pages every page is a TLB
// miss and a page walk. map_huge_pages gives a private anonymous mapping of its own, 2 MiB
// aligned, with MADV_HUGEPAGE over its whole 2 MiB pages, so the kernel backs them with 2 MiB
// pages at first touch (under THP's default "madvise" mode; "never" ignores the advice,
// "always" needs none). Its own mapping, not the heap's: advice on malloc'd memory would stay
// on heap ranges that later hold anything. File-backed slices get the same advice
// (arena/mapped_slice.cpp).
#pragma once
#include <cstdint>

namespace ktmoe {

constexpr int64_t kHugePageBytes = int64_t(2) << 20;

// `bytes` (> 0) of zeroed memory at a 2 MiB-aligned address in a mapping of its own, its whole 2 MiB pages
// advised as huge pages when `advise` (best effort: a kernel without THP still maps it); nullptr when mmap
// fails. Free with unmap_huge_pages(p, bytes). Without the advice the mapping still is its own: no advice
// another allocation left on a heap range applies to it.
void* map_huge_pages(int64_t bytes, bool advise = true);
void unmap_huge_pages(void* p, int64_t bytes);

}  // namespace ktmoe
