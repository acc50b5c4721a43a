// Transformer: the byte-level decoder-only language model of longattn-train, forward and backward.
//
//   tokens [B, n] -> x = tok_emb[token] + pos_emb[position]                       [R, E], R = B n
//                   (rotary positions: x = tok_emb[token]; each attention turns Q and K instead)
//   each of L blocks (pre-norm, as GPT-2; attention with MAGNETO's sub-LayerNorm):
//     h1 = LayerNorm(x);  x2 = x + MultiheadAttention(h1)                         [R, E]
//     h2 = LayerNorm(x2); u = h2 W1^T + b1; g = GELU(u); x = x2 + g W2^T + b2     u, g [R, F]
//   hf = LayerNorm(x); logits = hf W_head^T + b_head                              [R, V]
//   loss = sum_r weight_r (logsumexp(logits_r) - logits_r[target_r]) / normalizer
//
// B sequences, n tokens of each on this rank (n = N / cp: the tokens of `positions`, which are
// global positions, so a context-parallel rank embeds or turns its shard where it sits in the sequence),
// E = embed, F = 4 E, V = 256 bytes. The caller gives the normalizer (the weighted tokens of the
// global batch), so that the losses of all ranks add up to the mean over the global batch and
// the gradients summed over ranks are its gradients.
//
// Parameters are groups (ParameterGroup: values, gradients, count), listed in the order
// backward() makes their gradients final (head first, embeddings last), which is the order a
// data-parallel all-reduce wants them; backward() calls `ready(index)` as each becomes final.
// Gradient memory (GradientMemory): `kept` holds every gradient from construction on, in one
// buffer, and backward() adds into it (micro-batches accumulate until zero_gradients()); the
// stretches of it described below lie back to back there in backward's order, so a data-parallel
// reduction can take them where they are (gradient_stretches()). `per_block` holds a
// stretch of gradients - the head's, one block's (its own and its attention's), the embeddings' -
// only while backward makes it: taken from the pool and zeroed when backward reaches it, given
// back after ready() has been called for each of its groups, so each backward's gradients exist
// only inside ready(i) for the caller to take (ZeRO 2's reduce-scatter) and a rank never holds
// all of them; between backward passes the groups' gradient pointers are null.
//
// Activation recomputation (ModelConfig::recompute) trades compute for memory with the same
// results: `none` keeps every block's activations for backward; `selective` keeps the attention's
// inputs Q, K, V but not its outputs (A, LSE, the sub-LayerNorm's Z), which backward recomputes;
// `full` keeps only each block's input x (and the last block's activations, which backward uses
// first) and runs the other blocks' forward again in backward, one block at a time. Buffers
// backward needs only while it runs come from the pool and go back to it.
//
// Tensor parallelism (Megatron-LM), given a FeatureGroup of P ranks: each block's attention holds
// H / P heads (multihead_attention.hpp) and its MLP F / P hidden features - W1 and b1 column-
// parallel (rows of those features), W2 row-parallel (their columns), b2 whole - so each sublayer
// ends in one all-reduce of its output forward and one of its input's gradient backward.
// Embeddings, LayerNorms and the head are whole on every rank (V = 256: nothing to gain from
// splitting them), computed alike from the same inputs. Each group says how it is this rank's
// part of the whole model's tensor (ParameterGroup::split); weights initialize whole and are cut,
// so P ranks train the model one rank does.
//
// Sequence parallelism (Korthikanti et al. 2022; `sequence_parallel` with a group of P): between
// the tensor-parallel sublayers - embeddings, LayerNorms, residuals, the head and the loss - rank
// p holds tokens [p n/P, (p + 1) n/P) of each sequence only ([B n/P, E] rows). Entering a
// sublayer its input is all-gathered, leaving it the partial outputs are reduce-scattered
// instead of all-reduced (sequence_parallel.hpp; backward the reverse, the inputs gathered again
// rather than kept). forward() returns the loss of this rank's tokens; the gradients of the
// replicated tensors those rows feed (norms, head, embeddings: ParameterGroup::sequence_partial)
// are this rank's share, which the caller sums over the group.
//
// Every matrix product is a gemm (Kokkos Kernels); the rest are Kokkos kernels. All of it runs
// in the model's ExecutionContext: on its instance, parameters, activations and gradients from
// its pool (the attention layers share the context).
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "longattn/core/linear.hpp"
#include "longattn/core/multihead_attention.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/finite.hpp"
#include "longattn/error.hpp"

