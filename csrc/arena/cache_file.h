// [NOTE] The persistent cache file: header format and validation. MoE-free.
//
// A kept arena file `<dir>/<name>.ktmoe` is
//   [CacheHeader: 4 KiB][hole up to 2 MiB][slice][slice]...   (slices 2 MiB aligned)
// The header is written LAST (after every slice), then the file is fsynced and
// renamed over the final name, so a reader that finds a valid header finds
// complete data. The header holds N tensor entries (offset, [rows, cols] of
// uint8, data checksum) and opaque key bytes: what the slices mean (for packed
// experts: weight format, shapes, source fingerprint, ...) is defined by the
// caller (ops/packed_cache.h), which also judges a stored key against the one
// it wants. validate_cache_header() checks the file is well formed, holds the
// tensor shapes the caller expects, and asks the caller about the key; any
// difference is a reason to rebuild.
//
// The header checksum (FNV-1a 64 over the 4 KiB with the checksum field zeroed)
// guards the header. Each tensor entry also holds the data_checksum()
// (common/data_checksum.h) of its rows*cols bytes, computed at build time; a
// load checks it only when asked (verify "full"), since it reads every byte.
// Version 2: tensor entries + key bytes + data checksums (version 1 is stale).
#pragma once
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ktmoe {

constexpr char kCacheMagic[8] = {'K', 'T', 'M', 'O', 'E', 'C', 'A', '1'};
constexpr uint32_t kCacheFileVersion = 2;
constexpr int64_t kCacheHeaderBytes = 4096;
constexpr int kMaxCacheTensors = 8;
constexpr int64_t kMaxCacheKeyBytes = 2048;

// What a caller expects of a cache file (and what a builder writes into it).
struct CacheKey {
  std::string key;                                // opaque key bytes (<= kMaxCacheKeyBytes)
  std::vector<std::pair<int64_t, int64_t>> shapes;  // [rows, cols] (uint8) of each tensor, in order
};

// Judges the key bytes stored in a file: "" if usable, else why not ("stale: ...").
using CacheKeyCheck = std::function<std::string(const std::string& stored_key)>;

#pragma pack(push, 1)
struct CacheTensorEntry {
  int64_t offset;  // byte offset in the file (2 MiB aligned)
  int64_t rows, cols;
  uint32_t data_checksum;  // data_checksum() of the rows*cols bytes at offset
  uint32_t reserved;       // 0
};
struct CacheHeader {
  char magic[8];
  uint32_t file_version;
  uint32_t header_bytes;
  uint64_t checksum;
  int64_t file_bytes;
  uint32_t tensor_count;
  uint32_t key_bytes;
  CacheTensorEntry tensors[kMaxCacheTensors];
  char key[kMaxCacheKeyBytes];
  uint8_t reserved[kCacheHeaderBytes - 8 - 4 - 4 - 8 - 8 - 4 - 4 - kMaxCacheTensors * 32 - kMaxCacheKeyBytes];
};
#pragma pack(pop)
static_assert(sizeof(CacheHeader) == kCacheHeaderBytes, "cache header must be 4 KiB");

// A header for `key` with tensors at `offsets` (data checksums `checksums`) in a
// file of file_bytes, its checksum set. Throws std::invalid_argument on a too
// long key or too many tensors.
CacheHeader make_cache_header(const CacheKey& key, const std::vector<int64_t>& offsets,
                              const std::vector<uint32_t>& checksums, int64_t file_bytes);

// "" if h is a well-formed header (magic, version, checksum, counts, offsets
// inside actual_file_bytes) else why not. Checks nothing about what the caller wants.
std::string check_cache_header(const CacheHeader& h, int64_t actual_file_bytes);

// check_cache_header, then the tensor shapes equal expect.shapes and
// check_key(stored key) accepts the key. "" if usable, else why not
// ("stale: ...", "corrupt: ...", "foreign: ...", "truncated: ...").
std::string validate_cache_header(const CacheHeader& h, int64_t actual_file_bytes, const CacheKey& expect,
                                  const CacheKeyCheck& check_key);

// The stored key bytes of a well-formed header.
std::string stored_key(const CacheHeader& h);

// Reads the header of an open file; "" or why not (short file -> "truncated").
std::string read_cache_header(int fd, CacheHeader* h, int64_t* file_bytes);

// Opens an existing file for reading without following a symlink (unless
// follow_symlink) and without blocking (a FIFO), and requires a regular file:
// the fd, or -1 with *error ("not a regular file: ..." / "missing" / "unreadable: ...").
int open_regular_file(const std::string& path, std::string* error, bool follow_symlink = false);

// "" if a cache file (or its directory) with this stat may be trusted by this
// process: owned by the effective user and not writable by others; else why
// not ("untrusted: ..."). trust_others skips the check (the caller opted in).
std::string check_trusted(const struct stat& st, const std::string& what, bool trust_others);

// The names of an arena's files; this is the one place that spells them:
// `<name>.ktmoe` (kept), `<name>.ktmoe.tmp.<pid>` (a build), `<name>.ktmoe.lock`,
// and the names of a layer's arenas.
constexpr char kCacheSuffix[] = ".ktmoe";
std::string cache_file_name(const std::string& name);  // <name>.ktmoe
std::string cache_lock_name(const std::string& name);  // <name>.ktmoe.lock
std::string cache_file_path(const std::string& dir, const std::string& name);
std::string cache_tmp_path(const std::string& dir, const std::string& name);  // .tmp.<pid>
std::string cache_lock_path(const std::string& dir, const std::string& name);

// The arena name of a layer's NUMA part, `layer0003.part1`, and back from a
// name or file name (`layer0003.part1.ktmoe`): false when it is not one.
std::string cache_arena_name(int64_t layer, int64_t part);
bool parse_cache_arena_name(const std::string& name, int64_t* layer, int64_t* part);

// Names of the temporary build files in dir (of arena `name`; all when empty), sorted.
std::vector<std::string> cache_temp_files(const std::string& dir, const std::string& name);
// Removes arena `name`'s temporary build files (call under its CacheLock: any
// such file is a build that did not finish); returns the names removed.
std::vector<std::string> remove_stale_temp_files(const std::string& dir, const std::string& name);

}  // namespace ktmoe
