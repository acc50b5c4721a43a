// MultiheadAttention: the self-attention layer of a transformer block, forward and backward.
//
//   x [B, N, E] -> Q, K, V = x W_i^T + b_i   (i = q, k, v; each [B, N, E] = [B, N, H, D])
//               -> Q, K turned by their positions (options.rotary: rotary.hpp; no parameters)
//               -> A = attention(Q, K, V)    (dense, dilated or auto: the module's AttentionSpec)
//               -> Z = LayerNorm(A)          (MAGNETO's sub-LayerNorm; optional, on by default)
//               -> y = Z W_out^T + b_out
//
// Parameters live in one flat buffer (parameters(), gradients(): what an optimizer or an
// all-reduce walks), in this order: W_qkv [3E, E] (rows q, then k, then v), b_qkv [3E],
// W_out [E, E], b_out [E], and with the sub-LayerNorm gamma [E], beta [E]. Initialization as
// MAGNETO: W_q, W_k Xavier-normal with gain 1, W_v and W_out with gain gamma_init, biases 0,
// gamma 1, beta 0 (a seeded host generator: the same seed gives the same weights everywhere).
//
// forward() keeps the activations backward() needs (Q, K, V, A, LSE, Z and the LayerNorm
// statistics: activation_bytes()), and a handle to x: x must be unchanged until backward().
// With options.recompute_attention it keeps only Q, K and V, and backward() runs the attention
// and the sub-LayerNorm forward again (selective recomputation: the same values, so the same
// gradients). release_activations() drops everything kept (full recomputation by the caller:
// forward() again before backward()). backward() takes its own buffers from the pool for its
// duration, writes dx and adds the parameters' gradients into gradients() (zero_gradients()
// clears them), so micro-batches accumulate. The gradients are the module's own buffer, or with
// options.own_gradients = false memory the caller lends with use_gradients() (a model that holds
// gradients only while backward makes them, as ZeRO 2 does). Projections are Kokkos Kernels gemm calls. The
// module runs in the ExecutionContext it is made with (execution_context.hpp): every kernel and
// gemm on its instance, parameters, activations and workspaces from its pool (without one: the
// space's default instance and pool). Inputs are contiguous LayoutRight views.
// set_attention_runner() replaces how the attention step runs (attention_runner.hpp): ring
// attention over a context-parallel group, where x holds this rank's shard of the sequence.
// With options.rotary, forward() takes the positions of x's tokens (global positions where x is a
// shard of a longer sequence; default 0 .. N-1) and keeps a handle to them until backward(), which
// turns dQ and dK back before the projections' gradients.
//
// Tensor parallelism (Megatron-LM), given a FeatureGroup of P ranks (feature_group.hpp): rank p
// holds heads [p H/P, (p + 1) H/P) and so features F = E/P of them. W_qkv is column-parallel (its
// q, k and v rows of those features: [3F, E], b_qkv [3F]), W_out row-parallel (its columns of
// them: [E, F]), the sub-LayerNorm's gamma and beta [F] with row statistics summed over the
// group; b_out [E] is whole on every rank. Forward sums the output projection's partial products
// over the group (b_out added once), backward the input's partial gradients dx: two all-reduces
// of [B N, E] and three of row statistics per pass. x and y, dy and dx are whole [B, N, E] on
// every rank. The weights are the whole layer's, seeded alike, cut to the rank's part
// (feature_splits() says how), so P ranks compute what one does.
//
// Sequence parallelism (Korthikanti et al., 2022; options.sequence_parallel, with a group): x
// and y, dy and dx hold this rank's tokens of each sequence, [B, n / P, E], rank p tokens
// [p n / P, (p + 1) n / P) of the n. Forward all-gathers x into the whole [B, n, E] (into pool
// memory, given back after) and reduce-scatters the output projection's partial products into
// y instead of all-reducing them; backward all-gathers dy and x again and reduce-scatters dx.
// The same bytes move as without it; what the caller keeps between layers is 1/P of the tokens.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/attention_runner.hpp"
#include "longattn/core/attention_spec.hpp"
#include "longattn/core/feature_group.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/layer_norm.hpp"
#include "longattn/core/linear.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/rotary.hpp"
#include "longattn/core/sequence_parallel.hpp"
#include "longattn/error.hpp"

