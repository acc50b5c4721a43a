// A Kokkos Tools library for the tests: counts the profiling regions a program pushes and, at
// Kokkos::finalize, prints each name with its count to standard error ("region <name> x <n>").
// Loaded through KOKKOS_PROFILE_LIBRARY (Kokkos 3.x) or KOKKOS_TOOLS_LIBS (4.x), as any tool.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {
std::map<std::string, int>& counts() {
  static std::map<std::string, int> regions;
  return regions;
}
std::vector<std::string>& open_regions() {
  static std::vector<std::string> stack;
  return stack;
}
}  // namespace

extern "C" {
void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}
void kokkosp_push_profile_region(const char* name) {
  ++counts()[name];
  open_regions().push_back(name);
}
void kokkosp_pop_profile_region() {
  if (!open_regions().empty()) open_regions().pop_back();
}
void kokkosp_finalize_library() {
  for (const auto& [name, count] : counts()) std::fprintf(stderr, "region %s x %d\n", name.c_str(), count);
  std::fprintf(stderr, "regions left open: %zu\n", open_regions().size());
}
}
