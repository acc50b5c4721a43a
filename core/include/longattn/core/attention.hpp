// Exact softmax attention, forward and backward, fused and tiled (FlashAttention-2): never an
// N x N matrix, O(N) memory, any Kokkos execution space.
//
//   attention_forward[<Tiles>](exec, q, k, v, o, lse, opts[, blocks])
//   attention_backward[<Tiles>](exec, q, k, v, o, d_o, lse, dq, dk, dv, opts[, blocks])
//
// Tensors are rank-4 views [B, N, H, D] (batch, tokens, heads, head dim) in any layout with
// strides (LayoutRight, LayoutLeft, LayoutStride: a view of every r-th token is not a copy);
// lse is [B, H, Nq], the natural log of each query's softmax denominator. Scalar T: float or
// double (accumulation in the same type), or the 16-bit storage types bfloat16 and float16
// (half.hpp; accumulation in float, and lse is float). q and o have Nq tokens, k and v Nk.
// `blocks` is the block pattern the kernels visit: dense by default (DenseBlocks), or a
// block-sparse layout (block_sparse_layout.hpp), whose cost is proportional to its kept blocks.
//
// Memory, from the pool of the ExecutionContext a pass is given (execution_context.hpp), or the
// default pool when given a bare instance: on a host space both passes copy the tensors they
// stream into head-major workspaces (AttentionOptions::head_major_copies: two B x H x N x D
// tensors at a time); the backward pass also allocates Delta = rowsum(dO * O),
// B * H * Nq * sizeof(accumulate_t<T>), and in its one-pass form, unless dq holds float or double
// with each head's rows together, dQ's sums (B * H * Nq * D). At most
// attention_forward_workspace_bytes() and attention_backward_workspace_bytes(). Each team also
// uses the scratch of attention_scratch_bytes() (per thread on a CPU).
//
// On Kokkos::Cuda (TensorCoreTiles, attention_tiles.hpp) bfloat16 and float16 tensors with head
// dims 64 and 128 (forward also 256) and rows of 16-byte chunks run on tensor cores
// (detail/tensor_core/), and so do float tensors with head dims 64 and 128 where
// AttentionOptions::allow_tf32 asks for it; their backward pass allocates 8 bytes per query
// (LSE, Delta) and, in its one-pass form, dQ's float sums (B * H * Nq * D), within the same bound.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "longattn/core/attention_tiles.hpp"
#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/dense_blocks.hpp"
#include "longattn/core/finite.hpp"
#include "longattn/core/half.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/detail/attention_kernels.hpp"
#include "longattn/core/detail/eti.hpp"
#include "longattn/core/detail/tensor_core/kernels.hpp"
#include "longattn/checks.hpp"
#include "longattn/error.hpp"

