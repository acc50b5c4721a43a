// Dilated attention (LongNet), forward and backward, on the fused attention kernel:
//
//   dilated_attention_forward[<Tiles>](exec, q, k, v, o, lse, config[, opts])
//   dilated_attention_backward[<Tiles>](exec, q, k, v, o, d_o, lse, dq, dk, dv, config[, opts])
//
// Configuration i = (segment length w_i, dilation rate r_i), r_i dividing w_i. The sequence is
// cut into segments of w_i tokens (the last may be shorter); inside a segment the tokens at
// offset, offset + r_i, offset + 2 r_i, ... attend to each other (causally, in that order, when
// opts.causal). Two modes:
//   longnet      every head uses every configuration, head h with offset h mod r_i; the partial
//                results are merged by their softmax denominators (LongNet Eq. 10, merge_partial
//                on the LSEs); a (token, head) no configuration selects gets o = 0, lse = -inf.
//   head_groups  (dilated-attention-pytorch's semantics) heads are split into k groups, sizes as
//                equal as possible with the earlier groups one larger; group i uses configuration
//                i with offset i mod r_i; unselected tokens get zero; o is divided by k.
//
// Each (configuration, offset, heads) pass is the fused kernel on strided views: segments are
// the batch dimension, every r-th token a stride, the heads of an offset a head stride. Nothing
// is gathered or copied. Cost: per head and configuration about N w_i / r_i^2 scores, linear in N.
//
// lse: longnet, the log of the merged denominator (what backward needs); head_groups, that of
// the group's own softmax. Backward is exact: every pass recomputes its probabilities from the
// final lse and o (the merged softmax is one softmax over the union of the passes' keys), and
// adds its gradients into dq, dk, dv.
//
// Memory: forward in longnet mode with more than one configuration allocates one partial output
// and LSE (dilated_attention_workspace_bytes); backward allocates each pass's Delta (at most
// B * H * N values). q, k, v are one sequence (same token count), positions start at 0.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/merge_partial.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/error.hpp"

