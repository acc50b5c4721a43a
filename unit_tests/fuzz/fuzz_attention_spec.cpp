// libFuzzer target: the attention spec parser (--attention, "attention" in JSON configs). Any
// text either parses or throws longattn::Error; what parses prints back (to_string) as text that
// parses to the same spec.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "longattn/core/attention_spec.hpp"
#include "longattn/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  longattn::AttentionSpec spec;
  try {
    spec = longattn::parse_attention_spec(text);
  } catch (const longattn::Error&) {
    return 0;
  }
  if (longattn::parse_attention_spec(longattn::to_string(spec)) != spec) std::abort();
  return 0;
}
