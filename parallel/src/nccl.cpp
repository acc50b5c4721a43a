// The NCCL transport for CUDA memory (builds with LONGATTN_ENABLE_NCCL): the collectives
// stream-ordered on the caller's stream, exchanges on a stream of their own. NCCL communicators
// mirror the MPI ones (group, node, across nodes), each set up from a unique id that rank 0 of it
// broadcasts over MPI.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

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
namespace {

// Completion of the work a stream holds when the operation is made (an event recorded there).
// With a timeout, a wait past it aborts the NCCL communicators given (ncclCommAbort: their
// kernels stop) and ends the job.
class StreamEvent final : public PendingOperation {
 public:
  explicit StreamEvent(cudaStream_t stream, const Watch& watch = {}, std::vector<ncclComm_t> abort_on_timeout = {})
      : watch_(watch), abort_on_timeout_(std::move(abort_on_timeout)) {
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
  void wait() override {
    if (watch_.seconds <= 0) return check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(watch_.seconds);
    while (!test()) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (ncclComm_t c : abort_on_timeout_) ncclCommAbort(c);
        timed_out(watch_);
      }
      std::this_thread::yield();
    }
  }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  Watch watch_;
  std::vector<ncclComm_t> abort_on_timeout_;
};

cudaStream_t stream_of(const MemoryAccess& access) { return static_cast<cudaStream_t>(access.stream); }

