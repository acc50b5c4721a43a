// Block-sparse attention: every pattern builder against its definition (static patterns at token
// level, top-k by its ranking), the layouts' transposes, and attention through each layout
// against the naive double reference with the equivalent token mask: fresh random data, odd
// sizes, Nq != Nk, per-(batch, head) patterns, empty rows and columns, both causal settings,
// float and double, every enabled execution space. The full layout equals dense attention bit
// for bit; gradients through a sparse layout match central finite differences; invalid layouts
// and parameters throw longattn::Error.
#include <catch2/catch.hpp>

#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bf16_dot_products.hpp"
#include "execution_spaces.hpp"
#include "longattn/core/attention.hpp"
#include "longattn/core/block_sparse_layout.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "reference/attention.hpp"
#include "reference/block_sparse.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"
#include "reference/test_size.hpp"
#include "team_tiles.hpp"

namespace {

using longattn::BlockSparseConfig;
using longattn::BlockSparsePattern;
using longattn::BlockSparseShape;
using longattn::test::BlockMask;
using longattn::test::HostRows;
using longattn::test::HostTensor;
using longattn::test::random_tensor;
using longattn::test::relative_error;
using longattn::test::to_device;
using longattn::test::to_host;
using longattn::test::gradient_tolerance;
using longattn::test::tolerance;

struct Case {
  int batch, queries, keys, heads, head_dim;
};

const Case cases[] = {
    {2, longattn::test::test_size(333, 203), longattn::test::test_size(333, 203), longattn::test::test_size(3, 2),
     16},                  // odd N: a short last block
    {1, 150, 260, 2, 32},  // Nq != Nk
    {1, 192, 192, 2, 8},   // whole blocks
};

BlockSparseConfig config_of(BlockSparsePattern pattern) {
  BlockSparseConfig c;
  c.pattern = pattern;
  c.radius = 65;  // a gap that occurs between blocks: kept, one token less would drop it
  c.rates = {2, 3};
  c.global_tokens = 30;
  c.density = 0.4;
  c.seed = longattn::test::test_seed();
  c.top_k = 2;
  return c;
}

const BlockSparsePattern patterns[] = {BlockSparsePattern::full,         BlockSparsePattern::local_window,
                                       BlockSparsePattern::dilated,      BlockSparsePattern::global_local,
                                       BlockSparsePattern::random,       BlockSparsePattern::top_k};

// A per-(batch, head) block mask with about half the blocks, one empty row and one empty column.
std::vector<std::uint8_t> random_block_mask(const BlockSparseShape& shape, std::mt19937_64& rng) {
  std::vector<std::uint8_t> mask(std::size_t(shape.rows()) * shape.key_blocks());
  for (auto& keep : mask) keep = rng() % 2;
  const int QB = shape.query_blocks(), KB = shape.key_blocks();
  for (int kb = 0; kb < KB; ++kb) mask[std::size_t(1 % QB) * KB + kb] = 0;  // pattern 0, query block 1
  const std::size_t last = std::size_t(shape.patterns() - 1) * QB;
  for (int qb = 0; qb < QB; ++qb) mask[(last + qb) * KB + 0] = 0;  // last pattern, key block 0
  return mask;
}

// Rows hold the diagonal and min(k, allowed) blocks, all allowed, and no unkept allowed block
// scores above a kept off-diagonal one (beyond `slack`).
void check_top_k(const BlockMask& m, const HostTensor& q, const HostTensor& k, std::int64_t top_k, bool causal,
                 double slack) {
  for (int b = 0; b < m.batch; ++b)
    for (int h = 0; h < m.heads; ++h)
      for (int qb = 0; qb < m.query_blocks; ++qb) {
        INFO("top-k row b " << b << " h " << h << " qb " << qb);
        const int allowed = causal ? qb + 1 : m.key_blocks;
        int kept = 0;
        double lowest_kept = std::numeric_limits<double>::infinity(), highest_dropped = -lowest_kept;
        for (int kb = 0; kb < m.key_blocks; ++kb) {
          if (kb >= allowed) {
            CHECK(!m.kept(b, h, qb, kb));
            continue;
          }
          const double score = longattn::test::pooled_score(q, k, m.block, b, h, qb, kb);
          if (m.kept(b, h, qb, kb)) {
            ++kept;
            if (kb != qb) lowest_kept = std::min(lowest_kept, score);
          } else {
            highest_dropped = std::max(highest_dropped, score);
          }
        }
        CHECK(m.kept(b, h, qb, qb));
        CHECK(kept == std::min<std::int64_t>(top_k, allowed));
        CHECK(highest_dropped <= lowest_kept + slack);
      }
}

template <class ExecSpace, class T, class Tiles = longattn::DefaultTiles>
void check_pattern(const Case& c, const BlockSparseConfig* config, bool causal, std::mt19937_64& rng) {
  using Memory = typename ExecSpace::memory_space;
  const int B = c.batch, Nq = c.queries, Nk = c.keys, H = c.heads, D = c.head_dim;
  const ExecSpace exec;
  const HostTensor q = random_tensor<T>(B, Nq, H, D, rng), k = random_tensor<T>(B, Nk, H, D, rng);
  const HostTensor v = random_tensor<T>(B, Nk, H, D, rng), d_o = random_tensor<T>(B, Nq, H, D, rng);
  auto qd = to_device<T, Memory>(q), kd = to_device<T, Memory>(k), vd = to_device<T, Memory>(v);
  auto dod = to_device<T, Memory>(d_o);

  BlockSparseShape shape;
  shape.block = longattn::attention_block_size<ExecSpace, T, Tiles>();
  shape.queries = Nq;
  shape.keys = Nk;
  std::ostringstream what;
  what << "B " << B << " Nq " << Nq << " Nk " << Nk << " H " << H << " D " << D << " "
       << (config ? longattn::to_string(config->pattern) : "mask") << (causal ? " causal" : "") << ", "
       << longattn::detail::scalar_name<T>() << ", team size " << longattn::tiles_for_t<ExecSpace, Tiles>::team_size
       << ", seed " << longattn::test::test_seed();
  INFO(what.str());

  longattn::BlockSparseLayout<ExecSpace> layout;
  if (config) {
    layout = longattn::block_sparse_layout(exec, *config, qd, kd, causal);
  } else {
    shape.batch = B;
    shape.heads = H;
    layout = longattn::mask_layout(exec, shape, random_block_mask(shape, rng));
    causal = false;  // a mask is the whole pattern
  }
  bool consistent = false;
  const BlockMask mask = longattn::test::read_layout(layout, consistent);
  CHECK(consistent);
  CHECK(layout.density() == Approx(double(mask.count()) / mask.keep.size()));
  if (config && config->pattern == BlockSparsePattern::top_k) {
    check_top_k(mask, q, k, config->top_k, causal, std::is_same_v<T, float> ? 1e-5 : 1e-12);
  } else if (config && config->pattern == BlockSparsePattern::random) {
    for (int qb = 0; qb < mask.query_blocks; ++qb) {
      int allowed = 0, kept = 0;
      for (int kb = 0; kb < mask.key_blocks; ++kb) {
        const bool visible = !causal || longattn::test::causal_pair_exists(mask, qb, kb, Nq);
        allowed += visible;
        kept += mask.kept(0, 0, qb, kb);
        if (!visible) CHECK(!mask.kept(0, 0, qb, kb));
      }
      CHECK(kept == std::max<long long>(1, std::llround(config->density * allowed)));
    }
  } else if (config) {
    CHECK(mask.keep == longattn::test::reference_static_pattern(*config, shape.block, Nq, Nk, causal).keep);
  }

  HostTensor o_ref("o", B, Nq, H, D), dq_ref("dq", B, Nq, H, D), dk_ref("dk", B, Nk, H, D), dv_ref("dv", B, Nk, H, D);
  HostRows lse_ref("lse", B, H, Nq);
  const longattn::test::ReferenceOptions ref = mask.options(causal);
  longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, ref);
  longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, ref);

  Kokkos::View<T****, Memory> o("o", B, Nq, H, D), dq("dq", B, Nq, H, D), dk("dk", B, Nk, H, D), dv("dv", B, Nk, H, D);
  Kokkos::View<longattn::accumulate_t<T>***, Memory> lse("lse", B, H, Nq);
  // Stale values: rows and columns the pattern leaves empty must still be written.
  Kokkos::deep_copy(o, T(7.0));
  Kokkos::deep_copy(lse, 7);
  Kokkos::deep_copy(dq, T(7.0));
  Kokkos::deep_copy(dk, T(7.0));
  Kokkos::deep_copy(dv, T(7.0));
  longattn::AttentionOptions opts;
  opts.causal = causal;
  longattn::attention_forward<Tiles>(exec, qd, kd, vd, o, lse, opts, layout);
  longattn::attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, opts, layout);
  exec.fence();
  const double rounding = longattn::test::bf16_product_rounding<T, Memory>();
  CHECK(relative_error(to_host(o), o_ref) <= rounding * tolerance<T>());
  CHECK(relative_error(to_host(lse), lse_ref) <= rounding * tolerance<T>());
  CHECK(relative_error(to_host(dq), dq_ref) <= rounding * gradient_tolerance<T>());
  CHECK(relative_error(to_host(dk), dk_ref) <= rounding * gradient_tolerance<T>());
  CHECK(relative_error(to_host(dv), dv_ref) <= rounding * gradient_tolerance<T>());
  if (!config) {  // the empty row: o = 0, lse = -inf, dq = 0; the empty column: dk = dv = 0
    const HostTensor o_host = to_host(o), dq_host = to_host(dq), dk_host = to_host(dk);
    const HostRows lse_host = to_host(lse);
    const int row = std::min(1, mask.query_blocks - 1) * shape.block;
    CHECK(lse_host(0, 0, row) == -std::numeric_limits<double>::infinity());
    CHECK(o_host(0, row, 0, 0) == 0);
    CHECK(dq_host(0, row, 0, D - 1) == 0);
    CHECK(dk_host(B - 1, 0, H - 1, 0) == 0);
  }
}