namespace longattn {

struct MultiheadAttentionOptions {
  AttentionSpec attention;          // dense unless set (parse_attention_spec reads the text form)
  bool causal = false;
  bool sub_layer_norm = true;       // MAGNETO's LayerNorm before the output projection
  double layer_norm_eps = 1e-5;
  double gamma_init = 1.0;          // MAGNETO's gain for W_v and W_out (depends on the model's depth)
  std::uint64_t seed = 0;           // weight initialization
  bool recompute_attention = false; // keep Q, K, V only; backward() recomputes A, LSE and Z
  bool own_gradients = true;        // false: no gradient buffer; the caller lends one (use_gradients)
  bool sequence_parallel = false;   // with a group: x, y, dy, dx hold this rank's tokens (above)
  bool rotary = false;              // rotary position embeddings on Q and K (rotary.hpp; even head dim)
  double rotary_base = rotary_default_base;  // the base of their angles
};

namespace detail {
// view(t) = t (here, not in the class: nvcc refuses a lambda in a private member function).
template <class ExecSpace, class View>
void fill_counting(const ExecSpace& exec, const View& view) {
  Kokkos::parallel_for(
      "longattn::fill_counting", Kokkos::RangePolicy<ExecSpace>(exec, 0, int(view.extent(0))),
      KOKKOS_LAMBDA(int t) { view(t) = t; });
}
}  // namespace detail

template <class ExecSpace, class T = float>
class MultiheadAttention {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T>,
                "MultiheadAttention<ExecSpace, T>: T is float, double, bfloat16 or float16");

 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using Context = ExecutionContext<ExecSpace>;
  using Accumulate = accumulate_t<T>;  // sums, statistics, LSE and gradients: float for 16-bit T
  using Tokens = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;  // [B, N, E]
  using ConstTokens = Kokkos::View<const T***, Kokkos::LayoutRight, memory_space>;
  using Flat = Kokkos::View<T*, memory_space>;
  using GradientFlat = Kokkos::View<Accumulate*, memory_space>;
  using Positions = Kokkos::View<const int*, memory_space>;  // [N]: each token's position (rotary)

  // Named views into parameters() (of T) or gradients() (of Accumulate); F = E / P features of
  // this rank (E without tensor parallelism).
  template <class Value>
  struct TensorsOf {
    using Vector = Kokkos::View<Value*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using Matrix = Kokkos::View<Value**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Matrix w_qkv;  // [3F, E]
    Vector b_qkv;  // [3F]
    Matrix w_out;  // [E, F]
    Vector b_out;  // [E]
    Vector ln_gamma, ln_beta;  // [F], or empty without the sub-LayerNorm
  };
  // How each tensor of TensorsOf is this rank's part of the whole layer's.
  struct Splits {
    FeatureSplit w_qkv, b_qkv, w_out, b_out, ln_gamma, ln_beta;
  };
  using Tensors = TensorsOf<T>;
  using GradientTensors = TensorsOf<Accumulate>;
  using Vector = typename Tensors::Vector;
  using Matrix = typename Tensors::Matrix;

  using Features = FeatureGroup<ExecSpace>;

