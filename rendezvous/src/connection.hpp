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
#include "memory_budget.hpp"
#include "message.hpp"
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
        budget(options.max_store_bytes),
        core(store_limits(options), &budget),
        handshakes(options.max_unauthenticated_connections, options.max_unauthenticated_per_address) {}

  StoreServerOptions options;
  MemoryBudget budget;               // --max_store_bytes: the core's data and every connection's buffers
  StoreCore core;
  HandshakeQueue handshakes;         // connections still authenticating, oldest first
  int epoll_fd = -1;
  // Every open connection. A closed one moves to `closing` until the current batch of events is
  // done, since a later event of the same batch may still point at it.
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections;
  std::vector<std::shared_ptr<Connection>> closing;
  std::vector<std::shared_ptr<Connection>> reaping;  // closed, their waits still being dropped
  std::vector<Connection*> backlog;  // connections with input to process after their turn
  std::vector<Connection*> flush_later;  // connections sent notifications, to flush from the loop
  // One recv() at a time, shared; also what a paused connection keeps. Made at the first read:
  // zeroing 64 KiB cost 16 page faults at every launch, most of whose stores are never read from.
  static constexpr std::size_t kScratchBytes = 64 * 1024;
  std::vector<char> scratch;
  Message reply;                     // one request's reply, before it joins a connection's queue
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
  // The backlog's turn: it is off the backlog, then reads.
  void take_turn();
  bool queued() const { return queued_; }
  bool paused() const { return paused_; }
  bool authenticating() const { return auth_ != Auth::kOpen; }
  SteadyClock::time_point accepted_at() const { return accepted_at_; }
  std::size_t pending_output() const { return out_.size(); }

  // Out-of-band output (woken WAIT, watch event), called by the core. Charged to this client:
  // when it does not fit (its unsent output cap, the budget), this client is closed. Queued on
  // ctx.flush_later, to be sent from the event loop.
  void deliver(const Message& m) override;
  // Sends what deliver() queued (the loop calls it); returns the bytes the socket took.
  // Sends at most `max_bytes`; what is left once the socket still took them all goes back on
  // ctx.flush_later for the next turn (no EPOLLOUT edge would come for it).
  std::size_t flush_later(std::size_t max_bytes);
  // Closes with one log line giving the reason.
  void close(const std::string& reason);
  // Closes a connection still authenticating to make room for a newer one, telling the client
  // the store is busy (it retries). Logged by the caller, in aggregate.
  void evict();
  // Closes without a log line and lets go of everything at once (server shutdown, reset).
  void abandon();
  // A closed connection's pending waits are dropped kDropsPerTurn at a time, from the loop (see
  // ServerContext::reaping); true once all are gone and the socket is closed.
  bool reap(std::size_t max_waits);
  static constexpr std::size_t kDropsPerTurn = 1024;

 private:
  enum class Auth { kHello, kProof, kOpen };

  void consume(std::string_view data);
  void apply();
  void queue_reply();
  // Sets what this connection holds on the budget; true when the budget is not exceeded.
  bool sync_charge();
  std::string over_budget(const std::string& what) const;
  // Takes handshake bytes from `data`; false when the connection was closed.
  bool authenticate(std::string_view& data);
  void refuse(const std::string& answer, const std::string& why);
  void send_refusal(const std::string& answer);
  // Sends what is queued, at most `max_bytes`, without blocking; true when it stopped at that cap.
  bool flush(std::size_t max_bytes = ~std::size_t{0});
  ssize_t send_queued(int flags, std::size_t max_bytes = ~std::size_t{0});
  void resume();
  void queue_turn();
  bool turn_over();
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
  Tally charge_;             // its buffers on the budget: sync_charge()
  std::size_t request_held_ = 0;  // heap bytes of request_ counted in charge_
  Auth auth_;
  std::unique_ptr<ServerHandshake> handshake_;  // until authenticated
  SteadyClock::time_point accepted_at_ = SteadyClock::now();
  bool closed_ = false;
  bool queued_ = false;      // on the backlog
  bool flush_queued_ = false;  // on ctx_.flush_later
  int turn_requests_ = 0;    // requests applied in this turn
  SteadyClock::time_point turn_started_{};
  bool paused_ = false;      // replies over the high-water mark: not reading
  bool peer_done_ = false;   // the peer shut down its side (EPOLLRDHUP) or the socket failed
  bool trim_after_ = false;  // it held much: malloc_trim once it is reaped
};

}  // namespace ddprun::rendezvous
