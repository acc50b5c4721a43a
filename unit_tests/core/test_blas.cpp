// BLAS kernel selection. CTest runs this file twice: once with OPENBLAS_CORETYPE unset, where
// longattn must pick kernels for the CPU's full vector ISA, and once with
// OPENBLAS_CORETYPE=Prescott, which a user's explicit choice must keep.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "longattn/core/blas.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/error.hpp"

namespace {
std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
}  // namespace

TEST_CASE("BLAS kernels match the CPU unless the user chose them", "[core][blas]") {
  const auto blas = longattn::blas_runtime();
  INFO("library: " << blas.library << "; kernels: " << blas.kernels << "; selection: " << blas.selection);
  if (blas.library.rfind("OpenBLAS", 0) != 0) {
    WARN("not OpenBLAS: nothing to select");
    return;
  }
  REQUIRE_FALSE(blas.kernels.empty());
  // longattn's own switch sets OPENBLAS_CORETYPE too (OpenBLAS reads it when it re-initializes).
  const bool switched = blas.selection.rfind("switched by longattn", 0) == 0;
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced && !switched) {
    CHECK(lower(blas.kernels) == lower(forced));
    CHECK_THAT(blas.selection, Catch::Contains("from the environment"));
    return;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const std::string k = lower(blas.kernels);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    CHECK((k == "skylakex" || k == "cooperlake" || k == "sapphirerapids"));
  } else if (__builtin_cpu_supports("avx2")) {
    CHECK((k == "haswell" || k == "zen" || k == "skylakex" || k == "cooperlake"));
  }
#endif
}

TEST_CASE("set_blas_threads validates its argument", "[core][blas][errors]") {
  const int before = longattn::blas_runtime().threads;
  CHECK_THROWS_WITH(longattn::set_blas_threads(0), Catch::Contains("'threads' is 0") && Catch::Contains("at least 1"));
  longattn::set_blas_threads(1);
  if (before > 0) {
    CHECK(longattn::blas_runtime().threads == 1);
    longattn::set_blas_threads(before);
  }
}

TEST_CASE("the selection decision: switch only kernels below the CPU's ISA, never a user's choice", "[core][blas]") {
  using longattn::detail::kernels_to_select;
  // What Debian's OpenBLAS 0.3.21 picks on Emerald Rapids (family 6, model 207).
  CHECK(kernels_to_select("Prescott", 3, false) == "SkylakeX");
  CHECK(kernels_to_select("Haswell", 3, false) == "SkylakeX");
  CHECK(kernels_to_select("Nehalem", 2, false) == "Haswell");
  CHECK(kernels_to_select("Core2", 1, false) == "Sandybridge");
  CHECK(kernels_to_select("Cooperlake", 3, false).empty());
  CHECK(kernels_to_select("SkylakeX", 3, false).empty());
  CHECK(kernels_to_select("Zen", 2, false).empty());
  CHECK(kernels_to_select("Prescott", 0, false).empty());
  CHECK(kernels_to_select("Prescott", 3, true).empty());     // the user forced it
  CHECK(kernels_to_select("NEOVERSEN1", 3, false).empty());  // unknown to longattn: keep
  CHECK(kernels_to_select("Prescott", -1, false).empty());   // unknown CPU
}

// The mechanism itself: OpenBLAS re-initialized at run time to SSE3 kernels and back gives
// correct results both ways.
TEST_CASE("OpenBLAS kernels can be switched at run time", "[core][blas]") {
  const std::string original = longattn::blas_runtime().kernels;
  if (longattn::blas_runtime().library.rfind("OpenBLAS", 0) != 0 || original.empty()) {
    WARN("not OpenBLAS: nothing to switch");
    return;
  }
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved_env = env ? env : "";

  auto sgemm_error = [] {
    const int n = 67;
    Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace> a("A", n, n), b("B", n, n), c("C", n, n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) a(i, j) = float((i + 2 * j) % 7) - 3, b(i, j) = float((3 * i + j) % 5) - 2;
    longattn::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", 1.0f, a, b, 0.0f, c);
    double worst = 0;  // small integers: the float result is exact
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double expected = 0;
        for (int l = 0; l < n; ++l) expected += double(a(i, l)) * b(l, j);
        worst = std::max(worst, std::abs(c(i, j) - expected));
      }
    return worst;
  };

  CHECK_THROWS_WITH(longattn::detail::switch_openblas_kernels(""), Catch::Contains("'name' is \"\""));
  CHECK(lower(longattn::detail::switch_openblas_kernels("Prescott")) == "prescott");
  CHECK(sgemm_error() == 0.0);
  CHECK(lower(longattn::detail::switch_openblas_kernels(original)) == lower(original));
  CHECK(sgemm_error() == 0.0);
  if (env) setenv("OPENBLAS_CORETYPE", saved_env.c_str(), 1);
  else unsetenv("OPENBLAS_CORETYPE");
}
