// Example 02: causal attention over a sequence, forward and backward, on the default Kokkos
// execution space; then the same forward computed as two key shards merged with
// merge_partial, the way ring attention accumulates across ranks.
#include <Kokkos_Random.hpp>

#include <cstdio>

#include "longattn/core/attention.hpp"
#include "longattn/core/merge_partial.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/kokkos_compat.hpp"  // longattn::math: Kokkos' math functions in any version

int main(int argc, char* argv[]) {
  longattn::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  using Tensor = Kokkos::View<float****, Exec::memory_space>;  // [batch, tokens, heads, head dim]
  using Rows = Kokkos::View<float***, Exec::memory_space>;     // [batch, heads, tokens]
  const int B = 2, N = 1000, H = 4, D = 64;

  Tensor q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), o("o", B, N, H, D);
  Rows lse("lse", B, H, N);
  Kokkos::Random_XorShift64_Pool<Exec> random(42);
  Kokkos::fill_random(q, random, -1.0f, 1.0f);
  Kokkos::fill_random(k, random, -1.0f, 1.0f);
  Kokkos::fill_random(v, random, -1.0f, 1.0f);

  longattn::AttentionOptions causal;
  causal.causal = true;  // softmax scale defaults to 1 / sqrt(D)
  longattn::attention_forward(Exec(), q, k, v, o, lse, causal);

  // Backward for an upstream gradient dO: dQ, dK, dV. Extra memory: B * H * N floats.
  Tensor d_o("dO", B, N, H, D), dq("dQ", B, N, H, D), dk("dK", B, N, H, D), dv("dV", B, N, H, D);
  Kokkos::fill_random(d_o, random, -1.0f, 1.0f);
  longattn::attention_backward(Exec(), q, k, v, o, d_o, lse, dq, dk, dv, causal);

  // The same output from two halves of the keys: subviews (no copies) with their global offset.
  const int half = N / 2;
  auto keys = [&](const Tensor& t, int first, int last) {
    return Kokkos::subview(t, Kokkos::ALL, std::make_pair(first, last), Kokkos::ALL, Kokkos::ALL);
  };
  Tensor o_merged("o merged", B, N, H, D), o_second("o second", B, N, H, D);
  Rows lse_merged("lse merged", B, H, N), lse_second("lse second", B, H, N);
  longattn::attention_forward(Exec(), q, keys(k, 0, half), keys(v, 0, half), o_merged, lse_merged, causal);
  longattn::AttentionOptions second_half = causal;
  second_half.key_offset = half;  // global position of the second shard's first key
  longattn::attention_forward(Exec(), q, keys(k, half, N), keys(v, half, N), o_second, lse_second, second_half);
  longattn::merge_partial(Exec(), o_merged, lse_merged, o_second, lse_second);

  float worst = 0;
  Kokkos::parallel_reduce(
      "compare", Kokkos::RangePolicy<Exec>(0, o.size()),
      KOKKOS_LAMBDA(std::size_t i, float& w) {
        const float d = longattn::math::fabs(o.data()[i] - o_merged.data()[i]);
        w = d > w ? d : w;
      },
      Kokkos::Max<float>(worst));
  std::printf("causal attention B=%d N=%d H=%d D=%d: forward, backward done; two merged key shards %s "
              "the whole (largest difference %.1e)\n",
              B, N, H, D, worst < 1e-5f ? "match" : "DIFFER from", worst);
  return worst < 1e-5f ? 0 : 1;
}
