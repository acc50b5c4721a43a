// The tensor-core kernels (core/detail/tensor_core/): their warp operations on the host
// emulation (emulated_warp.hpp), which computes every collective from the PTX ISA's tables, and
// the attention entry points against the double reference, through the emulation on a host space
// (EmulatedTensorCoreTiles, every build) and, in CUDA builds, on the GPU (TensorCoreTiles on
// Kokkos::Cuda: the template cases' second instance):
//
//   - the fragment helpers (fragments.hpp) against products computed directly, 16-bit and TF32:
//     operands from rows, from columns and from accumulators, mma.sync; cvt.rna.tf32.f32;
//   - the warpgroup layouts (warpgroup.hpp): swizzled tiles, K-major and MN-major descriptors and
//     wgmma from shared memory and from registers, against products computed directly; the
//     wgmma ordering the emulation enforces (wgmma.fence, fence.proxy.async, waits);
//   - the padded tiles read without bank conflicts (and unpadded ones with them);
//   - the emulation's own checks: races (between warps, inside a warp, a cp.async over data
//     read), a read before cp.async lands, misalignment, bounds, reads of what nothing wrote, a
//     warp that diverges at a collective, a TF32 operand not rounded, a thread that finishes
//     early, a deadlock, a value taken as the warp's that its lanes disagree on;
//   - forward and backward (one pass with atomic dQ sums; deterministic; two passes; the forward
//     pass by the warp-level and, 16-bit at head dims 64 and 128, the warpgroup program) for
//     bfloat16, float16 and float on TF32 (allow_tf32), head dims 64 and 128 (16-bit forward
//     256), odd sizes, Nq != Nk with global offsets, causal or not, output_scale and accumulated
//     gradients, block-sparse layouts with empty rows and columns; the tensor-core kernels run
//     exactly where they should (float without allow_tf32 and other head dims run the portable
//     kernels), their ldmatrix reads without bank conflicts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/detail/tensor_core/emulated_warp.hpp"
#include "longattn/core/detail/tensor_core/fragments.hpp"
#include "longattn/core/detail/tensor_core/kernels.hpp"
#include "longattn/core/detail/tensor_core/warpgroup.hpp"
#include "reference/attention.hpp"
#include "reference/block_sparse.hpp"
#include "reference/random.hpp"
#include "reference/tensors.hpp"
#include "reference/test_size.hpp"

namespace {

namespace tc = longattn::detail::tensor_core;
using tc::EmulatedWarp;
using tc::Emulator;
using longattn::test::HostRows;
using longattn::test::HostTensor;
using longattn::test::random_tensor;
using longattn::test::relative_error;

// ---------------------------------------------------------------------------------------------
// Warp-level products: one warp, tiles of S in shared memory, results to global.

// x as a tensor-core operand of storage type S: rounded to S, or (float) to TF32, as the kernels'
// tiles are.
template <class S>
S operand(double x) {
  if constexpr (sizeof(S) == 2) {
    return S(x);
  } else {
    const std::uint32_t word = tc::emulation::tf32(float(x));
    float value;
    std::memcpy(&value, &word, sizeof value);
    return value;
  }
}

// A row-major [rows][columns] matrix of values of S (operand<S> of uniform values) and the same
// values as doubles.
template <class S>
struct Matrix {
  int rows, columns;
  std::vector<S> stored;
  std::vector<double> values;
  Matrix(int r, int c) : rows(r), columns(c), stored(std::size_t(r) * c), values(stored.size()) {}
  Matrix(int r, int c, std::mt19937_64& rng) : Matrix(r, c) {
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    for (std::size_t i = 0; i < stored.size(); ++i) {
      stored[i] = operand<S>(uniform(rng));
      values[i] = double(float(stored[i]));
    }
  }
  double operator()(int r, int c) const { return values[std::size_t(r) * columns + c]; }
  Matrix transposed() const {
    Matrix t(columns, rows);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < columns; ++c) {
        t.stored[std::size_t(c) * rows + r] = stored[std::size_t(r) * columns + c];
        t.values[std::size_t(c) * rows + r] = values[std::size_t(r) * columns + c];
      }
    return t;
  }
};

// Copies a matrix into a tile of 64 columns (rows < 64, zeros right of it), a 16-byte chunk per
// lane at a time.
template <class S>
void store_tile(char* tile, const Matrix<S>& m, int lane) {
  constexpr int values = tc::chunk_values<S>;
  for (int r = 0; r < m.rows; ++r)
    for (int chunk = lane; chunk < 64 / values; chunk += 32) {
      tc::Chunk bytes{};
      for (int j = 0; j < values && chunk * values + j < m.columns; ++j)
        std::memcpy(reinterpret_cast<char*>(&bytes) + j * sizeof(S), &m.stored[std::size_t(r) * m.columns + chunk * values + j],
                    sizeof(S));
      EmulatedWarp::store_shared(tile + tc::tile_offset<S>(r, chunk * values, 64), bytes);
    }
}

// The products a warp computes through fragments.hpp, k = mma_k<S>: D = A B (A 16 x k, B k x 16:
// two n-tiles), A and B read from rows (stored as A [m][k] and B^T [n][k]) or from columns
// (stored as A^T [k][m] and B [k][n]); then D's first k columns, as the A operand made of its
// accumulators, times C (k x 8, read from columns): E = D[:, :k] C.
template <class S>
struct WarpProduct {
  static constexpr int threads = 32;
  static constexpr std::size_t shared_bytes = 3 * tc::tile_bytes<S>(64, 64);
  const Matrix<S> *a_stored, *b_stored, *c;
  bool from_columns;
  float* d;  // [16][16]
  float* e;  // [16][8]

  void operator()(int, char* shared) const {
    const int lane = EmulatedWarp::thread();
    char *ta = shared, *tb = shared + tc::tile_bytes<S>(64, 64), *tcm = shared + 2 * tc::tile_bytes<S>(64, 64);
    store_tile(ta, *a_stored, lane);
    store_tile(tb, *b_stored, lane);
    store_tile(tcm, *c, lane);
    EmulatedWarp::sync_warp();
    std::uint32_t fa[4], fb[4];
    if (from_columns) {
      tc::a_from_columns<EmulatedWarp, S>(fa, ta, lane, 0, 0, 64);
      tc::b_from_columns<EmulatedWarp, S>(fb, tb, lane, 0, 0, 64);
    } else {
      tc::a_from_rows<EmulatedWarp, S>(fa, ta, lane, 0, 0, 64);
      tc::b_from_rows<EmulatedWarp, S>(fb, tb, lane, 0, 0, 64);
    }
    float acc[2][4] = {};
    tc::mma<EmulatedWarp, S>(acc[0], fa, fb[0], fb[1]);
    tc::mma<EmulatedWarp, S>(acc[1], fa, fb[2], fb[3]);
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i)
        d[tc::accumulator_row(lane, i) * 16 + 8 * n + tc::accumulator_col(lane, i)] = acc[n][i];
    std::uint32_t from_d[4], fc[4];
    tc::a_from_accumulators<EmulatedWarp, S>(acc, 0, from_d);
    tc::b_from_columns<EmulatedWarp, S>(fc, tcm, lane, 0, 0, 64);
    float out[4] = {};
    tc::mma<EmulatedWarp, S>(out, from_d, fc[0], fc[1]);
    for (int i = 0; i < 4; ++i) e[tc::accumulator_row(lane, i) * 8 + tc::accumulator_col(lane, i)] = out[i];
  }
};

