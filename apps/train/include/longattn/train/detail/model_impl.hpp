// Transformer's passes (model.hpp) and the kernels only it uses.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/core/layer_norm.hpp"
#include "longattn/core/linear.hpp"
#include "longattn/core/sequence_parallel.hpp"
#include "longattn/kokkos_compat.hpp"

namespace longattn::train {

namespace detail {

template <class ExecSpace>
using RangeOf = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;

// x[r] = tok[input[r]] + pos[position[r]], row r = (b, t); without learned positions (pos has
// no rows) x[r] = tok[input[r]].
template <class ExecSpace, class Ids, class Positions, class Matrix>
void embed_forward(const ExecSpace& exec, const Ids& inputs, const Positions& positions, const Matrix& tok,
                   const Matrix& pos, const Matrix& x) {
  const std::int64_t E = x.extent(1), n = inputs.extent(1);
  const bool learned = pos.extent(0) > 0;
  Kokkos::parallel_for(
      "longattn::train::embed_forward", RangeOf<ExecSpace>(exec, 0, std::int64_t(x.extent(0)) * E),
      KOKKOS_LAMBDA(std::int64_t i) {
        using T = typename Matrix::non_const_value_type;
        using A = accumulate_t<T>;
        const std::int64_t r = i / E, e = i % E;
        x(r, e) = T(A(tok(inputs(r / n, r % n), e)) + (learned ? A(pos(positions(r % n), e)) : A(0)));
      });
}

// The embeddings' gradients: one thread per column e walks the rows in order, so the sums are
// the same on every run (no atomics).
template <class ExecSpace, class Ids, class Positions, class Matrix, class GradientMatrix>
void embed_backward(const ExecSpace& exec, const Ids& inputs, const Positions& positions, const Matrix& dx,
                    const GradientMatrix& dtok, const GradientMatrix& dpos) {
  const std::int64_t R = dx.extent(0), n = inputs.extent(1);
  const bool learned = dpos.extent(0) > 0;  // else no position parameters (rotary)
  Kokkos::parallel_for(
      "longattn::train::embed_backward", Kokkos::RangePolicy<ExecSpace>(exec, 0, int(dx.extent(1))),
      KOKKOS_LAMBDA(int e) {
        using A = typename GradientMatrix::non_const_value_type;
        for (std::int64_t r = 0; r < R; ++r) {
          dtok(inputs(r / n, r % n), e) += A(dx(r, e));
          if (learned) dpos(positions(r % n), e) += A(dx(r, e));
        }
      });
}

// Returns sum_r w_r (logsumexp(logits_r) - logits_r[target_r]) and overwrites the logits with
// the loss's gradient times `scale`: w_r (softmax_r - onehot(target_r)) scale (computed in A).
template <class ExecSpace, class Matrix, class Ids, class Weights>
double cross_entropy(const ExecSpace& exec, const Matrix& logits, const Ids& targets, const Weights& weights,
                     double scale) {
  using T = typename Matrix::non_const_value_type;
  using A = accumulate_t<T>;
  const int V = int(logits.extent(1));
  const std::int64_t n = targets.extent(1);
  const A inverse = A(scale);
  double loss = 0;
  Kokkos::parallel_reduce(
      "longattn::train::cross_entropy", RangeOf<ExecSpace>(exec, 0, std::int64_t(logits.extent(0))),
      KOKKOS_LAMBDA(std::int64_t r, double& sum) {
        const int target = targets(r / n, r % n);
        const A w = A(weights(r / n, r % n));
        A max = A(logits(r, 0));
        for (int v = 1; v < V; ++v) max = A(logits(r, v)) > max ? A(logits(r, v)) : max;
        A total = 0;
        for (int v = 0; v < V; ++v) total += math::exp(A(logits(r, v)) - max);
        const A lse = max + math::log(total);
        sum += double(w) * double(lse - A(logits(r, target)));
        for (int v = 0; v < V; ++v)
          logits(r, v) = T(w * inverse * (math::exp(A(logits(r, v)) - lse) - (v == target ? A(1) : A(0))));
      },
      loss);
  return loss;
}

// Query-key scores per sequence over all heads that the spec computes (4 D FLOPs each, forward).
inline double attention_scores(const AttentionSpec& attention, std::int64_t N, int heads) {
  const AttentionSpec spec = resolve_attention_spec(attention, N);
  const double n = double(N);
  if (spec.kind == AttentionSpec::Kind::dilated) return dilated_attention_scores(N, heads, spec.dilated, true);
  if (spec.kind == AttentionSpec::Kind::block_sparse) {
    BlockSparseShape shape;
    shape.queries = shape.keys = N;
    const int blocks = shape.query_blocks();
    double kept = 0;
    if (spec.block_sparse.pattern == BlockSparsePattern::top_k) {
      for (int qb = 0; qb < blocks; ++qb) kept += double(std::min<std::int64_t>(spec.block_sparse.top_k, qb + 1));
    } else {
      kept = double(block_sparse_layout(Kokkos::DefaultHostExecutionSpace(), spec.block_sparse, shape, true).kept_blocks());
    }
    return heads * kept * shape.block * shape.block;
  }
  return heads * n * (n + 1) / 2;
}

}  // namespace detail

inline const char* to_string(Recompute recompute) {
  return recompute == Recompute::none ? "none" : recompute == Recompute::selective ? "selective" : "full";
}

inline Recompute parse_recompute(const std::string& text, const char* option) {
  for (const Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    if (text == to_string(r)) return r;
  throw_invalid_argument("longattn-train", option, "\"" + text + "\"", "one of none, selective, full");
}

inline const char* to_string(PositionEncoding positions) {
  return positions == PositionEncoding::learned ? "learned" : "rotary";
}

inline PositionEncoding parse_positions(const std::string& text, const char* option) {
  for (const PositionEncoding p : {PositionEncoding::learned, PositionEncoding::rotary})
    if (text == to_string(p)) return p;
  throw_invalid_argument("longattn-train", option, "\"" + text + "\"", "one of learned, rotary");
}

inline ModelShape named_model_shape(const std::string& name, const char* option) {
  if (name == "350m") return {24, 1024, 16};
  if (name == "1.3b") return {24, 2048, 16};
  throw_invalid_argument("longattn-train", option, "\"" + name + "\"", "one of 350m, 1.3b");
}

inline void validate(const ModelConfig& c) {
  const char* where = "longattn::train::ModelConfig";
  require(c.layers >= 1 && c.layers <= 1024, where, "layers", c.layers, "a count in [1, 1024]");
  require(c.heads >= 1, where, "heads", c.heads, "at least 1");
  require(c.embed >= 1 && c.embed % c.heads == 0, where, "embed", c.embed,
          "a positive multiple of heads = " + std::to_string(c.heads));
  require(c.context >= 2 && c.context <= (std::int64_t(1) << 24), where, "context", c.context,
          "a sequence length in [2, 16777216] tokens");
  require(c.positions == PositionEncoding::learned || (c.embed / c.heads) % 2 == 0, where, "embed / heads",
          c.embed / c.heads, "an even head dim with rotary positions (they turn features in pairs)");
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::initialize(std::uint64_t seed) {
  // GPT-2: N(0, 0.02) for embeddings and matrices, the second MLP matrix scaled by 1/sqrt(2 L)
  // (it adds into the residual stream once per layer); biases 0, LayerNorm gain 1, shift 0.
  // Split tensors are drawn whole, in the same order at every P, and cut to this rank's part.
  const auto host = Kokkos::create_mirror_view(values_.view());
  const std::size_t E = config_.embed, F = config_.hidden(), V = ModelConfig::vocab, N = config_.context;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.02);
  auto fill_split = [&](std::size_t at, const FeatureSplit& split, double scale) {
    std::vector<T> whole(split.whole_count());
    for (T& w : whole) w = T(normal(rng) * scale);
    split.extract(parts_, part_, whole.data(), &host(at));
  };
  auto fill_normal = [&](std::size_t at, std::size_t count, double scale) {
    fill_split(at, FeatureSplit::whole(count), scale);
  };
  auto fill = [&](std::size_t at, std::size_t count, double value) {
    for (std::size_t i = 0; i < count; ++i) host(at + i) = T(value);
  };
  auto fill_norm = [&](std::size_t at) {
    fill(at, E, 1);
    fill(at + E, E, 0);
  };
  fill_normal(embedding_.tokens, V * E, 1);
  if (learned_positions()) fill_normal(embedding_.positions, N * E, 1);
  for (const Block& b : blocks_) {
    fill_norm(b.ln1);
    fill_norm(b.ln2);
    fill_split(b.w1, FeatureSplit::by_rows(F, E), 1);
    fill(b.b1, local_hidden(), 0);
    fill_split(b.w2, FeatureSplit::by_columns(E, F), 1 / std::sqrt(2.0 * config_.layers));
    fill(b.b2, E, 0);
  }
  fill_norm(head_.ln);
  fill_normal(head_.w, V * E, 1);
  fill(head_.b, V, 0);
  Kokkos::deep_copy(context_.exec(), values_.view(), host);
  context_.exec().fence();  // host is freed on return
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::list_groups() {
  const std::size_t E = config_.embed, F = config_.hidden(), V = ModelConfig::vocab, N = config_.context;
  std::size_t stretch = 0;  // the stretch whose groups are listed (every one holds memory now)
  auto add = [&](const std::string& name, T* values, Accumulate* gradients, const FeatureSplit& split, bool decay,
                 bool sequence_partial) {
    if (stretches_[stretch].groups++ == 0) stretches_[stretch].first_group = int(groups_.size());
    group_offsets_.push_back(std::size_t(gradients - stretches_[stretch].gradients));
    groups_.push_back({name, values, gradients, split.part_count(parts_), decay, split, sequence_partial});
  };
  // Own tensors: whole ones outside the sublayers see only this rank's tokens under sequence
  // parallelism (b2's gradient comes from the gathered dy: whole).
  auto own = [&](const std::string& name, std::size_t offset, const FeatureSplit& split, bool decay,
                 bool outside_sublayers = true) {
    add(name, values_.data() + offset, own_gradient(offset), split, decay,
        sequence_parallel_ && outside_sublayers && !split.split());
  };
  using Split = FeatureSplit;
  own("head.norm", head_.ln, Split::whole(2 * E), false);
  own("head.weight", head_.w, Split::whole(V * E), true);
  own("head.bias", head_.b, Split::whole(V), false);
  for (int l = config_.layers - 1; l >= 0; --l) {
    const Block& b = blocks_[l];
    const std::string layer = "layer" + std::to_string(l) + ".";
    ++stretch;
    own(layer + "mlp.w2", b.w2, Split::by_columns(E, F), true);
    own(layer + "mlp.b2", b.b2, Split::whole(E), false, false);
    own(layer + "mlp.w1", b.w1, Split::by_rows(F, E), true);
    own(layer + "mlp.b1", b.b1, Split::by_rows(F, 1), false);
    own(layer + "norm2", b.ln2, Split::whole(2 * E), false);
    // The module's tensors, named in its flat buffer (multihead_attention.hpp); gamma and beta
    // lie one after the other, so the sub-norm's group is two blocks of [E] split by rows.
    const auto& w = b.attention->weights();
    const auto& g = b.attention->weight_gradients();
    const auto splits = b.attention->feature_splits();
    auto module = [&](const std::string& name, T* values, Accumulate* gradients, const Split& split, bool decay) {
      add(layer + name, values, gradients, split, decay, false);
    };
    module("attention.w_out", w.w_out.data(), g.w_out.data(), splits.w_out, true);
    module("attention.b_out", w.b_out.data(), g.b_out.data(), splits.b_out, false);
    module("attention.sub_norm", w.ln_gamma.data(), g.ln_gamma.data(), Split::by_rows(E, 1, 2), false);
    module("attention.w_qkv", w.w_qkv.data(), g.w_qkv.data(), splits.w_qkv, true);
    module("attention.b_qkv", w.b_qkv.data(), g.b_qkv.data(), splits.b_qkv, false);
    own(layer + "norm1", b.ln1, Split::whole(2 * E), false);
  }
  ++stretch;
  own("embedding.tokens", embedding_.tokens, Split::whole(V * E), false);
  if (learned_positions()) own("embedding.positions", embedding_.positions, Split::whole(N * E), false);
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::acquire_gradients(std::size_t s) {
  GradientStretch& stretch = stretches_[s];
  if (stretch.gradients != nullptr) return;  // held (kept memory: from construction on)
  const memory::CategoryScope scope(memory::Category::gradients);
  stretch.per_block = context_.template allocate<GradientFlat>(stretch.count());
  Kokkos::deep_copy(context_.exec(), stretch.per_block.view(), Accumulate(0));
  stretch.gradients = stretch.per_block.data();
  lend_gradients(stretch);
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::lend_gradients(const GradientStretch& stretch) {
  if (stretch.attention)
    stretch.attention->use_gradients(typename Attention::GradientFlat(stretch.gradients + stretch.own_count,
                                                                      stretch.attention->parameter_count()));
  for (int i = stretch.first_group; i < stretch.first_group + stretch.groups; ++i)
    groups_[std::size_t(i)].gradients = stretch.gradients + group_offsets_[std::size_t(i)];
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::release_gradients(std::size_t s) {
  if (gradient_memory_ == GradientMemory::kept) return;
  GradientStretch& stretch = stretches_[s];
  stretch.per_block = {};
  stretch.gradients = nullptr;
  for (int i = stretch.first_group; i < stretch.first_group + stretch.groups; ++i) groups_[std::size_t(i)].gradients = nullptr;
}

template <class ExecSpace, class T>
typename Transformer<ExecSpace, T>::Accumulate* Transformer<ExecSpace, T>::own_gradient(std::size_t offset) const {
  for (const GradientStretch& stretch : stretches_)
    if (offset >= stretch.own_begin && offset < stretch.own_begin + stretch.own_count)
      return stretch.gradients + (offset - stretch.own_begin);
  return nullptr;  // not reached: the stretches cover the own parameters
}

template <class ExecSpace, class T>
std::string Transformer<ExecSpace, T>::first_non_finite() const {
  const ExecSpace& exec = context_.exec();
  auto search = [&](const std::string& name, const auto& view) -> std::string {
    if (view.size() == 0) return "";
    const NonFinite bad = find_non_finite(exec, view);
    return bad.found ? name + " " + bad.describe() : "";
  };
  std::string found;
  for (auto g = groups_.rbegin(); found.empty() && g != groups_.rend(); ++g)
    found = search(g->name, VectorOf<const T>(g->values, g->count));
  for (std::size_t l = 0; found.empty() && l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    const std::string layer = "layer" + std::to_string(l) + ".";
    const std::pair<const char*, const Rows*> kept[] = {
        {"x (the block's input)", &b.x}, {"h1 (norm1(x))", &b.h1}, {"x2 (x + attention(h1))", &b.x2},
        {"h2 (norm2(x2))", &b.h2}, {"u (h2 w1 + b1)", &b.u}, {"g (gelu(u))", &b.g}};
    for (const auto& [name, rows] : kept)
      if (found.empty() && rows->data() != nullptr) found = search(layer + name, rows->view());
  }
  if (found.empty() && x_final_.data() != nullptr) found = search("final x (the last block's output)", x_final_.view());
  if (found.empty() && h_final_.data() != nullptr) found = search("final h (head.norm(x))", h_final_.view());
  if (found.empty() && logits_.data() != nullptr) found = search("logits", logits_.view());
  for (auto g = groups_.begin(); found.empty() && g != groups_.end() && g->gradients; ++g)
    found = search("the gradient of " + g->name, VectorOf<const Accumulate>(g->gradients, g->count));
  return found;
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::reserve(int batch, std::int64_t tokens) {
  if (batch == batch_ && tokens == tokens_) return;
  batch_ = tokens_ = 0;  // recorded once every buffer is there: a refusing pool leaves a retry possible
  // R rows of this rank's tokens (1/P of them under sequence parallelism), all_rows of all.
  const std::size_t all_rows = std::size_t(batch) * tokens, E = config_.embed, F = local_hidden(), V = ModelConfig::vocab;
  const std::size_t R = all_rows / std::size_t(sequence_parallel_ ? parts_ : 1);
  auto rows = [&](std::size_t count, std::size_t cols) {
    return context_.template allocate<typename Rows::view_type>(count, cols);
  };
  for (Block& b : blocks_) {
    release_activations(b);  // back to the pool before the new ones
    b.attention->release_activations();
    b.x = {};
  }
  x_final_ = h_final_ = logits_ = d_x_ = d_x2_ = d_h_ = d_hidden_ = {};
  norm_final_ = {};
  ones_ = {};
  {
    const memory::CategoryScope kept(memory::Category::activations);
    for (Block& b : blocks_) {
      b.x = rows(R, E);
      if (config_.recompute != Recompute::full) acquire_activations(b, R, all_rows);
    }
    x_final_ = rows(R, E), h_final_ = rows(R, E), logits_ = rows(R, V);
    norm_final_ = {context_.template allocate<typename Stats::view_type>(R),
                   context_.template allocate<typename Stats::view_type>(R)};
  }
  const memory::CategoryScope backward_only(memory::Category::workspaces);
  d_x_ = rows(R, E), d_x2_ = rows(R, E), d_h_ = rows(R, E), d_hidden_ = rows(all_rows, F);
  ones_ = context_.template allocate<Kokkos::View<T*, memory_space>>(all_rows);
  Kokkos::deep_copy(context_.exec(), ones_.view(), T(1.0));
  batch_ = batch;
  tokens_ = tokens;
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::acquire_activations(Block& b, std::size_t R, std::size_t all_rows) {
  if (b.h1.size() > 0) return;  // held
  const std::size_t E = config_.embed, F = local_hidden();
  auto rows = [&](std::size_t cols) {
    return context_.template allocate<typename Rows::view_type>(R, cols);
  };
  auto all = [&](std::size_t cols) {
    return context_.template allocate<typename Rows::view_type>(all_rows, cols);
  };
  auto stats = [&] {
    return LayerNormStats{context_.template allocate<typename Stats::view_type>(R),
                          context_.template allocate<typename Stats::view_type>(R)};
  };
  b.h1 = rows(E), b.x2 = rows(E), b.h2 = rows(E), b.u = all(F), b.g = all(F);
  b.norm1 = stats(), b.norm2 = stats();
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::release_activations(Block& b) {
  b.h1 = b.x2 = b.h2 = b.u = b.g = {};
  b.norm1 = b.norm2 = {};
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::linear_forward(const Matrix& x, std::size_t w, std::size_t b, const Matrix& y,
                                                Parallel parallel, const LinearEpilogue<Matrix>& after) const {
  const std::size_t in = x.extent(1), out = y.extent(1);
  const ExecSpace& exec = context_.exec();
  const bool summed = parallel == Parallel::row && features_;
  // Sequence parallelism: a column-parallel layer's input gathered whole, a row-parallel one's
  // partial output whole before it is reduce-scattered into y.
  const bool gather = sequence_parallel_ && parallel == Parallel::column;
  const bool scatter = sequence_parallel_ && parallel == Parallel::row;
  const memory::CategoryScope scope(memory::Category::communication_buffers);
  const Rows x_all = gather ? gathered(x) : Rows();
  const Rows y_all = scatter ? context_.template allocate<typename Rows::view_type>(x.extent(0), out) : Rows();
  const Matrix input = gather ? rows(x_all) : x, output = scatter ? rows(y_all) : y;
  // The product's epilogue takes the residual where y is whole on this rank (else it is added
  // after the sum or the scatter); the bias on one rank of a sum.
  const bool residual_after = summed || scatter;
  const auto bias = summed && part_ != 0 ? VectorOf<T>() : vector(values_, b, out);
  longattn::linear_forward(context_, input, matrix(values_, w, out, in), bias, output,
                           {residual_after ? Matrix() : after.residual, after.gelu});
  if (scatter) scattered(output, y);
  else if (summed) features_->sum(exec, y.data(), y.size());
  if (residual_after && after.residual.data()) add_into(exec, y, after.residual);
}

template <class ExecSpace, class T>
typename Transformer<ExecSpace, T>::Rows Transformer<ExecSpace, T>::gathered(const Matrix& shard) const {
  Rows whole = context_.template allocate<typename Rows::view_type>(shard.extent(0) * std::size_t(parts_), shard.extent(1));
  gather_sequence(context_, *features_, tokens3(shard), tokens3(whole));
  return whole;
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::scattered(const Matrix& partial, const Matrix& shard) const {
  reduce_scatter_sequence(context_, *features_, tokens3(partial), tokens3(shard));
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::linear_backward(const Matrix& x, const Matrix& dy, std::size_t w, std::size_t b,
                                                const Matrix& dx, Parallel parallel, const Matrix& gelu_input) const {
  const std::size_t in = x.extent(1), out = dy.extent(1);
  const ExecSpace& exec = context_.exec();
  // Sequence parallelism: a row-parallel layer's dy gathered whole; a column-parallel layer's
  // input gathered again and its partial dx whole before it is reduce-scattered into dx.
  const bool row = sequence_parallel_ && parallel == Parallel::row;
  const bool column = sequence_parallel_ && parallel == Parallel::column;
  const memory::CategoryScope scope(memory::Category::communication_buffers);
  const Rows dy_all = row ? gathered(dy) : Rows();
  const Rows x_all = column ? gathered(x) : Rows();
  const Rows dx_all = column ? context_.template allocate<typename Rows::view_type>(dy.extent(0), in) : Rows();
  const Matrix d_output = row ? rows(dy_all) : dy, input = column ? rows(x_all) : x, d_input = column ? rows(dx_all) : dx;
  add_column_sums(exec, d_output, ones_.view(), gradient_vector(b, out));
  gemm(context_, "T", "N", Accumulate(1), d_output, input, Accumulate(1), gradient_matrix(w, out, in));
  // GELU's input is whole on this rank where dx is (not a column-parallel layer's summed dx).
  require(!gelu_input.data() || parallel == Parallel::row, "longattn::train::Transformer::linear_backward",
          "gelu_input", "a matrix", "none but for a row-parallel layer");
  linear_input_gradient(context_, d_output, matrix(values_, w, out, in), d_input, gelu_input);
  if (column) scattered(d_input, dx);
  else if (parallel == Parallel::column && features_) features_->sum(exec, dx.data(), dx.size());
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::norm_forward(const Matrix& x, std::size_t ln, const Matrix& y, LayerNormStats& stats,
                                             const Matrix& residual) const {
  const std::size_t E = config_.embed;
  const auto gamma = vector(values_, ln, E), beta = vector(values_, ln + E, E);
  if (residual.data())
    residual_layer_norm_forward(context_.exec(), x, residual, gamma, beta, 1e-5, y, stats.mean.view(), stats.rstd.view());
  else
    layer_norm_forward(context_.exec(), x, gamma, beta, 1e-5, y, stats.mean.view(), stats.rstd.view());
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::norm_backward(const Matrix& dy, const Matrix& x, std::size_t ln,
                                              const LayerNormStats& stats, const Matrix& dx,
                                              const Matrix& residual) const {
  const std::size_t E = config_.embed;
  const auto gamma = vector(values_, ln, E);
  const auto dgamma = gradient_vector(ln, E), dbeta = gradient_vector(ln + E, E);
  if (residual.data())
    residual_layer_norm_backward(context_.exec(), dy, x, gamma, stats.mean.view(), stats.rstd.view(), residual, dx,
                                 dgamma, dbeta);
  else
    layer_norm_backward(context_.exec(), dy, x, gamma, stats.mean.view(), stats.rstd.view(), dx, dgamma, dbeta);
}

template <class ExecSpace, class T>
double Transformer<ExecSpace, T>::forward(const Batch& batch, double normalizer, double loss_scale) {
  const char* where = "longattn::train::Transformer::forward";
  const std::int64_t B = batch.inputs.extent(0), n = batch.inputs.extent(1);
  require(B >= 1 && n >= 1, where, "batch.inputs' extents", std::to_string(B) + " x " + std::to_string(n),
          "at least one sequence of at least one token");
  require(std::int64_t(batch.positions.extent(0)) == n, where, "batch.positions.extent(0)", batch.positions.extent(0),
          std::to_string(n) + " (the tokens per sequence)");
  require(batch.targets.extent(0) == batch.inputs.extent(0) && batch.targets.extent(1) == batch.inputs.extent(1) &&
              batch.weights.extent(0) == batch.inputs.extent(0) && batch.weights.extent(1) == batch.inputs.extent(1),
          where, "batch.targets / batch.weights", "other extents", "the extents of batch.inputs");
  require(normalizer > 0, where, "normalizer", normalizer, "a positive token count");
  require(loss_scale > 0 && std::isfinite(loss_scale), where, "loss_scale", loss_scale, "a positive finite factor");
  require(!sequence_parallel_ || n % parts_ == 0, where, "batch.inputs.extent(1)", n,
          "tokens per sequence divisible by the " + std::to_string(parts_) + " ranks that split them (sequence parallelism)");
  reserve(int(B), n);
  const memory::CategoryScope kept(memory::Category::activations);  // what forward keeps for backward
  batch_data_ = batch;
  const ExecSpace& exec = context_.exec();
  const std::size_t E = config_.embed, V = ModelConfig::vocab, N = config_.context;
  const auto mine = my_tokens(n);  // this rank's tokens of each sequence
  detail::embed_forward(exec, Kokkos::subview(batch.inputs, Kokkos::ALL, mine), Kokkos::subview(batch.positions, mine),
                        matrix(values_, embedding_.tokens, V, E),
                        matrix(values_, embedding_.positions, learned_positions() ? N : 0, E), rows(blocks_[0].x));
  const bool full = config_.recompute == Recompute::full;
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    const Matrix next = l + 1 < blocks_.size() ? rows(blocks_[l + 1].x) : rows(x_final_);
    // Under full recomputation a block's activations beyond its input are one block's working
    // set, forward and backward (the last block's stay for backward, which starts with it).
    const memory::CategoryScope scope(full ? memory::Category::workspaces : memory::Category::activations);
    if (full) acquire_activations(b, blocks_[0].x.extent(0), std::size_t(B) * n);
    block_forward(b, &next);
    if (full && l + 1 < blocks_.size()) {  // the last block's stay: backward starts with it
      release_activations(b);
      b.attention->release_activations();
    }
  }
  norm_forward(rows(x_final_), head_.ln, rows(h_final_), norm_final_);
  linear_forward(rows(h_final_), head_.w, head_.b, rows(logits_), Parallel::whole);
  return detail::cross_entropy(exec, rows(logits_), Kokkos::subview(batch.targets, Kokkos::ALL, mine),
                               Kokkos::subview(batch.weights, Kokkos::ALL, mine), loss_scale / normalizer) /
         normalizer;
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::block_forward(Block& b, const Matrix* next) {
  norm_forward(rows(b.x), b.ln1, rows(b.h1), b.norm1);
  // Rotary: the positions of all n tokens of the sequences (the module gathers them under
  // sequence parallelism).
  b.attention->forward(tokens3(b.h1), tokens3(b.x2), learned_positions() ? Positions() : batch_data_.positions);
  norm_forward(rows(b.x2), b.ln2, rows(b.h2), b.norm2, rows(b.x));  // x2 = attention + x, h2 = norm2(x2)
  linear_forward(rows(b.h2), b.w1, b.b1, rows(b.u), Parallel::column, {Matrix(), rows(b.g)});  // g = GELU(u)
  if (!next) return;
  linear_forward(rows(b.g), b.w2, b.b2, *next, Parallel::row, {rows(b.x2), Matrix()});  // next = x2 + MLP
}

template <class ExecSpace, class T>
void Transformer<ExecSpace, T>::backward(const std::function<void(int)>& ready) {
  require(batch_ > 0, "longattn::train::Transformer::backward", "this", "a model without a forward pass",
          "forward() before backward()");
  const ExecSpace& exec = context_.exec();
  // What backward takes from the pool lives only while it runs, recomputed activations included.
  const memory::CategoryScope scope(memory::Category::workspaces);
  int finished = 0;  // groups whose gradients are final, in groups_' order
  auto finish = [&](int count) {
    for (int i = 0; i < count; ++i, ++finished)
      if (ready) {
        exec.fence();
        ready(finished);
      }
  };
  const std::size_t E = config_.embed, V = ModelConfig::vocab, N = config_.context;
  std::size_t stretch = 0;  // whose gradients backward makes now (per-block memory: only this one held)
  acquire_gradients(stretch);
  // forward() left dLoss/dlogits in logits_.
  linear_backward(rows(h_final_), rows(logits_), head_.w, head_.b, rows(d_h_), Parallel::whole);
  norm_backward(rows(d_h_), rows(x_final_), head_.ln, norm_final_, rows(d_x_));
  finish(3);
  release_gradients(stretch);
  const bool full = config_.recompute == Recompute::full;
  for (std::size_t l = blocks_.size(); l-- > 0;) {
    Block& b = blocks_[l];
    if (full && b.h1.size() == 0) {  // this block's activations again, from its input
      acquire_activations(b, blocks_[0].x.extent(0), std::size_t(batch_) * tokens_);
      block_forward(b, nullptr);
    }
    acquire_gradients(++stretch);
    // d_x: the gradient of the block's output x2 + MLP(LN(x2)).
    linear_backward(rows(b.g), rows(d_x_), b.w2, b.b2, rows(d_hidden_), Parallel::row, rows(b.u));  // d_u
    linear_backward(rows(b.h2), rows(d_hidden_), b.w1, b.b1, rows(d_h_), Parallel::column);
    norm_backward(rows(d_h_), rows(b.x2), b.ln2, b.norm2, rows(d_x2_), rows(d_x_));  // + d_x around the MLP
    finish(5);
    b.attention->backward(tokens3(d_x2_), tokens3(d_h_));
    norm_backward(rows(d_h_), rows(b.x), b.ln1, b.norm1, rows(d_x_), rows(d_x2_));  // + d_x2 around the attention
    if (full) {
      release_activations(b);
      b.attention->release_activations();
    }
    finish(6);
    release_gradients(stretch);
  }
  acquire_gradients(++stretch);
  const auto mine = my_tokens(tokens_);
  detail::embed_backward(exec, Kokkos::subview(batch_data_.inputs, Kokkos::ALL, mine),
                         Kokkos::subview(batch_data_.positions, mine), rows(d_x_), gradient_matrix(embedding_.tokens, V, E),
                         learned_positions() ? gradient_matrix(embedding_.positions, N, E) : MatrixOf<Accumulate>());
  finish(learned_positions() ? 2 : 1);
  release_gradients(stretch);
  exec.fence();
}

template <class ExecSpace, class T>
double Transformer<ExecSpace, T>::flops_per_step(std::int64_t sequences) const {
  const double E = config_.embed, F = config_.hidden(), V = ModelConfig::vocab, N = double(config_.context);
  const double D = E / config_.heads, L = config_.layers;
  const double dense_per_token = L * 2 * (4 * E * E + 2 * E * F) + 2 * E * V;
  const double attention_per_sequence = L * 4 * D * detail::attention_scores(config_.attention, config_.context, config_.heads);
  return 3 * double(sequences) * (N * dense_per_token + attention_per_sequence);
}

}  // namespace longattn::train
