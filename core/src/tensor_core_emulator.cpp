// The host emulation of the tensor-core kernels' warp operations (tensor_core/emulated_warp.hpp).
// The layouts below are transcribed from the PTX ISA (9.7.13.4.7 and 9.7.13.4.8, "Matrix Fragments
// for mma.m16n8k8" (.tf32) and "for mma.m16n8k16 with floating point type"; 9.7.13.4.15,
// ldmatrix; 9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": 9.7.15.5.1,
// register fragments of wgmma.m64nNk16, 9.7.15.5.1.2, shared memory matrix layouts and their
// descriptor; 9.7.9.25, cp.async.bulk.tensor, and 5.5.6, the tensor copies' 128-byte swizzle;
// 9.7.13.15, mbarrier), not taken from fragments.hpp or warpgroup.hpp.
#include "longattn/core/detail/tensor_core/emulated_warp.hpp"

#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <vector>

#include "longattn/error.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define LONGATTN_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LONGATTN_ASAN_FIBERS 1
#endif
#endif
#ifdef LONGATTN_ASAN_FIBERS
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace longattn::detail::tensor_core {
namespace {

constexpr int warp_size = 32;
constexpr int warpgroup_size = 128;
constexpr std::size_t shared_limit = 227 * 1024;  // an H100's dynamic shared memory per block, opted in
constexpr int register_file = 65536;               // 32-bit registers an SM
constexpr std::size_t stack_bytes = 256 * 1024;
constexpr unsigned never = std::numeric_limits<unsigned>::max();

// Switching between the scheduler and the fibers: on x86-64 a switch of the callee-saved
// registers and the stack pointer (swapcontext would also save the signal mask, a system call
// per switch: 70% of the emulation's time); elsewhere swapcontext.
#if defined(__x86_64__)
extern "C" void longattn_tensor_core_switch(void** save_stack, void* load_stack);
// Pushes rbp, rbx, r12-r15 and the SSE/x87 control words, saves rsp in *save_stack, loads
// load_stack and pops the same from there.
asm(R"(
  .text
  .globl longattn_tensor_core_switch
  .type longattn_tensor_core_switch, @function
longattn_tensor_core_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size longattn_tensor_core_switch, .-longattn_tensor_core_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Context {
  void* stack_pointer = nullptr;
};
// A context that starts `entry` on the stack [stack, stack + bytes): a frame that the switch
// above pops, returning into entry as if it had been called.
void make_context(Context& context, char* stack, std::size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::uintptr_t>(stack + bytes) & ~std::uintptr_t(15));
  std::uint32_t controls[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(controls[0]), "=m"(controls[1]));
  top[-1] = 0;                                          // entry's return address: never used
  top[-2] = reinterpret_cast<std::uint64_t>(entry);     // where the switch returns
  for (int r = 3; r <= 8; ++r) top[-r] = 0;             // rbp, rbx, r12-r15
  std::memcpy(&top[-9], controls, sizeof controls);   // mxcsr, x87 control word
  context.stack_pointer = &top[-9];
}
void switch_context(Context& from, Context& to) { longattn_tensor_core_switch(&from.stack_pointer, to.stack_pointer); }
#else
struct Context {
  ucontext_t context;
};
void make_context(Context& context, char* stack, std::size_t bytes, void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = bytes;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.context, &to.context); }
#endif

enum class Op { shfl, uniform, ldmatrix, ldmatrix_trans, mma_bf16, mma_f16, mma_tf32, sync_warp };
const char* name(Op op) {
  switch (op) {
    case Op::shfl: return "shfl.sync.bfly";
    case Op::uniform: return "shfl.sync.idx (lane 0's value)";
    case Op::ldmatrix: return "ldmatrix.x4";
    case Op::ldmatrix_trans: return "ldmatrix.x4.trans";
    case Op::mma_bf16: return "mma.m16n8k16.bf16";
    case Op::mma_f16: return "mma.m16n8k16.f16";
    case Op::mma_tf32: return "mma.m16n8k8.tf32";
    case Op::sync_warp: return "bar.warp.sync";
  }
  return "?";
}

struct Copy {
  char* shared;
  const char* global;
  bool fill;
};

struct Fiber {
  Context context;
  char* stack = nullptr;
  int thread = 0;
  bool finished = false;
  const unsigned* wait_generation = nullptr;  // blocked until *wait_generation != wait_seen
  unsigned wait_seen = 0;
  const char* waiting_at = "";
  std::vector<Copy> in_flight;  // cp.async issued and not yet waited for (commit groups end at the wait)
  std::vector<std::size_t> unfenced;  // words it wrote (stores, cp.async) with no fence.proxy.async since
  std::vector<unsigned> observed;  // per mbarrier: the phases it has seen completed (by waiting)
  void* fake_stack = nullptr;   // AddressSanitizer's, while switched out
};

// One lane's part of a warp collective.
struct LaneSlot {
  std::uint32_t a[4] = {}, b[2] = {};
  float c[4] = {}, value = 0;
  int lane_mask = 0;
  int word = 0, out_word = 0;
  const char* row = nullptr;
  std::uint32_t out[4] = {};
  float out_c[4] = {}, out_value = 0;
};

struct WarpState {
  int arrived = 0;
  unsigned generation = 0;
  unsigned syncs = 0;  // sync_warp count: orders accesses between the warp's lanes
  Op op = Op::sync_warp;
  LaneSlot lanes[warp_size];
};

// What the race check remembers of a 4-byte word of shared memory.
struct Word {
  unsigned write_epoch = never, read_epoch = never;
  unsigned writer_syncs = 0, reader_syncs = 0;
  short writer = -1;
  short reader = -1;       // a thread, or several: -2
  short reader_warp = -1;  // the readers' warp, or -2: several warps
  short copying = -1;      // the thread whose copy in flight (cp.async or TMA) writes the word
  bool copying_tma = false;
  bool mbarrier = false;   // part of an mbarrier object
  short unfenced = -1;     // the thread whose write (generic proxy) no fence.proxy.async of its followed
  short tma_barrier = -1;  // landed by a TMA copy on this mbarrier ...
  unsigned tma_completion = 0;  // ... whose phase completion number this is
  int wgmma_readers = 0;   // wgmma.mma_async issued and not yet run that read it
};

// An mbarrier (PTX ISA 9.7.13.15): the arrivals a phase expects, those still pending, the
// transaction bytes announced and not yet landed, the phases completed.
struct Mbarrier {
  std::size_t offset = 0;
  int arrivals = 0, pending = 0;
  long long bytes = 0;
  unsigned completions = 0;
  unsigned init_epoch = 0;
  int init_thread = 0;
};

// A cp.async.bulk.tensor in flight.
struct TmaCopy {
  char* tile;
  TileMap map;
  int coordinates[4];
  std::size_t barrier;
  int thread;
};

// A wgmma.mma_async issued by a warpgroup: its operands as the 128 threads gave them.
struct Wgmma {
  Operand type = Operand::bf16;
  int n = 0;
  bool a_in_registers = false, b_transposed = false;
  std::uint64_t a_descriptor = 0, b_descriptor = 0;
  float* d[warpgroup_size] = {};
  std::uint32_t a[warpgroup_size][4] = {};
};

enum class GroupOp { fence, wgmma, commit, wait, setmaxnreg };
const char* name(GroupOp op) {
  switch (op) {
    case GroupOp::fence: return "wgmma.fence";
    case GroupOp::wgmma: return "wgmma.mma_async";
    case GroupOp::commit: return "wgmma.commit_group";
    case GroupOp::wait: return "wgmma.wait_group";
    case GroupOp::setmaxnreg: return "setmaxnreg";
  }
  return "?";
}

// A warpgroup's collectives (its 128 threads arrive) and its wgmma pipeline: the wgmma issued and
// not committed, the committed groups not waited for (they compute when waited for, so that a
// read of an accumulator before the wait sees the old value, as it may on the GPU).
struct WarpgroupState {
  int arrived = 0;
  unsigned generation = 0;
  GroupOp op = GroupOp::fence;
  Wgmma issuing;
  bool fenced = false;  // a wgmma.fence since the last wait
  int registers = 0;     // per thread (setmaxnreg)
  int asked_registers = 0, asked_increase = 0;  // a setmaxnreg's operands as its threads gave them
  std::vector<Wgmma> open;
  std::deque<std::vector<Wgmma>> committed;
};

// A named barrier (bar.sync / bar.arrive): the threads its current phase expects, those arrived.
struct NamedBarrier {
  int threads = 0, arrived = 0;
  unsigned generation = 0;
  std::vector<bool> in_phase;  // by thread
};
constexpr int named_barrier_ids = 16;  // 0 is sync_cta's

struct Cta {
  int index = 0, threads = 0, finished = 0;
  char* shared = nullptr;
  std::size_t shared_bytes = 0;
  std::vector<Fiber>* fibers = nullptr;
  std::vector<WarpState> warps;
  std::vector<WarpgroupState> warpgroups;  // threads / 128 of them (the whole ones)
  unsigned register_generation = 0;        // setmaxnreg.dec completed (registers freed)
  std::vector<Word> words;
  std::deque<Mbarrier> mbarriers;  // a deque: waiting fibers hold pointers to its elements
  std::deque<TmaCopy> tma_in_flight;
  bool tma_lands_late = false;  // TMA copies land when no thread can run (else at once)
  int barrier_arrived = 0;
  unsigned barrier_generation = 0;
  NamedBarrier named[named_barrier_ids];
  unsigned epoch = 0;  // completed CTA barriers
  Context scheduler;
  Fiber* current = nullptr;
  const void* program = nullptr;
  Emulator::Body body = nullptr;
  bool failed = false;
  char message[768] = {};
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_size = 0;
};

thread_local Cta* active = nullptr;
thread_local EmulationCounters totals;

// Fiber stacks, kept for the thread's life (mapped, not heap: a failed emulation abandons them).
struct Stacks {
  std::vector<char*> stacks;
  char* get(std::size_t n) {
    while (stacks.size() <= n) {
      void* p = mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw Error("longattn tensor-core emulator: cannot map a fiber stack");
      stacks.push_back(static_cast<char*>(p));
    }
    return stacks[n];
  }
  ~Stacks() {
    for (char* s : stacks) munmap(s, stack_bytes);
  }
};
thread_local Stacks stacks;
thread_local std::vector<Fiber> fiber_pool;

void start_switch(void** fake_stack, const void* bottom, std::size_t size) {
#ifdef LONGATTN_ASAN_FIBERS
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
  (void)fake_stack, (void)bottom, (void)size;
#endif
}
// A fiber stack used again: AddressSanitizer's redzones of the frames that were on it when its
// last fiber finished (by switching away, not returning) are still poisoned.
void unpoison(char* stack, std::size_t bytes) {
#ifdef LONGATTN_ASAN_FIBERS
  __asan_unpoison_memory_region(stack, bytes);
#else
  (void)stack, (void)bytes;
#endif
}
void finish_switch(void* fake_stack, const void** bottom_old, std::size_t* size_old) {
#ifdef LONGATTN_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#else
  (void)fake_stack, (void)bottom_old, (void)size_old;
#endif
}

Cta& cta() { return *active; }
Fiber& fiber() { return *active->current; }
int warp_of(int thread) { return thread / warp_size; }

// Back to the scheduler; returns when the scheduler resumes this fiber (never when finishing
// or failed).
void yield(bool finishing = false) {
  Cta& c = cta();
  Fiber& f = fiber();
  start_switch(finishing ? nullptr : &f.fake_stack, c.scheduler_stack, c.scheduler_stack_size);
  switch_context(f.context, c.scheduler);
  finish_switch(f.fake_stack, &c.scheduler_stack, &c.scheduler_stack_size);
}

// Records the first failure of the CTA, in the name of `thread`.
void record_failure(Cta& c, int thread, const char* format, va_list args) {
  if (c.failed) return;
  c.failed = true;
  const int n =
      std::snprintf(c.message, sizeof c.message, "longattn tensor-core emulator: CTA %d, thread %d: ", c.index, thread);
  std::vsnprintf(c.message + n, sizeof c.message - n, format, args);
}
void record_failure(Cta& c, int thread, const char* format, ...) {
  va_list args;
  va_start(args, format);
  record_failure(c, thread, format, args);
  va_end(args);
}

// Records the first failure of the CTA and leaves the fiber for good (its stack holds only
// trivially destructible values: the message lives in the CTA).
[[noreturn]] void leave() {
  yield(true);
  std::abort();  // not reached: a failed CTA's fibers are never resumed
}
[[noreturn]] void fail(const char* format, ...) {
  va_list args;
  va_start(args, format);
  record_failure(cta(), cta().current->thread, format, args);
  va_end(args);
  leave();
}

void block_until_changed(const unsigned* generation, unsigned seen, const char* what) {
  Fiber& f = fiber();
  f.wait_generation = generation;
  f.wait_seen = seen;
  f.waiting_at = what;
  yield();
}

// ------------------------------------------------------------------------- shared memory checks
std::size_t shared_offset(const void* address, std::size_t bytes, std::size_t alignment, const char* what) {
  Cta& c = cta();
  const char* p = static_cast<const char*>(address);
  if (p < c.shared || p + bytes > c.shared + c.shared_bytes)
    fail("%s at %p is outside the CTA's %zu bytes of shared memory at %p", what, address, c.shared_bytes,
         static_cast<const void*>(c.shared));
  const std::size_t offset = std::size_t(p - c.shared);
  if (offset % alignment != 0)
    fail("%s at shared offset %zu is not aligned to %zu bytes", what, offset, alignment);
  return offset;
}

bool ordered_in_warp(unsigned then_syncs, int other_thread, int thread) {
  return other_thread >= 0 && warp_of(other_thread) == warp_of(thread) && cta().warps[warp_of(thread)].syncs != then_syncs;
}

void check_read(std::size_t offset, std::size_t bytes, int thread, const char* what) {
  Cta& c = cta();
  const WarpState& warp = c.warps[warp_of(thread)];
  for (std::size_t w = offset / 4; w < (offset + bytes + 3) / 4; ++w) {
    Word& word = c.words[w];
    if (word.mbarrier) fail("%s reads shared offset %zu, an mbarrier's", what, w * 4);
    if (word.copying >= 0 && word.copying_tma)
      fail("%s reads shared offset %zu, which a TMA copy of thread %d has not landed yet", what, w * 4, word.copying);
    if (word.copying >= 0)
      fail("%s reads shared offset %zu, which a cp.async of thread %d has not landed yet (no cp.async.wait%s)", what,
           w * 4, word.copying, word.copying == thread ? "" : " and barrier");
    if (word.write_epoch == never)
      fail("%s reads shared offset %zu, which nothing wrote", what, w * 4);
    if (word.tma_barrier >= 0) {
      const std::vector<unsigned>& observed = (*c.fibers)[std::size_t(thread)].observed;
      if (observed.size() <= std::size_t(word.tma_barrier) || observed[std::size_t(word.tma_barrier)] < word.tma_completion)
        fail("%s reads shared offset %zu, which a TMA copy landed on mbarrier %d's phase %u, not waited for by thread %d",
             what, w * 4, int(word.tma_barrier), word.tma_completion - 1, thread);
    } else if (word.write_epoch == c.epoch && word.writer != thread &&
               !ordered_in_warp(word.writer_syncs, word.writer, thread)) {
      fail("%s reads shared offset %zu, written by thread %d since the last barrier: a race", what, w * 4,
           word.writer);
    }
    if (word.read_epoch != c.epoch) {
      word.reader = short(thread);
      word.reader_warp = short(warp_of(thread));
    } else {
      if (word.reader != thread) word.reader = -2;
      if (word.reader_warp != warp_of(thread)) word.reader_warp = -2;
    }
    word.read_epoch = c.epoch;
    word.reader_syncs = warp.syncs;
  }
}

void check_write(std::size_t offset, std::size_t bytes, int thread, const char* what, bool copy) {
  Cta& c = cta();
  for (std::size_t w = offset / 4; w < (offset + bytes + 3) / 4; ++w) {
    Word& word = c.words[w];
    if (word.mbarrier) fail("%s writes shared offset %zu, an mbarrier's", what, w * 4);
    if (word.copying >= 0)
      fail("%s writes shared offset %zu, which a %s of thread %d in flight writes", what, w * 4,
           word.copying_tma ? "TMA copy" : "cp.async", word.copying);
    const bool read_by_others =
        word.read_epoch == c.epoch && word.reader != thread &&
        !(word.reader_warp == warp_of(thread) && c.warps[warp_of(thread)].syncs != word.reader_syncs);
    if (read_by_others)
      fail("%s writes shared offset %zu, read since the last barrier by %s %d: a race", what, w * 4,
           word.reader_warp == -2 ? "threads of several warps, one in warp" : "warp",
           word.reader_warp == -2 ? warp_of(thread) : int(word.reader_warp));
    if (word.write_epoch == c.epoch && word.writer != thread && !ordered_in_warp(word.writer_syncs, word.writer, thread))
      fail("%s writes shared offset %zu, written by thread %d since the last barrier: a race", what, w * 4,
           word.writer);
    word.tma_barrier = -1;
    if (copy) {
      word.copying = short(thread);
      word.copying_tma = false;
    } else {
      word.writer = short(thread);
      word.write_epoch = c.epoch;
      word.writer_syncs = c.warps[warp_of(thread)].syncs;
      word.unfenced = short(thread);
      fiber().unfenced.push_back(w);
    }
  }
}

// The cp.async copies of the current thread land (cp.async.wait_all).
void land_copies(Fiber& f) {
  Cta& c = cta();
  for (const Copy& copy : f.in_flight) {
    const std::size_t offset = std::size_t(copy.shared - c.shared);
    for (std::size_t w = offset / 4; w < offset / 4 + 4; ++w) {
      Word& word = c.words[w];
      word.copying = -1;
      word.tma_barrier = -1;
      word.writer = short(f.thread);
      word.write_epoch = c.epoch;
      word.writer_syncs = c.warps[warp_of(f.thread)].syncs;
      word.unfenced = short(f.thread);
      f.unfenced.push_back(w);
    }
    if (copy.fill)
      std::memcpy(copy.shared, copy.global, 16);
    else
      std::memset(copy.shared, 0, 16);
  }
  f.in_flight.clear();
}

// ------------------------------------------------------------------------- mbarriers and TMA
constexpr short copy_engine = -3;  // the writer of what a TMA copy landed

void complete_phase_if_done(Mbarrier& m) {
  if (m.pending == 0 && m.bytes == 0) {
    ++m.completions;
    m.pending = m.arrivals;
  }
}

// The mbarrier at shared-memory address `address` (initialized, and visible to this thread).
std::size_t mbarrier_index(std::uint32_t address, const char* what) {
  Cta& c = cta();
  const int thread = fiber().thread;
  for (std::size_t i = 0; i < c.mbarriers.size(); ++i) {
    const Mbarrier& m = c.mbarriers[i];
    if (m.offset != address) continue;
    if (m.init_thread != thread && m.init_epoch == c.epoch)
      fail("%s uses the mbarrier at shared offset %u, initialized by thread %d with no CTA barrier since", what,
           address, m.init_thread);
    return i;
  }
  fail("%s uses shared offset %u, where no mbarrier was initialized", what, address);
}

// A TMA copy lands (PTX ISA 5.5.6, the 128-byte swizzle: byte-address bits 4-6 XOR bits 7-9): the
// box's values (zeros outside the tensor) into its rows of 128 bytes, its bytes counted on its
// mbarrier's phase. False, with the failure recorded, where a wgmma waiting to run reads them.
bool land_tma(Cta& c, const TmaCopy& copy) {
  const TileMap& map = copy.map;
  Mbarrier& m = c.mbarriers[copy.barrier];
  const std::size_t offset = std::size_t(copy.tile - c.shared), bytes = 128 * std::size_t(map.box_rows);
  for (std::size_t w = offset / 4; w < (offset + bytes) / 4; ++w) {
    Word& word = c.words[w];
    if (word.wgmma_readers > 0) {
      record_failure(c, copy.thread,
                     "a TMA copy lands on shared offset %zu, which a wgmma.mma_async issued and not yet waited for reads",
                     w * 4);
      return false;
    }
    word.copying = -1;
    word.writer = copy_engine;
    word.write_epoch = c.epoch;
    word.unfenced = -1;
    word.tma_barrier = short(copy.barrier);
    word.tma_completion = m.completions + 1;
  }
  const char* data = static_cast<const char*>(map.data);
  for (int r = 0; r < map.box_rows; ++r)
    for (int v = 0; v < panel_values; ++v) {
      const std::int64_t at[4] = {copy.coordinates[0] + v, copy.coordinates[1] + r, copy.coordinates[2],
                                  copy.coordinates[3]};
      std::uint16_t value = 0;
      bool inside = true;
      std::int64_t source = 0;
      for (int i = 0; i < 4; ++i) {
        inside = inside && at[i] >= 0 && at[i] < map.extents[i];
        source += at[i] * map.strides[i];
      }
      if (inside) std::memcpy(&value, data + source, 2);
      const std::size_t linear = offset + 128 * std::size_t(r) + 2 * std::size_t(v);
      std::memcpy(c.shared + (linear ^ ((linear >> 7 & 7u) << 4)), &value, 2);
    }
  m.bytes -= (long long)bytes;
  complete_phase_if_done(m);
  return true;
}

// ------------------------------------------------------------------------- the PTX ISA's layouts
float bf16_value(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
float operand_value(Op op, std::uint16_t bits) { return op == Op::mma_bf16 ? bf16_value(bits) : float16_value(bits); }
std::uint16_t half_of(std::uint32_t word, int half) { return std::uint16_t(half ? word >> 16 : word & 0xffffu); }

// mma.m16n8k16, .bf16/.f16 (PTX ISA 9.7.13.4.8). groupID = laneid >> 2, threadID_in_group = laneid % 4.
// A: a0..a7 (a_{2r}, a_{2r+1} in register r): row = groupID for ai with i < 2 or 4 <= i < 6, else
//    groupID + 8; col = threadID_in_group * 2 + (i & 1) for i < 4, else + 8.
// B: b0..b3 (b_{2r}, b_{2r+1} in register r): row = threadID_in_group * 2 + (i & 1) for i < 2,
//    else + 8; col = groupID.
// C, D: c0..c3: row = groupID for i < 2, else groupID + 8; col = threadID_in_group * 2 + (i & 1).
void ptx_a_element(int lane, int i, int& row, int& col) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  row = (i < 2 || (4 <= i && i < 6)) ? group : group + 8;
  col = thread_in_group * 2 + (i & 1) + (i < 4 ? 0 : 8);
}
void ptx_b_element(int lane, int i, int& row, int& col) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  row = thread_in_group * 2 + (i & 1) + (i < 2 ? 0 : 8);
  col = group;
}
void ptx_c_element(int lane, int i, int& row, int& col) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  row = i < 2 ? group : group + 8;
  col = thread_in_group * 2 + (i & 1);
}

