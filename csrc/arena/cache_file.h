// [NOTE] The persistent packed cache file: header format and validation.
//
// A kept arena file `<dir>/<name>.ktmoe` is
//   [CacheHeader: 4 KiB][hole up to 2 MiB][slice][slice]...   (slices 2 MiB aligned)
// The header is written LAST (after every slice), then the file is fsynced and
// renamed over the final name, so a reader that finds a valid header finds
// complete data. The header says what the slices hold (weight format, group,
// shapes, the NUMA part's intermediate range, packed-layout version) and where
// (offset and [rows, cols] of each tensor), plus a fingerprint of the source
// weights. validate_cache_header() compares all of it with what the caller
// expects and the actual file size; any difference is a reason to rebuild.
//
// The header checksum (FNV-1a 64 over the 4 KiB with the checksum field zeroed)
// guards the header. Each tensor entry also holds the data_checksum()
// (common/data_checksum.h) of its rows*cols bytes, computed at build time; a
// load checks it only when asked (verify "full"), since it reads every byte.
// Version 2 added the data checksums (a version 1 file is stale: rebuilt).
// This file is torch-free: the expected tensor shapes come from the ops layer.
#pragma once
#include <sys/stat.h>

#include <cstdint>
#include <string>

namespace ktmoe {

constexpr char kCacheMagic[8] = {'K', 'T', 'M', 'O', 'E', 'C', 'A', '1'};
constexpr uint32_t kCacheFileVersion = 2;
constexpr int64_t kCacheHeaderBytes = 4096;
constexpr int kCacheTensors = 2;               // w13, w2
constexpr int64_t kMaxFingerprintBytes = 256;

// What a caller expects of a cache file (and what a builder writes into it).
struct CacheKey {
  std::string weight_format;   // "bf16" | "int8" | "int4"
  int64_t group_size = 0;      // as given to pack_experts (0: default)
  int64_t experts = 0, hidden = 0, inter = 0;  // E, H, I of the whole layer
  int64_t inter_lo = 0, inter_hi = 0;          // this part's intermediate columns
  int64_t numa_part = 0;
  uint32_t packed_version = 0;                 // kPackedVersion of the kernels
  int64_t rows[kCacheTensors] = {0, 0};        // expected [rows, cols] of w13, w2
  int64_t cols[kCacheTensors] = {0, 0};
  std::string fingerprint;                     // <= kMaxFingerprintBytes
};

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
  uint32_t packed_version;
  uint32_t numa_part;
  char weight_format[8];
  int64_t group_size, experts, hidden, inter, inter_lo, inter_hi;
  int64_t file_bytes;
  CacheTensorEntry tensors[kCacheTensors];
  char layout_note[96];
  uint32_t fingerprint_len;
  char fingerprint[kMaxFingerprintBytes];
  uint8_t reserved[kCacheHeaderBytes - 8 - 4 - 4 - 8 - 4 - 4 - 8 - 7 * 8 - kCacheTensors * 32 - 96 - 4 -
                   kMaxFingerprintBytes];
};
#pragma pack(pop)
static_assert(sizeof(CacheHeader) == kCacheHeaderBytes, "cache header must be 4 KiB");

// Fills a header for `key` with the tensors at `offsets` (data checksums
// `checksums`) in a file of file_bytes; sets the header checksum. Throws
// std::invalid_argument on a too long fingerprint.
CacheHeader make_cache_header(const CacheKey& key, const int64_t offsets[kCacheTensors],
                              const uint32_t checksums[kCacheTensors], int64_t file_bytes);

// "" if h is a well-formed header (magic, version, checksum, offsets inside
// actual_file_bytes) else why not. Checks nothing about what the caller wants.
std::string check_cache_header(const CacheHeader& h, int64_t actual_file_bytes);

// check_cache_header plus: every field equals `expect`. "" if usable, else why not
// ("stale: ...", "corrupt: ...", "foreign: ...", "truncated: ...").
std::string validate_cache_header(const CacheHeader& h, int64_t actual_file_bytes, const CacheKey& expect);

// Reads the header of an open file; "" or why not (short file -> "truncated").
std::string read_cache_header(int fd, CacheHeader* h, int64_t* file_bytes);

// The CacheKey a well-formed header describes (what `inspect` checks a file against).
CacheKey cache_key_of(const CacheHeader& h);

// Opens an existing file for reading without following a symlink and without
// blocking (a FIFO), and requires a regular file: the fd, or -1 with *error
// ("not a regular file: ..." / "missing" / "unreadable: ...").
int open_regular_file(const std::string& path, std::string* error);

// "" if a cache file (or its directory) with this stat may be trusted by this
// process: owned by the effective user and not writable by others; else why
// not ("untrusted: ..."). trust_others skips the check (the caller opted in).
std::string check_trusted(const struct stat& st, const std::string& what, bool trust_others);

// Paths of an arena's kept file, its temporary build file and its lock file.
std::string cache_file_path(const std::string& dir, const std::string& name);
std::string cache_tmp_path(const std::string& dir, const std::string& name);  // .tmp.<pid>
std::string cache_lock_path(const std::string& dir, const std::string& name);

}  // namespace ktmoe