namespace longattn {

// How the backward pass is cut (detail/attention_kernels.hpp). `two`: a dK/dV pass and a dQ
// pass over B x H x blocks teams, 7 block products per block pair; `one`: one team per
// (batch, head) accumulates dQ as it goes, 5 products, for head dims that are multiples of
// attention_one_pass_head_dim_multiple(); `automatic`: one pass where B x H teams keep the space
// busy (5 x rounds of B x H over the teams it runs at once <= 7 x the even share) and the head
// dim allows, else two. The same gradients up to rounding, and both are deterministic.
enum class BackwardPasses { automatic, two, one };
inline const char* to_string(BackwardPasses passes) {
  return passes == BackwardPasses::automatic ? "automatic" : passes == BackwardPasses::two ? "two" : "one";
}

struct AttentionOptions {
  std::optional<double> softmax_scale;  // default 1 / sqrt(head dim)
  bool causal = false;                  // key j visible to query i iff key pos <= query pos
  std::int64_t query_offset = 0;        // global position of q's first token
  std::int64_t key_offset = 0;          // global position of k's first token
  // o = output_scale * softmax(q k^T) v (lse stays that of the unscaled softmax); backward
  // differentiates the scaled output. Dilated attention's head_groups mode divides by groups.
  double output_scale = 1;
  // Backward adds into dq, dk, dv instead of overwriting them: a query or key seen by several
  // passes (dilation configurations, ring steps) sums its gradients in place.
  bool accumulate_gradients = false;
  // Forward continues the softmax whose result (o, lse) is already there over k, v: the merge
  // of merge_partial, inside the kernel, with no partial buffers (ring steps). Start from
  // o = 0, lse = -inf for a first pass (or simply run the first pass without it). Needs a
  // non-zero output_scale.
  bool accumulate_output = false;
  // Check for NaN and infinity (find_non_finite, finite.hpp): the inputs before the kernels
  // run, the outputs after (inputs at the edge of the type's range can overflow the float
  // accumulation: bfloat16 near 3e38). The first one found is a longattn::Error naming the
  // tensor, the index and the value. Off by default: it reads every tensor once more and waits
  // for the instance (a debugging switch).
  bool check_finite = false;
  BackwardPasses backward_passes = BackwardPasses::automatic;
  // The same gradients bit for bit from run to run. The host and portable kernels always give
  // them; the tensor-core backward pass (Kokkos::Cuda, TensorCoreTiles) sums dQ in float with
  // atomic adds in an order that varies, unless this asks for a dQ pass of its own (two passes,
  // 7 block products instead of 5), as backward_passes = two does.
  bool deterministic = false;
  // float tensors on the tensor cores (TensorCoreTiles on Kokkos::Cuda) as TF32: the inputs and
  // the probabilities rounded to 10 mantissa bits for the products, which accumulate in float
  // (PyTorch's allow_tf32). Off: the portable kernels, float throughout. Other types and
  // configurations ignore it.
  bool allow_tf32 = false;
  // The tensor-core programs of 16-bit calls at head dims 64 and 128 (attention_tiles.hpp).
  TensorCoreProgram tensor_core_forward = TensorCoreProgram::automatic;
  TensorCoreProgram tensor_core_backward = TensorCoreProgram::automatic;
  // On a host space the kernels read the tensors they stream past a resident block (forward: K
  // and V; backward: Q and dO in the one-pass form and the dK/dV pass, K and V in the dQ pass)
  // from head-major copies ([B][H][N][D]: each head's rows together) that they take from the
  // pool, and the one-pass form sums dQ in such a workspace, wherever a head's rows are not
  // together already (the [B, N, H, D] layout puts them H * D elements apart). Contiguous rows
  // are what the CPU's prefetchers follow and what fills its caches' sets evenly: 1.1-1.3x
  // faster at N >= 4K (perf_tests/RESULTS.md). The price is transient memory, two B H N D
  // tensors (attention_forward_workspace_bytes). false: read them in place, allocate nothing.
  // Device spaces always read in place. The results are the same bit for bit.
  bool head_major_copies = true;
};

// Largest head dimension the kernels accept (scratch grows with it).
inline constexpr int attention_max_head_dim = 256;

// Tokens per block of the kernels on this execution space, scalar type and tile configuration
// (attention_tiles.hpp): block patterns (DenseBlocks, block-sparse layouts) are in these units.
template <class ExecSpace, class T, class Tiles = DefaultTiles>
constexpr int attention_block_size() {
  return tiles_for_t<ExecSpace, Tiles>::template shape<accumulate_t<T>>::block;
}

// The most the forward pass allocates from the pool: the head-major copies of K and V
// (AttentionOptions::head_major_copies; nothing on a device space or without them).
template <class T>
std::size_t attention_forward_workspace_bytes(int batch, int heads, int keys, int head_dim) {
  const char* where = "longattn::attention_forward_workspace_bytes";
  require(batch >= 0, where, "batch", batch, "a count >= 0");
  require(heads >= 0, where, "heads", heads, "a count >= 0");
  require(keys >= 0, where, "keys", keys, "a count >= 0");
  require(head_dim >= 0, where, "head_dim", head_dim, "a count >= 0");
  return 2 * std::size_t(batch) * heads * keys * head_dim * sizeof(T);
}

// The most the backward pass allocates from the pool: Delta, dQ's sums in the one-pass form,
// and the head-major copies of two of the tensors (of Q and dO, or of K and V: keys for Nq when
// the key count is larger).
template <class T>
std::size_t attention_backward_workspace_bytes(int batch, int heads, int queries, int head_dim, int keys = 0) {
  const char* where = "longattn::attention_backward_workspace_bytes";
  require(batch >= 0, where, "batch", batch, "a count >= 0");
  require(heads >= 0, where, "heads", heads, "a count >= 0");
  require(queries >= 0, where, "queries", queries, "a count >= 0");
  require(head_dim >= 0, where, "head_dim", head_dim, "a count >= 0");
  require(keys >= 0, where, "keys", keys, "a count >= 0 (0: as many as queries)");
  const std::size_t rows = std::size_t(batch) * heads;
  const std::size_t tokens = std::size_t(keys > queries ? keys : queries);
  return rows * queries * (1 + std::size_t(head_dim)) * sizeof(accumulate_t<T>) +
         2 * rows * tokens * head_dim * sizeof(T);
}

// Team scratch of the forward pass and of the largest backward kernel (the one-pass form's).
template <class ExecSpace, class T, class Tiles = DefaultTiles>
std::size_t attention_scratch_bytes(int head_dim, bool backward) {
  using Resolved = tiles_for_t<ExecSpace, Tiles>;
  return backward ? detail::KeyGradientKernel<ExecSpace, T, DenseBlocks, Resolved, true>::scratch_bytes(head_dim)
                  : detail::ForwardKernel<ExecSpace, T, DenseBlocks, Resolved>::scratch_bytes(head_dim);
}

// The one-pass backward form takes head dims that are multiples of this (the micro-tile width).
template <class ExecSpace, class T, class Tiles = DefaultTiles>
constexpr int attention_one_pass_head_dim_multiple() {
  return detail::KeyGradientKernel<ExecSpace, T, DenseBlocks, tiles_for_t<ExecSpace, Tiles>, true>::head_dim_multiple;
}

namespace detail {

template <class T>
std::string scalar_name() {
  if (std::is_same_v<T, float>) return "float";
  if (std::is_same_v<T, double>) return "double";
  if (std::is_same_v<T, bfloat16>) return "bfloat16";
  if (std::is_same_v<T, float16>) return "float16";
  return "an unsupported type";
}

// The attention kernels' storage types.
template <class T>
inline constexpr bool attention_scalar = std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T>;

// Whether the attention kernels run for storage type T: every tensor holds T, lse
// accumulate_t<T>; only then are the kernels compiled (otherwise the checks throw first).
template <class T, class Lse, class... Tensors>
inline constexpr bool runnable_attention = attention_scalar<T> && std::is_same_v<scalar_of<Lse>, accumulate_t<T>> &&
                                           (std::is_same_v<scalar_of<Tensors>, T> && ...);

// A view holds T (the value type of the view named `reference`) and lives where the execution
// space can reach it (a compile-time property: static_assert).
template <class ExecSpace, class T, class View>
void check_view(const char* where, const char* name, const View&, const char* reference = "q") {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,
                "longattn attention: a view's memory space is not accessible from the execution space");
  using Actual = scalar_of<View>;
  if constexpr (!std::is_same_v<Actual, T>)
    throw_invalid_argument(where, std::string(name) + "'s value type", scalar_name<Actual>(),
                           scalar_name<T>() + " (the value type of " + reference + ")");
}

// lse holds accumulate_t<T> for tensors of T (float for the 16-bit types).
template <class ExecSpace, class T, class Lse>
void check_lse_view(const char* where, const char* name, const Lse& lse, const char* reference = "q") {
  if constexpr (is_half_v<T>)
    check_view<ExecSpace, accumulate_t<T>>(where, name, lse,
                                           (std::string(reference) + "'s " + scalar_name<T>() + " accumulation").c_str());
  else
    check_view<ExecSpace, T>(where, name, lse, reference);
}

// The checks both passes share; returns the geometry.
template <class ExecSpace, class T, class Q, class K, class V, class O, class Lse>
AttentionGeometry check_attention(const char* where, const Q& q, const K& k, const V& v, const O& o,
                                  const Lse& lse, const AttentionOptions& opts) {
  static_assert(Q::rank == 4 && K::rank == 4 && V::rank == 4 && O::rank == 4,
                "q, k, v, o are rank-4 views [batch, tokens, heads, head dim]");
  static_assert(Lse::rank == 3, "lse is a rank-3 view [batch, heads, queries]");
  if constexpr (!attention_scalar<T>)
    throw_invalid_argument(where, "q's value type", scalar_name<T>(), "float, double, bfloat16 or float16");
  check_view<ExecSpace, T>(where, "q", q);
  check_view<ExecSpace, T>(where, "k", k);
  check_view<ExecSpace, T>(where, "v", v);
  check_view<ExecSpace, T>(where, "o", o);
  check_lse_view<ExecSpace, T>(where, "lse", lse);

  const std::int64_t B = q.extent(0), Nq = q.extent(1), H = q.extent(2), D = q.extent(3);
  const std::int64_t Nk = k.extent(1);
  constexpr std::int64_t int_limit = 1 << 30;
  const char* dims[] = {"batch", "tokens", "heads", "head dim"};
  for (int r = 0; r < 4; ++r)
    require(q.extent(r) > 0 && std::int64_t(q.extent(r)) < int_limit, where,
            std::string("q.extent(") + std::to_string(r) + ")", q.extent(r),
            std::string("a ") + dims[r] + " count in [1, 2^30)");
  require(Nk > 0 && Nk < int_limit, where, "k.extent(1)", Nk, "a key count in [1, 2^30)");
  require(D <= attention_max_head_dim, where, "q.extent(3)", D,
          "a head dim of at most " + std::to_string(attention_max_head_dim));
  check_extents(where, "k", k, {B, Nk, H, D}, "[batch, keys, heads, head dim] of q");
  check_extents(where, "v", v, {B, Nk, H, D}, "the extents of k");
  check_extents(where, "o", o, {B, Nq, H, D}, "the extents of q");
  check_extents(where, "lse", lse, {B, H, Nq}, "[batch, heads, queries] of q");
  if (opts.softmax_scale)
    require(std::isfinite(*opts.softmax_scale), where, "opts.softmax_scale", *opts.softmax_scale,
            "a finite number");
  require(std::isfinite(opts.output_scale), where, "opts.output_scale", opts.output_scale, "a finite number");
  require(!opts.accumulate_output || opts.output_scale != 0, where, "opts.output_scale", opts.output_scale,
          "a non-zero scale with accumulate_output (o is divided by it)");
  constexpr std::int64_t offset_limit = std::int64_t(1) << 62;
  require(opts.query_offset > -offset_limit && opts.query_offset < offset_limit, where,
          "opts.query_offset", opts.query_offset, "|offset| < 2^62");
  require(opts.key_offset > -offset_limit && opts.key_offset < offset_limit, where,
          "opts.key_offset", opts.key_offset, "|offset| < 2^62");

  AttentionGeometry geo;
  geo.batch = int(B);
  geo.heads = int(H);
  geo.queries = int(Nq);
  geo.keys = int(Nk);
  geo.head_dim = int(D);
  geo.query_offset = opts.query_offset;
  geo.key_offset = opts.key_offset;
  geo.causal = opts.causal;
  return geo;
}

}  // namespace detail

