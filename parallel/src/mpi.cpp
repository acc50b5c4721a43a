// The MPI transport: the collectives on host memory (and on device memory where MPI is
// GPU-aware), the hierarchical all-reduce (blocking, and staged for nonblocking use), the MPI
// types and operations of bfloat16 and float16.
#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "communicator_state.hpp"
#include "longattn/memory/pooled_view.hpp"

#if LONGATTN_HAVE_CUDA && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_Query_cuda_support
#endif

namespace longattn::parallel {
namespace detail {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  MPI_Error_string(code, text.data(), &length);
  throw Error(std::string("longattn::parallel: ") + call + " failed: " + text.data());
}

void timed_out(const Watch& watch) {
  std::fprintf(stderr,
               "longattn::parallel: rank %d of %d: %s did not finish within %g s (the collective timeout): a rank of "
               "its communicator died or hangs\n"
               "longattn::parallel: aborting the job (MPI_Abort) so that its restart can take over\n",
               watch.rank, watch.size, watch.what, watch.seconds);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

void wait_for(MPI_Request& request, const Watch& watch) {
  if (watch.seconds <= 0) return check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(watch.seconds);
  for (int finished = 0;;) {
    check_mpi(MPI_Test(&request, &finished, MPI_STATUS_IGNORE), "MPI_Test");
    if (finished) return;
    if (std::chrono::steady_clock::now() > deadline) timed_out(watch);
  }
}

// MPI has no 16-bit floating types: bfloat16 and float16 travel as MPI types of our own (two
// bytes), and their sums, maxima and minima are MPI operations of our own that compute in float
// and round each result (as NCCL's reductions of these types round at each step). Made on first
// use; freed as MPI_Finalize begins (an attribute of MPI_COMM_SELF).
struct HalfTypes {
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL, float16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
};
HalfTypes half_types_made;

template <class T, class Combine>
void combine_elements(const void* in, void* inout, int count, Combine combine) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < count; ++i) b[i] = T(combine(float(a[i]), float(b[i])));
}
template <class Combine>
void combine_half(const void* in, void* inout, const int* count, const MPI_Datatype* type, Combine combine) {
  if (*type == half_types_made.bfloat16) combine_elements<bfloat16>(in, inout, *count, combine);
  else combine_elements<float16>(in, inout, *count, combine);
}
void half_sum(void* in, void* inout, int* count, MPI_Datatype* type) {
  combine_half(in, inout, count, type, [](float a, float b) { return a + b; });
}
void half_max(void* in, void* inout, int* count, MPI_Datatype* type) {
  combine_half(in, inout, count, type, [](float a, float b) { return a < b ? b : a; });
}
void half_min(void* in, void* inout, int* count, MPI_Datatype* type) {
  combine_half(in, inout, count, type, [](float a, float b) { return b < a ? b : a; });
}
int free_half_types(MPI_Comm, int, void*, void*) {
  HalfTypes& h = half_types_made;
  for (MPI_Op* op : {&h.sum, &h.max, &h.min}) MPI_Op_free(op);
  for (MPI_Datatype* t : {&h.bfloat16, &h.float16}) MPI_Type_free(t);
  h = HalfTypes();
  return MPI_SUCCESS;
}
const HalfTypes& half_types() {
  static const bool made = [] {
    HalfTypes& h = half_types_made;
    for (MPI_Datatype* t : {&h.bfloat16, &h.float16}) {
      check_mpi(MPI_Type_contiguous(1, MPI_UINT16_T, t), "MPI_Type_contiguous");
      check_mpi(MPI_Type_commit(t), "MPI_Type_commit");
    }
    check_mpi(MPI_Op_create(half_sum, 1, &h.sum), "MPI_Op_create");
    check_mpi(MPI_Op_create(half_max, 1, &h.max), "MPI_Op_create");
    check_mpi(MPI_Op_create(half_min, 1, &h.min), "MPI_Op_create");
    int key = MPI_KEYVAL_INVALID;
    check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_half_types, &key, nullptr), "MPI_Comm_create_keyval");
    check_mpi(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr), "MPI_Comm_set_attr");
    return true;
  }();
  (void)made;
  return half_types_made;
}

