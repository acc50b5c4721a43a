// Communicator under mpiexec with 1 to 4 ranks: every collective against the serial computation
// of the same result (odd sizes, every element type and operation), real and simulated nodes
// (2 x 2 for the hierarchical path, uneven nodes for its fallback), sub-communicators and the
// data x context grid, point-to-point, Views, and bad input. Values are multiples of 1/4, so
// every sum is exact (also in bfloat16 and float16, whose sums are MPI operations of longattn's
// own) and results are compared exactly.
#include <mpi.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "execution_spaces.hpp"
#include "longattn/error.hpp"
#include "longattn/parallel/communicator.hpp"
#include "mpi_test_support.hpp"
#include "reference/random.hpp"

namespace {

using longattn::parallel::Communicator;
using longattn::parallel::CommunicatorOptions;
using longattn::parallel::DataType;
using longattn::parallel::ReduceOp;
using longattn::parallel::data_type_of;

// One seed for every rank (rank 0's), so each rank knows what every other rank contributes.
using longattn::test::shared_seed;
using longattn::test::throwing_options;

// What rank `rank` contributes at element i: a multiple of 1/4 in [-8, 8].
template <class T>
T value(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = (seed ^ (std::uint64_t(rank) * 0x9e3779b97f4a7c15ull)) + i * 0xbf58476d1ce4e5b9ull;
  const auto q = std::int64_t((h ^ (h >> 29)) % 65) - 32;
  if constexpr (std::is_integral_v<T>) return T(q);
  else if constexpr (longattn::is_half_v<T>) return T(float(q) / 4.0f);
  else return T(q) / T(4);
}

template <class T>
std::vector<T> contribution(std::uint64_t seed, int rank, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value<T>(seed, rank, i);
  return v;
}

// The serial result of `op` over the contributions of `members` (ranks of the world).
template <class T>
std::vector<T> serial(std::uint64_t seed, const std::vector<int>& members, std::size_t count, ReduceOp op) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = value<T>(seed, members[0], i);
    for (std::size_t m = 1; m < members.size(); ++m) {
      const T x = value<T>(seed, members[m], i);
      acc = op == ReduceOp::max ? std::max(acc, x) : op == ReduceOp::min ? std::min(acc, x) : T(acc + x);
    }
    using Wide = longattn::accumulate_t<T>;  // the average's scaling: in float for 16-bit T, then rounded
    if (op == ReduceOp::average) acc = T(Wide(acc) * (Wide(1) / Wide(members.size())));
    out[i] = acc;
  }
  return out;
}

std::vector<int> all_ranks(int size) {
  std::vector<int> r(static_cast<std::size_t>(size));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

template <class T>
void check_all_reduce(const Communicator& comm, std::uint64_t seed, const std::vector<int>& members, bool hierarchical) {
  const std::vector<ReduceOp> ops = std::is_integral_v<T>
                                        ? std::vector<ReduceOp>{ReduceOp::sum, ReduceOp::max, ReduceOp::min}
                                        : std::vector<ReduceOp>{ReduceOp::sum, ReduceOp::average, ReduceOp::max, ReduceOp::min};
  const int me = members[std::size_t(comm.rank())];
  for (const std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(65537)})
    for (const ReduceOp op : ops)
      for (const bool in_place : {true, false}) {
        INFO("count " << count << ", op " << to_string(op) << ", in place " << in_place << ", type "
                      << to_string(data_type_of<T>()) << ", hierarchical " << hierarchical);
        std::vector<T> send = contribution<T>(seed, me, count), recv(count, T(-99.0f));
        T* out = in_place ? send.data() : recv.data();
        if (hierarchical) comm.hierarchical_all_reduce(send.data(), out, count, data_type_of<T>(), op);
        else comm.all_reduce(send.data(), out, count, data_type_of<T>(), op);
        const std::vector<T> expected = serial<T>(seed, members, count, op);
        CHECK(std::equal(expected.begin(), expected.end(), out));
      }
}

}  // namespace

