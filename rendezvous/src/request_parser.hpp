#pragma once
// Incremental parser of client requests. It owns no socket: the server hands it whatever bytes
// arrived, and it consumes them into the request it is building, returning one complete request,
// or "need more" after taking every byte it was given, or rejecting the stream. It keeps what it
// has parsed between calls, so each byte is examined once however the stream is split into
// segments (one byte per send costs the same per byte as one large send), and it never allocates
// a declared length before the bytes arrive (a string grows as its bytes do). It is the only code
// that interprets untrusted bytes, hence the fuzz target.

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

// Heap bytes a request's strings hold (their capacity, with the vectors'): all of them, or its
// keys alone. For the memory budget.
std::size_t heap_bytes(const Request& r);
std::size_t key_heap_bytes(const Request& r);

class RequestParser {
 public:
  enum class Status { kComplete, kNeedMore, kInvalid };
  struct Result {
    Status status;
    std::size_t consumed = 0;  // bytes of `in` taken (kNeedMore: all of them)
    std::string error;         // kInvalid: why, for the log line
    std::size_t request_heap = 0;  // kComplete: heap_bytes() of the request now in `out`
  };

  explicit RequestParser(WireLimits limits = {}) : limits_(limits) {}

  // Consumes bytes from the start of `in`. kComplete: one request is complete and swapped into
  // `out` (whose old storage the parser reuses: `out_heap` is its heap_bytes() when the caller
  // knows it, else it is counted); the rest of `in` after `consumed` is not touched. kNeedMore:
  // all of `in` was taken into the request being built. kInvalid: the stream is broken; the
  // parser must not be used again.
  static constexpr std::size_t kUnknown = ~std::size_t{0};
  Result parse(std::string_view in, Request& out, std::size_t out_heap = kUnknown);

  wire::Dialect dialect() const { return dialect_; }
  const WireLimits& limits() const { return limits_; }
  // Bytes of the current, incomplete request taken so far (0 between requests).
  std::size_t partial_bytes() const { return total_; }
  // Heap bytes the parser holds: the request being built, on the storage of an earlier one.
  std::size_t held_bytes() const { return held_; }

  // Field kinds of a request body, in wire order.
  enum class Field : std::uint8_t { kU32, kI64, kCount, kSignedCount, kKey, kValue, kExpected, kDesired };

 private:
  void start(wire::Op op);
  // Takes up to `n` bytes into the integer accumulator; true once `n` are there.
  bool take_int(std::string_view& in, std::size_t n);
  std::uint64_t int_value() const;
  Field field() const;  // the field at idx_
  void finish_field();  // moves to the next field
  bool done() const { return idx_ >= fixed_len_ + count_ * repeat_len_; }
  std::string& target(Field f);
  bool begin_request(std::string_view& in);
  bool take_field(std::string_view& in);
  bool take_string(std::string_view& in, Field f);

  WireLimits limits_;
  wire::Dialect dialect_ = wire::Dialect::kUnknown;
  Request req_;
  bool in_request_ = false;
  bool sniffing_ = false;       // first request began with byte 0: VALIDATE (2.x) or SET (1.13)?
  const Field* fixed_ = nullptr;
  std::size_t fixed_len_ = 0;
  const Field* repeat_ = nullptr;  // CHECK, WAIT, MULTI_GET, MULTI_SET: the per-item fields
  std::size_t repeat_len_ = 0;
  std::uint64_t count_ = 0;
  std::size_t idx_ = 0;            // current field
  std::size_t nkeys_ = 0, nvalues_ = 0;
  bool in_string_ = false;         // length read, bytes still arriving
  std::uint64_t remaining_ = 0;    // bytes of the current string still to come
  char ibuf_[8] = {};
  std::size_t ihave_ = 0;
  std::size_t total_ = 0;          // bytes of this request so far
  std::size_t held_ = 0;           // heap_bytes(req_), kept up to date as it grows
};

}  // namespace ddprun::rendezvous
