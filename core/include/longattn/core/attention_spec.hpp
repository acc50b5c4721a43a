// Which attention a module runs, from a spec string:
//
//   dense                                   exact softmax attention over the whole sequence
//   dilated:w=2048,4096,8192;r=1,2,4        LongNet dilated attention (mode longnet)
//   dilated:w=...;r=...;mode=head_groups    the seed library's semantics (see dilated_attention.hpp)
//   auto                                    dense up to auto_dense_max_tokens, else dilated with
//                                           w_i = 2048 * 2^i, r_i = 2^i up to the first w_i >= N
//
// run_attention_forward / run_attention_backward run the attention a spec names on [B, N, H, D]
// views, so a module holds one AttentionSpec instead of branching on kinds.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "longattn/core/attention.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/error.hpp"

namespace longattn {

struct AttentionSpec {
  enum class Kind { dense, dilated, automatic };
  Kind kind = Kind::dense;
  DilatedConfig dilated;  // for Kind::dilated
};

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

inline std::vector<std::int64_t> parse_integers(const std::string& list, const std::string& key,
                                                const std::string& spec) {
  const char* where = "longattn::parse_attention_spec";
  std::vector<std::int64_t> values;
  for (const std::string& item : split(list, ',')) {
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(!item.empty() && used == item.size(), where, "spec", "\"" + spec + "\"",
            key + "= as comma-separated integers (\"" + item + "\" is not one)");
    values.push_back(value);
  }
  return values;
}

}  // namespace detail

inline std::string to_string(const AttentionSpec& spec) {
  switch (spec.kind) {
    case AttentionSpec::Kind::dense: return "dense";
    case AttentionSpec::Kind::automatic: return "auto";
    case AttentionSpec::Kind::dilated: break;
  }
  std::string out = "dilated:w=";
  for (std::size_t i = 0; i < spec.dilated.segment_lengths.size(); ++i)
    out += (i ? "," : "") + std::to_string(spec.dilated.segment_lengths[i]);
  out += ";r=";
  for (std::size_t i = 0; i < spec.dilated.dilation_rates.size(); ++i)
    out += (i ? "," : "") + std::to_string(spec.dilated.dilation_rates[i]);
  if (spec.dilated.mode != DilatedMode::longnet) out += std::string(";mode=") + to_string(spec.dilated.mode);
  return out;
}

// Throws longattn::Error naming the spec and what was expected.
inline AttentionSpec parse_attention_spec(const std::string& text) {
  const char* where = "longattn::parse_attention_spec";
  const std::string spec = detail::trim(text);
  const std::string grammar = "dense, auto, or dilated:w=<lengths>;r=<rates>[;mode=longnet|head_groups]";
  AttentionSpec out;
  if (spec == "dense") return out;
  if (spec == "auto") {
    out.kind = AttentionSpec::Kind::automatic;
    return out;
  }
  const auto colon = spec.find(':');
  const std::string kind = detail::trim(spec.substr(0, colon));
  require(kind != "block_sparse", where, "spec", "\"" + spec + "\"",
          grammar + " (block_sparse arrives with block-sparse attention)");
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

template <class ExecSpace, class Q, class K, class V, class O, class Lse>
void run_attention_forward(const ExecSpace& exec, const AttentionSpec& spec, const Q& q, const K& k, const V& v,
                           const O& o, const Lse& lse, const AttentionOptions& opts = {}) {
  const AttentionSpec concrete = resolve_attention_spec(spec, q.extent(1));
  if (concrete.kind == AttentionSpec::Kind::dilated)
    dilated_attention_forward(exec, q, k, v, o, lse, concrete.dilated, opts);
  else
    attention_forward(exec, q, k, v, o, lse, opts);
}

template <class ExecSpace, class Q, class K, class V, class O, class DO, class Lse, class DQ, class DK, class DV>
void run_attention_backward(const ExecSpace& exec, const AttentionSpec& spec, const Q& q, const K& k, const V& v,
                            const O& o, const DO& d_o, const Lse& lse, const DQ& dq, const DK& dk, const DV& dv,
                            const AttentionOptions& opts = {}) {
  const AttentionSpec concrete = resolve_attention_spec(spec, q.extent(1));
  if (concrete.kind == AttentionSpec::Kind::dilated)
    dilated_attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, concrete.dilated, opts);
  else
    attention_backward(exec, q, k, v, o, d_o, lse, dq, dk, dv, opts);
}

}  // namespace longattn