  // `features`: the tensor-parallel group this rank holds a part of the layer for; nullptr (or a
  // group of one): all of it.
  MultiheadAttention(const Context& context, int embed_dim, int heads, const MultiheadAttentionOptions& options = {},
                     std::shared_ptr<const Features> features = nullptr)
      : context_(context), embed_dim_(embed_dim), heads_(heads), options_(options),
        runner_(std::make_shared<LocalAttention<ExecSpace, T>>(options.attention, options.causal)),
        features_(features && features->size() > 1 ? std::move(features) : nullptr),
        parts_(features_ ? features_->size() : 1), part_(features_ ? features_->rank() : 0) {
    const char* where = "longattn::MultiheadAttention";
    require(heads > 0, where, "heads", heads, "at least 1");
    require(heads % parts_ == 0, where, "heads", heads,
            "a multiple of the " + std::to_string(parts_) + " ranks of the tensor-parallel group");
    require(options.attention.kind != AttentionSpec::Kind::dilated || parts_ == 1, where, "options.attention",
            to_string(options.attention),
            "dense or block-sparse attention under tensor parallelism (dilated attention's offsets follow the "
            "head index over all heads)");
    require(embed_dim > 0 && embed_dim % heads == 0, where, "embed_dim", embed_dim,
            "a positive multiple of heads = " + std::to_string(heads));
    require(embed_dim / heads <= attention_max_head_dim, where, "embed_dim / heads", embed_dim / heads,
            "a head dim of at most " + std::to_string(attention_max_head_dim));
    require(options.layer_norm_eps > 0 && std::isfinite(options.layer_norm_eps), where, "options.layer_norm_eps",
            options.layer_norm_eps, "a positive finite number");
    require(options.gamma_init > 0 && std::isfinite(options.gamma_init), where, "options.gamma_init",
            options.gamma_init, "a positive finite number");
    require(!options.rotary || (embed_dim / heads) % 2 == 0, where, "embed_dim / heads", embed_dim / heads,
            "an even head dim with options.rotary (rotary embeddings turn features in pairs)");
    require(!options.rotary || (options.rotary_base > 1 && std::isfinite(options.rotary_base)), where,
            "options.rotary_base", options.rotary_base, "a finite number above 1");
    if (options.attention.kind == AttentionSpec::Kind::dilated)
      validate_dilated_config(options.attention.dilated, heads, where);
    {
      const memory::CategoryScope scope(memory::Category::parameters);
      parameters_ = context_.template allocate<Flat>(parameter_count());
    }
    weights_ = carve(parameters_.view());
    initialize_parameters();
    if (options.own_gradients) {
      const memory::CategoryScope scope(memory::Category::gradients);
      own_gradients_ = context_.template allocate<GradientFlat>(parameter_count());
      use_gradients(own_gradients_.view());
      zero_gradients();
    }
  }

  // In the space's default instance and pool.
  MultiheadAttention(int embed_dim, int heads, const MultiheadAttentionOptions& options = {})
      : MultiheadAttention(Context(), embed_dim, heads, options) {}

  MultiheadAttention(const MultiheadAttention&) = delete;  // parameters are owned, not shared
  MultiheadAttention& operator=(const MultiheadAttention&) = delete;
  MultiheadAttention(MultiheadAttention&&) = default;
  MultiheadAttention& operator=(MultiheadAttention&&) = default;

  int embed_dim() const { return embed_dim_; }
  int heads() const { return heads_; }
  int head_dim() const { return embed_dim_ / heads_; }
  int local_heads() const { return heads_ / parts_; }          // this rank's (all without a group)
  int local_features() const { return local_heads() * head_dim(); }
  const std::shared_ptr<const Features>& features() const { return features_; }
  Splits feature_splits() const {
    const std::size_t E = embed_dim_;
    const bool norm = options_.sub_layer_norm;
    return {FeatureSplit::by_rows(E, E, 3), FeatureSplit::by_rows(E, 1, 3), FeatureSplit::by_columns(E, E),
            FeatureSplit::whole(E), FeatureSplit::by_rows(norm ? E : 0, 1), FeatureSplit::by_rows(norm ? E : 0, 1)};
  }
  const AttentionSpec& attention() const { return options_.attention; }
  const MultiheadAttentionOptions& options() const { return options_; }
  const Context& context() const { return context_; }

  using Runner = AttentionRunner<ExecSpace, T>;
  // The runner must run this module's attention (spec and causal setting).
  void set_attention_runner(std::shared_ptr<Runner> runner) {
    const char* where = "longattn::MultiheadAttention::set_attention_runner";
    require(runner != nullptr, where, "runner", "nullptr", "an AttentionRunner");
    require(runner->spec() == options_.attention, where, "runner->spec()", to_string(runner->spec()),
            "the module's attention, " + to_string(options_.attention));
    require(runner->causal() == options_.causal, where, "runner->causal()", runner->causal() ? "true" : "false",
            std::string("the module's causal setting, ") + (options_.causal ? "true" : "false"));
    runner_ = std::move(runner);
  }
  const std::shared_ptr<Runner>& attention_runner() const { return runner_; }

