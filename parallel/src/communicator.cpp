// Communicator: construction (node discovery or simulation, sub-communicators), requests, the
// error policy, and the one place that chooses the transport of calls on an instance's memory.
#include "longattn/parallel/communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "communicator_state.hpp"

namespace longattn::parallel {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::average: return "average";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string to_string(DataType type) {
  switch (type) {
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::uint8: return "uint8";
    case DataType::bfloat16: return "bfloat16";
    case DataType::float16: return "float16";
  }
  return "?";
}

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::float32: return 4;
    case DataType::float64: return 8;
    case DataType::int32: return 4;
    case DataType::int64: return 8;
    case DataType::uint8: return 1;
    case DataType::bfloat16:
    case DataType::float16: return 2;
  }
  return 0;
}

std::string to_string(Transport transport) {
  switch (transport) {
    case Transport::automatic: return "automatic";
    case Transport::mpi: return "mpi";
    case Transport::staged: return "staged";
    case Transport::nccl: return "nccl";
  }
  return "?";
}

Transport parse_transport(const std::string& text, const char* what) {
  for (Transport t : {Transport::automatic, Transport::mpi, Transport::staged, Transport::nccl})
    if (text == to_string(t)) return t;
  throw_invalid_argument("longattn::parallel::Communicator", what, "\"" + text + "\"",
                         "automatic, mpi, staged or nccl");
}

namespace detail {

CommunicatorState::~CommunicatorState() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI is gone, and its communicators with it
  last_exchange.reset();
  for (auto& transport : transports) transport.reset();  // NCCL's communicators before MPI's
  for (MPI_Comm* c : {&staged_gather, &staged_cross, &staged_scatter, &cross, &local, &comm})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

// Groups `comm` into nodes. node_label < 0: the ranks that share memory; otherwise ranks with
// the same label form a node. Nodes are numbered by their lowest rank.
std::shared_ptr<CommunicatorState> make_state(MPI_Comm parent, int node_label, const CommunicatorOptions& options) {
  auto s = std::make_shared<CommunicatorState>();
  s->options = options;
  check_mpi(MPI_Comm_dup(parent, &s->comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(s->comm, &s->rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(s->comm, &s->size), "MPI_Comm_size");
  // The name every member agrees on: the lowest world rank among them, and its count of
  // communicators made before this one.
  static std::int64_t made = 0;
  int lowest[2] = {0, s->rank};  // world rank, rank in comm
  MPI_Comm_rank(MPI_COMM_WORLD, &lowest[0]);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, lowest, 1, MPI_2INT, MPI_MINLOC, s->comm), "MPI_Allreduce");
  std::int64_t count = made++;
  check_mpi(MPI_Bcast(&count, 1, MPI_INT64_T, lowest[1], s->comm), "MPI_Bcast");
  s->id = (std::int64_t(lowest[0]) << 32) | count;
  if (node_label < 0)
    check_mpi(MPI_Comm_split_type(s->comm, MPI_COMM_TYPE_SHARED, s->rank, MPI_INFO_NULL, &s->local),
              "MPI_Comm_split_type");
  else
    check_mpi(MPI_Comm_split(s->comm, node_label, s->rank, &s->local), "MPI_Comm_split");
  MPI_Comm_set_errhandler(s->local, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->local, &s->local_rank);
  MPI_Comm_size(s->local, &s->local_size);
  MPI_Comm leaders = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(s->comm, s->local_rank == 0 ? 0 : MPI_UNDEFINED, s->rank, &leaders), "MPI_Comm_split");
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &s->node);
    MPI_Comm_size(leaders, &s->nodes);
    MPI_Comm_free(&leaders);
  }
  check_mpi(MPI_Bcast(&s->node, 1, MPI_INT, 0, s->local), "MPI_Bcast");
  check_mpi(MPI_Bcast(&s->nodes, 1, MPI_INT, 0, s->local), "MPI_Bcast");
  s->node_of_rank.resize(std::size_t(s->size));
  check_mpi(MPI_Allgather(&s->node, 1, MPI_INT, s->node_of_rank.data(), 1, MPI_INT, s->comm), "MPI_Allgather");
  int smallest = s->local_size, largest = s->local_size;
  MPI_Allreduce(MPI_IN_PLACE, &smallest, 1, MPI_INT, MPI_MIN, s->comm);
  MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_INT, MPI_MAX, s->comm);
  s->uniform = smallest == largest;
  check_mpi(MPI_Comm_split(s->comm, s->local_rank, s->node, &s->cross), "MPI_Comm_split");
  MPI_Comm_set_errhandler(s->cross, MPI_ERRORS_RETURN);
  if (s->nodes > 1 && s->local_size > 1 && s->uniform) {
    check_mpi(MPI_Comm_dup(s->local, &s->staged_scatter), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(s->cross, &s->staged_cross), "MPI_Comm_dup");
    check_mpi(MPI_Comm_dup(s->local, &s->staged_gather), "MPI_Comm_dup");
  }
  return s;
}

}  // namespace detail

