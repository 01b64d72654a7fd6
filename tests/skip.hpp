#pragma once
// Tests that need a tool, a privilege or hardware this machine lacks are skipped through ctest's
// SKIP_RETURN_CODE (77), visibly, instead of passing without testing. Every test binary runs
// one test case per ctest entry, so the exit skips exactly that test. Under CI (CI=true) a
// missing tool or privilege is a failure: CI installs them (scripts/setup.sh), so a test that
// did not run there means something is broken. Missing hardware (a GPU, a second core) is
// skipped everywhere.

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ddprun::testing {

constexpr int kSkipCode = 77;

inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && (std::string(ci) == "true" || std::string(ci) == "1");
}

[[noreturn]] inline void skip_now(const std::string& why) {
  std::printf("SKIP: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(kSkipCode);
}

}  // namespace ddprun::testing

// Skips the test unless `cond` holds; under CI=true it fails instead.
#define SKIP_UNLESS(cond, why)                                              \
  do {                                                                      \
    if (!(cond)) {                                                          \
      if (::ddprun::testing::in_ci()) FAIL("CI=true and " << why);          \
      ::ddprun::testing::skip_now(std::string() + why);                     \
    }                                                                       \
  } while (0)

// Skips the test unless `cond` holds, under CI too: the hardware is not there.
#define SKIP_UNLESS_HARDWARE(cond, why)                                     \
  do {                                                                      \
    if (!(cond)) ::ddprun::testing::skip_now(std::string() + why);          \
  } while (0)
