// Sums down the columns of a [rows, cols] matrix: N sums a column (a bias gradient; LayerNorm's
// dgamma and dbeta), each added into the caller's output. `add(r, c, sums)` adds row r's terms of
// column c, `store(c, sums)` adds the column's totals into the output.
//
// On a host space a thread takes a column and its rows in order (the caller's own loop, with its
// contiguous reads, does better there). On a device a thread per column leaves most of the GPU idle
// and each thread walks every row (a 1024-column gradient over 32K rows: 1024 threads, 32K
// dependent steps each), so there a team of 32 lanes x `phases` takes 32 columns: lane l column
// 32 g + l, phase p rows p, p + phases, ... in order; then the phases' partial sums are added in
// phase order through team scratch. The order of every sum is fixed: the result is the same from
// run to run.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace longattn::detail {

template <int N, class A, class ExecSpace, class Add, class Store>
void device_column_sums(const char* label, const ExecSpace& exec, std::int64_t rows, int cols, const Add& add,
                        const Store& store) {
  constexpr int lanes = 32, phases = 16;
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Member = typename Policy::member_type;
  const std::size_t scratch_bytes = sizeof(A) * N * lanes * phases;
  Policy policy(exec, (cols + lanes - 1) / lanes, lanes * phases);
  Kokkos::parallel_for(
      label, policy.set_scratch_size(0, Kokkos::PerTeam(scratch_bytes)), KOKKOS_LAMBDA(const Member& team) {
        const int lane = team.team_rank() % lanes, phase = team.team_rank() / lanes;
        const int c = team.league_rank() * lanes + lane;
        A* partial = static_cast<A*>(team.team_scratch(0).get_shmem(scratch_bytes));
        A sums[N];
        for (int n = 0; n < N; ++n) sums[n] = A(0);
        if (c < cols)
          for (std::int64_t r = phase; r < rows; r += phases) add(r, c, sums);
        for (int n = 0; n < N; ++n) partial[(n * phases + phase) * lanes + lane] = sums[n];
        team.team_barrier();
        if (phase == 0 && c < cols) {
          for (int n = 0; n < N; ++n) {
            sums[n] = A(0);
            for (int p = 0; p < phases; ++p) sums[n] += partial[(n * phases + p) * lanes + lane];
          }
          store(c, sums);
        }
      });
}

}  // namespace longattn::detail