// The shape of an attention call (sizes, offsets, causal), as the checks below return it.
using AttentionGeometry = detail::AttentionGeometry;

// The argument checks attention_forward runs first: shapes, value types (T: q's), options, and
// outputs that alias no input; throws longattn::Error from `where`. Public for code that builds
// on the kernels (distributed dilated attention checks its shards with them).
template <class ExecSpace, class T, class Q, class K, class V, class O, class Lse>
AttentionGeometry check_attention_forward(const char* where, const Q& q, const K& k, const V& v, const O& o,
                                const Lse& lse, const AttentionOptions& opts) {
  const AttentionGeometry geo = detail::check_attention<ExecSpace, T>(where, q, k, v, o, lse, opts);
  check_no_alias(where, "o", o, "q", q);
  check_no_alias(where, "o", o, "k", k);
  check_no_alias(where, "o", o, "v", v);
  check_no_alias(where, "lse", lse, "q", q);
  check_no_alias(where, "lse", lse, "k", k);
  check_no_alias(where, "lse", lse, "v", v);
  check_no_alias(where, "lse", lse, "o", o);
  return geo;
}

// The checks of the backward pass: those of the forward inputs, then the gradients' shapes and
// that no gradient aliases an input or another gradient.
template <class ExecSpace, class T, class Q, class K, class V, class O, class DO, class Lse, class DQ,
          class DK, class DV>
AttentionGeometry check_attention_backward(const char* where, const Q& q, const K& k, const V& v, const O& o,
                                 const DO& d_o, const Lse& lse, const DQ& dq, const DK& dk, const DV& dv,
                                 const AttentionOptions& opts) {
  const AttentionGeometry geo = detail::check_attention<ExecSpace, T>(where, q, k, v, o, lse, opts);
  static_assert(DO::rank == 4 && DQ::rank == 4 && DK::rank == 4 && DV::rank == 4,
                "d_o, dq, dk, dv are rank-4 views [batch, tokens, heads, head dim]");
  detail::check_view<ExecSpace, T>(where, "d_o", d_o);
  detail::check_view<ExecSpace, T>(where, "dq", dq);
  detail::check_view<ExecSpace, T>(where, "dk", dk);
  detail::check_view<ExecSpace, T>(where, "dv", dv);
  const std::int64_t B = geo.batch, Nq = geo.queries, Nk = geo.keys, H = geo.heads, D = geo.head_dim;
  check_extents(where, "d_o", d_o, {B, Nq, H, D}, "the extents of o");
  check_extents(where, "dq", dq, {B, Nq, H, D}, "the extents of q");
  check_extents(where, "dk", dk, {B, Nk, H, D}, "the extents of k");
  check_extents(where, "dv", dv, {B, Nk, H, D}, "the extents of v");
  auto no_alias = [&](const char* name, const auto& output) {
    check_no_alias(where, name, output, "q", q);
    check_no_alias(where, name, output, "k", k);
    check_no_alias(where, name, output, "v", v);
    check_no_alias(where, name, output, "o", o);
    check_no_alias(where, name, output, "d_o", d_o);
    check_no_alias(where, name, output, "lse", lse);
  };
  no_alias("dq", dq);
  no_alias("dk", dk);
  no_alias("dv", dv);
  check_no_alias(where, "dq", dq, "dk", dk);
  check_no_alias(where, "dq", dq, "dv", dv);
  check_no_alias(where, "dk", dk, "dv", dv);
  return geo;
}

