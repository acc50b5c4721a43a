#pragma once
// The CPU's bf16 products on a host space: gemm on bfloat16 operands (gemm.hpp) and the
// attention kernels on bfloat16 tensors (attention.hpp) run on its dot products (x86-64
// AVX512-BF16's vdpbf16ps) where they are in use; the attention kernels' block products run on
// its tile products (Intel AMX-BF16) where those are, before the dot products. Elsewhere both
// compute on float values.
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

// Whether this CPU has AMX-BF16 tile products (Intel Sapphire Rapids and later) and the OS lets
// this process use their tile registers (Linux 5.16 and later, asked at the first call); and
// this build has the kernels. One tdpbf16ps does 16 x 16 x 32 products (a float FMA: 16).
bool bf16_tile_products_available();
// Whether the attention kernels' bf16 block products run on them now: available and, per
// LONGATTN_BF16_TILE_PRODUCTS in the environment (read at the first call), "1" or unset: on;
// "0": off. use_bf16_tile_products() overrides. gemm does not use them.
bool bf16_tile_products_in_use();
// Turns their use on (where available) or off for the process, e.g. to compare the paths.
void use_bf16_tile_products(bool on);

}  // namespace longattn
