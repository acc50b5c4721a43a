// Communicator over NCCL for CUDA memory (builds with LONGATTN_ENABLE_NCCL): the same
// collectives, stream-ordered on the caller's stream. NCCL communicators mirror the MPI ones
// (group, node, across nodes), each set up from a unique id that rank 0 of it broadcasts over MPI.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "communicator_state.hpp"

namespace longattn::parallel {
namespace {

void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) throw Error(std::string("longattn::parallel: ") + call + " failed: " + ncclGetErrorString(result));
}

void check_cuda(cudaError_t error, const char* call) {
  if (error != cudaSuccess) throw Error(std::string("longattn::parallel: ") + call + " failed: " + cudaGetErrorString(error));
}

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
    case DataType::int32: return ncclInt32;
    case DataType::int64: return ncclInt64;
    case DataType::uint8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::average: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

ncclComm_t make_comm(MPI_Comm comm) {
  int rank = 0, size = 0;
  detail::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  detail::check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  ncclUniqueId id;
  if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  detail::check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm), "MPI_Bcast");
  ncclComm_t nccl = nullptr;
  check_nccl(ncclCommInitRank(&nccl, size, id, rank), "ncclCommInitRank");
  return nccl;
}

}  // namespace

namespace detail {

void CommunicatorState::make_nccl() {
  if (nccl) return;
  nccl = make_comm(comm);
  nccl_local = make_comm(local);
  nccl_cross = make_comm(cross);
}

void CommunicatorState::destroy_nccl() {
  for (ncclComm_t* c : {&nccl_cross, &nccl_local, &nccl})
    if (*c) ncclCommDestroy(*c);
  if (nccl_scratch) cudaFree(nccl_scratch);
}

}  // namespace detail

void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                              cudaStream_t stream) const {
  const char* where = "longattn::parallel::Communicator::all_reduce";
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    verify(where, count, type, int(op));
    state_->make_nccl();
    check_nccl(ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), state_->nccl, stream), "ncclAllReduce");
  });
}

// As on the host: reduce-scatter in the node, all-reduce across nodes, all-gather in the node.
// NCCL's reduce-scatter wants equal blocks, so a count that the node's ranks do not divide goes
// through a padded copy in the scratch buffer. An average averages at each stage: in the node
// over local_size, across nodes over nodes(), together over size().
void Communicator::hierarchical_all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                           cudaStream_t stream) const {
  const char* where = "longattn::parallel::Communicator::hierarchical_all_reduce";
  if (state_->nodes == 1 || state_->local_size == 1 || !state_->uniform)
    return all_reduce(send, recv, count, type, op, stream);
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    verify(where, count, type, int(op));
    state_->make_nccl();
    const std::size_t L = std::size_t(state_->local_size), block = (count + L - 1) / L, bytes = size_of(type);
    const bool padded = block * L != count;
    const std::size_t needed = (padded ? block * L : 0) * bytes + block * bytes;
    if (state_->nccl_scratch_bytes < needed) {
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the old scratch may be in use
      if (state_->nccl_scratch) check_cuda(cudaFree(state_->nccl_scratch), "cudaFree");
      state_->nccl_scratch = nullptr;
      check_cuda(cudaMalloc(&state_->nccl_scratch, needed), "cudaMalloc");
      state_->nccl_scratch_bytes = needed;
    }
    char* scratch = static_cast<char*>(state_->nccl_scratch);
    char* full = padded ? scratch : static_cast<char*>(recv);  // the whole vector, padded if need be
    char* mine = scratch + (padded ? block * L * bytes : 0);   // this rank's reduced block
    const void* input = send;
    if (padded) {
      check_cuda(cudaMemcpyAsync(full, send, count * bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      check_cuda(cudaMemsetAsync(full + count * bytes, 0, (block * L - count) * bytes, stream), "cudaMemsetAsync");
      input = full;
    }
    const ncclDataType_t t = nccl_type(type);
    check_nccl(ncclReduceScatter(input, mine, block, t, nccl_op(op), state_->nccl_local, stream), "ncclReduceScatter");
    check_nccl(ncclAllReduce(mine, mine, block, t, nccl_op(op), state_->nccl_cross, stream), "ncclAllReduce");
    check_nccl(ncclAllGather(mine, full, block, t, state_->nccl_local, stream), "ncclAllGather");
    if (padded)
      check_cuda(cudaMemcpyAsync(recv, full, count * bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  });
}

void Communicator::send_recv(const void* send, std::size_t send_count, int destination, void* recv,
                             std::size_t recv_count, int source, DataType type, cudaStream_t stream) const {
  const char* where = "longattn::parallel::Communicator::send_recv";
  guarded(where, [&] {
    require(send_count == 0 || send != nullptr, where, "send", "nullptr", "a device buffer");
    require(recv_count == 0 || recv != nullptr, where, "recv", "nullptr", "a device buffer");
    require(destination >= 0 && destination < state_->size, where, "destination", destination,
            "a rank from 0 to " + std::to_string(state_->size - 1));
    require(source >= 0 && source < state_->size, where, "source", source,
            "a rank from 0 to " + std::to_string(state_->size - 1));
    state_->make_nccl();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(send, send_count, nccl_type(type), destination, state_->nccl, stream), "ncclSend");
    check_nccl(ncclRecv(recv, recv_count, nccl_type(type), source, state_->nccl, stream), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  });
}

}  // namespace longattn::parallel
