#pragma once
// What a pool's memory holds: its blocks counted by category, so that a training step's memory
// splits into the parts a memory model (longattn-plan) predicts, each with its own high-water mark.
//
//   {
//     const memory::CategoryScope kept(memory::Category::activations);
//     auto x = ctx.allocate<View>(rows, cols);   // counted as activations while x lives
//   }
//
// A PooledView counts its block under the calling thread's current category when it is made, and
// takes it off that category when its last copy goes. The current category is the innermost live
// CategoryScope of the thread (Category::other outside every scope): a library tags what only it
// knows (a kernel's transient copies, a collective's buffers) and its caller the rest (whether a
// forward pass's outputs are activations kept for backward or a recomputation's workspaces).
// Blocks taken with Pool::allocate() directly are in no category.
#include <array>
#include <cstddef>

namespace longattn::memory {

enum class Category {
  other,                  // made outside every scope
  parameters,             // a model's weights (and anything that lives as long, e.g. constants)
  gradients,              // the parameters' gradients, kept or ZeRO's pieces
  optimizer_states,       // moments, master weights
  communication_buffers,  // gradient buckets, ring K/V pieces, gathered tokens and keys
  activations,            // a forward pass's outputs kept for backward
  workspaces,             // backward's buffers, recomputation, attention's Delta and partial results
  transient_copies,       // copies of an operand in another layout or type (head-major K/V, float gemm operands)
};
inline constexpr int category_count = 8;

// "other", "parameters", "gradients", "optimizer states", "communication buffers", "activations",
// "workspaces", "transient copies".
const char* to_string(Category category);

// The current category of the calling thread.
Category current_category() noexcept;

// Makes `category` the calling thread's current one while it lives (scopes nest; innermost wins).
class CategoryScope {
 public:
  explicit CategoryScope(Category category) noexcept;
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  Category previous_;
};

// One category's bytes in PooledView blocks (whole blocks, as PoolStats counts them).
struct CategoryStats {
  Category category = Category::other;
  std::size_t in_use_bytes = 0;
  std::size_t in_use_high_water_bytes = 0;  // since the pool began or its last reset_high_water()
  // Its bytes when all categories together were at their high-water: which parts made the peak
  // (the categories' own high-waters need not fall at one moment).
  std::size_t at_peak_bytes = 0;
};
using CategoryTable = std::array<CategoryStats, category_count>;  // indexed by int(Category)

}  // namespace longattn::memory
