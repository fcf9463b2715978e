// [NOTE] Cache file header: build, checksum, read and validate (see cache_file.h).
#include "arena/cache_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/posix_text.h"

namespace ktmoe {
namespace {

constexpr char kLayoutNote[] =
    "packed layout is ISA-independent: generic/avx2/avx512 kernels read the same bytes";

uint64_t header_checksum(const CacheHeader& h) {
  CacheHeader copy = h;
  copy.checksum = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(&copy);
  uint64_t x = 1469598103934665603ull;  // FNV-1a 64
  for (int64_t i = 0; i < kCacheHeaderBytes; ++i) x = (x ^ p[i]) * 1099511628211ull;
  return x;
}

std::string str_field(const char* s, size_t cap) { return std::string(s, strnlen(s, cap)); }

std::string mismatch(const char* what, const std::string& have, const std::string& want) {
  return std::string("stale: ") + what + " is " + have + ", expected " + want;
}
std::string mismatch(const char* what, int64_t have, int64_t want) {
  return mismatch(what, std::to_string(have), std::to_string(want));
}

}  // namespace

CacheHeader make_cache_header(const CacheKey& key, const int64_t offsets[kCacheTensors],
                              const uint32_t checksums[kCacheTensors], int64_t file_bytes) {
  if (int64_t(key.fingerprint.size()) > kMaxFingerprintBytes)
    throw std::invalid_argument("cache fingerprint longer than " + std::to_string(kMaxFingerprintBytes) + " bytes");
  if (key.weight_format.size() >= sizeof(CacheHeader::weight_format))
    throw std::invalid_argument("weight format name too long: " + key.weight_format);
  CacheHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kCacheMagic, sizeof(h.magic));
  h.file_version = kCacheFileVersion;
  h.header_bytes = kCacheHeaderBytes;
  h.packed_version = key.packed_version;
  h.numa_part = uint32_t(key.numa_part);
  std::memcpy(h.weight_format, key.weight_format.data(), key.weight_format.size());
  h.group_size = key.group_size;
  h.experts = key.experts;
  h.hidden = key.hidden;
  h.inter = key.inter;
  h.inter_lo = key.inter_lo;
  h.inter_hi = key.inter_hi;
  h.file_bytes = file_bytes;
  for (int t = 0; t < kCacheTensors; ++t) h.tensors[t] = {offsets[t], key.rows[t], key.cols[t], checksums[t], 0};
  std::memcpy(h.layout_note, kLayoutNote, sizeof(kLayoutNote));
  h.fingerprint_len = uint32_t(key.fingerprint.size());
  std::memcpy(h.fingerprint, key.fingerprint.data(), key.fingerprint.size());
  h.checksum = header_checksum(h);
  return h;
}

std::string check_cache_header(const CacheHeader& h, int64_t actual_file_bytes) {
  if (std::memcmp(h.magic, kCacheMagic, sizeof(h.magic)) != 0) return "foreign: bad magic (not a ktmoe cache file)";
  if (h.checksum != header_checksum(h)) return "corrupt: header checksum mismatch";
  if (h.file_version != kCacheFileVersion || h.header_bytes != kCacheHeaderBytes)
    return "stale: cache file version " + std::to_string(h.file_version) + ", expected " +
           std::to_string(kCacheFileVersion);
  if (h.fingerprint_len > kMaxFingerprintBytes) return "corrupt: fingerprint length";
  if (actual_file_bytes != h.file_bytes)
    return "truncated: file has " + std::to_string(actual_file_bytes) + " bytes, header says " +
           std::to_string(h.file_bytes);
  for (const CacheTensorEntry& t : h.tensors) {
    int64_t bytes = 0, end = 0;  // checked arithmetic: forged sizes must not wrap
    if (t.offset < kCacheHeaderBytes || t.rows <= 0 || t.cols <= 0 || t.offset % (int64_t(2) << 20) != 0 ||
        __builtin_mul_overflow(t.rows, t.cols, &bytes) || __builtin_add_overflow(t.offset, bytes, &end) ||
        end > h.file_bytes)
      return "corrupt: tensor range outside the file";
  }
  return "";
}

