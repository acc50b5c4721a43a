#pragma once
// Ring attention: exact attention over a sequence split over the P ranks of a context-parallel
// group, each rank keeping only its shard of Q, K, V (memory O(N/P)).
//
//   parallel::RingPlan<Exec> plan(group, tokens, attention_block_size<Exec, float>(), causal, ring);
//   parallel::ring_attention_forward(ctx, plan, AttentionInputs{q, k, v}, AttentionOutputs{o, lse}, opts);
//   parallel::ring_attention_backward(ctx, plan, AttentionInputs{q, k, v}, AttentionOutputs{o, lse}, d_o,
//                                     AttentionGradients{dq, dk, dv}, opts);
//
// ctx: an ExecutionContext (core/execution_context.hpp) or a bare instance: kernels run on its
// instance, the K/V and gradient transfer buffers come from its pool.
// q, k, v, o, d_o, dq, dk, dv are this rank's [B, N/P, H, D] and lse its [B, H, N/P], laid out
// as the sharding says (sharding.hpp: shard() and unshard() move between global and local).
// The result equals single-rank attention over the whole sequence; opts.causal masks by global
// position.
//
// How: each rank's keys and values are cut into pieces (K and V of a piece packed in one
// buffer). In round c, piece c of every rank visits every rank once, one step at a time: a rank
// computes its queries against the piece it holds while the next piece arrives (two buffers: the
// transfer of step t + 1 overlaps the compute of step t). The forward pass accumulates every step
// into (o, lse) inside the kernel (accumulate_output: no partial buffers). The backward pass
// computes each step's dK, dV of the piece into a fresh buffer, adds the accumulator the previous
// rank sends after it (that transfer overlapped the compute), passes it on, and the last holder
// returns the total to the piece's owner.
//
// Two levels (topology two_level, the default where the group spans nodes of equal size): the
// ranks form n_o nodes x n_i ranks, and a step is (o, s) with o the outer step (node to node) and
// s the inner step (rank to rank inside a node). Rank (node j, local i) holds at (o, s) the piece
// of rank (j - o, i - s): inside a node pieces go round an inner ring; at the start of each outer
// step every rank also sends the piece it holds to the rank with its local index on the next
// node, which needs it only n_i steps later. So every piece crosses each node boundary once
// (n_o - 1 crossings, whatever the rank order), all ranks of a node use the network at once, and
// each transfer between nodes hides behind n_i steps of compute. In the backward pass the
// gradient of a piece goes round each node's inner ring and the node's total goes home. The flat
// ring is the same schedule with one node of P ranks.
//
// A RingPlan, made on the host, says for this rank what it holds, computes, sends and receives
// at each step: pairs of (query segment, key piece) that no query can see (causal, or no kept
// block of a block-sparse layout) are skipped, and a piece travels only as far as the last rank
// that needs it (a local window then talks to neighbours only). Make one per (group, sequence,
// pattern) and reuse it for forward and backward across steps.
//
// Transfers: each step's messages are one exchange (communicator.hpp) that every rank starts at
// the same point of the schedule - MPI on host memory, one NCCL group or staged MPI messages on
// a GPU's (the communicator's transport) - and a step's gradient leaves with the next step's
// exchange, where its receiver takes it. Buffers
// live in the memory of ctx's space. Errors follow the group's ErrorPolicy and are agreed
// between ranks first: when one rank's input is wrong, every rank fails with its message and
// none is left waiting.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/attention_tensors.hpp"
#include "longattn/core/block_sparse_layout.hpp"
#include "longattn/core/convert.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/merge_partial.hpp"
#include "longattn/memory/pooled_view.hpp"
#include "longattn/parallel/communicator.hpp"
#include "longattn/parallel/sharding.hpp"

namespace longattn::parallel {

// automatic: two_level where the group spans several nodes with several ranks each, all nodes of
// the same size; flat otherwise.
enum class RingTopology { automatic, flat, two_level };

struct RingOptions {
  Sharding sharding = Sharding::contiguous;  // zigzag balances causal work over the ranks
  // Pieces each key segment travels in. 0: about 2048 tokens each (at least one block): the
  // ring's buffers stay ~5% of the rank's tensors, and each step is still a large kernel call.
  int pieces = 0;
  RingTopology topology = RingTopology::automatic;
};

// Where a rank's ring time went (summed over the calls since reset): kernels (fenced), waiting
// for transfers, what it sent (in all, and to ranks of other nodes).
struct RingTimings {
  double compute_seconds = 0, wait_seconds = 0;
  std::int64_t bytes_sent = 0, bytes_sent_off_node = 0;
};

// A piece of a rank's keys and values: consecutive global tokens.
struct Piece {
  int owner = 0;
  std::int64_t global_begin = 0, local_begin = 0, tokens = 0;
};

template <class ExecSpace>
class RingPlan {
 public:
  using Layout = BlockSparseLayout<ExecSpace>;

  // Dense attention over a sequence of `tokens` in blocks of `block` tokens (the kernels').
  // Collective over `group`.
  RingPlan(const Communicator& group, std::int64_t tokens, int block, bool causal, const RingOptions& options = {})
      : group_(group), tokens_(tokens), block_(block), causal_(causal), options_(options) {
    agree_and_arrange(0);
    group_.checked(where, [&] { plan(nullptr, nullptr); });
  }

  // Block-sparse attention with `global`, a layout over the whole sequence (queries = keys = all
  // tokens; its block is the kernels'). Each rank slices its (segment, piece) pairs out of it.
  RingPlan(const ExecSpace& exec, const Communicator& group, const Layout& global, bool causal,
           const RingOptions& options = {})
      : group_(group), tokens_(global.shape().queries), block_(global.shape().block), causal_(causal),
        options_(options) {
    agree_and_arrange(std::int64_t(global.key_blocks_of_rows().extent(0)));
    group_.checked(where, [&] {
      require(global.shape().keys == global.shape().queries, where, "layout.shape().keys", global.shape().keys,
              std::to_string(global.shape().queries) + " (self-attention: keys are the queries' tokens)");
      plan(&exec, &global);
    });
  }