using detail::check_mpi;

// ------------------------------------------------------------------------------ Request
Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (operation_) operation_->wait();
    operation_ = std::move(other.operation_);
  }
  return *this;
}

Request::~Request() {
  if (!operation_) return;
  try {
    operation_->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "longattn::parallel: a request failed while its owner went away: %s\n", e.what());
  }
}

void Request::wait() {
  if (!operation_) return;
  operation_->wait();
  operation_.reset();
}

bool Request::test() {
  if (!operation_) return true;
  if (!operation_->test()) return false;
  operation_.reset();
  return true;
}

// ------------------------------------------------------------------------------ construction
namespace {

int simulated_ranks_per_node(const CommunicatorOptions& options) {
  if (options.ranks_per_node != 0) return options.ranks_per_node;
  const char* text = std::getenv("LONGATTN_RANKS_PER_NODE");
  if (!text || !*text) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > INT_MAX)
    throw_invalid_argument("longattn::parallel::Communicator", "LONGATTN_RANKS_PER_NODE", std::string("\"") + text + "\"",
                           "a positive number of ranks per simulated node");
  return int(value);
}

// The options with the environment applied where they leave a choice open.
CommunicatorOptions resolved(const CommunicatorOptions& options) {
  const char* where = "longattn::parallel::Communicator";
  CommunicatorOptions r = options;
  const char* transport = std::getenv("LONGATTN_TRANSPORT");
  if (r.transport == Transport::automatic && transport && *transport)
    r.transport = parse_transport(transport, "LONGATTN_TRANSPORT");
  require(LONGATTN_HAVE_NCCL || r.transport != Transport::nccl, where, "transport", "nccl",
          "automatic, mpi or staged (this build has no NCCL: LONGATTN_ENABLE_NCCL=OFF)");
  const char* chunk = std::getenv("LONGATTN_STAGING_CHUNK_BYTES");
  if (r.staging_chunk_bytes == 0 && chunk && *chunk) {
    char* end = nullptr;
    const long long value = std::strtoll(chunk, &end, 10);
    if (*end != '\0' || value < 1)
      throw_invalid_argument(where, "LONGATTN_STAGING_CHUNK_BYTES", std::string("\"") + chunk + "\"",
                             "a positive number of bytes");
    r.staging_chunk_bytes = std::size_t(value);
  }
  if (r.staging_chunk_bytes == 0) r.staging_chunk_bytes = std::size_t(4) << 20;
  require(r.timeout_seconds >= 0, where, "timeout_seconds", r.timeout_seconds, "0 (no limit) or a number of seconds");
  const char* timeout = std::getenv("LONGATTN_COLLECTIVE_TIMEOUT");
  if (r.timeout_seconds == 0 && timeout && *timeout) {
    char* end = nullptr;
    const double value = std::strtod(timeout, &end);
    if (*end != '\0' || !(value >= 0))
      throw_invalid_argument(where, "LONGATTN_COLLECTIVE_TIMEOUT", std::string("\"") + timeout + "\"",
                             "0 (no limit) or a number of seconds");
    r.timeout_seconds = value;
  }
  const char* record = std::getenv("LONGATTN_RECORD_ISSUE_ORDER");
  if (record && *record) {
    const std::string text = record;
    if (text != "0" && text != "1")
      throw_invalid_argument(where, "LONGATTN_RECORD_ISSUE_ORDER", "\"" + text + "\"", "0 or 1");
    r.record_issue_order = r.record_issue_order || text == "1";
  }
  return r;
}

}  // namespace