class NcclTransport final : public MemoryTransport {
 public:
  explicit NcclTransport(const CommunicatorState& state)
      : nccl_(make_comm(state.comm)), local_(make_comm(state.local)), cross_(make_comm(state.cross)) {}
  ~NcclTransport() override {
    for (ncclComm_t c : {cross_, local_, nccl_})
      if (c) ncclCommDestroy(c);
    if (scratch_) cudaFree(scratch_);
    if (exchange_stream_) cudaStreamDestroy(exchange_stream_);
  }
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  void all_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                  std::size_t count, DataType type, ReduceOp op, bool hierarchical) override {
    if (hierarchical && comm.nodes() > 1 && comm.local_size() > 1 && comm.uniform_nodes())
      return hierarchical_all_reduce(comm, stream_of(access), send, recv, count, type, op);
    check_nccl(ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), nccl_, stream_of(access)), "ncclAllReduce");
  }

  void reduce_scatter(const Communicator&, const MemoryAccess& access, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op) override {
    check_nccl(ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), nccl_, stream_of(access)),
               "ncclReduceScatter");
  }

  void all_gather(const Communicator&, const MemoryAccess& access, const void* send, void* recv, std::size_t count,
                  DataType type) override {
    check_nccl(ncclAllGather(send, recv, count, nccl_type(type), nccl_, stream_of(access)), "ncclAllGather");
  }

  Request iall_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op, bool hierarchical) override {
    all_reduce(comm, access, send, recv, count, type, op, hierarchical);
    return Request(std::make_unique<StreamEvent>(stream_of(access), watch(comm, "iall_reduce"), communicators()));
  }

  Request ireduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                          std::size_t count, DataType type, ReduceOp op) override {
    reduce_scatter(comm, access, send, recv, count, type, op);
    return Request(std::make_unique<StreamEvent>(stream_of(access), watch(comm, "ireduce_scatter"), communicators()));
  }

  // The exchange stream waits for what the caller's stream holds (the kernels that wrote the
  // sends), runs the group, and the Request waits for the exchange stream.
  Request exchange(const Communicator& comm, const MemoryAccess& access, const std::vector<Transfer>& transfers) override {
    if (!exchange_stream_)
      check_cuda(cudaStreamCreateWithFlags(&exchange_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    const StreamEvent written(stream_of(access));
    check_cuda(cudaStreamWaitEvent(exchange_stream_, written.event(), 0), "cudaStreamWaitEvent");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Transfer& t : transfers) {
      if (t.direction == Transfer::Direction::send)
        check_nccl(ncclSend(t.data, t.count, nccl_type(t.type), t.peer, nccl_, exchange_stream_), "ncclSend");
      else
        check_nccl(ncclRecv(t.data, t.count, nccl_type(t.type), t.peer, nccl_, exchange_stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    return Request(std::make_unique<StreamEvent>(exchange_stream_, watch(comm, "exchange"), communicators()));
  }

 private:
  static Watch watch(const Communicator& comm, const char* what) {
    return {comm.options().timeout_seconds, comm.rank(), comm.size(), what};
  }
  std::vector<ncclComm_t> communicators() const { return {nccl_, local_, cross_}; }

  // As on the host: reduce-scatter in the node, all-reduce across nodes, all-gather in the node.
  // NCCL's reduce-scatter wants equal blocks, so a count that the node's ranks do not divide goes
  // through a padded copy in the scratch buffer. An average averages at each stage: in the node
  // over local_size, across nodes over nodes(), together over size().
  void hierarchical_all_reduce(const Communicator& comm, cudaStream_t stream, const void* send, void* recv,
                               std::size_t count, DataType type, ReduceOp op) {
    const std::size_t L = std::size_t(comm.local_size()), block = (count + L - 1) / L, bytes = size_of(type);
    const bool padded = block * L != count;
    const std::size_t needed = (padded ? block * L : 0) * bytes + block * bytes;
    if (scratch_bytes_ < needed) {
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the old scratch may be in use
      if (scratch_) check_cuda(cudaFree(scratch_), "cudaFree");
      scratch_ = nullptr;
      check_cuda(cudaMalloc(&scratch_, needed), "cudaMalloc");
      scratch_bytes_ = needed;
    }
    char* scratch = static_cast<char*>(scratch_);
    char* full = padded ? scratch : static_cast<char*>(recv);  // the whole vector, padded if need be
    char* mine = scratch + (padded ? block * L * bytes : 0);   // this rank's reduced block
    const void* input = send;
    if (padded) {
      check_cuda(cudaMemcpyAsync(full, send, count * bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      check_cuda(cudaMemsetAsync(full + count * bytes, 0, (block * L - count) * bytes, stream), "cudaMemsetAsync");
      input = full;
    }
    const ncclDataType_t t = nccl_type(type);
    check_nccl(ncclReduceScatter(input, mine, block, t, nccl_op(op), local_, stream), "ncclReduceScatter");
    check_nccl(ncclAllReduce(mine, mine, block, t, nccl_op(op), cross_, stream), "ncclAllReduce");
    check_nccl(ncclAllGather(mine, full, block, t, local_, stream), "ncclAllGather");
    if (padded)
      check_cuda(cudaMemcpyAsync(recv, full, count * bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  }

  ncclComm_t nccl_ = nullptr, local_ = nullptr, cross_ = nullptr;
  // The hierarchical path's device scratch: grown as needed, reused in stream order (one
  // stream per communicator, as NCCL wants its calls on a communicator in order anyway).
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  // Exchanges run here, so that transfers overlap the kernels on the caller's stream.
  cudaStream_t exchange_stream_ = nullptr;
};

}  // namespace

std::unique_ptr<MemoryTransport> make_nccl_transport(const CommunicatorState& state) {
  return std::make_unique<NcclTransport>(state);
}

// NCCL refuses two ranks of a communicator on one GPU (ncclCommInitRank: invalid usage): every
// rank brings its GPU's PCI bus id, and every rank sees whether two are the same.
bool every_rank_has_own_gpu(const CommunicatorState& state) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  constexpr int id_length = 32;
  std::array<char, id_length> mine{};
  check_cuda(cudaDeviceGetPCIBusId(mine.data(), id_length, device), "cudaDeviceGetPCIBusId");
  std::vector<char> all(std::size_t(id_length) * std::size_t(state.size));
  check_mpi(MPI_Allgather(mine.data(), id_length, MPI_CHAR, all.data(), id_length, MPI_CHAR, state.comm), "MPI_Allgather");
  std::vector<std::string> ids;
  for (int r = 0; r < state.size; ++r) ids.emplace_back(all.data() + std::size_t(r) * id_length);
  std::sort(ids.begin(), ids.end());
  return std::adjacent_find(ids.begin(), ids.end()) == ids.end();
}

}  // namespace detail
}  // namespace longattn::parallel