// mma.m16n8k8, .tf32 (PTX ISA 9.7.13.4.7): one value a register.
// A: a0..a3: row = groupID for a0 and a2, else groupID + 8; col = threadID_in_group for a0 and a1,
//    else threadID_in_group + 4.
// B: b0, b1: row = threadID_in_group for b0, threadID_in_group + 4 for b1; col = groupID.
// C, D: as m16n8k16.
void ptx_tf32_a_element(int lane, int i, int& row, int& col) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  row = (i == 0 || i == 2) ? group : group + 8;
  col = i < 2 ? thread_in_group : thread_in_group + 4;
}
void ptx_tf32_b_element(int lane, int i, int& row, int& col) {
  const int group = lane >> 2, thread_in_group = lane % 4;
  row = i == 0 ? thread_in_group : thread_in_group + 4;
  col = group;
}

// A TF32 operand register's value; one with any of the 13 low bits set was not rounded to TF32
// (cvt.rna.tf32.f32) and is reported.
float tf32_value(std::uint32_t word, int lane, const char* operand, int i) {
  if (word & 0x1fffu)
    fail("mma.m16n8k8.tf32: lane %d's %s%d is 0x%08x, not a TF32 value (low 13 bits set; round it with "
         "cvt.rna.tf32.f32)",
         lane, operand, i, word);
  float x;
  std::memcpy(&x, &word, sizeof x);
  return x;
}