bool is_half(DataType type) { return type == DataType::bfloat16 || type == DataType::float16; }

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
    case DataType::int32: return MPI_INT32_T;
    case DataType::int64: return MPI_INT64_T;
    case DataType::uint8: return MPI_UINT8_T;
    case DataType::bfloat16: return half_types().bfloat16;
    case DataType::float16: return half_types().float16;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, DataType type) {
  if (is_half(type)) {
    const HalfTypes& h = half_types();
    return op == ReduceOp::max ? h.max : op == ReduceOp::min ? h.min : h.sum;
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average: return MPI_SUM;  // then scaled by 1 / size
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// Messages are built only on failure: this runs on every call.
void check_buffers(const char* where, const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op) {
  if (count > 0 && !send) throw_invalid_argument(where, "send", "nullptr", "a buffer of " + std::to_string(count) + " elements");
  if (count > 0 && !recv) throw_invalid_argument(where, "recv", "nullptr", "a buffer of " + std::to_string(count) + " elements");
  if (op == ReduceOp::average && type != DataType::float32 && type != DataType::float64 && !is_half(type))
    throw_invalid_argument(where, "op", "average of " + to_string(type),
                           "sum, max or min for integers (average is for floating-point types)");
}

// The average's last step: the sum divided by the group's size.
template <class T>
void scale_elements(void* data, std::size_t count, accumulate_t<T> factor) {
  auto* v = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) v[i] = T(accumulate_t<T>(v[i]) * factor);
}
void scale(void* data, std::size_t count, DataType type, int ranks) {
  switch (type) {
    case DataType::float32: return scale_elements<float>(data, count, 1.0f / float(ranks));
    case DataType::float64: return scale_elements<double>(data, count, 1.0 / double(ranks));
    case DataType::bfloat16: return scale_elements<bfloat16>(data, count, 1.0f / float(ranks));
    case DataType::float16: return scale_elements<float16>(data, count, 1.0f / float(ranks));
    default: return;  // integers are never averaged (check_buffers)
  }
}

// Blocks of `count` elements over `parts` ranks: sizes differ by at most one; counts are ints
// (MPI's), so callers cut messages into pieces of at most max_piece elements first.
struct Blocks {
  std::vector<int> counts, displacements;
  Blocks(std::size_t count, int parts) : counts(std::size_t(parts)), displacements(std::size_t(parts)) {
    int offset = 0;
    for (int i = 0; i < parts; ++i) {
      counts[std::size_t(i)] = int(count / std::size_t(parts) + (std::size_t(i) < count % std::size_t(parts)));
      displacements[std::size_t(i)] = offset;
      offset += counts[std::size_t(i)];
    }
  }
};
constexpr std::size_t max_piece = std::size_t(1) << 30;

// A host block for a hierarchical collective's node-local part (a communication buffer).
memory::PooledView<Kokkos::View<unsigned char*, Kokkos::HostSpace>> scratch_block(std::size_t bytes) {
  const memory::CategoryScope scope(memory::Category::communication_buffers);
  return memory::PooledView<Kokkos::View<unsigned char*, Kokkos::HostSpace>>(memory::default_pool<Kokkos::HostSpace>(),
                                                                             std::max<std::size_t>(1, bytes));
}

// A staged hierarchical all-reduce of one piece: reduce-scatter inside the node into a block of
// scratch (started at once), all-reduce of that block across nodes, all-gather inside the node;
// then the scaling of an average. Only the oldest unfinished operation of a communicator moves
// past its first stage (CommunicatorState::staged).
class HierarchicalStages final : public PendingOperation {
 public:
  HierarchicalStages(std::shared_ptr<CommunicatorState> state, const void* send, void* recv, std::size_t count,
                     DataType type, ReduceOp op)
      : state_(std::move(state)), send_(send), recv_(recv), count_(count), type_(type), op_(op),
        blocks_(count, state_->local_size),
        scratch_(scratch_block(std::size_t(blocks_.counts[0]) * size_of(type))) {
    start_stage();
    state_->staged.push_back(this);
  }
  ~HierarchicalStages() override {
    if (stage_ < done) wait();
  }

  bool test() override { return progress(false); }
  void wait() override { progress(true); }

 private:
  enum Stage { reduce_scatter_in_node, all_reduce_across_nodes, all_gather_in_node, done };

  // Moves the operations ahead of this one, then this one, as far as they go (blocking: to the end).
  bool progress(bool blocking) {
    while (stage_ < done) {
      HierarchicalStages* oldest = state_->staged.front();
      if (!oldest->advance(blocking)) return false;
      state_->staged.pop_front();
    }
    return true;
  }

  // This operation's stages, each started when the one before is done; true once all are.
  bool advance(bool blocking) {
    while (stage_ < done) {
      int finished = 1;
      if (blocking) wait_for(request_, state_->watch("the nonblocking hierarchical all-reduce"));
      else check_mpi(MPI_Test(&request_, &finished, MPI_STATUS_IGNORE), "MPI_Test");
      if (!finished) return false;
      ++stage_;
      start_stage();
    }
    return true;
  }

  void start_stage() {
    const MPI_Datatype t = mpi_type(type_);
    void* block = scratch_.data();
    const int mine = blocks_.counts[std::size_t(state_->local_rank)];
    switch (stage_) {
      case reduce_scatter_in_node:
        check_mpi(MPI_Ireduce_scatter(send_, block, blocks_.counts.data(), t, mpi_op(op_, type_), state_->staged_scatter,
                                      &request_),
                  "MPI_Ireduce_scatter");
        break;
      case all_reduce_across_nodes:
        check_mpi(MPI_Iallreduce(MPI_IN_PLACE, block, mine, t, mpi_op(op_, type_), state_->staged_cross, &request_),
                  "MPI_Iallreduce");
        break;
      case all_gather_in_node:
        check_mpi(MPI_Iallgatherv(block, mine, t, recv_, blocks_.counts.data(), blocks_.displacements.data(), t,
                                  state_->staged_gather, &request_),
                  "MPI_Iallgatherv");
        break;
      case done:
        if (op_ == ReduceOp::average) scale(recv_, count_, type_, state_->size);
        break;
    }
  }

  std::shared_ptr<CommunicatorState> state_;
  const void* send_;
  void* recv_;
  std::size_t count_;
  DataType type_;
  ReduceOp op_;
  Blocks blocks_;
  memory::PooledView<Kokkos::View<unsigned char*, Kokkos::HostSpace>> scratch_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  int stage_ = reduce_scatter_in_node;
};

// One MPI request (point-to-point, a flat nonblocking all-reduce), with the average's scaling.
class SingleRequest final : public PendingOperation {
 public:
  SingleRequest(MPI_Request request, const Watch& watch, void* scale_data = nullptr, std::size_t count = 0,
                DataType type = DataType::float32, int ranks = 1)
      : request_(request), watch_(watch), scale_data_(scale_data), count_(count), type_(type), ranks_(ranks) {}
  ~SingleRequest() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int finished = 0;
    check_mpi(MPI_Test(&request_, &finished, MPI_STATUS_IGNORE), "MPI_Test");
    if (finished) complete();
    return finished != 0;
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    wait_for(request_, watch_);
    complete();
  }

 private:
  void complete() {
    if (scale_data_) scale(scale_data_, count_, type_, ranks_);
    scale_data_ = nullptr;
  }
  MPI_Request request_;
  Watch watch_;
  void* scale_data_;
  std::size_t count_;
  DataType type_;
  int ranks_;
};

