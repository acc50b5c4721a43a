// Example 03: a causal multi-head attention layer with LongNet's dilated attention, built from a
// spec string, trained for a few steps of plain SGD to map each token to the one before it:
// forward, loss, backward, update through the flat parameter and gradient buffers.
#include <KokkosBlas1_axpby.hpp>
#include <Kokkos_Random.hpp>

#include <cstdio>

#include "longattn/core/multihead_attention.hpp"
#include "longattn/core/runtime.hpp"

int main(int argc, char* argv[]) {
  // Also switches OpenBLAS to this CPU's kernels where it misdetected the CPU (off by default:
  // it changes the whole process's BLAS).
  longattn::ScopeGuard guard(argc, argv, {/*select_blas_kernels=*/true});
  using Exec = Kokkos::DefaultExecutionSpace;
  using Layer = longattn::MultiheadAttention<Exec, float>;
  const int B = 1, N = 3000, E = 64, H = 4;

  longattn::MultiheadAttentionOptions options;
  options.causal = true;
  options.seed = 7;
  // Three configurations: 512-token segments densely, 1024 every 2nd token, 2048 every 4th.
  Layer layer = longattn::make_multihead_attention<Exec>("dilated:w=512,1024,2048;r=1,2,4", E, H, options);

  Layer::Tokens x("x", B, N, E), target("target", B, N, E), y("y", B, N, E), dy("dy", B, N, E), dx("dx", B, N, E);
  Kokkos::Random_XorShift64_Pool<Exec> random(3);
  Kokkos::fill_random(x, random, -1.0f, 1.0f);
  Kokkos::parallel_for(
      "previous token", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>({0, 0, 0}, {B, N, E}),
      KOKKOS_LAMBDA(int b, int n, int e) { target(b, n, e) = n > 0 ? x(b, n - 1, e) : 0.0f; });

  const float learning_rate = 0.25f, count = float(B) * N * E;
  float first_loss = 0, loss = 0;
  for (int step = 0; step < 8; ++step) {
    layer.forward(x, y);
    // loss = mean (y - target)^2 / 2; dy = (y - target) / count.
    Kokkos::parallel_reduce(
        "loss", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>({0, 0, 0}, {B, N, E}),
        KOKKOS_LAMBDA(int b, int n, int e, float& sum) {
          const float diff = y(b, n, e) - target(b, n, e);
          dy(b, n, e) = diff / count;
          sum += 0.5f * diff * diff / count;
        },
        loss);
    if (step == 0) first_loss = loss;
    std::printf("step %d  loss %.5f\n", step, loss);
    layer.zero_gradients();
    layer.backward(dy, dx);
    KokkosBlas::axpy(-learning_rate, layer.gradients(), layer.parameters());  // SGD
  }
  const bool learned = loss < 0.9f * first_loss;
  std::printf("%s (%zu parameters, attention %s): loss %s from %.5f to %.5f\n", "MultiheadAttention",
              layer.parameter_count(), longattn::to_string(layer.attention()).c_str(),
              learned ? "decreased" : "did NOT decrease", first_loss, loss);
  return learned ? 0 : 1;
}