// D = A B + C for the warp: the operands gathered from the lanes' registers by the tables above
// (A 16 x k, B k x 8; k = 16 for .bf16/.f16, 8 for .tf32), the products (exact in double: 16-bit
// and TF32 significands have at most 11 bits) summed in double, rounded once at the end.
void execute_mma(WarpState& w) {
  const bool tf32 = w.op == Op::mma_tf32;
  const int k = tf32 ? 8 : 16;
  float a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < warp_size; ++lane) {
    const LaneSlot& s = w.lanes[lane];
    int row, col;
    if (tf32) {
      for (int i = 0; i < 4; ++i) {
        ptx_tf32_a_element(lane, i, row, col);
        a[row][col] = tf32_value(s.a[i], lane, "a", i);
      }
      for (int i = 0; i < 2; ++i) {
        ptx_tf32_b_element(lane, i, row, col);
        b[row][col] = tf32_value(s.b[i], lane, "b", i);
      }
    } else {
      for (int i = 0; i < 8; ++i) {
        ptx_a_element(lane, i, row, col);
        a[row][col] = operand_value(w.op, half_of(s.a[i / 2], i % 2));
      }
      for (int i = 0; i < 4; ++i) {
        ptx_b_element(lane, i, row, col);
        b[row][col] = operand_value(w.op, half_of(s.b[i / 2], i % 2));
      }
    }
    for (int i = 0; i < 4; ++i) {
      ptx_c_element(lane, i, row, col);
      c[row][col] = s.c[i];
    }
  }
  for (int lane = 0; lane < warp_size; ++lane)
    for (int i = 0; i < 4; ++i) {
      int row, col;
      ptx_c_element(lane, i, row, col);
      double sum = c[row][col];
      for (int kk = 0; kk < k; ++kk) sum += double(a[row][kk]) * double(b[kk][col]);
      w.lanes[lane].out_c[i] = float(sum);
    }
  ++totals.mma;
}

