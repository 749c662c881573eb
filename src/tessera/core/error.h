// tessera::Error: a user-facing failure (bad flag, file, network, memory) carrying what
// happened and what to do about it. The CLI prints "error: <what>" and "hint: <hint>" and
// exits with exit_code(): 2 for usage errors, 1 for runtime errors.
// Broken internal invariants are not Errors: TESSERA_CHECK aborts with file:line.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace tessera {

enum class ErrorKind { Usage, Runtime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string what, std::string hint = "")
      : std::runtime_error(std::move(what)), kind_(kind), hint_(std::move(hint)) {}
  ErrorKind kind() const { return kind_; }
  const std::string& hint() const { return hint_; }
  int exit_code() const { return kind_ == ErrorKind::Usage ? 2 : 1; }

 private:
  ErrorKind kind_;
  std::string hint_;
};

inline Error usage_error(std::string what, std::string hint = "") {
  return Error(ErrorKind::Usage, std::move(what), std::move(hint));
}
inline Error runtime_error(std::string what, std::string hint = "") {
  return Error(ErrorKind::Runtime, std::move(what), std::move(hint));
}

// "<action> <path>: <strerror(err)>" for a failed system call, with a hint for the errnos a
// user can fix (a wrong path, permissions, a full disk, a folder given for a file).
[[noreturn]] void throw_io_error(const std::string& path, std::string_view action, int err);

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace tessera

// Internal invariant: aborts with file:line (never for user input).
#define TESSERA_CHECK(cond, msg)                                                \
  do {                                                                          \
    if (!(cond)) ::tessera::check_failed(#cond, __FILE__, __LINE__, (msg));     \
  } while (0)
