#pragma once
// One client connection of the store server, and the state the server's connections share.
// No Asio here: the server's event loop (store_server.cpp) owns the listening socket and the
// epoll set and calls on_event(); everything a client can make the server do happens here.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddprun/rendezvous/store_server.hpp"
#include "handshake.hpp"
#include "handshake_queue.hpp"
#include "output_queue.hpp"
#include "peer_access.hpp"
#include "request_parser.hpp"
#include "store_core.hpp"

namespace ddprun::rendezvous {

class Connection;

using SteadyClock = std::chrono::steady_clock;

StoreLimits store_limits(const StoreServerOptions& o);

// What every connection of one server shares. Owned by the server; used on its I/O thread only.
struct ServerContext {
  explicit ServerContext(StoreServerOptions o)
      : options(std::move(o)),
        core(store_limits(options)),
        handshakes(options.max_unauthenticated_connections, options.max_unauthenticated_per_address) {}

  StoreServerOptions options;
  StoreCore core;
  HandshakeQueue handshakes;         // connections still authenticating, oldest first
  int epoll_fd = -1;
  // Every open connection. A closed one moves to `closing` until the current batch of events is
  // done, since a later event of the same batch may still point at it.
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections;
  std::vector<std::shared_ptr<Connection>> closing;
  std::vector<Connection*> backlog;  // connections with input to process after their turn
  std::vector<char> scratch;         // one recv() at a time, shared
  std::string reply;                 // one request's reply, before it joins a connection's queue
  std::size_t refused = 0;           // connections refused since start
  std::size_t evicted = 0;           // connections still authenticating closed to make room
  bool trim_memory = false;          // a closed connection freed much: malloc_trim after the batch

  // Logs `line` once per `key` (an address and a reason), for refusals a peer can repeat.
  void log_once(const std::string& key, const std::string& line);
  std::unordered_set<std::string> logged;
  // Connections refused, or closed to make room, for want of capacity: each kind counted and
  // logged at most once a second ("store: refused 3 connection(s): <why>").
  struct CountedLog {
    const char* what;
    SteadyClock::time_point last{};
    std::size_t unlogged = 0;
    void note(const std::string& why);
  };
  CountedLog refused_log{"refused"};
  CountedLog evicted_log{"closed"};
  // Per-connection warnings (closes, disconnects), at most kWarningsPerSecond a second, so that
  // a client repeating an abuse cannot flood the log; the number left out is logged after.
  void warn(const std::string& line);
  static constexpr int kWarningsPerSecond = 20;
  SteadyClock::time_point warn_window{};
  int warn_count = 0;
  std::size_t warn_suppressed = 0;
};

class Connection final : public Peer, public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerContext& ctx, int fd, std::string peer);
  ~Connection() override;

  // Registers with the epoll set. False (and logged) when that fails.
  bool start();
  // Handles epoll events. Never throws: a failure closes this connection only.
  void on_event(std::uint32_t events);
  // Reads until the socket is drained or this connection's turn is over; in the latter case it
  // queues itself on the backlog, since edge-triggered epoll will not report that input again.
  void on_readable();
  bool queued() const { return queued_; }
  bool paused() const { return paused_; }
  bool authenticating() const { return auth_ != Auth::kOpen; }
  SteadyClock::time_point accepted_at() const { return accepted_at_; }
  std::size_t pending_output() const { return out_.size(); }

  // Out-of-band reply (woken WAIT, watch notification), called by the core.
  void deliver(std::string_view bytes) override;
  // Closes with one log line giving the reason.
  void close(const std::string& reason);
  // Closes a connection still authenticating to make room for a newer one, telling the client
  // the store is busy (it retries). Logged by the caller, in aggregate.
  void evict();
  // Closes without a log line (server shutdown, reset).
  void abandon() { shutdown(); }

 private:
  enum class Auth { kHello, kProof, kOpen };

  void consume(std::string_view data);
  void apply();
  // Takes handshake bytes from `data`; false when the connection was closed.
  bool authenticate(std::string_view& data);
  void refuse(const std::string& answer, const std::string& why);
  void send_refusal(const std::string& answer);
  void flush();
  ssize_t send_queued(int flags);
  void resume();
  void closed_by_peer();
  void shutdown();

  ServerContext& ctx_;
  int fd_;
  std::string peer_;
  RequestParser parser_;
  Request request_;
  Session session_;
  OutputQueue out_;
  std::string pending_;      // input read but not parsed because the connection is paused
  Auth auth_;
  std::unique_ptr<ServerHandshake> handshake_;  // until authenticated
  SteadyClock::time_point accepted_at_ = SteadyClock::now();
  bool closed_ = false;
  bool queued_ = false;      // on the backlog
  bool paused_ = false;      // replies over the high-water mark: not reading
  bool peer_done_ = false;   // the peer shut down its side (EPOLLRDHUP) or the socket failed
};

}  // namespace ddprun::rendezvous
