// One error path for the whole runtime (see ../shared/STYLE.md): every failed return code
// becomes a keel::Error that says what failed, where, and the library's own text.
// Failures the runtime is built to survive (a dead peer, a timeout, an abort) derive from
// keel::Error too but have their own types in parallel/comm_error.h, so callers can catch
// them apart from programming errors.
#pragma once

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace keel {

// The base of every exception keel throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad user input (config, data, checkpoint, plugin): the message names the file, field and
// value. Thrown before any state is touched, so nothing is lost.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what) {}
};

namespace detail {
[[noreturn]] inline void throw_check(const char* file, int line, const char* expr,
                                     const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": " << expr << " failed";
  if (!msg.empty()) os << ": " << msg;
  throw Error(os.str());
}
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail
}  // namespace keel

// KEEL_CHECK(cond, "message", value, ...): a broken invariant or a failed call.
#define KEEL_CHECK(cond, ...)                                                             \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::keel::detail::throw_check(__FILE__, __LINE__, #cond,                              \
                                  ::keel::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                     \
  } while (0)

// KEEL_CHECK_ERRNO(call): a syscall that returns -1 and sets errno.
#define KEEL_CHECK_ERRNO(call)                                                            \
  do {                                                                                    \
    if ((call) == -1) {                                                                   \
      int keel_errno_ = errno;                                                            \
      ::keel::detail::throw_check(__FILE__, __LINE__, #call, std::strerror(keel_errno_)); \
    }                                                                                     \
  } while (0)