TEST_CASE("a communicator knows its ranks and nodes", "[parallel][communicator]") {
  const Communicator world = Communicator::world();
  CHECK(world.rank() == world_rank());
  CHECK(world.size() == world_size());
  CHECK(world.nodes() >= 1);
  CHECK(world.local_rank() < world.local_size());
  CHECK(world.node() < world.nodes());

  for (const int per_node : {1, 2, 3}) {
    INFO(per_node << " ranks per simulated node");
    const Communicator sim = Communicator::world(throwing_options(per_node));
    const int size = world_size(), rank = world_rank();
    CHECK(sim.nodes() == (size + per_node - 1) / per_node);
    CHECK(sim.node() == rank / per_node);
    CHECK(sim.local_rank() == rank % per_node);
    CHECK(sim.local_size() == std::min(per_node, size - rank / per_node * per_node));
    CHECK(sim.uniform_nodes() == (size % per_node == 0 || size < per_node));
  }
}

TEST_CASE("LONGATTN_RANKS_PER_NODE simulates nodes, and a bad value is refused", "[parallel][communicator]") {
  setenv("LONGATTN_RANKS_PER_NODE", "2", 1);
  const Communicator sim = Communicator::world(throwing_options());
  CHECK(sim.local_rank() == world_rank() % 2);
  setenv("LONGATTN_RANKS_PER_NODE", "two", 1);
  CHECK_THROWS_WITH(Communicator::world(throwing_options()),
                    Catch::Contains("'LONGATTN_RANKS_PER_NODE' is \"two\"") && Catch::Contains("positive number"));
  unsetenv("LONGATTN_RANKS_PER_NODE");
}

TEMPLATE_TEST_CASE("all_reduce equals the serial reduction", "[parallel][collectives]", float, double, std::int32_t,
                   std::int64_t, longattn::bfloat16, longattn::float16) {
  const std::uint64_t seed = shared_seed();
  INFO("seed " << seed);
  check_all_reduce<TestType>(Communicator::world(throwing_options()), seed, all_ranks(world_size()), false);
}

TEMPLATE_TEST_CASE("the hierarchical all-reduce equals the serial reduction on real and simulated nodes",
                   "[parallel][collectives][hierarchical]", float, double, longattn::bfloat16) {
  const std::uint64_t seed = shared_seed();
  INFO("seed " << seed);
  for (const int per_node : {0, 1, 2, 3}) {  // 0: this machine's node; 2 at 4 ranks: 2 nodes x 2
    INFO(per_node << " ranks per node");
    check_all_reduce<TestType>(Communicator::world(throwing_options(per_node)), seed, all_ranks(world_size()), true);
  }
}

TEST_CASE("nonblocking all-reduces, flat and hierarchical, several in flight", "[parallel][collectives]") {
  const std::uint64_t seed = shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options(2));
  const std::vector<int> members = all_ranks(world_size());
  std::vector<std::vector<float>> data;
  std::vector<longattn::parallel::Request> requests;
  const std::size_t counts[] = {5, 4097, 33, 100000};
  for (int i = 0; i < 4; ++i) data.push_back(contribution<float>(seed + std::uint64_t(i), comm.rank(), counts[i]));
  for (int i = 0; i < 4; ++i)
    requests.push_back(comm.iall_reduce(data[std::size_t(i)].data(), data[std::size_t(i)].data(), counts[i],
                                        DataType::float32, i % 2 ? ReduceOp::average : ReduceOp::sum, i >= 2));
  while (!requests[1].test()) {
  }
  for (auto& r : requests) r.wait();
  for (int i = 0; i < 4; ++i) {
    INFO("operation " << i);
    const auto expected = serial<float>(seed + std::uint64_t(i), members, counts[i], i % 2 ? ReduceOp::average : ReduceOp::sum);
    CHECK(data[std::size_t(i)] == expected);
  }
}