namespace detail {

// AttentionOptions::check_finite: `view` holds no NaN or infinity (lse: -inf is a query that
// sees no key).
template <class ExecSpace, class View>
void check_finite_tensor(const char* where, const ExecSpace& exec, const char* name, const View& view,
                         const std::string& expected, bool allow_minus_infinity = false) {
  const NonFinite bad = find_non_finite(exec, view, allow_minus_infinity);
  require(!bad.found, where, name, bad.describe(), expected);
}

inline const char* finite_input() { return "finite values (AttentionOptions::check_finite)"; }

inline double softmax_scale(const AttentionOptions& opts, int head_dim);

// AttentionOptions::check_finite, before the kernels: finite q, k, v; scores the accumulation
// type A resolves; output sums inside A. The scores (log2 units) are bounded by S = D x scale x
// log2(e) x max|q| x max|k|, and a D-term dot product's rounding by D x eps(A) x S: past 1, a
// probability is not determined to a factor of 2 (the forward and backward passes, which sum
// in different orders, then disagree), and past half of A's largest value the scores overflow.
// |sum_j p_ij v_j| <= Nk x max|v| (p <= 1 before normalization).
template <class ExecSpace, class T, class Q, class K, class V>
void check_attention_inputs(const char* where, const ExecSpace& exec, const Q& q, const K& k, const V& v,
                            const AttentionGeometry& geo, const AttentionOptions& opts) {
  check_finite_tensor(where, exec, "q", q, finite_input());
  check_finite_tensor(where, exec, "k", k, finite_input());
  check_finite_tensor(where, exec, "v", v, finite_input());
  using A = accumulate_t<T>;
  const double limit = double(std::numeric_limits<A>::max()) / 2;
  const double q_max = largest_magnitude(exec, q), k_max = largest_magnitude(exec, k);
  const double scores = geo.head_dim * std::abs(softmax_scale(opts, geo.head_dim)) * log2_e<double>() * q_max * k_max;
  const double rounding = geo.head_dim * double(std::numeric_limits<A>::epsilon()) * scores;
  std::ostringstream largest, expected;
  largest << "max |q| " << q_max << ", max |k| " << k_max;
  expected << "scores that " << scalar_name<A>() << ", the accumulation type, resolves: their bound S = head dim x "
           << "softmax scale x log2(e) x max |q| x max |k| = " << scores << " and its rounding head dim x eps x S = "
           << rounding << " must stay at most 1 (scale q or k down)";
  require(scores < limit && rounding <= 1, where, "q and k", largest.str(), expected.str());
  const double v_max = largest_magnitude(exec, v), sums = double(geo.keys) * v_max * std::abs(opts.output_scale);
  std::ostringstream v_largest, v_expected;
  v_largest << "max |v| " << v_max;
  v_expected << "sums over keys inside " << scalar_name<A>() << ": keys x max |v| x output scale = " << sums
             << " passes half its largest value (scale v down)";
  require(sums < limit, where, "v", v_largest.str(), v_expected.str());
}

// What a non-finite output from finite inputs means.
template <class T>
std::string overflowed(const char* what) {
  const std::string range = std::is_same_v<T, accumulate_t<T>>
                                ? scalar_name<T>() + "'s range"
                                : "the range of " + scalar_name<T>() + " (the output type) or of " +
                                      scalar_name<accumulate_t<T>>() + " (the accumulation type)";
  return std::string("finite values from finite inputs: ") + what + " passed " + range + "; scale the inputs down";
}

inline double softmax_scale(const AttentionOptions& opts, int head_dim) {
  return opts.softmax_scale ? *opts.softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

// The dense pattern of q against k (extents are checked later, with everything else).
template <class ExecSpace, class T, class Tiles, class Q, class K>
DenseBlocks dense_blocks(const Q& q, const K& k, const AttentionOptions& opts) {
  DenseBlocks blocks;
  if constexpr (attention_scalar<T>) blocks.block = attention_block_size<ExecSpace, T, Tiles>();
  blocks.queries = static_cast<int>(q.extent(1));
  blocks.keys = static_cast<int>(k.extent(1));
  blocks.query_offset = opts.query_offset;
  blocks.key_offset = opts.key_offset;
  blocks.causal = opts.causal;
  return blocks;
}

template <class Pattern, class = void>
struct has_memory_space : std::false_type {};
template <class Pattern>
struct has_memory_space<Pattern, std::void_t<typename Pattern::memory_space>> : std::true_type {};

// A block pattern must be cut in the kernel's blocks, cover q's and k's tokens, have a pattern
// for every (batch, head) and live where the kernels can read it.
template <class ExecSpace, class T, class Tiles, class Blocks>
void check_blocks(const char* where, const Blocks& blocks, const AttentionGeometry& geo) {
  const int block = attention_block_size<ExecSpace, T, Tiles>();
  require(blocks.block_size() == block, where, "blocks.block_size()", blocks.block_size(),
          std::to_string(block) + " (the kernel's block size here)");
  const int query_blocks = (geo.queries + block - 1) / block, key_blocks = (geo.keys + block - 1) / block;
  require(blocks.query_blocks() == query_blocks, where, "blocks.query_blocks()", blocks.query_blocks(),
          std::to_string(query_blocks) + " (blocks of q's tokens)");
  require(blocks.key_blocks() == key_blocks, where, "blocks.key_blocks()", blocks.key_blocks(),
          std::to_string(key_blocks) + " (blocks of k's tokens)");
  require(blocks.pattern_batch() == 1 || blocks.pattern_batch() == geo.batch, where, "blocks.pattern_batch()",
          blocks.pattern_batch(), "1 (shared) or " + std::to_string(geo.batch) + " (q's batch)");
  require(blocks.pattern_heads() == 1 || blocks.pattern_heads() == geo.heads, where, "blocks.pattern_heads()",
          blocks.pattern_heads(), "1 (shared) or " + std::to_string(geo.heads) + " (q's heads)");
  if constexpr (has_memory_space<Blocks>::value)
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename Blocks::memory_space>::accessible,
                  "longattn attention: the block pattern's memory space is not accessible from the execution space");
}

// Whether a kernel takes the bf16 path (attention_kernels.hpp): compiled for its types, and the
// CPU's bf16 tile or dot products in use (bf16_dot_products.hpp); it rounds to bf16 by
// AVX512-BF16's instruction where the CPU has it (the dot products' instruction set).
template <class Kernel>
void choose_bf16_path(Kernel& kernel) {
  kernel.bf16_products = Kernel::bf16_compiled && (bf16_tile_products_in_use() || bf16_dot_products_in_use());
  kernel.bf16_rounding = bf16_dot_products_available() ? detail::Bf16Rounding::avx512_bf16 : detail::Bf16Rounding::integer;
}

// Runs a team kernel in teams of its tile configuration's size, with its scratch in level 0
// (fast: shared memory on a GPU) where it fits, else level 1. A team larger than the space
// can run (on a host space: more threads than it has) is an error, not Kokkos' abort.
template <class ExecSpace, class Kernel>
void run_team_kernel(const char* label, const ExecSpace& exec, Kernel kernel) {
  using Policy = Kokkos::TeamPolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>>;
  const std::size_t bytes = Kernel::scratch_bytes(kernel.geo.head_dim);
  kernel.scratch_level = bytes <= std::size_t(Policy::scratch_size_max(0)) ? 0 : 1;
  const int team_size = Kernel::team_size;
  const int team_size_max = Policy(exec, kernel.league_size(), 1)
                                .set_scratch_size(kernel.scratch_level, Kokkos::PerTeam(bytes))
                                .team_size_max(kernel, Kokkos::ParallelForTag());
  require(team_size <= team_size_max, label, "Tiles::team_size", team_size,
          "at most " + std::to_string(team_size_max) + ", the largest team " + ExecSpace::name() +
              " runs here (a host space's teams are made of its threads)");
  const Policy policy = Policy(exec, kernel.league_size(), team_size)
                            .set_scratch_size(kernel.scratch_level, Kokkos::PerTeam(bytes));
  Kokkos::parallel_for(label, policy, kernel);
}

// dst = src row by row over [B, N, H, D] tensors of the same shape, or dst += src (in src's type)
// when accumulating; an empty src reads as zeros. A named functor: a KOKKOS_LAMBDA that captures
// another one breaks on host spaces in a CUDA build. nvcc wraps each host-side extended lambda in
// a type whose copy and call go through function pointers kept in statics private to one
// translation unit. The outer wrapper's copy function, a function shared by every unit, then
// reads another unit's pointers for the inner lambda; here it called a null pointer (SIGSEGV at
// address 0, Kokkos::Serial, -O3; also seen by k2-fsa/k2#361 and arborx/ArborX#1297).
template <class Dst, class Src>
struct CopyRows {
  Dst dst;
  Src src;
  int tokens, heads, head_dim;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    using Out = typename Dst::value_type;
    using Sum = std::remove_const_t<typename Src::value_type>;
    const int b = int(row / heads / tokens), i = int(row / heads % tokens), h = int(row % heads);
    // The branches once a row, outside the loops: inside them, the head-major copy took 1.5x as
    // long (GCC 12, Zen 5).
    if (src.data() == nullptr) {
      if (!accumulate)
        for (int d = 0; d < head_dim; ++d) dst(b, i, h, d) = Out(0.0f);
    } else if (accumulate) {
      for (int d = 0; d < head_dim; ++d) dst(b, i, h, d) = Out(Sum(dst(b, i, h, d)) + Sum(src(b, i, h, d)));
    } else {
      for (int d = 0; d < head_dim; ++d) dst(b, i, h, d) = Out(src(b, i, h, d));
    }
  }
};