  const Communicator& group() const { return group_; }
  std::int64_t tokens() const { return tokens_; }
  int block() const { return block_; }
  bool causal() const { return causal_; }
  const RingOptions& options() const { return options_; }
  const std::vector<Segment>& segments() const { return segments_; }  // this rank's
  int rounds() const { return int(pieces_per_rank_); }
  std::int64_t largest_piece() const { return largest_piece_; }
  const Piece& piece(int owner, int round) const { return pieces_[index(owner, round)]; }

  // The schedule: outer_steps() x inner_steps() steps per round (nodes x ranks per node; the flat
  // ring is 1 x P). Rank (node j, local i) holds at step (o, s) the piece of rank (j - o, i - s).
  bool two_level() const { return outer_ > 1 && inner_ > 1; }
  int outer_steps() const { return outer_; }
  int inner_steps() const { return inner_; }
  int owner_at(int o, int s) const { return rank_at(node_ - o, local_ - s); }
  int holder(int owner, int o, int s) const {  // who holds owner's pieces at step (o, s)
    const std::size_t p = std::size_t(owner);
    return rank_at(node_of_[p] + o, local_of_[p] + s);
  }
  int next_inner() const { return rank_at(node_, local_ + 1); }
  int previous_inner() const { return rank_at(node_, local_ - 1); }
  int next_outer() const { return rank_at(node_ + 1, local_); }
  int previous_outer() const { return rank_at(node_ - 1, local_); }
  // Whether `rank` shares this rank's node (the communicator's nodes, real or simulated).
  bool same_node(int rank) const { return real_node_of_[std::size_t(rank)] == real_node_of_[std::size_t(this->rank())]; }

  // How far piece (owner, round) travels: the last outer step at which a rank needs it (-1: none
  // does), and inside the node it reaches at outer step o the last inner step (-1: none there).
  int outer_route(int owner, int round) const { return outer_routes_[index(owner, round)]; }
  int inner_route(int owner, int round, int o) const {
    return inner_routes_[index(owner, round) * std::size_t(outer_) + std::size_t(o)];
  }
  // This rank at step (o, s) of round c. It holds a piece that has come this far (at s = 0 perhaps
  // only to pass it to the next node), and accumulates its gradient when a rank of this node at
  // this inner step or later needs it.
  bool holds(int o, int s, int c) const {
    const int owner = owner_at(o, s);
    return o <= outer_route(owner, c) && (s == 0 || s <= inner_route(owner, c, o));
  }
  bool accumulates(int o, int s, int c) const { return s <= inner_route(owner_at(o, s), c, o); }
  bool sends_inner(int o, int s, int c) const { return s < inner_route(owner_at(o, s), c, o); }
  bool receives_inner(int o, int s, int c) const { return s + 1 < inner_ && holds(o, s + 1, c); }
  bool sends_outer(int o, int c) const { return holds(o, 0, c) && o < outer_route(owner_at(o, 0), c); }
  bool receives_outer(int o, int c) const { return o + 1 < outer_ && holds(o + 1, 0, c); }

  // Whether this rank's segment `segment` sees any key of piece (owner, round), and through which
  // block-sparse sub-layout (nullptr: dense).
  bool computes(int segment, int owner, int round) const { return computed_.count(key(segment, owner, round)) > 0; }
  const Layout* layout(int segment, int owner, int round) const {
    const auto it = computed_.find(key(segment, owner, round));
    return it == computed_.end() ? nullptr : it->second.get();
  }
  // (segment, piece) pairs this rank computes, and the pieces it sends over a forward pass.
  std::int64_t pairs_computed() const { return std::int64_t(computed_.size()); }
  std::int64_t pieces_sent() const {
    std::int64_t n = 0;
    for (int c = 0; c < rounds(); ++c)
      for (int o = 0; o < outer_; ++o) {
        n += sends_outer(o, c);
        for (int s = 0; s < inner_; ++s) n += sends_inner(o, s, c);
      }
    return n;
  }
  // Time and traffic of this rank's passes with this plan (for benchmarks and logs).
  RingTimings& timings() const { return timings_; }
  void reset_timings() const { timings_ = RingTimings(); }

 private:
  static constexpr const char* where = "longattn::parallel::RingPlan";
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  std::size_t index(int owner, int round) const { return std::size_t(owner) * pieces_per_rank_ + std::size_t(round); }
  int rank_at(int node, int local) const {
    const int j = ((node % outer_) + outer_) % outer_, i = ((local % inner_) + inner_) % inner_;
    return rank_of_[std::size_t(j) * std::size_t(inner_) + std::size_t(i)];
  }
  static std::tuple<int, int, int> key(int segment, int owner, int round) { return {segment, owner, round}; }

  // Collective: every rank must make the same plan (else all fail alike), and the ranks' places in
  // the nodes x ranks grid.
  void agree_and_arrange(std::int64_t layout_entries) {
    group_.require_same(where, {{"tokens", tokens_},
                                {"block", block_},
                                {"causal", causal_},
                                {"options.sharding", std::int64_t(options_.sharding)},
                                {"options.pieces", options_.pieces},
                                {"options.topology", std::int64_t(options_.topology)},
                                {"layout entries", layout_entries}});
    const int P = size();
    const bool can_split = group_.uniform_nodes() && group_.nodes() > 1 && group_.local_size() > 1;
    group_.guarded(where, [&] {
      require(options_.topology != RingTopology::two_level || group_.uniform_nodes(), where, "options.topology",
              "two_level", "flat or automatic (the group's nodes hold different numbers of ranks)");
    });
    const bool split = options_.topology == RingTopology::two_level ||
                       (options_.topology == RingTopology::automatic && can_split);
    outer_ = split ? group_.nodes() : 1;
    inner_ = split ? group_.local_size() : P;
    const std::int32_t mine[3] = {split ? group_.node() : 0, split ? group_.local_rank() : rank(), group_.node()};
    std::vector<std::int32_t> all(std::size_t(3) * std::size_t(P));
    group_.all_gather(mine, all.data(), 3, DataType::int32);
    rank_of_.assign(std::size_t(P), 0);
    node_of_.resize(std::size_t(P));
    local_of_.resize(std::size_t(P));
    real_node_of_.resize(std::size_t(P));
    for (int r = 0; r < P; ++r) {
      const std::size_t u = std::size_t(r);
      node_of_[u] = all[3 * u];
      local_of_[u] = all[3 * u + 1];
      real_node_of_[u] = all[3 * u + 2];
      rank_of_[std::size_t(node_of_[u]) * std::size_t(inner_) + std::size_t(local_of_[u])] = r;
    }
    node_ = node_of_[std::size_t(rank())];
    local_ = local_of_[std::size_t(rank())];
  }