// ldmatrix.m8n8.x4.b16 (PTX ISA 9.7.13.4.15): threads 0-7, 8-15, 16-23, 24-31 give the addresses of
// the rows of matrices 0-3; register j of thread laneid receives matrix j's row laneid / 4, elements
// 2 (laneid % 4) and 2 (laneid % 4) + 1; .trans loads each matrix in column-major order, so the
// thread receives elements (rows) 2 (laneid % 4) and 2 (laneid % 4) + 1 of column laneid / 4.
// A matrix is read in one shared-memory wavefront when its 8 rows of 16 bytes fall into distinct
// banks; each bank that holds k distinct words costs k wavefronts.
void execute_ldmatrix(WarpState& w, int first_thread) {
  const bool trans = w.op == Op::ldmatrix_trans;
  Cta& c = cta();
  std::size_t offsets[warp_size];
  for (int lane = 0; lane < warp_size; ++lane) offsets[lane] = shared_offset(w.lanes[lane].row, 16, 16, name(w.op));
  for (int lane = 0; lane < warp_size; ++lane) check_read(offsets[lane], 16, first_thread + lane, name(w.op));
  for (int j = 0; j < 4; ++j) {
    std::size_t words_of_bank[32][8];
    int count[32] = {}, wavefronts = 1;
    for (int r = 0; r < 8; ++r) {
      const std::size_t first = std::size_t(w.lanes[8 * j + r].row - c.shared) / 4;
      for (std::size_t word = first; word < first + 4; ++word) {
        const int bank = int(word % 32);
        bool seen = false;
        for (int n = 0; n < count[bank]; ++n) seen = seen || words_of_bank[bank][n] == word;
        if (!seen) words_of_bank[bank][count[bank]++] = word;
        if (count[bank] > wavefronts) wavefronts = count[bank];
      }
    }
    totals.ldmatrix_conflict_wavefronts += wavefronts - 1;
  }
  for (int lane = 0; lane < warp_size; ++lane)
    for (int j = 0; j < 4; ++j) {
      std::uint16_t lo, hi;
      if (!trans) {
        const char* row = w.lanes[8 * j + lane / 4].row;
        std::memcpy(&lo, row + 2 * (2 * (lane % 4)), 2);
        std::memcpy(&hi, row + 2 * (2 * (lane % 4) + 1), 2);
      } else {
        std::memcpy(&lo, w.lanes[8 * j + 2 * (lane % 4)].row + 2 * (lane / 4), 2);
        std::memcpy(&hi, w.lanes[8 * j + 2 * (lane % 4) + 1].row + 2 * (lane / 4), 2);
      }
      w.lanes[lane].out[j] = std::uint32_t(lo) | std::uint32_t(hi) << 16;
    }
  ++totals.ldmatrix;
}

// Lane 0's value to every lane; the programs take it as the warp's, so the lanes must agree.
void execute_uniform(WarpState& w) {
  for (int lane = 0; lane < warp_size; ++lane) {
    if (w.lanes[lane].word != w.lanes[0].word)
      fail("lane %d gives %d where lane 0 gives %d to a value the program takes as the warp's (shfl.sync.idx)", lane,
           w.lanes[lane].word, w.lanes[0].word);
    w.lanes[lane].out_word = w.lanes[0].word;
  }
  ++totals.shuffles;
}

void execute_shfl(WarpState& w) {
  for (int lane = 0; lane < warp_size; ++lane) {
    const int source = lane ^ w.lanes[lane].lane_mask;
    if (source < 0 || source >= warp_size) fail("shfl_xor with lane mask %d", w.lanes[lane].lane_mask);
    w.lanes[lane].out_value = w.lanes[source].value;
  }
  ++totals.shuffles;
}

