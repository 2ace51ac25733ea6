// Error helpers: throw a gflow::Error with a code and a message built with <<.
//   GFLOW_THROW(kInvalidArgument, ctx) << "count " << n << " exceeds ...";
//   GFLOW_SYSCHECK(fd = ::socket(...), "socket") throws kInternal with errno text.
// GFLOW_ENFORCE is for invariants only (a bug in gflow, never user input).
#pragma once

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>

#include "gflow/error.h"

namespace gflow::detail {

class Thrower {
 public:
  Thrower(ErrorCode code, ErrorContext ctx) : code_(code), ctx_(std::move(ctx)) {}
  [[noreturn]] ~Thrower() noexcept(false) { throw Error(code_, os_.str(), ctx_); }
  std::ostream& stream() { return os_; }

 private:
  ErrorCode code_;
  ErrorContext ctx_;
  std::ostringstream os_;
};

inline std::string errnoString(int err) {
  return std::string(std::strerror(err));
}

}  // namespace gflow::detail

#define GFLOW_THROW(code, ctx) ::gflow::detail::Thrower(::gflow::ErrorCode::code, ctx).stream()

#define GFLOW_SYSCHECK(expr, what)                                                               \
  do {                                                                                           \
    if ((expr) < 0) {                                                                            \
      int gflow_err_ = errno;                                                                    \
      GFLOW_THROW(kInternal, ::gflow::ErrorContext{})                                            \
          << what << " failed: " << ::gflow::detail::errnoString(gflow_err_) << " [" << __FILE__ \
          << ":" << __LINE__ << "]";                                                             \
    }                                                                                            \
  } while (0)

#define GFLOW_ENFORCE(cond)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      GFLOW_THROW(kInternal, ::gflow::ErrorContext{})                                        \
          << "internal invariant failed: " #cond " [" << __FILE__ << ":" << __LINE__ << "]"; \
    }                                                                                        \
  } while (0)
