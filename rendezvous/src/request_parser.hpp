#pragma once
// Incremental parser of client requests. It owns no socket: the server feeds it the bytes it has
// buffered, and it either returns one complete request, asks for more bytes, or rejects the
// stream. It is the only code that interprets untrusted bytes, hence the fuzz target.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/rendezvous/protocol.hpp"

namespace ddprun::rendezvous {

using wire::WireLimits;

struct Request {
  wire::Op op = wire::Op::kPing;
  std::vector<std::string> keys;    // every key the request names, in order
  std::vector<std::string> values;  // SET, APPEND, QUEUE_PUSH: 1; COMPARE_SET: expected, desired; MULTI_SET: n
  std::int64_t delta = 0;           // ADD
  std::uint32_t u32 = 0;            // PING nonce, VALIDATE magic
};

class RequestParser {
 public:
  enum class Status { kComplete, kNeedMore, kInvalid };
  struct Result {
    Status status;
    std::size_t consumed = 0;   // kComplete: bytes of the request
    std::size_t need = 0;       // kNeedMore: do not call again before this many bytes are buffered
    std::string error;          // kInvalid: why, for the log line
  };

  explicit RequestParser(WireLimits limits = {}) : limits_(limits) {}

  // Parses one request from the start of `in`. On kComplete fills `out` (reusing its storage).
  // The dialect is fixed by the first request of the connection and kept here.
  Result parse(std::string_view in, Request& out);

  wire::Dialect dialect() const { return dialect_; }
  const WireLimits& limits() const { return limits_; }

 private:
  WireLimits limits_;
  wire::Dialect dialect_ = wire::Dialect::kUnknown;
};

}  // namespace ddprun::rendezvous
