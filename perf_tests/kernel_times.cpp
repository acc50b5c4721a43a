// A Kokkos Tools library that times every kernel by name, grouped by the outermost profiling
// region it ran in (longattn-train's phases: "longattn-train: forward", ...), and writes them as
// JSON when Kokkos finalizes:
//
//   export KOKKOS_PROFILE_LIBRARY=build/test/perf_tests/liblongattn_kernel_times.so
//   LONGATTN_KERNEL_TIMES=times.json longattn-train ...
//
//   {"regions": {"longattn-train: forward": {"longattn::layer_norm_forward": {"seconds": s, "calls": n}, ...}, ...}}
//
// Kernels outside every region are under "". A "%p" in the path becomes the process id (one file
// per MPI rank). The times are from a kernel's begin to its end callback: on the host backends,
// whose kernels return when done, the kernel's run time; on a GPU, only its launch (Kokkos Tools'
// own kernel timer has the same limit). write_calibration.py reads these files.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct KernelTime {
  double seconds = 0;
  long calls = 0;
};

struct OpenKernel {
  std::string name;
  Clock::time_point start;
};

std::map<std::string, std::map<std::string, KernelTime>> times;  // region -> kernel -> time
std::vector<std::string> regions;                                 // the profiling region stack
std::vector<OpenKernel> open_kernels;                             // begun, not ended (LIFO)

void begin_kernel(const char* name, std::uint64_t* id) {
  *id = open_kernels.size();
  open_kernels.push_back({name, Clock::now()});
}

void end_kernel(std::uint64_t id) {
  if (id >= open_kernels.size()) return;
  const OpenKernel& kernel = open_kernels[id];
  KernelTime& time = times[regions.empty() ? std::string() : regions.front()][kernel.name];
  time.seconds += std::chrono::duration<double>(Clock::now() - kernel.start).count();
  ++time.calls;
  open_kernels.resize(id);  // kernels end in the reverse order they begin
}

// JSON string contents: kernel names are labels, so only quotes, backslashes and control bytes need escaping.
std::string escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof(code), "\\u%04x", c);
      out += code;
    } else {
      out += c;
    }
  }
  return out;
}

std::string output_path() {
  const char* configured = std::getenv("LONGATTN_KERNEL_TIMES");
  std::string path = configured && *configured ? configured : "kernel_times.json";
  const auto at = path.find("%p");
  if (at != std::string::npos) path.replace(at, 2, std::to_string(getpid()));
  return path;
}

}  // namespace

extern "C" {

void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}

void kokkosp_finalize_library() {
  const std::string path = output_path();
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (!file) {
    std::fprintf(stderr, "longattn kernel_times: cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(file, "{\"regions\": {");
  const char* region_separator = "";
  for (const auto& [region, kernels] : times) {
    std::fprintf(file, "%s\n  \"%s\": {", region_separator, escaped(region).c_str());
    const char* separator = "";
    for (const auto& [name, time] : kernels) {
      std::fprintf(file, "%s\n    \"%s\": {\"seconds\": %.9g, \"calls\": %ld}", separator, escaped(name).c_str(),
                   time.seconds, time.calls);
      separator = ",";
    }
    std::fprintf(file, "}");
    region_separator = ",";
  }
  std::fprintf(file, "}}\n");
  std::fclose(file);
}

void kokkosp_begin_parallel_for(const char* name, std::uint32_t, std::uint64_t* id) { begin_kernel(name, id); }
void kokkosp_end_parallel_for(std::uint64_t id) { end_kernel(id); }
void kokkosp_begin_parallel_reduce(const char* name, std::uint32_t, std::uint64_t* id) { begin_kernel(name, id); }
void kokkosp_end_parallel_reduce(std::uint64_t id) { end_kernel(id); }
void kokkosp_begin_parallel_scan(const char* name, std::uint32_t, std::uint64_t* id) { begin_kernel(name, id); }
void kokkosp_end_parallel_scan(std::uint64_t id) { end_kernel(id); }
void kokkosp_push_profile_region(const char* name) { regions.emplace_back(name); }
void kokkosp_pop_profile_region() {
  if (!regions.empty()) regions.pop_back();
}

}  // extern "C"
