// The staged transport: MPI on host copies of an instance's memory, for where neither NCCL nor
// a GPU-aware MPI can serve (ranks sharing a GPU, AMD GPUs, clusters without NCCL). The copies
// run on the instance (after the kernels already started there) into host buffers from the
// default pool, pinned where the space has pinned host memory (detail::Staging).
//
// An all-reduce moves in pieces of staging_chunk_bytes through two host buffers, so that while
// piece i is reduced over MPI, piece i+1 comes to the host and piece i-1 goes back:
//
//   to_host(0)  | MPI(0) + to_host(1) | MPI(1) + to_memory(0) + to_host(2) | ... | to_memory(last)
//
// The other calls stage their whole buffers: their messages are one MPI call each.
#include <algorithm>
#include <optional>

#include "communicator_state.hpp"

namespace longattn::parallel::detail {
namespace {

// Copies back to the instance's memory once an MPI operation on host buffers completes.
class StagedOperation final : public PendingOperation {
 public:
  struct CopyBack {
    void* memory;
    const void* host;
    std::size_t bytes;
  };
  StagedOperation(Request host, std::shared_ptr<const Staging> staging, std::vector<std::shared_ptr<void>> buffers,
                  std::vector<CopyBack> copies)
      : host_(std::move(host)), staging_(std::move(staging)), buffers_(std::move(buffers)), copies_(std::move(copies)) {}
  ~StagedOperation() override {
    try {
      wait();
    } catch (const std::exception&) {
      // The Request that owned this operation reported the failure when it waited.
    }
  }
  bool test() override {
    if (!done_ && host_.test()) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    host_.wait();
    finish();
  }

 private:
  void finish() {
    for (const CopyBack& c : copies_) staging_->to_memory(c.memory, c.host, c.bytes);
    staging_->fence();
    done_ = true;
  }
  Request host_;
  std::shared_ptr<const Staging> staging_;
  std::vector<std::shared_ptr<void>> buffers_;  // the host buffers, kept until the copies are done
  std::vector<CopyBack> copies_;
  bool done_ = false;
};

// A host buffer and its owner.
struct HostBuffer {
  std::shared_ptr<void> owner;
  void* data = nullptr;
  HostBuffer(const Staging& staging, std::size_t bytes) { owner = staging.host_buffer(bytes, data); }
};

const char* at(const void* base, std::size_t bytes) { return static_cast<const char*>(base) + bytes; }
char* at(void* base, std::size_t bytes) { return static_cast<char*>(base) + bytes; }

class StagedTransport final : public MemoryTransport {
 public:
  explicit StagedTransport(std::size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}

  void all_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                  std::size_t count, DataType type, ReduceOp op, bool hierarchical) override {
    const Staging& staging = *access.staging;
    const std::size_t element = size_of(type);
    const std::size_t piece = std::max<std::size_t>(1, chunk_bytes_ / element);  // elements
    const std::size_t pieces = (count + piece - 1) / piece;
    const auto length = [&](std::size_t i) { return std::min(piece, count - i * piece) * element; };  // bytes
    if (pieces == 0) {
      staging.fence();
      hierarchical ? comm.hierarchical_all_reduce(send, recv, 0, type, op) : comm.all_reduce(send, recv, 0, type, op);
      return;
    }
    const HostBuffer first(staging, length(0));
    const std::optional<HostBuffer> second = pieces > 1 ? std::optional<HostBuffer>(std::in_place, staging, length(0))
                                                        : std::nullopt;
    void* host[2] = {first.data, second ? second->data : nullptr};
    staging.to_host(host[0], send, length(0));
    staging.fence();
    for (std::size_t i = 0; i < pieces; ++i) {
      void* h = host[i % 2];
      const std::size_t n = length(i) / element;
      Request reduced = comm.iall_reduce(h, h, n, type, op, hierarchical);
      // Stream-ordered after piece i-1's copy back, which read the buffer piece i+1 now fills.
      if (i + 1 < pieces) staging.to_host(host[(i + 1) % 2], at(send, (i + 1) * piece * element), length(i + 1));
      reduced.wait();
      staging.fence();  // piece i+1 on the host
      staging.to_memory(at(recv, i * piece * element), h, length(i));
    }
    staging.fence();
  }