  // This rank's parameters (the whole layer's without a group).
  std::size_t parameter_count() const {
    const std::size_t E = embed_dim_, F = local_features();
    return 4 * F * E + 3 * F + E + (options_.sub_layer_norm ? 2 * F : 0);
  }
  // Views of the module's memory (from the context's pool): valid while the module lives.
  Flat parameters() const { return parameters_; }
  GradientFlat gradients() const { return gradients_; }  // empty until use_gradients() without own_gradients
  const Tensors& weights() const { return weights_; }
  const GradientTensors& weight_gradients() const { return weight_gradients_; }

  void zero_gradients() { Kokkos::deep_copy(context_.exec(), gradients_, Accumulate(0)); }

  // backward() adds the gradients into `storage` from now on: parameter_count() elements of
  // memory_space that stay valid while backward() runs (not cleared here). The module's own
  // buffer, if any, goes back to the pool.
  void use_gradients(const GradientFlat& storage) {
    require(storage.size() == parameter_count() && storage.span_is_contiguous(),
            "longattn::MultiheadAttention::use_gradients", "storage", storage.size(),
            std::to_string(parameter_count()) + " contiguous elements (parameter_count())");
    if (own_gradients_.data() != storage.data()) own_gradients_ = {};
    gradients_ = storage;
    weight_gradients_ = carve(gradients_);
  }

  // Bytes forward() keeps for backward(), for B sequences of N tokens: Q, K, V and a column of
  // ones, and unless options.recompute_attention the attention's outputs (A, LSE, Z, statistics).
  std::size_t activation_bytes(int batch, std::int64_t tokens) const {
    const std::size_t rows = checked_rows("longattn::MultiheadAttention::activation_bytes", batch, tokens);
    return sizeof(T) * (3 * rows * local_features() + rows) + (options_.recompute_attention ? 0 : output_bytes(rows));
  }
  // Bytes backward() takes from the pool while it runs (and gives back): the gradients of the
  // projections' inputs and outputs, and under options.recompute_attention the recomputed outputs.
  std::size_t backward_workspace_bytes(int batch, std::int64_t tokens) const {
    const std::size_t rows = checked_rows("longattn::MultiheadAttention::backward_workspace_bytes", batch, tokens);
    const std::size_t F = local_features();
    return sizeof(T) * (rows * F + 3 * rows * F + (options_.sub_layer_norm ? rows * F : 0)) +
           (options_.recompute_attention ? output_bytes(rows) : 0);
  }

  // Gives every activation back to the pool; backward() then needs a forward() first.
  void release_activations() {
    release_outputs();
    x_ = {};
    positions_ = {};
    qkv_ = {};
    ones_ = {};
    batch_ = 0;
    tokens_ = 0;
  }

  // Whether x, y, dy and dx hold this rank's tokens only (options.sequence_parallel with a group).
  bool sequence_parallel() const { return features_ && options_.sequence_parallel; }

  // `positions` (options.rotary only; empty: 0 .. N-1): [N] for the N tokens of each sequence
  // the attention sees, all of them under sequence parallelism; unchanged until backward().
  void forward(const ConstTokens& x, const Tokens& y, const Positions& positions = {}) {
    const char* where = "longattn::MultiheadAttention::forward";
    check_tokens(where, "x", x, x.extent(0), x.extent(1));
    check_tokens(where, "y", y, x.extent(0), x.extent(1));
    check_no_alias(where, "y", y, "x", x);
    const ExecSpace& exec = context_.exec();
    const int shards = sequence_parallel() ? parts_ : 1;
    const std::int64_t tokens = std::int64_t(x.extent(1)) * shards;
    require(options_.rotary || positions.size() == 0, where, "positions", "a view of " + std::to_string(positions.size()),
            "none without options.rotary (positions only turn Q and K)");
    if (positions.size() > 0)
      check_extents(where, "positions", positions, {tokens},
                    sequence_parallel() ? "[tokens of x x the group's ranks]" : "[tokens of x]");
    reserve(exec, int(x.extent(0)), tokens);
    x_ = x;
    positions_ = positions.size() > 0 || !options_.rotary ? positions : counting_positions(exec, tokens);
    const auto x_gathered = gather_tokens(x);
    const auto x_rows = rows_of(sequence_parallel() ? ConstTokens(x_gathered.view()) : x);
    // Q, K, V = x W_i^T + b_i.
    for (int i = 0; i < 3; ++i)
      linear_forward(context_, x_rows, rows_block(weights_.w_qkv, i), slice(weights_.b_qkv, i), matrix(qkv_, i));
    if (options_.rotary)
      rotary_embedding(exec, heads_view(qkv_, 0), heads_view(qkv_, 1), positions_, options_.rotary_base,
                       Rotation::forward);
    attend(exec);
    // y = Z W_out^T + b_out: each rank's partial product over its features, summed; b_out once.
    const auto y_whole = whole_tokens();
    const Tokens y_sum = sequence_parallel() ? y_whole.view() : y;
    linear_forward(context_, projection_input(), weights_.w_out, part_ == 0 ? weights_.b_out : Vector(), rows_of(y_sum));
    if (sequence_parallel()) scatter_tokens(y_sum, y);
    else if (features_) features_->sum(exec, y.data(), y.size());
    if (options_.recompute_attention) release_outputs();
  }

