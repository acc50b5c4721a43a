// libFuzzer target: block-sparse layouts built from block-CSR a caller hands in. The input gives
// a shape (tokens, block counts, batch and head patterns) and the CSR arrays; the layout either
// validates or throws longattn::Error, and a layout that validates runs forward attention on
// tensors of its shape (under AddressSanitizer: no read or write outside them).
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/block_sparse_layout.hpp"
#include "longattn/error.hpp"

namespace {

using Space = Kokkos::Serial;

// Reads the input front to back; zeros once it runs out.
struct Bytes {
  const std::uint8_t* data;
  std::size_t size;
  template <class T>
  T take() {
    T value{};
    const std::size_t n = size < sizeof(T) ? size : sizeof(T);
    std::memcpy(&value, data, n);
    data += n;
    size -= n;
    return value;
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  Kokkos::initialize(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in{data, size};
  constexpr int block = longattn::attention_block_size<Space, float>();
  longattn::BlockSparseShape shape;
  shape.block = in.take<std::uint8_t>() % 8 == 0 ? block / 2 : block;  // a wrong block size, sometimes
  shape.queries = 1 + in.take<std::uint16_t>() % (4 * block);
  shape.keys = 1 + in.take<std::uint16_t>() % (4 * block);
  const int batch = 2, heads = 2;
  shape.batch = 1 + in.take<std::uint8_t>() % batch;
  shape.heads = 1 + in.take<std::uint8_t>() % heads;
  // CSR arrays as the input has them: offsets (int64, any values) and key blocks (int, any values).
  std::vector<std::int64_t> offsets(in.take<std::uint8_t>() % 40);
  for (auto& offset : offsets) offset = in.take<std::int8_t>() < 0 ? in.take<std::int64_t>() : in.take<std::uint8_t>() % 32;
  std::vector<int> key_blocks(in.take<std::uint8_t>() % 64);
  for (auto& key : key_blocks) key = in.take<std::int8_t>() < 0 ? in.take<int>() : in.take<std::uint8_t>() % 8;
  try {
    const Space exec;
    const longattn::BlockSparseLayout<Space> layout(exec, shape, offsets, key_blocks);
    const int head_dim = 8;
    using Tensor = Kokkos::View<float****, Space::memory_space>;  // [B, N, H, D]
    Tensor q("q", batch, shape.queries, heads, head_dim), o("o", batch, shape.queries, heads, head_dim);
    Tensor k("k", batch, shape.keys, heads, head_dim), v("v", batch, shape.keys, heads, head_dim);
    Kokkos::View<float***, Space::memory_space> lse("lse", batch, heads, shape.queries);
    Kokkos::deep_copy(q, 0.5f);
    Kokkos::deep_copy(k, 0.25f);
    Kokkos::deep_copy(v, 1.0f);
    longattn::AttentionOptions options;
    options.causal = in.take<std::uint8_t>() % 2 == 1;
    longattn::attention_forward(exec, q, k, v, o, lse, options, layout);
    exec.fence();
  } catch (const longattn::Error&) {
  }
  return 0;
}
