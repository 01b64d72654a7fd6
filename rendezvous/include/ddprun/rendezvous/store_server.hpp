#pragma once
// The rendezvous store server: PyTorch's TCPStore protocol (1.13 and 2.x numberings, told apart
// per connection) on one event-driven I/O thread. A misbehaving client only ever loses its own
// connection; nothing it sends can crash the server, stall other clients, or make the server
// hold more than the caps below (per connection: the output cap plus one request).
//
// Access control (README "Security"): an optional address allow-list for peers on other hosts;
// for peers on this host, optionally only processes of this process's user (or root), as the
// kernel reports the owner of the peer's socket; and optionally ddprun's HMAC handshake with a
// per-job secret before any request (ddprun's own clients only: PyTorch cannot speak it).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

  // ---- memory caps; a request over one closes its connection with a log line naming the cap
  std::size_t max_reply_bytes = 32 * 1024 * 1024;       // one reply (MULTI_GET)
  // The memory budget: everything clients make the store hold (keys, values and queued items
  // with their overhead, WAIT and WATCH registrations, each connection's buffers and unsent
  // output). A request that does not fit fails for its client; a client that cannot take a
  // notification is disconnected. The process stays under it plus a constant (README).
  std::size_t max_store_bytes = std::size_t{1} << 30;
  std::size_t max_waits_per_connection = 128 * 1024;    // keys one connection waits on at once
  std::size_t max_watches_per_connection = 1024;        // WATCH_KEY registrations (1.13)
  std::size_t max_queue_length = 1024 * 1024;           // items in one queue
  // A connection whose unsent replies reach this is not read from until they drain to half.
  std::size_t output_high_water_bytes = 1024 * 1024;
  // Unsent replies beyond which a client is disconnected (only notifications it did not ask
  // for, WAIT wake-ups and watch events, can push a paused client there).
  std::size_t max_pending_output_bytes = 64 * 1024 * 1024;

  // ---- connections
  std::size_t max_connections = 65536;
  // Descriptors left free for the process hosting the store (an agent needs pipes for its next
  // workers): a connection that would use one of the last `reserved_fds` is refused.
  std::size_t reserved_fds = 256;
  // TCP keep-alive: a peer silent this long is probed (every idle/3, 3 probes) and reaped when
  // it has vanished. 0 turns it off.
  std::chrono::seconds tcp_keepalive_idle{30};
  // Raise RLIMIT_NOFILE to its hard limit, so that >= 10,000 clients can connect.
  bool raise_fd_limit = true;

  // ---- access control
  // Peers on other hosts must be in one of these CIDR blocks; nullopt: any address. Peers on
  // this host (loopback, or one of this host's addresses) pass this check.
  std::optional<std::vector<std::string>> allow;
  // Peers on this host must be processes of this process's user, or root.
  bool same_user = false;
  // Non-empty: ddprun's HMAC handshake is required before any request (auth.hpp).
  std::string secret;
  // A connection that has not authenticated by then is closed.
  std::chrono::milliseconds auth_timeout{10000};
  // Connections still authenticating (with a secret), in all and from one source address. A
  // newcomer over either cap, or over max_connections or the descriptor reserve, makes the
  // oldest of them close (told the store is busy, so a ddprun client retries): clients without
  // the secret cannot crowd out those that have it.
  std::size_t max_unauthenticated_connections = 1024;
  std::size_t max_unauthenticated_per_address = 64;

  // For tests: called on the I/O thread before each request is applied; an exception it throws
  // is handled as one thrown by the request.
  std::function<void(std::string_view op, std::string_view first_key)> on_request;
  // For measurements (ddprun-store --count_requests): called on the I/O thread after each
  // request was applied without error, with its operation, its first key, the key and value
  // bytes it carried, and the bytes of its reply (0 for a WAIT that is not answered at once).
  std::function<void(std::string_view op, std::string_view first_key, std::size_t request_bytes,
                     std::size_t reply_bytes)>
      on_applied;
};

struct StoreServerStats {
  std::size_t connections = 0;
  std::size_t paused_connections = 0;    // not read from until their replies drain
  std::size_t pending_output_bytes = 0;  // replies queued, all connections
  std::size_t max_pending_output_bytes = 0;
  std::size_t refused_connections = 0;   // since start: cap, descriptors, access control
  std::size_t unauthenticated = 0;       // connections still authenticating now
  std::size_t evicted_unauthenticated = 0;  // since start: closed to make room for newer ones
  std::size_t keys = 0;
  std::size_t store_bytes = 0;           // key and value bytes stored
  std::size_t memory_bytes = 0;          // the memory budget in use (max_store_bytes caps it)
  std::size_t memory_limit = 0;
  std::size_t wait_lists = 0;            // keys somebody waits on
  std::size_t wait_entries = 0;
  std::size_t watch_entries = 0;
  std::size_t waits_woken = 0;           // since start: WAITs answered when their last key was set
};

class StoreServer {
 public:
  // Binds and listens at once (so the port is taken before anyone is told about it). Throws
  // NetworkError naming the address when it cannot bind (address in use, unknown host), and
  // UsageError for inconsistent options or a malformed allow-list.
  explicit StoreServer(StoreServerOptions options);
  // Stops and joins the I/O thread if it runs.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Serves on a background thread until stop(). Before, connections wait in the listen queue
  // (and stats(), reset() are done on the caller's thread).
  void start();
  // The listening socket (to learn, with a reactor of one's own, that a client is waiting).
  int listen_fd() const;
  // Serves on the calling thread until stop() (from another thread or a signal handler thread).
  void run();
  // Thread-safe; idempotent.
  void stop();

  // Forgets every key and closes every client connection, as a freshly started server would
  // be. An agent calls it between restart attempts, once all workers of the old attempt are
  // gone, so that nothing of that attempt (keys, stale clients) can confuse the next one.
  // Thread-safe; returns when done.
  void reset();

  // Replaces the allow-list of peers on other hosts (nullopt: any address). Thread-safe;
  // applies to connections accepted from now on. Throws UsageError for a malformed entry.
  void set_allow(std::optional<std::vector<std::string>> cidrs);

  // A consistent snapshot, taken on the I/O thread. Thread-safe.
  StoreServerStats stats();

  // The bound port (the real one when options.port was 0) and host as bound ("0.0.0.0", "::").
  std::uint16_t port() const;
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
