#pragma once
// longattn::ScopeGuard: start and stop what longattn runs on. Put one at the top of main():
//
//   int main(int argc, char* argv[]) {
//     longattn::ScopeGuard guard(argc, argv);
//     ...
//   }
//
// It initializes Kokkos (passing --kokkos-* arguments on) unless the program already did,
// selects the BLAS kernels for this CPU (core/blas.hpp), and finalizes Kokkos at scope exit
// if it initialized it.
namespace longattn {

class ScopeGuard {
 public:
  ScopeGuard(int& argc, char* argv[]);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  bool owns_kokkos_ = false;
};

}  // namespace longattn