// An operation that the communicator also keeps (the last exchange, which the next one may wait
// for); waiting twice is harmless.
class SharedOperation final : public PendingOperation {
 public:
  explicit SharedOperation(std::shared_ptr<PendingOperation> operation) : operation_(std::move(operation)) {}
  bool test() override { return operation_->test(); }
  void wait() override { operation_->wait(); }

 private:
  std::shared_ptr<PendingOperation> operation_;
};

// Several operations as one (a message cut into pieces, the messages of an exchange).
class OperationGroup final : public PendingOperation {
 public:
  explicit OperationGroup(std::vector<std::unique_ptr<PendingOperation>> parts) : parts_(std::move(parts)) {}
  bool test() override {
    bool all = true;
    for (auto& p : parts_) all = p->test() && all;
    return all;
  }
  void wait() override {
    for (auto& p : parts_) p->wait();
  }

 private:
  std::vector<std::unique_ptr<PendingOperation>> parts_;
};

}  // namespace detail

using detail::check_buffers;
using detail::check_mpi;
using detail::mpi_op;
using detail::mpi_type;

// ------------------------------------------------------------------------------ collectives
void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) const {
  const char* where = "longattn::parallel::Communicator::all_reduce";
  guarded(where, [&] {
    check_buffers(where, send, recv, count, type, op);
    on_issue(where, count, type, int(op));
    const std::size_t bytes = size_of(type);
    for (std::size_t first = 0; first < count; first += detail::max_piece) {
      const int n = int(std::min(detail::max_piece, count - first));
      auto* out = static_cast<char*>(recv) + first * bytes;
      const void* in = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + first * bytes;
      detail::run("MPI_Iallreduce", state_->watch(where), [&](MPI_Request* r) {
        return MPI_Iallreduce(in, out, n, mpi_type(type), mpi_op(op, type), state_->comm, r);
      });
    }
    if (op == ReduceOp::average) detail::scale(recv, count, type, state_->size);
  });
}

