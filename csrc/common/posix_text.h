// Small torch-free helpers shared by the arena and the cache: the text of errno
// after a failed system call, and rounding up to a multiple.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace ktmoe {

// "<what>: <strerror(errno)>"; read errno right after the failing call.
inline std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// x rounded up to a multiple of m (m > 0, x >= 0).
inline int64_t round_up_to(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace ktmoe