template <class ExecSpace, class Dst, class Src>
void copy_rows(const char* label, const ExecSpace& exec, const Dst& dst, const Src& src, bool accumulate) {
  const std::int64_t rows = std::int64_t(dst.extent(0)) * std::int64_t(dst.extent(1)) * std::int64_t(dst.extent(2));
  const CopyRows<Dst, Src> kernel{dst, src, int(dst.extent(1)), int(dst.extent(2)), int(dst.extent(3)), accumulate};
  Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows), kernel);
}

// A [B, N, H, D] view of head-major memory ([B][H][N][D]: each head's N rows together).
template <class ExecSpace, class T>
Tensor4<T, ExecSpace> head_major_view(T* data, std::size_t batch, std::size_t tokens, std::size_t heads,
                                      std::size_t head_dim) {
  return Tensor4<T, ExecSpace>(data, Kokkos::LayoutStride(batch, heads * tokens * head_dim, tokens, head_dim, heads,
                                                          tokens * head_dim, head_dim, 1));
}

// Pool memory holding a head-major copy of a tensor of S (or dQ's head-major sums).
template <class ExecSpace, class S>
using HeadMajorMemory = memory::PooledView<Kokkos::View<S*, typename ExecSpace::memory_space>>;

// Whether the kernels should stream x from a head-major copy (AttentionOptions::head_major_copies):
// on host spaces, where a head's rows are not together already.
template <class ExecSpace, class View>
bool wants_head_major_copy(const AttentionOptions& opts, const View& x) {
  const bool together = x.stride(3) == 1 && x.stride(1) == x.extent(3);
  return opts.head_major_copies && Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible && !together &&
         x.span() > 0;
}

