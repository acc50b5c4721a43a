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
    case DataType::bfloat16: return ncclBfloat16;
    case DataType::float16: return ncclFloat16;
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
  if (exchange_stream) cudaStreamDestroy(exchange_stream);
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

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                  cudaStream_t stream) const {
  const char* where = "longattn::parallel::Communicator::reduce_scatter";
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    verify(where, count, type, int(op));
    state_->make_nccl();
    check_nccl(ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), state_->nccl, stream),
               "ncclReduceScatter");
  });
}

void Communicator::all_gather(const void* send, void* recv, std::size_t count, DataType type,
                              cudaStream_t stream) const {
  const char* where = "longattn::parallel::Communicator::all_gather";
  guarded(where, [&] {
    require(count == 0 || (send != nullptr && recv != nullptr), where, "send, recv", "nullptr",
            "device buffers of " + std::to_string(count) + " and " + std::to_string(count * std::size_t(state_->size)) +
                " elements");
    verify(where, count, type, -1);
    state_->make_nccl();
    check_nccl(ncclAllGather(send, recv, count, nccl_type(type), state_->nccl, stream), "ncclAllGather");
  });
}

namespace detail {

// Completion of the work a stream holds when the operation is made (an event recorded there).
class StreamEvent final : public PendingOperation {
 public:
  explicit StreamEvent(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord");
  }
  ~StreamEvent() override { cudaEventDestroy(event_); }  // a Request waits before; CUDA frees it when reached
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  bool test() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, "cudaEventQuery");
    return true;
  }
  void wait() override { check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace detail

Request Communicator::iall_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                  bool hierarchical, cudaStream_t stream) const {
  if (hierarchical) hierarchical_all_reduce(send, recv, count, type, op, stream);
  else all_reduce(send, recv, count, type, op, stream);
  std::unique_ptr<detail::PendingOperation> done;
  guarded("longattn::parallel::Communicator::iall_reduce", [&] { done = std::make_unique<detail::StreamEvent>(stream); });
  return Request(std::move(done));
}

Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                      cudaStream_t stream) const {
  reduce_scatter(send, recv, count, type, op, stream);
  std::unique_ptr<detail::PendingOperation> done;
  guarded("longattn::parallel::Communicator::ireduce_scatter",
          [&] { done = std::make_unique<detail::StreamEvent>(stream); });
  return Request(std::move(done));
}

// The exchange stream waits for what `stream` holds (the kernels that wrote the sends), runs the
// group, and the Request waits for the exchange stream.
Request Communicator::exchange(const std::vector<Transfer>& transfers, cudaStream_t stream) const {
  const char* where = "longattn::parallel::Communicator::exchange";
  std::unique_ptr<detail::PendingOperation> done;
  guarded(where, [&] {
    for (const Transfer& t : transfers) {
      const bool sending = t.direction == Transfer::Direction::send;
      require(t.count == 0 || t.data != nullptr, where, "data", "nullptr", "a device buffer");
      require(t.peer >= 0 && t.peer < state_->size, where, sending ? "destination" : "source", t.peer,
              "a rank from 0 to " + std::to_string(state_->size - 1));
    }
    state_->make_nccl();
    if (!state_->exchange_stream)
      check_cuda(cudaStreamCreateWithFlags(&state_->exchange_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    const detail::StreamEvent written(stream);
    check_cuda(cudaStreamWaitEvent(state_->exchange_stream, written.event(), 0), "cudaStreamWaitEvent");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Transfer& t : transfers) {
      if (t.direction == Transfer::Direction::send)
        check_nccl(ncclSend(t.data, t.count, nccl_type(t.type), t.peer, state_->nccl, state_->exchange_stream), "ncclSend");
      else
        check_nccl(ncclRecv(t.data, t.count, nccl_type(t.type), t.peer, state_->nccl, state_->exchange_stream), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    done = std::make_unique<detail::StreamEvent>(state_->exchange_stream);
  });
  return Request(std::move(done));
}

}  // namespace longattn::parallel