  // Pieces, who needs each, routes; this rank's sub-layouts.
  void plan(const ExecSpace* exec, const Layout* global) {
    require(block_ >= 1, where, "block", block_, "a positive number of tokens");
    const int P = size();
    const std::vector<Segment> first = shard_segments(tokens_, P, 0, options_.sharding, block_);  // validates
    const std::int64_t segment_tokens = first.front().tokens, segment_blocks = segment_tokens / block_;
    require(options_.pieces >= 0, where, "options.pieces", options_.pieces, "0 (automatic) or a number of pieces");
    const std::int64_t per_segment =
        options_.pieces > 0 ? options_.pieces : std::max<std::int64_t>(1, (segment_tokens + 2047) / 2048);
    require(per_segment <= segment_blocks, where, "options.pieces", options_.pieces,
            "at most " + std::to_string(segment_blocks) + " (a piece holds whole " + std::to_string(block_) +
                "-token blocks)");
    std::vector<std::vector<Segment>> all(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) all[std::size_t(r)] = shard_segments(tokens_, P, r, options_.sharding, block_);
    segments_ = all[std::size_t(rank())];
    pieces_per_rank_ = std::size_t(per_segment) * segments_.size();
    for (int r = 0; r < P; ++r)
      for (const Segment& s : all[std::size_t(r)])
        for (std::int64_t p = 0; p < per_segment; ++p) {  // blocks split as evenly as possible
          const std::int64_t b0 = segment_blocks * p / per_segment, b1 = segment_blocks * (p + 1) / per_segment;
          pieces_.push_back(Piece{r, s.global_begin + b0 * block_, s.local_begin + b0 * block_, (b1 - b0) * block_});
          largest_piece_ = std::max(largest_piece_, (b1 - b0) * block_);
        }

    if (global) {
      require(global->shape().block == block_, where, "layout block", global->shape().block, std::to_string(block_));
      const auto host_offsets = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), global->row_offsets());
      const auto host_entries = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), global->key_blocks_of_rows());
      sparse_offsets_.assign(host_offsets.data(), host_offsets.data() + host_offsets.size());
      sparse_entries_.assign(host_entries.data(), host_entries.data() + host_entries.size());
      sparse_shape_ = global->shape();
    }
    // Who needs each piece: in each node the piece reaches, the last inner step at which a rank
    // needs it; the outer route ends at the last node where one does.
    auto needs = [&](int r, const Piece& p) {
      for (const Segment& s : all[std::size_t(r)])
        if (kept_blocks(s, p, nullptr, nullptr) > 0) return true;
      return false;
    };
    outer_routes_.assign(pieces_.size(), -1);
    inner_routes_.assign(pieces_.size() * std::size_t(outer_), -1);
    for (std::size_t i = 0; i < pieces_.size(); ++i)
      for (int o = 0; o < outer_; ++o)
        for (int s = inner_ - 1; s >= 0; --s)
          if (needs(holder(pieces_[i].owner, o, s), pieces_[i])) {
            inner_routes_[i * std::size_t(outer_) + std::size_t(o)] = s;
            outer_routes_[i] = o;
            break;
          }
    for (int g = 0; g < int(segments_.size()); ++g)
      for (int owner = 0; owner < P; ++owner)
        for (int c = 0; c < rounds(); ++c) {
          std::vector<std::int64_t> rows;
          std::vector<int> kept;
          const std::int64_t n = kept_blocks(segments_[std::size_t(g)], piece(owner, c), global ? &rows : nullptr,
                                             global ? &kept : nullptr);
          if (n == 0) continue;
          std::shared_ptr<Layout> sub;
          if (global) {
            BlockSparseShape shape = sparse_shape_;
            shape.queries = segments_[std::size_t(g)].tokens;
            shape.keys = piece(owner, c).tokens;
            sub = std::make_shared<Layout>(*exec, shape, rows, kept);
          }
          computed_.emplace(key(g, owner, c), sub);
        }
  }

  // Kept (query block, key block) pairs between a segment's queries and a piece's keys: causal
  // visibility, and the layout's pairs if block-sparse. With rows/kept given, also the block-CSR
  // of that sub-rectangle (key blocks relative to the piece).
  std::int64_t kept_blocks(const Segment& s, const Piece& p, std::vector<std::int64_t>* rows,
                           std::vector<int>* kept) const {
    const std::int64_t q0 = s.global_begin / block_, nq = s.tokens / block_;
    const std::int64_t k0 = p.global_begin / block_, nk = p.tokens / block_;
    auto visible = [&](std::int64_t qb, std::int64_t kb) { return !causal_ || kb <= qb; };  // whole blocks
    if (sparse_offsets_.empty()) {
      if (!causal_) return nq * nk;
      std::int64_t n = 0;
      for (std::int64_t qb = q0; qb < q0 + nq; ++qb) n += std::clamp<std::int64_t>(qb - k0 + 1, 0, nk);
      return n;
    }
    std::int64_t n = 0;
    if (rows) rows->assign(1, 0);
    const std::int64_t query_blocks = sparse_shape_.query_blocks();
    for (std::int64_t pattern = 0; pattern < sparse_shape_.patterns(); ++pattern)
      for (std::int64_t qb = q0; qb < q0 + nq; ++qb) {
        const std::int64_t row = pattern * query_blocks + qb;
        const int* begin = sparse_entries_.data() + sparse_offsets_[std::size_t(row)];
        const int* end = sparse_entries_.data() + sparse_offsets_[std::size_t(row) + 1];
        for (const int* e = std::lower_bound(begin, end, int(k0)); e != end && *e < k0 + nk; ++e)
          if (visible(qb, *e)) {
            ++n;
            if (kept) kept->push_back(int(*e - k0));
          }
        if (rows) rows->push_back(std::int64_t(kept ? kept->size() : 0));
      }
    return n;
  }

  Communicator group_;
  std::int64_t tokens_;
  int block_;
  bool causal_;
  RingOptions options_;
  int outer_ = 1, inner_ = 1, node_ = 0, local_ = 0;   // the grid, and this rank's place in it
  std::vector<int> rank_of_, node_of_, local_of_, real_node_of_;  // rank at (node, local); each
                                                                  // rank's place; its node
  std::vector<Segment> segments_;
  std::vector<Piece> pieces_;  // every rank's, by owner then round
  std::size_t pieces_per_rank_ = 0;
  std::int64_t largest_piece_ = 0;
  std::vector<int> outer_routes_, inner_routes_;  // per piece; per piece and outer step
  std::map<std::tuple<int, int, int>, std::shared_ptr<Layout>> computed_;
  std::vector<std::int64_t> sparse_offsets_;
  std::vector<int> sparse_entries_;
  BlockSparseShape sparse_shape_;
  mutable RingTimings timings_;
};

