#pragma once
// longattn::parallel::Communicator: the collectives a data- and context-parallel training run
// needs, aware of which ranks share a node.
//
//   auto world = parallel::Communicator::world();          // MPI_COMM_WORLD, nodes found by MPI
//   world.all_reduce(exec, gradients, ReduceOp::average);   // any contiguous View
//   world.hierarchical_all_reduce(exec, gradients, ReduceOp::average);
//   auto grid = parallel::make_grid(world, /*context_parallel=*/4);  // data x context groups
//
// A Communicator is a handle: copies share its MPI (and NCCL) communicators, freed with the last.
//
// Memory decides the transport: Views in host memory go through MPI (after exec.fence()); Views
// in CUDA memory through NCCL on exec's stream (stream-ordered: the call returns at once), in
// builds with LONGATTN_ENABLE_NCCL. Raw host pointers take the MPI path directly.
//
// Nodes: ranks that share memory (MPI_Comm_split_type), or simulated with
// CommunicatorOptions::ranks_per_node or the environment variable LONGATTN_RANKS_PER_NODE
// (4 ranks as 2 nodes x 2 on one machine), which is how the hierarchical path is tested.
//
// Errors: a collective blocks every rank until all have joined, so an error on one rank would
// leave the others waiting forever. By default (ErrorPolicy::abort) a rank whose collective
// fails - a bad argument, an MPI error - prints the message and ends the whole job with
// MPI_Abort. ErrorPolicy::throw_error throws longattn::Error instead, for callers that make
// the same call on every rank (then every rank throws). Arguments that must agree between
// ranks (counts, operations, types) are compared across ranks when
// CommunicatorOptions::verify_collectives is set (one small extra all-reduce per call).
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "longattn/config.hpp"
#include "longattn/error.hpp"

#if LONGATTN_HAVE_NCCL
#include <nccl.h>
#endif

namespace longattn::parallel {

enum class ReduceOp { sum, average, max, min };
enum class DataType { float32, float64, int32, int64, uint8 };
enum class ErrorPolicy { abort, throw_error };

std::string to_string(ReduceOp op);
std::string to_string(DataType type);
std::size_t size_of(DataType type);

template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DataType::float32;
  else if constexpr (std::is_same_v<U, double>) return DataType::float64;
  else if constexpr (std::is_same_v<U, std::int32_t>) return DataType::int32;
  else if constexpr (std::is_same_v<U, std::int64_t>) return DataType::int64;
  else {
    static_assert(std::is_same_v<U, std::uint8_t>, "longattn::parallel: float, double, int32, int64 or uint8 elements");
    return DataType::uint8;
  }
}

struct CommunicatorOptions {
  int ranks_per_node = 0;  // > 0: simulate nodes of this many consecutive ranks; 0: the real ones
                           // (or LONGATTN_RANKS_PER_NODE when set)
  ErrorPolicy on_error = ErrorPolicy::abort;
  bool verify_collectives = false;  // compare counts, operations and types across ranks
};

namespace detail {
struct CommunicatorState;  // MPI communicators of the group, its node and across nodes (src/)

// What a Request tracks: one MPI request, or several stages run one after the other (a
// hierarchical all-reduce), with the average's scaling once the last is done.
class PendingOperation {
 public:
  virtual ~PendingOperation() = default;
  virtual bool test() = 0;  // progresses; true once complete
  virtual void wait() = 0;
};
}  // namespace detail

// A nonblocking operation in flight. wait() completes it; the destructor waits too, so that the
// buffers it uses stay valid until it is done. Move-only.
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<detail::PendingOperation> operation) : operation_(std::move(operation)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  void wait();
  bool test();  // true once complete (and progresses MPI meanwhile)
  bool active() const { return operation_ != nullptr; }

 private:
  std::unique_ptr<detail::PendingOperation> operation_;
};

class Communicator {
 public:
  // The job (a duplicate of MPI_COMM_WORLD). MPI must be initialized (MpiSession).
  static Communicator world(const CommunicatorOptions& options = {});
  // Any MPI communicator (duplicated; the caller keeps ownership of `comm`).
  static Communicator from_mpi(MPI_Comm comm, const CommunicatorOptions& options = {});

  int rank() const;
  int size() const;
  int node() const;        // 0 .. nodes()-1, numbered by the lowest rank of each node
  int nodes() const;
  int local_rank() const;  // rank among the ranks of this node
  int local_size() const;
  // The same number of ranks on every node (what the hierarchical path needs).
  bool uniform_nodes() const;
  const CommunicatorOptions& options() const;
  MPI_Comm mpi() const;    // the group's communicator, for calls of your own

  // Ranks with the same color form a new communicator, ordered by key (then by rank). Node
  // membership carries over. Collective over this communicator.
  Communicator split(int color, int key) const;

