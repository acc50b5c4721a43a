// Example 04: causal block-sparse attention over 4096 tokens on the default Kokkos execution
// space: a sliding window, a layout written by hand as block-CSR (every query block sees the
// first block, an "attention sink", and itself), which must equal the global + local builder
// with one global block and no window, and content-adaptive top-k. Forward and backward each.
#include <Kokkos_Random.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/kokkos_compat.hpp"  // longattn::math: Kokkos' math functions in any version

int main(int argc, char* argv[]) {
  longattn::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  using Tensor = Kokkos::View<float****, Exec::memory_space>;  // [batch, tokens, heads, head dim]
  using Rows = Kokkos::View<float***, Exec::memory_space>;     // [batch, heads, tokens]
  const int B = 1, N = 4096, H = 4, D = 64;
  const Exec exec;

  Tensor q("q", B, N, H, D), k("k", B, N, H, D), v("v", B, N, H, D), o("o", B, N, H, D);
  Tensor d_o("dO", B, N, H, D), dq("dQ", B, N, H, D), dk("dK", B, N, H, D), dv("dV", B, N, H, D);
  Rows lse("lse", B, H, N);
  Kokkos::Random_XorShift64_Pool<Exec> random(42);
  for (const Tensor& t : {q, k, v, d_o}) Kokkos::fill_random(t, random, -1.0f, 1.0f);
  longattn::AttentionOptions opts;
  opts.causal = true;  // masks inside the diagonal blocks; the causal layouts skip the rest

  // The grid: 64-token blocks (the kernels' block size), one pattern shared by batch and heads.
  longattn::BlockSparseShape shape;
  shape.block = longattn::attention_block_size<Exec, float>();
  shape.queries = shape.keys = N;

  // 1. A sliding window of 256 tokens each side (causal: only the past side).
  const auto window = longattn::local_window_layout(exec, shape, 256, true);
  longattn::attention_forward(exec, q, k, v, o, lse, opts, window);
  longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts, window);
  std::printf("sliding window: %lld of %d x %d blocks kept (density %.3f)\n",
              static_cast<long long>(window.kept_blocks()), shape.query_blocks(), shape.key_blocks(),
              window.density());

  // 2. Your own pattern as block-CSR on the host: row qb lists key blocks 0 and qb, ascending.
  std::vector<std::int64_t> row_offsets{0};
  std::vector<int> key_blocks;
  for (int qb = 0; qb < shape.query_blocks(); ++qb) {
    key_blocks.push_back(0);
    if (qb > 0) key_blocks.push_back(qb);
    row_offsets.push_back(std::int64_t(key_blocks.size()));
  }
  const longattn::BlockSparseLayout<Exec> sink(exec, shape, row_offsets, key_blocks);
  longattn::attention_forward(exec, q, k, v, o, lse, opts, sink);
  // The same pattern from a builder: 64 global tokens (one block), window radius 0.
  Tensor o_builder("o builder", B, N, H, D);
  longattn::attention_forward(exec, q, k, v, o_builder, lse, opts,
                              longattn::global_local_layout(exec, shape, 64, 0, true));
  float worst = 0;
  Kokkos::parallel_reduce(
      "compare", Kokkos::RangePolicy<Exec>(0, o.size()),
      KOKKOS_LAMBDA(std::size_t i, float& w) {
        const float d = longattn::math::fabs(o.data()[i] - o_builder.data()[i]);
        w = d > w ? d : w;
      },
      Kokkos::Max<float>(worst));
  std::printf("sink + diagonal by hand (density %.3f): %s the global + local builder\n", sink.density(),
              worst == 0 ? "matches" : "DIFFERS from");

  // 3. Content-adaptive: per (batch, head, query block) the 8 key blocks whose mean key best
  //    matches the block's mean query, the diagonal always among them.
  const auto adaptive = longattn::top_k_layout(exec, q, k, 8, true);
  longattn::attention_forward(exec, q, k, v, o, lse, opts, adaptive);
  longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts, adaptive);
  std::printf("top-8: %lld blocks kept over %d (batch, head) patterns (density %.3f)\n",
              static_cast<long long>(adaptive.kept_blocks()), B * H, adaptive.density());
  return worst == 0 ? 0 : 1;
}
