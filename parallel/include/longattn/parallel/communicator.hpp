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
// The transport: calls with a raw pointer and no instance are host memory and go straight to
// MPI. The calls that take an execution space instance move data in its memory space, by the
// communicator's Transport (CommunicatorOptions::transport, or the environment variable
// LONGATTN_TRANSPORT): host memory through MPI after exec.fence(); device memory, by default
// (Transport::automatic), through NCCL on exec's stream (builds with LONGATTN_ENABLE_NCCL, every
// rank on a GPU of its own), else MPI on the device pointers where MPI says it is GPU-aware
// (MPIX_Query_cuda_support), else MPI on host copies (Transport::staged: device to pinned host
// memory on exec, MPI, back to the device; all-reduces in chunks whose copies overlap the
// messages of their neighbours). transport(exec) says which one a call on exec's memory takes.
// Transport::staged on host memory copies too: it runs the staging code where there is no GPU.
//
// Point-to-point messages between buffers of a space travel in exchanges (exchange()): the
// sends and receives a rank starts together, complete together. Through NCCL an exchange is
// one NCCL group on the communicator's own stream, and NCCL pairs messages by order, not tag,
// and runs one exchange after the other. So a schedule must be one that every rank runs alike:
// the same exchanges in the same order, each message in the same exchange as its partner, the
// messages between two ranks in the same order on both sides. Host exchanges pair messages the
// same way (one MPI tag), and CommunicatorOptions::serialize_exchanges makes each wait for the
// one before as the stream does: a schedule that passes the tests so also runs under NCCL.
//
// Issue order: NCCL runs the operations of one communicator in the order they are issued, and
// warns that communicators used concurrently can deadlock when their kernels interleave
// differently on different GPUs. longattn's rule is that every rank issues the operations on
// the communicators it shares with another rank in the same order as that rank (each rank runs
// the same program: the buckets' all-reduces start in backward's order, the ring's exchanges in
// the schedule's). CommunicatorOptions::record_issue_order and check_issue_order() check it.
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
#include "longattn/core/half.hpp"
#include "longattn/error.hpp"
#include "longattn/kokkos_compat.hpp"
#include "longattn/memory/pooled_view.hpp"

namespace longattn::parallel {

enum class ReduceOp { sum, average, max, min };
// bfloat16 and float16 (longattn/core/half.hpp) reduce through MPI operations of longattn's own
// that add in float and round each result; NCCL has them natively.
enum class DataType { float32, float64, int32, int64, uint8, bfloat16, float16 };
enum class ErrorPolicy { abort, throw_error };
// How calls on an instance's memory travel (the comment at the top).
enum class Transport {
  automatic,  // host memory: mpi; device memory: nccl where it can serve, else mpi where MPI is
              // GPU-aware, else staged
  mpi,        // MPI on the buffers themselves (device memory: only where MPI is GPU-aware)
  staged,     // MPI on host copies (on host memory too: how the staging code is tested)
  nccl,       // NCCL on exec's stream (device memory; builds with LONGATTN_ENABLE_NCCL)
};

std::string to_string(ReduceOp op);
std::string to_string(DataType type);
std::string to_string(Transport transport);  // "automatic", "mpi", "staged", "nccl"
// The inverse of to_string; longattn::Error naming `what` otherwise.
Transport parse_transport(const std::string& text, const char* what);
std::size_t size_of(DataType type);

template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DataType::float32;
  else if constexpr (std::is_same_v<U, double>) return DataType::float64;
  else if constexpr (std::is_same_v<U, std::int32_t>) return DataType::int32;
  else if constexpr (std::is_same_v<U, std::int64_t>) return DataType::int64;
  else if constexpr (std::is_same_v<U, bfloat16>) return DataType::bfloat16;
  else if constexpr (std::is_same_v<U, float16>) return DataType::float16;
  else {
    static_assert(std::is_same_v<U, std::uint8_t>,
                  "longattn::parallel: float, double, bfloat16, float16, int32, int64 or uint8 elements");
    return DataType::uint8;
  }
}