// The tensor a kernel streams: x itself, or (wants_head_major_copy) a head-major copy of it in
// `memory`, taken from the context's pool. `memory` must outlive the kernels that read it.
template <class ExecSpace, class S>
Tensor4<const S, ExecSpace> streamed_tensor(const ExecutionContext<ExecSpace>& context, const AttentionOptions& opts,
                                            const Tensor4<const S, ExecSpace>& x,
                                            HeadMajorMemory<ExecSpace, S>& memory) {
  if (!wants_head_major_copy<ExecSpace>(opts, x)) return x;
  const std::size_t B = x.extent(0), N = x.extent(1), H = x.extent(2), D = x.extent(3);
  const memory::CategoryScope scope(memory::Category::transient_copies);
  memory = context.template allocate<Kokkos::View<S*, typename ExecSpace::memory_space>>(B * H * N * D);
  const Tensor4<S, ExecSpace> copy = head_major_view<ExecSpace>(memory.data(), B, N, H, D);
  copy_rows("longattn::attention::head_major_copy", context.exec(), copy, x, false);
  return copy;
}

// Whether the tensor-core kernels are compiled for a call: storage type S 16-bit or float, and
// Tiles a TensorCores configuration whose launcher runs on ExecSpace (attention_tiles.hpp).
template <class ExecSpace, class S, class Tiles>
constexpr bool tensor_cores_compiled() {
  if constexpr (uses_tensor_cores<Tiles>::value && (is_half_v<S> || std::is_same_v<S, float>))
    return Tiles::tensor_core_launch::template runs_on<ExecSpace>;
  else
    return false;
}

// The compiled entry points under attention_forward and attention_backward, one class per
// (execution space, storage type S, block pattern, tile configuration). The members are
// defined out of line (not inline), so that the `extern template` declarations of eti.hpp make
// a program link the instantiations compiled into liblongattn_core for the enabled spaces and
// types instead of compiling the kernels again in every translation unit; other combinations
// are instantiated from these definitions as usual.
template <class ExecSpace, class S, class Pattern, class Tiles = typename default_tiles<ExecSpace>::type>
struct AttentionKernels {
  using T = accumulate_t<S>;
  using Input = Tensor4<const S, ExecSpace>;
  using Output = Tensor4<S, ExecSpace>;
  using Delta = Kokkos::View<T***, typename ExecSpace::memory_space>;  // [B, H, Nq]
  using Context = ExecutionContext<ExecSpace>;
  using Copy = HeadMajorMemory<ExecSpace, S>;

  // Workspaces (head-major copies; backward's Delta and dQ's sums) from the context's pool.
  static void forward(const Context& context, const Input& q, const Input& k, const Input& v, const Output& o,
                      const Tensor3<T, ExecSpace>& lse, const AttentionGeometry& geo, const Pattern& pattern,
                      const AttentionOptions& opts);
  static void backward(const Context& context, const Input& q, const Input& k, const Input& v, const Input& o,
                       const Input& d_o, const Tensor3<const T, ExecSpace>& lse, const Output& dq, const Output& dk,
                       const Output& dv, const AttentionGeometry& geo, const Pattern& pattern,
                       const AttentionOptions& opts);
  // Whether backward() takes the one-pass form (AttentionOptions::backward_passes).
  static bool one_pass(const ExecSpace& exec, const AttentionGeometry& geo, BackwardPasses passes);
};

template <class ExecSpace, class S, class Pattern, class Tiles>
void AttentionKernels<ExecSpace, S, Pattern, Tiles>::forward(const Context& context, const Input& q, const Input& k,
                                                             const Input& v, const Output& o,
                                                             const Tensor3<T, ExecSpace>& lse,
                                                             const AttentionGeometry& geo, const Pattern& pattern,
                                                             const AttentionOptions& opts) {
  const double scale = softmax_scale(opts, geo.head_dim);
  if constexpr (tensor_cores_compiled<ExecSpace, S, Tiles>()) {
    using TensorCores = tensor_core::TensorCoreKernels<typename Tiles::tensor_core_launch, ExecSpace, S, Pattern>;
    if (TensorCores::take(geo.head_dim, false, opts.allow_tf32, q, k, v, o)) {
      TensorCores::forward(context, q, k, v, o, lse, geo, pattern, float(scale * log2_e<double>()),
                           float(opts.output_scale), opts.accumulate_output, opts.tensor_core_forward);
      return;
    }
  }
  Copy k_copy, v_copy;
  ForwardKernel<ExecSpace, S, Pattern, Tiles> kernel{q,
                                                     streamed_tensor(context, opts, k, k_copy),
                                                     streamed_tensor(context, opts, v, v_copy),
                                                     o,
                                                     lse,
                                                     geo,
                                                     pattern,
                                                     T(scale * log2_e<double>()),
                                                     T(opts.output_scale),
                                                     opts.accumulate_output,
                                                     0};
  choose_bf16_path(kernel);
  run_team_kernel("longattn::attention_forward", context.exec(), kernel);
}

template <class ExecSpace, class S, class Pattern, class Tiles>
bool AttentionKernels<ExecSpace, S, Pattern, Tiles>::one_pass(const ExecSpace& exec, const AttentionGeometry& geo,
                                                              BackwardPasses passes) {
  if (geo.head_dim % KeyGradientKernel<ExecSpace, S, Pattern, Tiles, true>::head_dim_multiple != 0) return false;
  if (passes != BackwardPasses::automatic) return passes == BackwardPasses::one;
  // One pass: rounds of one head per team, 5 products per block pair; two passes: 7, spread evenly.
  const std::int64_t heads = std::int64_t(geo.batch) * geo.heads;
  const std::int64_t teams = std::max<std::int64_t>(1, exec.concurrency() / Tiles::team_size);
  return 5 * teams * ((heads + teams - 1) / teams) <= 7 * heads;
}

