#pragma once
// ddprun's mutual challenge-response for its own store clients (agents and the rendezvous
// store), before any TCPStore request: both sides prove they know a per-job secret with
// HMAC-SHA256 over fresh nonces; the secret never crosses the wire.
//
//   client -> server  HELLO: u8 0xA7, u32 'DDPA', 32-byte client nonce
//   server -> client  u8 0, 32-byte server nonce, 32-byte server proof
//                     server proof = HMAC(secret, "ddprun-store-server" | cnonce | snonce)
//   client -> server  32-byte client proof = HMAC(secret, "ddprun-store-client" | snonce | cnonce)
//                     (32 zero bytes when the server's proof was wrong: the client refuses it)
//   server -> client  u8 0 (accepted: TCPStore requests follow), 1 (refused: wrong or missing
//                     secret, then closed) or 2 (busy: see below, then closed)
//
// A secured server answers a client that does not start with HELLO (a PyTorch client, a ddprun
// client without the secret) with kRefusedMarker in place of the reply it expects, then closes:
// a ddprun client reads it where the echo of its PING would be and reports the refusal.
// A server turning a client away for capacity (too many connections, or it closes the oldest
// connection still authenticating to make room) sends kBusyMarker where the server's challenge
// would start, or kBusy in place of the verdict, then closes: the client tries again until its
// time-out. Neither says anything about the secret.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::rendezvous::auth {

inline constexpr std::uint8_t kHelloOpcode = 0xA7;
inline constexpr std::uint32_t kHelloMagic = 0x41505044;  // "DDPA"
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::size_t kHelloBytes = 1 + 4 + kNonceBytes;
inline constexpr std::size_t kChallengeBytes = 1 + kNonceBytes + kProofBytes;
inline constexpr std::uint32_t kRefusedMarker = 0xDD5EC12E;
inline constexpr std::uint32_t kBusyMarker = 0xDD5EB5E1;  // its first byte is not kAccepted
inline constexpr std::uint8_t kAccepted = 0;
inline constexpr std::uint8_t kRefused = 1;
inline constexpr std::uint8_t kBusy = 2;
inline constexpr std::size_t kMaxSecretBytes = 4096;

std::string random_bytes(std::size_t n);
std::string server_proof(std::string_view secret, std::string_view cnonce, std::string_view snonce);
std::string client_proof(std::string_view secret, std::string_view snonce, std::string_view cnonce);
// Constant-time comparison of equal-length strings.
bool equal(std::string_view a, std::string_view b);

// Reads a secret file: it must exist, be a regular file not readable or writable by group or
// others (like an ssh key), and hold 1-4096 bytes; trailing newlines are not part of the
// secret. Throws UsageError saying what is wrong and what to do.
std::string read_secret_file(const std::string& path);

// The same checks for another private file: `what` names it in the messages ("the etcd password
// file"), `create` says how to make one ("printf %s PASSWORD > FILE; chmod 600 FILE").
std::string read_private_file(const std::string& path, const std::string& what, const std::string& create);

}  // namespace ddprun::rendezvous::auth