struct CommunicatorOptions {
  int ranks_per_node = 0;  // > 0: simulate nodes of this many consecutive ranks; 0: the real ones
                           // (or LONGATTN_RANKS_PER_NODE when set)
  ErrorPolicy on_error = ErrorPolicy::abort;
  bool verify_collectives = false;  // compare counts, operations and types across ranks
  // Host exchanges start only when the previous one has completed, as NCCL's on one stream do
  // (the GPU's schedule, checked on the host; slower: no two exchanges overlap).
  bool serialize_exchanges = false;
  // automatic: LONGATTN_TRANSPORT when set ("mpi", "staged", "nccl"), else chosen as above.
  Transport transport = Transport::automatic;
  // The staged transport's all-reduce moves pieces of this many bytes (0: LONGATTN_STAGING_CHUNK_BYTES
  // when set, else 4 MiB): one piece's copies overlap the next one's messages.
  std::size_t staging_chunk_bytes = 0;
  // The watchdog: a collective, exchange or request wait on MPI (host memory, the staged and mpi
  // transports) or NCCL not done after this many seconds prints which and ends the job
  // (MPI_Abort; through NCCL ncclCommAbort first), so that a rank that died or hangs leaves no
  // job hanging until its time limit. 0: LONGATTN_COLLECTIVE_TIMEOUT when set, else no limit.
  double timeout_seconds = 0;
  // Record the order in which this rank issues collectives and exchanges, for
  // check_issue_order() (or LONGATTN_RECORD_ISSUE_ORDER=1).
  bool record_issue_order = false;
};

// One message of an exchange: `count` elements of `type` at `data`, to or from rank `peer`.
struct Transfer {
  enum class Direction { send, receive };
  Direction direction;
  void* data;
  std::size_t count;
  DataType type;
  int peer;
  static Transfer send(const void* data, std::size_t count, DataType type, int destination) {
    return {Direction::send, const_cast<void*>(data), count, type, destination};
  }
  static Transfer receive(void* data, std::size_t count, DataType type, int source) {
    return {Direction::receive, data, count, type, source};
  }
};

namespace detail {
struct CommunicatorState;  // MPI communicators of the group, its node and across nodes (src/)
class MemoryTransport;     // how calls on one kind of memory travel: MPI, staged or NCCL (src/)

// What a Request tracks: one MPI request, or several stages run one after the other (a
// hierarchical all-reduce), with the average's scaling once the last is done.
class PendingOperation {
 public:
  virtual ~PendingOperation() = default;
  virtual bool test() = 0;  // progresses; true once complete
  virtual void wait() = 0;
};

// The staged transport's access to an execution space: copies between its memory and host
// memory, ordered on the instance (on a GPU: after the kernels already started there), its
// fence, and host buffers to stage in (pinned where the space has pinned host memory).
class Staging {
 public:
  virtual ~Staging() = default;
  virtual void to_host(void* host, const void* memory, std::size_t bytes) const = 0;
  virtual void to_memory(void* memory, const void* host, std::size_t bytes) const = 0;
  virtual void fence() const = 0;
  // A host buffer of `bytes` from the default pool (communication buffers), valid while the
  // returned owner lives; `data` points to it.
  virtual std::shared_ptr<void> host_buffer(std::size_t bytes, void*& data) const = 0;
};

template <class Memory>
struct HostStagingSpace {
  using type = Kokkos::HostSpace;
};
#if defined(KOKKOS_ENABLE_CUDA)
template <>
struct HostStagingSpace<Kokkos::CudaSpace> {
  using type = Kokkos::CudaHostPinnedSpace;
};
#endif
#if defined(KOKKOS_ENABLE_HIP)
template <>
struct HostStagingSpace<HIPSpace> {
  using type = HIPHostPinnedSpace;
};
#endif

template <class ExecSpace>
class SpaceStaging final : public Staging {
  using Memory = typename ExecSpace::memory_space;
  using Host = typename HostStagingSpace<Memory>::type;
  template <class T, class Space>
  using Bytes = Kokkos::View<T*, Space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

