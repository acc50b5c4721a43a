// PooledView: a View over a pool block, returned when the last copy goes (even after every Pool
// handle is gone); kernels run on it like on any View; the default pools.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "execution_spaces.hpp"
#include "longattn/memory/pooled_view.hpp"

namespace {
using longattn::memory::Pool;
using longattn::memory::PooledView;

// Whether `P` (a PooledView, an lvalue reference to one or a temporary) hands out its view.
template <class P, class = void>
struct gives_view : std::false_type {};
template <class P>
struct gives_view<P, std::void_t<decltype(std::declval<P>().view())>> : std::true_type {};
template <class P, class View, class = void>
struct converts_to_view : std::false_type {};
template <class P, class View>
struct converts_to_view<P, View, std::void_t<decltype(static_cast<const View&>(std::declval<P>()))>> : std::true_type {};

using HostVector = Kokkos::View<float*, Kokkos::HostSpace>;
// A temporary's view would dangle at the end of the statement: refused at compile time.
static_assert(gives_view<PooledView<HostVector>&>::value && gives_view<const PooledView<HostVector>&>::value,
              "a PooledView that lives on gives its view");
static_assert(!gives_view<PooledView<HostVector>>::value && !gives_view<PooledView<HostVector>&&>::value,
              "a temporary PooledView gives no view");
static_assert(converts_to_view<PooledView<HostVector>&, HostVector>::value &&
                  !converts_to_view<PooledView<HostVector>, HostVector>::value,
              "only a PooledView that lives on converts to its view");
}  // namespace

TEMPLATE_LIST_TEST_CASE("a PooledView holds its block until its last copy goes", "[memory][pooled_view]",
                        longattn::test::ExecutionSpaces) {
  using Exec = TestType;
  using Space = typename Exec::memory_space;
  using Matrix = Kokkos::View<double**, Kokkos::LayoutRight, Space>;
  const Pool<Space> pool;
  {
    const PooledView<Matrix> a(pool, 37, 11);
    CHECK(a.extent(0) == 37);
    CHECK(a.extent(1) == 11);
    CHECK(a.bytes() == 37 * 11 * sizeof(double));
    CHECK(pool.stats().in_use_bytes == longattn::memory::block_bytes(a.bytes()));
    CHECK(pool.block_size(a.data()) == longattn::memory::block_bytes(a.bytes()));
    const Matrix view = a;  // converts: the kernel sees an ordinary View
    Kokkos::parallel_for(
        Kokkos::RangePolicy<Exec>(0, 37), KOKKOS_LAMBDA(int i) {
          for (int j = 0; j < 11; ++j) view(i, j) = i * 100 + j;
        });
    double sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::RangePolicy<Exec>(0, 37),
        KOKKOS_LAMBDA(int i, double& s) {
          for (int j = 0; j < 11; ++j) s += view(i, j);
        },
        sum);
    CHECK(sum == 11 * 100 * (36 * 37 / 2) + 37 * (10 * 11 / 2));
    {
      const PooledView<Matrix> copy = a;  // shares the block
      CHECK(copy.data() == a.data());
    }
    CHECK(pool.stats().in_use_bytes > 0);  // a still holds it
  }
  CHECK(pool.stats().in_use_bytes == 0);

  const PooledView<Kokkos::View<float*, Space>> empty(pool, 0);
  CHECK(empty.data() == nullptr);
  CHECK(empty.size() == 0);
  CHECK(pool.stats().allocations == 1);  // nothing allocated for zero elements
}

TEST_CASE("a copied PooledView keeps the memory after the one it was copied from is gone", "[memory][pooled_view]") {
  const Pool<Kokkos::HostSpace> pool;
  using Vector = Kokkos::View<double*, Kokkos::HostSpace>;
  std::optional<PooledView<Vector>> owner(std::in_place, pool, 4096);
  for (int i = 0; i < 4096; ++i) owner->view()(i) = 0.5 * i;
  const PooledView<Vector> copy = *owner;
  const std::size_t held = pool.stats().in_use_bytes;
  owner.reset();  // the first owner goes
  CHECK(pool.stats().in_use_bytes == held);  // the block is not back in the pool
  // The pool lends that memory to no one else: a new block of the same size lies elsewhere.
  const PooledView<Vector> other(pool, 4096);
  CHECK(other.data() != copy.data());
  for (int i = 0; i < 4096; ++i) other.view()(i) = -1;
  bool intact = true;
  for (int i = 0; i < 4096; ++i) intact = intact && copy.view()(i) == 0.5 * i;
  CHECK(intact);
}

TEST_CASE("a PooledView outlives every handle of its pool", "[memory][pooled_view]") {
  PooledView<Kokkos::View<int*, Kokkos::HostSpace>> survivor;
  std::vector<std::string> warnings;
  const auto previous = longattn::memory::set_warning_handler([&](const std::string& m) { warnings.push_back(m); });
  {
    const Pool<Kokkos::HostSpace> pool;
    survivor = PooledView<Kokkos::View<int*, Kokkos::HostSpace>>(pool, 1000);
  }
  for (int i = 0; i < 1000; ++i) survivor.view()(i) = i;  // the block is still valid
  CHECK(survivor.view()(999) == 999);
  survivor = {};  // the pool goes with its last block, having nothing left lent: no warning
  longattn::memory::set_warning_handler(previous);
  CHECK(warnings.empty());
}

