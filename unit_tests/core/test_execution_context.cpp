// The caller's execution context: two MultiheadAttention layers on two different instances
// (Kokkos::Serial on a thread of its own, Kokkos::OpenMP on this one), each with its own pool,
// run at the same time and give what each gives alone; nothing comes from the default pool; a
// pool's limit is a clear longattn::Error and the layer can go on after it. Fixed block-sparse
// layouts are built once per shape and shared by layers.
#include <catch2/catch.hpp>

#include <cmath>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "longattn/core/attention_spec.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/multihead_attention.hpp"
#include "reference/random.hpp"

namespace {

constexpr int B = 2, N = 200, E = 24, H = 4;

longattn::MultiheadAttentionOptions layer_options(const char* spec) {
  longattn::MultiheadAttentionOptions options;
  options.attention = longattn::parse_attention_spec(spec);
  options.causal = true;
  options.seed = longattn::test::test_seed();
  return options;
}

longattn::memory::PoolOptions labelled(const std::string& label, std::size_t limit_bytes = 0) {
  longattn::memory::PoolOptions options;
  options.label = label;
  options.limit_bytes = limit_bytes;
  options.min_chunk_bytes = std::size_t(256) << 10;
  return options;
}

#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
std::vector<double> random_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1, 1);
  std::vector<double> values(count);
  for (double& v : values) v = uniform(rng);
  return values;
}

// y, dx and the parameter gradients of one forward and backward pass, on the host.
struct LayerResult {
  std::vector<double> y, dx, gradients;
};

template <class Exec>
class LayerRun {
 public:
  using Memory = typename Exec::memory_space;
  using Tokens = Kokkos::View<double***, Kokkos::LayoutRight, Memory>;

  LayerRun(const longattn::ExecutionContext<Exec>& context, const char* spec)
      : layer_(context, E, H, layer_options(spec)), x_("x", B, N, E), dy_("dy", B, N, E), y_("y", B, N, E),
        dx_("dx", B, N, E) {
    copy_in(x_, random_values(x_.size(), 1 + longattn::test::test_seed()));
    copy_in(dy_, random_values(dy_.size(), 2 + longattn::test::test_seed()));
  }

  LayerResult run() {
    layer_.zero_gradients();
    layer_.forward(x_, y_);
    layer_.backward(dy_, dx_);
    layer_.context().exec().fence();
    return {copy_out(y_), copy_out(dx_), copy_out(layer_.gradients())};
  }

 private:
  template <class View>
  static void copy_in(const View& view, const std::vector<double>& values) {
    const auto host = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < values.size(); ++i) host.data()[i] = values[i];
    Kokkos::deep_copy(view, host);
  }
  template <class View>
  static std::vector<double> copy_out(const View& view) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    return std::vector<double>(host.data(), host.data() + host.size());
  }

  longattn::MultiheadAttention<Exec, double> layer_;
  Tokens x_, dy_, y_, dx_;
};

double largest_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

void check_same(const LayerResult& together, const LayerResult& alone) {
  // Each layer does the same arithmetic in the same order on its own instance: equal up to the
  // BLAS's own rounding choices, far below the 1e-12 of the layer against its double reference.
  CHECK(largest_difference(together.y, alone.y) < 1e-13);
  CHECK(largest_difference(together.dx, alone.dx) < 1e-13);
  CHECK(largest_difference(together.gradients, alone.gradients) < 1e-13);
}
#endif

}  // namespace