  // ---- host memory (MPI): `count` elements of `type` at each pointer
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) const;
  // Reduce-scatter inside each node, all-reduce across nodes between equal local ranks,
  // all-gather inside each node. Any count (blocks differ by at most one element). Falls back
  // to all_reduce where there is no hierarchy to exploit (one node, one rank per node) or nodes
  // differ in size.
  void hierarchical_all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) const;
  // send holds size() blocks of `count`; rank r receives the reduction of block r.
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) const;
  // send holds `count`; recv receives size() blocks of `count`, rank order.
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) const;
  void broadcast(void* data, std::size_t count, DataType type, int root) const;
  void barrier() const;

  Request isend(const void* data, std::size_t count, DataType type, int destination, int tag) const;
  Request irecv(void* data, std::size_t count, DataType type, int source, int tag) const;
  // Nonblocking all-reduce on host memory, flat or hierarchical (as the blocking calls).
  Request iall_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                      bool hierarchical = false) const;

  // ---- Views (contiguous, in place): host memory through MPI after exec.fence(); CUDA memory
  // through NCCL on exec's stream.
  template <class ExecSpace, class View>
  void all_reduce(const ExecSpace& exec, const View& data, ReduceOp op) const {
    dispatch(exec, data, op, false);
  }
  template <class ExecSpace, class View>
  void hierarchical_all_reduce(const ExecSpace& exec, const View& data, ReduceOp op) const {
    dispatch(exec, data, op, true);
  }

  // Runs f, applying the error policy to what it throws: abort prints the message and ends the
  // job; throw_error rethrows. Every collective of this class runs through it.
  template <class F>
  void guarded(const char* where, F&& f) const {
    try {
      f();
    } catch (const std::exception& e) {
      fail(where, e.what());
    }
  }

  // Runs f on every rank, then agrees (collective, one small all-reduce): if f threw on any
  // rank, every rank fails by the error policy with the message of the lowest rank that threw
  // ("rank R: ..." on the others). For checks whose outcome may differ between ranks (local
  // extents) ahead of point-to-point exchanges, so that no rank is left waiting.
  template <class F>
  void checked(const char* where, F&& f) const {
    std::string error;
    try {
      f();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "an exception without a message";
    }
    agree(where, error);
  }

  // Values that must be equal on every rank (the arguments of a collective plan): otherwise every
  // rank fails by the error policy, naming the first value that differs and its range.
  struct Agreed {
    const char* name;
    std::int64_t value;
  };
  void require_same(const char* where, const std::vector<Agreed>& values) const;

#if LONGATTN_HAVE_NCCL
  // ---- CUDA memory (NCCL), stream-ordered on `stream`; the NCCL communicators are made on first
  // use (the unique id goes out over MPI: collective over this communicator).
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, cudaStream_t stream) const;
  void hierarchical_all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                               cudaStream_t stream) const;
  void send_recv(const void* send, std::size_t send_count, int destination, void* recv, std::size_t recv_count,
                 int source, DataType type, cudaStream_t stream) const;
#endif

 private:
  explicit Communicator(std::shared_ptr<detail::CommunicatorState> state) : state_(std::move(state)) {}
  [[noreturn]] void fail(const char* where, const std::string& message) const;
  void agree(const char* where, const std::string& error) const;
  void verify(const char* where, std::size_t count, DataType type, int op) const;

  template <class ExecSpace, class View>
  void dispatch(const ExecSpace& exec, const View& data, ReduceOp op, bool hierarchical) const {
    using Value = typename View::non_const_value_type;
    static_assert(Kokkos::is_view<View>::value, "a Kokkos::View");
    const char* where = hierarchical ? "longattn::parallel::Communicator::hierarchical_all_reduce"
                                     : "longattn::parallel::Communicator::all_reduce";
    guarded(where, [&] {
      require(data.span_is_contiguous(), where, "data", data.label(), "a contiguous View");
    });
    using Memory = typename View::memory_space;
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible) {
      exec.fence();
      if (hierarchical) hierarchical_all_reduce(data.data(), data.data(), data.size(), data_type_of<Value>(), op);
      else all_reduce(data.data(), data.data(), data.size(), data_type_of<Value>(), op);
    } else {
#if LONGATTN_HAVE_NCCL
      if (hierarchical)
        hierarchical_all_reduce(data.data(), data.data(), data.size(), data_type_of<Value>(), op, exec.cuda_stream());
      else
        all_reduce(data.data(), data.data(), data.size(), data_type_of<Value>(), op, exec.cuda_stream());
#else
      static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible,
                    "device memory needs the NCCL backend (LONGATTN_ENABLE_NCCL=ON)");
#endif
    }
  }

  std::shared_ptr<detail::CommunicatorState> state_;
};

// A data-parallel x context-parallel grid over `world`: ranks d * context_parallel + c for
// c = 0 .. context_parallel-1 form context group d (consecutive ranks: a sequence's shards stay
// on one node where they can); ranks with the same c form data group c.
struct Grid {
  Communicator context;  // the ring attention group of this rank
  Communicator data;     // the gradient all-reduce group of this rank
  int context_parallel = 1, data_parallel = 1;
};
Grid make_grid(const Communicator& world, int context_parallel);

}  // namespace longattn::parallel