// Arrives at a collective of the warp with this lane's inputs in its slot (filled by `fill`);
// the last lane to arrive computes it; returns this lane's slot with the outputs.
template <class Fill>
LaneSlot& collective(Op op, const Fill& fill) {
  Cta& c = cta();
  Fiber& f = fiber();
  const int warp = warp_of(f.thread), lane = f.thread % warp_size;
  WarpState& w = c.warps[warp];
  if (w.arrived == 0)
    w.op = op;
  else if (w.op != op)
    fail("reaches %s while lanes of warp %d wait at %s: the warp diverged at a collective", name(op), warp,
         name(w.op));
  LaneSlot& slot = w.lanes[lane];
  fill(slot);
  const unsigned seen = w.generation;
  if (++w.arrived == warp_size) {
    switch (op) {
      case Op::shfl: execute_shfl(w); break;
      case Op::uniform: execute_uniform(w); break;
      case Op::ldmatrix:
      case Op::ldmatrix_trans: execute_ldmatrix(w, warp * warp_size); break;
      case Op::mma_bf16:
      case Op::mma_f16:
      case Op::mma_tf32: execute_mma(w); break;
      case Op::sync_warp: ++w.syncs; break;
    }
    w.arrived = 0;
    ++w.generation;
  } else {
    block_until_changed(&w.generation, seen, name(op));
  }
  return slot;
}

// ------------------------------------------------------------------------- wgmma (sm_90a)
// wgmma.m64nNk16 with 16-bit A and B (PTX ISA 9.7.15.5.1): thread t of the warpgroup is lane
// t % 32 of warp w = t / 32, groupID = lane >> 2, threadID_in_group = lane % 4.
// D: d_i at row 16 w + groupID + 8 ((i % 4) >= 2), col 8 (i / 4) + 2 threadID_in_group + i % 2.
// A in registers: a_i (a_{2r}, a_{2r+1} in register r) at row 16 w + groupID + 8 ((i % 4) >= 2),
//    col 2 threadID_in_group + i % 2 + 8 (i >= 4).
void wgmma_d_element(int thread, int i, int& row, int& col) {
  const int warp = thread / warp_size, lane = thread % warp_size;
  row = 16 * warp + (lane >> 2) + 8 * ((i % 4) >= 2 ? 1 : 0);
  col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
}
void wgmma_a_element(int thread, int i, int& row, int& col) {
  const int warp = thread / warp_size, lane = thread % warp_size;
  row = 16 * warp + (lane >> 2) + 8 * ((i % 4) >= 2 ? 1 : 0);
  col = 2 * (lane % 4) + i % 2 + 8 * (i >= 4 ? 1 : 0);
}

// The shared-memory byte offset of element (mn, k) of an operand by its matrix descriptor (PTX ISA
// 9.7.15.5.1.2): start address (bits 0-13), leading dimension byte offset (16-29) and stride
// dimension byte offset (32-45), each >> 4; base offset (49-51); swizzle (62-63: 1 = 128 bytes).
// The 128-byte swizzle's canonical layouts, 16-bit values (T = 8 values, 16 bytes):
//   K-major   ((8, m), (T, 2k)) : ((8T, SBO), (1, T)): rows of 128 bytes, 8-row groups SBO apart
//   MN-major  ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO)): 64 MN values a 128-byte row, rows
//             by k, 64-value column groups LBO apart, 8-k groups SBO apart
// and the address swizzled at the end: bits 4-6 XOR bits 7-9.
std::size_t operand_offset(std::uint64_t descriptor, int mn, int k, bool mn_major) {
  const std::size_t start = std::size_t(descriptor & 0x3fffu) << 4;
  const std::size_t leading = std::size_t(descriptor >> 16 & 0x3fffu) << 4;
  const std::size_t stride = std::size_t(descriptor >> 32 & 0x3fffu) << 4;
  const unsigned base_offset = unsigned(descriptor >> 49 & 7u), layout = unsigned(descriptor >> 62);
  if (layout != 1 || base_offset != 0)
    fail("wgmma descriptor 0x%016llx: layout %u, base offset %u (emulated: the 128-byte swizzle, base offset 0)",
         static_cast<unsigned long long>(descriptor), layout, base_offset);
  const std::size_t linear = mn_major ? start + leading * std::size_t(mn / 64) + stride * std::size_t(k / 8) +
                                            128 * std::size_t(k % 8) + 2 * std::size_t(mn % 64)
                                      : start + stride * std::size_t(mn / 8) + 128 * std::size_t(mn % 8) +
                                            2 * std::size_t(k);
  return linear ^ ((linear >> 7 & 7u) << 4);
}

// One 16-bit operand value that wgmma reads from shared memory, with the checks of a read (and
// that the writer fenced the async proxy).
float wgmma_shared_value(Operand type, std::size_t offset, int first_thread) {
  Cta& c = cta();
  if (offset + 2 > c.shared_bytes)
    fail("wgmma reads shared offset %zu, outside the CTA's %zu bytes", offset, c.shared_bytes);
  check_read(offset, 2, first_thread, "wgmma.mma_async");
  const Word& word = c.words[offset / 4];
  if (word.unfenced >= 0)
    fail("wgmma.mma_async reads shared offset %zu, written by thread %d through the generic proxy with no "
         "fence.proxy.async of that thread since",
         offset, word.unfenced);
  std::uint16_t bits;
  std::memcpy(&bits, c.shared + offset, 2);
  return type == Operand::bf16 ? bf16_value(bits) : float16_value(bits);
}

// Counts the shared-memory words a wgmma reads as read by a wgmma waiting to run: delta 1 as it is
// issued, -1 as it runs (a TMA copy must not land on them in between).
void count_wgmma_reads(const Wgmma& g, int delta) {
  Cta& c = cta();
  const auto count = [&](std::size_t offset) {
    if (offset + 2 <= c.shared_bytes) c.words[offset / 4].wgmma_readers += delta;
  };
  if (!g.a_in_registers)
    for (int row = 0; row < 64; ++row)
      for (int k = 0; k < 16; ++k) count(operand_offset(g.a_descriptor, row, k, false));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < g.n; ++n) count(operand_offset(g.b_descriptor, n, k, g.b_transposed));
}

// D = A B + D for the warpgroup: 64 x 16 A and 16 x N B gathered by the tables above, products
// summed in double and rounded once, as execute_mma.
void execute_wgmma(const Wgmma& g, int first_thread) {
  static thread_local std::vector<float> a(64 * 16), b(16 * 256);
  for (int t = 0; t < warpgroup_size; ++t) {
    if (g.a_in_registers)
      for (int i = 0; i < 8; ++i) {
        int row, col;
        wgmma_a_element(t, i, row, col);
        const std::uint16_t bits = half_of(g.a[t][i / 2], i % 2);
        a[std::size_t(16 * row + col)] = g.type == Operand::bf16 ? bf16_value(bits) : float16_value(bits);
      }
  }
  if (!g.a_in_registers)
    for (int row = 0; row < 64; ++row)
      for (int k = 0; k < 16; ++k)
        a[std::size_t(16 * row + k)] =
            wgmma_shared_value(g.type, operand_offset(g.a_descriptor, row, k, false), first_thread);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < g.n; ++n)
      b[std::size_t(256 * k + n)] =
          wgmma_shared_value(g.type, operand_offset(g.b_descriptor, n, k, g.b_transposed), first_thread);
  for (int t = 0; t < warpgroup_size; ++t)
    for (int i = 0; i < g.n / 2; ++i) {
      int row, col;
      wgmma_d_element(t, i, row, col);
      double sum = g.d[t][i];
      for (int k = 0; k < 16; ++k) sum += double(a[std::size_t(16 * row + k)]) * double(b[std::size_t(256 * k + col)]);
      g.d[t][i] = float(sum);
    }
  ++totals.wgmma;
}