// Runs check(case, config, causal) for every case and causal setting with each pattern (top-k
// only where queries and keys are one sequence), then check(case, nullptr, false) for a random mask.
template <class Check>
void for_each_pattern(const Check& check) {
  for (const Case& c : cases)
    for (bool causal : {false, true}) {
      for (BlockSparsePattern pattern : patterns) {
        if (pattern == BlockSparsePattern::top_k && c.queries != c.keys) continue;
        const BlockSparseConfig config = config_of(pattern);
        check(c, &config, causal);
      }
      if (!causal) check(c, nullptr, false);
    }
}

}  // namespace

TEMPLATE_LIST_TEST_CASE(
    "each block-sparse pattern keeps the blocks its definition names and attends like the "
    "reference with the equivalent token mask",
    "[core][block_sparse]", longattn::test::ExecutionSpaces) {
  std::mt19937_64 rng(longattn::test::test_seed());
  for_each_pattern([&](const Case& c, const BlockSparseConfig* config, bool causal) {
    check_pattern<TestType, float>(c, config, causal, rng);
    check_pattern<TestType, double>(c, config, causal, rng);
    // bfloat16 for the patterns top-k does not score (it takes float or double), float16 for the mask.
    if (!config)
      check_pattern<TestType, longattn::float16>(c, config, causal, rng);
    else if (config->pattern != BlockSparsePattern::top_k)
      check_pattern<TestType, longattn::bfloat16>(c, config, causal, rng);
  });
}

