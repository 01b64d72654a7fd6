#pragma once
// A blocking-with-deadline TCP socket for clients (the store client, tests, benchmarks). Plain
// POSIX: no Asio, so that code linking the client compiles fast and pulls in nothing.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include "ddprun/common/text.hpp"

namespace ddprun::rendezvous {

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  // Connects once to host:port (every resolved address in turn). Throws NetworkError with the
  // last error, or TimeoutError at the deadline. The socket is non-blocking with TCP_NODELAY.
  static Socket connect(const std::string& host, std::uint16_t port, Clock::time_point deadline);

  // Sends all of `data`; throws NetworkError or TimeoutError.
  void send_all(std::string_view data, Clock::time_point deadline);
  // Receives exactly n bytes; throws NetworkError (peer closed, reset) or TimeoutError.
  void recv_exact(void* buf, std::size_t n, Clock::time_point deadline);
  // Waits until readable or the deadline; true when readable.
  bool wait_readable(Clock::time_point deadline);

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

 private:
  int fd_ = -1;
};

using ddprun::format_address;  // ddprun/common/text.hpp

}  // namespace ddprun::rendezvous