template <class S>
void check_warp_products(std::mt19937_64& rng) {
  constexpr int k = tc::mma_k<S>;
  for (bool from_columns : {false, true}) {
    INFO(longattn::detail::scalar_name<S>() << ", operands from " << (from_columns ? "columns" : "rows"));
    const Matrix<S> a(16, k, rng), b(k, 16, rng), c(k, 16, rng);
    const Matrix<S> a_stored = from_columns ? a.transposed() : a, b_stored = from_columns ? b : b.transposed();
    std::vector<float> d(16 * 16, -1.0f), e(16 * 8, -1.0f);
    Emulator::run(WarpProduct<S>{&a_stored, &b_stored, &c, from_columns, d.data(), e.data()}, 1);
    double worst_d = 0, worst_e = 0;
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        double sum = 0;
        for (int kk = 0; kk < k; ++kk) sum += a(i, kk) * b(kk, j);
        worst_d = std::max(worst_d, std::abs(sum - d[i * 16 + j]));
      }
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double sum = 0;  // D rounded as the kernels make probabilities operands
        for (int kk = 0; kk < k; ++kk) sum += double(float(operand<S>(d[i * 16 + kk]))) * c(kk, j);
        worst_e = std::max(worst_e, std::abs(sum - e[i * 8 + j]));
      }
    CHECK(worst_d < 1e-5);
    CHECK(worst_e < 1e-5);
  }
}

}  // namespace

TEST_CASE("tensor-core fragments: operands from rows, columns and accumulators give the products",
          "[core][tensor_cores]") {
  std::mt19937_64 rng(longattn::test::test_seed());
  INFO("seed " << longattn::test::test_seed());
  check_warp_products<longattn::bfloat16>(rng);
  check_warp_products<longattn::float16>(rng);
  check_warp_products<float>(rng);
}

TEST_CASE("tensor-core fragments: the PTX ISA's layouts, lane by lane", "[core][tensor_cores]") {
  // Spot values read off the PTX ISA's figures for mma.m16n8k16 (.bf16/.f16): lane 5 is group 1,
  // thread 1 of its group.
  CHECK(tc::accumulator_row(5, 0) == 1);
  CHECK(tc::accumulator_col(5, 0) == 2);
  CHECK(tc::accumulator_row(5, 3) == 9);
  CHECK(tc::accumulator_col(5, 3) == 3);
  CHECK(tc::accumulator_row(31, 2) == 15);
  CHECK(tc::accumulator_col(31, 1) == 7);
  // ldmatrix.x4: lanes 8-15 give matrix 1's rows; for an A operand matrix 1 is rows 8-15, columns 0-7
  // (16-bit) or 0-3 (TF32), matrix 2 the next 16 bytes of rows 0-7.
  using longattn::bfloat16;
  CHECK(tc::a_address<bfloat16>(9, 0, 0, 64) == tc::tile_offset<bfloat16>(9, 0, 64));
  CHECK(tc::a_address<bfloat16>(17, 0, 0, 64) == tc::tile_offset<bfloat16>(1, 8, 64));
  CHECK(tc::a_address<float>(17, 0, 0, 64) == tc::tile_offset<float>(1, 4, 64));
  // Rows padded by 16 bytes.
  CHECK(tc::tile_offset<bfloat16>(3, 8, 64) == 3 * 144 + 16);
  CHECK(tc::tile_offset<bfloat16>(10, 17, 128) == 10 * 272 + 34);
  CHECK(tc::tile_offset<float>(3, 8, 64) == 3 * 272 + 32);
  // TF32 operands in the permuted k order (fragments.hpp): from accumulators, lane 5's a2 is
  // row 1, column 3 of the k-step (n-tile kk's value 1), a1 row 9, column 2 (value 2).
  const float c[1][4] = {{1.0f, 3.0f, 2.0f, 4.0f}};
  std::uint32_t a[4];
  tc::a_from_accumulators<EmulatedWarp, float>(c, 0, a);
  CHECK(a[0] == 0x3f800000u);  // 1
  CHECK(a[1] == 0x40000000u);  // 2
  CHECK(a[2] == 0x40400000u);  // 3
  CHECK(a[3] == 0x40800000u);  // 4
}

