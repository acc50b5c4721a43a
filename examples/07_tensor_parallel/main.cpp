// Example 07: tensor parallelism (Megatron-LM) for one attention layer. The ranks of the job
// form a tensor-parallel group; each holds heads / ranks of the layer (its rows of W_qkv, its
// columns of W_out, its part of the sub-LayerNorm) and the group sums the partial results, so
// every rank gets the whole layer's output y and input gradient dx. Each rank then checks them,
// and its part of the weight gradients, against the whole layer run alone.
//   mpiexec -n 2 build/tensor_parallel_example
#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "longattn/core/multihead_attention.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/parallel/placement.hpp"
#include "longattn/parallel/tensor_parallel.hpp"

using Exec = Kokkos::DefaultHostExecutionSpace;  // the group sums host memory through MPI
using Layer = longattn::MultiheadAttention<Exec, double>;
namespace parallel = longattn::parallel;

// Largest |a - b| of two views of the same shape (host memory).
template <class A, class B>
double difference(const A& a, const B& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a.data()[i] - b.data()[i]));
  return worst;
}

int main(int argc, char* argv[]) {
  parallel::MpiSession mpi(argc, argv);  // MPI first, then Kokkos
  longattn::ScopeGuard guard(argc, argv);
  {
    const parallel::Communicator world = parallel::Communicator::world();
    const int B = 2, N = 64, H = 8, E = 8 * 16;  // 8 heads of 16: 1, 2, 4 or 8 ranks
    if (H % world.size() != 0) {
      if (world.rank() == 0) std::printf("run with 1, 2, 4 or 8 ranks (a divisor of %d heads)\n", H);
      return 1;
    }
    longattn::MultiheadAttentionOptions options;
    options.causal = true;
    options.seed = 7;  // the same whole-layer weights on every rank; each keeps its part

    // The group: here the whole job (in a training run, the tp neighbours within a node).
    const auto group = std::make_shared<parallel::TensorParallelGroup<Exec>>(world);
    Layer part({}, E, H, options, group);
    Layer whole({}, E, H, options);  // for the check only

    Kokkos::Random_XorShift64_Pool<Exec> random(2026);
    Layer::Tokens x("x", B, N, E), dy("dy", B, N, E);
    Kokkos::fill_random(x, random, -1.0, 1.0);
    Kokkos::fill_random(dy, random, -1.0, 1.0);
    Layer::Tokens y("y", B, N, E), dx("dx", B, N, E), y_whole("y whole", B, N, E), dx_whole("dx whole", B, N, E);
    part.forward(x, y);  // collective: the output projection's partial products are summed
    part.backward(dy, dx);
    whole.forward(x, y_whole);
    whole.backward(dy, dx_whole);
    Exec().fence();

    // This rank's columns of dW_out are its part of the whole layer's (feature_splits() says how).
    const auto splits = part.feature_splits();
    std::vector<double> expected(splits.w_out.part_count(world.size()));
    splits.w_out.extract(world.size(), world.rank(), whole.weight_gradients().w_out.data(), expected.data());
    double worst = std::max({difference(y, y_whole), difference(dx, dx_whole),
                             difference(part.weight_gradients().w_out, expected)});
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, world.mpi());
    if (world.rank() == 0) {
      std::printf("%d heads over %d ranks: %d heads, %zu of the layer's %zu parameters on each\n", H, world.size(),
                  part.local_heads(), part.parameter_count(), whole.parameter_count());
      std::printf(worst < 1e-10 ? "the split layer matches the whole layer (max difference %.1e)\n"
                                : "MISMATCH: max difference %.1e\n",
                  worst);
    }
    if (worst >= 1e-10) return 1;
  }
  return 0;
}
