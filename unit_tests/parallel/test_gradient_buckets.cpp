// GradientBuckets under mpiexec: 200 small gradients of odd sizes (float and double) and one
// larger than a bucket, marked ready in backward order; buckets start before wait(), results
// equal the serial average on flat and simulated-node communicators, over several steps;
// gradients packed, stored in their buckets and back to back in the caller's memory (reduced
// there, no buffer); the same in the memory of the host's default space and the GPU's (NCCL on
// CUDA memory); float gradients reduced in bfloat16 and float16.
#include <mpi.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "longattn/error.hpp"
#include "longattn/parallel/gradient_buckets.hpp"
#include "execution_spaces.hpp"
#include "mpi_test_support.hpp"
#include "reference/random.hpp"

namespace {

using longattn::parallel::Communicator;
using longattn::parallel::GradientBucketOptions;
using longattn::parallel::GradientBuckets;

using longattn::test::exact_contribution;
using longattn::test::throwing_options;

}  // namespace

TEST_CASE("bucketed gradients are averaged over the ranks, buckets starting during backward", "[parallel][buckets]") {
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  for (const int per_node : {0, 2}) {
    for (const bool hierarchical : {false, true}) {
      INFO(per_node << " ranks per node, hierarchical " << hierarchical);
      const Communicator comm = Communicator::world(throwing_options(per_node));
      const int P = comm.size();
      // 200 gradients: odd sizes, floats with a few doubles between, and one of 80 KiB.
      std::vector<std::vector<float>> floats;
      std::vector<std::vector<double>> doubles;
      std::vector<std::pair<bool, int>> order;  // (is double, index), registration = backward order
      for (int g = 0; g < 200; ++g) {
        const std::size_t count = g == 100 ? 20000 : std::size_t(1 + (g * 37) % 611);
        if (g % 25 == 24) {
          doubles.emplace_back(count);
          order.emplace_back(true, int(doubles.size()) - 1);
        } else {
          floats.emplace_back(count);
          order.emplace_back(false, int(floats.size()) - 1);
        }
      }
      GradientBucketOptions options;
      options.bucket_bytes = 16 * 1024;
      options.hierarchical = hierarchical;
      GradientBuckets buckets(comm, options);
      for (const auto& [is_double, i] : order)
        if (is_double) buckets.add(doubles[std::size_t(i)].data(), doubles[std::size_t(i)].size());
        else buckets.add(floats[std::size_t(i)].data(), floats[std::size_t(i)].size());

      for (int step = 0; step < 3; ++step) {
        INFO("step " << step);
        for (std::size_t g = 0; g < order.size(); ++g) {
          const auto [is_double, i] = order[g];
          if (is_double)
            for (std::size_t e = 0; e < doubles[std::size_t(i)].size(); ++e)
              doubles[std::size_t(i)][e] = exact_contribution(seed, comm.rank(), step, int(g), e);
          else
            for (std::size_t e = 0; e < floats[std::size_t(i)].size(); ++e)
              floats[std::size_t(i)][e] = float(exact_contribution(seed, comm.rank(), step, int(g), e));
        }
        for (std::size_t g = 0; g < order.size(); ++g) buckets.ready(int(g));  // backward finishes them in order
        CHECK(buckets.buckets_started() == buckets.buckets());  // each started when its last gradient was ready
        buckets.wait();
        CHECK(buckets.buckets_started() == 0);
        bool all_equal = true;
        for (std::size_t g = 0; g < order.size(); ++g) {
          const auto [is_double, i] = order[g];
          const std::size_t count = is_double ? doubles[std::size_t(i)].size() : floats[std::size_t(i)].size();
          for (std::size_t e = 0; e < count; ++e) {
            double sum = 0;
            for (int r = 0; r < P; ++r) sum += exact_contribution(seed, r, step, int(g), e);
            if (is_double) all_equal = all_equal && doubles[std::size_t(i)][e] == sum * (1.0 / P);
            else all_equal = all_equal && floats[std::size_t(i)][e] == float(sum) * (1.0f / float(P));
          }
        }
        CHECK(all_equal);
      }
      CHECK(buckets.gradients() == 200);
      CHECK(buckets.buckets() > 8);    // about 16 KiB each, the doubles apart, the large one alone
      CHECK(buckets.buckets() < 40);
    }
  }
}