void Communicator::hierarchical_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                           ReduceOp op) const {
  const char* where = "longattn::parallel::Communicator::hierarchical_all_reduce";
  if (state_->nodes == 1 || state_->local_size == 1 || !state_->uniform) return all_reduce(send, recv, count, type, op);
  guarded(where, [&] {
    check_buffers(where, send, recv, count, type, op);
    on_issue(where, count, type, int(op));
    const detail::Watch watch = state_->watch(where);
    const std::size_t bytes = size_of(type);
    const MPI_Datatype t = mpi_type(type);
    const std::size_t piece_elements = detail::max_piece * std::size_t(state_->local_size);
    for (std::size_t first = 0; first < count; first += piece_elements) {
      const std::size_t n = std::min(piece_elements, count - first);
      const detail::Blocks blocks(n, state_->local_size);
      const int mine = blocks.counts[std::size_t(state_->local_rank)];
      const auto block = detail::scratch_block(std::size_t(blocks.counts[0]) * bytes);
      const void* in = static_cast<const char*>(send) + first * bytes;
      void* out = static_cast<char*>(recv) + first * bytes;
      detail::run("MPI_Ireduce_scatter", watch, [&](MPI_Request* r) {
        return MPI_Ireduce_scatter(in, block.data(), blocks.counts.data(), t, mpi_op(op, type), state_->local, r);
      });
      detail::run("MPI_Iallreduce", watch, [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, block.data(), mine, t, mpi_op(op, type), state_->cross, r);
      });
      detail::run("MPI_Iallgatherv", watch, [&](MPI_Request* r) {
        return MPI_Iallgatherv(block.data(), mine, t, out, blocks.counts.data(), blocks.displacements.data(), t,
                               state_->local, r);
      });
    }
    if (op == ReduceOp::average) detail::scale(recv, count, type, state_->size);
  });
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) const {
  const char* where = "longattn::parallel::Communicator::reduce_scatter";
  guarded(where, [&] {
    check_buffers(where, send, recv, count, type, op);
    require(send != recv || count == 0, where, "recv", "the send buffer", "a buffer of its own");
    require(count <= std::size_t(INT_MAX), where, "count", count, "at most 2^31 - 1 elements per rank");
    on_issue(where, count, type, int(op));
    detail::run("MPI_Ireduce_scatter_block", state_->watch(where), [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(send, recv, int(count), mpi_type(type), mpi_op(op, type), state_->comm, r);
    });
    if (op == ReduceOp::average) detail::scale(recv, count, type, state_->size);
  });
}

void Communicator::all_gather(const void* send, void* recv, std::size_t count, DataType type) const {
  const char* where = "longattn::parallel::Communicator::all_gather";
  guarded(where, [&] {
    check_buffers(where, send, recv, count, type, ReduceOp::sum);
    require(send != recv || count == 0, where, "recv", "the send buffer", "a buffer of its own");
    require(count <= std::size_t(INT_MAX), where, "count", count, "at most 2^31 - 1 elements per rank");
    on_issue(where, count, type, -1);
    detail::run("MPI_Iallgather", state_->watch(where), [&](MPI_Request* r) {
      return MPI_Iallgather(send, int(count), mpi_type(type), recv, int(count), mpi_type(type), state_->comm, r);
    });
  });
}

