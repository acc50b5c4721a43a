// libFuzzer target: the apps' JSON config files (--config FILE of longattn-train and
// longattn-plan: apps/common/include/longattn/apps/cli_config.hpp), read into a command line of
// the kinds of options the apps have (integers, reals, text, flags, repeated options, an
// attention spec parsed at the edge). Any file either parses or is refused with longattn::Error
// or CLI11's parse error.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "longattn/apps/cli_config.hpp"
#include "longattn/core/attention_spec.hpp"
#include "longattn/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/longattn-fuzz-config-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  CLI::App app{"fuzz"};
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  int layers = 4;
  std::int64_t context = 256;
  double lr = 1e-3;
  std::string attention = "dense", task = "text";
  bool resume = false;
  std::vector<std::string> gpus;
  app.add_option("--config", path);
  app.add_option("--layers", layers);
  app.add_option("--context", context);
  app.add_option("--lr", lr);
  app.add_option("--attention", attention);
  app.add_option("--task", task)->check(CLI::IsMember({"text", "long_range"}));
  app.add_flag("--resume", resume);
  app.add_option("--gpu", gpus)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  std::string arg0 = "fuzz", arg1 = "--config", arg2 = path;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data()};
  try {
    longattn::apps::parse_with_config(app, 3, argv, "fuzz");
    longattn::parse_attention_spec(attention);
  } catch (const CLI::ParseError&) {
  } catch (const longattn::Error&) {
  }
  std::remove(path.c_str());
  return 0;
}
