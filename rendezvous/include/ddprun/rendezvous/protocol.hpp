#pragma once
// The c10d TCPStore wire protocol, as spoken by PyTorch 1.13 and 2.x clients
// (see docs: tcpstore-protocol.md). Integers are host-order (little-endian), strings are a u64
// length and raw bytes. Two opcode numberings exist; a server tells them apart per connection.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::rendezvous::wire {

// Operations, independent of the numbering used on the wire.
enum class Op : std::uint8_t {
  kValidate,
  kPing,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,  // 1.13 only
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kQueuePush,
  kQueuePop,
  kQueueLen,
};

// Which opcode numbering a connection speaks.
enum class Dialect : std::uint8_t {
  kUnknown,  // nothing read yet
  kV1,       // PyTorch 1.13: no handshake, SET = 0 ... DELETE_KEY = 8 (with WATCH_KEY = 7)
  kV2,       // PyTorch 2.x: VALIDATE = 0 with a magic, then SET = 1 ... QUEUE_LEN = 16
};

inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

// Limits on one request; a request over any of them closes its connection. Defaults follow
// PyTorch's libuv server.
struct WireLimits {
  std::size_t max_key_bytes = 8 * 1024;               // one key
  std::size_t max_value_bytes = 8 * 1024 * 1024;      // one value
  std::size_t max_keys_per_request = 128 * 1024;      // CHECK, WAIT, MULTI_GET, MULTI_SET
  std::size_t max_request_bytes = 64 * 1024 * 1024;   // a whole request (bounds buffering)
};

enum CheckResponse : std::uint8_t { kReady = 0, kNotReady = 1 };
enum WaitResponse : std::uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };
enum WatchResponse : std::uint8_t {
  kKeyUpdated = 0,
  kKeyCreated = 1,
  kKeyDeleted = 2,
  kKeyCallbackRegistered = 3,
};

// The opcode byte of `op` in `dialect`; nullopt when that dialect has no such operation.
std::optional<std::uint8_t> encode_op(Op op, Dialect dialect);
// The operation of opcode byte `byte` in `dialect` (kV1 or kV2); nullopt for an unknown opcode.
std::optional<Op> decode_op(std::uint8_t byte, Dialect dialect);
// "SET", "COMPARE_SET", ... for log lines.
const char* op_name(Op op);

// Encoding helpers: append one field to `out`.
inline void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }
template <typename T>
inline void put_int(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}
inline void put_u32(std::string& out, std::uint32_t v) { put_int(out, v); }
inline void put_u64(std::string& out, std::uint64_t v) { put_int(out, v); }
inline void put_i64(std::string& out, std::int64_t v) { put_int(out, v); }
inline void put_str(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s.data(), s.size());
}

}  // namespace ddprun::rendezvous::wire
