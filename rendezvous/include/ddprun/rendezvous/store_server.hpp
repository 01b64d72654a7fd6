#pragma once
// The rendezvous store server: PyTorch's TCPStore protocol (1.13 and 2.x numberings, told apart
// per connection) on one event-driven I/O thread. A misbehaving client only ever loses its own
// connection; nothing it sends can crash or stall the server.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/rendezvous/protocol.hpp"

namespace ddprun::rendezvous {

struct StoreServerOptions {
  // Address to bind: an IPv4 or IPv6 literal or a host name. Empty = every interface
  // (dual-stack "::" where IPv6 exists, else "0.0.0.0").
  std::string host = "";
  // 0 picks a free port; read it back with port().
  std::uint16_t port = 0;
  // Limits on one request (key 8 KiB, value 8 MiB, ...); a violation closes that connection.
  wire::WireLimits limits = {};
  // Replies queued for a client that does not read them, beyond which it is disconnected.
  std::size_t max_pending_output_bytes = 64 * 1024 * 1024;
  // Raise RLIMIT_NOFILE to its hard limit, so that >= 10,000 clients can connect.
  bool raise_fd_limit = true;
};

class StoreServer {
 public:
  // Binds and listens at once (so the port is taken before anyone is told about it). Throws
  // NetworkError naming the address when it cannot bind (address in use, unknown host).
  explicit StoreServer(StoreServerOptions options);
  // Stops and joins the I/O thread if it runs.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Serves on a background thread until stop().
  void start();
  // Serves on the calling thread until stop() (from another thread or a signal handler thread).
  void run();
  // Thread-safe; idempotent.
  void stop();

  // Forgets every key and closes every client connection, as a freshly started server would
  // be. An agent calls it between restart attempts, once all workers of the old attempt are
  // gone, so that nothing of that attempt (keys, stale clients) can confuse the next one.
  // Thread-safe; returns when done.
  void reset();

  // The bound port (the real one when options.port was 0) and host as bound ("0.0.0.0", "::").
  std::uint16_t port() const;
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