// Every pattern (top-k's scoring kernel included) and a random mask, in the GPU's tile shape with
// teams of 2 and 4 threads on the host; float and double (float only with LONGATTN_TEST_SIZE=small:
// the team's barriers and work split are the same code for both).
TEMPLATE_LIST_TEST_CASE(
    "block-sparse attention in the GPU's tile shape with several threads per team matches the "
    "reference",
    "[core][block_sparse][team_tiles]", longattn::test::TeamTileConfigs) {
  if (!longattn::test::openmp_runs_team_of<TestType>()) return;
#ifdef KOKKOS_ENABLE_OPENMP
  std::mt19937_64 rng(longattn::test::test_seed());
  for_each_pattern([&](const Case& c, const BlockSparseConfig* config, bool causal) {
    check_pattern<Kokkos::OpenMP, float, TestType>(c, config, causal, rng);
    if (!longattn::test::small_test_sizes()) check_pattern<Kokkos::OpenMP, double, TestType>(c, config, causal, rng);
  });
#endif
}

TEMPLATE_LIST_TEST_CASE("pattern edge cases: zero radius, rates beyond the sequence, more global tokens than "
                        "tokens, k above the block count, density 1",
                        "[core][block_sparse]", longattn::test::ExecutionSpaces) {
  const TestType exec;
  BlockSparseShape shape;
  shape.queries = shape.keys = 300;  // 5 blocks of 64
  bool consistent = false;
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "non-causal"));
    // Radius 0 keeps the diagonal only.
    auto local = longattn::test::read_layout(longattn::local_window_layout(exec, shape, 0, causal), consistent);
    CHECK(consistent);
    CHECK(local.count() == 5);
    for (int b = 0; b < 5; ++b) CHECK(local.kept(0, 0, b, b));
    // Rates past the last block add nothing.
    CHECK(longattn::test::read_layout(longattn::dilated_blocks_layout(exec, shape, {7, 100}, causal), consistent).count() == 5);
    // Global tokens beyond the sequence: every block is global, the layout is full.
    const auto all = longattn::test::read_layout(longattn::full_layout(exec, shape, causal), consistent);
    CHECK(all.count() == (causal ? 15u : 25u));
    CHECK(longattn::test::read_layout(longattn::global_local_layout(exec, shape, 1000, 0, causal), consistent).keep == all.keep);
    CHECK(longattn::test::read_layout(longattn::random_layout(exec, shape, 1.0, 3, causal), consistent).keep == all.keep);
  }
  // Random layouts are reproducible from their seed and differ between seeds.
  shape.queries = shape.keys = 64 * 40;
  const auto first = longattn::test::read_layout(longattn::random_layout(exec, shape, 0.25, 11, false), consistent);
  CHECK(first.keep == longattn::test::read_layout(longattn::random_layout(exec, shape, 0.25, 11, false), consistent).keep);
  CHECK(first.keep != longattn::test::read_layout(longattn::random_layout(exec, shape, 0.25, 12, false), consistent).keep);
  CHECK(first.count() == 40u * 10u);
  // k above the block count keeps every allowed block.
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  auto q = to_device<float, Memory>(random_tensor<float>(1, 300, 2, 8, rng));
  for (bool causal : {false, true}) {
    const auto top = longattn::test::read_layout(longattn::top_k_layout(exec, q, q, 9, causal), consistent);
    CHECK(consistent);
    CHECK(top.count() == (causal ? 2 * 15u : 2 * 25u));
  }
}