// Arrives at a collective of the warpgroup (its 128 threads) with `fill` applied to its state by
// each thread; the last to arrive runs `complete`.
template <class Fill, class Complete>
void warpgroup_collective(GroupOp op, const Fill& fill, const Complete& complete) {
  Cta& c = cta();
  Fiber& f = fiber();
  const int group = f.thread / warpgroup_size;
  if (std::size_t(group) >= c.warpgroups.size())
    fail("reaches %s outside the whole warpgroups of a CTA of %d threads", name(op), c.threads);
  WarpgroupState& g = c.warpgroups[std::size_t(group)];
  if (g.arrived == 0)
    g.op = op;
  else if (g.op != op)
    fail("reaches %s while threads of warpgroup %d wait at %s: the warpgroup diverged", name(op), group, name(g.op));
  fill(g, f.thread % warpgroup_size);
  const unsigned seen = g.generation;
  if (++g.arrived == warpgroup_size) {
    complete(g, group * warpgroup_size);
    g.arrived = 0;
    ++g.generation;
  } else {
    block_until_changed(&g.generation, seen, name(op));
  }
}

void fiber_main() {
  Cta& c = cta();
  Fiber& f = fiber();
  finish_switch(nullptr, &c.scheduler_stack, &c.scheduler_stack_size);
  c.body(c.program, c.index, c.shared);
  if (!f.in_flight.empty()) fail("finishes with %zu cp.async copies never waited for", f.in_flight.size());
  if (c.barrier_arrived > 0) fail("finishes while %d threads wait at a CTA barrier", c.barrier_arrived);
  if (c.warps[warp_of(f.thread)].arrived > 0)
    fail("finishes while lanes of its warp wait at %s", name(c.warps[warp_of(f.thread)].op));
  if (std::size_t(f.thread / warpgroup_size) < c.warpgroups.size()) {
    const WarpgroupState& g = c.warpgroups[std::size_t(f.thread / warpgroup_size)];
    if (!g.open.empty() || !g.committed.empty())
      fail("finishes with wgmma.mma_async of its warpgroup never waited for (wgmma.wait_group)");
  }
  f.finished = true;
  ++c.finished;
  yield(true);
  std::abort();  // a finished fiber is never resumed
}

void resume(Cta& c, Fiber& f) {
  c.current = &f;
  f.wait_generation = nullptr;
  start_switch(&c.scheduler_fake_stack, f.stack, stack_bytes);
  switch_context(c.scheduler, f.context);
  finish_switch(c.scheduler_fake_stack, nullptr, nullptr);
}

// The registers a thread has at launch where a CTA of `threads` runs alone on an SM: each of the
// SM's four sub-partitions holds 16K registers (64K in all) and every fourth warp of the CTA, so
// the sub-partition with the most warps bounds them (a multiple of 8, at most 255: 168 at 9-12
// warps, 224 would need 8 at most).
int launch_registers(int threads) {
  const int warps_per_partition = (threads / warp_size + 3) / 4;
  return std::min(255 / 8 * 8, register_file / 4 / (warp_size * warps_per_partition) / 8 * 8);
}

void run_cta(Cta& c) {
  std::vector<Fiber>& fibers = *c.fibers;
  for (int t = 0; t < c.threads; ++t) {
    Fiber& f = fibers[t];
    f.thread = t;
    f.finished = false;
    f.wait_generation = nullptr;
    f.in_flight.clear();
    f.unfenced.clear();
    f.observed.clear();
    f.fake_stack = nullptr;
    f.stack = stacks.get(std::size_t(t));
    unpoison(f.stack, stack_bytes);
    make_context(f.context, f.stack, stack_bytes, fiber_main);
  }
  // The pool may hold more fibers than this grid's threads (left by a larger or failed grid):
  // only the first c.threads belong to it.
  Fiber* const first = fibers.data();
  Fiber* const last = first + c.threads;
  while (c.finished < c.threads && !c.failed) {
    bool ran = false;
    for (Fiber* f = first; f != last; ++f) {
      if (f->finished || (f->wait_generation != nullptr && *f->wait_generation == f->wait_seen)) continue;
      resume(c, *f);
      ran = true;
      if (c.failed) return;
    }
    if (!ran && !c.tma_in_flight.empty()) {  // the copies land as late as they may: now
      const TmaCopy copy = c.tma_in_flight.front();
      c.tma_in_flight.pop_front();
      if (!land_tma(c, copy)) return;
      continue;
    }
    if (!ran) {  // every unfinished thread waits for one that never comes
      int shown = std::snprintf(c.message, sizeof c.message,
                                "longattn tensor-core emulator: CTA %d deadlocks; waiting:", c.index);
      for (const Fiber* f = first; f != last; ++f)
        if (!f->finished && shown < int(sizeof c.message) - 64)
          shown += std::snprintf(c.message + shown, sizeof c.message - shown, " thread %d at %s;", f->thread,
                                 f->waiting_at);
      c.failed = true;
      return;
    }
  }
  if (!c.failed && !c.tma_in_flight.empty())
    record_failure(c, c.tma_in_flight.front().thread, "finishes with %zu TMA copies in flight, never waited for",
                   c.tma_in_flight.size());
  for (int id = 1; id < named_barrier_ids && !c.failed; ++id)
    if (c.named[id].arrived > 0)
      record_failure(c, c.threads - 1, "ends with named barrier %d holding %d of its phase's %d arrivals", id,
                     c.named[id].arrived, c.named[id].threads);
}

}  // namespace

void Emulator::run(const void* program, Body body, int ctas, int threads, std::size_t shared_bytes) {
  const char* where = "longattn::detail::tensor_core::Emulator::run";
  require(threads > 0 && threads % warp_size == 0 && threads <= 1024, where, "threads", threads,
          "a multiple of 32 in [32, 1024]");
  require(shared_bytes <= shared_limit, where, "shared_bytes", shared_bytes, "at most 227 KiB (an H100's limit)");
  require(ctas >= 0, where, "ctas", ctas, "a count >= 0");
  require(active == nullptr, where, "program", "an emulation inside an emulation", "one grid at a time per thread");
  if (ctas == 0) return;
  // Shared memory starts as 0xff bytes (16-bit NaNs): reading what nothing wrote is also reported.
  const std::size_t allocated = (shared_bytes + 127) / 128 * 128 + 128;
  std::unique_ptr<char, void (*)(void*)> shared(static_cast<char*>(std::aligned_alloc(128, allocated)), std::free);
  if (fiber_pool.size() < std::size_t(threads)) fiber_pool.resize(std::size_t(threads));
  Cta c;
  c.threads = threads;
  c.shared = shared.get();
  c.shared_bytes = shared_bytes;
  c.fibers = &fiber_pool;
  c.program = program;
  c.body = body;
  c.warps.resize(std::size_t(threads / warp_size));
  c.warpgroups.resize(std::size_t(threads / warpgroup_size));
  active = &c;
  for (int cta = 0; cta < ctas && !c.failed; ++cta) {
    c.index = cta;
    c.finished = 0;
    c.barrier_arrived = 0;
    c.epoch = 0;
    for (WarpState& w : c.warps) w.arrived = 0;
    for (WarpgroupState& g : c.warpgroups) g = WarpgroupState{};
    for (WarpgroupState& g : c.warpgroups) g.registers = launch_registers(threads);
    for (NamedBarrier& b : c.named) b = NamedBarrier{0, 0, 0, std::vector<bool>(std::size_t(threads), false)};
    c.mbarriers.clear();
    c.tma_in_flight.clear();
    c.tma_lands_late = cta % 2 == 1;
    c.words.assign((shared_bytes + 3) / 4, Word{});
    std::memset(c.shared, 0xff, allocated);
    run_cta(c);
    ++totals.ctas;
  }
  active = nullptr;
  if (c.failed) throw Error(c.message);
}

