#pragma once
// Test sizes: LONGATTN_TEST_SIZE=small (CI's sanitizer stages) runs every test case at the
// smaller of its two sizes, where size adds no coverage (more blocks of the same shape, more
// tokens per rank); unset or "full" runs the full sizes. Any other value stops the program.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace longattn::test {

inline bool small_test_sizes() {
  static const bool small = [] {
    const char* value = std::getenv("LONGATTN_TEST_SIZE");
    const std::string size = value ? value : "full";
    if (size != "full" && size != "small") {
      std::fprintf(stderr, "LONGATTN_TEST_SIZE is '%s'; expected 'full' (the default) or 'small'\n", size.c_str());
      std::exit(2);
    }
    return size == "small";
  }();
  return small;
}

// `full` normally, `small` with LONGATTN_TEST_SIZE=small.
template <class T>
T test_size(T full, T small) {
  return small_test_sizes() ? small : full;
}

}  // namespace longattn::test
