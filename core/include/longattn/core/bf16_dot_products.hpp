#pragma once
// The CPU's bf16 dot products (x86-64 AVX512-BF16's vdpbf16ps): gemm on bfloat16 operands
// (gemm.hpp) and the attention kernels on bfloat16 tensors (attention.hpp) run on them on a
// host space where they are in use; elsewhere both compute on float values.
namespace longattn {

// Whether this CPU has them (and this build has the kernels: x86-64, GCC or Clang).
bool bf16_dot_products_available();
// Products per second of the bf16 dot-product instruction over the float FMA on this core,
// measured at the first call (about half a millisecond); 0 where not available. The instruction
// does twice an FMA's products, but CPUs run it at different rates: 0.49 measured on Intel
// Emerald Rapids (one instruction every other cycle; AMX is Intel's bf16 path), at least 1.5 on
// AMD Zen 5 (its bf16 gemm ran at 1.53x the FMA peak).
double bf16_dot_product_speedup();
// The speedup from which they are used unless the environment says otherwise.
inline constexpr double bf16_dot_products_minimum_speedup = 1.25;
// Whether they are used now: available and, per LONGATTN_BF16_DOT_PRODUCTS in the environment
// (read at the first call), "auto" or unset: measured faster (bf16_dot_product_speedup() >=
// bf16_dot_products_minimum_speedup); "1": always; "0": never. use_bf16_dot_products() overrides.
bool bf16_dot_products_in_use();
// Turns their use on (where available) or off for the process, e.g. to compare both paths.
void use_bf16_dot_products(bool on);

}  // namespace longattn