namespace longattn::train {

enum class Recompute { none, selective, full };
enum class GradientMemory { kept, per_block };  // see the top of this file
// How the model knows where a token is: a learned embedding per position (GPT-2: context x E
// parameters) or rotary embeddings in every attention layer (RoFormer, LLaMA: none).
enum class PositionEncoding { learned, rotary };
const char* to_string(Recompute recompute);
// "none", "selective" or "full"; throws longattn::Error naming `option` otherwise.
Recompute parse_recompute(const std::string& text, const char* option = "recompute");
const char* to_string(PositionEncoding positions);
// "learned" or "rotary"; throws longattn::Error naming `option` otherwise.
PositionEncoding parse_positions(const std::string& text, const char* option = "positions");

struct ModelConfig {
  int layers = 4;
  int embed = 256;                   // E
  int heads = 4;                     // head dim E / heads
  std::int64_t context = 256;        // N: tokens per sequence (learned positions: up to N)
  PositionEncoding positions = PositionEncoding::learned;
  AttentionSpec attention;           // dense unless set (parse_attention_spec: the text form)
  std::uint64_t seed = 1;            // weight initialization
  Recompute recompute = Recompute::none;  // how backward gets activations (the same results)
  static constexpr int vocab = 256;  // bytes
  int hidden() const { return 4 * embed; }
};

// Throws longattn::Error naming the field.
void validate(const ModelConfig& config);

// Named model shapes (longattn-train --model): GPT-3's Medium and XL (Brown et al. 2020, table
// 2.1), byte-level here: "350m" is 24 layers, E 1024, 16 heads (302M parameters in its blocks),
// "1.3b" 24 layers, E 2048, 16 heads (1.21B); learned positions add context x E, rotary none.
struct ModelShape {
  int layers, embed, heads;
};
// Throws longattn::Error naming `option` and the names otherwise.
ModelShape named_model_shape(const std::string& name, const char* option = "model");

// Values in the model's type T, gradients in accumulate_t<T> (float for 16-bit T).
template <class T>
struct ParameterGroup {
  std::string name;
  T* values;
  accumulate_t<T>* gradients;
  std::size_t count;
  bool decay;           // matrices decay (AdamW), biases, norms and embeddings do not
  FeatureSplit split{};  // how `values` are this rank's part of the whole tensor (tensor parallelism)
  bool sequence_partial = false;  // gradients from this rank's tokens only: summed over the group by the caller
};

template <class ExecSpace, class T>
class Transformer {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using TokenIds = Kokkos::View<int**, Kokkos::LayoutRight, memory_space>;   // [B, n]
  using Weights = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;      // [B, n]
  using Positions = Kokkos::View<int*, memory_space>;                        // [n]
  using Attention = MultiheadAttention<ExecSpace, T>;
  using Accumulate = accumulate_t<T>;  // gradients' type
  using Context = ExecutionContext<ExecSpace>;
  using Features = FeatureGroup<ExecSpace>;

  // This rank's part of a batch: inputs, next-token targets, loss weights (1 or 0) and the
  // global positions of its tokens.
  struct Batch {
    TokenIds inputs, targets;
    Weights weights;
    Positions positions;
  };