TEST_CASE("reduce_scatter, all_gather, broadcast and barrier", "[parallel][collectives]") {
  const std::uint64_t seed = shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options());
  const int P = comm.size(), me = comm.rank();
  const std::size_t block = 777;
  const std::vector<double> send = contribution<double>(seed, me, block * std::size_t(P));
  std::vector<double> mine(block);
  comm.reduce_scatter(send.data(), mine.data(), block, DataType::float64, ReduceOp::average);
  const auto total = serial<double>(seed, all_ranks(P), block * std::size_t(P), ReduceOp::average);
  CHECK(std::equal(mine.begin(), mine.end(), total.begin() + std::ptrdiff_t(block) * me));
  // 16 bits: bfloat16 sums (exact for these values), float16 blocks gathered.
  const auto send16 = contribution<longattn::bfloat16>(seed, me, block * std::size_t(P));
  std::vector<longattn::bfloat16> mine16(block);
  comm.reduce_scatter(send16.data(), mine16.data(), block, DataType::bfloat16, ReduceOp::sum);
  const auto total16 = serial<longattn::bfloat16>(seed, all_ranks(P), block * std::size_t(P), ReduceOp::sum);
  CHECK(std::equal(mine16.begin(), mine16.end(), total16.begin() + std::ptrdiff_t(block) * me));
  const auto half_piece = contribution<longattn::float16>(seed, me, 7);
  std::vector<longattn::float16> half_gathered(7 * std::size_t(P));
  comm.all_gather(half_piece.data(), half_gathered.data(), 7, DataType::float16);
  for (int r = 0; r < P; ++r) {
    const auto theirs = contribution<longattn::float16>(seed, r, 7);
    CHECK(std::equal(theirs.begin(), theirs.end(), half_gathered.begin() + 7 * r));
  }

  const std::vector<std::int64_t> piece = contribution<std::int64_t>(seed, me, 13);
  std::vector<std::int64_t> gathered(13 * std::size_t(P));
  comm.all_gather(piece.data(), gathered.data(), 13, DataType::int64);
  for (int r = 0; r < P; ++r) {
    const auto theirs = contribution<std::int64_t>(seed, r, 13);
    CHECK(std::equal(theirs.begin(), theirs.end(), gathered.begin() + 13 * r));
  }

  std::vector<float> message = me == P - 1 ? contribution<float>(seed, 99, 31) : std::vector<float>(31, 0.0f);
  comm.broadcast(message.data(), message.size(), DataType::float32, P - 1);
  CHECK(message == contribution<float>(seed, 99, 31));
  comm.barrier();
}

TEST_CASE("isend and irecv pass a message around the ring", "[parallel][point_to_point]") {
  const std::uint64_t seed = shared_seed();
  const Communicator comm = Communicator::world(throwing_options());
  const int P = comm.size(), me = comm.rank();
  const std::vector<float> out = contribution<float>(seed, me, 10007);
  std::vector<float> in(10007, -1.0f);
  auto receive = comm.irecv(in.data(), in.size(), DataType::float32, (me + P - 1) % P, 7);
  auto send = comm.isend(out.data(), out.size(), DataType::float32, (me + 1) % P, 7);
  receive.wait();
  send.wait();
  CHECK(in == contribution<float>(seed, (me + P - 1) % P, 10007));
}

TEST_CASE("exchanges pair messages by order; serialized, each waits for the one before",
          "[parallel][point_to_point]") {
  const std::uint64_t seed = shared_seed();
  for (const bool serialized : {false, true}) {
    auto options = throwing_options();
    options.serialize_exchanges = serialized;
    const Communicator comm = Communicator::world(options);
    const int P = comm.size(), me = comm.rank(), next = (me + 1) % P, previous = (me + P - 1) % P;
    INFO("serialized " << serialized);
    // Two messages to the next rank in one exchange, of different lengths: they pair in order.
    const std::vector<float> first = contribution<float>(seed, me, 1000), second = contribution<float>(seed, me + P, 3);
    std::vector<float> first_in(1000, -1.0f), second_in(3, -1.0f);
    using longattn::parallel::Transfer;
    longattn::parallel::Request a = comm.exchange(
        {Transfer::send(first.data(), first.size(), DataType::float32, next),
         Transfer::send(second.data(), second.size(), DataType::float32, next),
         Transfer::receive(first_in.data(), first_in.size(), DataType::float32, previous),
         Transfer::receive(second_in.data(), second_in.size(), DataType::float32, previous)});
    std::vector<float> back(3, -1.0f);
    longattn::parallel::Request b = comm.exchange({Transfer::send(second.data(), 3, DataType::float32, previous),
                                                   Transfer::receive(back.data(), 3, DataType::float32, next)});
    if (serialized) CHECK(a.test());  // b started only once a was complete
    a.wait();
    b.wait();
    CHECK(first_in == contribution<float>(seed, previous, 1000));
    CHECK(second_in == contribution<float>(seed, previous + P, 3));
    CHECK(back == contribution<float>(seed, next + P, 3));
  }
}

