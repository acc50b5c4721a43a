// The collective timeout (CommunicatorOptions::timeout_seconds): rank 1 stops in the middle of a
// run of all-reduces (SIGSTOP, as a rank that hangs; one that dies may leave the others waiting
// as well where the launcher does not end the job), and rank 0's next all-reduce must end the
// job after 2 s with a message naming it. CTest expects the message, and the job's end well
// within its timeout: no hang.
#include <csignal>
#include <cstdio>
#include <vector>

#include "longattn/parallel/communicator.hpp"
#include "longattn/parallel/placement.hpp"

int main(int argc, char* argv[]) {
  longattn::parallel::MpiSession mpi(argc, argv);
  longattn::parallel::CommunicatorOptions options;
  options.timeout_seconds = 2;
  const auto world = longattn::parallel::Communicator::world(options);
  std::vector<float> data(1000, 1.0f);
  for (int i = 0; i < 3; ++i) {
    if (i == 2 && world.rank() == 1) std::raise(SIGSTOP);
    world.all_reduce(data.data(), data.data(), data.size(), longattn::parallel::DataType::float32,
                     longattn::parallel::ReduceOp::sum);
  }
  std::printf("rank %d: every all-reduce returned, which it should not have\n", world.rank());
  return 0;
}