TEMPLATE_LIST_TEST_CASE("the full layout equals dense attention bit for bit", "[core][block_sparse]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const TestType exec;
  const int B = 2, N = 200, H = 2, D = 16;
  auto q = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  auto k = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  auto v = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  auto d_o = to_device<float, Memory>(random_tensor<float>(B, N, H, D, rng));
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "non-causal") << ", seed " << longattn::test::test_seed());
    longattn::AttentionOptions opts;
    opts.causal = causal;
    BlockSparseShape shape;
    shape.block = longattn::attention_block_size<TestType, float>();
    shape.queries = shape.keys = N;
    const auto full = longattn::full_layout(exec, shape, causal);
    CHECK(full.density() == Approx(causal ? 10.0 / 16 : 1.0));
    using F4 = Kokkos::View<float****, Memory>;
    using F3 = Kokkos::View<float***, Memory>;
    F4 o[2] = {F4("o", B, N, H, D), F4("o", B, N, H, D)}, dq[2] = {F4("dq", B, N, H, D), F4("dq", B, N, H, D)};
    F4 dk[2] = {F4("dk", B, N, H, D), F4("dk", B, N, H, D)}, dv[2] = {F4("dv", B, N, H, D), F4("dv", B, N, H, D)};
    F3 lse[2] = {F3("lse", B, H, N), F3("lse", B, H, N)};
    longattn::attention_forward(exec, q, k, v, o[0], lse[0], opts);
    longattn::attention_backward(exec, q, k, v, o[0], d_o, lse[0], dq[0], dk[0], dv[0], opts);
    longattn::attention_forward(exec, q, k, v, o[1], lse[1], opts, full);
    longattn::attention_backward(exec, q, k, v, o[1], d_o, lse[1], dq[1], dk[1], dv[1], opts, full);
    exec.fence();
    auto same = [](const auto& a, const auto& b) {
      const auto x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
      const auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
      return std::equal(x.data(), x.data() + x.span(), y.data());
    };
    CHECK(same(o[0], o[1]));
    CHECK(same(lse[0], lse[1]));
    CHECK(same(dq[0], dq[1]));
    CHECK(same(dk[0], dk[1]));
    CHECK(same(dv[0], dv[1]));
  }
}