TEST_CASE("sub-communicators and the data x context grid reduce over their own ranks", "[parallel][communicator]") {
  const std::uint64_t seed = shared_seed();
  INFO("seed " << seed);
  const Communicator world = Communicator::world(throwing_options(2));
  const int P = world.size(), me = world.rank();

  const Communicator halves = world.split(me % 2, -me);  // key reverses the order
  std::vector<int> members;
  for (int r = P - 1; r >= 0; --r)
    if (r % 2 == me % 2) members.push_back(r);
  REQUIRE(halves.size() == int(members.size()));
  CHECK(members[std::size_t(halves.rank())] == me);
  check_all_reduce<float>(halves, seed, members, true);

  for (int cp = 1; cp <= P; ++cp) {
    if (P % cp != 0) {
      CHECK_THROWS_WITH(longattn::parallel::make_grid(world, cp),
                        Catch::Contains("argument 'context_parallel' is " + std::to_string(cp)) &&
                            Catch::Contains("a divisor of the " + std::to_string(P) + " ranks"));
      continue;
    }
    INFO("context parallel " << cp);
    const auto grid = longattn::parallel::make_grid(world, cp);
    CHECK(grid.context.size() == cp);
    CHECK(grid.data.size() == P / cp);
    CHECK(grid.context.rank() == me % cp);
    CHECK(grid.data.rank() == me / cp);
    std::vector<int> context_members, data_members;
    for (int c = 0; c < cp; ++c) context_members.push_back(me / cp * cp + c);
    for (int d = 0; d < P / cp; ++d) data_members.push_back(d * cp + me % cp);
    check_all_reduce<double>(grid.context, seed, context_members, false);
    check_all_reduce<float>(grid.data, seed, data_members, true);
  }
}

TEMPLATE_LIST_TEST_CASE("Views are reduced in place", "[parallel][collectives]", longattn::test::MpiTestSpaces) {
  using Exec = TestType;
  const std::uint64_t seed = shared_seed();
  const Communicator comm = Communicator::world(throwing_options(2));
  Kokkos::View<float*, typename Exec::memory_space> data("data", 999);
  const auto host = Kokkos::create_mirror_view(data);
  const auto mine = contribution<float>(seed, comm.rank(), 999);
  std::copy(mine.begin(), mine.end(), host.data());
  Kokkos::deep_copy(data, host);
  comm.hierarchical_all_reduce(Exec(), data, ReduceOp::average);
  Kokkos::deep_copy(host, data);
  const auto expected = serial<float>(seed, all_ranks(comm.size()), 999, ReduceOp::average);
  CHECK(std::equal(expected.begin(), expected.end(), host.data()));

  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> matrix("matrix", 4, 6);
  const auto strided = Kokkos::subview(matrix, Kokkos::ALL, 2);
  CHECK_THROWS_WITH(comm.all_reduce(Exec(), strided, ReduceOp::sum), Catch::Contains("expected a contiguous View"));
}

namespace {

template <class T, class Exec>
Kokkos::View<T*, typename Exec::memory_space> in_space(const std::vector<T>& values) {
  Kokkos::View<T*, typename Exec::memory_space> v("values", values.size());
  Kokkos::deep_copy(v, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()));
  return v;
}

