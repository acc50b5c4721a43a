// The process-wide switches of gemm.hpp (float products on TF32 tensor cores) and linear.hpp
// (GELU in cuBLASLt's epilogue), each read from the environment at its first use, and
// runtime.hpp's check_environment_switches, which reads them and bf16_gemm.cpp's at once.
#include <atomic>
#include <cstdlib>
#include <string>

#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/linear.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/error.hpp"

namespace longattn {
namespace {

// `variable`: unset or "0": off; "1": on; else an Error saying what each means.
bool environment_switch(const char* variable, const char* what, const char* meaning) {
  const char* value = std::getenv(variable);
  const std::string v = value ? value : "0";
  require(v == "0" || v == "1", what, variable, v, meaning);
  return v == "1";
}

std::atomic<bool>& tf32_allowed() {
  static std::atomic<bool> flag(environment_switch(
      "LONGATTN_ALLOW_TF32", "longattn (TF32 matrix products)",
      "0 (float products in float, the default) or 1 (on TF32 tensor cores where the space has them)"));
  return flag;
}

std::atomic<bool>& gelu_in_epilogue() {
  static std::atomic<bool> flag(environment_switch(
      "LONGATTN_CUBLASLT_GELU", "longattn (linear layers)",
      "0 (GELU by its own kernels after the matmul, the default) or 1 (in cuBLASLt's epilogue)"));
  return flag;
}

}  // namespace

bool tf32_matmul_allowed() { return tf32_allowed().load(std::memory_order_relaxed); }

void allow_tf32_matmul(bool on) { tf32_allowed().store(on, std::memory_order_relaxed); }

bool cublaslt_gelu_in_use() { return gelu_in_epilogue().load(std::memory_order_relaxed); }

void use_cublaslt_gelu(bool on) { gelu_in_epilogue().store(on, std::memory_order_relaxed); }

void check_environment_switches() {
  tf32_matmul_allowed();
  cublaslt_gelu_in_use();
  bf16_dot_products_in_use();
}

}  // namespace longattn
