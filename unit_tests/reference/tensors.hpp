#pragma once
// Test tensors: fresh random inputs in [-1, 1) (rounded through the kernel's type, so the double
// reference sees exactly the kernel's inputs), copies between the reference's double host views
// and device views, and the error measure every kernel test uses.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <type_traits>

#include "longattn/core/half.hpp"
#include "reference/attention.hpp"
#include "reference/random.hpp"
#include "reference/test_size.hpp"

namespace longattn::test {

// Uniform values in [-1, 1), rounded through T so that the reference sees exactly the kernel's inputs.
template <class T>
HostTensor random_tensor(int b, int n, int h, int d, std::mt19937_64& rng) {
  HostTensor t("random", b, n, h, d);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (std::size_t i = 0; i < t.span(); ++i) t.data()[i] = static_cast<double>(static_cast<T>(uniform(rng)));
  return t;
}

template <class T, class Memory, class Host>
auto to_device(const Host& host) {
  Kokkos::View<T****, Kokkos::LayoutRight, Memory> device("device", host.extent(0), host.extent(1),
                                                          host.extent(2), host.extent(3));
  auto mirror = Kokkos::create_mirror_view(device);
  for (std::size_t i = 0; i < mirror.span(); ++i) mirror.data()[i] = static_cast<T>(host.data()[i]);
  Kokkos::deep_copy(device, mirror);
  return device;
}

// Any device view (rank 3 or 4, any layout) as a double host view.
template <class View>
auto to_host(const View& view) {
  auto mirror = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  if constexpr (View::rank == 4) {
    HostTensor out("host", view.extent(0), view.extent(1), view.extent(2), view.extent(3));
    for (std::size_t a = 0; a < out.extent(0); ++a)
      for (std::size_t b = 0; b < out.extent(1); ++b)
        for (std::size_t c = 0; c < out.extent(2); ++c)
          for (std::size_t d = 0; d < out.extent(3); ++d) out(a, b, c, d) = mirror(a, b, c, d);
    return out;
  } else {
    HostRows out("host", view.extent(0), view.extent(1), view.extent(2));
    for (std::size_t a = 0; a < out.extent(0); ++a)
      for (std::size_t b = 0; b < out.extent(1); ++b)
        for (std::size_t c = 0; c < out.extent(2); ++c) out(a, b, c) = mirror(a, b, c);
    return out;
  }
}

// Largest |a - b| relative to max(1, largest |b|); equal infinities count as 0.
template <class View>
double relative_error(const View& a, const View& b) {
  double worst = 0, size = 1;
  for (std::size_t i = 0; i < b.span(); ++i) {
    const double x = a.data()[i], y = b.data()[i];
    if (std::isinf(y) && x == y) continue;
    worst = std::max(worst, std::isnan(x) ? std::numeric_limits<double>::infinity() : std::abs(x - y));
    size = std::max(size, std::abs(y));
  }
  return worst / size;
}

// Float and double: accumulated rounding. The 16-bit types: their outputs are rounded once to
// 8 (bfloat16) or 11 (float16) significant bits, an error of at most 2^-9 or 2^-12 relative,
// with a factor 2 for the rest (Delta from the rounded o, float accumulation).
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, longattn::bfloat16>) return 2 * 0x1p-9;
  if constexpr (std::is_same_v<T, longattn::float16>) return 2 * 0x1p-12;
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

// Gradients sum more terms: 4x, except in the 16-bit types, where the final rounding dominates.
template <class T>
double gradient_tolerance() {
  return (longattn::is_half_v<T> ? 1 : 4) * tolerance<T>();
}


// Gradients by central finite differences: the largest |(loss() at x + h e_i - loss() at
// x - h e_i) / 2h - analytic(i)| over the elements i of a contiguous device view x, perturbed one
// at a time through a host mirror (and restored). Every element; with LONGATTN_TEST_SIZE=small
// (test_size.hpp) about 64 of them, evenly spaced from a random first one.
template <class View, class Loss, class Analytic>
double finite_difference_error(const View& input, Loss&& loss, Analytic&& analytic, double h = 1e-6) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), input);
  const std::size_t count = host.span();
  const std::size_t stride = test_size<std::size_t>(1, std::max<std::size_t>(1, count / 64));
  std::mt19937_64 rng(test_seed() + count);
  double worst = 0;
  for (std::size_t i = rng() % stride; i < count; i += stride) {
    const double saved = host.data()[i];
    host.data()[i] = saved + h;
    Kokkos::deep_copy(input, host);
    const double up = loss();
    host.data()[i] = saved - h;
    Kokkos::deep_copy(input, host);
    const double down = loss();
    host.data()[i] = saved;
    Kokkos::deep_copy(input, host);
    worst = std::max(worst, std::abs((up - down) / (2 * h) - analytic(i)));
  }
  return worst;
}

}  // namespace longattn::test