template <class View>
std::vector<typename View::non_const_value_type> on_host(const View& v) {
  std::vector<typename View::non_const_value_type> values(v.size());
  Kokkos::deep_copy(Kokkos::View<typename View::non_const_value_type*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                        values.data(), values.size()),
                    v);
  return values;
}

template <class T, class Exec>
void check_staged_calls(const Communicator& comm, std::uint64_t seed, std::size_t largest) {
  const Exec exec;
  const int P = comm.size(), me = comm.rank();
  const DataType type = data_type_of<T>();
  for (const std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(1001), std::size_t(65537)}) {
    if (count > largest) break;
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average, ReduceOp::max})
      for (const bool hierarchical : {false, true}) {
        INFO("all_reduce of " << count << ", op " << to_string(op) << ", hierarchical " << hierarchical);
        auto data = in_space<T, Exec>(contribution<T>(seed, me, count));
        if (hierarchical) comm.hierarchical_all_reduce(exec, data, op);
        else comm.all_reduce(exec, data, op);
        CHECK(on_host(data) == serial<T>(seed, all_ranks(P), count, op));
      }
    INFO("count " << count);
    // Two nonblocking all-reduces in flight, then a reduce-scatter in flight.
    auto a = in_space<T, Exec>(contribution<T>(seed, me, count)), b = in_space<T, Exec>(contribution<T>(seed, me + P, count));
    auto r1 = comm.iall_reduce(exec, a.data(), a.data(), count, type, ReduceOp::sum, false);
    auto r2 = comm.iall_reduce(exec, b.data(), b.data(), count, type, ReduceOp::max, true);
    r2.wait();
    r1.wait();
    std::vector<int> shifted;
    for (int r = 0; r < P; ++r) shifted.push_back(r + P);
    CHECK(on_host(a) == serial<T>(seed, all_ranks(P), count, ReduceOp::sum));
    CHECK(on_host(b) == serial<T>(seed, shifted, count, ReduceOp::max));

    auto blocks = in_space<T, Exec>(contribution<T>(seed, me, count * std::size_t(P)));
    Kokkos::View<T*, typename Exec::memory_space> mine("mine", count), gathered("gathered", count * std::size_t(P));
    auto scattering = comm.ireduce_scatter(exec, blocks.data(), mine.data(), count, type, ReduceOp::sum);
    scattering.wait();
    const auto sums = serial<T>(seed, all_ranks(P), count * std::size_t(P), ReduceOp::sum);
    CHECK(on_host(mine) == std::vector<T>(sums.begin() + std::ptrdiff_t(count) * me, sums.begin() + std::ptrdiff_t(count) * (me + 1)));
    Kokkos::deep_copy(mine, T(0.0f));
    comm.reduce_scatter(exec, blocks.data(), mine.data(), count, type, ReduceOp::sum);
    CHECK(on_host(mine) == std::vector<T>(sums.begin() + std::ptrdiff_t(count) * me, sums.begin() + std::ptrdiff_t(count) * (me + 1)));
    comm.all_gather(exec, mine.data(), gathered.data(), count, type);
    CHECK(on_host(gathered) == sums);

    // An exchange around the ring: two messages each way of different lengths.
    using longattn::parallel::Transfer;
    const int next = (me + 1) % P, previous = (me + P - 1) % P;
    auto out = in_space<T, Exec>(contribution<T>(seed, me, count + 3));
    Kokkos::View<T*, typename Exec::memory_space> from_previous("from_previous", count), tail("tail", 3);
    auto exchanged = comm.exchange(exec, {Transfer::send(out.data(), count, type, next),
                                          Transfer::send(out.data() + count, 3, type, next),
                                          Transfer::receive(from_previous.data(), count, type, previous),
                                          Transfer::receive(tail.data(), 3, type, previous)});
    exchanged.wait();
    const auto sent = contribution<T>(seed, previous, count + 3);
    CHECK(on_host(from_previous) == std::vector<T>(sent.begin(), sent.begin() + std::ptrdiff_t(count)));
    CHECK(on_host(tail) == std::vector<T>(sent.begin() + std::ptrdiff_t(count), sent.end()));
  }
}

}  // namespace