Communicator Communicator::from_mpi(MPI_Comm comm, const CommunicatorOptions& options) {
  const char* where = "longattn::parallel::Communicator";
  int initialized = 0;
  MPI_Initialized(&initialized);
  require(initialized != 0, where, "MPI", "not initialized", "MPI_Init first (longattn::parallel::MpiSession)");
  require(comm != MPI_COMM_NULL, where, "comm", "MPI_COMM_NULL", "a valid communicator");
  require(options.ranks_per_node >= 0, where, "options.ranks_per_node", options.ranks_per_node,
          "0 (the real nodes) or the ranks of a simulated node");
  const int per_node = simulated_ranks_per_node(options);
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return Communicator(detail::make_state(comm, per_node > 0 ? rank / per_node : -1, resolved(options)));
}

Communicator Communicator::world(const CommunicatorOptions& options) { return from_mpi(MPI_COMM_WORLD, options); }

Communicator Communicator::split(int color, int key) const {
  const char* where = "longattn::parallel::Communicator::split";
  MPI_Comm part = MPI_COMM_NULL;
  guarded(where, [&] {
    require(color >= 0, where, "color", color, "a color >= 0");
    check_mpi(MPI_Comm_split(state_->comm, color, key, &part), "MPI_Comm_split");
  });
  // Nodes carry over: the members of a node stay together in the part.
  Communicator result(detail::make_state(part, state_->node, state_->options));
  MPI_Comm_free(&part);
  return result;
}

int Communicator::rank() const { return state_->rank; }
int Communicator::size() const { return state_->size; }
int Communicator::node() const { return state_->node; }
int Communicator::nodes() const { return state_->nodes; }
int Communicator::local_rank() const { return state_->local_rank; }
int Communicator::local_size() const { return state_->local_size; }
bool Communicator::uniform_nodes() const { return state_->uniform; }
const CommunicatorOptions& Communicator::options() const { return state_->options; }
MPI_Comm Communicator::mpi() const { return state_->comm; }

// ------------------------------------------------------------------------------ errors
void Communicator::fail(const char* where, const std::string& message) const {
  if (state_->options.on_error == ErrorPolicy::throw_error) {
    if (message.rfind(where, 0) == 0 || message.rfind("longattn::", 0) == 0) throw Error(message);
    throw Error(std::string(where) + ": " + message);
  }
  abort(message);
}

void Communicator::abort(const std::string& message) const {
  std::fprintf(stderr,
               "longattn::parallel: rank %d of %d: %s\n"
               "longattn::parallel: aborting the job (MPI_Abort) so that the other ranks do not wait for this one\n",
               state_->rank, state_->size, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

void Communicator::agree(const char* where, const std::string& error) const {
  int first = error.empty() ? state_->size : state_->rank;
  detail::run("MPI_Iallreduce", state_->watch(where), [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, state_->comm, r);
  });
  if (first == state_->size) return;
  std::string message = error;
  std::uint64_t length = message.size();
  check_mpi(MPI_Bcast(&length, 1, MPI_UINT64_T, first, state_->comm), "MPI_Bcast");
  message.resize(length);
  check_mpi(MPI_Bcast(message.data(), int(length), MPI_CHAR, first, state_->comm), "MPI_Bcast");
  if (first == state_->rank) fail(where, message);
  const std::string own = std::string(where) + ": ";  // "where: rank R: what", not where twice
  if (message.rfind(own, 0) == 0) message.erase(0, own.size());
  fail(where, "rank " + std::to_string(first) + ": " + message);
}

void Communicator::require_same(const char* where, const std::vector<Agreed>& values) const {
  const std::size_t n = values.size();
  std::vector<std::int64_t> high(n), low(n);
  for (std::size_t i = 0; i < n; ++i) high[i] = low[i] = values[i].value;
  guarded(where, [&] {
    const detail::Watch watch = state_->watch(where);
    detail::run("MPI_Iallreduce", watch, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, high.data(), int(n), MPI_INT64_T, MPI_MAX, state_->comm, r);
    });
    detail::run("MPI_Iallreduce", watch, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, low.data(), int(n), MPI_INT64_T, MPI_MIN, state_->comm, r);
    });
  });
  for (std::size_t i = 0; i < n; ++i)
    if (high[i] != low[i]) {
      std::ostringstream message;
      message << where << ": argument '" << values[i].name << "' differs between ranks (from " << low[i] << " to "
              << high[i] << "), expected the same on every rank of the communicator";
      fail(where, message.str());
    }
}

