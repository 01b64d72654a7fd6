#pragma once
// The server's side of ddprun's authentication (ddprun/rendezvous/auth.hpp), free of sockets so
// that the fuzzer drives it exactly as a connection does: feed it bytes, send what it answers.

#include <cstddef>
#include <string>
#include <string_view>

namespace ddprun::rendezvous {

class ServerHandshake {
 public:
  enum class State { kHello, kProof, kAccepted, kRefused };

  explicit ServerHandshake(std::string secret) : secret_(std::move(secret)) {}

  // Takes handshake bytes from the front of `data` (never more than the handshake needs) and
  // appends to `answer` what must be sent back. After kRefused, `why` says why, for the log.
  State feed(std::string_view& data, std::string& answer);
  // What to send a client turned away for capacity at this point of the handshake (auth.hpp).
  void busy(std::string& answer) const;
  State state() const { return state_; }
  const std::string& why() const { return why_; }

 private:
  State refuse(std::string_view why, std::string& answer, bool as_marker);

  std::string secret_;
  State state_ = State::kHello;
  std::string in_;
  std::string cnonce_, snonce_;
  std::string why_;
};

}  // namespace ddprun::rendezvous
