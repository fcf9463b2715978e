// [NOTE] The page cache of a file, seen from this process: which pages are in it (mincore),
// and reading pages into it with read() (sequential, so the kernel's large-folio readahead
// runs ahead of the copy) or once through a mapping (one load per 64-byte line). The
// prefaulter (prefaulter.h) and a kept file's read-first step (cache_protocol.h) are built
// on these; none of them keeps any state.
#pragma once
#include <cstdint>
#include <string>

namespace ktmoe {

constexpr int64_t kReadChunk = int64_t(2) << 20;  // read() size: stays in the L2/L3, one syscall per 2 MiB

// Bytes of [addr, addr + bytes) (page aligned) in the page cache, mapped here or not; 0 if mincore fails.
int64_t mincore_resident(void* addr, int64_t bytes);
// Whether every page of [addr, addr + bytes) (any alignment: the ends rounded out to pages) is in the page
// cache; false if mincore fails (not a mapping).
bool range_in_page_cache(const void* addr, int64_t bytes);
// Reads [offset, offset + bytes) of fd with pread() into buf (contents discarded): through the page
// cache, with its readahead. Stops early at end of file. False with *error.
bool read_through(int fd, int64_t offset, int64_t bytes, char* buf, int64_t buf_bytes, std::string* error);
// One load per 64-byte line: the CPU's first read of pages nothing copied yet (prefaulter.h says why).
void read_lines(const char* p, int64_t bytes);

// Bytes of the file at `path` in the page cache (mincore over a read-only map);
// -1 with *error when it cannot be opened or mapped.
int64_t file_resident_bytes(const std::string& path, std::string* error);
// Reads the whole file at `path` with read() (a regular file, no symlink): into the
// page cache with its large-folio readahead, every page read once by the copy (see
// prefaulter.h). Returns the file's size, or -1 with *error.
int64_t read_file_through_cache(const std::string& path, std::string* error);

}  // namespace ktmoe