// ------------------------------------------------------------------------------ issue order
namespace {

// This process's log of issued operations (record_issue_order), over all its communicators.
struct Issued {
  std::int64_t communicator, sequence, operation;  // operation: an index into operation_names
};
std::vector<Issued> issue_log;
std::vector<std::string> operation_names;  // the `where` of each operation logged, in first-use order

std::int64_t operation_index(const char* where) {
  for (std::size_t i = 0; i < operation_names.size(); ++i)
    if (operation_names[i] == where) return std::int64_t(i);
  operation_names.emplace_back(where);
  return std::int64_t(operation_names.size() - 1);
}

// "all_reduce #3 on communicator 0:2" (the lowest world rank of its members : its number there).
std::string describe(const Issued& e, const std::vector<std::string>& names) {
  const std::string name = e.operation >= 0 && std::size_t(e.operation) < names.size() ? names[std::size_t(e.operation)]
                                                                                       : "an operation";
  return name.substr(name.rfind(':') + 1) + " #" + std::to_string(e.sequence) + " on communicator " +
         std::to_string(e.communicator >> 32) + ":" + std::to_string(e.communicator & 0xffffffff);
}

}  // namespace

void Communicator::on_issue(const char* where, std::size_t count, DataType type, int op, bool collective) const {
  if (state_->options.record_issue_order)
    issue_log.push_back({state_->id, state_->issued, operation_index(where)});
  ++state_->issued;
  // With verify_collectives: every rank brings (count, type, op); a difference is an error on
  // every rank at once, so no rank is left waiting.
  if (collective && state_->options.verify_collectives)
    require_same(where, {{"count", std::int64_t(count)}, {"type", std::int64_t(type)}, {"op", op}});
}

// Operation names travel as their text, so that each rank reads the others' indices.
void Communicator::check_issue_order() const {
  const char* where = "longattn::parallel::Communicator::check_issue_order";
  if (!state_->options.record_issue_order) return;
  const int P = state_->size;
  const std::size_t ranks = std::size_t(P);
  std::vector<std::vector<Issued>> logs(ranks);
  std::vector<std::vector<std::string>> names(ranks);
  guarded(where, [&] {
    // Every rank's log: lengths, then the entries as int64 triples; then the names, joined by '\n'.
    auto gather = [&](const std::vector<std::int64_t>& mine) {
      std::int64_t length = std::int64_t(mine.size());
      std::vector<std::int64_t> lengths(ranks);
      detail::run("MPI_Iallgather", state_->watch(where), [&](MPI_Request* r) {
        return MPI_Iallgather(&length, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, state_->comm, r);
      });
      std::vector<int> counts(ranks), offsets(ranks);
      int total = 0;
      for (int p = 0; p < P; ++p) {
        require(lengths[std::size_t(p)] <= INT_MAX - total, where, "the issue logs", lengths[std::size_t(p)],
                "fewer than 2^31 entries in all (check more often)");
        counts[std::size_t(p)] = int(lengths[std::size_t(p)]);
        offsets[std::size_t(p)] = total;
        total += counts[std::size_t(p)];
      }
      std::vector<std::int64_t> all(static_cast<std::size_t>(total));
      detail::run("MPI_Iallgatherv", state_->watch(where), [&](MPI_Request* r) {
        return MPI_Iallgatherv(mine.data(), int(mine.size()), MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                               MPI_INT64_T, state_->comm, r);
      });
      std::vector<std::vector<std::int64_t>> parts(ranks);
      for (int p = 0; p < P; ++p)
        parts[std::size_t(p)].assign(all.begin() + offsets[std::size_t(p)],
                                     all.begin() + offsets[std::size_t(p)] + counts[std::size_t(p)]);
      return parts;
    };
    std::vector<std::int64_t> entries;
    for (const Issued& e : issue_log) entries.insert(entries.end(), {e.communicator, e.sequence, e.operation});
    std::vector<std::int64_t> text;  // the names as characters, one per element (logs are small)
    for (const std::string& n : operation_names) {
      for (char c : n) text.push_back(c);
      text.push_back('\n');
    }
    const auto all_entries = gather(entries), all_text = gather(text);
    for (int p = 0; p < P; ++p) {
      const auto& e = all_entries[std::size_t(p)];
      for (std::size_t i = 0; i + 2 < e.size(); i += 3) logs[std::size_t(p)].push_back({e[i], e[i + 1], e[i + 2]});
      std::string name;
      for (std::int64_t c : all_text[std::size_t(p)]) {
        if (c == '\n') names[std::size_t(p)].push_back(name), name.clear();
        else name.push_back(char(c));
      }
    }
  });
  issue_log.clear();
  // This rank against every other: the operations on the communicators both have used, in order.
  checked(where, [&] {
    const int me = state_->rank;
    const auto& mine = logs[std::size_t(me)];
    for (int p = 0; p < P; ++p) {
      if (p == me) continue;
      const auto& theirs = logs[std::size_t(p)];
      auto used = [](const std::vector<Issued>& log) {
        std::vector<std::int64_t> ids;
        for (const Issued& e : log) ids.push_back(e.communicator);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        return ids;
      };
      const auto in_mine = used(mine), in_theirs = used(theirs);
      auto shared = [](const std::vector<Issued>& log, const std::vector<std::int64_t>& other) {
        std::vector<Issued> kept;
        for (const Issued& e : log)
          if (std::binary_search(other.begin(), other.end(), e.communicator)) kept.push_back(e);
        return kept;
      };
      const auto a = shared(mine, in_theirs), b = shared(theirs, in_mine);
      for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
        const bool same = i < a.size() && i < b.size() && a[i].communicator == b[i].communicator &&
                          a[i].sequence == b[i].sequence;
        if (same) continue;
        throw Error(std::string(where) + ": rank " + std::to_string(me) + " issued " +
                    (i < a.size() ? describe(a[i], names[std::size_t(me)]) : "nothing more") + " where rank " +
                    std::to_string(p) + " issued " +
                    (i < b.size() ? describe(b[i], names[std::size_t(p)]) : "nothing more") + " (operation " +
                    std::to_string(i + 1) +
                    " on the communicators both use): two ranks must issue the operations on the communicators "
                    "they share in the same order (NCCL can deadlock otherwise)");
      }
    }
  });
}