  void backward(const ConstTokens& dy, const Tokens& dx) {
    const char* where = "longattn::MultiheadAttention::backward";
    require(x_.size() > 0, where, "this", "a module without a forward pass", "forward() before backward()");
    check_tokens(where, "dy", dy, x_.extent(0), x_.extent(1));
    check_tokens(where, "dx", dx, x_.extent(0), x_.extent(1));
    check_no_alias(where, "dx", dx, "dy", dy);
    check_no_alias(where, "dx", dx, "x (of the forward pass)", x_);
    require(gradients_.size() > 0, where, "this", "a module without gradient memory",
            "use_gradients() before backward() (options.own_gradients is false)");
    const ExecSpace& exec = context_.exec();
    if (attention_out_.size() == 0) attend(exec);  // recompute_attention: A, LSE and Z again
    const std::size_t rows = std::size_t(batch_) * std::size_t(tokens_), F = local_features();  // all of them
    const memory::CategoryScope scope(memory::Category::workspaces);
    const auto d_projection = context_.template allocate<Activations>(rows, F);
    const auto d_attention = options_.sub_layer_norm ? context_.template allocate<Activations>(rows, F)
                                                     : memory::PooledView<Activations>();
    const auto d_qkv = context_.template allocate<Projections>(3, rows, F);
    // Under sequence parallelism dy and x gathered whole, dx summed into a whole buffer first.
    const auto dy_gathered = gather_tokens(dy), x_gathered = gather_tokens(x_);
    const auto dx_whole = whole_tokens();
    const auto dy_rows = rows_of(sequence_parallel() ? ConstTokens(dy_gathered.view()) : dy);
    const auto x_rows = rows_of(sequence_parallel() ? ConstTokens(x_gathered.view()) : x_);
    const Tokens dx_sum = sequence_parallel() ? dx_whole.view() : dx;
    const GradientTensors& grad = weight_gradients_;
    // Output projection: db_out += colsum(dy), dW_out += dy^T Z, dZ = dy W_out.
    add_column_sums(exec, dy_rows, ones_.view(), grad.b_out);
    gemm(context_, "T", "N", one, dy_rows, projection_input(), one, grad.w_out);
    gemm(context_, "N", "N", one, dy_rows, weights_.w_out, zero, matrix(d_projection));
    if (options_.sub_layer_norm && features_)
      layer_norm_backward(context_, *features_, matrix(d_projection), matrix(attention_out_), weights_.ln_gamma,
                          mean_.view(), rstd_.view(), matrix(d_attention), grad.ln_gamma, grad.ln_beta);
    else if (options_.sub_layer_norm)
      layer_norm_backward(exec, matrix(d_projection), matrix(attention_out_), weights_.ln_gamma, mean_.view(),
                          rstd_.view(), matrix(d_attention), grad.ln_gamma, grad.ln_beta);
    const auto& d_output = options_.sub_layer_norm ? d_attention : d_projection;
    runner_->backward(context_, attention_inputs(), {heads_view(attention_out_), lse_.view()}, heads_view(d_output),
                      {heads_view(d_qkv, 0), heads_view(d_qkv, 1), heads_view(d_qkv, 2)});
    if (options_.rotary)  // the gradients of the turned Q and K, turned back: those of the projections
      rotary_embedding(exec, heads_view(d_qkv, 0), heads_view(d_qkv, 1), positions_, options_.rotary_base,
                       Rotation::backward);
    // Projections: db_i += colsum(dQ_i), dW_i += dQ_i^T x, dx = sum_i dQ_i W_i.
    for (int i = 0; i < 3; ++i) {
      add_column_sums(exec, matrix(d_qkv, i), ones_.view(), slice(grad.b_qkv, i));
      gemm(context_, "T", "N", one, matrix(d_qkv, i), x_rows, one, rows_block(grad.w_qkv, i));
      gemm(context_, "N", "N", one, matrix(d_qkv, i), rows_block(weights_.w_qkv, i), i == 0 ? zero : one,
           rows_of(dx_sum));
    }
    // Each rank's features' share of dx, summed.
    if (sequence_parallel()) scatter_tokens(dx_sum, dx);
    else if (features_) features_->sum(exec, dx.data(), dx.size());
    if (options_.recompute_attention) release_outputs();
  }  // the workspace goes back to the pool, reused in stream order by later work on the instance