TEST_CASE("tensor-core fragments: cvt.rna.tf32.f32 and TF32 operands", "[core][tensor_cores]") {
  auto tf32 = [](float x) {
    const std::uint32_t word = tc::emulation::tf32(x);
    float y;
    std::memcpy(&y, &word, sizeof y);
    return y;
  };
  CHECK(tf32(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f);  // a tie: away from zero
  CHECK(tf32(-(1.0f + 0x1p-11f)) == -(1.0f + 0x1p-10f));
  CHECK(tf32(1.0f + 0x1p-11f - 0x1p-23f) == 1.0f);
  CHECK(tf32(1.0f + 0x1p-10f + 0x1p-12f) == 1.0f + 0x1p-10f);
  CHECK(tf32(0x1p-130f) == 0x1p-130f);  // subnormals with 10 significant bits kept
  CHECK(tf32(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(tf32(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(tf32(std::numeric_limits<float>::quiet_NaN())));
}

namespace {

// Reads a [64][64] bfloat16 tile by ldmatrix, every A operand of it, with rows padded or not.
struct TileReads {
  static constexpr int threads = 32;
  static constexpr std::size_t shared_bytes = tc::tile_bytes<longattn::bfloat16>(64, 64);
  bool padded;
  void operator()(int, char* shared) const {
    const int lane = EmulatedWarp::thread();
    for (std::size_t chunk = lane; chunk < shared_bytes / 16; chunk += 32)
      EmulatedWarp::store_shared(shared + chunk * 16, tc::Chunk{});
    EmulatedWarp::sync_warp();
    for (int m0 = 0; m0 < 64; m0 += 16)
      for (int k0 = 0; k0 < 64; k0 += 16) {
        std::uint32_t r[4];
        const int row = m0 + (lane & 7) + 8 * ((lane >> 3) & 1), column = k0 + 8 * (lane >> 4);
        EmulatedWarp::ldmatrix_x4(r, shared + (padded ? tc::a_address<longattn::bfloat16>(lane, m0, k0, 64) : (row * 64 + column) * 2));
      }
  }
};

}  // namespace

namespace {

// A [rows][128] matrix of 16-bit values as the copy engine's map: one token of one head each row.
template <class S>
tc::TileMap map_of(const Matrix<S>& m) {
  tc::TileMap map;
  map.data = m.stored.data();
  const std::int64_t extents[4] = {m.columns, m.rows, 1, 1}, strides[4] = {2, 2 * std::int64_t(m.columns), 16, 16};
  std::copy(extents, extents + 4, map.extents);
  std::copy(strides, strides + 4, map.strides);
  map.box_rows = m.rows;
  return map;
}

// The products a warpgroup computes through warpgroup.hpp, 16-bit: D = A B^T (A 64 x 128 and
// B^T 64 x 128 stored by rows, copied by TMA into swizzled tiles: K-major descriptors, 8 k-steps
// over two panels), then E = D V (D rounded to S as the A operand from its accumulators, V
// 64 x 128 stored by rows: MN-major descriptors, N = 128 over two panels).
template <class S>
struct WarpgroupProduct {
  static constexpr int threads = tc::warpgroup_threads;
  static constexpr int tile = tc::swizzled_tile_bytes(64, 128);
  static constexpr std::size_t shared_bytes = 3 * tile + 8;
  const Matrix<S> *a, *b_transposed, *v;
  float* d;  // [64][64]
  float* e;  // [64][128]

  void operator()(int, char* shared) const {
    const int thread = EmulatedWarp::thread(), warp = thread / 32, lane = thread % 32;
    const std::uint32_t address = EmulatedWarp::shared_address(shared), barrier = address + 3 * tile;
    if (thread == 0) EmulatedWarp::mbarrier_init(barrier, 1);
    EmulatedWarp::sync_cta();
    if (thread == 0) {
      EmulatedWarp::mbarrier_arrive_expect_tx(barrier, 3 * tile);
      const Matrix<S>* matrices[3] = {a, b_transposed, v};
      for (int m = 0; m < 3; ++m)
        for (int panel = 0; panel < 2; ++panel)
          EmulatedWarp::tma_load(shared + m * tile + panel * tc::panel_bytes(64), map_of(*matrices[m]), 64 * panel, 0,
                                 0, 0, barrier);
    }
    EmulatedWarp::mbarrier_wait(barrier, 0);
    float acc[8][4] = {};
    EmulatedWarp::wgmma_fence();
    for (int kk = 0; kk < 8; ++kk)
      EmulatedWarp::wgmma<tc::operand_of<S>, 64>(acc, tc::k_major_descriptor(address, 64, 0, 16 * kk),
                                                 tc::k_major_descriptor(address + tile, 64, 0, 16 * kk));
    EmulatedWarp::wgmma_commit();
    EmulatedWarp::wgmma_wait<0>();
    std::uint32_t p[4][4];
    for (int kk = 0; kk < 4; ++kk) tc::a_from_accumulators<EmulatedWarp, S>(acc, kk, p[kk]);
    float out[16][4] = {};
    EmulatedWarp::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk)
      EmulatedWarp::wgmma<tc::operand_of<S>, 128>(out, p[kk], tc::mn_major_descriptor(address + 2 * tile, 64, 16 * kk));
    EmulatedWarp::wgmma_commit();
    EmulatedWarp::wgmma_wait<0>();
    // Where warpgroup.hpp says a thread's accumulators are.
    for (int n = 0; n < 8; ++n)
      for (int i = 0; i < 4; ++i)
        d[(16 * warp + tc::accumulator_row(lane, i)) * 64 + 8 * n + tc::accumulator_col(lane, i)] = acc[n][i];
    for (int n = 0; n < 16; ++n)
      for (int i = 0; i < 4; ++i)
        e[(16 * warp + tc::accumulator_row(lane, i)) * 128 + 8 * n + tc::accumulator_col(lane, i)] = out[n][i];
  }
};

template <class S>
void check_warpgroup_products(std::mt19937_64& rng) {
  INFO(longattn::detail::scalar_name<S>());
  const Matrix<S> a(64, 128, rng), b_transposed(64, 128, rng), v(64, 128, rng);
  std::vector<float> d(64 * 64, -1.0f), e(64 * 128, -1.0f);
  Emulator::reset_counters();
  Emulator::run(WarpgroupProduct<S>{&a, &b_transposed, &v, d.data(), e.data()}, 2);  // copies landing at once, late
  CHECK(Emulator::counters().wgmma == 24);
  CHECK(Emulator::counters().tma == 12);
  double worst_d = 0, worst_e = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j) {
      double sum = 0;
      for (int k = 0; k < 128; ++k) sum += a(i, k) * b_transposed(j, k);
      worst_d = std::max(worst_d, std::abs(sum - d[std::size_t(i) * 64 + j]));
    }
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      double sum = 0;  // D rounded as the kernels make probabilities operands
      for (int k = 0; k < 64; ++k) sum += double(float(S(d[std::size_t(i) * 64 + k]))) * v(k, j);
      worst_e = std::max(worst_e, std::abs(sum - e[std::size_t(i) * 128 + j]));
    }
  CHECK(worst_d < 1e-4);
  CHECK(worst_e < 1e-3);
}

}  // namespace

TEST_CASE("tensor-core warpgroups: swizzled tiles and wgmma's descriptors give the products", "[core][tensor_cores]") {
  std::mt19937_64 rng(longattn::test::test_seed());
  INFO("seed " << longattn::test::test_seed());
  check_warpgroup_products<longattn::bfloat16>(rng);
  check_warpgroup_products<longattn::float16>(rng);
  // Spot values of the layout: a K-major descriptor of the second panel's k-step at value 80 of a
  // 64-row tile at 0x400: start (0x400 + 8192 + 32) >> 4, LBO 1, SBO 64, 128-byte swizzle; V's
  // second k-step: start (0x400 + 2048) >> 4, LBO 8192 >> 4.
  CHECK(tc::k_major_descriptor(0x400, 64, 0, 80) ==
        ((0x400u + 8192 + 32) >> 4 | std::uint64_t(1) << 16 | std::uint64_t(64) << 32 | std::uint64_t(1) << 62));
  CHECK(tc::mn_major_descriptor(0x400, 64, 16) ==
        ((0x400u + 2048) >> 4 | std::uint64_t(512) << 16 | std::uint64_t(64) << 32 | std::uint64_t(1) << 62));
}

TEST_CASE("tensor-core fragments: padded tiles are read without bank conflicts", "[core][tensor_cores]") {
  Emulator::reset_counters();
  Emulator::run(TileReads{true}, 1);
  CHECK(Emulator::counters().ldmatrix == 16);
  CHECK(Emulator::counters().ldmatrix_conflict_wavefronts == 0);
  Emulator::reset_counters();
  Emulator::run(TileReads{false}, 1);  // rows of 128 bytes: the 8 rows of a matrix share 4 banks
  CHECK(Emulator::counters().ldmatrix_conflict_wavefronts == 16 * 4 * 7);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Attention on tensor cores: through the emulation on a host space, and (CUDA builds) on the GPU.
struct Emulated {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using Tiles = longattn::EmulatedTensorCoreTiles;
  static constexpr bool emulated = true;
};
#ifdef KOKKOS_ENABLE_CUDA
struct OnGpu {
  using Exec = Kokkos::Cuda;
  using Tiles = longattn::TensorCoreTiles;
  static constexpr bool emulated = false;
};
using Targets = std::tuple<Emulated, OnGpu>;
#else
using Targets = std::tuple<Emulated>;
#endif

// Whether the warpgroup programs run on a target (the emulation: always).
template <class Target>
bool warpgroup_program_runs() {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (!Target::emulated) return tc::CudaLaunch::warpgroup_device(Kokkos::Cuda());
#endif
  return true;
}

struct Shape {
  int batch, queries, keys, heads, head_dim;
  std::int64_t query_offset = 0, key_offset = 0;
};

std::string describe(const Shape& s, bool causal) {
  std::ostringstream out;
  out << "B " << s.batch << " Nq " << s.queries << " Nk " << s.keys << " H " << s.heads << " D " << s.head_dim
      << " offsets " << s.query_offset << "/" << s.key_offset << (causal ? " causal" : "") << ", seed "
      << longattn::test::test_seed();
  return out.str();
}

// How the backward pass sums dQ.
enum class Form { atomic, deterministic, two_passes };
const char* name(Form form) {
  return form == Form::atomic ? "one pass, atomic dQ" : form == Form::deterministic ? "deterministic" : "two passes";
}

// The tolerances of the tensor-core kernels: the 16-bit type's (tensors.hpp) times 2, for the
// probabilities and dS rounded to 16 bits before their products (as FlashAttention does); float
// on TF32 float16's (10 mantissa bits too) times 2, its inputs also rounded but its outputs not.
template <class T>
double tensor_core_tolerance() {
  if constexpr (std::is_same_v<T, float>)
    return 2 * longattn::test::tolerance<longattn::float16>();
  else
    return 2 * longattn::test::tolerance<T>();
}

// One call of forward and backward, what it asks and what it should run on.
template <class Exec>
struct Run {
  Shape s;
  bool causal = false;
  Form form = Form::atomic;
  double output_scale = 1;
  bool accumulate_gradients = false;                          // dq, dk, dv start random
  const longattn::BlockSparseLayout<Exec>* layout = nullptr;  // with `mask`, its pattern
  const longattn::test::BlockMask* mask = nullptr;
  bool allow_tf32 = true;  // AttentionOptions::allow_tf32: float on the tensor cores
  longattn::TensorCoreProgram forward_program = longattn::TensorCoreProgram::automatic;
  longattn::TensorCoreProgram backward_program = longattn::TensorCoreProgram::automatic;
  bool forward_on_tensor_cores = true, backward_on_tensor_cores = true;
};

// Forward and backward against the reference, at the tensor-core tolerance where the tensor-core
// kernels ran (they must have run exactly where `run` says), else the portable kernels'.
template <class Target, class T>
void check_attention(const Run<typename Target::Exec>& run, std::mt19937_64& rng) {
  using Exec = typename Target::Exec;
  using Tiles = typename Target::Tiles;
  using Memory = typename Exec::memory_space;
  using Device4 = Kokkos::View<T****, Kokkos::LayoutRight, Memory>;
  const Shape& s = run.s;
  INFO(describe(s, run.causal) << ", " << longattn::detail::scalar_name<T>() << ", " << name(run.form)
                               << ", output scale " << run.output_scale
                               << (run.accumulate_gradients ? ", accumulating gradients" : "")
                               << (run.layout ? ", block-sparse" : "") << ", programs "
                               << longattn::to_string(run.forward_program) << " (forward), "
                               << longattn::to_string(run.backward_program) << " (backward), on " << Exec::name());
  const HostTensor q = random_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, rng);
  const HostTensor k = random_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, rng);
  const HostTensor v = random_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, rng);
  const HostTensor d_o = random_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, rng);
  HostTensor o_ref("o", s.batch, s.queries, s.heads, s.head_dim);
  HostRows lse_ref("lse", s.batch, s.heads, s.queries);
  HostTensor dq_ref("dq", s.batch, s.queries, s.heads, s.head_dim);
  HostTensor dk_ref("dk", s.batch, s.keys, s.heads, s.head_dim), dv_ref("dv", s.batch, s.keys, s.heads, s.head_dim);
  longattn::test::ReferenceOptions ref_opts = run.mask ? run.mask->options(run.causal) : longattn::test::ReferenceOptions{};
  ref_opts.causal = run.causal;
  ref_opts.query_offset = s.query_offset;
  ref_opts.key_offset = s.key_offset;
  longattn::test::reference_attention_forward(q, k, v, o_ref, lse_ref, ref_opts);
  longattn::test::reference_attention_backward(q, k, v, d_o, dq_ref, dk_ref, dv_ref, ref_opts);
  // o = output_scale softmax(...) v; its gradients scale with it.
  for (const HostTensor& x : {o_ref, dq_ref, dk_ref, dv_ref})
    for (std::size_t i = 0; i < x.span(); ++i) x.data()[i] *= run.output_scale;

  auto qd = longattn::test::to_device<T, Memory>(q), kd = longattn::test::to_device<T, Memory>(k);
  auto vd = longattn::test::to_device<T, Memory>(v), dod = longattn::test::to_device<T, Memory>(d_o);
  Device4 o("o", s.batch, s.queries, s.heads, s.head_dim), dq("dq", s.batch, s.queries, s.heads, s.head_dim);
  Device4 dk("dk", s.batch, s.keys, s.heads, s.head_dim), dv("dv", s.batch, s.keys, s.heads, s.head_dim);
  Kokkos::View<float***, Memory> lse("lse", s.batch, s.heads, s.queries);
  if (run.accumulate_gradients) {  // the gradients are added to what dq, dk, dv hold
    const HostTensor dq0 = random_tensor<T>(s.batch, s.queries, s.heads, s.head_dim, rng);
    const HostTensor dk0 = random_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, rng);
    const HostTensor dv0 = random_tensor<T>(s.batch, s.keys, s.heads, s.head_dim, rng);
    Kokkos::deep_copy(dq, longattn::test::to_device<T, Memory>(dq0));
    Kokkos::deep_copy(dk, longattn::test::to_device<T, Memory>(dk0));
    Kokkos::deep_copy(dv, longattn::test::to_device<T, Memory>(dv0));
    for (std::size_t i = 0; i < dq_ref.span(); ++i) dq_ref.data()[i] += dq0.data()[i];
    for (std::size_t i = 0; i < dk_ref.span(); ++i) dk_ref.data()[i] += dk0.data()[i];
    for (std::size_t i = 0; i < dv_ref.span(); ++i) dv_ref.data()[i] += dv0.data()[i];
  } else {  // stale values: everything must be written
    Kokkos::deep_copy(o, T(7.0));
    Kokkos::deep_copy(lse, 7.0f);
    Kokkos::deep_copy(dq, T(7.0));
    Kokkos::deep_copy(dk, T(7.0));
    Kokkos::deep_copy(dv, T(7.0));
  }
  longattn::AttentionOptions opts;
  opts.causal = run.causal;
  opts.query_offset = s.query_offset;
  opts.key_offset = s.key_offset;
  opts.output_scale = run.output_scale;
  opts.accumulate_gradients = run.accumulate_gradients;
  opts.deterministic = run.form == Form::deterministic;
  opts.allow_tf32 = run.allow_tf32;
  opts.tensor_core_forward = run.forward_program;
  opts.tensor_core_backward = run.backward_program;
  if (run.form == Form::two_passes) opts.backward_passes = longattn::BackwardPasses::two;
  const Exec exec;
  std::int64_t grids = tc::launched_grids();
  Emulator::reset_counters();
  if (run.layout)
    longattn::attention_forward<Tiles>(exec, qd, kd, vd, o, lse, opts, *run.layout);
  else
    longattn::attention_forward<Tiles>(exec, qd, kd, vd, o, lse, opts);
  CHECK((tc::launched_grids() > grids) == run.forward_on_tensor_cores);
  if (Target::emulated) {
    CHECK(Emulator::counters().ldmatrix_conflict_wavefronts == 0);  // padded tiles
    const bool warpgroup = run.forward_program == longattn::TensorCoreProgram::warpgroup;
    CHECK((Emulator::counters().wgmma > 0) == warpgroup);
    CHECK((Emulator::counters().tma > 0) == warpgroup);
    CHECK((Emulator::counters().named_barriers > 0) == warpgroup);  // the consumers' turns
  }
  grids = tc::launched_grids();
  Emulator::reset_counters();
  if (run.layout)
    longattn::attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, opts, *run.layout);
  else
    longattn::attention_backward<Tiles>(exec, qd, kd, vd, o, dod, lse, dq, dk, dv, opts);
  CHECK((tc::launched_grids() > grids) == run.backward_on_tensor_cores);
  if (Target::emulated) {  // dQ summed by atomics exactly in the warp-level one-pass form
    const bool warpgroup = run.backward_program == longattn::TensorCoreProgram::warpgroup;
    CHECK((Emulator::counters().atomics > 0) == (run.backward_on_tensor_cores && run.form == Form::atomic && !warpgroup));
    CHECK(Emulator::counters().ldmatrix_conflict_wavefronts == 0);
    CHECK((Emulator::counters().wgmma > 0) == warpgroup);
    CHECK((Emulator::counters().tma > 0) == warpgroup);
    CHECK((Emulator::counters().setmaxnreg > 0) == warpgroup);  // the producer's registers to the consumers
  }
  exec.fence();

  const double forward_tolerance =
      run.forward_on_tensor_cores ? tensor_core_tolerance<T>() : longattn::test::tolerance<T>();
  // Accumulating, a gradient is rounded twice (the pass's value, then the sum).
  const double backward_tolerance =
      (run.accumulate_gradients ? 2 : 1) *
      (run.backward_on_tensor_cores ? tensor_core_tolerance<T>() : longattn::test::gradient_tolerance<T>());
  CHECK(relative_error(longattn::test::to_host(o), o_ref) <= forward_tolerance);
  CHECK(relative_error(longattn::test::to_host(lse), lse_ref) <= forward_tolerance);
  CHECK(relative_error(longattn::test::to_host(dq), dq_ref) <= backward_tolerance);
  CHECK(relative_error(longattn::test::to_host(dk), dk_ref) <= backward_tolerance);
  CHECK(relative_error(longattn::test::to_host(dv), dv_ref) <= backward_tolerance);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("tensor-core attention matches the double reference", "[core][tensor_cores]", Targets) {
  std::mt19937_64 rng(longattn::test::test_seed());
  const std::vector<Shape> all = {
      {1, 1, 1, 1, 64},
      {2, 100, 37, 2, 64, 50, 20},
      {1, 65, 129, 2, 128, 0, 64},  // causal: the first 64 queries see no key
      {2, 67, 67, 3, 64},
      {1, 130, 200, 2, 128, 150, 0},
      {1, 300, 260, 1, 64},  // three pairs of query blocks, the last one short
  };
  // LONGATTN_TEST_SIZE=small (sanitizers): the first three, which hold every kind of edge.
  const std::vector<Shape> shapes(all.begin(), all.begin() + longattn::test::test_size(6, 3));
  for (const Shape& s : shapes)
    for (bool causal : {false, true})
      for (Form form : {Form::atomic, Form::deterministic}) {
        const Run<typename TestType::Exec> run{s, causal, form};
        check_attention<TestType, longattn::bfloat16>(run, rng);
        check_attention<TestType, longattn::float16>(run, rng);
        // float (TF32) in one form of each causal setting: the forms' code is the 16-bit one's.
        if ((form == Form::atomic) != causal) check_attention<TestType, float>(run, rng);
      }
}