std::string validate_cache_header(const CacheHeader& h, int64_t actual_file_bytes, const CacheKey& expect) {
  if (std::string r = check_cache_header(h, actual_file_bytes); !r.empty()) return r;
  if (h.packed_version != expect.packed_version)
    return mismatch("packed layout version", h.packed_version, expect.packed_version);
  const std::string format = str_field(h.weight_format, sizeof(h.weight_format));
  if (format != expect.weight_format) return mismatch("weight format", format, expect.weight_format);
  if (h.group_size != expect.group_size) return mismatch("group size", h.group_size, expect.group_size);
  if (h.experts != expect.experts) return mismatch("experts", h.experts, expect.experts);
  if (h.hidden != expect.hidden) return mismatch("hidden size", h.hidden, expect.hidden);
  if (h.inter != expect.inter) return mismatch("intermediate size", h.inter, expect.inter);
  if (h.inter_lo != expect.inter_lo || h.inter_hi != expect.inter_hi)
    return mismatch("intermediate range", std::to_string(h.inter_lo) + ".." + std::to_string(h.inter_hi),
                    std::to_string(expect.inter_lo) + ".." + std::to_string(expect.inter_hi));
  if (int64_t(h.numa_part) != expect.numa_part) return mismatch("NUMA part", h.numa_part, expect.numa_part);
  for (int t = 0; t < kCacheTensors; ++t)
    if (h.tensors[t].rows != expect.rows[t] || h.tensors[t].cols != expect.cols[t])
      return mismatch(t == 0 ? "w13 shape" : "w2 shape",
                      std::to_string(h.tensors[t].rows) + "x" + std::to_string(h.tensors[t].cols),
                      std::to_string(expect.rows[t]) + "x" + std::to_string(expect.cols[t]));
  if (std::string(h.fingerprint, h.fingerprint_len) != expect.fingerprint)
    return "stale: source fingerprint differs (the weights changed)";
  return "";
}

CacheKey cache_key_of(const CacheHeader& h) {
  CacheKey key;
  key.weight_format = str_field(h.weight_format, sizeof(h.weight_format));
  key.group_size = h.group_size;
  key.experts = h.experts;
  key.hidden = h.hidden;
  key.inter = h.inter;
  key.inter_lo = h.inter_lo;
  key.inter_hi = h.inter_hi;
  key.numa_part = h.numa_part;
  key.packed_version = h.packed_version;
  for (int t = 0; t < kCacheTensors; ++t) {
    key.rows[t] = h.tensors[t].rows;
    key.cols[t] = h.tensors[t].cols;
  }
  key.fingerprint.assign(h.fingerprint, std::min<uint32_t>(h.fingerprint_len, kMaxFingerprintBytes));
  return key;
}

int open_regular_file(const std::string& path, std::string* error) {
  // O_NOFOLLOW: a planted symlink is refused (ELOOP); O_NONBLOCK: a FIFO does not
  // wait for a writer. Then only a regular file is accepted.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) *error = "missing";
    else if (errno == ELOOP) *error = "not a regular file: '" + path + "' is a symlink (not followed)";
    else *error = errno_text("unreadable: open '" + path + "'");
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *error = "not a regular file: '" + path + "'";
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string check_trusted(const struct stat& st, const std::string& what, bool trust_others) {
  if (trust_others) return "";
  if (st.st_uid != ::geteuid())
    return "untrusted: " + what + " is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
           std::to_string(::geteuid()) + "); pass cache_trust_others=True to accept it";
  if (st.st_mode & S_IWOTH)
    return "untrusted: " + what + " is writable by others; pass cache_trust_others=True to accept it";
  return "";
}

std::string read_cache_header(int fd, CacheHeader* h, int64_t* file_bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) return errno_text("unreadable: fstat");
  *file_bytes = st.st_size;
  if (st.st_size < kCacheHeaderBytes)
    return "truncated: " + std::to_string(st.st_size) + " bytes, shorter than the header";
  int64_t got = 0;
  auto* p = reinterpret_cast<char*>(h);
  while (got < kCacheHeaderBytes) {
    const ssize_t n = ::pread(fd, p + got, size_t(kCacheHeaderBytes - got), got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_text("unreadable: pread");
    if (n == 0) return "unreadable: pread: short read";
    got += n;
  }
  return "";
}

std::string cache_file_path(const std::string& dir, const std::string& name) {
  return dir + "/" + name + ".ktmoe";
}
std::string cache_tmp_path(const std::string& dir, const std::string& name) {
  return cache_file_path(dir, name) + ".tmp." + std::to_string(getpid());
}
std::string cache_lock_path(const std::string& dir, const std::string& name) {
  return cache_file_path(dir, name) + ".lock";
}

}  // namespace ktmoe