 private:
  using Activations = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;        // [rows, E]
  using Projections = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;       // [3, rows, E]
  using RowValues = Kokkos::View<T*, memory_space>;                                // [rows]
  using RowStats = Kokkos::View<Accumulate*, memory_space>;                        // [rows]
  using Lse = Kokkos::View<Accumulate***, memory_space>;                           // [B, H, N]
  static constexpr Accumulate one = 1, zero = 0;
  using Heads = Kokkos::View<T****, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  template <class View>
  void check_tokens(const char* where, const char* name, const View& view, std::size_t batch, std::size_t tokens) const {
    const std::int64_t expected[3] = {std::int64_t(batch), std::int64_t(tokens), embed_dim_};
    require(view.extent(0) > 0 && view.extent(1) > 0, where, std::string(name) + "'s extents",
            extents_of(view), "[batch >= 1, tokens >= 1, embed_dim]");
    check_extents(where, name, view, expected, "[batch, tokens, embed_dim]");
  }

  template <class View>
  TensorsOf<typename View::value_type> carve(const View& flat) const {
    using Tensors = TensorsOf<typename View::value_type>;
    using Matrix = typename Tensors::Matrix;
    using Vector = typename Tensors::Vector;
    const std::size_t E = embed_dim_, F = local_features();
    auto* p = flat.data();
    Tensors t;
    t.w_qkv = Matrix(p, 3 * F, E), p += 3 * F * E;
    t.b_qkv = Vector(p, 3 * F), p += 3 * F;
    t.w_out = Matrix(p, E, F), p += E * F;
    t.b_out = Vector(p, E), p += E;
    if (options_.sub_layer_norm) {
      t.ln_gamma = Vector(p, F), p += F;
      t.ln_beta = Vector(p, F);
    }
    return t;
  }

  // MAGNETO: Xavier-normal std = gain * sqrt(2 / (fan_in + fan_out)) = gain / sqrt(E). The whole
  // layer's weights, then this rank's part of each.
  void initialize_parameters() {
    const std::size_t E = embed_dim_;
    std::vector<T> w_qkv(3 * E * E), b_qkv(3 * E, T(0.0)), w_out(E * E), b_out(E, T(0.0));
    std::mt19937_64 rng(options_.seed);
    std::normal_distribution<double> normal(0.0, 1.0 / std::sqrt(double(E)));
    for (std::size_t i = 0; i < 3 * E * E; ++i) w_qkv[i] = T(normal(rng) * (i < 2 * E * E ? 1.0 : options_.gamma_init));
    for (std::size_t i = 0; i < E * E; ++i) w_out[i] = T(normal(rng) * options_.gamma_init);
    const std::vector<T> gamma(options_.sub_layer_norm ? E : 0, T(1.0)), beta(gamma.size(), T(0.0));
    const auto host = Kokkos::create_mirror_view(parameters_.view());
    const Splits splits = feature_splits();
    const Tensors t = carve(host);
    splits.w_qkv.extract(parts_, part_, w_qkv.data(), t.w_qkv.data());
    splits.b_qkv.extract(parts_, part_, b_qkv.data(), t.b_qkv.data());
    splits.w_out.extract(parts_, part_, w_out.data(), t.w_out.data());
    splits.b_out.extract(parts_, part_, b_out.data(), t.b_out.data());
    splits.ln_gamma.extract(parts_, part_, gamma.data(), t.ln_gamma.data());
    splits.ln_beta.extract(parts_, part_, beta.data(), t.ln_beta.data());
    Kokkos::deep_copy(context_.exec(), parameters_.view(), host);
    context_.exec().fence();  // host is freed on return
  }

