#pragma once
// Data-path results: a [[nodiscard]] status value instead of exceptions (style.md).
#include <string>
#include <utility>

namespace nereus {

/// Outcome of a data-path operation.
/// `abandoned`: the transport stopped waiting for a request it could not cancel (a send
/// its peer never takes); the request may still read its buffer, so the caller must
/// neither reuse nor free memory it owns for it (UcxTransport::abandon_sends).
enum class StatusCode { ok, not_supported, cancelled, invalid, peer_failed, io_error, timed_out, abandoned };

/// A status code and, when not ok, what went wrong.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

}  // namespace nereus
