// libFuzzer target: longattn-train's checkpoint reader. Any file either reads (magic line,
// metadata, a payload of the size and checksum it states) or throws longattn::Error; nothing
// it states sizes an allocation beyond the file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "longattn/error.hpp"
#include "longattn/train/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/longattn-fuzz-checkpoint-" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  try {
    const longattn::train::Checkpoint checkpoint = longattn::train::read_checkpoint(path);
    if (checkpoint.payload.size() > size) std::abort();
  } catch (const longattn::Error&) {
  }
  std::remove(path.c_str());
  return 0;
}