  // `features`: the tensor-parallel group (nullptr or a group of one: the whole model here);
  // `sequence_parallel`: with a group, split the tokens between its sublayers (above).
  Transformer(const Context& context, const ModelConfig& config, std::shared_ptr<const Features> features = nullptr,
              GradientMemory gradient_memory = GradientMemory::kept, bool sequence_parallel = false)
      : context_(context), config_(config), features_(features && features->size() > 1 ? std::move(features) : nullptr),
        parts_(features_ ? features_->size() : 1), part_(features_ ? features_->rank() : 0),
        gradient_memory_(gradient_memory), sequence_parallel_(features_ && sequence_parallel) {
    validate(config);
    require(config.hidden() % parts_ == 0, "longattn::train::Transformer", "features", parts_,
            "a tensor-parallel group whose size divides the hidden size 4 x embed = " +
                std::to_string(config.hidden()));
    const std::size_t E = config.embed, F = local_hidden(), V = ModelConfig::vocab, N = config.context;
    MultiheadAttentionOptions options;
    options.attention = config.attention;
    options.causal = true;
    options.gamma_init = std::sqrt(std::log(2.0 * config.layers));  // MAGNETO, decoder
    options.recompute_attention = config.recompute == Recompute::selective;
    options.own_gradients = false;  // each block's attention's gradients are in its stretch
    options.sequence_parallel = sequence_parallel_;
    options.rotary = config.positions == PositionEncoding::rotary;
    std::mt19937_64 seeds(config.seed);
    // Own parameters, one buffer of values carved in this order; gradients by stretches.
    const std::size_t own_head = 2 * E + V * E + V, own_block = 4 * E + F * E + F + E * F + E;
    const std::size_t own_embedding = V * E + (config.positions == PositionEncoding::learned ? N * E : 0);
    {
      const memory::CategoryScope scope(memory::Category::parameters);
      values_ = context_.template allocate<Flat>(own_head + std::size_t(config.layers) * own_block + own_embedding);
    }
    std::size_t offset = 0;
    auto take = [&](std::size_t count) {
      const std::size_t at = offset;
      offset += count;
      return at;
    };
    // Gradient-ready order: head, then blocks last to first, then embeddings.
    head_ = {take(2 * E), take(V * E), take(V)};
    blocks_.resize(config.layers);
    for (int l = config.layers - 1; l >= 0; --l) {
      Block& b = blocks_[l];
      b.ln1 = take(2 * E), b.ln2 = take(2 * E), b.w1 = take(F * E), b.b1 = take(F), b.w2 = take(E * F), b.b2 = take(E);
    }
    embedding_ = {take(V * E), take(own_embedding - V * E)};
    for (int l = 0; l < config.layers; ++l) {
      options.seed = seeds();
      blocks_[l].attention = std::make_unique<Attention>(context_, config.embed, config.heads, options, features_);
    }
    initialize(seeds());
    // Stretches in backward's order; every one holds memory while the groups are listed.
    stretches_.push_back({head_.ln, own_head, nullptr, 0, 0, nullptr, {}});
    for (int l = config.layers - 1; l >= 0; --l)
      stretches_.push_back({blocks_[l].ln1, own_block, blocks_[l].attention.get(), 0, 0, nullptr, {}});
    stretches_.push_back({embedding_.tokens, own_embedding, nullptr, 0, 0, nullptr, {}});
    if (gradient_memory_ == GradientMemory::kept) {
      std::size_t total = 0;
      for (const GradientStretch& s : stretches_) total += s.count();
      const memory::CategoryScope scope(memory::Category::gradients);
      kept_gradients_ = context_.template allocate<GradientFlat>(total);
      Kokkos::deep_copy(context_.exec(), kept_gradients_.view(), Accumulate(0));
      Accumulate* next = kept_gradients_.data();
      for (GradientStretch& s : stretches_) {
        s.gradients = next;
        next += s.count();
        lend_gradients(s);
      }
    } else {
      for (std::size_t s = 0; s < stretches_.size(); ++s) acquire_gradients(s);
    }
    list_groups();
    if (gradient_memory_ == GradientMemory::per_block)
      for (std::size_t s = 0; s < stretches_.size(); ++s) release_gradients(s);
  }

  // In the space's default instance and pool.
  explicit Transformer(const ModelConfig& config) : Transformer(Context(), config) {}

