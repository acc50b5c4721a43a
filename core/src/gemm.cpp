// gemm.hpp's process-wide switch: float matrix products on TF32 tensor cores.
#include <atomic>
#include <cstdlib>
#include <string>

#include "longattn/core/gemm.hpp"
#include "longattn/error.hpp"

namespace longattn {
namespace {

// LONGATTN_ALLOW_TF32: unset or "0": float products in float; "1": on TF32 tensor cores.
bool wanted() {
  const char* value = std::getenv("LONGATTN_ALLOW_TF32");
  const std::string v = value ? value : "0";
  require(v == "0" || v == "1", "longattn (TF32 matrix products)", "LONGATTN_ALLOW_TF32", v,
          "0 (float products in float, the default) or 1 (on TF32 tensor cores where the space has them)");
  return v == "1";
}

std::atomic<bool>& allowed() {
  static std::atomic<bool> flag(wanted());
  return flag;
}

}  // namespace

bool tf32_matmul_allowed() { return allowed().load(std::memory_order_relaxed); }

void allow_tf32_matmul(bool on) { allowed().store(on, std::memory_order_relaxed); }

}  // namespace longattn
