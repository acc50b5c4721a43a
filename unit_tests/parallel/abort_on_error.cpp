// A rank whose collective fails ends the whole job (the default ErrorPolicy::abort): rank 1
// passes a null buffer to an all-reduce that the other ranks are already waiting in. CTest runs
// it under mpiexec and expects the message, and the job's end well within its timeout: no hang.
#include <cstdio>
#include <vector>

#include "longattn/parallel/communicator.hpp"
#include "longattn/parallel/placement.hpp"

int main(int argc, char* argv[]) {
  longattn::parallel::MpiSession mpi(argc, argv);
  const auto world = longattn::parallel::Communicator::world();
  std::vector<float> data(5, 1.0f);
  const float* send = world.rank() == 1 ? nullptr : data.data();
  world.all_reduce(send, data.data(), data.size(), longattn::parallel::DataType::float32,
                   longattn::parallel::ReduceOp::sum);
  std::printf("rank %d: the all-reduce returned, which it should not have\n", world.rank());
  return 0;
}
