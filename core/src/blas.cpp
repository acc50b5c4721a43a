#include "longattn/core/blas.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "longattn/error.hpp"

namespace longattn {
namespace {

// OpenBLAS entry points, looked up at run time so that longattn links against any BLAS.
template <class Function>
Function* openblas_symbol(const char* name) {
  return reinterpret_cast<Function*>(dlsym(RTLD_DEFAULT, name));
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The ISA level an OpenBLAS x86-64 kernel set needs; -1 for names not listed here.
int kernels_isa_level(const std::string& corename) {
  const std::string c = lower(corename);
  for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == name) return 3;
  for (const char* name : {"haswell", "zen", "excavator"})
    if (c == name) return 2;
  for (const char* name : {"sandybridge", "bulldozer", "piledriver", "steamroller"})
    if (c == name) return 1;
  for (const char* name : {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                           "nano", "barcelona", "bobcat", "opteron", "opteron_sse3", "katmai",
                           "coppermine", "northwood", "banias", "athlon"})
    if (c == name) return 0;
  return -1;
}

const char* isa_name(int level) {
  switch (level) {
    case 3: return "AVX-512";
    case 2: return "AVX2";
    case 1: return "AVX";
    default: return "SSE";
  }
}

std::string current_kernels() {
  auto* corename = openblas_symbol<char*()>("openblas_get_corename");
  return corename ? std::string(corename()) : std::string();
}

bool has_runtime_selection() {
  return openblas_symbol<void()>("gotoblas_dynamic_quit") && openblas_symbol<void()>("gotoblas_dynamic_init") &&
         !current_kernels().empty();
}

std::string& selection_note() {
  static std::string note = "the BLAS library's own (longattn::select_blas_kernels() not called)";
  return note;
}

void select_once() {
  std::string& note = selection_note();
  if (!has_runtime_selection()) {
    note = "the BLAS library's own (not an OpenBLAS with runtime kernel selection)";
    return;
  }
  const std::string picked = current_kernels();
  const int cpu = detail::cpu_isa_level();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced) {
    note = std::string("OPENBLAS_CORETYPE=") + forced + " from the environment";
    const std::string better = detail::kernels_to_select(picked, cpu, false);
    if (!better.empty()) note += " (this CPU has " + std::string(isa_name(cpu)) + ": unset it for " + better + ")";
    return;
  }
  const std::string wanted = detail::kernels_to_select(picked, cpu, false);
  if (wanted.empty()) {
    note = "OpenBLAS's own detection";
    return;
  }
  const std::string now = detail::switch_openblas_kernels(wanted);
  note = lower(now) == lower(wanted)
             ? "switched by longattn from " + picked + " (OpenBLAS misdetected this " + isa_name(cpu) + " CPU)"
             : "OpenBLAS refused " + wanted + "; " + now + " in use (misdetected " + isa_name(cpu) + " CPU)";
}

}  // namespace

namespace detail {

int cpu_isa_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
  return 0;
#else
  return -1;
#endif
}

std::string kernels_to_select(const std::string& picked, int cpu_isa_level, bool user_forced) {
  const int have = kernels_isa_level(picked);
  if (user_forced || have < 0 || cpu_isa_level < 0 || have >= cpu_isa_level) return "";
  switch (cpu_isa_level) {
    case 3: return "SkylakeX";
    case 2: return "Haswell";
    case 1: return "Sandybridge";
    default: return "";
  }
}

std::string switch_openblas_kernels(const std::string& name) {
  require(!name.empty(), "longattn::detail::switch_openblas_kernels", "name", "\"\"",
          "an OpenBLAS kernel set such as \"SkylakeX\"");
  if (!has_runtime_selection()) return "";
  // OpenBLAS reads OPENBLAS_CORETYPE whenever it (re)initializes its kernel table.
  setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
  openblas_symbol<void()>("gotoblas_dynamic_quit")();
  openblas_symbol<void()>("gotoblas_dynamic_init")();
  return current_kernels();
}

}  // namespace detail

void select_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, select_once);
}

BlasRuntime blas_runtime() {
  BlasRuntime r;
  auto* config = openblas_symbol<char*()>("openblas_get_config");
  auto* threads = openblas_symbol<int()>("openblas_get_num_threads");
  r.library = config ? std::string(config()) : std::string("BLAS (not OpenBLAS)");
  r.kernels = current_kernels();
  r.selection = selection_note();
  r.threads = threads ? threads() : 0;
  return r;
}

void set_blas_threads(int threads) {
  require(threads >= 1, "longattn::set_blas_threads", "threads", threads, "at least 1");
  if (auto* set = openblas_symbol<void(int)>("openblas_set_num_threads")) set(threads);
}

}  // namespace longattn
