#pragma once
// The pool's size classes and granules (internal).
//
//   classes 0..7:   16, 32, ..., 128 bytes (steps of 16)
//   classes 8..43:  four per doubling: 160, 192, 224, 256, 320, 384, ..., 56 KiB, 64 KiB
// so a block wastes at most 25% of itself (12.5% on average). Slabs are page-aligned, so a
// class whose size is a multiple of the requested alignment gives aligned blocks; class_for
// picks the smallest such. Requests above 64 KiB are large blocks, rounded to 4 KiB and cut
// best-fit from the coalescing heap: buffers whose size changes from step to step (a sequence
// length) then share memory, where size classes would each keep slabs of their own.
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace longattn::memory::detail {

inline constexpr std::size_t page_bytes = std::size_t(64) << 10;  // granule of chunks and slabs (the page map's page)
inline constexpr std::size_t large_granule = std::size_t(4) << 10;  // granule of large blocks
inline constexpr std::size_t max_class_bytes = std::size_t(64) << 10;
inline constexpr int class_count = 44;

constexpr std::size_t class_size(int size_class) {
  if (size_class < 8) return std::size_t(16) * std::size_t(size_class + 1);
  const int doubling = (size_class - 8) / 4, step = (size_class - 8) % 4 + 1;
  return (std::size_t(128) << doubling) + std::size_t(step) * (std::size_t(32) << doubling);
}
static_assert(class_size(class_count - 1) == max_class_bytes, "the last class is 64 KiB");

constexpr std::size_t round_up(std::size_t bytes, std::size_t granule) { return (bytes + granule - 1) / granule * granule; }

// The smallest class holding `bytes` (1 .. max_class_bytes).
inline int class_of(std::size_t bytes) {
  if (bytes <= 128) return int((bytes + 15) / 16) - 1;
  const std::size_t b = bytes - 1;                        // >= 128
  const int doubling = 63 - __builtin_clzll(b) - 7;       // b in [128 << d, 256 << d)
  const int step = int((b - (std::size_t(128) << doubling)) >> (doubling + 5));  // 0..3, steps of 32 << d
  return 8 + 4 * doubling + step;
}

// The class for a request, or -1 when it is a large block. alignment: a power of two <= 64 KiB.
inline int class_for(std::size_t bytes, std::size_t alignment) {
  if (bytes > max_class_bytes) return -1;
  int c = class_of(std::max(bytes, alignment));
  while ((class_size(c) & (alignment - 1)) != 0) ++c;  // ends at 64 KiB at the latest
  return c;
}

// A slab holds at least 4 blocks and at least one page.
inline std::size_t slab_bytes(int size_class) {
  return round_up(std::max(page_bytes, 4 * class_size(size_class)), page_bytes);
}

// Blocks a thread cache keeps per class: about 256 KiB worth, a power of two from 2 to 64.
inline std::uint32_t cache_capacity(int size_class) {
  std::uint32_t capacity = 64;
  while (capacity > 2 && capacity * class_size(size_class) > (std::size_t(256) << 10)) capacity /= 2;
  return capacity;
}
// Blocks an empty thread cache takes from the central list at once: half its capacity.
inline std::uint32_t refill_blocks(int size_class) { return cache_capacity(size_class) / 2; }

}  // namespace longattn::memory::detail