// The staged transport (device memory to host copies, MPI, back) on every space the tests run:
// on the host it runs the same staging code, in pieces of a few bytes to more than a message.
TEMPLATE_LIST_TEST_CASE("the staged transport equals the serial results, in pieces of any size",
                        "[parallel][collectives][staged]", longattn::test::MpiTestSpaces) {
  using Exec = TestType;
  const std::uint64_t seed = shared_seed();
  INFO("seed " << seed);
  for (const std::size_t chunk : {std::size_t(2), std::size_t(6), std::size_t(4096), std::size_t(1) << 22}) {
    const std::size_t largest = chunk < 4096 ? 1001 : 65537;  // pieces of a few bytes: a few thousand
    INFO("pieces of " << chunk << " bytes");
    auto options = throwing_options(2);
    options.transport = longattn::parallel::Transport::staged;
    options.staging_chunk_bytes = chunk;
    const Communicator comm = Communicator::world(options);
    CHECK(comm.transport(Exec()) == longattn::parallel::Transport::staged);
    check_staged_calls<float, Exec>(comm, seed, largest);
    check_staged_calls<longattn::bfloat16, Exec>(comm, seed, largest);
  }
}

TEMPLATE_LIST_TEST_CASE("the transport is chosen by the options, LONGATTN_TRANSPORT, and the memory",
                        "[parallel][communicator]", longattn::test::MpiTestSpaces) {
  using Exec = TestType;
  using longattn::parallel::Transport;
  constexpr bool device = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  const char* set = std::getenv("LONGATTN_TRANSPORT");  // ctest's *_staged runs set it
  const std::string outside = set ? set : "";
  unsetenv("LONGATTN_TRANSPORT");
  const Communicator automatic = Communicator::world(throwing_options());
  const Transport chosen = automatic.transport(Exec());
  CHECK(chosen != Transport::automatic);
  if (!device) CHECK(chosen == Transport::mpi);
  if (device && !LONGATTN_HAVE_NCCL) CHECK(chosen != Transport::nccl);

  setenv("LONGATTN_TRANSPORT", "staged", 1);
  CHECK(Communicator::world(throwing_options()).transport(Exec()) == Transport::staged);
  auto mpi = throwing_options();
  mpi.transport = Transport::mpi;  // the options win over the environment
  const Communicator forced = Communicator::world(mpi);
  if (!device) CHECK(forced.transport(Exec()) == Transport::mpi);
  setenv("LONGATTN_TRANSPORT", "carrier pigeon", 1);
  CHECK_THROWS_WITH(Communicator::world(throwing_options()),
                    Catch::Contains("'LONGATTN_TRANSPORT' is \"carrier pigeon\"") &&
                        Catch::Contains("automatic, mpi, staged or nccl"));
  if (outside.empty()) unsetenv("LONGATTN_TRANSPORT");
  else setenv("LONGATTN_TRANSPORT", outside.c_str(), 1);
  if (!LONGATTN_HAVE_NCCL) {
    auto nccl = throwing_options();
    nccl.transport = Transport::nccl;
    CHECK_THROWS_WITH(Communicator::world(nccl), Catch::Contains("'transport' is nccl") && Catch::Contains("no NCCL"));
  }
  setenv("LONGATTN_STAGING_CHUNK_BYTES", "-4", 1);
  CHECK_THROWS_WITH(Communicator::world(throwing_options()),
                    Catch::Contains("'LONGATTN_STAGING_CHUNK_BYTES' is \"-4\"") && Catch::Contains("positive number of bytes"));
  unsetenv("LONGATTN_STAGING_CHUNK_BYTES");
}