TEMPLATE_LIST_TEST_CASE("block-sparse gradients match central finite differences", "[core][block_sparse]",
                        longattn::test::ExecutionSpaces) {
  using Memory = typename TestType::memory_space;
  std::mt19937_64 rng(longattn::test::test_seed());
  const TestType exec;
  const int B = 1, N = 150, H = 1, D = 3;
  BlockSparseShape shape;
  shape.block = longattn::attention_block_size<TestType, double>();
  shape.queries = shape.keys = N;
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "non-causal") << ", seed " << longattn::test::test_seed());
    // Blocks (0, 2), (1, 0), (2, 1), (2, 2): off-diagonal blocks and a masked diagonal.
    std::vector<std::uint8_t> mask = {0, 0, 1, 1, 0, 0, 0, 1, 1};
    const auto layout = longattn::mask_layout(exec, shape, mask);
    auto q = to_device<double, Memory>(random_tensor<double>(B, N, H, D, rng));
    auto k = to_device<double, Memory>(random_tensor<double>(B, N, H, D, rng));
    auto v = to_device<double, Memory>(random_tensor<double>(B, N, H, D, rng));
    const HostTensor d_o_host = random_tensor<double>(B, N, H, D, rng);
    auto d_o = to_device<double, Memory>(d_o_host);
    Kokkos::View<double****, Memory> o("o", B, N, H, D), dq("dq", B, N, H, D), dk("dk", B, N, H, D), dv("dv", B, N, H, D);
    Kokkos::View<double***, Memory> lse("lse", B, H, N);
    longattn::AttentionOptions opts;
    opts.causal = causal;
    longattn::attention_forward(exec, q, k, v, o, lse, opts, layout);
    longattn::attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts, layout);
    const HostTensor grads[3] = {to_host(dq), to_host(dk), to_host(dv)};
    auto loss = [&] {  // sum(dO * O)
      longattn::attention_forward(exec, q, k, v, o, lse, opts, layout);
      const HostTensor out = to_host(o);
      double sum = 0;
      for (std::size_t i = 0; i < out.span(); ++i) sum += out.data()[i] * d_o_host.data()[i];
      return sum;
    };
    decltype(q) inputs[3] = {q, k, v};
    for (int t = 0; t < 3; ++t) {
      const double error =
          longattn::test::finite_difference_error(inputs[t], loss, [&](std::size_t i) { return grads[t].data()[i]; });
      INFO("input " << t << ": largest |finite difference - analytic| " << error);
      CHECK(error < 1e-7);
    }
  }
}