TEST_CASE("a pool destroyed with blocks still lent says so", "[memory][pooled_view]") {
  std::vector<std::string> warnings;
  const auto previous = longattn::memory::set_warning_handler([&](const std::string& m) { warnings.push_back(m); });
  {
    longattn::memory::PoolOptions options;
    options.label = "leaky";
    const Pool<Kokkos::HostSpace> pool(options);
    (void)pool.allocate(4096);
  }
  longattn::memory::set_warning_handler(previous);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("memory pool 'leaky' destroyed while 4.0 KiB of its blocks were still lent"));
}

TEMPLATE_LIST_TEST_CASE("the default pool of a memory space is one pool", "[memory][pooled_view]",
                        longattn::test::ExecutionSpaces) {
  using Space = typename TestType::memory_space;
  auto& pool = longattn::memory::default_pool<Space>();
  CHECK(&pool == &longattn::memory::default_pool<Space>());
  CHECK_THAT(pool.label(), Catch::Contains("longattn::default_pool<"));
  const std::size_t before = pool.stats().in_use_bytes;
  {
    const PooledView<Kokkos::View<float***, Space>> t(pool, 3, 5, 7);
    CHECK(pool.stats().in_use_bytes == before + longattn::memory::block_bytes(3 * 5 * 7 * sizeof(float)));
  }
  CHECK(pool.stats().in_use_bytes == before);
}

TEMPLATE_LIST_TEST_CASE("a pool counts PooledViews by the category current when each was made", "[memory][pooled_view]",
                        longattn::test::ExecutionSpaces) {
  using Space = typename TestType::memory_space;
  using longattn::memory::Category;
  using longattn::memory::CategoryScope;
  using longattn::memory::block_bytes;
  using Vector = Kokkos::View<float*, Space>;
  const Pool<Space> pool;
  auto in_use = [&](Category c) { return pool.category_stats()[std::size_t(c)].in_use_bytes; };
  auto high = [&](Category c) { return pool.category_stats()[std::size_t(c)].in_use_high_water_bytes; };
  const std::size_t small = block_bytes(100 * sizeof(float)), large = block_bytes(300000 * sizeof(float));
  CHECK(longattn::memory::current_category() == Category::other);
  const PooledView<Vector> outside(pool, 100);
  std::optional<PooledView<Vector>> kept, copy;
  {
    const CategoryScope activations(Category::activations);
    kept.emplace(pool, 300000);
    {
      const CategoryScope inner(Category::transient_copies);  // innermost wins
      CHECK(longattn::memory::current_category() == Category::transient_copies);
      copy.emplace(pool, 100);
      const PooledView<Vector> gone(pool, 300000);
      CHECK(in_use(Category::transient_copies) == small + large);
    }
    CHECK(longattn::memory::current_category() == Category::activations);
  }
  CHECK(longattn::memory::current_category() == Category::other);
  CHECK(in_use(Category::other) == small);
  CHECK(in_use(Category::activations) == large);
  CHECK(in_use(Category::transient_copies) == small);  // `gone` went back under its own category
  CHECK(high(Category::transient_copies) == small + large);
  CHECK(in_use(Category::parameters) == 0);
  // The peak of all categories together was with `gone` alive: every category's bytes then.
  auto at_peak = [&](Category c) { return pool.category_stats()[std::size_t(c)].at_peak_bytes; };
  CHECK(at_peak(Category::other) == small);
  CHECK(at_peak(Category::activations) == large);
  CHECK(at_peak(Category::transient_copies) == small + large);
  {
    const CategoryScope later(Category::parameters);  // a block counts where it was made, not where it goes
    kept.reset();
  }
  CHECK(in_use(Category::activations) == 0);
  CHECK(in_use(Category::parameters) == 0);
  CHECK(high(Category::activations) == large);
  std::size_t total = 0;
  for (const auto& c : pool.category_stats()) total += c.in_use_bytes;
  CHECK(total == pool.stats().in_use_bytes);
  pool.reset_high_water();  // the categories' marks start again from what they hold
  CHECK(high(Category::activations) == 0);
  CHECK(high(Category::transient_copies) == small);
  CHECK(at_peak(Category::transient_copies) == small);
  CHECK(at_peak(Category::activations) == 0);
  {
    const CategoryScope later(Category::workspaces);  // a new peak: the snapshot moves with it
    const PooledView<Vector> workspace(pool, 300000);
    CHECK(at_peak(Category::workspaces) == large);
    CHECK(at_peak(Category::other) == small);
  }
  CHECK(at_peak(Category::workspaces) == large);  // the mark stays after the block goes
  CHECK(std::string(longattn::memory::to_string(Category::optimizer_states)) == "optimizer states");
}