// Two communicators of the same ranks, a nonblocking all-reduce on each: MPI completes them in
// either order, NCCL could deadlock when ranks issue them in different orders.
TEST_CASE("check_issue_order passes one order on every rank and names the first difference of a planted one",
          "[parallel][communicator][issue_order]") {
  if (!longattn::test::several_ranks()) return;
  auto options = throwing_options();
  options.record_issue_order = true;
  const Communicator a = Communicator::world(options), b = a.split(0, a.rank());
  std::vector<float> x(100, 1.0f), y(100, 2.0f);
  for (const bool planted : {false, true}) {
    INFO("planted " << planted);
    const bool swap = planted && a.rank() == 1;  // rank 1 issues b's before a's
    const Communicator& first = swap ? b : a;
    const Communicator& second = swap ? a : b;
    auto r1 = first.iall_reduce(x.data(), x.data(), x.size(), DataType::float32, ReduceOp::max);
    auto r2 = second.iall_reduce(y.data(), y.data(), y.size(), DataType::float32, ReduceOp::max);
    r1.wait();
    r2.wait();
    if (!planted) {
      CHECK_NOTHROW(a.check_issue_order());
      continue;
    }
    CHECK_THROWS_WITH(a.check_issue_order(),
                      Catch::Contains("issued iall_reduce #") && Catch::Contains("where rank") &&
                          Catch::Contains("(operation 1 on the communicators both use)") &&
                          Catch::Contains("must issue the operations on the communicators they share in the same order"));
  }
  CHECK_NOTHROW(a.check_issue_order());  // the logs started afresh
}

TEST_CASE("bad arguments are longattn::Errors when every rank makes the same call", "[parallel][errors]") {
  const Communicator comm = Communicator::world(throwing_options());
  float x[4] = {};
  std::int32_t n[4] = {};
  CHECK_THROWS_WITH(comm.all_reduce(nullptr, x, 4, DataType::float32, ReduceOp::sum),
                    Catch::Contains("all_reduce: argument 'send' is nullptr, expected a buffer of 4 elements"));
  CHECK_THROWS_WITH(comm.all_reduce(n, n, 4, DataType::int32, ReduceOp::average),
                    Catch::Contains("argument 'op' is average of int32"));
  CHECK_THROWS_WITH(comm.broadcast(x, 4, DataType::float32, comm.size()),
                    Catch::Contains("argument 'root' is " + std::to_string(comm.size())));
  CHECK_THROWS_WITH(comm.isend(x, 4, DataType::float32, -1, 0), Catch::Contains("argument 'destination' is -1"));
  CHECK_THROWS_WITH(comm.irecv(x, 4, DataType::float32, 0, 40000), Catch::Contains("argument 'tag' is 40000"));
  CHECK_THROWS_WITH(comm.reduce_scatter(x, x, 1, DataType::float32, ReduceOp::sum),
                    Catch::Contains("argument 'recv' is the send buffer"));
  CHECK_THROWS_WITH(comm.split(-3, 0), Catch::Contains("argument 'color' is -3"));
  CommunicatorOptions bad;
  bad.ranks_per_node = -1;
  CHECK_THROWS_WITH(Communicator::world(bad), Catch::Contains("argument 'options.ranks_per_node' is -1"));
  CHECK_THROWS_WITH(Communicator::from_mpi(MPI_COMM_NULL), Catch::Contains("argument 'comm' is MPI_COMM_NULL"));
}

TEST_CASE("with verify_collectives, counts that differ between ranks are an error on every rank",
          "[parallel][errors]") {
  CommunicatorOptions options = throwing_options();
  options.verify_collectives = true;
  const Communicator comm = Communicator::world(options);
  std::vector<float> data(8, 1.0f);
  if (comm.size() > 1) {
    const std::size_t count = 4 + std::size_t(comm.rank() % 2);  // ranks disagree
    CHECK_THROWS_WITH(comm.all_reduce(data.data(), data.data(), count, DataType::float32, ReduceOp::sum),
                      Catch::Contains("argument 'count' differs between ranks (from 4 to 5)"));
    CHECK_THROWS_WITH(comm.all_reduce(data.data(), data.data(), 4, DataType::float32,
                                      comm.rank() == 0 ? ReduceOp::sum : ReduceOp::max),
                      Catch::Contains("argument 'op' differs between ranks"));
  }
  comm.all_reduce(data.data(), data.data(), 8, DataType::float32, ReduceOp::sum);  // agreeing ranks pass
  CHECK(data[7] == float(comm.size()));
}