  const ModelConfig& config() const { return config_; }
  const Context& context() const { return context_; }
  const std::vector<ParameterGroup<T>>& parameter_groups() const { return groups_; }
  // This rank's parameters, and the whole model's (the same without tensor parallelism).
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const auto& g : groups_) n += g.count;
    return n;
  }
  std::size_t whole_parameter_count() const {
    std::size_t n = 0;
    for (const auto& g : groups_) n += g.split.whole_count();
    return n;
  }
  // Every layer's attention runs through `runner` (context parallelism, attention_runner.hpp).
  void set_attention_runner(const std::shared_ptr<AttentionRunner<ExecSpace, T>>& runner) {
    for (Block& b : blocks_) b.attention->set_attention_runner(runner);
  }

  GradientMemory gradient_memory() const { return gradient_memory_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // Kept gradients: all to zero. Per-block gradients start at zero in every backward: nothing to do.
  void zero_gradients() {
    if (gradient_memory_ == GradientMemory::kept) Kokkos::deep_copy(context_.exec(), kept_gradients_.view(), Accumulate(0));
  }

  // A stretch of gradient memory: groups [first_group, first_group + groups) of
  // parameter_groups(), backward's order, in `count` elements from `gradients` (in an order of
  // their own). Kept gradients: the stretches lie back to back from the first one's `gradients`,
  // each final once its last group is; per-block: `gradients` is null between backward passes.
  struct GradientStretchSpan {
    Accumulate* gradients;
    std::size_t count;
    int first_group, groups;
  };
  std::vector<GradientStretchSpan> gradient_stretches() const {
    std::vector<GradientStretchSpan> spans;
    for (const GradientStretch& s : stretches_) spans.push_back({s.gradients, s.count(), s.first_group, s.groups});
    return spans;
  }

  // This rank's loss contribution; keeps what backward() needs. backward()'s gradients are
  // those of loss_scale times the loss (fp16 training scales them above its underflow).
  double forward(const Batch& batch, double normalizer, double loss_scale = 1);
  // Adds this batch's gradients into the groups' gradients; ready(i) as group i is final (its
  // gradients at parameter_groups()[i].gradients; with per-block memory only during the call).
  void backward(const std::function<void(int)>& ready = {});

  // The first tensor holding a NaN or an infinity, in the order a step makes them: parameters
  // (embeddings to head), the activations the last forward pass kept (each block's input x, h1,
  // x2 = x + attention, h2, u, g; then the final norm's output and the logits), then gradients
  // (head to embeddings; kept gradients only). "" when all are finite. E.g. "layer1.x2 (x + attention(h1)) [3, 17] =
  // inf". Activations released by recomputation are not searched. Waits for the instance.
  std::string first_non_finite() const;

  // Model FLOPs of one training step (forward + backward, 3x the forward) over `sequences`
  // sequences of the full context, and their attention share.
  double flops_per_step(std::int64_t sequences) const;

 private:
  using Flat = Kokkos::View<T*, memory_space>;
  using GradientFlat = Kokkos::View<Accumulate*, memory_space>;
  template <class Value>
  using MatrixOf = Kokkos::View<Value**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  template <class Value>
  using VectorOf = Kokkos::View<Value*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Matrix = MatrixOf<T>;
  using Rows = memory::PooledView<Kokkos::View<T**, Kokkos::LayoutRight, memory_space>>;  // [R, cols]
  using Stats = memory::PooledView<Kokkos::View<Accumulate*, memory_space>>;              // [R]

  struct LayerNormStats {
    Stats mean, rstd;
  };
  struct Block {
    std::size_t ln1, ln2, w1, b1, w2, b2;  // offsets of the own parameters
    std::unique_ptr<Attention> attention;
    Rows x;                                // the block's input (kept in every mode)
    Rows h1, x2, h2, u, g;                 // forward activations (under `full`: while one block runs)
    LayerNormStats norm1, norm2;
  };
  struct Head {
    std::size_t ln, w, b;
  };
  struct Embedding {
    std::size_t tokens, positions;  // positions: learned ones only
  };
  bool learned_positions() const { return config_.positions == PositionEncoding::learned; }
  // Gradient memory of consecutive groups: own parameters [own_begin, own_begin + own_count) of
  // the flat layout, then (a block's) its attention's parameter_count().
  struct GradientStretch {
    std::size_t own_begin, own_count;
    Attention* attention;
    int first_group = 0, groups = 0;  // in groups_
    Accumulate* gradients = nullptr;  // while held: in kept_gradients_, or `per_block`
    memory::PooledView<GradientFlat> per_block;
    std::size_t count() const { return own_count + (attention ? attention->parameter_count() : 0); }
  };
  void acquire_gradients(std::size_t stretch);  // zeroed; the groups' pointers into it
  void release_gradients(std::size_t stretch);  // per-block memory only
  // The stretch's attention and (once listed) its groups take their gradients in its memory.
  void lend_gradients(const GradientStretch& stretch);
  // Where an own parameter's gradient is: in the stretch holding its offset.
  Accumulate* own_gradient(std::size_t offset) const;

  void initialize(std::uint64_t seed);
  void list_groups();
  void reserve(int batch, std::int64_t tokens);
  // A block's activations for `rows` of its tokens ([rows, E]: this rank's under sequence
  // parallelism) and `all_rows` of the sequences (the MLP's hidden layer).
  void acquire_activations(Block& b, std::size_t rows, std::size_t all_rows);
  void release_activations(Block& b);
  // The block's forward from b.x; its output into `next` (none: stop after the MLP's GELU, as
  // full recomputation needs).
  void block_forward(Block& b, const Matrix* next);

  // Pieces of the flat parameter buffer (T) or of gradients (Accumulate).
  template <class View>
  static auto matrix(const memory::PooledView<View>& flat, std::size_t offset, std::size_t rows, std::size_t cols) {
    return MatrixOf<typename View::value_type>(flat.data() + offset, rows, cols);
  }
  template <class View>
  static auto vector(const memory::PooledView<View>& flat, std::size_t offset, std::size_t count) {
    return VectorOf<typename View::value_type>(flat.data() + offset, count);
  }
  MatrixOf<Accumulate> gradient_matrix(std::size_t offset, std::size_t rows, std::size_t cols) const {
    return MatrixOf<Accumulate>(own_gradient(offset), rows, cols);
  }
  VectorOf<Accumulate> gradient_vector(std::size_t offset, std::size_t count) const {
    return VectorOf<Accumulate>(own_gradient(offset), count);
  }
  static Matrix rows(const Rows& r) { return Matrix(r.data(), r.extent(0), r.extent(1)); }
  using Tokens3 = Kokkos::View<T***, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // Rows as [B, tokens, cols]: this rank's tokens of the batch's sequences, or all of them.
  template <class M>
  Tokens3 tokens3(const M& r) const {
    return Tokens3(r.data(), batch_, std::int64_t(r.extent(0)) / batch_, r.extent(1));
  }
  // This rank's tokens of each sequence (sequence parallelism), of a [B, n] or [n] batch view.
  std::pair<std::int64_t, std::int64_t> my_tokens(std::int64_t n) const {
    return sequence_parallel_ ? std::make_pair(part_ * n / parts_, (part_ + 1) * n / parts_) : std::make_pair(std::int64_t(0), n);
  }
  // Under sequence parallelism: the whole [B n, cols] rows of this rank's `shard` gathered from
  // the group; `partial` whole rows reduce-scattered (summed) into `shard`.
  Rows gathered(const Matrix& shard) const;
  void scattered(const Matrix& partial, const Matrix& shard) const;

  // How a linear layer's weights are split over the tensor-parallel group: whole, by output
  // features (column-parallel: dx summed over the group backward) or by input features
  // (row-parallel: y summed over the group forward, b added once).
  enum class Parallel { whole, column, row };
  // y = x W^T + b (+ residual, then GELU: longattn::linear_forward's epilogue); and its backward:
  // db += colsum(dy), dW += dy^T x, dx = dy W (then dx *= GELU'(gelu_input): a row-parallel
  // layer's input is GELU's output).
  void linear_forward(const Matrix& x, std::size_t w, std::size_t b, const Matrix& y, Parallel parallel,
                      const LinearEpilogue<Matrix>& after = {}) const;
  void linear_backward(const Matrix& x, const Matrix& dy, std::size_t w, std::size_t b, const Matrix& dx,
                       Parallel parallel, const Matrix& gelu_input = {}) const;
  std::size_t local_hidden() const { return std::size_t(config_.hidden() / parts_); }
  // With a residual: x += residual first (forward), dx += residual (backward), in the norm's pass.
  void norm_forward(const Matrix& x, std::size_t ln, const Matrix& y, LayerNormStats& stats,
                    const Matrix& residual = {}) const;
  void norm_backward(const Matrix& dy, const Matrix& x, std::size_t ln, const LayerNormStats& stats, const Matrix& dx,
                     const Matrix& residual = {}) const;

  Context context_;
  ModelConfig config_;
  std::shared_ptr<const Features> features_;  // nullptr: the whole model on this rank
  int parts_, part_;
  GradientMemory gradient_memory_;
  bool sequence_parallel_;
  memory::PooledView<Flat> values_;
  memory::PooledView<GradientFlat> kept_gradients_;  // every stretch, back to back (kept memory)
  std::vector<GradientStretch> stretches_;  // backward's order: head, blocks L-1 .. 0, embeddings
  std::vector<std::size_t> group_offsets_;  // each group's gradients in its stretch's memory
  Head head_;
  Embedding embedding_;
  std::vector<Block> blocks_;
  std::vector<ParameterGroup<T>> groups_;

  // Activations of the last forward pass.
  int batch_ = 0;
  std::int64_t tokens_ = 0;  // of each sequence on this rank (before the sequence split)
  Batch batch_data_;
  Rows x_final_, h_final_, logits_, d_x_, d_x2_, d_h_, d_hidden_;
  LayerNormStats norm_final_;
  memory::PooledView<Kokkos::View<T*, memory_space>> ones_;
};

}  // namespace longattn::train

#include "longattn/train/detail/model_impl.hpp"