template <class ExecSpace, class S, class Pattern, class Tiles>
void AttentionKernels<ExecSpace, S, Pattern, Tiles>::backward(const Context& context, const Input& q, const Input& k,
                                                              const Input& v, const Input& o, const Input& d_o,
                                                              const Tensor3<const T, ExecSpace>& lse, const Output& dq,
                                                              const Output& dk, const Output& dv,
                                                              const AttentionGeometry& geo, const Pattern& pattern,
                                                              const AttentionOptions& opts) {
  using Memory = typename ExecSpace::memory_space;
  const ExecSpace& exec = context.exec();
  const double scale = softmax_scale(opts, geo.head_dim);
  const T scale_log2 = T(scale * log2_e<double>());
  if constexpr (tensor_cores_compiled<ExecSpace, S, Tiles>()) {
    using TensorCores = tensor_core::TensorCoreKernels<typename Tiles::tensor_core_launch, ExecSpace, S, Pattern>;
    if (TensorCores::take(geo.head_dim, true, opts.allow_tf32, q, k, v, d_o, dq, dk, dv)) {
      require(!opts.deterministic || opts.backward_passes != BackwardPasses::one, "longattn::attention_backward",
              "opts.backward_passes", "one",
              "two or automatic with opts.deterministic (on tensor cores the one-pass form sums dQ atomically)");
      tensor_core::BackwardChoice choice;
      choice.deterministic = opts.deterministic || opts.backward_passes == BackwardPasses::two;
      choice.program = opts.tensor_core_backward;
      require(choice.program != TensorCoreProgram::warpgroup || opts.backward_passes != BackwardPasses::one,
              "longattn::attention_backward", "opts.backward_passes", "one",
              "two or automatic with opts.tensor_core_backward = warpgroup (its dQ is a pass of its own)");
      TensorCores::backward(context, q, k, v, o, d_o, lse, dq, dk, dv, geo, pattern, float(scale),
                            float(scale_log2), float(opts.output_scale), opts.accumulate_gradients, choice);
      return;
    }
  }
  const auto delta = [&] {
    const memory::CategoryScope scope(memory::Category::workspaces);
    return context.template allocate<Delta>(geo.batch, geo.heads, geo.queries);
  }();
  Kokkos::parallel_for("longattn::attention_backward::delta",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
                           exec, 0, std::int64_t(geo.batch) * geo.heads * geo.queries),
                       DeltaKernel<ExecSpace, S>{o, d_o, delta.view(), geo.heads, geo.queries, geo.head_dim});
  // The dK/dV kernel of the two-pass form (std::false_type) or of the one pass (std::true_type),
  // streaming Q and dO (from head-major copies where opts ask for them, kept alive in the copies).
  auto key_gradient_kernel = [&](auto one_pass_form, Copy& q_copy, Copy& d_o_copy) {
    return KeyGradientKernel<ExecSpace, S, Pattern, Tiles, decltype(one_pass_form)::value>{
        streamed_tensor(context, opts, q, q_copy), k, v, streamed_tensor(context, opts, d_o, d_o_copy), lse,
        delta.view(), dk, dv, geo, pattern, scale_log2, T(opts.output_scale), opts.accumulate_gradients, 0};
  };
  if (!one_pass(exec, geo, opts.backward_passes)) {
    {  // Q's and dO's copies go back to the pool before K's and V's are taken
      Copy q_copy, d_o_copy;
      auto key_gradient = key_gradient_kernel(std::false_type(), q_copy, d_o_copy);
      choose_bf16_path(key_gradient);
      run_team_kernel("longattn::attention_backward::dk_dv", exec, key_gradient);
    }
    Copy k_copy, v_copy;  // the dQ pass streams K and V
    QueryGradientKernel<ExecSpace, S, Pattern, Tiles> query_gradient{
        q, streamed_tensor(context, opts, k, k_copy), streamed_tensor(context, opts, v, v_copy), d_o, lse, delta.view(),
        dq, geo, pattern, T(scale), scale_log2, T(opts.output_scale), opts.accumulate_gradients, 0};
    choose_bf16_path(query_gradient);
    run_team_kernel("longattn::attention_backward::dq", exec, query_gradient);
    return;
  }
  // One pass: dQ is summed in place where dq holds T with each head's rows together (or, without
  // head-major copies, with the head dim contiguous), else in a head-major workspace of T, added
  // into dq at the end.
  using Sums = Kokkos::View<T*, Memory>;
  memory::PooledView<Sums> workspace;
  Tensor4<T, ExecSpace> dq_sum;
  if constexpr (std::is_same_v<S, T>) {
    if (dq.stride(3) == 1 && dq.stride(1) <= std::size_t(std::numeric_limits<int>::max()) &&
        !wants_head_major_copy<ExecSpace>(opts, dq))
      dq_sum = dq;
  }
  if (dq_sum.data() == nullptr) {
    const std::size_t B = geo.batch, H = geo.heads, N = geo.queries, D = geo.head_dim;
    const memory::CategoryScope scope(memory::Category::workspaces);
    workspace = context.template allocate<Sums>(B * H * N * D);
    dq_sum = head_major_view<ExecSpace>(workspace.data(), B, N, H, D);
    Kokkos::deep_copy(exec, workspace.view(), T(0));
  }
  if (workspace.data() == nullptr && !opts.accumulate_gradients)
    copy_rows("longattn::attention_backward::zero_dq", exec, dq_sum, Tensor4<const T, ExecSpace>(), false);
  Copy q_copy, d_o_copy;
  auto kernel = key_gradient_kernel(std::true_type(), q_copy, d_o_copy);
  kernel.dq_sum = dq_sum;
  kernel.scale = T(scale);
  choose_bf16_path(kernel);
  run_team_kernel("longattn::attention_backward::dq_dk_dv", exec, kernel);
  if (workspace.data() != nullptr)
    copy_rows("longattn::attention_backward::dq", exec, dq, dq_sum, opts.accumulate_gradients);
}

// Compiled into liblongattn_core (detail/eti.hpp); block_sparse_layout.hpp declares its own.
#define LONGATTN_ATTENTION_DENSE_ETI(SPACE, S) extern template struct AttentionKernels<SPACE, S, DenseBlocks>;
LONGATTN_ETI_FOR_EACH(LONGATTN_ETI_STORAGE_TYPES, LONGATTN_ATTENTION_DENSE_ETI)
#undef LONGATTN_ATTENTION_DENSE_ETI

}  // namespace detail

