#pragma once
// longattn::Error: the one exception type of the library. Every public entry point checks its
// arguments and throws it with a message naming the function, the argument, its value and
// what was expected, e.g.
//   longattn::gemm: argument 'C' has extent(0) = 7, expected 5 (rows of op(A))
#include <sstream>
#include <stdexcept>
#include <string>

namespace longattn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error("<where>: argument '<name>' is <value>, expected <expected>").
template <class Value>
[[noreturn]] void throw_invalid_argument(const std::string& where, const std::string& name,
                                         const Value& value, const std::string& expected) {
  std::ostringstream message;
  message << where << ": argument '" << name << "' is " << value << ", expected " << expected;
  throw Error(message.str());
}

// require(ok, ...) throws the message above when ok is false. The texts are taken as they come
// (string literals stay pointers), so a check that passes builds no string: require sits on hot
// paths such as Pool::allocate.
template <class Where, class Name, class Value, class Expected>
void require(bool ok, const Where& where, const Name& name, const Value& value, const Expected& expected) {
  if (!ok) throw_invalid_argument(where, name, value, expected);
}

}  // namespace longattn
