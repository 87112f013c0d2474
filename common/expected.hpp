// The one way an expected failure is returned: a value, or a one-line message naming the input.
// (std::expected is C++23; this is the part of it mcprun uses.)
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace mcprun {

/// The message of an expected failure, e.g. "--rdzv-endpoint 'x:y': port must be a number".
struct Error {
  std::string message;
};

/// Returns T, or an Error: `if (!result) return result.error();`, then `*result`.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}
  Expected(Error error) : state_(std::move(error)) {}

  explicit operator bool() const { return state_.index() == 0; }
  T& operator*() & { return std::get<0>(state_); }
  const T& operator*() const& { return std::get<0>(state_); }
  T&& operator*() && { return std::get<0>(std::move(state_)); }
  T* operator->() { return &std::get<0>(state_); }
  const T* operator->() const { return &std::get<0>(state_); }
  const Error& error() const { return std::get<1>(state_); }

 private:
  std::variant<T, Error> state_;
};

/// Success with nothing to return (`return {};`), or an Error.
template <>
class [[nodiscard]] Expected<void> {
 public:
  Expected() = default;
  Expected(Error error) : error_(std::move(error)) {}

  explicit operator bool() const { return !error_.has_value(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

}  // namespace mcprun
