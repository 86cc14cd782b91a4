// A minimal assertion harness for the kernel unit tests (ctest runs each binary; a
// non-zero exit is a failure). Kept tiny so the kernel library builds with no dependency.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace te_kernels::test {
inline int& failures() {
  static int count = 0;
  return count;
}
}  // namespace te_kernels::test

#define TE_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                 \
      std::fprintf(stderr, "\n");                                        \
      ++te_kernels::test::failures();                                    \
    }                                                                    \
  } while (0)

#define TE_TEST_MAIN_RETURN()                                            \
  do {                                                                   \
    if (te_kernels::test::failures() == 0) std::printf("all checks passed\n"); \
    return te_kernels::test::failures() == 0 ? 0 : 1;                    \
  } while (0)