EmulationCounters Emulator::counters() { return totals; }
void Emulator::reset_counters() { totals = EmulationCounters{}; }

namespace emulation {

int thread() { return fiber().thread; }

void sync_cta() {
  Cta& c = cta();
  if (c.finished > 0) fail("reaches a CTA barrier after %d threads finished", c.finished);
  const unsigned seen = c.barrier_generation;
  if (++c.barrier_arrived == c.threads) {
    c.barrier_arrived = 0;
    ++c.barrier_generation;
    ++c.epoch;
    ++totals.barriers;
  } else {
    block_until_changed(&c.barrier_generation, seen, "a CTA barrier");
  }
}

// bar.sync / bar.arrive id, threads: whole warps arrive (the .aligned forms: every lane executes
// it), the phase completes at `threads` arrivals.
void named_barrier(int id, int threads, bool wait) {
  Cta& c = cta();
  Fiber& f = fiber();
  const char* what = wait ? "bar.sync" : "bar.arrive";
  if (id < 1 || id >= named_barrier_ids) fail("%s %d: named barriers are 1-15 (0 is the CTA barrier's)", what, id);
  if (threads < warp_size || threads % warp_size != 0 || threads > c.threads)
    fail("%s %d with %d threads: a multiple of 32 up to the CTA's %d", what, id, threads, c.threads);
  NamedBarrier& b = c.named[id];
  if (b.arrived > 0 && b.threads != threads)
    fail("%s %d with %d threads where its phase's other arrivals said %d", what, id, threads, b.threads);
  if (b.in_phase[std::size_t(f.thread)])
    fail("%s %d: the thread arrives twice in one phase (%d of %d arrived)", what, id, b.arrived, threads);
  b.threads = threads;
  b.in_phase[std::size_t(f.thread)] = true;
  const unsigned seen = b.generation;
  if (++b.arrived == threads) {
    for (int w = 0; w < c.threads / warp_size; ++w) {
      int lanes = 0;
      for (int lane = 0; lane < warp_size; ++lane) lanes += b.in_phase[std::size_t(w * warp_size + lane)] ? 1 : 0;
      if (lanes != 0 && lanes != warp_size)
        fail("%s %d completes with %d of warp %d's lanes (whole warps arrive)", what, id, lanes, w);
    }
    std::fill(b.in_phase.begin(), b.in_phase.end(), false);
    b.arrived = 0;
    ++b.generation;
    ++totals.named_barriers;
  } else if (wait) {
    block_until_changed(&b.generation, seen, "a named barrier");
  }
}

void sync_warp() {
  collective(Op::sync_warp, [](LaneSlot&) {});
}

float shfl_xor(float value, int lane_mask) {
  return collective(Op::shfl, [&](LaneSlot& s) {
           s.value = value;
           s.lane_mask = lane_mask;
         }).out_value;
}

int uniform(int value) {
  return collective(Op::uniform, [&](LaneSlot& slot) { slot.word = value; }).out_word;
}

void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans) {
  const LaneSlot& s = collective(trans ? Op::ldmatrix_trans : Op::ldmatrix,
                                 [&](LaneSlot& slot) { slot.row = static_cast<const char*>(row); });
  for (int j = 0; j < 4; ++j) r[j] = s.out[j];
}

void mma(Operand type, float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  const Op op = type == Operand::bf16 ? Op::mma_bf16 : type == Operand::f16 ? Op::mma_f16 : Op::mma_tf32;
  const LaneSlot& s = collective(op, [&](LaneSlot& slot) {
    for (int r = 0; r < 4; ++r) slot.a[r] = a[r];
    slot.b[0] = b0;
    slot.b[1] = b1;
    for (int i = 0; i < 4; ++i) slot.c[i] = d[i];
  });
  for (int i = 0; i < 4; ++i) d[i] = s.out_c[i];
}

void cp_async_16(void* shared, const void* global, bool fill) {
  Fiber& f = fiber();
  const std::size_t offset = shared_offset(shared, 16, 16, "cp.async");
  if (fill && reinterpret_cast<std::uintptr_t>(global) % 16 != 0)
    fail("cp.async from global address %p, not aligned to 16 bytes", global);
  check_write(offset, 16, f.thread, "cp.async", true);
  f.in_flight.push_back({static_cast<char*>(shared), static_cast<const char*>(global), fill});
  ++totals.cp_async;
}

void cp_async_wait_all() { land_copies(fiber()); }

void atomic_add_pair(float* global, float x, float y) {
  if (reinterpret_cast<std::uintptr_t>(global) % 8 != 0)
    fail("red.global.add.v2.f32 at %p, not aligned to 8 bytes", static_cast<void*>(global));
  global[0] += x;
  global[1] += y;
  ++totals.atomics;
}

// cvt.rna.tf32.f32: the 13 low bits dropped, the magnitude rounded to nearest with ties away from
// zero (adding half of the dropped range carries into the kept bits); infinities stay, NaNs stay NaNs.
std::uint32_t tf32(float x) {
  std::uint32_t word;
  std::memcpy(&word, &x, sizeof word);
  if ((word & 0x7f800000u) == 0x7f800000u) return (word & 0x007fffffu) != 0 ? 0x7fffe000u : word;
  return (word + 0x1000u) & ~0x1fffu;
}

float exp2(float x) {
  const float y = std::exp2(x);
  return y < std::numeric_limits<float>::min() ? 0.0f : y;  // .ftz: subnormal results flush to zero
}

std::uint32_t shared_address(const void* address) {
  Cta& c = cta();
  const char* p = static_cast<const char*>(address);
  if (p < c.shared || p > c.shared + c.shared_bytes)
    fail("cvta.to.shared of %p, outside the CTA's shared memory at %p", address, static_cast<const void*>(c.shared));
  return std::uint32_t(p - c.shared);
}

void wgmma(Operand type, int n, float* d, const std::uint32_t* a, std::uint64_t a_descriptor,
           std::uint64_t b_descriptor, bool b_transposed) {
  warpgroup_collective(
      GroupOp::wgmma,
      [&](WarpgroupState& g, int t) {
        Wgmma& w = g.issuing;
        if (t == 0 || g.arrived == 0) {
          w.type = type;
          w.n = n;
          w.a_in_registers = a != nullptr;
          w.b_transposed = b_transposed;
          w.a_descriptor = a_descriptor;
          w.b_descriptor = b_descriptor;
        } else if (w.type != type || w.n != n || w.a_in_registers != (a != nullptr) || w.b_transposed != b_transposed ||
                   w.a_descriptor != a_descriptor || w.b_descriptor != b_descriptor) {
          fail("gives wgmma.mma_async operands (shape, type or descriptors) that differ from its warpgroup's");
        }
        w.d[t] = d;
        for (int r = 0; r < 4; ++r) w.a[t][r] = a != nullptr ? a[r] : 0u;
      },
      [](WarpgroupState& g, int) {
        if (!g.fenced) fail("issues wgmma.mma_async with no wgmma.fence since its warpgroup last waited");
        g.open.push_back(g.issuing);
        count_wgmma_reads(g.issuing, 1);
      });
}