TEST_CASE("two layers on two execution space instances run at once, each as alone", "[core][context]") {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  const longattn::memory::Pool<Kokkos::HostSpace> serial_pool(labelled("serial layer"));
  const longattn::memory::Pool<Kokkos::HostSpace> openmp_pool(labelled("openmp layer"));
  const longattn::ExecutionContext<Kokkos::Serial> serial(Kokkos::Serial(), serial_pool);
  const longattn::ExecutionContext<Kokkos::OpenMP> openmp(Kokkos::OpenMP(), openmp_pool);
  const char* spec = GENERATE("block_sparse:pattern=local_window;radius=64", "dilated:w=64,128;r=1,2");
  INFO(spec << ", seed " << longattn::test::test_seed());
  LayerRun<Kokkos::Serial> serial_layer(serial, spec);
  LayerRun<Kokkos::OpenMP> openmp_layer(openmp, spec);
  const LayerResult serial_alone = serial_layer.run();
  const LayerResult openmp_alone = openmp_layer.run();

  auto& default_pool = longattn::memory::default_pool<Kokkos::HostSpace>();
  const auto default_allocations = default_pool.stats().allocations;
  const auto serial_allocations = serial_pool.stats().allocations;
  const auto openmp_allocations = openmp_pool.stats().allocations;
  LayerResult serial_together, openmp_together;
  std::exception_ptr serial_error;
  for (int round = 0; round < 3; ++round) {  // several overlapping passes
    std::thread serial_thread([&] {
      try {
        serial_together = serial_layer.run();
      } catch (...) {
        serial_error = std::current_exception();
      }
    });
    openmp_together = openmp_layer.run();
    serial_thread.join();
    if (serial_error) std::rethrow_exception(serial_error);
    check_same(serial_together, serial_alone);
    check_same(openmp_together, openmp_alone);
  }
  // The layers' workspaces (backward's Delta, dilated attention's partial results) came from
  // their own pools, none from the default pool.
  CHECK(default_pool.stats().allocations == default_allocations);
  CHECK(serial_pool.stats().allocations > serial_allocations);
  CHECK(openmp_pool.stats().allocations > openmp_allocations);
#else
  WARN("SKIP: needs Kokkos::Serial and Kokkos::OpenMP enabled together");
#endif
}

TEST_CASE("a layer whose pool reaches its limit gets a clear error and can go on", "[core][context][errors]") {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using Tokens = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;
  const longattn::memory::Pool<Kokkos::HostSpace> pool(labelled("layer limit", std::size_t(2) << 20));
  longattn::MultiheadAttention<Exec, double> layer(longattn::ExecutionContext<Exec>(Exec(), pool), E, H,
                                                   layer_options("dense"));
  const Tokens big("x", 1, 4096, E), big_y("y", 1, 4096, E);  // Q, K, V alone: 2.3 MiB
  auto refusal = [&] {
    try {
      layer.forward(big, big_y);
    } catch (const longattn::Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string message = refusal();
  CHECK_THAT(message, Catch::Contains("pool 'layer limit'") && Catch::Contains("limit of 2.0 MiB") &&
                          Catch::Contains("raise PoolOptions::limit_bytes"));
  CHECK(refusal() == message);  // again: the same error, no half-made state
  CHECK_THROWS_WITH(layer.backward(big_y, big), Catch::Contains("forward() before backward()"));
  const Tokens x("x", B, 64, E), y("y", B, 64, E), dx("dx", B, 64, E);
  Kokkos::deep_copy(x, 0.25);
  CHECK_NOTHROW(layer.forward(x, y));  // a size that fits
  CHECK_NOTHROW(layer.backward(y, dx));
  CHECK(pool.stats().reserved_bytes <= std::size_t(2) << 20);
}

TEST_CASE("fixed block-sparse layouts are built once per shape and shared by layers", "[core][context]") {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using Tokens = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;
  const auto& layouts = longattn::shared_block_sparse_layouts<Exec>();
  // A radius no other test uses: this test's layouts are new to the shared cache.
  const char* spec = "block_sparse:pattern=local_window;radius=77";
  longattn::MultiheadAttention<Exec, double> first(E, H, layer_options(spec)), second(E, H, layer_options(spec));
  const Tokens x("x", B, N, E), y("y", B, N, E), dx("dx", B, N, E);
  Kokkos::deep_copy(x, 0.5);
  const std::size_t before = layouts->builds();
  for (int step = 0; step < 3; ++step)
    for (auto* layer : {&first, &second}) {
      layer->forward(x, y);
      layer->backward(y, dx);
    }
  CHECK(layouts->builds() == before + 1);  // one shape: one layout, for 6 forward and 6 backward passes
  const Tokens longer("x", B, N + 64, E), longer_y("y", B, N + 64, E);
  first.forward(longer, longer_y);
  CHECK(layouts->builds() == before + 2);  // a new shape: built once more

  longattn::BlockSparseLayoutCache<Exec> small(1);
  longattn::BlockSparseConfig window;
  window.radius = 64;
  longattn::BlockSparseShape shape;
  shape.queries = shape.keys = 256;
  const auto a = small.get(Exec(), window, shape, true);
  CHECK(small.get(Exec(), window, shape, true).kept_blocks() == a.kept_blocks());
  CHECK(small.builds() == 1);
  small.get(Exec(), window, shape, false);  // capacity 1: the causal layout goes
  small.get(Exec(), window, shape, true);
  CHECK(small.builds() == 3);
  CHECK(small.size() == 1);
  CHECK_THROWS_WITH(longattn::BlockSparseLayoutCache<Exec>(0), Catch::Contains("'capacity' is 0"));
}