TEST_CASE("gradients stored in their buckets are reduced where they are, kept ones beside them",
          "[parallel][buckets]") {
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options(2));
  GradientBucketOptions options;
  options.bucket_bytes = 4096;
  GradientBuckets buckets(comm, options);
  std::vector<Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>> stored;
  std::vector<std::vector<double>> kept;
  for (int g = 0; g < 30; ++g) {
    if (g % 10 == 9) {
      kept.emplace_back(std::size_t(50 + g));
      buckets.add(kept.back().data(), kept.back().size());
    } else {
      stored.push_back(buckets.add<float>(std::size_t(g == 4 ? 2000 : 7 + 13 * g)));
    }
  }
  // Consecutive stored gradients of one bucket are adjacent: the bucket's buffer is their memory.
  CHECK(stored[1].data() == stored[0].data() + stored[0].size());
  CHECK(stored[4].size() == 2000);  // 8000 bytes: a bucket of its own
  for (int step = 0; step < 2; ++step) {
    int s = 0, k = 0;
    for (int g = 0; g < 30; ++g) {
      if (g % 10 == 9)
        for (std::size_t e = 0; e < kept[std::size_t(k)].size(); ++e) kept[std::size_t(k)][e] = exact_contribution(seed, comm.rank(), step, g, e);
      else
        for (std::size_t e = 0; e < stored[std::size_t(s)].size(); ++e)
          stored[std::size_t(s)](e) = float(exact_contribution(seed, comm.rank(), step, g, e));
      g % 10 == 9 ? ++k : ++s;
    }
    for (int g = 29; g >= 0; --g) buckets.ready(g);  // any order
    buckets.wait();
    bool all_equal = true;
    s = k = 0;
    for (int g = 0; g < 30; ++g) {
      const std::size_t count = g % 10 == 9 ? kept[std::size_t(k)].size() : stored[std::size_t(s)].size();
      for (std::size_t e = 0; e < count; ++e) {
        double sum = 0;
        for (int r = 0; r < comm.size(); ++r) sum += exact_contribution(seed, r, step, g, e);
        all_equal = all_equal && (g % 10 == 9 ? kept[std::size_t(k)][e] == sum * (1.0 / comm.size())
                                              : stored[std::size_t(s)](e) == float(sum) * (1.0f / float(comm.size())));
      }
      g % 10 == 9 ? ++k : ++s;
    }
    CHECK(all_equal);
  }
}

TEST_CASE("gradients back to back in the caller's memory are reduced where they lie, with no buffer",
          "[parallel][buckets]") {
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options(2));
  GradientBucketOptions options;
  options.bucket_bytes = 4096;
  // Two registrations of back-to-back gradients, one after the other and adjacent in one vector
  // (a bucket must not join them all the same), then a packed gradient.
  std::vector<std::size_t> first_counts, second_counts;
  for (int g = 0; g < 20; ++g) first_counts.push_back(g == 7 ? 1500 : std::size_t(5 + 29 * g));  // 1500: alone
  for (int g = 0; g < 5; ++g) second_counts.push_back(std::size_t(3 + 11 * g));
  const std::size_t first_total = std::accumulate(first_counts.begin(), first_counts.end(), std::size_t(0));
  const std::size_t total = std::accumulate(second_counts.begin(), second_counts.end(), first_total);
  std::vector<float> flat(total);
  std::vector<float> packed(123);
  GradientBuckets buckets(comm, options);
  CHECK(buckets.add_back_to_back(flat.data(), first_counts) == 0);
  CHECK(buckets.add_back_to_back(flat.data() + first_total, second_counts) == 20);
  CHECK(buckets.add(packed.data(), packed.size()) == 25);
  // Each registration's buckets as they would be alone, and one for the packed gradient.
  auto buckets_of = [&](const std::vector<std::size_t>& counts) {
    std::vector<float> memory(total);
    GradientBuckets alone(comm, options);
    alone.add_back_to_back(memory.data(), counts);
    return alone.buckets();
  };
  CHECK(buckets.buckets() == buckets_of(first_counts) + buckets_of(second_counts) + 1);
  CHECK(buckets.buckets() > 4);

  // Gradient g's memory: where it lies in `flat`, or the packed vector.
  std::vector<float*> data;
  std::vector<std::size_t> counts = first_counts;
  counts.insert(counts.end(), second_counts.begin(), second_counts.end());
  for (std::size_t g = 0, at = 0; g < counts.size(); at += counts[g++]) data.push_back(flat.data() + at);
  data.push_back(packed.data());
  counts.push_back(packed.size());
  for (int step = 0; step < 2; ++step) {
    for (std::size_t g = 0; g < counts.size(); ++g)
      for (std::size_t e = 0; e < counts[g]; ++e) data[g][e] = float(exact_contribution(seed, comm.rank(), step, int(g), e));
    for (int g = int(counts.size()) - 1; g >= 0; --g) buckets.ready(g);  // any order
    buckets.wait();
    // Only the packed gradient's bucket holds a buffer.
    CHECK(buckets.buffer_bytes() == packed.size() * sizeof(float));
    bool all_equal = true;
    for (std::size_t g = 0; g < counts.size(); ++g)
      for (std::size_t e = 0; e < counts[g]; ++e) {
        double sum = 0;
        for (int r = 0; r < comm.size(); ++r) sum += exact_contribution(seed, r, step, int(g), e);
        all_equal = all_equal && data[g][e] == float(sum) * (1.0f / float(comm.size()));
      }
    CHECK(all_equal);
  }
}