  std::size_t checked_rows(const char* where, int batch, std::int64_t tokens) const {
    require(batch >= 0, where, "batch", batch, "a count >= 0");
    require(tokens >= 0, where, "tokens", tokens, "a count >= 0");
    return std::size_t(batch) * std::size_t(tokens);
  }
  // The attention's outputs for `rows` tokens: A, LSE per head, and with the sub-LayerNorm Z
  // and its mean and rstd.
  std::size_t output_bytes(std::size_t rows) const {
    const std::size_t F = local_features();
    return sizeof(T) * (rows * F + (options_.sub_layer_norm ? rows * F : 0)) +
           sizeof(Accumulate) * (rows * local_heads() + (options_.sub_layer_norm ? 2 * rows : 0));
  }

  // (Re)allocates Q, K, V and the ones for B sequences of N tokens (the previous activations go
  // back to the pool first, so a changed length reuses their memory). The size is recorded only
  // once all are there: a pool that refuses leaves the module ready to try again.
  void reserve(const ExecSpace& exec, int batch, std::int64_t tokens) {
    if (batch == batch_ && tokens == tokens_) return;
    release_activations();
    const std::size_t rows = std::size_t(batch) * tokens;
    qkv_ = context_.template allocate<Projections>(3, rows, std::size_t(local_features()));
    ones_ = context_.template allocate<RowValues>(rows);
    Kokkos::deep_copy(exec, ones_.view(), T(1.0));
    batch_ = batch;
    tokens_ = tokens;
  }

  // A = attention(Q, K, V) with its LSE, then Z = LayerNorm(A), into the output buffers (taken
  // from the pool when not held: always under recompute_attention, else after a reserve()).
  void attend(const ExecSpace& exec) {
    if (attention_out_.size() == 0) {
      const std::size_t rows = std::size_t(batch_) * tokens_, F = local_features();
      attention_out_ = context_.template allocate<Activations>(rows, F);
      lse_ = context_.template allocate<Lse>(batch_, local_heads(), tokens_);
      if (options_.sub_layer_norm) {
        normalized_ = context_.template allocate<Activations>(rows, F);
        mean_ = context_.template allocate<RowStats>(rows);
        rstd_ = context_.template allocate<RowStats>(rows);
      }
    }
    runner_->forward(context_, attention_inputs(), {heads_view(attention_out_), lse_.view()});
    if (options_.sub_layer_norm && features_)
      layer_norm_forward(context_, *features_, matrix(attention_out_), weights_.ln_gamma, weights_.ln_beta,
                         options_.layer_norm_eps, matrix(normalized_), mean_.view(), rstd_.view());
    else if (options_.sub_layer_norm)
      layer_norm_forward(exec, matrix(attention_out_), weights_.ln_gamma, weights_.ln_beta, options_.layer_norm_eps,
                         matrix(normalized_), mean_.view(), rstd_.view());
  }
  // 0 .. tokens-1, kept while the length stays (forward() without positions).
  Positions counting_positions(const ExecSpace& exec, std::int64_t tokens) {
    if (std::int64_t(counting_.size()) != tokens) {
      counting_ = context_.template allocate<Kokkos::View<int*, memory_space>>(std::size_t(tokens));
      detail::fill_counting(exec, counting_.view());
    }
    return counting_.view();
  }
  void release_outputs() {
    attention_out_ = normalized_ = {};
    lse_ = {};
    mean_ = rstd_ = {};
  }

  typename Runner::Inputs attention_inputs() const {
    return {heads_view(qkv_, 0), heads_view(qkv_, 1), heads_view(qkv_, 2)};
  }