TEMPLATE_LIST_TEST_CASE("tensor-core attention: two passes, output_scale, accumulated gradients, other head dims",
                        "[core][tensor_cores]", Targets) {
  using Run = Run<typename TestType::Exec>;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Shape s{2, 100, 150, 2, 64, 80, 0};
  for (bool causal : {false, true}) {
    check_attention<TestType, longattn::bfloat16>(Run{s, causal, Form::two_passes}, rng);
    check_attention<TestType, longattn::bfloat16>(Run{s, causal, Form::atomic, 0.25}, rng);
    check_attention<TestType, longattn::float16>(Run{s, causal, Form::deterministic, 1.5, true}, rng);
    check_attention<TestType, longattn::bfloat16>(Run{s, causal, Form::atomic, 1, true}, rng);
    check_attention<TestType, float>(Run{s, causal, Form::atomic, 0.5, true}, rng);
  }
  // Head dim 256: the forward pass on tensor cores, the backward on the portable kernels.
  Run wide{{1, 130, 90, 1, 256, 40, 0}, true, Form::atomic};
  wide.backward_on_tensor_cores = false;
  check_attention<TestType, longattn::bfloat16>(wide, rng);
  wide.causal = false;
  check_attention<TestType, longattn::float16>(wide, rng);
  // Head dims without programs, float at 256 (its tiles would not fit) or without allow_tf32: the
  // portable kernels.
  Run other{{1, 70, 70, 2, 32}, true, Form::atomic};
  other.forward_on_tensor_cores = other.backward_on_tensor_cores = false;
  check_attention<TestType, longattn::bfloat16>(other, rng);
  other.s.head_dim = 96;
  check_attention<TestType, longattn::float16>(other, rng);
  check_attention<TestType, float>(other, rng);
  other.s.head_dim = 256;
  check_attention<TestType, float>(other, rng);
  other.s.head_dim = 64;
  other.allow_tf32 = false;
  check_attention<TestType, float>(other, rng);
}