 public:
  explicit SpaceStaging(const ExecSpace& exec) : exec_(exec) {}
  void to_host(void* host, const void* memory, std::size_t bytes) const override {
    Kokkos::deep_copy(exec_, Bytes<char, Host>(static_cast<char*>(host), bytes),
                      Bytes<const char, Memory>(static_cast<const char*>(memory), bytes));
  }
  void to_memory(void* memory, const void* host, std::size_t bytes) const override {
    Kokkos::deep_copy(exec_, Bytes<char, Memory>(static_cast<char*>(memory), bytes),
                      Bytes<const char, Host>(static_cast<const char*>(host), bytes));
  }
  void fence() const override { exec_.fence(); }
  std::shared_ptr<void> host_buffer(std::size_t bytes, void*& data) const override {
    const memory::CategoryScope scope(memory::Category::communication_buffers);
    auto buffer = std::make_shared<memory::PooledView<Kokkos::View<unsigned char*, Host>>>(
        memory::default_pool<Host>(), bytes > 0 ? bytes : 1);
    data = buffer->data();
    return buffer;
  }

 private:
  ExecSpace exec_;
};

// What a call on an instance's memory brings to its transport.
struct MemoryAccess {
  bool device_memory = false;  // not accessible from the host
  std::shared_ptr<const Staging> staging;
  void* stream = nullptr;  // the instance's cudaStream_t (Kokkos::Cuda), else null
};

template <class ExecSpace>
MemoryAccess access_of(const ExecSpace& exec) {
  MemoryAccess access;
  access.device_memory = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
  access.staging = std::make_shared<SpaceStaging<ExecSpace>>(exec);
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) access.stream = exec.cuda_stream();
#endif
  return access;
}
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
  // Nonblocking reduce_scatter on host memory (send holds size() blocks of `count`).
  Request ireduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) const;

  // ---- memory of exec's space, by the transport (the comment at the top): stream-ordered on a
  // GPU through NCCL (later work on exec sees the result); otherwise done when the call returns.
  // Views (contiguous, reduced in place).
  template <class ExecSpace, class View>
  void all_reduce(const ExecSpace& exec, const View& data, ReduceOp op) const {
    reduce_view(exec, data, op, false);
  }
  template <class ExecSpace, class View>
  void hierarchical_all_reduce(const ExecSpace& exec, const View& data, ReduceOp op) const {
    reduce_view(exec, data, op, true);
  }
  // Pointers into exec's memory space, as the host calls above.
  template <class ExecSpace>
  void all_gather(const ExecSpace& exec, const void* send, void* recv, std::size_t count, DataType type) const {
    all_gather_in(detail::access_of(exec), send, recv, count, type);
  }
  template <class ExecSpace>
  void reduce_scatter(const ExecSpace& exec, const void* send, void* recv, std::size_t count, DataType type,
                      ReduceOp op) const {
    reduce_scatter_in(detail::access_of(exec), send, recv, count, type, op);
  }
  // Nonblocking all-reduce (flat or hierarchical); the Request completes when the result is in
  // `recv` (through NCCL: when exec's stream has got there).
  template <class ExecSpace>
  Request iall_reduce(const ExecSpace& exec, const void* send, void* recv, std::size_t count, DataType type,
                      ReduceOp op, bool hierarchical) const {
    return iall_reduce_in(detail::access_of(exec), send, recv, count, type, op, hierarchical);
  }
  // Nonblocking reduce_scatter; the Request completes when rank r's block is in `recv`.
  template <class ExecSpace>
  Request ireduce_scatter(const ExecSpace& exec, const void* send, void* recv, std::size_t count, DataType type,
                          ReduceOp op) const {
    return ireduce_scatter_in(detail::access_of(exec), send, recv, count, type, op);
  }
  // Starts the transfers together (the rules above); the Request completes with the last. The
  // sends read their buffers after the work already started on exec.
  template <class ExecSpace>
  Request exchange(const ExecSpace& exec, const std::vector<Transfer>& transfers) const {
    return exchange_in(detail::access_of(exec), transfers);
  }
  // The transport that calls on exec's memory take: never automatic. The first call for device
  // memory decides where the choice is automatic, collectively (as the first such collective).
  template <class ExecSpace>
  Transport transport(const ExecSpace&) const {
    return transport_for(!Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible);
  }
  // Host memory, without an instance.
  Request exchange(const std::vector<Transfer>& transfers) const;

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

  // Ends the whole job from this rank alone, whatever the error policy: prints "rank R of W:
  // message" and calls MPI_Abort with exit status 1, so that no other rank waits for this one in
  // a collective. For a failure that other ranks cannot learn of (they may be inside one).
  [[noreturn]] void abort(const std::string& message) const;

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

  // Issue order (the comment at the top: NCCL can deadlock when ranks issue operations on the
  // communicators they share in different orders). With record_issue_order, every rank logs the
  // collectives and exchanges it issues on any communicator; this call (collective over this
  // communicator, normally the world) compares the logs: for every two ranks, the operations
  // each issued on the communicators both belong to must come in the same order. Otherwise every
  // rank fails by the error policy, naming the two ranks and the first operations that differ.
  // Then the logs start afresh. Without record_issue_order it does nothing.
  void check_issue_order() const;

  // Values that must be equal on every rank (the arguments of a collective plan): otherwise every
  // rank fails by the error policy, naming the first value that differs and its range.
  struct Agreed {
    const char* name;
    std::int64_t value;
  };
  void require_same(const char* where, const std::vector<Agreed>& values) const;


 private:
  explicit Communicator(std::shared_ptr<detail::CommunicatorState> state) : state_(std::move(state)) {}
  [[noreturn]] void fail(const char* where, const std::string& message) const;
  void agree(const char* where, const std::string& error) const;
  // Every collective and exchange begins here: logged with record_issue_order; with
  // verify_collectives its arguments compared across ranks (collectives only).
  void on_issue(const char* where, std::size_t count, DataType type, int op, bool collective = true) const;

  // The calls on an instance's memory, by its transport (src/communicator.cpp chooses).
  Transport transport_for(bool device_memory) const;
  // The implementation that carries a call on `access`'s memory (the NCCL transport's calls are
  // logged by on_issue here; the MPI and staged ones log themselves in the host collectives).
  detail::MemoryTransport& transport_of(const detail::MemoryAccess& access, const char* where, std::size_t count,
                                        DataType type, int op, bool reduces, bool collective = true) const;
  void all_reduce_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count, DataType type,
                     ReduceOp op, bool hierarchical) const;
  void reduce_scatter_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count,
                         DataType type, ReduceOp op) const;
  void all_gather_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count,
                     DataType type) const;
  Request iall_reduce_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count,
                         DataType type, ReduceOp op, bool hierarchical) const;
  Request ireduce_scatter_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count,
                             DataType type, ReduceOp op) const;
  Request exchange_in(const detail::MemoryAccess& access, const std::vector<Transfer>& transfers) const;

  template <class ExecSpace, class View>
  void reduce_view(const ExecSpace& exec, const View& data, ReduceOp op, bool hierarchical) const {
    using Value = typename View::non_const_value_type;
    static_assert(Kokkos::is_view<View>::value, "a Kokkos::View");
    static_assert(std::is_same_v<typename View::memory_space, typename ExecSpace::memory_space>,
                  "a View in the memory space of the execution space");
    const char* where = hierarchical ? "longattn::parallel::Communicator::hierarchical_all_reduce"
                                     : "longattn::parallel::Communicator::all_reduce";
    guarded(where, [&] {
      require(data.span_is_contiguous(), where, "data", data.label(), "a contiguous View");
    });
    all_reduce_in(detail::access_of(exec), data.data(), data.data(), data.size(), data_type_of<Value>(), op,
                  hierarchical);
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