namespace longattn {

enum class DilatedMode { longnet, head_groups };

struct DilatedConfig {
  std::vector<std::int64_t> segment_lengths;  // w_i, tokens
  std::vector<std::int64_t> dilation_rates;   // r_i, dividing w_i
  DilatedMode mode = DilatedMode::longnet;
};

inline bool operator==(const DilatedConfig& a, const DilatedConfig& b) {
  return a.segment_lengths == b.segment_lengths && a.dilation_rates == b.dilation_rates && a.mode == b.mode;
}

inline const char* to_string(DilatedMode mode) {
  return mode == DilatedMode::longnet ? "longnet" : "head_groups";
}

// Throws longattn::Error (from `where`) naming the first invalid entry: lengths differ, empty,
// a value not positive or not below 2^30, r_i not dividing w_i, or (head_groups) fewer heads
// than configurations. heads = 0 skips the head check.
inline void validate_dilated_config(const DilatedConfig& config, int heads, const char* where) {
  const std::size_t count = config.segment_lengths.size();
  require(count > 0, where, "config.segment_lengths.size()", count, "at least one configuration");
  require(config.dilation_rates.size() == count, where, "config.dilation_rates.size()",
          config.dilation_rates.size(), std::to_string(count) + " (one rate per segment length)");
  constexpr std::int64_t limit = std::int64_t(1) << 30;
  for (std::size_t i = 0; i < count; ++i) {
    const std::string index = "[" + std::to_string(i) + "]";
    const std::int64_t w = config.segment_lengths[i], r = config.dilation_rates[i];
    require(w > 0 && w < limit, where, "config.segment_lengths" + index, w, "a token count in [1, 2^30)");
    require(r > 0 && r < limit, where, "config.dilation_rates" + index, r, "a rate in [1, 2^30)");
    require(w % r == 0, where, "config.dilation_rates" + index, r,
            "a divisor of config.segment_lengths" + index + " = " + std::to_string(w));
  }
  if (config.mode == DilatedMode::head_groups && heads > 0)
    require(std::size_t(heads) >= count, where, "heads", heads,
            "at least " + std::to_string(count) + " (one per configuration in head_groups mode)");
}

// The building blocks dilated attention is made of, public for code that composes them with
// its own communication (distributed dilated attention, parallel/dilated_attention.hpp): the
// passes of a configuration, the segment runs of a pass, and strided views of the tokens a run
// selects.
namespace dilated {

// One pass of the pattern: configuration (w, r), the token offset inside each segment, the
// heads it covers (first, first + step, ..., count of them).
struct Pass {
  int config;
  std::int64_t segment, rate, offset;
  int head_first, head_step, head_count;
};

// Every pass of `config` for `heads` heads, in configuration order.
inline std::vector<Pass> passes(const DilatedConfig& config, int heads) {
  std::vector<Pass> passes;
  const int count = static_cast<int>(config.segment_lengths.size());
  int group_first = 0;
  for (int i = 0; i < count; ++i) {
    const std::int64_t w = config.segment_lengths[i], r = config.dilation_rates[i];
    if (config.mode == DilatedMode::longnet) {
      // Heads h = offset, offset + r, ... share offset h mod r.
      for (std::int64_t offset = 0; offset < r && offset < heads; ++offset)
        passes.push_back({i, w, r, offset, int(offset), int(r), int((heads - offset + r - 1) / r)});
    } else {
      const int size = heads / count + (i < heads % count ? 1 : 0);
      passes.push_back({i, w, r, i % r, group_first, 1, size});
      group_first += size;
    }
  }
  return passes;
}

// The tokens of a pass, in one batch entry, as up to two runs of equal segments: the full
// segments, then the final short one. A run is [first token, segments, selected per segment].
struct SegmentRun {
  std::int64_t first, segments, tokens;
};

inline std::vector<SegmentRun> segment_runs(const Pass& pass, std::int64_t tokens) {
  std::vector<SegmentRun> runs;
  const std::int64_t full = tokens / pass.segment, tail = tokens - full * pass.segment;
  if (full > 0) runs.push_back({0, full, pass.segment / pass.rate});
  if (tail > pass.offset) runs.push_back({full * pass.segment, 1, (tail - pass.offset + pass.rate - 1) / pass.rate});
  return runs;
}

// Query-key scores one pass computes in a batch entry of `tokens` tokens, over its heads.
inline double pass_scores(const Pass& pass, std::int64_t tokens, bool causal) {
  double scores = 0;
  for (const SegmentRun& run : segment_runs(pass, tokens)) {
    const double n = double(run.tokens);
    scores += double(run.segments) * pass.head_count * (causal ? n * (n + 1) / 2 : n * n);
  }
  return scores;
}

template <class View>
using StridedView = Kokkos::View<typename View::value_type****, Kokkos::LayoutStride,
                                 typename View::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class View>
using StridedRows = Kokkos::View<typename View::value_type***, Kokkos::LayoutStride,
                                 typename View::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// x [B, N, H, D] -> the run's tokens of batch entry b and the pass's heads, as
// [segments, selected tokens, heads, D]: a view, no copy.
// The first element is found by its offset, not by x(...): the host may not touch device memory.
template <class View>
StridedView<View> select_tokens(const View& x, int b, const Pass& pass, const SegmentRun& run) {
  const std::size_t token_stride = x.stride(1);
  return StridedView<View>(x.data() + b * x.stride(0) + (run.first + pass.offset) * token_stride +
                               pass.head_first * x.stride(2),
                           Kokkos::LayoutStride(run.segments, pass.segment * token_stride, run.tokens,
                                                pass.rate * token_stride, pass.head_count,
                                                pass.head_step * x.stride(2), x.extent(3), x.stride(3)));
}

// lse [B, H, N] -> the same selection as [segments, heads, selected tokens].
template <class View>
StridedRows<View> select_rows(const View& lse, int b, const Pass& pass, const SegmentRun& run) {
  const std::size_t token_stride = lse.stride(2);
  return StridedRows<View>(lse.data() + b * lse.stride(0) + pass.head_first * lse.stride(1) +
                               (run.first + pass.offset) * token_stride,
                           Kokkos::LayoutStride(run.segments, pass.segment * token_stride, pass.head_count,
                                                pass.head_step * lse.stride(1), run.tokens,
                                                pass.rate * token_stride));
}

// Calls f(pass, run, b) for every pass, batch entry and segment run, in pass order.
template <class F>
void for_each_run(const std::vector<Pass>& passes, int batch, std::int64_t tokens, F&& f) {
  for (const Pass& pass : passes)
    for (const SegmentRun& run : segment_runs(pass, tokens))
      for (int b = 0; b < batch; ++b) f(pass, run, b);
}

// The checks dilated attention adds to the kernel's: one sequence, positions from 0, a valid
// configuration for these heads.
inline void check_config(const char* where, const AttentionGeometry& geo, const DilatedConfig& config) {
  require(geo.keys == geo.queries, where, "k.extent(1)", geo.keys,
          std::to_string(geo.queries) + " (q's token count: dilated attention is self-attention over one sequence)");
  require(geo.query_offset == 0, where, "opts.query_offset", geo.query_offset, "0 (segments start at token 0)");
  require(geo.key_offset == 0, where, "opts.key_offset", geo.key_offset, "0 (segments start at token 0)");
  validate_dilated_config(config, geo.heads, where);
}

// The options every pass runs with: head_groups divides o by the number of groups.
inline AttentionOptions pass_options(const AttentionOptions& opts, const DilatedConfig& config) {
  AttentionOptions pass = opts;
  if (config.mode == DilatedMode::head_groups) pass.output_scale /= double(config.segment_lengths.size());
  return pass;
}

}  // namespace dilated

// Bytes the forward pass allocates (the partial output and LSE of longnet's merge).
template <class T>
std::size_t dilated_attention_workspace_bytes(int batch, std::int64_t tokens, int heads, int head_dim,
                                              const DilatedConfig& config) {
  const char* where = "longattn::dilated_attention_workspace_bytes";
  require(batch >= 0, where, "batch", batch, "a count >= 0");
  require(tokens >= 0, where, "tokens", tokens, "a count >= 0");
  require(heads >= 0, where, "heads", heads, "a count >= 0");
  require(head_dim >= 0, where, "head_dim", head_dim, "a count >= 0");
  if (config.mode != DilatedMode::longnet || config.segment_lengths.size() < 2) return 0;
  return std::size_t(batch) * tokens * heads * (head_dim * sizeof(T) + sizeof(accumulate_t<T>));
}

// Query-key scores the pattern computes per batch entry, over all heads (4 * head_dim flops each
// in the forward pass): the work actually done, for FLOP rates and planning.
inline double dilated_attention_scores(std::int64_t tokens, int heads, const DilatedConfig& config, bool causal) {
  const char* where = "longattn::dilated_attention_scores";
  require(tokens >= 0, where, "tokens", tokens, "a count >= 0");
  require(heads >= 1, where, "heads", heads, "at least 1");
  validate_dilated_config(config, heads, where);
  double scores = 0;
  for (const dilated::Pass& pass : dilated::passes(config, heads)) scores += dilated::pass_scores(pass, tokens, causal);
  return scores;
}

// ---------------------------------------------------------------------------------------------
// `on`: an execution space instance, or an ExecutionContext whose pool the partial results come from.
template <class Tiles = DefaultTiles, class On, class Q, class K, class V, class O, class Lse>
void dilated_attention_forward(const On& on, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                               const DilatedConfig& config, const AttentionOptions& opts = {}) {
  using ExecSpace = execution_space_of<On>;
  using T = longattn::scalar_of<Q>;
  const char* where = "longattn::dilated_attention_forward";
  const AttentionGeometry geo = check_attention_forward<ExecSpace, T>(where, q, k, v, o, lse, opts);
  dilated::check_config(where, geo, config);
  if constexpr (detail::runnable_attention<T, Lse, K, V, O>) {
    const auto& context = context_of(on);
    const ExecSpace& exec = context.exec();
    const std::vector<dilated::Pass> passes = dilated::passes(config, geo.heads);
    const AttentionOptions pass_opts = dilated::pass_options(opts, config);
    // longnet's first configuration and every head group write o and lse directly; (token, head)
    // pairs they leave unselected (r > 1) start as "no key seen": o = 0, lse = -inf.
    bool unselected = config.dilation_rates[0] > 1;
    if (config.mode == DilatedMode::head_groups)
      for (const std::int64_t rate : config.dilation_rates) unselected = unselected || rate > 1;
    if (unselected) {
      Kokkos::deep_copy(exec, o, T(0.0));
      Kokkos::deep_copy(exec, lse, detail::minus_infinity<accumulate_t<T>>());
    }
    const bool merged = config.mode == DilatedMode::longnet && passes.back().config > 0;
    using Memory = typename ExecSpace::memory_space;
    memory::PooledView<Kokkos::View<T****, Kokkos::LayoutRight, Memory>> o_part_memory;
    memory::PooledView<Kokkos::View<accumulate_t<T>***, Kokkos::LayoutRight, Memory>> lse_part_memory;
    if (merged) {
      const memory::CategoryScope scope(memory::Category::workspaces);
      o_part_memory = context.template allocate<Kokkos::View<T****, Kokkos::LayoutRight, Memory>>(
          geo.batch, geo.queries, geo.heads, geo.head_dim);
      lse_part_memory = context.template allocate<Kokkos::View<accumulate_t<T>***, Kokkos::LayoutRight, Memory>>(
          geo.batch, geo.heads, geo.queries);
    }
    const auto& o_part = o_part_memory.view();
    const auto& lse_part = lse_part_memory.view();
    dilated::for_each_run(passes, geo.batch, geo.queries, [&](const dilated::Pass& pass,
                                                                     const dilated::SegmentRun& run, int b) {
      const auto q_run = dilated::select_tokens(q, b, pass, run);
      const auto k_run = dilated::select_tokens(k, b, pass, run);
      const auto v_run = dilated::select_tokens(v, b, pass, run);
      const auto o_run = dilated::select_tokens(o, b, pass, run);
      const auto lse_run = dilated::select_rows(lse, b, pass, run);
      if (config.mode == DilatedMode::head_groups || pass.config == 0) {
        attention_forward<Tiles>(context, q_run, k_run, v_run, o_run, lse_run, pass_opts);
      } else {
        const auto o_part_run = dilated::select_tokens(o_part, b, pass, run);
        const auto lse_part_run = dilated::select_rows(lse_part, b, pass, run);
        attention_forward<Tiles>(context, q_run, k_run, v_run, o_part_run, lse_part_run, pass_opts);
        merge_partial(exec, o_run, lse_run, o_part_run, lse_part_run);
      }
    });
  }
}

// Gradients of sum(d_o * o) for the o that dilated_attention_forward returned with this lse.
// Written into dq, dk, dv, or added to them with opts.accumulate_gradients.
template <class Tiles = DefaultTiles, class On, class Q, class K, class V, class O, class DO, class Lse, class DQ,
          class DK, class DV>
void dilated_attention_backward(const On& on, const Q& q, const K& k, const V& v, const O& o, const DO& d_o,
                                const Lse& lse, const DQ& dq, const DK& dk, const DV& dv, const DilatedConfig& config,
                                const AttentionOptions& opts = {}) {
  using ExecSpace = execution_space_of<On>;
  using T = longattn::scalar_of<Q>;
  const char* where = "longattn::dilated_attention_backward";
  const AttentionGeometry geo =
      check_attention_backward<ExecSpace, T>(where, q, k, v, o, d_o, lse, dq, dk, dv, opts);
  dilated::check_config(where, geo, config);
  if constexpr (detail::runnable_attention<T, Lse, K, V, O, DO, DQ, DK, DV>) {
    const auto& context = context_of(on);
    const ExecSpace& exec = context.exec();
    if (!opts.accumulate_gradients) {
      Kokkos::deep_copy(exec, dq, T(0.0));
      Kokkos::deep_copy(exec, dk, T(0.0));
      Kokkos::deep_copy(exec, dv, T(0.0));
    }
    AttentionOptions pass_opts = dilated::pass_options(opts, config);
    pass_opts.accumulate_gradients = true;  // a token's passes sum their gradients
    dilated::for_each_run(dilated::passes(config, geo.heads), geo.batch, geo.queries,
                          [&](const dilated::Pass& pass, const dilated::SegmentRun& run, int b) {
                            attention_backward<Tiles>(
                                context, dilated::select_tokens(q, b, pass, run),
                                dilated::select_tokens(k, b, pass, run), dilated::select_tokens(v, b, pass, run),
                                dilated::select_tokens(o, b, pass, run), dilated::select_tokens(d_o, b, pass, run),
                                dilated::select_rows(lse, b, pass, run), dilated::select_tokens(dq, b, pass, run),
                                dilated::select_tokens(dk, b, pass, run), dilated::select_tokens(dv, b, pass, run),
                                pass_opts);
                          });
  }
}

}  // namespace longattn