TEMPLATE_LIST_TEST_CASE("tensor-core attention: the warpgroup programs (wgmma) match the double reference",
                        "[core][tensor_cores]", Targets) {
  using Exec = typename TestType::Exec;
  using Run = Run<Exec>;
  if (!warpgroup_program_runs<TestType>()) {
    WARN("SKIP: the GPU is not compute capability 9.0, where the warpgroup program runs");
    return;
  }
  std::mt19937_64 rng(longattn::test::test_seed());
  const std::vector<Shape> all = {
      {1, 65, 129, 2, 128, 0, 64},  // causal: the first 64 queries see no key
      {2, 100, 37, 2, 64, 50, 20},
      {1, 130, 200, 1, 128, 150, 0},
      {1, 300, 260, 1, 64},  // three pairs of query blocks, the last one short
  };
  const std::vector<Shape> shapes(all.begin(), all.begin() + longattn::test::test_size(4, 2));
  for (const Shape& s : shapes)
    for (bool causal : {false, true}) {
      Run run{s, causal, causal ? Form::atomic : Form::deterministic, causal ? 0.5 : 1.0, !causal};
      run.forward_program = run.backward_program = longattn::TensorCoreProgram::warpgroup;
      check_attention<TestType, longattn::bfloat16>(run, rng);
      check_attention<TestType, longattn::float16>(run, rng);
    }
  // Ring attention's passes: the softmax continued over a second part of the keys
  // (accumulate_output) equals one pass over all of them.
  const Exec exec;
  {
    using Memory = typename Exec::memory_space;
    const HostTensor q = random_tensor<longattn::bfloat16>(1, 100, 2, 128, rng);
    const HostTensor kv = random_tensor<longattn::bfloat16>(1, 200, 2, 128, rng);
    auto qd = longattn::test::to_device<longattn::bfloat16, Memory>(q);
    auto kvd = longattn::test::to_device<longattn::bfloat16, Memory>(kv);
    Kokkos::View<longattn::bfloat16****, Kokkos::LayoutRight, Memory> o("o", 1, 100, 2, 128), o_acc("o acc", 1, 100, 2, 128);
    Kokkos::View<float***, Memory> lse("lse", 1, 2, 100), lse_acc("lse acc", 1, 2, 100);
    longattn::AttentionOptions whole;
    whole.tensor_core_forward = longattn::TensorCoreProgram::warpgroup;
    whole.causal = true;
    whole.query_offset = 120;
    longattn::attention_forward<typename TestType::Tiles>(exec, qd, kvd, kvd, o, lse, whole);
    for (const std::pair<int, int>& part : {std::pair<int, int>{0, 130}, {130, 200}}) {
      longattn::AttentionOptions pass = whole;
      pass.key_offset = part.first;
      pass.accumulate_output = part.first > 0;
      const auto keys = Kokkos::subview(kvd, Kokkos::ALL, part, Kokkos::ALL, Kokkos::ALL);
      longattn::attention_forward<typename TestType::Tiles>(exec, qd, keys, keys, o_acc, lse_acc, pass);
    }
    exec.fence();
    INFO("accumulate_output, bfloat16, D 128, causal");
    CHECK(relative_error(longattn::test::to_host(o_acc), longattn::test::to_host(o)) <=
          2 * tensor_core_tolerance<longattn::bfloat16>());
    CHECK(relative_error(longattn::test::to_host(lse_acc), longattn::test::to_host(lse)) <= 1e-5);
  }
  // Where they cannot run: float (TF32), head dim 256; the backward one in one pass.
  longattn::AttentionOptions opts;
  opts.tensor_core_forward = opts.tensor_core_backward = longattn::TensorCoreProgram::warpgroup;
  opts.allow_tf32 = true;
  using Device4 = Kokkos::View<float****, Kokkos::LayoutRight, typename Exec::memory_space>;
  Device4 x("x", 1, 64, 1, 64), y("y", 1, 64, 1, 64), dx("dx", 1, 64, 1, 64), dz("dz", 1, 64, 1, 64);
  Kokkos::View<float***, typename Exec::memory_space> lse("lse", 1, 1, 64);
  CHECK_THROWS_WITH(longattn::attention_forward<typename TestType::Tiles>(exec, x, x, x, y, lse, opts),
                    Catch::Contains("opts.tensor_core_forward") && Catch::Contains("16-bit tensors at head dims 64 and 128"));
  CHECK_THROWS_WITH(longattn::attention_backward<typename TestType::Tiles>(exec, x, x, x, x, x, lse, y, dx, dz, opts),
                    Catch::Contains("opts.tensor_core_backward") && Catch::Contains("16-bit tensors at head dims 64 and 128"));
  using Half4 = Kokkos::View<longattn::bfloat16****, Kokkos::LayoutRight, typename Exec::memory_space>;
  Half4 wide("wide", 1, 64, 1, 256), wide_o("wide_o", 1, 64, 1, 256);
  CHECK_THROWS_WITH(longattn::attention_forward<typename TestType::Tiles>(exec, wide, wide, wide, wide_o, lse, opts),
                    Catch::Contains("opts.tensor_core_forward"));
  Half4 narrow("narrow", 1, 64, 1, 64), dq("dq", 1, 64, 1, 64), dk("dk", 1, 64, 1, 64), dv("dv", 1, 64, 1, 64);
  opts.backward_passes = longattn::BackwardPasses::one;
  CHECK_THROWS_WITH(longattn::attention_backward<typename TestType::Tiles>(exec, narrow, narrow, narrow, narrow, narrow,
                                                                           lse, dq, dk, dv, opts),
                    Catch::Contains("opts.backward_passes") && Catch::Contains("tensor_core_backward = warpgroup"));
}

