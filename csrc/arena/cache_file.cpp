// [NOTE] Cache file header: build, checksum, read and validate; safe opening (see cache_file.h).
#include "arena/cache_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "common/posix_text.h"

namespace ktmoe {
namespace {

uint64_t header_checksum(const CacheHeader& h) {
  CacheHeader copy = h;
  copy.checksum = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(&copy);
  uint64_t x = 1469598103934665603ull;  // FNV-1a 64
  for (int64_t i = 0; i < kCacheHeaderBytes; ++i) x = (x ^ p[i]) * 1099511628211ull;
  return x;
}

}  // namespace

CacheHeader make_cache_header(const CacheKey& key, const std::vector<int64_t>& offsets,
                              const std::vector<uint32_t>& checksums, int64_t file_bytes) {
  if (int64_t(key.key.size()) > kMaxCacheKeyBytes)
    throw std::invalid_argument("cache key longer than " + std::to_string(kMaxCacheKeyBytes) + " bytes");
  if (key.shapes.size() > size_t(kMaxCacheTensors) || offsets.size() != key.shapes.size() ||
      checksums.size() != key.shapes.size())
    throw std::invalid_argument("cache file: 1 to " + std::to_string(kMaxCacheTensors) +
                                " tensors, each with an offset and a checksum");
  CacheHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kCacheMagic, sizeof(h.magic));
  h.file_version = kCacheFileVersion;
  h.header_bytes = kCacheHeaderBytes;
  h.file_bytes = file_bytes;
  h.tensor_count = uint32_t(key.shapes.size());
  for (size_t t = 0; t < key.shapes.size(); ++t)
    h.tensors[t] = {offsets[t], key.shapes[t].first, key.shapes[t].second, checksums[t], 0};
  h.key_bytes = uint32_t(key.key.size());
  std::memcpy(h.key, key.key.data(), key.key.size());
  h.checksum = header_checksum(h);
  return h;
}

std::string check_cache_header(const CacheHeader& h, int64_t actual_file_bytes) {
  if (std::memcmp(h.magic, kCacheMagic, sizeof(h.magic)) != 0) return "foreign: bad magic (not a ktmoe cache file)";
  if (h.checksum != header_checksum(h)) return "corrupt: header checksum mismatch";
  if (h.file_version != kCacheFileVersion || h.header_bytes != kCacheHeaderBytes)
    return "stale: cache file version " + std::to_string(h.file_version) + ", expected " +
           std::to_string(kCacheFileVersion);
  if (h.key_bytes > kMaxCacheKeyBytes) return "corrupt: key length";
  if (h.tensor_count < 1 || h.tensor_count > uint32_t(kMaxCacheTensors)) return "corrupt: tensor count";
  if (actual_file_bytes != h.file_bytes)
    return "truncated: file has " + std::to_string(actual_file_bytes) + " bytes, header says " +
           std::to_string(h.file_bytes);
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    const CacheTensorEntry& t = h.tensors[i];
    int64_t bytes = 0, end = 0;  // checked arithmetic: forged sizes must not wrap
    if (t.offset < kCacheHeaderBytes || t.rows <= 0 || t.cols <= 0 || t.offset % (int64_t(2) << 20) != 0 ||
        __builtin_mul_overflow(t.rows, t.cols, &bytes) || __builtin_add_overflow(t.offset, bytes, &end) ||
        end > h.file_bytes)
      return "corrupt: tensor range outside the file";
  }
  return "";
}

std::string stored_key(const CacheHeader& h) {
  return std::string(h.key, std::min<uint32_t>(h.key_bytes, kMaxCacheKeyBytes));
}

std::string validate_cache_header(const CacheHeader& h, int64_t actual_file_bytes, const CacheKey& expect,
                                  const CacheKeyCheck& check_key) {
  if (std::string r = check_cache_header(h, actual_file_bytes); !r.empty()) return r;
  if (std::string r = check_key(stored_key(h)); !r.empty()) return r;
  if (h.tensor_count != expect.shapes.size())
    return "stale: " + std::to_string(h.tensor_count) + " tensors, expected " + std::to_string(expect.shapes.size());
  for (uint32_t t = 0; t < h.tensor_count; ++t)
    if (h.tensors[t].rows != expect.shapes[t].first || h.tensors[t].cols != expect.shapes[t].second)
      return "stale: tensor " + std::to_string(t) + " is " + std::to_string(h.tensors[t].rows) + "x" +
             std::to_string(h.tensors[t].cols) + ", expected " + std::to_string(expect.shapes[t].first) + "x" +
             std::to_string(expect.shapes[t].second);
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

int open_regular_file(const std::string& path, std::string* error, bool follow_symlink) {
  // O_NOFOLLOW: a planted symlink is refused (ELOOP); O_NONBLOCK: a FIFO does not
  // wait for a writer. Then only a regular file is accepted.
  const int fd = ::open(path.c_str(), O_RDONLY | (follow_symlink ? 0 : O_NOFOLLOW) | O_NONBLOCK | O_CLOEXEC);
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

std::string cache_file_name(const std::string& name) { return name + kCacheSuffix; }
std::string cache_lock_name(const std::string& name) { return cache_file_name(name) + ".lock"; }

std::string cache_file_path(const std::string& dir, const std::string& name) {
  return dir + "/" + cache_file_name(name);
}
std::string cache_tmp_path(const std::string& dir, const std::string& name) {
  return cache_file_path(dir, name) + ".tmp." + std::to_string(getpid());
}
std::string cache_lock_path(const std::string& dir, const std::string& name) {
  return dir + "/" + cache_lock_name(name);
}

std::string cache_arena_name(int64_t layer, int64_t part) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "layer%04lld.part%lld", static_cast<long long>(layer), static_cast<long long>(part));
  return buf;
}

bool parse_cache_arena_name(const std::string& name, int64_t* layer, int64_t* part) {
  std::string stem = name;
  const size_t n = std::strlen(kCacheSuffix);
  if (stem.size() > n && stem.compare(stem.size() - n, n, kCacheSuffix) == 0) stem.resize(stem.size() - n);
  long long l = 0, p = 0;
  int used = 0;
  if (std::sscanf(stem.c_str(), "layer%lld.part%lld%n", &l, &p, &used) != 2 || size_t(used) != stem.size() ||
      l < 0 || p < 0 || cache_arena_name(l, p) != stem)
    return false;
  *layer = l;
  *part = p;
  return true;
}

std::vector<std::string> cache_temp_files(const std::string& dir, const std::string& name) {
  const std::string marker = std::string(kCacheSuffix) + ".tmp.";
  const std::string prefix = name.empty() ? "" : name + marker;
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (prefix.empty() ? n.find(marker) != std::string::npos : n.compare(0, prefix.size(), prefix) == 0)
        out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir, const std::string& name) {
  std::vector<std::string> removed;
  for (const std::string& n : cache_temp_files(dir, name))
    if (::unlink((dir + "/" + n).c_str()) == 0) removed.push_back(n);
  return removed;
}

}  // namespace ktmoe
