#pragma once
// The apps' command lines: options from a JSON config file first, the command line over them.
//
//   --config FILE   a JSON object whose keys are the long option names ({"layers": 4, ...});
//                   an array gives a repeated option. Unknown keys are refused, naming the valid ones.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "longattn/error.hpp"

namespace longattn::apps {

inline std::vector<std::string> config_arguments(const CLI::App& app, const std::string& path, const char* program) {
  std::ifstream in(path);
  require(bool(in), program, "config", "\"" + path + "\"", "a readable JSON file");
  nlohmann::json config;
  try {
    in >> config;
  } catch (const nlohmann::json::exception& error) {
    throw_invalid_argument(program, "config", "\"" + path + "\"", std::string("valid JSON (") + error.what() + ")");
  }
  require(config.is_object(), program, "config", "\"" + path + "\"", "a JSON object");
  std::vector<std::string> args;
  for (const auto& [key, value] : config.items()) {
    if (app.get_option_no_throw("--" + key) == nullptr || key == "config") {
      std::string valid;
      for (const CLI::Option* option : app.get_options())
        if (!option->get_lnames().empty() && option->get_lnames()[0] != "help" && option->get_lnames()[0] != "config")
          valid += (valid.empty() ? "" : ", ") + option->get_lnames()[0];
      throw_invalid_argument(program, "config key", "\"" + key + "\"", "one of " + valid);
    }
    const auto text = [](const nlohmann::json& item) { return item.is_string() ? item.get<std::string>() : item.dump(); };
    if (value.is_boolean()) {  // a flag: present when true
      if (value.get<bool>()) args.push_back("--" + key);
    } else if (value.is_array()) {
      for (const auto& item : value) args.insert(args.end(), {"--" + key, text(item)});
    } else {
      args.insert(args.end(), {"--" + key, text(value)});
    }
  }
  return args;
}

// Parses argv into `app`, a --config file's options first. Throws CLI::ParseError (app.exit()
// reports it) or longattn::Error (a bad config file).
inline void parse_with_config(CLI::App& app, int argc, char** argv, const char* program) {
  std::string config_path;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--config" && i + 1 < argc) config_path = argv[i + 1];
    else if (std::string(argv[i]).rfind("--config=", 0) == 0) config_path = std::string(argv[i]).substr(9);
  std::vector<std::string> args;
  if (!config_path.empty()) args = config_arguments(app, config_path, program);
  args.insert(args.end(), argv + 1, argv + argc);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  app.parse(args);
}

}  // namespace longattn::apps
