#include "longattn/memory/category.hpp"

namespace longattn::memory {

namespace {
thread_local Category current = Category::other;
}  // namespace

const char* to_string(Category category) {
  switch (category) {
    case Category::other: return "other";
    case Category::parameters: return "parameters";
    case Category::gradients: return "gradients";
    case Category::optimizer_states: return "optimizer states";
    case Category::communication_buffers: return "communication buffers";
    case Category::activations: return "activations";
    case Category::workspaces: return "workspaces";
    case Category::transient_copies: return "transient copies";
  }
  return "?";
}

Category current_category() noexcept { return current; }

CategoryScope::CategoryScope(Category category) noexcept : previous_(current) { current = category; }
CategoryScope::~CategoryScope() { current = previous_; }

}  // namespace longattn::memory
