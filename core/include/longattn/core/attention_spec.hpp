// Which attention a module runs, from a spec string:
//
//   dense                                   exact softmax attention over the whole sequence
//   dilated:w=2048,4096,8192;r=1,2,4        LongNet dilated attention (mode longnet)
//   dilated:w=...;r=...;mode=head_groups    the seed library's semantics (see dilated_attention.hpp)
//   block_sparse:pattern=<name>;<fields>    block-sparse attention (block_sparse_patterns.hpp):
//     pattern=full | local_window;radius=<tokens> | dilated;rates=<block distances>
//     | global_local;global=<tokens>;radius=<tokens> | random;density=<fraction>[;seed=<n>]
//     | top_k;k=<key blocks per query block>
//   auto                                    dense up to auto_dense_max_tokens, else dilated with
//                                           w_i = 2048 * 2^i, r_i = 2^i up to the first w_i >= N
//
// Text is parsed once, where it enters (a command line, a JSON file, make_multihead_attention),
// into an AttentionSpec; everything below takes the typed spec. A runner (attention_runner.hpp)
// runs the attention a spec names.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/error.hpp"

namespace longattn {

struct AttentionSpec {
  enum class Kind { dense, dilated, block_sparse, automatic };
  Kind kind = Kind::dense;
  DilatedConfig dilated;            // for Kind::dilated
  BlockSparseConfig block_sparse;   // for Kind::block_sparse
};

inline bool operator==(const AttentionSpec& a, const AttentionSpec& b) {
  switch (a.kind) {
    case AttentionSpec::Kind::dilated: return b.kind == a.kind && a.dilated == b.dilated;
    case AttentionSpec::Kind::block_sparse: return b.kind == a.kind && a.block_sparse == b.block_sparse;
    default: return b.kind == a.kind;
  }
}
inline bool operator!=(const AttentionSpec& a, const AttentionSpec& b) { return !(a == b); }

// auto: sequences up to this many tokens run dense attention.
inline constexpr std::int64_t auto_dense_max_tokens = 8192;

namespace detail {

inline std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t"), end = s.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
}

inline std::vector<std::string> split(const std::string& s, char separator) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  for (;;) {
    const auto end = s.find(separator, start);
    parts.push_back(trim(s.substr(start, end == std::string::npos ? std::string::npos : end - start)));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

// One number of a spec field, all of `item` parsed by `parse` (std::stoll, std::stod, ...).
template <class Parse>
auto parse_number(const std::string& item, const std::string& key, const std::string& spec, const char* kind,
                  Parse&& parse) {
  decltype(parse(item, nullptr)) value{};
  std::size_t used = 0;
  try {
    value = parse(item, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  require(!item.empty() && used == item.size(), "longattn::parse_attention_spec", "spec", "\"" + spec + "\"",
          key + "= as " + kind + " (\"" + item + "\" is not one)");
  return value;
}

inline std::int64_t parse_integer(const std::string& item, const std::string& key, const std::string& spec) {
  return parse_number(item, key, spec, "an integer",
                      [](const std::string& x, std::size_t* used) { return std::int64_t(std::stoll(x, used)); });
}

inline std::vector<std::int64_t> parse_integers(const std::string& list, const std::string& key,
                                                const std::string& spec) {
  std::vector<std::int64_t> values;
  for (const std::string& item : split(list, ','))
    values.push_back(parse_number(item, key, spec, "comma-separated integers",
                                  [](const std::string& x, std::size_t* used) { return std::int64_t(std::stoll(x, used)); }));
  return values;
}

// The shortest decimal that reads back as `value`.
inline std::string shortest(double value) {
  for (int digits = 1;; ++digits) {
    std::ostringstream out;
    out << std::setprecision(digits) << value;
    if (digits >= 17 || std::stod(out.str()) == value) return out.str();
  }
}

inline std::string join(const std::vector<std::int64_t>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out;
}

// The fields after "block_sparse:".
inline BlockSparseConfig parse_block_sparse(const std::string& fields, const std::string& spec,
                                            const std::string& grammar) {
  const char* where = "longattn::parse_attention_spec";
  BlockSparseConfig config;
  std::vector<std::string> seen;
  bool have_pattern = false;
  for (const std::string& field : split(fields, ';')) {
    const auto equals = field.find('=');
    const std::string key = trim(field.substr(0, equals));
    const std::string value = equals == std::string::npos ? "" : trim(field.substr(equals + 1));
    const bool repeated = std::find(seen.begin(), seen.end(), key) != seen.end();
    seen.push_back(key);
    const auto bad_field = [&] {
      throw_invalid_argument(where, "spec", "\"" + spec + "\"",
                             grammar + " (\"" + field + "\" is not one of its fields, or repeats one)");
    };
    if (equals == std::string::npos || repeated) bad_field();
    if (key == "pattern") {
      const BlockSparsePattern patterns[] = {BlockSparsePattern::full, BlockSparsePattern::local_window,
                                             BlockSparsePattern::dilated, BlockSparsePattern::global_local,
                                             BlockSparsePattern::random, BlockSparsePattern::top_k};
      have_pattern = false;
      for (BlockSparsePattern pattern : patterns)
        if (value == to_string(pattern)) {
          config.pattern = pattern;
          have_pattern = true;
        }
      if (!have_pattern) bad_field();
    } else if (key == "radius") {
      config.radius = parse_integer(value, key, spec);
    } else if (key == "rates") {
      config.rates = parse_integers(value, key, spec);
    } else if (key == "global") {
      config.global_tokens = parse_integer(value, key, spec);
    } else if (key == "density") {
      config.density = parse_number(value, key, spec, "a number",
                                    [](const std::string& x, std::size_t* used) { return std::stod(x, used); });
    } else if (key == "seed") {
      const std::int64_t seed = parse_integer(value, key, spec);
      require(seed >= 0, where, "spec", "\"" + spec + "\"", "seed= as a non-negative integer");
      config.seed = std::uint64_t(seed);
    } else if (key == "k") {
      config.top_k = parse_integer(value, key, spec);
    } else {
      bad_field();
    }
  }
  require(have_pattern, where, "spec", "\"" + spec + "\"", grammar + " (pattern= is needed)");
  // The fields each pattern needs, and only those.
  std::vector<std::string> needed, optional;
  switch (config.pattern) {
    case BlockSparsePattern::full: break;
    case BlockSparsePattern::local_window: needed = {"radius"}; break;
    case BlockSparsePattern::dilated: needed = {"rates"}; break;
    case BlockSparsePattern::global_local: needed = {"global", "radius"}; break;
    case BlockSparsePattern::random: needed = {"density"}; optional = {"seed"}; break;
    case BlockSparsePattern::top_k: needed = {"k"}; break;
  }
  for (const std::string& key : needed)
    require(std::find(seen.begin(), seen.end(), key) != seen.end(), where, "spec", "\"" + spec + "\"",
            grammar + " (pattern=" + to_string(config.pattern) + " needs " + key + "=)");
  for (const std::string& key : seen)
    require(key == "pattern" || std::find(needed.begin(), needed.end(), key) != needed.end() ||
                std::find(optional.begin(), optional.end(), key) != optional.end(),
            where, "spec", "\"" + spec + "\"",
            grammar + " (pattern=" + to_string(config.pattern) + " takes no " + key + "=)");
  validate_block_sparse_config(config, where);
  return config;
}

}  // namespace detail

inline std::string to_string(const BlockSparseConfig& config) {
  std::ostringstream out;
  out << "pattern=" << to_string(config.pattern);
  switch (config.pattern) {
    case BlockSparsePattern::full: break;
    case BlockSparsePattern::local_window: out << ";radius=" << config.radius; break;
    case BlockSparsePattern::dilated: out << ";rates=" << detail::join(config.rates); break;
    case BlockSparsePattern::global_local:
      out << ";global=" << config.global_tokens << ";radius=" << config.radius;
      break;
    case BlockSparsePattern::random:
      out << ";density=" << detail::shortest(config.density) << ";seed=" << config.seed;
      break;
    case BlockSparsePattern::top_k: out << ";k=" << config.top_k; break;
  }
  return out.str();
}

inline std::string to_string(const AttentionSpec& spec) {
  switch (spec.kind) {
    case AttentionSpec::Kind::dense: return "dense";
    case AttentionSpec::Kind::automatic: return "auto";
    case AttentionSpec::Kind::block_sparse: return "block_sparse:" + to_string(spec.block_sparse);
    case AttentionSpec::Kind::dilated: break;
  }
  std::string out = "dilated:w=" + detail::join(spec.dilated.segment_lengths) + ";r=" +
                    detail::join(spec.dilated.dilation_rates);
  if (spec.dilated.mode != DilatedMode::longnet) out += std::string(";mode=") + to_string(spec.dilated.mode);
  return out;
}

// Throws longattn::Error naming the spec and what was expected.
inline AttentionSpec parse_attention_spec(const std::string& text) {
  const char* where = "longattn::parse_attention_spec";
  const std::string spec = detail::trim(text);
  const std::string grammar =
      "dense, auto, dilated:w=<lengths>;r=<rates>[;mode=longnet|head_groups], or "
      "block_sparse:pattern=<full|local_window|dilated|global_local|random|top_k>;<its fields>";
  AttentionSpec out;
  if (spec == "dense") return out;
  if (spec == "auto") {
    out.kind = AttentionSpec::Kind::automatic;
    return out;
  }
  const auto colon = spec.find(':');
  const std::string kind = detail::trim(spec.substr(0, colon));
  if (kind == "block_sparse" && colon != std::string::npos) {
    out.kind = AttentionSpec::Kind::block_sparse;
    out.block_sparse = detail::parse_block_sparse(spec.substr(colon + 1), spec, grammar);
    return out;
  }
  require(kind == "dilated" && colon != std::string::npos, where, "spec", "\"" + spec + "\"", grammar);
  out.kind = AttentionSpec::Kind::dilated;
  bool have_w = false, have_r = false;
  for (const std::string& field : detail::split(spec.substr(colon + 1), ';')) {
    const auto equals = field.find('=');
    const std::string key = detail::trim(field.substr(0, equals));
    const std::string value = equals == std::string::npos ? "" : detail::trim(field.substr(equals + 1));
    if (key == "w" && equals != std::string::npos && !have_w) {
      out.dilated.segment_lengths = detail::parse_integers(value, key, spec);
      have_w = true;
    } else if (key == "r" && equals != std::string::npos && !have_r) {
      out.dilated.dilation_rates = detail::parse_integers(value, key, spec);
      have_r = true;
    } else if (key == "mode" && (value == "longnet" || value == "head_groups")) {
      out.dilated.mode = value == "longnet" ? DilatedMode::longnet : DilatedMode::head_groups;
    } else {
      throw_invalid_argument(where, "spec", "\"" + spec + "\"",
                             grammar + " (\"" + field + "\" is not one of its fields, or repeats one)");
    }
  }
  require(have_w && have_r, where, "spec", "\"" + spec + "\"", grammar + " (both w= and r= are needed)");
  validate_dilated_config(out.dilated, 0, where);
  return out;
}

// The concrete attention for a sequence of `tokens`: auto picks dense or dilated, the others
// are returned as they are.
inline AttentionSpec resolve_attention_spec(const AttentionSpec& spec, std::int64_t tokens) {
  if (spec.kind != AttentionSpec::Kind::automatic) return spec;
  AttentionSpec out;
  if (tokens <= auto_dense_max_tokens) return out;
  out.kind = AttentionSpec::Kind::dilated;
  for (std::int64_t w = 2048, r = 1;; w *= 2, r *= 2) {
    out.dilated.segment_lengths.push_back(w);
    out.dilated.dilation_rates.push_back(r);
    if (w >= tokens) break;
  }
  return out;
}

}  // namespace longattn