// ------------------------------------------------------------------------------ transports
// The one place that decides how calls on an instance's memory travel (communicator.hpp).
Transport Communicator::transport_for(bool device_memory) const {
  detail::CommunicatorState& s = *state_;
  if (!device_memory) return s.options.transport == Transport::staged ? Transport::staged : Transport::mpi;
  if (s.device_transport != Transport::automatic) return s.device_transport;
  const char* where = "longattn::parallel::Communicator::transport";
  guarded(where, [&] {
    // Every rank answers alike (the same library, and agreed over MPI where ranks could differ).
    int gpu_aware = detail::mpi_takes_device_pointers() ? 1 : 0;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &gpu_aware, 1, MPI_INT, MPI_MIN, s.comm), "MPI_Allreduce");
    switch (s.options.transport) {
      case Transport::automatic:
#if LONGATTN_HAVE_NCCL
        if (detail::every_rank_has_own_gpu(s)) {
          s.device_transport = Transport::nccl;
          break;
        }
#endif
        s.device_transport = gpu_aware ? Transport::mpi : Transport::staged;
        break;
      case Transport::mpi:
        require(gpu_aware == 1, where, "transport", "mpi",
                "staged or nccl for device memory: this MPI does not take device pointers (MPIX_Query_cuda_support)");
        s.device_transport = Transport::mpi;
        break;
      default: s.device_transport = s.options.transport;
    }
  });
  return s.device_transport;
}

namespace {

// The implementation of `transport`, made on first use (NCCL's collectively). MPI's reductions
// of bfloat16 and float16 are longattn's own operations, which read the buffers on the host:
// on device memory they go through the staged transport.
detail::MemoryTransport& implementation(detail::CommunicatorState& s, Transport transport, const detail::MemoryAccess& access,
                                        DataType type, bool reduces) {
  if (transport == Transport::mpi && access.device_memory && reduces && detail::is_half(type)) transport = Transport::staged;
  std::unique_ptr<detail::MemoryTransport>& made = s.transports[std::size_t(transport)];
  if (!made) {
    switch (transport) {
      case Transport::staged: made = detail::make_staged_transport(s.options.staging_chunk_bytes); break;
#if LONGATTN_HAVE_NCCL
      case Transport::nccl: made = detail::make_nccl_transport(s); break;
#endif
      default: made = detail::make_mpi_transport(); break;
    }
  }
  return *made;
}

}  // namespace