void Communicator::broadcast(void* data, std::size_t count, DataType type, int root) const {
  const char* where = "longattn::parallel::Communicator::broadcast";
  guarded(where, [&] {
    require(count == 0 || data != nullptr, where, "data", "nullptr", "a buffer of " + std::to_string(count) + " elements");
    require(root >= 0 && root < state_->size, where, "root", root, "a rank from 0 to " + std::to_string(state_->size - 1));
    require(count <= std::size_t(INT_MAX), where, "count", count, "at most 2^31 - 1 elements");
    on_issue(where, count, type, root);
    detail::run("MPI_Ibcast", state_->watch(where), [&](MPI_Request* r) {
      return MPI_Ibcast(data, int(count), mpi_type(type), root, state_->comm, r);
    });
  });
}

void Communicator::barrier() const {
  const char* where = "longattn::parallel::Communicator::barrier";
  guarded(where, [&] {
    on_issue(where, 0, DataType::uint8, -1);
    detail::run("MPI_Ibarrier", state_->watch(where), [&](MPI_Request* r) { return MPI_Ibarrier(state_->comm, r); });
  });
}

namespace {

// Point-to-point arguments (every ring step: messages are built only on failure).
void check_message(const char* where, const void* data, std::size_t count, const char* name, int peer, int size, int tag) {
  if (count > 0 && !data) throw_invalid_argument(where, "data", "nullptr", "a buffer of " + std::to_string(count) + " elements");
  require(count <= std::size_t(INT_MAX), where, "count", count, "at most 2^31 - 1 elements");
  if (peer < 0 || peer >= size) throw_invalid_argument(where, name, peer, "a rank from 0 to " + std::to_string(size - 1));
  require(tag >= 0 && tag <= 32767, where, "tag", tag, "a tag from 0 to 32767 (the least MPI guarantees)");
}

}  // namespace

Request Communicator::isend(const void* data, std::size_t count, DataType type, int destination, int tag) const {
  const char* where = "longattn::parallel::Communicator::isend";
  MPI_Request request = MPI_REQUEST_NULL;
  guarded(where, [&] {
    check_message(where, data, count, "destination", destination, state_->size, tag);
    check_mpi(MPI_Isend(data, int(count), mpi_type(type), destination, tag, state_->comm, &request), "MPI_Isend");
  });
  return Request(std::make_unique<detail::SingleRequest>(request, state_->watch(where)));
}

Request Communicator::irecv(void* data, std::size_t count, DataType type, int source, int tag) const {
  const char* where = "longattn::parallel::Communicator::irecv";
  MPI_Request request = MPI_REQUEST_NULL;
  guarded(where, [&] {
    check_message(where, data, count, "source", source, state_->size, tag);
    check_mpi(MPI_Irecv(data, int(count), mpi_type(type), source, tag, state_->comm, &request), "MPI_Irecv");
  });
  return Request(std::make_unique<detail::SingleRequest>(request, state_->watch(where)));
}

Request Communicator::exchange(const std::vector<Transfer>& transfers) const {
  const char* where = "longattn::parallel::Communicator::exchange";
  std::vector<std::unique_ptr<detail::PendingOperation>> parts;
  guarded(where, [&] {
    on_issue(where, transfers.size(), DataType::uint8, -1, false);
    if (state_->options.serialize_exchanges && state_->last_exchange) state_->last_exchange->wait();
    for (const Transfer& t : transfers) {
      const bool sending = t.direction == Transfer::Direction::send;
      check_message(where, t.data, t.count, sending ? "destination" : "source", t.peer, state_->size,
                    detail::exchange_tag);
      MPI_Request request = MPI_REQUEST_NULL;
      if (sending)
        check_mpi(MPI_Isend(t.data, int(t.count), mpi_type(t.type), t.peer, detail::exchange_tag, state_->comm, &request),
                  "MPI_Isend");
      else
        check_mpi(MPI_Irecv(t.data, int(t.count), mpi_type(t.type), t.peer, detail::exchange_tag, state_->comm, &request),
                  "MPI_Irecv");
      parts.push_back(std::make_unique<detail::SingleRequest>(request, state_->watch(where)));
    }
  });
  auto operation = std::make_shared<detail::OperationGroup>(std::move(parts));
  state_->last_exchange = operation;
  return Request(std::make_unique<detail::SharedOperation>(std::move(operation)));
}

