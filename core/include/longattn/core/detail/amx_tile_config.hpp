// The tile configuration of Intel AMX (palette 1: 8 tiles of up to 16 rows of 64 bytes), for
// the tile products (src/bf16_tile_products.cpp) and the code that tests and measures them.
// Load it through load_amx_tile_config, not GCC 12's _tile_loadconfig: that tells the compiler
// it reads 8 of the 64 bytes, and GCC then dropped a configuration's other stores (seen in a
// test: ldtilecfg faulted on a configuration of zeros).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(__CUDACC__)
#define LONGATTN_AMX_TILE_CONFIG 1

#include <cstdint>

namespace longattn::detail {

struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// Tiles 0 .. tiles - 1 as `rows` rows of `bytes_per_row` bytes, the others unused.
inline AmxTileConfig amx_tile_config(int tiles, int rows, int bytes_per_row) {
  AmxTileConfig config;
  for (int t = 0; t < tiles; ++t) {
    config.bytes_per_row[t] = std::uint16_t(bytes_per_row);
    config.rows[t] = std::uint8_t(rows);
  }
  return config;
}

// Needs AMX-TILE and the OS's grant of the tile registers (bf16_tile_products_available()).
__attribute__((target("amx-tile"))) inline void load_amx_tile_config(const AmxTileConfig& config) {
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

}  // namespace longattn::detail

#endif