  Matrix projection_input() const { return matrix(options_.sub_layer_norm ? normalized_ : attention_out_); }

  // Views of the same memory in the shapes the steps need.
  template <class View>
  static auto rows_of(const View& tokens) {
    using Rows = Kokkos::View<typename View::value_type**, Kokkos::LayoutRight, memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    return Rows(tokens.data(), tokens.extent(0) * tokens.extent(1), tokens.extent(2));
  }
  static Matrix matrix(const Activations& a) { return Matrix(a.data(), a.extent(0), a.extent(1)); }

  // Sequence parallelism (sequence_parallel.hpp): a whole [B, n, E] from the pool for the
  // forward pass's B and n, or none without it; the ranks' shards gathered into one.
  memory::PooledView<Tokens> whole_tokens() const {
    if (!sequence_parallel()) return {};
    const memory::CategoryScope scope(memory::Category::communication_buffers);
    return context_.template allocate<Tokens>(std::size_t(batch_), std::size_t(tokens_), std::size_t(embed_dim_));
  }
  memory::PooledView<Tokens> gather_tokens(const ConstTokens& shard) const {
    auto whole = whole_tokens();
    if (sequence_parallel()) gather_sequence(context_, *features_, shard, whole.view());
    return whole;
  }
  void scatter_tokens(const Tokens& whole, const Tokens& shard) const {
    reduce_scatter_sequence(context_, *features_, whole, shard);
  }
  static Matrix matrix(const Projections& p, int i) {
    return Matrix(p.data() + i * p.extent(1) * p.extent(2), p.extent(1), p.extent(2));
  }
  template <class M>  // q, k or v's rows of W_qkv (weights or gradients)
  static M rows_block(const M& w, int i) {
    const std::size_t rows = w.extent(0) / 3, cols = w.extent(1);
    return M(w.data() + i * rows * cols, rows, cols);
  }
  template <class V>
  static V slice(const V& b, int i) {
    const std::size_t E = b.extent(0) / 3;
    return V(b.data() + i * E, E);
  }
  Heads heads_view(T* data) const { return Heads(data, batch_, tokens_, local_heads(), head_dim()); }
  Heads heads_view(const Activations& a) const { return heads_view(a.data()); }
  Heads heads_view(const Projections& p, int i) const { return heads_view(p.data() + i * p.extent(1) * p.extent(2)); }

  Context context_;
  int embed_dim_, heads_;
  MultiheadAttentionOptions options_;
  std::shared_ptr<Runner> runner_;
  std::shared_ptr<const Features> features_;  // nullptr: the whole layer on this rank
  int parts_, part_;
  memory::PooledView<Flat> parameters_;
  memory::PooledView<GradientFlat> own_gradients_;  // without options.own_gradients: none
  GradientFlat gradients_;                          // own_gradients_ or the caller's (use_gradients)
  Tensors weights_;
  GradientTensors weight_gradients_;

  int batch_ = 0;
  std::int64_t tokens_ = 0;
  ConstTokens x_;
  Positions positions_;                                            // of x_'s tokens (rotary)
  memory::PooledView<Kokkos::View<int*, memory_space>> counting_;  // 0 .. N-1: positions by default
  memory::PooledView<Projections> qkv_;
  memory::PooledView<Activations> attention_out_, normalized_;
  memory::PooledView<Lse> lse_;
  memory::PooledView<RowStats> mean_, rstd_;
  memory::PooledView<RowValues> ones_;
};

// The factory: a module running the attention the text `spec` names ("dense",
// "dilated:w=...;r=...", "auto", "block_sparse:..."), parsed here once; the other options as
// given; in `context` (default: the space's default instance and pool).
template <class ExecSpace, class T = float>
MultiheadAttention<ExecSpace, T> make_multihead_attention(const std::string& spec, int embed_dim, int heads,
                                                          MultiheadAttentionOptions options = {},
                                                          const ExecutionContext<ExecSpace>& context = {}) {
  options.attention = parse_attention_spec(spec);
  return MultiheadAttention<ExecSpace, T>(context, embed_dim, heads, options);
}

}  // namespace longattn