TEMPLATE_LIST_TEST_CASE("tensor-core attention: block-sparse layouts visit only their blocks", "[core][tensor_cores]",
                        Targets) {
  using Exec = typename TestType::Exec;
  using Run = Run<Exec>;
  std::mt19937_64 rng(longattn::test::test_seed());
  const Exec exec;
  const std::vector<Shape> shapes = {Shape{2, 300, 300, 2, 64}, Shape{1, 200, 330, 3, 128}};
  for (std::size_t n = 0; n < longattn::test::test_size<std::size_t>(2, 1); ++n) {
    const Shape& s = shapes[n];
    longattn::BlockSparseShape shape;
    shape.block = longattn::attention_block_size<Exec, longattn::bfloat16, typename TestType::Tiles>();
    shape.queries = s.queries;
    shape.keys = s.keys;
    shape.batch = s.batch;
    shape.heads = s.heads;
    // A random mask with an empty row (pattern 0, query block 1) and an empty column (last
    // pattern, key block 0).
    std::vector<std::uint8_t> keep(std::size_t(shape.rows()) * shape.key_blocks());
    for (auto& x : keep) x = rng() % 2;
    const int QB = shape.query_blocks(), KB = shape.key_blocks();
    for (int kb = 0; kb < KB; ++kb) keep[std::size_t(1) * KB + kb] = 0;
    for (int qb = 0; qb < QB; ++qb) keep[(std::size_t(shape.patterns() - 1) * QB + qb) * KB] = 0;
    const auto layout = longattn::mask_layout(exec, shape, keep);
    bool consistent = false;
    const longattn::test::BlockMask mask = longattn::test::read_layout(layout, consistent);
    REQUIRE(consistent);
    for (Form form : {Form::atomic, Form::deterministic}) {
      Run run{s, false, form};
      run.layout = &layout;
      run.mask = &mask;
      check_attention<TestType, longattn::bfloat16>(run, rng);
    }
    if (warpgroup_program_runs<TestType>()) {
      Run warpgroup{s, true, Form::atomic};
      warpgroup.layout = &layout;
      warpgroup.mask = &mask;
      warpgroup.forward_program = warpgroup.backward_program = longattn::TensorCoreProgram::warpgroup;
      check_attention<TestType, longattn::float16>(warpgroup, rng);
    }
    // A causal local window, shared by every head.
    longattn::BlockSparseShape shared = shape;
    shared.batch = shared.heads = 1;
    const auto window = longattn::local_window_layout(exec, shared, 100, true);
    const longattn::test::BlockMask window_mask = longattn::test::read_layout(window, consistent);
    Run run{s, true, Form::atomic};
    run.layout = &window;
    run.mask = &window_mask;
    check_attention<TestType, longattn::float16>(run, rng);
    check_attention<TestType, float>(run, rng);
  }
}

namespace {

// A CTA program of `Threads` threads and 1 KiB of shared memory made of a function of it.
template <int Threads, class F>
struct SmallProgram {
  static constexpr int threads = Threads;
  static constexpr std::size_t shared_bytes = 1024;
  F f;
  void operator()(int, char* shared) const { f(shared, EmulatedWarp::thread()); }
};
template <int Threads, class F>
void emulate(const F& f) {
  Emulator::run(SmallProgram<Threads, F>{f}, 2);
}

}  // namespace

TEST_CASE("the warp emulation reports races, early reads, misalignment, divergence and deadlocks",
          "[core][tensor_cores][errors]") {
  using Catch::Contains;
  alignas(16) static const char source[64] = {};
  // Correct: written, a barrier, read by another warp; a cp.async waited for, then read.
  CHECK_NOTHROW(emulate<64>([](char* shared, int thread) {
    if (thread == 0) EmulatedWarp::store_shared(shared, 1.0f);
    EmulatedWarp::sync_cta();
    if (thread == 40) CHECK(EmulatedWarp::load_shared<float>(shared) == 1.0f);
    if (thread == 1) EmulatedWarp::cp_async_16(shared + 16, source, true);
    EmulatedWarp::cp_async_wait_all();
    EmulatedWarp::sync_cta();
    if (thread == 33) CHECK(EmulatedWarp::load_shared<float>(shared + 16) == 0.0f);
  }));
  CHECK_THROWS_WITH(emulate<64>([](char* shared, int thread) {  // no barrier between warps
                      if (thread == 0) EmulatedWarp::store_shared(shared, 1.0f);
                      EmulatedWarp::sync_warp();
                      if (thread == 40) (void)EmulatedWarp::load_shared<float>(shared);
                      EmulatedWarp::sync_cta();
                    }),
                    Contains("CTA 0, thread 40: a shared-memory load reads shared offset 0, written by thread 0 "
                             "since the last barrier: a race"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {  // no sync_warp inside a warp
                      if (thread == 0) EmulatedWarp::store_shared(shared, 1.0f);
                      if (thread == 1) (void)EmulatedWarp::load_shared<float>(shared);
                    }),
                    Contains("written by thread 0 since the last barrier: a race"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {  // read before the wait
                      if (thread == 3) {
                        EmulatedWarp::cp_async_16(shared, source, true);
                        (void)EmulatedWarp::load_shared<float>(shared);
                      }
                      EmulatedWarp::cp_async_wait_all();
                    }),
                    Contains("which a cp.async of thread 3 has not landed yet (no cp.async.wait)"));
  CHECK_THROWS_WITH(emulate<64>([](char* shared, int thread) {  // a copy over data another warp reads
                      if (thread == 0) EmulatedWarp::store_shared(shared, 1.0f);
                      EmulatedWarp::sync_cta();
                      if (thread == 40) (void)EmulatedWarp::load_shared<float>(shared);
                      EmulatedWarp::sync_warp();
                      if (thread == 0) EmulatedWarp::cp_async_16(shared, source, true);
                      EmulatedWarp::cp_async_wait_all();
                    }),
                    Contains("cp.async writes shared offset 0, read since the last barrier by warp 1: a race"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {
                      if (thread == 0) EmulatedWarp::cp_async_16(shared + 8, source, true);
                      EmulatedWarp::cp_async_wait_all();
                    }),
                    Contains("cp.async at shared offset 8 is not aligned to 16 bytes"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {
                      std::uint32_t r[4];
                      EmulatedWarp::ldmatrix_x4(r, shared + 1024 - 16 + (thread == 5 ? 16 : 0));
                    }),
                    Contains("ldmatrix.x4 at"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int) {
                      std::uint32_t r[4];
                      EmulatedWarp::ldmatrix_x4(r, shared);
                    }),
                    Contains("reads shared offset 0, which nothing wrote"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {
                      if (thread == 7) {
                        std::uint32_t r[4];
                        EmulatedWarp::ldmatrix_x4(r, shared);
                      } else {
                        (void)EmulatedWarp::shfl_xor(1.0f, 1);
                      }
                    }),
                    Contains("the warp diverged at a collective"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int thread) {  // a TF32 operand not rounded to TF32
                      float d[4] = {};
                      const float x = thread == 6 ? 1.0f + 0x1p-20f : 1.0f;
                      std::uint32_t a[4] = {};
                      std::memcpy(&a[0], &x, sizeof x);
                      EmulatedWarp::mma<tc::Operand::tf32>(d, a, 0u, 0u);
                    }),
                    Contains("mma.m16n8k8.tf32: lane 6's a0 is 0x3f800008, not a TF32 value"));
  CHECK_THROWS_WITH(emulate<64>([](char*, int thread) {
                      if (thread < 32) EmulatedWarp::sync_cta();
                    }),
                    Contains("finishes while 32 threads wait at a CTA barrier"));
  CHECK_THROWS_WITH(emulate<64>([](char*, int thread) {
                      if (thread >= 32 && thread < 48)
                        (void)EmulatedWarp::shfl_xor(1.0f, 1);
                      else
                        EmulatedWarp::sync_cta();
                    }),
                    Contains("CTA 0 deadlocks; waiting: thread 0 at a CTA barrier;"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int thread) { (void)EmulatedWarp::uniform(thread / 2); }),
                    Contains("lane 2 gives 1 where lane 0 gives 0 to a value the program takes as the warp's"));
  // After a failure the next emulation runs normally.
  CHECK_NOTHROW(emulate<32>([](char*, int) { EmulatedWarp::sync_warp(); }));
}