TEST_CASE("the first buckets start while later gradients are not yet ready", "[parallel][buckets]") {
  const Communicator comm = Communicator::world(throwing_options(0));
  std::vector<std::vector<float>> grads(40, std::vector<float>(1000, 1.0f));  // 4 KB each
  GradientBucketOptions options;
  options.bucket_bytes = 8000;  // two gradients per bucket
  GradientBuckets buckets(comm, options);
  for (auto& g : grads) buckets.add(g.data(), g.size());
  for (int g = 0; g < 10; ++g) buckets.ready(g);
  CHECK(buckets.buckets() == 20);
  CHECK(buckets.buckets_started() == 5);
  buckets.wait();  // the other 30 gradients count as final here
  for (const auto& g : grads) CHECK(g[999] == 1.0f);
}

TEMPLATE_LIST_TEST_CASE("gradients in the memory of an execution space are summed there",
                        "[parallel][buckets]", longattn::test::MpiTestSpaces) {
  using Exec = TestType;
  using Memory = typename Exec::memory_space;
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  const Communicator comm = Communicator::world(throwing_options(2));
  GradientBucketOptions options;
  options.bucket_bytes = 4096;
  options.op = longattn::parallel::ReduceOp::sum;
  const longattn::ExecutionContext<Exec> context;
  GradientBuckets<Exec> buckets(context, comm, options);
  // Kept gradients (copied into buckets and back; one of 12 KB alone), stored ones, and 8 back
  // to back in one View (reduced where they lie).
  std::vector<Kokkos::View<float*, Memory>> kept;
  std::vector<Kokkos::View<float*, Memory, Kokkos::MemoryUnmanaged>> views;  // every gradient, in order
  for (int g = 0; g < 12; ++g) {
    const std::size_t count = g == 5 ? 3000 : std::size_t(11 + 17 * g);
    if (g % 3 == 2) {
      views.push_back(buckets.template add<float>(count));
    } else {
      kept.emplace_back("kept", count);
      buckets.add(kept.back());
      views.emplace_back(kept.back().data(), count);
    }
  }
  const std::vector<std::size_t> back_to_back{300, 7, 1100, 45, 45, 600, 2, 900};
  const Kokkos::View<float*, Memory> flat("back to back", 3000);
  buckets.add_back_to_back(flat.data(), back_to_back);
  for (std::size_t g = 0, at = 0; g < back_to_back.size(); at += back_to_back[g++])
    views.emplace_back(flat.data() + at, back_to_back[g]);
  const int gradients = int(views.size());
  for (int step = 0; step < 2; ++step) {
    for (int g = 0; g < gradients; ++g) {
      const auto host = Kokkos::create_mirror_view(views[std::size_t(g)]);
      for (std::size_t e = 0; e < host.size(); ++e) host(e) = float(exact_contribution(seed, comm.rank(), step, g, e));
      Kokkos::deep_copy(views[std::size_t(g)], host);
    }
    for (int g = 0; g < gradients; ++g) buckets.ready(g);
    buckets.wait();
    bool all_equal = true;
    for (int g = 0; g < gradients; ++g) {
      const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), views[std::size_t(g)]);
      for (std::size_t e = 0; e < host.size(); ++e) {
        double sum = 0;
        for (int r = 0; r < comm.size(); ++r) sum += exact_contribution(seed, r, step, g, e);
        all_equal = all_equal && host(e) == float(sum);
      }
    }
    CHECK(all_equal);
  }
}