// Whether attention_backward takes the one-pass form on `exec` for `batch` x `heads` heads of
// `head_dim` (BackwardPasses: with `automatic`, where the head dim allows it and the heads keep
// the space's teams busy). Only that form sums dQ in a workspace beside dq (AttentionOptions::
// head_major_copies); memory planners ask this. The tensor-core kernels choose their own form.
template <class T, class Tiles = DefaultTiles, class ExecSpace>
bool attention_backward_one_pass(const ExecSpace& exec, int batch, int heads, int head_dim,
                                 BackwardPasses passes = BackwardPasses::automatic) {
  const char* where = "longattn::attention_backward_one_pass";
  require(batch >= 0, where, "batch", batch, "a count >= 0");
  require(heads >= 0, where, "heads", heads, "a count >= 0");
  require(head_dim >= 0, where, "head_dim", head_dim, "a count >= 0");
  detail::AttentionGeometry geo;
  geo.batch = batch;
  geo.heads = heads;
  geo.head_dim = head_dim;
  return detail::AttentionKernels<ExecSpace, T, DenseBlocks, tiles_for_t<ExecSpace, Tiles>>::one_pass(exec, geo, passes);
}

// ---------------------------------------------------------------------------------------------
// Tiles: the tile configuration (attention_tiles.hpp), the space's own unless given:
// attention_forward<ThreadTiles<4>>(exec, ...) runs the GPU's shape of the kernels on a host space.
// `on`: an execution space instance, or an ExecutionContext whose pool the head-major copies
// come from.
template <class Tiles = DefaultTiles, class On, class Q, class K, class V, class O, class Lse, class Blocks>
void attention_forward(const On& on, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                       const AttentionOptions& opts, const Blocks& blocks) {
  using ExecSpace = execution_space_of<On>;
  using T = longattn::scalar_of<Q>;
  const char* where = "longattn::attention_forward";
  const AttentionGeometry geo = check_attention_forward<ExecSpace, T>(where, q, k, v, o, lse, opts);
  if constexpr (detail::runnable_attention<T, Lse, K, V, O>) {
    detail::check_blocks<ExecSpace, T, Tiles>(where, blocks, geo);
    const auto& context = context_of(on);
    const ExecSpace& exec = context.exec();
    if (opts.check_finite) {
      detail::check_attention_inputs<ExecSpace, T>(where, exec, q, k, v, geo, opts);
      if (opts.accumulate_output) {
        detail::check_finite_tensor(where, exec, "o", o, detail::finite_input());
        detail::check_finite_tensor(where, exec, "lse", lse, detail::finite_input(), true);
      }
    }
    detail::AttentionKernels<ExecSpace, T, Blocks, tiles_for_t<ExecSpace, Tiles>>::forward(context, q, k, v, o, lse,
                                                                                           geo, blocks, opts);
    if (opts.check_finite) {
      detail::check_finite_tensor(where, exec, "lse", lse, detail::overflowed<T>("the softmax"), true);
      detail::check_finite_tensor(where, exec, "o", o, detail::overflowed<T>("the softmax"));
    }
  }
}

template <class Tiles = DefaultTiles, class On, class Q, class K, class V, class O, class Lse>
void attention_forward(const On& on, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                       const AttentionOptions& opts = {}) {
  attention_forward<Tiles>(on, q, k, v, o, lse, opts,
                           detail::dense_blocks<execution_space_of<On>, longattn::scalar_of<Q>, Tiles>(q, k, opts));
}

// ---------------------------------------------------------------------------------------------
// `on`: an execution space instance, or an ExecutionContext whose pool Delta comes from.
template <class Tiles = DefaultTiles, class On, class Q, class K, class V, class O, class DO, class Lse, class DQ,
          class DK, class DV, class Blocks>
void attention_backward(const On& on, const Q& q, const K& k, const V& v, const O& o, const DO& d_o, const Lse& lse,
                        const DQ& dq, const DK& dk, const DV& dv, const AttentionOptions& opts, const Blocks& blocks) {
  using ExecSpace = execution_space_of<On>;
  using T = longattn::scalar_of<Q>;
  const char* where = "longattn::attention_backward";
  const AttentionGeometry geo =
      check_attention_backward<ExecSpace, T>(where, q, k, v, o, d_o, lse, dq, dk, dv, opts);

  if constexpr (detail::runnable_attention<T, Lse, K, V, O, DO, DQ, DK, DV>) {
    detail::check_blocks<ExecSpace, T, Tiles>(where, blocks, geo);
    constexpr int multiple = attention_one_pass_head_dim_multiple<ExecSpace, T, Tiles>();
    require(opts.backward_passes != BackwardPasses::one || geo.head_dim % multiple == 0, where,
            "opts.backward_passes", "one",
            "two or automatic for head dim " + std::to_string(geo.head_dim) +
                " (the one-pass form takes multiples of " + std::to_string(multiple) + ")");
    const auto& context = context_of(on);
    const ExecSpace& exec = context.exec();
    if (opts.check_finite) {
      detail::check_attention_inputs<ExecSpace, T>(where, exec, q, k, v, geo, opts);
      detail::check_finite_tensor(where, exec, "o", o, detail::finite_input());
      detail::check_finite_tensor(where, exec, "d_o", d_o, detail::finite_input());
      detail::check_finite_tensor(where, exec, "lse", lse, detail::finite_input(), true);
    }
    detail::AttentionKernels<ExecSpace, T, Blocks, tiles_for_t<ExecSpace, Tiles>>::backward(
        context, q, k, v, o, d_o, lse, dq, dk, dv, geo, blocks, opts);
    if (opts.check_finite) {
      detail::check_finite_tensor(where, exec, "dq", dq, detail::overflowed<T>("the gradient sums"));
      detail::check_finite_tensor(where, exec, "dk", dk, detail::overflowed<T>("the gradient sums"));
      detail::check_finite_tensor(where, exec, "dv", dv, detail::overflowed<T>("the gradient sums"));
    }
  }
}

template <class Tiles = DefaultTiles, class On, class Q, class K, class V, class O, class DO, class Lse, class DQ,
          class DK, class DV>
void attention_backward(const On& on, const Q& q, const K& k, const V& v, const O& o, const DO& d_o, const Lse& lse,
                        const DQ& dq, const DK& dk, const DV& dv, const AttentionOptions& opts = {}) {
  attention_backward<Tiles>(on, q, k, v, o, d_o, lse, dq, dk, dv, opts,
                            detail::dense_blocks<execution_space_of<On>, longattn::scalar_of<Q>, Tiles>(q, k, opts));
}

}  // namespace longattn