namespace {

// One warpgroup product S = A B^T (64 x 64 tiles of zeros, bf16) with the ordering steps that
// `skip` leaves out.
enum class Skip { nothing, proxy_fence, wgmma_fence, wait };
struct WgmmaOrdering {
  static constexpr int threads = tc::warpgroup_threads;
  static constexpr int tile = tc::swizzled_tile_bytes(64, 64);
  static constexpr std::size_t shared_bytes = 2 * tile;
  Skip skip;
  void operator()(int, char* shared) const {
    const int thread = EmulatedWarp::thread();
    for (int word = thread; word < 2 * tile / 4; word += threads) EmulatedWarp::store_shared(shared + 4 * word, 0u);
    if (skip != Skip::proxy_fence) EmulatedWarp::fence_proxy_async();
    EmulatedWarp::sync_cta();
    const std::uint32_t address = EmulatedWarp::shared_address(shared);
    float s[8][4] = {};
    if (skip != Skip::wgmma_fence) EmulatedWarp::wgmma_fence();
    EmulatedWarp::wgmma<tc::Operand::bf16, 64>(s, tc::k_major_descriptor(address, 64, 0, 0),
                                               tc::k_major_descriptor(address + tile, 64, 0, 0));
    EmulatedWarp::wgmma_commit();
    if (skip != Skip::wait) EmulatedWarp::wgmma_wait<0>();
  }
};

}  // namespace

TEST_CASE("the warpgroup emulation reports wgmma without its fences or its wait", "[core][tensor_cores][errors]") {
  using Catch::Contains;
  CHECK_NOTHROW(Emulator::run(WgmmaOrdering{Skip::nothing}, 1));
  CHECK_THROWS_WITH(Emulator::run(WgmmaOrdering{Skip::proxy_fence}, 1),
                    Contains("through the generic proxy with no fence.proxy.async"));
  CHECK_THROWS_WITH(Emulator::run(WgmmaOrdering{Skip::wgmma_fence}, 1),
                    Contains("issues wgmma.mma_async with no wgmma.fence"));
  CHECK_THROWS_WITH(Emulator::run(WgmmaOrdering{Skip::wait}, 1), Contains("never waited for (wgmma.wait_group)"));
}

namespace {

// A tensor of 4 tokens of 64 16-bit values for the copy engine (value 64 t + v + 1 at token t,
// value v), copied a token at a time.
std::uint16_t tokens[4 * 64];
tc::TileMap token_map() {
  tc::TileMap map;
  map.data = tokens;
  const std::int64_t extents[4] = {64, 4, 1, 1}, strides[4] = {2, 128, 16, 16};
  std::copy(extents, extents + 4, map.extents);
  std::copy(strides, strides + 4, map.strides);
  map.box_rows = 1;
  return map;
}
constexpr std::uint32_t barrier_offset = 512;  // in SmallProgram's shared memory

// A wgmma reading two 64 x 64 tiles that TMA brought, and a copy over the second issued before the
// wgmma was waited for.
struct CopyOverWgmma {
  static constexpr int threads = tc::warpgroup_threads;
  static constexpr int tile = tc::swizzled_tile_bytes(64, 64);
  static constexpr std::size_t shared_bytes = 2 * tile + 8;
  tc::TileMap map;  // 64 x 64
  void operator()(int, char* shared) const {
    const int thread = EmulatedWarp::thread();
    const std::uint32_t address = EmulatedWarp::shared_address(shared), barrier = address + 2 * tile;
    if (thread == 0) EmulatedWarp::mbarrier_init(barrier, 1);
    EmulatedWarp::sync_cta();
    if (thread == 0) {
      EmulatedWarp::mbarrier_arrive_expect_tx(barrier, 2 * tile);
      EmulatedWarp::tma_load(shared, map, 0, 0, 0, 0, barrier);
      EmulatedWarp::tma_load(shared + tile, map, 0, 0, 0, 0, barrier);
    }
    EmulatedWarp::mbarrier_wait(barrier, 0);
    float s[8][4] = {};
    EmulatedWarp::wgmma_fence();
    EmulatedWarp::wgmma<tc::Operand::bf16, 64>(s, tc::k_major_descriptor(address, 64, 0, 0),
                                               tc::k_major_descriptor(address + tile, 64, 0, 0));
    EmulatedWarp::wgmma_commit();
    if (thread == 0) {
      EmulatedWarp::mbarrier_arrive_expect_tx(barrier, tile);
      EmulatedWarp::tma_load(shared + tile, map, 0, 0, 0, 0, barrier);
    }
    EmulatedWarp::wgmma_wait<0>();
    EmulatedWarp::mbarrier_wait(barrier, 1);
  }
};

}  // namespace

TEST_CASE("the emulation's TMA copies and mbarriers: boxes, swizzle and zeros; waits and arrivals checked",
          "[core][tensor_cores][errors]") {
  using Catch::Contains;
  for (int i = 0; i < 4 * 64; ++i) tokens[i] = std::uint16_t(i + 1);
  // Token 1 into the second 128-byte row of a swizzle period (its 16-byte chunks XOR 1), token 4
  // (past the tensor) as zeros; read after the wait, in a CTA whose copies land at once and in one
  // whose copies land as late as they may.
  Emulator::reset_counters();
  CHECK_NOTHROW(emulate<64>([](char* shared, int thread) {
    if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
    EmulatedWarp::sync_cta();
    if (thread == 0) {
      EmulatedWarp::mbarrier_arrive_expect_tx(barrier_offset, 256);
      EmulatedWarp::tma_load(shared + 128, token_map(), 0, 1, 0, 0, barrier_offset);
      EmulatedWarp::tma_load(shared + 256, token_map(), 0, 4, 0, 0, barrier_offset);
    }
    EmulatedWarp::mbarrier_wait(barrier_offset, 0);
    if (thread == 40) {
      CHECK(EmulatedWarp::load_shared<std::uint16_t>(shared + 128 + 16) == 65);  // value 0 in chunk 1
      CHECK(EmulatedWarp::load_shared<std::uint16_t>(shared + 128 + 2) == 74);   // value 9 in chunk 0
      CHECK(EmulatedWarp::load_shared<std::uint16_t>(shared + 256 + 32) == 0);   // past the tensor
    }
  }));
  CHECK(Emulator::counters().tma == 4);
  CHECK_THROWS_WITH(emulate<64>([](char* shared, int thread) {  // read with no wait
                      if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
                      EmulatedWarp::sync_cta();
                      if (thread == 0) {
                        EmulatedWarp::mbarrier_arrive_expect_tx(barrier_offset, 128);
                        EmulatedWarp::tma_load(shared, token_map(), 0, 0, 0, 0, barrier_offset);
                      }
                      if (thread == 33) (void)EmulatedWarp::load_shared<std::uint16_t>(shared);
                      EmulatedWarp::mbarrier_wait(barrier_offset, 0);
                    }),
                    Contains("CTA 0, thread 33: a shared-memory load reads shared offset 0, which a TMA copy landed on "
                             "mbarrier 0's phase 0, not waited for by thread 33"));
  CHECK_THROWS_WITH(Emulator::run(CopyOverWgmma{[] {
                                    static longattn::bfloat16 zeros[64 * 64] = {};
                                    tc::TileMap map = token_map();
                                    map.data = zeros;
                                    map.extents[1] = 64;
                                    map.box_rows = 64;
                                    return map;
                                  }()},
                                  1),
                    Contains("a TMA copy lands on shared offset 8192, which a wgmma.mma_async issued and not yet "
                             "waited for reads"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int) { EmulatedWarp::mbarrier_wait(barrier_offset, 0); }),
                    Contains("mbarrier.try_wait uses shared offset 512, where no mbarrier was initialized"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int thread) {
                      if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
                      EmulatedWarp::sync_warp();
                      if (thread == 1) EmulatedWarp::mbarrier_arrive(barrier_offset);
                    }),
                    Contains("initialized by thread 0 with no CTA barrier since"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {  // two arrivals where the phase expects one
                      if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
                      EmulatedWarp::sync_cta();
                      if (thread == 0) {
                        EmulatedWarp::mbarrier_arrive_expect_tx(barrier_offset, 128);
                        EmulatedWarp::mbarrier_arrive(barrier_offset);
                        EmulatedWarp::tma_load(shared, token_map(), 0, 0, 0, 0, barrier_offset);
                      }
                    }),
                    Contains("arrives at the mbarrier at shared offset 512 with none of its phase's 1 arrivals pending"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int thread) {  // a phase nobody completes
                      if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
                      EmulatedWarp::sync_cta();
                      EmulatedWarp::mbarrier_wait(barrier_offset, 0);
                    }),
                    Contains("CTA 0 deadlocks; waiting: thread 0 at an mbarrier wait;"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {  // a copy never waited for
                      if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
                      EmulatedWarp::sync_cta();
                      if (thread == 0) {
                        EmulatedWarp::mbarrier_arrive_expect_tx(barrier_offset, 128);
                        EmulatedWarp::tma_load(shared, token_map(), 0, 0, 0, 0, barrier_offset);
                      }
                    }),
                    Contains("CTA 1, thread 0: finishes with 1 TMA copies in flight, never waited for"));
  CHECK_THROWS_WITH(emulate<32>([](char* shared, int thread) {
                      if (thread == 0) EmulatedWarp::mbarrier_init(barrier_offset, 1);
                      EmulatedWarp::sync_cta();
                      if (thread == 0) EmulatedWarp::tma_load(shared + 64, token_map(), 0, 0, 0, 0, barrier_offset);
                    }),
                    Contains("cp.async.bulk.tensor at shared offset 64 is not aligned to 128 bytes"));
}

