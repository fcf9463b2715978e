// [NOTE] The native tests' check macros: one output line per check, counted.
//
//   CHECK(ok, what)  prints "PASS what", or "FAIL what [file:line]" and counts a failure;
//   SKIP(what)       prints "SKIP what" (an ISA this CPU lacks, a table being written);
//   strf(fmt, ...)   printf into a std::string, for the `what` of a check;
//   finish()         prints "N passed, M failed"; main returns it (1 if anything failed).
//
// tests/test_native_kernels.py runs the program and reads these lines: the last one must end
// in " 0 failed"; FAIL and SKIP lines are shown.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

namespace ktmoe_test {

inline int g_passed = 0, g_failed = 0, g_skipped = 0;

__attribute__((format(printf, 1, 2))) inline std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

inline void report(bool ok, const std::string& what, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  if (ok)
    std::printf("PASS %s\n", what.c_str());
  else
    std::printf("FAIL %s [%s:%d]\n", what.c_str(), slash ? slash + 1 : file, line);
  std::fflush(stdout);
  (ok ? g_passed : g_failed)++;
}

inline void skip(const std::string& what) {
  std::printf("SKIP %s\n", what.c_str());
  ++g_skipped;
}

inline int finish() {
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace ktmoe_test

#define CHECK(ok, what) ::ktmoe_test::report(static_cast<bool>(ok), (what), __FILE__, __LINE__)
#define SKIP(what) ::ktmoe_test::skip(what)
