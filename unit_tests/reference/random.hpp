#pragma once
// Fresh random test data: a new seed every run unless LONGATTN_TEST_SEED is set, and the seed
// is printed with any failure (Catch2 INFO) so a failing case can be replayed.
#include <cstdint>
#include <cstdlib>
#include <random>

namespace longattn::test {

inline std::uint64_t test_seed() {
  static const std::uint64_t seed = []() -> std::uint64_t {
    if (const char* fixed = std::getenv("LONGATTN_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
    return static_cast<std::uint64_t>(std::random_device{}());
  }();
  return seed;
}

// Fills a host view (any rank <= 2) with uniform values in [-1, 1).
template <class HostView>
void fill_uniform(const HostView& view, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (std::size_t i = 0; i < view.extent(0); ++i)
    for (std::size_t j = 0; j < view.extent(1); ++j)
      view(i, j) = static_cast<typename HostView::value_type>(uniform(rng));
}

}  // namespace longattn::test