TEST_CASE("invalid block-sparse layouts and parameters throw a longattn::Error", "[core][block_sparse][errors]") {
  using Host = Kokkos::DefaultHostExecutionSpace;
  using Layout = longattn::BlockSparseLayout<Host>;
  const Host exec;
  BlockSparseShape shape;
  shape.queries = 130;  // 3 query blocks
  shape.keys = 100;     // 2 key blocks
  auto csr = [&](std::vector<std::int64_t> offsets, std::vector<int> entries) { return Layout(exec, shape, offsets, entries); };
  CHECK_NOTHROW(csr({0, 1, 1, 3}, {0, 0, 1}));  // an empty row is fine
  CHECK_THROWS_WITH(csr({0, 1, 2}, {0, 0}),
                    Catch::Contains("'row_offsets.extent(0)' is 3, expected 4 (batch * heads * query blocks + 1"));
  CHECK_THROWS_WITH(csr({1, 1, 2, 3}, {0, 0, 1}), Catch::Contains("'row_offsets[0]' is 1, expected 0"));
  CHECK_THROWS_WITH(csr({0, 1, 2, 2}, {0, 0, 1}),
                    Catch::Contains("'row_offsets[3]' is 2, expected 3 (the number of key block entries)"));
  CHECK_THROWS_WITH(csr({0, 2, 1, 3}, {0, 1, 1}),
                    Catch::Contains("'row_offsets[2]' is 1, expected at least row_offsets[1] = 2"));
  // Non-decreasing until an offset past the entries (found by fuzz_block_sparse: the row's entries
  // were read up to it, outside the array), or before a negative one.
  CHECK_THROWS_WITH(csr({0, 1000, 1000, 3}, {0, 0, 1}),
                    Catch::Contains("'row_offsets[1]' is 1000, expected at most 3 (the number of key block entries)"));
  CHECK_THROWS_WITH(csr({0, -5, 2, 3}, {0, 0, 1}),
                    Catch::Contains("'row_offsets[1]' is -5, expected at least row_offsets[0] = 0"));
  CHECK_THROWS_WITH(csr({0, 1, 3, 4}, {0, 1, 0, 0}),
                    Catch::Contains("'key blocks of row 1 (batch 0, head 0, query block 1)' is [1, 0], expected ascending "
                                    "key block indices in [0, 2) without duplicates"));
  CHECK_THROWS_WITH(csr({0, 1, 3, 4}, {0, 1, 1, 0}), Catch::Contains("row 1 (batch 0, head 0, query block 1)' is [1, 1]"));
  CHECK_THROWS_WITH(csr({0, 1, 2, 3}, {0, 0, 2}), Catch::Contains("query block 2)' is [2]"));
  CHECK_THROWS_WITH(csr({0, 1, 2, 3}, {-1, 0, 1}), Catch::Contains("query block 0)' is [-1]"));
  shape.heads = 2;
  CHECK_THROWS_WITH(csr({0, 1, 2, 3, 4, 5, 7}, {0, 0, 0, 0, 0, 1, 1}),
                    Catch::Contains("row 5 (batch 0, head 1, query block 2)' is [1, 1]"));
  shape.heads = 1;

  BlockSparseShape bad = shape;
  bad.block = 0;
  CHECK_THROWS_WITH(longattn::full_layout(exec, bad, false), Catch::Contains("'shape.block' is 0"));
  bad = shape;
  bad.queries = 0;
  CHECK_THROWS_WITH(longattn::full_layout(exec, bad, false), Catch::Contains("'shape.queries' is 0"));
  bad = shape;
  bad.heads = 0;
  CHECK_THROWS_WITH(longattn::full_layout(exec, bad, false), Catch::Contains("'shape.heads' is 0"));
  CHECK_THROWS_WITH(longattn::local_window_layout(exec, shape, -1, false), Catch::Contains("'radius' is -1"));
  CHECK_THROWS_WITH(longattn::dilated_blocks_layout(exec, shape, {}, false), Catch::Contains("'rates' is empty"));
  CHECK_THROWS_WITH(longattn::dilated_blocks_layout(exec, shape, {2, 0}, false),
                    Catch::Contains("'rates[1]' is 0, expected a positive block distance"));
  CHECK_THROWS_WITH(longattn::global_local_layout(exec, shape, -5, 3, false), Catch::Contains("'global_tokens' is -5"));
  CHECK_THROWS_WITH(longattn::random_layout(exec, shape, 0.0, 1, false), Catch::Contains("'density' is 0, expected a fraction in (0, 1]"));
  CHECK_THROWS_WITH(longattn::random_layout(exec, shape, 1.5, 1, false), Catch::Contains("'density' is 1.5"));
  CHECK_THROWS_WITH(longattn::mask_layout(exec, shape, std::vector<std::uint8_t>(5)),
                    Catch::Contains("'mask.size()' is 5, expected 6 (batch * heads * query blocks * key blocks"));

  // Layouts that do not fit the tensors.
  using F4 = Kokkos::View<float****, Host>;
  using F3 = Kokkos::View<float***, Host>;
  F4 q("q", 2, 130, 3, 8), k("k", 2, 100, 3, 8), v("v", 2, 100, 3, 8), o("o", 2, 130, 3, 8);
  F3 lse("lse", 2, 3, 130);
  CHECK_NOTHROW(longattn::attention_forward(exec, q, k, v, o, lse, {}, longattn::full_layout(exec, shape, false)));
  bad = shape;
  bad.keys = 200;
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, {}, longattn::full_layout(exec, bad, false)),
                    Catch::Contains("'blocks.key_blocks()' is 4, expected 2 (blocks of k's tokens)"));
  bad = shape;
  bad.block = 32;
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, {}, longattn::full_layout(exec, bad, false)),
                    Catch::Contains("'blocks.block_size()' is 32, expected 64"));
  bad = shape;
  bad.heads = 2;
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, {}, longattn::full_layout(exec, bad, false)),
                    Catch::Contains("'blocks.pattern_heads()' is 2, expected 1 (shared) or 3 (q's heads)"));
  bad = shape;
  bad.batch = 3;
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, {}, longattn::full_layout(exec, bad, false)),
                    Catch::Contains("'blocks.pattern_batch()' is 3, expected 1 (shared) or 2 (q's batch)"));
  CHECK_THROWS_WITH(longattn::attention_forward(exec, q, k, v, o, lse, {}, Layout()),
                    Catch::Contains("'blocks.block_size()' is 0"));

  CHECK_THROWS_WITH(longattn::top_k_layout(exec, q, k, 2, false),
                    Catch::Contains("'k's extents' is [2, 100, 3, 8], expected [2, 130, 3, 8] (the extents of q: top-k needs Nq = Nk)"));
  CHECK_THROWS_WITH(longattn::top_k_layout(exec, q, q, 0, false), Catch::Contains("'top_k' is 0, expected at least 1"));
  BlockSparseConfig config;
  config.pattern = BlockSparsePattern::top_k;
  CHECK_THROWS_WITH(longattn::block_sparse_layout(exec, config, q, q, false), Catch::Contains("'top_k' is 0"));
}
