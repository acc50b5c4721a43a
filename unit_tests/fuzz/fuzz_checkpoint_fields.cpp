// libFuzzer target, structure-aware: checkpoint files whose format is right and whose metadata
// fields are drawn by the fuzzer (each present or not, of any JSON type: integers of every sign
// and size, reals, NaN and infinity as text, strings, engine states, arrays, objects), with a
// payload whose stated size and checksum are right or wrong. The raw-bytes target
// (fuzz_checkpoint) rarely reaches a well-formed file with one bad field; this one does at
// once. Every file either reads and gives a ResumePoint inside the run (the checks the trainer
// makes before resuming: longattn::train::resume_point) or throws longattn::Error; anything
// else (a JSON type error, an allocation the file does not back) is a finding.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "longattn/error.hpp"
#include "longattn/train/checkpoint.hpp"

namespace {

// A JSON value of a type the fuzzer picks.
nlohmann::json value(FuzzedDataProvider& in, int depth = 0) {
  switch (in.ConsumeIntegralInRange(0, depth < 2 ? 11 : 9)) {
    case 0: return in.ConsumeIntegral<std::int64_t>();
    case 1: return in.ConsumeIntegralInRange<std::int64_t>(-3, 100);
    case 2: return in.ConsumeIntegral<std::uint64_t>();
    case 3: return in.ConsumeFloatingPoint<double>();
    case 4: return in.ConsumeProbability<double>() * 1e6;
    case 5: return in.ConsumeRandomLengthString(64);
    case 6: {  // an engine state, maybe cut short or edited
      std::mt19937_64 engine(in.ConsumeIntegral<std::uint64_t>());
      std::ostringstream state;
      state << engine;
      std::string text = state.str();
      text.resize(in.ConsumeIntegralInRange<std::size_t>(0, text.size()));
      return text;
    }
    case 7: return in.ConsumeBool();
    case 8: return nullptr;
    case 9: return in.PickValueInArray({"nan", "inf", "-inf", "1e400", "-0"});
    case 10: {
      nlohmann::json array = nlohmann::json::array();
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) array.push_back(value(in, depth + 1));
      return array;
    }
    default: {
      nlohmann::json object = nlohmann::json::object();
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) object[in.ConsumeRandomLengthString(8)] = value(in, depth + 1);
      return object;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/longattn-fuzz-checkpoint-fields-" + std::to_string(::getpid());
  FuzzedDataProvider in(data, size);
  const int steps = in.ConsumeIntegralInRange(1, 1000000);
  std::vector<unsigned char> payload(in.ConsumeIntegralInRange<std::size_t>(0, 256), 7);
  nlohmann::json metadata = nlohmann::json::object();
  // The fields the reader and resume_point read, each right, absent or anything.
  std::mt19937_64 engine(in.ConsumeIntegral<std::uint64_t>());
  std::ostringstream state;
  state << engine;
  const std::uint64_t checksum = longattn::train::fnv1a64(payload.data(), payload.size());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(checksum));
  const nlohmann::json right[] = {payload.size(), hex, in.ConsumeIntegralInRange(0, steps), 3, state.str(), 65536.0, 0};
  const char* keys[] = {"payload_bytes", "checksum", "step", "optimizer_steps", "rng", "loss_scale", "good_steps"};
  for (std::size_t i = 0; i < std::size(keys); ++i) {
    const int choice = in.ConsumeIntegralInRange(0, 3);  // mostly right: one bad field at a time is the case to reach
    if (choice <= 1) metadata[keys[i]] = right[i];
    else if (choice == 2) metadata[keys[i]] = value(in);
  }
  if (in.ConsumeBool()) metadata["run"] = value(in);
  // Strings of any bytes: written with U+FFFD for invalid UTF-8 (as a parser would refuse them).
  const std::string header =
      "longattn-checkpoint 1\n" + metadata.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string tail = in.ConsumeRemainingBytesAsString();  // extra bytes, or none
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << header;
    file.write(reinterpret_cast<const char*>(payload.data()), std::streamsize(payload.size()));
    file << tail;
  }
  try {
    const longattn::train::Checkpoint checkpoint = longattn::train::read_checkpoint(path);
    if (checkpoint.payload.size() > payload.size() + tail.size()) std::abort();  // more than the file holds
    const longattn::train::ResumePoint point = longattn::train::resume_point(checkpoint.metadata, steps, path);
    if (point.step < 0 || point.step > steps || point.optimizer_steps < 0 || point.good_steps < 0 ||
        !(point.loss_scale >= 0) || !std::isfinite(point.loss_scale))
      std::abort();
  } catch (const longattn::Error&) {
  }
  std::remove(path.c_str());
  return 0;
}