detail::MemoryTransport& Communicator::transport_of(const detail::MemoryAccess& access, const char* where,
                                                   std::size_t count, DataType type, int op, bool reduces,
                                                   bool collective) const {
  const Transport t = transport_for(access.device_memory);
  if (t == Transport::nccl) on_issue(where, count, type, op, collective);
  return implementation(*state_, t, access, type, reduces);
}

// Each call checks what every transport needs, then hands over.
void Communicator::all_reduce_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count,
                                 DataType type, ReduceOp op, bool hierarchical) const {
  const char* where = hierarchical ? "longattn::parallel::Communicator::hierarchical_all_reduce"
                                   : "longattn::parallel::Communicator::all_reduce";
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    transport_of(access, where, count, type, int(op), true)
        .all_reduce(*this, access, send, recv, count, type, op, hierarchical);
  });
}

void Communicator::reduce_scatter_in(const detail::MemoryAccess& access, const void* send, void* recv,
                                     std::size_t count, DataType type, ReduceOp op) const {
  const char* where = "longattn::parallel::Communicator::reduce_scatter";
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    require(send != recv || count == 0, where, "recv", "the send buffer", "a buffer of its own");
    transport_of(access, where, count, type, int(op), true).reduce_scatter(*this, access, send, recv, count, type, op);
  });
}

void Communicator::all_gather_in(const detail::MemoryAccess& access, const void* send, void* recv, std::size_t count,
                                 DataType type) const {
  const char* where = "longattn::parallel::Communicator::all_gather";
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, ReduceOp::sum);
    require(send != recv || count == 0, where, "recv", "the send buffer", "a buffer of its own");
    transport_of(access, where, count, type, -1, false).all_gather(*this, access, send, recv, count, type);
  });
}

Request Communicator::iall_reduce_in(const detail::MemoryAccess& access, const void* send, void* recv,
                                     std::size_t count, DataType type, ReduceOp op, bool hierarchical) const {
  const char* where = "longattn::parallel::Communicator::iall_reduce";
  Request request;
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    request = transport_of(access, where, count, type, int(op), true)
                  .iall_reduce(*this, access, send, recv, count, type, op, hierarchical);
  });
  return request;
}

Request Communicator::ireduce_scatter_in(const detail::MemoryAccess& access, const void* send, void* recv,
                                         std::size_t count, DataType type, ReduceOp op) const {
  const char* where = "longattn::parallel::Communicator::ireduce_scatter";
  Request request;
  guarded(where, [&] {
    detail::check_buffers(where, send, recv, count, type, op);
    require(send != recv || count == 0, where, "recv", "the send buffer", "a buffer of its own");
    request = transport_of(access, where, count, type, int(op), true)
                  .ireduce_scatter(*this, access, send, recv, count, type, op);
  });
  return request;
}

Request Communicator::exchange_in(const detail::MemoryAccess& access, const std::vector<Transfer>& transfers) const {
  const char* where = "longattn::parallel::Communicator::exchange";
  Request request;
  guarded(where, [&] {
    for (const Transfer& t : transfers) {
      const bool sending = t.direction == Transfer::Direction::send;
      require(t.count == 0 || t.data != nullptr, where, "data", "nullptr", "a buffer of " + std::to_string(t.count) + " elements");
      require(t.peer >= 0 && t.peer < state_->size, where, sending ? "destination" : "source", t.peer,
              "a rank from 0 to " + std::to_string(state_->size - 1));
    }
    request = transport_of(access, where, transfers.size(), DataType::uint8, -1, false, false).exchange(*this, access, transfers);
  });
  return request;
}

// ------------------------------------------------------------------------------ grid
Grid make_grid(const Communicator& world, int context_parallel) {
  const char* where = "longattn::parallel::make_grid";
  world.guarded(where, [&] {
    require(context_parallel >= 1 && world.size() % context_parallel == 0, where, "context_parallel", context_parallel,
            "a divisor of the " + std::to_string(world.size()) + " ranks");
  });
  Grid grid{world.split(world.rank() / context_parallel, world.rank()),
            world.split(world.rank() % context_parallel, world.rank()), context_parallel,
            world.size() / context_parallel};
  return grid;
}

}  // namespace longattn::parallel