TEST_CASE("the emulation's setmaxnreg: registers move between warpgroups within a sub-partition's",
          "[core][tensor_cores][errors]") {
  using Catch::Contains;
  // Three warpgroups start with 168 registers a thread: the third gives back all but 24, the
  // first two take 240 (504 of 512), the second waiting until the third gave (it asks first).
  Emulator::reset_counters();
  CHECK_NOTHROW(emulate<384>([](char*, int thread) {
    if (thread / 128 == 2) EmulatedWarp::setmaxnreg_dec<24>();
    if (thread / 128 < 2) EmulatedWarp::setmaxnreg_inc<240>();
  }));
  CHECK(Emulator::counters().setmaxnreg == 2 * 3);
  CHECK_THROWS_WITH(emulate<384>([](char*, int thread) {  // 40 + 2 x 240 > 512: never free
                      if (thread / 128 == 2) EmulatedWarp::setmaxnreg_dec<40>();
                      if (thread / 128 < 2) EmulatedWarp::setmaxnreg_inc<240>();
                    }),
                    Contains("deadlocks; waiting: thread") && Contains(" at setmaxnreg"));
  CHECK_THROWS_WITH(emulate<256>([](char*, int thread) {
                      if (thread / 128 == 0) EmulatedWarp::setmaxnreg_dec<244>();
                    }),
                    Contains("setmaxnreg.dec 244: 24-256 registers, a multiple of 8"));
  CHECK_THROWS_WITH(emulate<256>([](char*, int) { EmulatedWarp::setmaxnreg_inc<128>(); }),
                    Contains("setmaxnreg.inc 128 where the warpgroup's threads have 248 registers"));
  CHECK_THROWS_WITH(emulate<128>([](char*, int thread) {
                      if (thread < 64)
                        EmulatedWarp::setmaxnreg_dec<64>();
                      else
                        EmulatedWarp::setmaxnreg_dec<72>();
                    }),
                    Contains("gives setmaxnreg operands that differ from its warpgroup's"));
}

TEST_CASE("the emulation's named barriers: turns in order; counts, whole warps and leftover arrivals checked",
          "[core][tensor_cores][errors]") {
  using Catch::Contains;
  // Two warps take three turns each as the warpgroup forward program's consumers do (begin_turns,
  // take_turn, pass_turn, end_turns): warp 1 passes first, so warp 0 goes first; after the loop
  // warp 0 takes the turn warp 1 passed last.
  static std::vector<int> turns_taken;
  turns_taken.clear();
  Emulator::reset_counters();
  CHECK_NOTHROW(emulate<64>([](char*, int thread) {
    const int warp = thread / 32;
    if (warp == 1) EmulatedWarp::barrier_arrive(1, 64);
    for (int i = 0; i < 3; ++i) {
      EmulatedWarp::barrier_sync(1 + warp, 64);
      if (thread % 32 == 0) turns_taken.push_back(warp);
      EmulatedWarp::barrier_arrive(2 - warp, 64);
    }
    if (warp == 0) EmulatedWarp::barrier_sync(1, 64);
  }));
  CHECK(turns_taken == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1});  // two CTAs
  CHECK(Emulator::counters().named_barriers == 2 * 7);
  CHECK_THROWS_WITH(emulate<64>([](char*, int thread) {  // warp 0 does not take the last turn
                      const int warp = thread / 32;
                      if (warp == 1) EmulatedWarp::barrier_arrive(1, 64);
                      for (int i = 0; i < 3; ++i) {
                        EmulatedWarp::barrier_sync(1 + warp, 64);
                        EmulatedWarp::barrier_arrive(2 - warp, 64);
                      }
                    }),
                    Contains("CTA 0, thread 63: ends with named barrier 1 holding 32 of its phase's 64 arrivals"));
  CHECK_THROWS_WITH(emulate<64>([](char*, int thread) {  // each waits for the other's pass first
                      EmulatedWarp::barrier_sync(1 + thread / 32, 64);
                      EmulatedWarp::barrier_arrive(2 - thread / 32, 64);
                    }),
                    Contains("CTA 0 deadlocks; waiting: thread 0 at a named barrier;"));
  CHECK_THROWS_WITH(emulate<128>([](char*, int thread) {
                      if (thread >= 64) return;
                      if (thread < 32)
                        EmulatedWarp::barrier_arrive(1, 64);
                      else
                        EmulatedWarp::barrier_sync(1, 96);
                    }),
                    Contains("thread 32: bar.sync 1 with 96 threads where its phase's other arrivals said 64"));
  CHECK_THROWS_WITH(emulate<64>([](char*, int thread) {
                      if (thread < 16 || thread >= 48) EmulatedWarp::barrier_sync(2, 32);
                    }),
                    Contains("bar.sync 2 completes with 16 of warp 0's lanes (whole warps arrive)"));
  CHECK_THROWS_WITH(emulate<64>([](char*, int thread) {
                      if (thread < 32) {
                        EmulatedWarp::barrier_arrive(3, 64);
                        EmulatedWarp::barrier_arrive(3, 64);
                      }
                    }),
                    Contains("thread 0: bar.arrive 3: the thread arrives twice in one phase (1 of 64 arrived)"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int) { EmulatedWarp::barrier_sync(0, 32); }),
                    Contains("bar.sync 0: named barriers are 1-15 (0 is the CTA barrier's)"));
  CHECK_THROWS_WITH(emulate<32>([](char*, int) { EmulatedWarp::barrier_arrive(4, 40); }),
                    Contains("bar.arrive 4 with 40 threads: a multiple of 32 up to the CTA's 32"));
}

TEST_CASE("tensor cores: a deterministic one-pass backward is refused", "[core][tensor_cores][errors]") {
  using Exec = Emulated::Exec;
  using Tensor = Kokkos::View<longattn::bfloat16****, Exec::memory_space>;
  const Exec exec;
  const Tensor x("x", 1, 70, 1, 64), o("o", 1, 70, 1, 64), d_o("d_o", 1, 70, 1, 64);
  const Tensor dq("dq", 1, 70, 1, 64), dk("dk", 1, 70, 1, 64), dv("dv", 1, 70, 1, 64);
  Kokkos::View<float***, Exec::memory_space> lse("lse", 1, 1, 70);
  longattn::AttentionOptions opts;
  longattn::attention_forward<Emulated::Tiles>(exec, x, x, x, o, lse, opts);
  opts.deterministic = true;
  opts.backward_passes = longattn::BackwardPasses::one;
  CHECK_THROWS_WITH(longattn::attention_backward<Emulated::Tiles>(exec, x, x, x, o, d_o, lse, dq, dk, dv, opts),
                    "longattn::attention_backward: argument 'opts.backward_passes' is one, expected two or automatic "
                    "with opts.deterministic (on tensor cores the one-pass form sums dQ atomically)");
}
