// Status and Result: how failures travel inside Strata. Codes are the public STRATA_E_* values,
// so the C API returns them unchanged; the message carries the context a user needs.
#pragma once

#include <strata/strata.h>

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace strata {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return {}; }
  static Status error(int code, std::string message) {
    assert(code < 0);
    return Status(code, std::move(message));
  }

  bool is_ok() const { return code_ == STRATA_OK; }
  explicit operator bool() const { return is_ok(); }
  int code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with what the caller was doing, e.g. "reading tensor 'wq.3'".
  Status with_context(const std::string& context) && {
    if (!is_ok()) message_ = context + ": " + message_;
    return std::move(*this);
  }

 private:
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code_ = STRATA_OK;
  std::string message_;
};

// Shorthands for the common codes.
inline Status invalid_argument(std::string m) {
  return Status::error(STRATA_E_INVALID, std::move(m));
}
inline Status io_error(std::string m) {
  return Status::error(STRATA_E_IO, std::move(m));
}
inline Status unsupported(std::string m) {
  return Status::error(STRATA_E_UNSUPPORTED, std::move(m));
}

// Builds "what: strerror(errno_value) (errno N)".
Status errno_status(int code, const std::string& what, int errno_value);

// strerror's text, from any thread (strerror itself may share one buffer between threads).
std::string errno_text(int errno_value);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.is_ok());
  }

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  Status take_status() && { return std::move(status_); }

  T& value() & {
    assert(is_ok());
    return *value_;
  }
  T&& value() && {
    assert(is_ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace strata

namespace strata::detail {
// The status an early return hands back: as it is, or prefixed with what the caller was doing.
inline Status returned(Status status) {
  return status;
}
inline Status returned(Status status, const std::string& context) {
  return std::move(status).with_context(context);
}
}  // namespace strata::detail

// The macros below take a declaration (`auto x`) or a place (`rt->engine_`) as `lhs`, which
// parentheses would break: bugprone-macro-parentheses is off for them.
// NOLINTBEGIN(bugprone-macro-parentheses)

// Returns early with the status when an expression fails, optionally saying what was being done:
//   STRATA_TRY(file.sync());
//   STRATA_TRY(store.write(extent, bytes), "writing tensor '" + name + "'");
#define STRATA_TRY(expr, ...)                                                                      \
  do {                                                                                             \
    ::strata::Status strata_try_status_ = (expr);                                                  \
    if (!strata_try_status_.is_ok()) {                                                             \
      return ::strata::detail::returned(std::move(strata_try_status_) __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                              \
  } while (0)

// Declares or assigns `lhs` from a Result, or returns its status early (with the optional
// context, as STRATA_TRY):
//   STRATA_ASSIGN_OR_RETURN(auto file, UniqueFd::open(path));
//   STRATA_ASSIGN_OR_RETURN(rt->engine_, io::make_io_engine(kind, options), "I/O engine");
// It expands to several statements: use it in a block, never as the body of an unbraced if.
// `expr` is evaluated once; a comma in it must sit inside parentheses.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr, ...)                                       \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_STATUS_CONCAT_(strata_result_, __LINE__), lhs, \
                                expr __VA_OPT__(, ) __VA_ARGS__)
#define STRATA_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr, ...)                                      \
  auto result = (expr);                                                                            \
  if (!result.is_ok()) {                                                                           \
    return ::strata::detail::returned(std::move(result).take_status() __VA_OPT__(, ) __VA_ARGS__); \
  }                                                                                                \
  lhs = std::move(result).value()
#define STRATA_STATUS_CONCAT_(a, b) STRATA_STATUS_CONCAT_INNER_(a, b)
#define STRATA_STATUS_CONCAT_INNER_(a, b) a##b
// NOLINTEND(bugprone-macro-parentheses)
