#pragma once
// Dilated attention (LongNet) over a sequence sharded contiguously over a context-parallel
// group, forward and backward; the result equals core dilated attention over the whole sequence.
//
//   parallel::dilated_attention_forward(ctx, group, AttentionInputs{q, k, v}, AttentionOutputs{o, lse}, config, opts);
//   parallel::dilated_attention_backward(ctx, group, AttentionInputs{q, k, v}, AttentionOutputs{o, lse}, d_o,
//                                        AttentionGradients{dq, dk, dv}, config, opts);
//
// ctx: an ExecutionContext (core/execution_context.hpp) or a bare instance: kernels on its
// instance, gathered segments and workspaces from its pool.
// q, k, v, ... are this rank's [B, S, H, D] (S = N / P, contiguous sharding: rank r holds tokens
// [r S, (r+1) S)). Each (configuration, offset, heads) pass (see core/dilated_attention.hpp):
//   - a segment that fits in a shard (w divides S; any w on one rank) is computed locally, on
//     strided views;
//   - a longer one (S divides w and w divides N, or w >= N: one segment) spans G = min(w, N) / S
//     consecutive ranks, LongNet's distributed algorithm: each rank selects its own dilated
//     tokens (S / r of them: r must divide S), the G ranks all-gather the dilated K and V (so
//     traffic shrinks by the rate r), and each computes its dilated queries against the whole
//     dilated segment; backward reduce-scatters the gathered keys' gradients back to their
//     owners.
// Errors follow the group's ErrorPolicy, agreed between ranks first (no rank is left waiting).
// Every pass accumulates into (o, lse) from (0, -inf) in the kernel (LongNet's merge by
// softmax denominators; head_groups keeps its 1 / k scale). 16-bit tensors (bfloat16, float16)
// are gathered and scattered in 16 bits, and passes accumulate in their type as on one rank. Buffers in the memory of ctx's
// space; the gathers and scatters go through the communicator's transport for that memory
// (Communicator::transport).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "longattn/core/attention_tensors.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/memory/pooled_view.hpp"
#include "longattn/parallel/communicator.hpp"