void wgmma_fence() {
  warpgroup_collective(GroupOp::fence, [](WarpgroupState&, int) {}, [](WarpgroupState& g, int) { g.fenced = true; });
}

void wgmma_commit() {
  warpgroup_collective(GroupOp::commit, [](WarpgroupState&, int) {}, [](WarpgroupState& g, int) {
    g.committed.push_back(std::move(g.open));
    g.open.clear();
  });
}

// wgmma.wait_group N: the committed groups but the N latest compute, in order.
void wgmma_wait(int pending) {
  warpgroup_collective(GroupOp::wait, [](WarpgroupState&, int) {}, [pending](WarpgroupState& g, int first_thread) {
    if (!g.open.empty()) fail("waits (wgmma.wait_group %d) with wgmma.mma_async not committed", pending);
    while (int(g.committed.size()) > pending) {
      for (const Wgmma& w : g.committed.front()) {
        count_wgmma_reads(w, -1);
        execute_wgmma(w, first_thread);
      }
      g.committed.pop_front();
    }
    g.fenced = false;
  });
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 (PTX ISA, setmaxnreg): the warpgroup's threads ask for
// `registers` each (24-256, a multiple of 8; inc: at least, dec: at most what they have). The
// registers of a sub-partition (a quarter of the SM's, one warp of each warpgroup) are shared, so
// an increase waits until the warpgroups' sum fits them: until others decreased.
void setmaxnreg(int registers, bool increase) {
  warpgroup_collective(
      GroupOp::setmaxnreg,
      [&](WarpgroupState& g, int t) {
        if (t == 0 || g.arrived == 0) {
          g.asked_registers = registers;
          g.asked_increase = increase;
        } else if (g.asked_registers != registers || g.asked_increase != int(increase)) {
          fail("gives setmaxnreg operands that differ from its warpgroup's");
        }
      },
      [&](WarpgroupState& g, int) {
        const char* what = increase ? "setmaxnreg.inc" : "setmaxnreg.dec";
        if (registers < 24 || registers > 256 || registers % 8 != 0)
          fail("%s %d: 24-256 registers, a multiple of 8", what, registers);
        if (increase ? registers < g.registers : registers > g.registers)
          fail("%s %d where the warpgroup's threads have %d registers", what, registers, g.registers);
        Cta& c = cta();
        const auto others = [&] {
          int sum = 0;
          for (const WarpgroupState& other : c.warpgroups) sum += &other == &g ? 0 : other.registers;
          return sum;
        };
        while (increase && warp_size * (others() + registers) > register_file / 4)
          block_until_changed(&c.register_generation, c.register_generation,
                              "setmaxnreg.inc (the registers it asks for are not free)");
        g.registers = registers;
        if (!increase) ++c.register_generation;
        ++totals.setmaxnreg;
      });
}

void fence_proxy_async() {
  Cta& c = cta();
  Fiber& f = fiber();
  for (std::size_t w : f.unfenced)
    if (c.words[w].unfenced == f.thread) c.words[w].unfenced = -1;
  f.unfenced.clear();
}

void store_shared(void* address, const void* value, std::size_t bytes) {
  const std::size_t offset = shared_offset(address, bytes, bytes, "a shared-memory store");
  check_write(offset, bytes, fiber().thread, "a shared-memory store", false);
  std::memcpy(address, value, bytes);
}

void load_shared(const void* address, void* value, std::size_t bytes) {
  const std::size_t offset = shared_offset(address, bytes, bytes, "a shared-memory load");
  check_read(offset, bytes, fiber().thread, "a shared-memory load");
  std::memcpy(value, address, bytes);
}

void tma_load(void* tile, const TileMap& map, int x, int token, int head, int batch, std::uint32_t barrier) {
  Cta& c = cta();
  Fiber& f = fiber();
  const char* what = "cp.async.bulk.tensor";
  if (map.box_rows < 1 || map.box_rows > 256) fail("%s with a box of %d rows (1-256)", what, map.box_rows);
  if (map.strides[0] != 2 || reinterpret_cast<std::uintptr_t>(map.data) % 16 != 0)
    fail("%s from a tensor map of 16-bit values not contiguous in a row, or not on 16 bytes", what);
  for (int i = 1; i < 4; ++i)
    if (map.strides[i] % 16 != 0 || map.extents[i] < 1)
      fail("%s from a tensor map whose dimension %d has extent %lld, stride %lld bytes (a multiple of 16)", what, i,
           static_cast<long long>(map.extents[i]), static_cast<long long>(map.strides[i]));
  const std::size_t bytes = 128 * std::size_t(map.box_rows);
  const std::size_t offset = shared_offset(tile, bytes, 128, what);
  const std::size_t index = mbarrier_index(barrier, what);
  for (std::size_t w = offset / 4; w < (offset + bytes) / 4; ++w) {
    Word& word = c.words[w];
    if (word.mbarrier) fail("%s writes shared offset %zu, an mbarrier's", what, w * 4);
    if (word.copying >= 0)
      fail("%s writes shared offset %zu, which a %s of thread %d in flight writes", what, w * 4,
           word.copying_tma ? "TMA copy" : "cp.async", word.copying);
    word.copying = short(f.thread);
    word.copying_tma = true;
  }
  const TmaCopy copy{static_cast<char*>(tile), map, {x, token, head, batch}, index, f.thread};
  ++totals.tma;
  if (c.tma_lands_late)
    c.tma_in_flight.push_back(copy);
  else if (!land_tma(c, copy))
    leave();
}

void mbarrier_init(std::uint32_t barrier, int arrivals) {
  Cta& c = cta();
  if (barrier % 8 != 0 || barrier + 8 > c.shared_bytes)
    fail("mbarrier.init at shared offset %u: not 8-byte aligned inside the CTA's %zu bytes", barrier, c.shared_bytes);
  if (arrivals < 1) fail("mbarrier.init with %d arrivals (at least 1)", arrivals);
  for (const Mbarrier& m : c.mbarriers)
    if (m.offset == barrier) fail("mbarrier.init at shared offset %u, an mbarrier already", barrier);
  for (std::size_t w = barrier / 4; w < barrier / 4 + 2; ++w) c.words[w].mbarrier = true;
  Mbarrier m;
  m.offset = barrier;
  m.arrivals = m.pending = arrivals;
  m.init_epoch = c.epoch;
  m.init_thread = fiber().thread;
  c.mbarriers.push_back(m);
}

void mbarrier_arrive(std::uint32_t barrier, std::uint32_t expect_bytes) {
  Mbarrier& m = cta().mbarriers[mbarrier_index(barrier, "mbarrier.arrive")];
  if (m.pending == 0)
    fail("arrives at the mbarrier at shared offset %u with none of its phase's %d arrivals pending", barrier,
         m.arrivals);
  m.bytes += expect_bytes;
  --m.pending;
  complete_phase_if_done(m);
}

// mbarrier.try_wait.parity: the phase of this parity completed when the current phase's parity
// differs from it.
void mbarrier_wait(std::uint32_t barrier, int parity) {
  Cta& c = cta();
  Fiber& f = fiber();
  const std::size_t index = mbarrier_index(barrier, "mbarrier.try_wait");
  const Mbarrier& m = c.mbarriers[index];
  while (int(m.completions % 2) == parity % 2) block_until_changed(&m.completions, m.completions, "an mbarrier wait");
  if (f.observed.size() <= index) f.observed.resize(index + 1, 0);
  f.observed[index] = m.completions;
}

}  // namespace emulation
}  // namespace longattn::detail::tensor_core