TEMPLATE_TEST_CASE("float gradients reduced in 16 bits come back as the 16-bit average", "[parallel][buckets][half]",
                   longattn::bfloat16, longattn::float16) {
  using Half = TestType;
  const std::uint64_t seed = longattn::test::shared_seed();
  INFO("seed " << seed);
  for (const bool hierarchical : {false, true}) {
    INFO("hierarchical " << hierarchical);
    const Communicator comm = Communicator::world(throwing_options(2));
    const int P = comm.size();
    GradientBucketOptions options;
    options.bucket_bytes = 4096;
    options.hierarchical = hierarchical;
    options.reduce_type = longattn::parallel::data_type_of<Half>();
    GradientBuckets buckets(comm, options);
    // Kept gradients (one larger than a bucket, reduced alone), gradients stored in buckets and
    // two back to back.
    std::vector<std::vector<float>> kept{std::vector<float>(300), std::vector<float>(2000), std::vector<float>(5)};
    for (auto& g : kept) buckets.add(g.data(), g.size());
    const auto stored = buckets.template add<float>(777);
    std::vector<float> back_to_back(400 + 333);
    buckets.add_back_to_back(back_to_back.data(), {400, 333});
    buckets.wait();  // a step with nothing ready: buffers made, everything reduced once
    // Kept and back-to-back gradients go straight into the 16-bit copies (2 bytes each, no float
    // buffer: the 300 and the 5 in two buckets, the 2000 alone, the 400 and 333 in one); the
    // stored one's bucket has its float buffer (4096 bytes) and a copy of its 777.
    CHECK(buckets.buffer_bytes() == 2 * (300 + 5) + 2 * 2000 + 4096 + 2 * 777 + 2 * (400 + 333));
    for (int step = 0; step < 2; ++step) {
      auto fill = [&](float* g, std::size_t count, int index) {
        for (std::size_t e = 0; e < count; ++e) g[e] = float(exact_contribution(seed, comm.rank(), step, index, e));
      };
      for (std::size_t i = 0; i < kept.size(); ++i) fill(kept[i].data(), kept[i].size(), int(i));
      fill(stored.data(), stored.size(), 3);
      fill(back_to_back.data(), 400, 4);
      fill(back_to_back.data() + 400, 333, 5);
      for (int g = 0; g < 6; ++g) buckets.ready(g);
      buckets.wait();
      // Each contribution and sum is exact in 16 bits; the average is the sum times 1/P in float,
      // rounded to 16 bits, widened back.
      auto expected = [&](int index, std::size_t e) {
        double sum = 0;
        for (int r = 0; r < P; ++r) sum += exact_contribution(seed, r, step, index, e);
        return float(Half(float(sum) * (1.0f / float(P))));
      };
      bool all_equal = true;
      for (std::size_t i = 0; i < kept.size(); ++i)
        for (std::size_t e = 0; e < kept[i].size(); ++e) all_equal = all_equal && kept[i][e] == expected(int(i), e);
      for (std::size_t e = 0; e < stored.size(); ++e) all_equal = all_equal && stored(e) == expected(3, e);
      for (std::size_t e = 0; e < back_to_back.size(); ++e)
        all_equal = all_equal && back_to_back[e] == (e < 400 ? expected(4, e) : expected(5, e - 400));
      CHECK(all_equal);
    }
  }
}

TEST_CASE("GradientBuckets refuses bad input", "[parallel][buckets][errors]") {
  const Communicator comm = Communicator::world(throwing_options(0));
  std::vector<float> g(10);
  std::vector<std::int32_t> ints(10);
  GradientBucketOptions zero;
  zero.bucket_bytes = 0;
  CHECK_THROWS_WITH(GradientBuckets(comm, zero), Catch::Contains("argument 'options.bucket_bytes' is 0"));
  GradientBucketOptions integers;
  integers.reduce_type = longattn::parallel::DataType::int32;
  CHECK_THROWS_WITH(GradientBuckets(comm, integers),
                    Catch::Contains("argument 'options.reduce_type' is int32, expected float32, bfloat16 or float16"));
  GradientBuckets buckets(comm);
  CHECK_THROWS_WITH(buckets.add(g.data(), 0), Catch::Contains("argument 'count' is 0, expected at least one element"));
  CHECK_THROWS_WITH(buckets.add(ints.data(), ints.size()), Catch::Contains("argument 'type' is int32"));
  CHECK_THROWS_WITH(buckets.add_back_to_back(g.data(), {}), Catch::Contains("argument 'counts' is empty"));
  CHECK_THROWS_WITH(buckets.add_back_to_back(g.data(), {4, 0, 6}),
                    Catch::Contains("argument 'counts[1]' is 0, expected at least one element"));
  buckets.add(g.data(), g.size());
  buckets.ready(0);
  CHECK_THROWS_WITH(buckets.ready(0), Catch::Contains("argument 'index' is 0, expected a gradient not yet ready"));
  CHECK_THROWS_WITH(buckets.ready(1), Catch::Contains("argument 'index' is 1, expected a gradient from 0 to 0"));
  CHECK_THROWS_WITH(buckets.add(g.data(), g.size()), Catch::Contains("expected every gradient added before the first"));
  buckets.wait();
}
