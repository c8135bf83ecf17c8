// Error type of the library and the TR_CHECK macro: the library throws, only the CLI exits.
#pragma once
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace tr {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation failed or would pass the allocator's cap; the message holds the memory breakdown.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tr

// Checks a condition and throws tr::Error with a formatted message naming what is at fault.
#define TR_CHECK(cond, ...)               \
  do {                                    \
    if (!(cond)) ::tr::fail(__VA_ARGS__); \
  } while (0)