Request Communicator::iall_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                  bool hierarchical) const {
  const char* where = "longattn::parallel::Communicator::iall_reduce";
  std::vector<std::unique_ptr<detail::PendingOperation>> parts;
  guarded(where, [&] {
    check_buffers(where, send, recv, count, type, op);
    on_issue(where, count, type, int(op));
    const bool staged = hierarchical && state_->nodes > 1 && state_->local_size > 1 && state_->uniform;
    const std::size_t bytes = size_of(type);
    const std::size_t piece = staged ? detail::max_piece * std::size_t(state_->local_size) : detail::max_piece;
    for (std::size_t first = 0; first < count; first += piece) {
      const std::size_t n = std::min(piece, count - first);
      const auto* in = static_cast<const char*>(send) + first * bytes;
      auto* out = static_cast<char*>(recv) + first * bytes;
      if (staged) {
        parts.push_back(std::make_unique<detail::HierarchicalStages>(state_, in, out, n, type, op));
      } else {
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : in, out, int(n), mpi_type(type), mpi_op(op, type), state_->comm,
                                 &request),
                  "MPI_Iallreduce");
        parts.push_back(std::make_unique<detail::SingleRequest>(request, state_->watch(where),
                                                                op == ReduceOp::average ? out : nullptr, n, type,
                                                                state_->size));
      }
    }
  });
  if (parts.size() == 1) return Request(std::move(parts.front()));
  return Request(std::make_unique<detail::OperationGroup>(std::move(parts)));
}

Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                      ReduceOp op) const {
  const char* where = "longattn::parallel::Communicator::ireduce_scatter";
  MPI_Request request = MPI_REQUEST_NULL;
  guarded(where, [&] {
    check_buffers(where, send, recv, count, type, op);
    require(send != recv || count == 0, where, "recv", "the send buffer", "a buffer of its own");
    require(count <= std::size_t(INT_MAX), where, "count", count, "at most 2^31 - 1 elements per rank");
    on_issue(where, count, type, int(op));
    check_mpi(MPI_Ireduce_scatter_block(send, recv, int(count), mpi_type(type), mpi_op(op, type), state_->comm, &request),
              "MPI_Ireduce_scatter_block");
  });
  return Request(std::make_unique<detail::SingleRequest>(request, state_->watch(where),
                                                         op == ReduceOp::average ? recv : nullptr, count, type,
                                                         state_->size));
}

// ------------------------------------------------------------------------------ the transport
namespace detail {

bool mpi_takes_device_pointers() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

namespace {

// The buffers themselves to MPI, once the work already started on the instance is done.
class MpiTransport final : public MemoryTransport {
 public:
  void all_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                  std::size_t count, DataType type, ReduceOp op, bool hierarchical) override {
    access.staging->fence();
    hierarchical ? comm.hierarchical_all_reduce(send, recv, count, type, op) : comm.all_reduce(send, recv, count, type, op);
  }
  void reduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op) override {
    access.staging->fence();
    comm.reduce_scatter(send, recv, count, type, op);
  }
  void all_gather(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                  std::size_t count, DataType type) override {
    access.staging->fence();
    comm.all_gather(send, recv, count, type);
  }
  Request iall_reduce(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                      std::size_t count, DataType type, ReduceOp op, bool hierarchical) override {
    access.staging->fence();
    return comm.iall_reduce(send, recv, count, type, op, hierarchical);
  }
  Request ireduce_scatter(const Communicator& comm, const MemoryAccess& access, const void* send, void* recv,
                          std::size_t count, DataType type, ReduceOp op) override {
    access.staging->fence();
    return comm.ireduce_scatter(send, recv, count, type, op);
  }
  Request exchange(const Communicator& comm, const MemoryAccess& access, const std::vector<Transfer>& transfers) override {
    access.staging->fence();
    return comm.exchange(transfers);
  }
};

}  // namespace

std::unique_ptr<MemoryTransport> make_mpi_transport() { return std::make_unique<MpiTransport>(); }

}  // namespace detail

}  // namespace longattn::parallel
