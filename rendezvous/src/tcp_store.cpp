#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"

#include <unistd.h>

#include <cstring>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/auth.hpp"
#include "ddprun/rendezvous/protocol.hpp"
#include "socket.hpp"

namespace ddprun::rendezvous {
namespace {

using wire::Op;

std::uint8_t opcode(Op op) { return *wire::encode_op(op, wire::Dialect::kV2); }

// PyTorch's client puts "/" before every key; doing the same makes keys interoperable.
constexpr std::string_view kKeyPrefix = "/";

void put_key(std::string& out, std::string_view key) {
  wire::put_u64(out, kKeyPrefix.size() + key.size());
  out.append(kKeyPrefix);
  out.append(key);
}

void put_keys(std::string& out, const std::vector<std::string>& keys) {
  wire::put_u64(out, keys.size());
  for (const auto& k : keys) put_key(out, k);
}

std::string seconds(std::chrono::milliseconds d) { return duration_text(d); }

// A WAIT that ran out of time and was cancelled: the connection is still in step.
class KeysTimeout : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

// The store turned this client away for capacity (auth.hpp): worth another try.
class BusyError : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// Keys in this client's messages: in full as a rule (they name what was waited for), within a
// bound, escaped (they may be built from other nodes' names or a user's run id).
constexpr std::size_t kKeyShown = 256;

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (std::size_t i = 0; i < keys.size() && i < 8; ++i) {
    if (i) s += ", ";
    s += "'" + escape_for_log(keys[i], kKeyShown) + "'";
  }
  if (keys.size() > 8) s += " and " + std::to_string(keys.size() - 8) + " more";
  return s;
}

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::chrono::milliseconds timeout;
  std::string address;
  mutable std::mutex mu;
  Socket sock;  // invalid after a network error; the next call reconnects

  explicit Impl(TcpStoreOptions o)
      : options(std::move(o)), timeout(options.timeout), address(format_address(options.host, options.port)) {}

  Clock::time_point deadline() const { return Clock::now() + timeout; }

  // Connects and performs the 2.x handshake, retrying with backoff until the timeout: the
  // server may not be listening yet.
  void connect() {
    auto until = Clock::now() + timeout;
    auto backoff = std::chrono::milliseconds(10);
    std::string last;
    bool busy = false;
    bool mute = false;  // a listener there took the connection, and never answered as a store
    auto say_at = Clock::now() + std::chrono::seconds(10);  // a long wait is not a silent one
    for (;;) {
      bool accepted = false;
      try {
        Socket s = Socket::connect(options.host, options.port, until);
        accepted = true;
        handshake(s, until);
        sock = std::move(s);
        return;
      } catch (const BusyError& e) {
        last = e.what();
        busy = true;
      } catch (const NetworkError& e) {
        last = e.what();
        busy = false;
        mute = accepted;
      } catch (const TimeoutError& e) {
        last = e.what();
        busy = false;
        mute = accepted;
      }
      // The last try comes just before the time-out, not a whole backoff earlier.
      constexpr auto kLastTry = std::chrono::milliseconds(20);
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left <= kLastTry) {
        throw TimeoutError("store: could not connect to " + address + " within " + seconds(timeout) + " (last error: " +
                           last + ")" +
                           (busy ? "; the store is reachable but was at capacity: raise its connection limits, or "
                                   "look for clients flooding it"
                            : mute ? "; the connection was taken but never answered: a store too loaded to accept, "
                                     "or not a ddprun or PyTorch c10d store" + check() + "?"
                                   : "; is the store running and reachable there?"));
      }
      if (Clock::now() >= say_at) {
        spdlog::info("ddprun: no store answers at {} yet ({}); trying for {} more", address, last,
                     seconds(std::chrono::duration_cast<std::chrono::milliseconds>(left)));
        say_at = Clock::now() + std::chrono::seconds(60);
      }
      std::this_thread::sleep_for(std::min(backoff, left - kLastTry));  // retry backoff, not synchronisation
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
  }

  // " (check SETTINGS)" for the settings that pointed this client here, where there are some.
  std::string check() const { return options.pointed_by.empty() ? "" : " (check " + options.pointed_by + ")"; }

  // The 2.x handshake on a new connection (ddprun's authentication first where there is a
  // secret): validation and a ping whose nonce the store echoes.
  void handshake(Socket& s, Clock::time_point until) {
    if (!options.secret.empty()) authenticate(s, until);
    std::string hello;
    wire::put_u8(hello, opcode(Op::kValidate));
    wire::put_u32(hello, wire::kValidationMagic);
    wire::put_u8(hello, opcode(Op::kPing));
    auto nonce = static_cast<std::uint32_t>(::getpid());
    wire::put_u32(hello, nonce);
    s.send_all(hello, until);
    // A store answers at once; something else (an HTTP server, a wrong port) is said to be
    // there after 10 s, the wait going on (a store that is only slow answers later).
    if (!s.wait_readable(std::min(until, Clock::now() + std::chrono::seconds(10))) && Clock::now() < until) {
      spdlog::warn("ddprun: {} has not answered the store's handshake within 10 s: overloaded, or not a ddprun or "
                   "PyTorch c10d store{}? Waiting until the time-out", address, check());
    }
    std::uint32_t echo = 0;
    s.recv_exact(&echo, sizeof(echo), until);
    if (echo == auth::kRefusedMarker) {
      throw AuthError("the store at " + address + " refused this client: wrong or missing secret (it requires "
                      "ddprun's authentication; give this client the job's secret file)");
    }
    if (echo != nonce) {
      throw ProtocolError("store: " + address + " answered the store's handshake with something else: it is not a "
                          "ddprun or PyTorch c10d store" + check());
    }
  }