namespace detail {

// K and V of one piece packed in one message: [2][B][tokens][H][D], contiguous.
template <class T, class Memory>
using Packed = Kokkos::View<T*****, Kokkos::LayoutRight, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// A buffer for the largest piece, from the context's pool (a communication buffer); views of it
// for any piece.
template <class T, class Memory>
struct PieceBuffer {
  using Memory1 = memory::PooledView<Kokkos::View<T*, Memory>>;
  Memory1 memory;
  int batch = 0, heads = 0, head_dim = 0;
  PieceBuffer(const memory::Pool<Memory>& pool, std::int64_t largest, int B, int H, int D)
      : memory(allocate(pool, std::size_t(2) * B * largest * H * D)), batch(B), heads(H), head_dim(D) {}
  static Memory1 allocate(const memory::Pool<Memory>& pool, std::size_t elements) {
    const memory::CategoryScope scope(memory::Category::communication_buffers);
    return Memory1(pool, elements);
  }
  Packed<T, Memory> packed(std::int64_t tokens) const {
    return Packed<T, Memory>(memory.data(), 2, batch, tokens, heads, head_dim);
  }
  auto keys(std::int64_t tokens) const {
    return Kokkos::subview(packed(tokens), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
  }
  auto values(std::int64_t tokens) const {
    return Kokkos::subview(packed(tokens), 1, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
  }
  std::size_t count(std::int64_t tokens) const { return std::size_t(2) * batch * tokens * heads * head_dim; }
};

// The K/V buffers of a pass. Flat ring: two, alternating steps. Two levels: two for the inner
// ring's steps and two for the pieces from the previous node (the one of this outer step goes on
// to the next node meanwhile, the next arrives).
template <class T, class Memory>
class KvBuffers {
 public:
  using Buffer = PieceBuffer<T, Memory>;
  KvBuffers(const memory::Pool<Memory>& pool, int outer, int inner, std::int64_t largest, int B, int H, int D) {
    auto make = [&] { return std::make_shared<Buffer>(pool, largest, B, H, D); };
    outer_[0] = make();
    if (outer > 1) outer_[1] = make();
    if (inner > 1) {
      inner_[0] = outer > 1 ? make() : outer_[0];
      inner_[1] = make();
    }
  }
  const Buffer& at(int o, int s) const { return s == 0 ? *outer_[o % 2] : *inner_[s % 2]; }  // step (o, s)'s

 private:
  std::shared_ptr<Buffer> outer_[2], inner_[2];
};

// dst += src, element by element (rank-4 views of equal extents, any layout).
template <class ExecSpace, class Dst, class Src>
void add_into(const ExecSpace& exec, const Dst& dst, const Src& src) {
  Kokkos::parallel_for(
      "longattn::ring_attention::add",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<4>>(exec, {0, 0, 0, 0},
                                                        {dst.extent(0), dst.extent(1), dst.extent(2), dst.extent(3)}),
      KOKKOS_LAMBDA(int b, int n, int h, int d) { dst(b, n, h, d) += src(b, n, h, d); });
}

// The messages a rank starts together at one step (one exchange: communicator.hpp), added in
// the same order on every rank - K and V pieces, then gradients along the inner ring, then
// nodes' totals going home - so that the messages between two ranks pair up in order, as NCCL
// pairs them. Counts the bytes sent in the plan's timings.
template <class ExecSpace>
class StepTransfers {
 public:
  explicit StepTransfers(const RingPlan<ExecSpace>& plan) : plan_(plan) {}
  template <class T, class Memory>
  void send(const PieceBuffer<T, Memory>& buffer, std::int64_t tokens, int destination) {
    const std::size_t count = buffer.count(tokens);
    plan_.timings().bytes_sent += std::int64_t(count * sizeof(T));
    if (!plan_.same_node(destination)) plan_.timings().bytes_sent_off_node += std::int64_t(count * sizeof(T));
    transfers_.push_back(Transfer::send(buffer.memory.data(), count, data_type_of<T>(), destination));
  }
  template <class T, class Memory>
  void receive(const PieceBuffer<T, Memory>& buffer, std::int64_t tokens, int source) {
    transfers_.push_back(Transfer::receive(buffer.memory.data(), buffer.count(tokens), data_type_of<T>(), source));
  }
  // An exchange with nothing in it is not started (it would move nothing, on any transport).
  Request start(const ExecSpace& exec) const {
    return transfers_.empty() ? Request() : plan_.group().exchange(exec, transfers_);
  }

 private:
  const RingPlan<ExecSpace>& plan_;
  std::vector<Transfer> transfers_;
};

// Step (o, 0) of round c between nodes: the piece held goes to the next node, the one for step
// (o + 1, 0) comes from the previous node (in flight for the whole outer step).
template <class ExecSpace, class T, class Memory>
void add_outer_kv(StepTransfers<ExecSpace>& x, const RingPlan<ExecSpace>& plan, const KvBuffers<T, Memory>& kv, int o,
                  int c) {
  if (plan.sends_outer(o, c)) x.send(kv.at(o, 0), plan.piece(plan.owner_at(o, 0), c).tokens, plan.next_outer());
  if (plan.receives_outer(o, c))
    x.receive(kv.at(o + 1, 0), plan.piece(plan.owner_at(o + 1, 0), c).tokens, plan.previous_outer());
}

// Step (o, s) of round c inside the node: the piece held goes on, the next one arrives.
template <class ExecSpace, class T, class Memory>
void add_inner_kv(StepTransfers<ExecSpace>& x, const RingPlan<ExecSpace>& plan, const KvBuffers<T, Memory>& kv, int o,
                  int s, int c) {
  if (plan.sends_inner(o, s, c)) x.send(kv.at(o, s), plan.piece(plan.owner_at(o, s), c).tokens, plan.next_inner());
  if (plan.receives_inner(o, s, c))
    x.receive(kv.at(o, s + 1), plan.piece(plan.owner_at(o, s + 1), c).tokens, plan.previous_inner());
}

// This rank's piece of round c, K and V packed, into the buffer of step (0, 0).
template <class ExecSpace, class T, class Memory, class K, class V>
void load_own_piece(const ExecSpace& exec, const RingPlan<ExecSpace>& plan, const KvBuffers<T, Memory>& kv, const K& k,
                    const V& v, int c) {
  if (!plan.holds(0, 0, c)) return;
  const Piece& mine = plan.piece(plan.group().rank(), c);
  const auto& buffer = kv.at(0, 0);
  Kokkos::deep_copy(exec, buffer.keys(mine.tokens), token_range<1>(k, mine.local_begin, mine.tokens));
  Kokkos::deep_copy(exec, buffer.values(mine.tokens), token_range<1>(v, mine.local_begin, mine.tokens));
  exec.fence();
}

// Adds the seconds from its construction to its destruction to `total`.
class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

template <class ExecSpace, class T, class View>
void check_ring_tensor(const char* where, const char* name, const View& view, std::int64_t batch, std::int64_t local,
                       std::int64_t heads, std::int64_t head_dim) {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                "ring attention: tensors that the execution space can reach");
  if constexpr (View::rank == 4)
    longattn::check_extents(where, name, view, {batch, local, heads, head_dim},
                                    "[batch, tokens of this rank, heads, head dim]");
  else
    longattn::check_extents(where, name, view, {batch, heads, local}, "[batch, heads, tokens of this rank]");
}

template <class ExecSpace, class Q>
void check_ring_inputs(const char* where, const RingPlan<ExecSpace>& plan, const Q& q, const AttentionOptions& opts,
                       int block) {
  const std::int64_t local = plan.tokens() / plan.group().size();
  require(std::int64_t(q.extent(1)) == local, where, "q.extent(1)", q.extent(1),
          std::to_string(local) + " (the plan's " + std::to_string(plan.tokens()) + " tokens over " +
              std::to_string(plan.group().size()) + " ranks)");
  require(opts.causal == plan.causal(), where, "opts.causal", opts.causal ? "true" : "false",
          std::string(plan.causal() ? "true" : "false") + " (as the plan was made)");
  require(plan.block() == block, where, "plan.block()", plan.block(), std::to_string(block) + " (the kernels' block)");
}

// The options of one (segment, piece) pair: global offsets.
inline AttentionOptions pair_options(AttentionOptions opts, const Segment& s, const Piece& p) {
  opts.query_offset += s.global_begin;
  opts.key_offset += p.global_begin;
  return opts;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
template <class On, class Q, class K, class V, class O, class Lse>
void ring_attention_forward(const On& on, const RingPlan<execution_space_of<On>>& plan, const AttentionInputs<Q, K, V>& in,
                            const AttentionOutputs<O, Lse>& out, const AttentionOptions& opts = {}) {
  using ExecSpace = execution_space_of<On>;
  const auto& context = context_of(on);
  const ExecSpace& exec = context.exec();
  const Q& q = in.q;
  const K& k = in.k;
  const V& v = in.v;
  const O& o = out.o;
  const Lse& lse = out.lse;
  using T = longattn::scalar_of<Q>;
  using Acc = accumulate_t<T>;
  using Memory = typename ExecSpace::memory_space;
  constexpr bool half = is_half_v<T>;
  const char* where = "longattn::parallel::ring_attention_forward";
  const Communicator& comm = plan.group();
  const std::int64_t B = q.extent(0), local = q.extent(1), H = q.extent(2), D = q.extent(3);
  comm.checked(where, [&] {
    detail::check_ring_inputs(where, plan, q, opts, attention_block_size<ExecSpace, T>());
    detail::check_ring_tensor<ExecSpace, T>(where, "k", k, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "v", v, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "o", o, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "lse", lse, B, local, H, D);
  });
  // 16-bit storage: the output accumulates over the steps in float (o_wide), each step's partial
  // output merged into it, and is rounded into o once at the end. Float and double accumulate in
  // o itself, inside the kernel.
  const std::int64_t segment_tokens = plan.segments().front().tokens;
  memory::PooledView<Kokkos::View<Acc****, Kokkos::LayoutRight, Memory>> o_wide;
  memory::PooledView<Kokkos::View<T****, Kokkos::LayoutRight, Memory>> o_part;
  memory::PooledView<Kokkos::View<Acc***, Kokkos::LayoutRight, Memory>> lse_part;
  if constexpr (half) {
    const memory::CategoryScope scope(memory::Category::workspaces);
    o_wide = context.template allocate<Kokkos::View<Acc****, Kokkos::LayoutRight, Memory>>(B, local, H, D);
    o_part = context.template allocate<Kokkos::View<T****, Kokkos::LayoutRight, Memory>>(B, segment_tokens, H, D);
    lse_part = context.template allocate<Kokkos::View<Acc***, Kokkos::LayoutRight, Memory>>(B, H, segment_tokens);
    if (opts.accumulate_output) convert(exec, o, o_wide.view());
    else Kokkos::deep_copy(exec, o_wide.view(), Acc(0));
  } else if (!opts.accumulate_output) {
    Kokkos::deep_copy(exec, o, T(0));
  }
  if (!opts.accumulate_output) Kokkos::deep_copy(exec, lse, -std::numeric_limits<Acc>::infinity());
  AttentionOptions step_opts = opts;
  step_opts.accumulate_output = !half;
  const detail::KvBuffers<T, Memory> kv(context.pool(), plan.outer_steps(), plan.inner_steps(), plan.largest_piece(),
                                        int(B), int(H), int(D));
  RingTimings& timings = plan.timings();
  comm.guarded(where, [&] {
    for (int c = 0; c < plan.rounds(); ++c)
      for (int outer = 0; outer < plan.outer_steps(); ++outer) {
        Request outer_transfers;  // overlap the whole outer step
        for (int s = 0; s < plan.inner_steps(); ++s) {
          const int owner = plan.owner_at(outer, s);
          const Piece& held = plan.piece(owner, c);
          const auto& buffer = kv.at(outer, s);
          if (outer == 0 && s == 0) detail::load_own_piece(exec, plan, kv, k, v, c);
          if (s == 0) {
            detail::StepTransfers<ExecSpace> x(plan);
            detail::add_outer_kv(x, plan, kv, outer, c);
            outer_transfers = x.start(exec);
          }
          detail::StepTransfers<ExecSpace> x(plan);
          detail::add_inner_kv(x, plan, kv, outer, s, c);
          Request transfers = x.start(exec);
          std::optional<detail::Stopwatch> computing(std::in_place, timings.compute_seconds);
          if (plan.holds(outer, s, c))
            for (int g = 0; g < int(plan.segments().size()); ++g) {
              if (!plan.computes(g, owner, c)) continue;
              const Segment& seg = plan.segments()[std::size_t(g)];
              const auto pair_opts = detail::pair_options(step_opts, seg, held);
              const auto q_seg = detail::token_range<1>(q, seg.local_begin, seg.tokens);
              const auto lse_seg = detail::token_range<2>(lse, seg.local_begin, seg.tokens);
              auto forward = [&](const auto& o_out, const auto& lse_out) {
                if (const auto* layout = plan.layout(g, owner, c))
                  attention_forward(context, q_seg, buffer.keys(held.tokens), buffer.values(held.tokens), o_out, lse_out,
                                    pair_opts, *layout);
                else
                  attention_forward(context, q_seg, buffer.keys(held.tokens), buffer.values(held.tokens), o_out, lse_out,
                                    pair_opts);
              };
              if constexpr (half) {
                const auto o_step = detail::token_range<1>(o_part.view(), 0, seg.tokens);
                const auto lse_step = detail::token_range<2>(lse_part.view(), 0, seg.tokens);
                forward(o_step, lse_step);
                merge_partial(exec, detail::token_range<1>(o_wide.view(), seg.local_begin, seg.tokens), lse_seg, o_step,
                              lse_step);
              } else {
                forward(detail::token_range<1>(o, seg.local_begin, seg.tokens), lse_seg);
              }
            }
          exec.fence();
          computing.reset();
          const detail::Stopwatch waiting(timings.wait_seconds);
          transfers.wait();
        }
        const detail::Stopwatch waiting(timings.wait_seconds);
        outer_transfers.wait();
      }
    if constexpr (half) {
      convert(exec, o_wide.view(), o);
      exec.fence();
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Backward: dq accumulates locally; the dK, dV of a piece follow it round each node's inner ring
// (each holder adds its part) and the last holder in the node returns them to the piece's owner,
// which adds the nodes' totals in a fixed order.
template <class On, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
void ring_attention_backward(const On& on, const RingPlan<execution_space_of<On>>& plan,
                             const AttentionInputs<Q, K, V>& in, const AttentionOutputs<O, Lse>& out, const DO& d_o,
                             const AttentionGradients<DQ, DK, DV>& grad, const AttentionOptions& opts = {}) {
  using ExecSpace = execution_space_of<On>;
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
  using Acc = accumulate_t<T>;
  using Memory = typename ExecSpace::memory_space;
  constexpr bool half = is_half_v<T>;
  const char* where = "longattn::parallel::ring_attention_backward";
  const Communicator& comm = plan.group();
  const int me = comm.rank(), inner_steps = plan.inner_steps(), outer_steps = plan.outer_steps();
  const std::int64_t B = q.extent(0), local = q.extent(1), H = q.extent(2), D = q.extent(3);
  comm.checked(where, [&] {
    detail::check_ring_inputs(where, plan, q, opts, attention_block_size<ExecSpace, T>());
    detail::check_ring_tensor<ExecSpace, T>(where, "k", k, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "v", v, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "o", o, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "d_o", d_o, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "lse", lse, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "dq", dq, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "dk", dk, B, local, H, D);
    detail::check_ring_tensor<ExecSpace, T>(where, "dv", dv, B, local, H, D);
  });
  // 16-bit storage: dq, dk and dv accumulate over the steps in float copies (each step's kernel
  // writes its part in T, added in float), a piece's gradient travels the ring in float, and the
  // totals are rounded into dq, dk, dv once at the end. Float and double accumulate in place.
  using Wide = Kokkos::View<Acc****, Kokkos::LayoutRight, Memory>;
  memory::PooledView<Wide> dq_wide, dk_wide, dv_wide;
  if constexpr (half) {
    const memory::CategoryScope scope(memory::Category::workspaces);
    for (auto* wide : {&dq_wide, &dk_wide, &dv_wide}) *wide = context.template allocate<Wide>(B, local, H, D);
    if (opts.accumulate_gradients) {
      convert(exec, dq, dq_wide.view());
      convert(exec, dk, dk_wide.view());
      convert(exec, dv, dv_wide.view());
    } else {
      for (auto* wide : {&dq_wide, &dk_wide, &dv_wide}) Kokkos::deep_copy(exec, wide->view(), Acc(0));
    }
  } else if (!opts.accumulate_gradients) {
    Kokkos::deep_copy(exec, dq, T(0));
    Kokkos::deep_copy(exec, dk, T(0));
    Kokkos::deep_copy(exec, dv, T(0));
  }
  // Where the gradients accumulate: the float copies, or the tensors themselves.
  const auto dq_total = [&] { if constexpr (half) return dq_wide.view(); else return dq; }();
  const auto dk_total = [&] { if constexpr (half) return dk_wide.view(); else return dk; }();
  const auto dv_total = [&] { if constexpr (half) return dv_wide.view(); else return dv; }();
  AttentionOptions step_opts = opts;
  step_opts.accumulate_gradients = !half;
  const int largest = int(plan.largest_piece()), b = int(B), h = int(H), d = int(D);
  using Buffer = detail::PieceBuffer<Acc, Memory>;  // a piece's gradient (dK, dV)
  const auto& pool = context.pool();
  const detail::KvBuffers<T, Memory> kv(pool, outer_steps, inner_steps, largest, b, h, d);
  // dK, dV of the piece held (two: the last step's goes out while this step's is computed); the
  // accumulator from the previous rank.
  const Buffer piece_grad[2] = {{pool, largest, b, h, d}, {pool, largest, b, h, d}};
  const Buffer incoming{pool, largest, b, h, d};
  // 16-bit: one step's part of dq (one segment) and of the piece's dK, dV, in T.
  std::optional<detail::PieceBuffer<T, Memory>> piece_part;
  memory::PooledView<Kokkos::View<T****, Kokkos::LayoutRight, Memory>> dq_part;
  if constexpr (half) {
    piece_part.emplace(pool, largest, b, h, d);
    const memory::CategoryScope scope(memory::Category::workspaces);
    dq_part = context.template allocate<Kokkos::View<T****, Kokkos::LayoutRight, Memory>>(
        B, plan.segments().front().tokens, H, D);
  }
  // This rank's own piece, a node's total back from its route (one per outer step in flight).
  std::vector<Buffer> returned;
  returned.reserve(2);
  for (int i = 0; i < std::min(2, outer_steps); ++i) returned.emplace_back(pool, largest, b, h, d);
  RingTimings& timings = plan.timings();
  comm.guarded(where, [&] {
    for (int c = 0; c < plan.rounds(); ++c) {
      const Piece& mine = plan.piece(me, c);
      // A step's gradient leaves with the next step's exchange (where its receiver, computing that
      // step, takes it): on along the inner ring, or home to the piece's owner.
      struct Outgoing {
        const Buffer* gradient;
        std::int64_t tokens;
        int destination;
        bool along_ring;
      };
      std::optional<Outgoing> outgoing;
      bool total_arrived[2] = {false, false};  // per returned buffer: a node's total, not yet added
      auto add_node_total = [&](int slot) {
        if (!total_arrived[slot]) return;
        detail::add_into(exec, detail::token_range<1>(dk_total, mine.local_begin, mine.tokens),
                         returned[std::size_t(slot)].keys(mine.tokens));
        detail::add_into(exec, detail::token_range<1>(dv_total, mine.local_begin, mine.tokens),
                         returned[std::size_t(slot)].values(mine.tokens));
        exec.fence();
        total_arrived[slot] = false;
      };
      // The exchange after step `done` ends this rank's piece's route in the node of outer step
      // o: that node's total comes home in it.
      auto receive_node_total = [&](detail::StepTransfers<ExecSpace>& x, int done) {
        const int o = done / inner_steps, s = done % inner_steps;
        if (done < 0 || s != plan.inner_route(me, c, o) || (o == 0 && s == 0)) return;
        x.receive(returned[std::size_t(o % 2)], mine.tokens, plan.holder(me, o, s));
        total_arrived[o % 2] = true;
      };
      auto send_outgoing = [&](detail::StepTransfers<ExecSpace>& x, bool along_ring) {
        if (outgoing && outgoing->along_ring == along_ring)
          x.send(*outgoing->gradient, outgoing->tokens, outgoing->destination);
      };
      for (int outer = 0; outer < outer_steps; ++outer) {
        add_node_total(outer % 2);  // its buffer takes this outer step's total
        Request outer_transfers;
        for (int s = 0; s < inner_steps; ++s) {
          const int owner = plan.owner_at(outer, s), step = outer * inner_steps + s;
          const Piece& held = plan.piece(owner, c);
          const auto& buffer = kv.at(outer, s);
          if (outer == 0 && s == 0) detail::load_own_piece(exec, plan, kv, k, v, c);
          if (s == 0) {
            detail::StepTransfers<ExecSpace> x(plan);
            detail::add_outer_kv(x, plan, kv, outer, c);
            outer_transfers = x.start(exec);
          }
          // K/V, gradients along the ring, totals home: the order of StepTransfers.
          const bool accumulates = plan.accumulates(outer, s, c), receives_gradient = accumulates && s >= 1;
          detail::StepTransfers<ExecSpace> x(plan);
          detail::add_inner_kv(x, plan, kv, outer, s, c);
          send_outgoing(x, true);
          if (receives_gradient) x.receive(incoming, held.tokens, plan.previous_inner());
          send_outgoing(x, false);
          receive_node_total(x, step - 1);
          outgoing.reset();
          Request transfers = x.start(exec);
          if (accumulates) {
            const Buffer& g = piece_grad[step % 2];
            std::optional<detail::Stopwatch> computing(std::in_place, timings.compute_seconds);
            Kokkos::deep_copy(exec, g.packed(held.tokens), Acc(0));
            for (int seg_index = 0; seg_index < int(plan.segments().size()); ++seg_index) {
              if (!plan.computes(seg_index, owner, c)) continue;
              const Segment& seg = plan.segments()[std::size_t(seg_index)];
              const auto pair_opts = detail::pair_options(step_opts, seg, held);
              const auto q_seg = detail::token_range<1>(q, seg.local_begin, seg.tokens);
              const auto o_seg = detail::token_range<1>(o, seg.local_begin, seg.tokens);
              const auto do_seg = detail::token_range<1>(d_o, seg.local_begin, seg.tokens);
              const auto dq_seg = detail::token_range<1>(dq_total, seg.local_begin, seg.tokens);
              const auto lse_seg = detail::token_range<2>(lse, seg.local_begin, seg.tokens);
              auto backward = [&](const auto& dq_out, const auto& dk_out, const auto& dv_out) {
                if (const auto* layout = plan.layout(seg_index, owner, c))
                  attention_backward(context, q_seg, buffer.keys(held.tokens), buffer.values(held.tokens), o_seg,
                                     do_seg, lse_seg, dq_out, dk_out, dv_out, pair_opts, *layout);
                else
                  attention_backward(context, q_seg, buffer.keys(held.tokens), buffer.values(held.tokens), o_seg,
                                     do_seg, lse_seg, dq_out, dk_out, dv_out, pair_opts);
              };
              if constexpr (half) {
                const auto dq_step = detail::token_range<1>(dq_part.view(), 0, seg.tokens);
                backward(dq_step, piece_part->keys(held.tokens), piece_part->values(held.tokens));
                detail::add_into(exec, dq_seg, dq_step);
                detail::add_into(exec, g.keys(held.tokens), piece_part->keys(held.tokens));
                detail::add_into(exec, g.values(held.tokens), piece_part->values(held.tokens));
              } else {
                backward(dq_seg, g.keys(held.tokens), g.values(held.tokens));
              }
            }
            exec.fence();
            computing.reset();
            if (receives_gradient) {  // the parts of the ranks before this one in the node
              {
                const detail::Stopwatch waiting(timings.wait_seconds);
                transfers.wait();
              }
              const detail::Stopwatch adding(timings.compute_seconds);
              detail::add_into(exec, g.keys(held.tokens), incoming.keys(held.tokens));
              detail::add_into(exec, g.values(held.tokens), incoming.values(held.tokens));
              exec.fence();
            }
            if (plan.sends_inner(outer, s, c))  // on with the piece
              outgoing = Outgoing{&g, held.tokens, plan.next_inner(), true};
            else if (step > 0)  // the end of its route in this node: the node's total goes home
              outgoing = Outgoing{&g, held.tokens, owner, false};
            else {  // a piece only its owner needs
              detail::add_into(exec, detail::token_range<1>(dk_total, mine.local_begin, mine.tokens), g.keys(mine.tokens));
              detail::add_into(exec, detail::token_range<1>(dv_total, mine.local_begin, mine.tokens), g.values(mine.tokens));
            }
          }
          const detail::Stopwatch waiting(timings.wait_seconds);
          transfers.wait();
        }
        const detail::Stopwatch waiting(timings.wait_seconds);
        outer_transfers.wait();
      }
      {  // the round's end: the last step's gradient goes home, the last totals arrive
        detail::StepTransfers<ExecSpace> x(plan);
        send_outgoing(x, false);
        receive_node_total(x, outer_steps * inner_steps - 1);
        outgoing.reset();
        const detail::Stopwatch waiting(timings.wait_seconds);
        x.start(exec).wait();
      }
      for (int outer = std::max(0, outer_steps - 2); outer < outer_steps; ++outer) add_node_total(outer % 2);
      exec.fence();
    }
    if constexpr (half) {
      convert(exec, dq_wide.view(), dq);
      convert(exec, dk_wide.view(), dk);
      convert(exec, dv_wide.view(), dv);
      exec.fence();
    }
  });
}

// Dense ring attention over this group, with a plan made for the call.
template <class On, class Q, class K, class V, class O, class Lse>
void ring_attention_forward(const On& on, const Communicator& group, const AttentionInputs<Q, K, V>& in,
                            const AttentionOutputs<O, Lse>& out, const AttentionOptions& opts = {},
                            const RingOptions& ring = {}) {
  using ExecSpace = execution_space_of<On>;
  const RingPlan<ExecSpace> plan(group, std::int64_t(in.q.extent(1)) * group.size(),
                                 attention_block_size<ExecSpace, longattn::scalar_of<Q>>(), opts.causal, ring);
  ring_attention_forward(on, plan, in, out, opts);
}

template <class On, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
void ring_attention_backward(const On& on, const Communicator& group, const AttentionInputs<Q, K, V>& in,
                             const AttentionOutputs<O, Lse>& out, const DO& d_o,
                             const AttentionGradients<DQ, DK, DV>& grad, const AttentionOptions& opts = {},
                             const RingOptions& ring = {}) {
  using ExecSpace = execution_space_of<On>;
  const RingPlan<ExecSpace> plan(group, std::int64_t(in.q.extent(1)) * group.size(),
                                 attention_block_size<ExecSpace, longattn::scalar_of<Q>>(), opts.causal, ring);
  ring_attention_backward(on, plan, in, out, d_o, grad, opts);
}

}  // namespace longattn::parallel