namespace longattn::parallel {

namespace detail {

// A pass that spans ranks: the group of the G ranks of this rank's segment, this rank's place
// in it.
struct SpanningGroup {
  Communicator comm;
  int ranks, index;
};

// Ranks a pass's segments span: 0 when they fit in a shard (computed locally), else G.
inline std::int64_t spanning_ranks(std::int64_t w, std::int64_t S, int P) {
  if (P == 1 || S % w == 0) return 0;
  return std::min(w, S * P) / S;
}

// Throws unless every configuration is local or spans whole shards with r dividing S.
inline void check_dilated_shards(const char* where, std::int64_t S, int P, const DilatedConfig& config) {
  const std::int64_t N = S * P;
  for (std::size_t i = 0; i < config.segment_lengths.size(); ++i) {
    const std::string index = "[" + std::to_string(i) + "]";
    const std::int64_t w = config.segment_lengths[i], r = config.dilation_rates[i];
    if (spanning_ranks(w, S, P) == 0) continue;
    require(w >= N || (w % S == 0 && N % w == 0), where, "config.segment_lengths" + index, w,
            "a divisor of the " + std::to_string(S) + " tokens per rank (computed locally), a multiple of them "
            "dividing the " + std::to_string(N) + "-token sequence, or at least " + std::to_string(N) +
            " (spanning ranks)");
    require(S % r == 0, where, "config.dilation_rates" + index, r,
            "a divisor of the " + std::to_string(S) + " tokens per rank (a segment spanning ranks splits its "
            "dilated tokens evenly)");
  }
}

// Collective: checks (agreed, so that all ranks fail alike) and the group of each span G.
template <class CheckTensors>
std::map<std::int64_t, SpanningGroup> prepare_dilated(const char* where, const Communicator& group,
                                                      const DilatedConfig& config, CheckTensors&& check_tensors,
                                                      AttentionGeometry& geo) {
  group.checked(where, [&] {
    geo = check_tensors();
    dilated::check_config(where, geo, config);
    check_dilated_shards(where, geo.queries, group.size(), config);
  });
  std::vector<Communicator::Agreed> agreed = {{"q.extent(1) (tokens per rank)", geo.queries},
                                              {"q.extent(0)", geo.batch},
                                              {"q.extent(2)", geo.heads},
                                              {"config.mode", std::int64_t(config.mode)},
                                              {"config.segment_lengths.size()", std::int64_t(config.segment_lengths.size())}};
  std::int64_t lengths = 0, rates = 0;  // order-sensitive sums: equal configurations agree
  for (std::size_t i = 0; i < config.segment_lengths.size(); ++i) {
    lengths = lengths * 31 + config.segment_lengths[i];
    rates = rates * 31 + config.dilation_rates[i];
  }
  agreed.push_back({"config.segment_lengths", lengths});
  agreed.push_back({"config.dilation_rates", rates});
  group.require_same(where, agreed);
  std::map<std::int64_t, SpanningGroup> groups;
  const int me = group.rank();
  for (const std::int64_t w : config.segment_lengths) {
    const std::int64_t G = spanning_ranks(w, geo.queries, group.size());
    if (G > 0 && !groups.count(G)) groups.emplace(G, SpanningGroup{group.split(int(me / G), me), int(G), int(me % G)});
  }
  return groups;
}

// The pass's dilated tokens of this rank's shard in one batch entry: one run over the shard
// (the segment's local part), every rate-th token from the pass's offset.
inline dilated::SegmentRun shard_run(const dilated::Pass& pass, std::int64_t S) {
  return {0, 1, S / pass.rate};
}

template <class T, class Memory>
using Segments = Kokkos::View<T****, Kokkos::LayoutRight, Memory>;  // [B, tokens, heads, D]

// Packs the selected (strided) keys and values of every batch entry into [2][B][n][heads][D].
template <class ExecSpace, class K, class V, class Packed>
void pack_selection(const ExecSpace& exec, const K& k, const V& v, const dilated::Pass& pass,
                    const dilated::SegmentRun& run, const Packed& packed) {
  for (int b = 0; b < int(k.extent(0)); ++b) {
    const auto kb = Kokkos::subview(dilated::select_tokens(k, b, pass, run), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
    const auto vb = Kokkos::subview(dilated::select_tokens(v, b, pass, run), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
    Kokkos::deep_copy(exec, Kokkos::subview(packed, 0, b, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL), kb);
    Kokkos::deep_copy(exec, Kokkos::subview(packed, 1, b, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL), vb);
  }
}

// The whole dilated segment's K and V from the group's packed parts ([G][2][B][n][h][D]) as
// [B, G n, h, D] each.
template <class ExecSpace, class Gathered, class Out>
void unpack_segment(const ExecSpace& exec, const Gathered& gathered, int part, const Out& out) {
  const std::int64_t n = gathered.extent(3);
  for (std::int64_t g = 0; g < std::int64_t(gathered.extent(0)); ++g)
    Kokkos::deep_copy(exec, Kokkos::subview(out, Kokkos::ALL, Kokkos::make_pair(g * n, (g + 1) * n), Kokkos::ALL, Kokkos::ALL),
                      Kokkos::subview(gathered, g, part, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
}

template <class T, class Memory>
using Pooled6 = memory::PooledView<Kokkos::View<T******, Kokkos::LayoutRight, Memory>>;
template <class T, class Memory>
using Pooled5 = memory::PooledView<Kokkos::View<T*****, Kokkos::LayoutRight, Memory>>;
template <class T, class Memory>
using Pooled4 = memory::PooledView<Kokkos::View<T****, Kokkos::LayoutRight, Memory>>;

// A spanning pass's gathered segment: this rank's dilated K, V packed, all-gathered over the
// group and laid out as [B, w / r, heads, D] keys and values. Each buffer goes back to the pool
// as soon as the next holds its data, so that at most two segments' K and V are held (the
// gathered parts and the keys and values); the kernels that read a released block run on `exec`
// before any that reuses it.
template <class ExecSpace, class T, class K, class V>
auto gather_segment(const ExecutionContext<ExecSpace>& context, const SpanningGroup& spanning, const K& k, const V& v,
                    const dilated::Pass& pass, const dilated::SegmentRun& run) {
  using Memory = typename ExecSpace::memory_space;
  const ExecSpace& exec = context.exec();
  const auto& pool = context.pool();
  const int B = int(k.extent(0)), D = int(k.extent(3)), h = pass.head_count;
  const std::int64_t n = run.tokens, G = spanning.ranks;
  const memory::CategoryScope scope(memory::Category::communication_buffers);
  const Pooled6<T, Memory> all = [&] {
    const Pooled5<T, Memory> mine(pool, 2, B, n, h, D);
    pack_selection(exec, k, v, pass, run, mine.view());
    Pooled6<T, Memory> gathered(pool, G, 2, B, n, h, D);
    spanning.comm.all_gather(exec, mine.data(), gathered.data(), mine.size(), data_type_of<T>());
    return gathered;
  }();
  Pooled4<T, Memory> keys(pool, B, G * n, h, D), values(pool, B, G * n, h, D);
  unpack_segment(exec, all.view(), 0, keys.view());
  unpack_segment(exec, all.view(), 1, values.view());
  return std::make_pair(keys, values);
}

}  // namespace detail

template <class On, class Q, class K, class V, class O, class Lse>
void dilated_attention_forward(const On& on, const Communicator& group, const AttentionInputs<Q, K, V>& in,
                               const AttentionOutputs<O, Lse>& out, const DilatedConfig& config,
                               const AttentionOptions& opts = {}) {
  using ExecSpace = execution_space_of<On>;
  const auto& context = context_of(on);
  const ExecSpace& exec = context.exec();
  const Q& q = in.q;
  const K& k = in.k;
  const V& v = in.v;
  const O& o = out.o;
  const Lse& lse = out.lse;
  using T = longattn::scalar_of<Q>;
  const char* where = "longattn::parallel::dilated_attention_forward";
  AttentionGeometry geo;
  const auto groups = detail::prepare_dilated(
      where, group, config, [&] { return check_attention_forward<ExecSpace, T>(where, q, k, v, o, lse, opts); },
      geo);
  const std::int64_t S = geo.queries;
  AttentionOptions pass_opts = dilated::pass_options(opts, config);
  pass_opts.accumulate_output = true;
  Kokkos::deep_copy(exec, o, T(accumulate_t<T>(0)));
  Kokkos::deep_copy(exec, lse, -std::numeric_limits<accumulate_t<T>>::infinity());
  group.guarded(where, [&] {
    for (const dilated::Pass& pass : dilated::passes(config, geo.heads)) {
      const std::int64_t span = detail::spanning_ranks(pass.segment, S, group.size());
      if (span == 0) {  // local segments, as on one rank
        for (const dilated::SegmentRun& run : dilated::segment_runs(pass, S))
          for (int b = 0; b < geo.batch; ++b)
            attention_forward(context, dilated::select_tokens(q, b, pass, run),
                              dilated::select_tokens(k, b, pass, run),
                              dilated::select_tokens(v, b, pass, run),
                              dilated::select_tokens(o, b, pass, run),
                              dilated::select_rows(lse, b, pass, run), pass_opts);
        continue;
      }
      const detail::SpanningGroup& spanning = groups.at(span);
      const dilated::SegmentRun run = detail::shard_run(pass, S);
      const auto gathered = detail::gather_segment<ExecSpace, T>(context, spanning, k, v, pass, run);
      const auto& keys = gathered.first;
      const auto& values = gathered.second;
      AttentionOptions segment_opts = pass_opts;
      segment_opts.query_offset = std::int64_t(spanning.index) * run.tokens;  // in the dilated segment
      for (int b = 0; b < geo.batch; ++b) {
        const auto batch = Kokkos::make_pair(b, b + 1);
        attention_forward(context, dilated::select_tokens(q, b, pass, run),
                          Kokkos::subview(keys.view(), batch, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                          Kokkos::subview(values.view(), batch, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                          dilated::select_tokens(o, b, pass, run),
                          dilated::select_rows(lse, b, pass, run), segment_opts);
      }
      exec.fence();
    }
  });
}

template <class On, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
void dilated_attention_backward(const On& on, const Communicator& group, const AttentionInputs<Q, K, V>& in,
                                const AttentionOutputs<O, Lse>& out, const DO& d_o,
                                const AttentionGradients<DQ, DK, DV>& grad, const DilatedConfig& config,
                                const AttentionOptions& opts = {}) {
  using ExecSpace = execution_space_of<On>;
  using Memory = typename ExecSpace::memory_space;
  const auto& context = context_of(on);
  const ExecSpace& exec = context.exec();
  const Q& q = in.q;
  const K& k = in.k;
  const V& v = in.v;
  const O& o = out.o;
  const Lse& lse = out.lse;
  const DQ& dq = grad.dq;
  const DK& dk = grad.dk;
  const DV& dv = grad.dv;
  using T = longattn::scalar_of<Q>;
  const char* where = "longattn::parallel::dilated_attention_backward";
  AttentionGeometry geo;
  const auto groups = detail::prepare_dilated(
      where, group, config,
      [&] { return check_attention_backward<ExecSpace, T>(where, q, k, v, o, d_o, lse, dq, dk, dv, opts); }, geo);
  const std::int64_t S = geo.queries;
  AttentionOptions pass_opts = dilated::pass_options(opts, config);
  const T zero(accumulate_t<T>(0));
  if (!opts.accumulate_gradients) {
    Kokkos::deep_copy(exec, dq, zero);
    Kokkos::deep_copy(exec, dk, zero);
    Kokkos::deep_copy(exec, dv, zero);
  }
  pass_opts.accumulate_gradients = true;
  const auto& pool = context.pool();
  group.guarded(where, [&] {
    for (const dilated::Pass& pass : dilated::passes(config, geo.heads)) {
      const std::int64_t span = detail::spanning_ranks(pass.segment, S, group.size());
      if (span == 0) {
        for (const dilated::SegmentRun& run : dilated::segment_runs(pass, S))
          for (int b = 0; b < geo.batch; ++b)
            attention_backward(context, dilated::select_tokens(q, b, pass, run),
                               dilated::select_tokens(k, b, pass, run),
                               dilated::select_tokens(v, b, pass, run),
                               dilated::select_tokens(o, b, pass, run),
                               dilated::select_tokens(d_o, b, pass, run),
                               dilated::select_rows(lse, b, pass, run),
                               dilated::select_tokens(dq, b, pass, run),
                               dilated::select_tokens(dk, b, pass, run),
                               dilated::select_tokens(dv, b, pass, run), pass_opts);
        continue;
      }
      const detail::SpanningGroup& spanning = groups.at(span);
      const dilated::SegmentRun run = detail::shard_run(pass, S);
      const std::int64_t n = run.tokens, G = spanning.ranks;
      const int h = pass.head_count, D = geo.head_dim, B = geo.batch;
      // The gradients of the whole dilated segment's keys, from this rank's queries, laid out
      // rank by rank for the reduce-scatter. Each buffer goes back to the pool once the next
      // holds its data (the gathered K and V after the kernels, the gradients once copied), so
      // that at most two segments' K and V are held, as in the forward pass.
      const memory::CategoryScope scope(memory::Category::communication_buffers);
      const detail::Pooled6<T, Memory> parts = [&] {
        const auto [d_keys, d_values] = [&] {
          const auto gathered = detail::gather_segment<ExecSpace, T>(context, spanning, k, v, pass, run);
          const auto& keys = gathered.first;
          const auto& values = gathered.second;
          detail::Pooled4<T, Memory> d_k(pool, B, G * n, h, D), d_v(pool, B, G * n, h, D);
          Kokkos::deep_copy(exec, d_k.view(), zero);
          Kokkos::deep_copy(exec, d_v.view(), zero);
          AttentionOptions segment_opts = pass_opts;
          segment_opts.query_offset = std::int64_t(spanning.index) * n;
          for (int b = 0; b < B; ++b) {
            const auto batch = Kokkos::make_pair(b, b + 1);
            auto slice = [&](const auto& view) { return Kokkos::subview(view, batch, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL); };
            attention_backward(context, dilated::select_tokens(q, b, pass, run), slice(keys.view()),
                               slice(values.view()), dilated::select_tokens(o, b, pass, run),
                               dilated::select_tokens(d_o, b, pass, run),
                               dilated::select_rows(lse, b, pass, run),
                               dilated::select_tokens(dq, b, pass, run), slice(d_k.view()),
                               slice(d_v.view()), segment_opts);
          }
          return std::make_pair(d_k, d_v);
        }();
        detail::Pooled6<T, Memory> by_rank(pool, G, 2, B, n, h, D);
        for (std::int64_t g = 0; g < G; ++g) {
          const auto tokens = Kokkos::make_pair(g * n, (g + 1) * n);
          Kokkos::deep_copy(exec, Kokkos::subview(by_rank.view(), g, 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                            Kokkos::subview(d_keys.view(), Kokkos::ALL, tokens, Kokkos::ALL, Kokkos::ALL));
          Kokkos::deep_copy(exec, Kokkos::subview(by_rank.view(), g, 1, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                            Kokkos::subview(d_values.view(), Kokkos::ALL, tokens, Kokkos::ALL, Kokkos::ALL));
        }
        return by_rank;
      }();
      // Summed over the group and scattered back: each rank gets its own dilated tokens' part.
      const detail::Pooled5<T, Memory> mine(pool, 2, B, n, h, D);
      spanning.comm.reduce_scatter(exec, parts.data(), mine.data(), mine.size(), data_type_of<T>(), ReduceOp::sum);
      for (int b = 0; b < B; ++b) {
        const auto dk_b = Kokkos::subview(dilated::select_tokens(dk, b, pass, run), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
        const auto dv_b = Kokkos::subview(dilated::select_tokens(dv, b, pass, run), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
        const auto from_k = Kokkos::subview(mine.view(), 0, b, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
        const auto from_v = Kokkos::subview(mine.view(), 1, b, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
        Kokkos::parallel_for(
            "longattn::parallel::dilated_attention_backward::add",
            Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(exec, {0, 0, 0}, {dk_b.extent(0), dk_b.extent(1), dk_b.extent(2)}),
            KOKKOS_LAMBDA(int t, int head, int d) {  // in float for 16-bit storage
              using Wide = accumulate_t<T>;
              dk_b(t, head, d) = T(Wide(dk_b(t, head, d)) + Wide(from_k(t, head, d)));
              dv_b(t, head, d) = T(Wide(dv_b(t, head, d)) + Wide(from_v(t, head, d)));
            });
      }
      exec.fence();
    }
  });
}

}  // namespace longattn::parallel