  // ddprun's mutual HMAC handshake (auth.hpp). Any failure is an AuthError: retrying with the
  // same secret cannot help.
  void authenticate(Socket& s, Clock::time_point until) {
    const std::string refused = "the store at " + address + " refused this client: wrong or missing secret";
    std::string cnonce = auth::random_bytes(auth::kNonceBytes);
    std::string hello;
    wire::put_u8(hello, auth::kHelloOpcode);
    wire::put_u32(hello, auth::kHelloMagic);
    hello += cnonce;
    std::string challenge(auth::kChallengeBytes, '\0');
    try {
      s.send_all(hello, until);
      std::uint32_t head = 0;
      s.recv_exact(&head, sizeof(head), until);
      if (head == auth::kBusyMarker) throw BusyError(busy_text());
      std::memcpy(challenge.data(), &head, sizeof(head));
      s.recv_exact(challenge.data() + sizeof(head), challenge.size() - sizeof(head), until);
    } catch (const BusyError&) {
      throw;
    } catch (const NetworkError& e) {
      throw AuthError("the store at " + address + " closed the connection during authentication (" + e.what() +
                      "): it does not authenticate clients, or not with ddprun's handshake; is it this job's "
                      "rendezvous store, started with a secret?");
    }
    std::string snonce = challenge.substr(1, auth::kNonceBytes);
    std::string sproof = challenge.substr(1 + auth::kNonceBytes);
    bool server_ok = challenge[0] == static_cast<char>(auth::kAccepted) &&
                     auth::equal(sproof, auth::server_proof(options.secret, cnonce, snonce));
    // A server that does not know the secret gets no valid proof from us.
    std::string proof = server_ok ? auth::client_proof(options.secret, snonce, cnonce)
                                  : std::string(auth::kProofBytes, '\0');
    std::uint8_t verdict = auth::kRefused;
    try {
      s.send_all(proof, until);
      s.recv_exact(&verdict, 1, until);
    } catch (const NetworkError& e) {
      // A refusal is always said (auth.hpp): a close without a verdict is not one.
      if (!server_ok) throw AuthError(refused + " (the server could not prove it knows this client's secret)");
      throw NetworkError("the store at " + address + " closed the connection before its verdict on this client (" +
                         e.what() + ")");
    }
    if (!server_ok) throw AuthError(refused + " (the server could not prove it knows this client's secret)");
    if (verdict == auth::kBusy) throw BusyError(busy_text());
    if (verdict != auth::kAccepted) throw AuthError(refused);
  }

  std::string busy_text() const {
    return "the store at " + address + " turned this client away: it is at capacity (its limit of connections, or "
           "of connections still authenticating); trying again";
  }

  // Runs one request/reply exchange with the mutex held, reconnecting first if needed, and
  // turns low-level errors into messages naming the operation and the server.
  template <typename F>
  auto call(const char* what, std::string_view key, F&& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (!sock.valid()) connect();
    try {
      return f();
    } catch (const KeysTimeout&) {
      throw;
    } catch (const NetworkError& e) {
      sock.close();
      throw NetworkError("store " + address + ": " + what + " '" + escape_for_log(key, kKeyShown) + "' failed: " + e.what());
    } catch (const TimeoutError& e) {
      sock.close();
      throw TimeoutError("store " + address + ": " + what + " '" + escape_for_log(key, kKeyShown) + "': no answer within " +
                         seconds(timeout) + " (" + e.what() + ")");
    }
  }

  // SET and APPEND: key and value out, no reply.
  void send_key_value(Op op, const char* what, std::string_view key, std::string_view value) {
    call(what, key, [&] {
      std::string req;
      wire::put_u8(req, opcode(op));
      put_key(req, key);
      wire::put_str(req, value);
      sock.send_all(req, deadline());
    });
  }

  std::string read_str() {
    std::uint64_t len = 0;
    sock.recv_exact(&len, sizeof(len), deadline());
    if (len > (std::uint64_t{1} << 34)) throw NetworkError("implausible reply length " + std::to_string(len));
    std::string s(len, '\0');
    if (len) sock.recv_exact(s.data(), len, deadline());
    return s;
  }
  template <typename T>
  T read_int() {
    T v{};
    sock.recv_exact(&v, sizeof(v), deadline());
    return v;
  }