  void reduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op) override {
    const Staging& staging = *access.staging;
    const std::size_t bytes = count * size_of(type);
    const HostBuffer whole(staging, bytes * std::size_t(comm.size())), mine(staging, bytes);
    staging.to_host(whole.data, send, bytes * std::size_t(comm.size()));
    staging.fence();
    comm.reduce_scatter(whole.data, mine.data, count, type, op);
    staging.to_memory(recv, mine.data, bytes);
    staging.fence();
  }

  void all_gather(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                  std::size_t count, DataType type) override {
    const Staging& staging = *access.staging;
    const std::size_t bytes = count * size_of(type);
    const HostBuffer mine(staging, bytes), whole(staging, bytes * std::size_t(comm.size()));
    staging.to_host(mine.data, send, bytes);
    staging.fence();
    comm.all_gather(mine.data, whole.data, count, type);
    staging.to_memory(recv, whole.data, bytes * std::size_t(comm.size()));
    staging.fence();
  }

  Request iall_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op, bool hierarchical) override {
    const std::size_t bytes = count * size_of(type);
    const HostBuffer host(*access.staging, bytes);
    access.staging->to_host(host.data, send, bytes);
    access.staging->fence();
    Request reduced = comm.iall_reduce(host.data, host.data, count, type, op, hierarchical);
    return Request(std::make_unique<StagedOperation>(std::move(reduced), access.staging,
                                                     std::vector<std::shared_ptr<void>>{host.owner},
                                                     std::vector<StagedOperation::CopyBack>{{recv, host.data, bytes}}));
  }

  Request ireduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                          std::size_t count, DataType type, ReduceOp op) override {
    const std::size_t bytes = count * size_of(type);
    const HostBuffer whole(*access.staging, bytes * std::size_t(comm.size())), mine(*access.staging, bytes);
    access.staging->to_host(whole.data, send, bytes * std::size_t(comm.size()));
    access.staging->fence();
    Request reduced = comm.ireduce_scatter(whole.data, mine.data, count, type, op);
    return Request(std::make_unique<StagedOperation>(std::move(reduced), access.staging,
                                                     std::vector<std::shared_ptr<void>>{whole.owner, mine.owner},
                                                     std::vector<StagedOperation::CopyBack>{{recv, mine.data, bytes}}));
  }

  // One host buffer holds every message (each at a 64-byte boundary); the sends are copied in
  // before the messages start, the receives copied out when the last has arrived.
  Request exchange(const Communicator& comm, const MemoryAccess& access, const std::vector<Transfer>& transfers) override {
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    for (const Transfer& t : transfers) {
      offsets.push_back(total);
      total += (t.count * size_of(t.type) + 63) / 64 * 64;
    }
    const HostBuffer host(*access.staging, total);
    std::vector<Transfer> staged = transfers;
    std::vector<StagedOperation::CopyBack> copies;
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      const Transfer& t = transfers[i];
      staged[i].data = at(host.data, offsets[i]);
      const std::size_t bytes = t.count * size_of(t.type);
      if (t.direction == Transfer::Direction::send) access.staging->to_host(staged[i].data, t.data, bytes);
      else copies.push_back({t.data, staged[i].data, bytes});
    }
    access.staging->fence();
    Request messages = comm.exchange(staged);
    return Request(std::make_unique<StagedOperation>(std::move(messages), access.staging,
                                                     std::vector<std::shared_ptr<void>>{host.owner}, std::move(copies)));
  }

 private:
  std::size_t chunk_bytes_;
};

}  // namespace

std::unique_ptr<MemoryTransport> make_staged_transport(std::size_t chunk_bytes) {
  return std::make_unique<StagedTransport>(chunk_bytes);
}

}  // namespace longattn::parallel::detail
