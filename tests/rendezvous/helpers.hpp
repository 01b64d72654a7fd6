#pragma once
#include <chrono>
#include <thread>
// Shared test helpers: a server on 127.0.0.1 port 0, a raw client that speaks bytes, and a
// capture of the server's log lines.

#include <sys/socket.h>

#include <cerrno>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/rendezvous/protocol.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "socket.hpp"

namespace ddprun::rendezvous::test {

using namespace std::chrono_literals;
using wire::Dialect;
using wire::Op;

inline Clock::time_point in(std::chrono::milliseconds d) { return Clock::now() + d; }

// A TcpStore client of the server on this host's `port`, with a 5 s time-out.
inline TcpStore client(std::uint16_t port) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = 5s;
  return TcpStore(o);
}

// Captures log lines from the moment it is made; replaces the default logger while alive.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1024)) {
    previous_ = spdlog::default_logger();
    auto logger = std::make_shared<spdlog::logger>("test", sink_);
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  // Lines containing every one of `parts`.
  std::vector<std::string> lines_with(std::initializer_list<std::string> parts) const {
    std::vector<std::string> out;
    for (const auto& l : sink_->last_formatted()) {
      bool all = true;
      for (const auto& p : parts) all = all && l.find(p) != std::string::npos;
      if (all) out.push_back(l);
    }
    return out;
  }
  // As lines_with, once at least `n` such lines are there or `limit` passed: the server logs on
  // its own thread, possibly after the client has seen the effect.
  std::vector<std::string> await_lines_with(std::initializer_list<std::string> parts, std::size_t n = 1,
                                            std::chrono::milliseconds limit = std::chrono::seconds(2)) const {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto found = lines_with(parts);
      if (found.size() >= n || std::chrono::steady_clock::now() > deadline) return found;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

class TestServer {
 public:
  explicit TestServer(StoreServerOptions o = with_loopback()) : server_(std::move(o)) { server_.start(); }
  std::uint16_t port() const { return server_.port(); }
  StoreServerStats stats() { return server_.stats(); }
  static StoreServerOptions with_loopback() {
    StoreServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }

 private:
  StoreServer server_;
};

// Builds one request in a dialect.
class Frame {
 public:
  Frame(Dialect d, Op op) { wire::put_u8(bytes_, *wire::encode_op(op, d)); }
  Frame& str(std::string_view s) { wire::put_str(bytes_, s); return *this; }
  Frame& u32(std::uint32_t v) { wire::put_u32(bytes_, v); return *this; }
  Frame& u64(std::uint64_t v) { wire::put_u64(bytes_, v); return *this; }
  Frame& i64(std::int64_t v) { wire::put_i64(bytes_, v); return *this; }
  Frame& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (const auto& k : ks) str(k);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }
  operator std::string_view() const { return bytes_; }

 private:
  std::string bytes_;
};

// A client that writes and reads raw protocol bytes.
class Raw {
 public:
  explicit Raw(std::uint16_t port, std::string host = "127.0.0.1")
      : sock_(Socket::connect(host, port, in(5s))) {}
  // Opens a connection speaking `d`: 2.x sends VALIDATE first, 1.13 sends nothing.
  static Raw speaking(Dialect d, std::uint16_t port) {
    Raw r(port);
    if (d == Dialect::kV2) r.send(Frame(d, Op::kValidate).u32(wire::kValidationMagic));
    return r;
  }
  void send(std::string_view bytes) { sock_.send_all(bytes, in(5s)); }
  template <typename T>
  T read() {
    T v{};
    sock_.recv_exact(&v, sizeof(v), in(5s));
    return v;
  }
  std::uint8_t u8() { return read<std::uint8_t>(); }
  std::int64_t i64() { return read<std::int64_t>(); }
  std::string str() {
    auto n = read<std::uint64_t>();
    std::string s(n, '\0');
    if (n) sock_.recv_exact(s.data(), n, in(5s));
    return s;
  }
  // Round trip that proves everything the server sent before it has been read: a PING (2.x)
  // whose echo must be the next 4 bytes. Used to show that no WAIT reply is pending.
  bool ping_is_next() {
    send(Frame(Dialect::kV2, Op::kPing).u32(0xA1B2C3D4));
    return read<std::uint32_t>() == 0xA1B2C3D4;
  }
  // True when the server closes the connection within 5 s (EOF or reset), reading and
  // discarding whatever it still sends.
  bool closed_by_server() {
    char buf[65536];
    for (;;) {
      if (!sock_.wait_readable(in(5s))) return false;
      ssize_t n = ::recv(sock_.fd(), buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
    }
  }
  Socket& socket() { return sock_; }

 private:
  Socket sock_;
};

}  // namespace ddprun::rendezvous::test