  // Sends WAIT and blocks until answered or `limit` passes; on time-out sends CANCEL_WAIT so the
  // connection stays usable. Mutex held.
  void wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds limit) {
    std::string req;
    wire::put_u8(req, opcode(Op::kWait));
    put_keys(req, keys);
    sock.send_all(req, deadline());
    if (sock.wait_readable(Clock::now() + limit)) {
      auto r = read_int<std::uint8_t>();
      if (r != wire::kStopWaiting) throw NetworkError("unexpected WAIT reply " + std::to_string(r));
      return;
    }
    std::string cancel;
    wire::put_u8(cancel, opcode(Op::kCancelWait));
    sock.send_all(cancel, deadline());
    auto r = read_int<std::uint8_t>();
    if (r == wire::kStopWaiting) {
      // The keys arrived while we cancelled: the wait succeeded; consume the cancel's answer.
      r = read_int<std::uint8_t>();
      if (r != wire::kWaitCanceled) throw NetworkError("unexpected CANCEL_WAIT reply " + std::to_string(r));
      return;
    }
    if (r != wire::kWaitCanceled) throw NetworkError("unexpected CANCEL_WAIT reply " + std::to_string(r));
    throw KeysTimeout("rendezvous: timed out after " + seconds(limit) + " waiting for key" +
                               (keys.size() == 1 ? " " : "s ") + quote_keys(keys) + " on " + address);
  }
};

TcpStore::TcpStore(TcpStoreOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->connect();
}

TcpStore::~TcpStore() = default;

std::string TcpStore::address() const { return impl_->address; }

std::chrono::milliseconds TcpStore::timeout() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->timeout;
}

void TcpStore::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->timeout = timeout;
}

void TcpStore::set(std::string_view key, std::string_view value) { impl_->send_key_value(Op::kSet, "SET", key, value); }

std::string TcpStore::get(std::string_view key) {
  return impl_->call("GET", key, [&] {
    impl_->wait_locked({std::string(key)}, impl_->timeout);
    std::string req;
    wire::put_u8(req, opcode(Op::kGet));
    put_key(req, key);
    impl_->sock.send_all(req, impl_->deadline());
    return impl_->read_str();
  });
}

std::int64_t TcpStore::add(std::string_view key, std::int64_t delta) {
  return impl_->call("ADD", key, [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kAdd));
    put_key(req, key);
    wire::put_i64(req, delta);
    impl_->sock.send_all(req, impl_->deadline());
    return impl_->read_int<std::int64_t>();
  });
}

std::string TcpStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  return impl_->call("COMPARE_SET", key, [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kCompareSet));
    put_key(req, key);
    wire::put_str(req, expected);
    wire::put_str(req, desired);
    impl_->sock.send_all(req, impl_->deadline());
    return impl_->read_str();
  });
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return impl_->call("CHECK", keys.empty() ? "" : keys[0], [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kCheck));
    put_keys(req, keys);
    impl_->sock.send_all(req, impl_->deadline());
    return impl_->read_int<std::uint8_t>() == wire::kReady;
  });
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  impl_->call("WAIT", keys.empty() ? "" : keys[0], [&] { impl_->wait_locked(keys, timeout); });
}

bool TcpStore::delete_key(std::string_view key) {
  return impl_->call("DELETE_KEY", key, [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kDeleteKey));
    put_key(req, key);
    impl_->sock.send_all(req, impl_->deadline());
    return impl_->read_int<std::int64_t>() == 1;
  });
}

std::int64_t TcpStore::num_keys() {
  return impl_->call("GETNUMKEYS", "", [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kGetNumKeys));
    impl_->sock.send_all(req, impl_->deadline());
    return impl_->read_int<std::int64_t>();
  });
}

void TcpStore::append(std::string_view key, std::string_view value) {
  impl_->send_key_value(Op::kAppend, "APPEND", key, value);
}

std::vector<std::string> TcpStore::multi_get(const std::vector<std::string>& keys) {
  return impl_->call("MULTI_GET", keys.empty() ? "" : keys[0], [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kMultiGet));
    put_keys(req, keys);
    impl_->sock.send_all(req, impl_->deadline());
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(impl_->read_str());
    return out;
  });
}

void TcpStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw UsageError("multi_set: " + std::to_string(keys.size()) + " keys but " + std::to_string(values.size()) +
                     " values");
  }
  impl_->call("MULTI_SET", keys.empty() ? "" : keys[0], [&] {
    std::string req;
    wire::put_u8(req, opcode(Op::kMultiSet));
    wire::put_i64(req, static_cast<std::int64_t>(keys.size()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      put_key(req, keys[i]);
      wire::put_str(req, values[i]);
    }
    impl_->sock.send_all(req, impl_->deadline());
  });
}

bool TcpStore::ping(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    if (!impl_->sock.valid()) impl_->connect();
    std::string req;
    wire::put_u8(req, opcode(Op::kPing));
    wire::put_u32(req, 0x5eed);
    auto until = Clock::now() + timeout;
    impl_->sock.send_all(req, until);
    std::uint32_t echo = 0;
    impl_->sock.recv_exact(&echo, sizeof(echo), until);
    return echo == 0x5eed;
  } catch (const Error&) {
    impl_->sock.close();
    return false;
  }
}

}  // namespace ddprun::rendezvous
