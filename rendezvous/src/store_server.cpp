#include "ddprun/rendezvous/store_server.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <malloc.h>

#include <spdlog/spdlog.h>
#include <future>
#include <mutex>
#include <thread>

#include "admission.hpp"
#include "connection.hpp"
#include "listener.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/thread.hpp"
#include "socket.hpp"

// Design. Asio owns the event loop: the listening socket, the stop signal, timers. Client
// connections live in an inner edge-triggered epoll set whose descriptor Asio waits on. Per
// request that costs exactly one recv() and one send(): Asio's per-socket operations add a
// third system call to every request (a speculative recv() that returns EAGAIN, or an
// epoll_ctl() to re-arm), which on loopback is a third of the server's time. Everything runs on
// one thread; the StoreCore is not shared. connection.cpp has everything a client can trigger.
// Every turn of the loop is bounded, so that no client holds it for more than a few ms: a
// connection reads for 16 x 64 KiB or about 1 ms of requests, then waits on the backlog (once); output a
// client did not ask for (watch events, WAIT wake-ups) is sent 1 MiB a turn; a closed
// connection's waits are dropped 1,024 a turn before its socket closes.

namespace ddprun::rendezvous {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr int kEventsPerWait = 512;
constexpr int kAcceptsPerTurn = 512;
// Notifications sent per turn of the loop, in all. A SET of 8 MiB watched by 200 clients that
// never read fills 200 sockets (a few MiB each); 1 MiB a turn, and whole connections past it,
// made turns of 20-130 ms on a loaded machine, and other clients' PINGs waited 0.14-1.8 s.
constexpr std::size_t kFlushBytesPerTurn = 1 << 20;

// A count as given: a negative one arrives wrapped to nearly 2^64.
std::string count_text(std::size_t v) { return v > SIZE_MAX / 2 ? "a negative number" : std::to_string(v); }

void check_options(const StoreServerOptions& o) {
  auto fail = [](const std::string& m) { throw UsageError("store options: " + m); };
  std::size_t biggest_reply = std::max(o.max_reply_bytes, 2 * o.limits.max_value_bytes + 64);
  if (o.max_pending_output_bytes < o.output_high_water_bytes + biggest_reply) {
    fail("--max_pending_output_bytes (" + std::to_string(o.max_pending_output_bytes) +
         ") must be at least --output_high_water_bytes plus the largest reply (max(--max_reply_bytes, 2 x "
         "--max_value_bytes)): " + std::to_string(o.output_high_water_bytes + biggest_reply));
  }
  if (o.max_reply_bytes < o.limits.max_value_bytes + 8) fail("--max_reply_bytes must hold one value (--max_value_bytes + 8)");
  // Counts: at least 1, and not a negative number wrapped to 2^64 - 1 by the command line.
  for (const auto& [name, v] : {std::pair<const char*, std::size_t>{"max_connections", o.max_connections},
                                {"max_keys_per_request", o.limits.max_keys_per_request},
                                {"max_key_bytes", o.limits.max_key_bytes},
                                {"max_waits_per_connection", o.max_waits_per_connection},
                                {"max_watches_per_connection", o.max_watches_per_connection},
                                {"max_queue_length", o.max_queue_length},
                                {"max_unauthenticated_connections", o.max_unauthenticated_connections},
                                {"max_unauthenticated_per_address", o.max_unauthenticated_per_address}}) {
    if (v == 0 || v > 1'000'000'000) fail(std::string("--") + name + " must be 1 to 1000000000 (got " + count_text(v) + ")");
  }
  if (o.reserved_fds > 1'000'000) fail("--reserved_fds must be 0 to 1000000 (got " + count_text(o.reserved_fds) + ")");
  if (o.tcp_keepalive_idle.count() > 32767) {
    fail("--tcp_keepalive_s must be at most 32767 (Linux's bound on TCP_KEEPIDLE; got " +
         std::to_string(o.tcp_keepalive_idle.count()) + ")");
  }
  if (o.output_high_water_bytes == 0) fail("--output_high_water_bytes must be at least 1");
}

}  // namespace

struct StoreServer::Impl {
  explicit Impl(StoreServerOptions o) : ctx(std::move(o)) {
    ctx.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (ctx.epoll_fd < 0) throw NetworkError(std::string("store: epoll_create1 failed: ") + std::strerror(errno));
    epoll_desc.assign(ctx.epoll_fd);
    admission.set_allow(ctx.options.allow);
  }
  ~Impl() { close_all(); }

  ServerContext ctx;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::posix::stream_descriptor epoll_desc{io};
  asio::steady_timer retry_timer{io};
  asio::steady_timer auth_timer{io};
  Admission admission{ctx};
  std::size_t fd_limit = 1024;
  std::string host;
  std::uint16_t port = 0;
  std::thread thread;
  // start() against on_io_thread() on another thread (a metrics scrape): until the thread runs,
  // work is done inline, and the thread does not start while such work is under way.
  std::mutex start_mu;
  bool waiting_for_events = false;
  bool fd_limit_logged = false;

  void close_all() {
    auto open = std::move(ctx.connections);
    ctx.connections.clear();
    for (auto& [ptr, conn] : open) conn->abandon();
    for (auto& conn : ctx.reaping) conn->abandon();
    ctx.reaping.clear();
    ctx.backlog.clear();
    ctx.flush_later.clear();
    ctx.closing.clear();
  }

  // Runs `f` on the I/O thread and waits for it (inline when the loop is not running).
  template <typename F>
  void on_io_thread(F&& f) {
    {
      std::lock_guard<std::mutex> lk(start_mu);
      if (!thread.joinable() || io.stopped()) {
        f();
        return;
      }
    }
    std::promise<void> done;
    asio::post(io, [&] {
      try {
        f();
        done.set_value();
      } catch (...) {
        done.set_exception(std::current_exception());
      }
    });
    done.get_future().get();
  }

  void bind(const StoreServerOptions& o) {
    auto bound = listen_on(acceptor, o.host, o.port);
    host = bound.host;
    port = bound.port;
  }

  // Accepting: on readiness, accept4() until the queue is empty (or a batch is done), so a
  // burst of thousands of connects drains quickly.
  void wait_for_clients() {
    acceptor.async_wait(tcp::acceptor::wait_read, [this](boost::system::error_code ec) {
      if (ec == asio::error::operation_aborted) return;
      accept_batch();
    });
  }

  void accept_batch() {
    for (int i = 0; i < kAcceptsPerTurn; ++i) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(acceptor.native_handle(), reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: existing clients go on; retry shortly instead of spinning.
          if (!fd_limit_logged) {
            spdlog::warn("store: cannot accept more clients: {} ({} connected); raise the open-file limit (ulimit -n)",
                         std::strerror(errno), ctx.connections.size());
            fd_limit_logged = true;
          }
          retry_timer.expires_after(std::chrono::milliseconds(50));
          retry_timer.async_wait([this](boost::system::error_code e) {
            if (!e) accept_batch();
          });
          return;
        }
        spdlog::debug("store: accept failed: {}", std::strerror(errno));
        continue;
      }
      if (!admission.admit(fd, addr, fd_limit)) continue;
      admission.configure(fd);
      auto peer = IpAddress::from_sockaddr(addr);
      std::string name = peer ? format_address(peer->to_string(), peer->port) : std::string("?");
      std::shared_ptr<Connection> conn;
      try {
        conn = std::make_shared<Connection>(ctx, fd, std::move(name));
      } catch (const std::bad_alloc&) {
        ::close(fd);
        admission.refuse_for_capacity("out of memory");
        continue;
      }
      if (conn->start()) {
        if (conn->authenticating()) queue_handshake(conn.get(), peer ? peer->to_string() : std::string("?"));
        ctx.connections.emplace(conn.get(), std::move(conn));
        // Data may have arrived before the socket joined the epoll set; EPOLL_CTL_ADD reports
        // current readiness, so the first event covers it.
      }
    }
    wait_for_clients();
    poll_connections();  // new connections' first requests are often already there
  }

  // Enters `c` among the connections still authenticating, closing the oldest over the caps.
  void queue_handshake(Connection* c, const std::string& address) {
    auto evict = ctx.handshakes.add(c, address, c->accepted_at());
    for (auto* old : evict) old->evict();
    if (!evict.empty()) {
      ctx.evicted_log.note(fmt::format("still authenticating, the oldest, to make room for newer ones "
                                       "(--max_unauthenticated_connections={}, --max_unauthenticated_per_address={}); "
                                       "they are told to try again",
                                       ctx.options.max_unauthenticated_connections,
                                       ctx.options.max_unauthenticated_per_address));
    }
  }

  // Connections: Asio reports the epoll set readable; we harvest its events without blocking.
  void wait_for_events() {
    if (waiting_for_events) return;
    waiting_for_events = true;
    epoll_desc.async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
      waiting_for_events = false;
      if (ec == asio::error::operation_aborted) return;
      poll_connections();
    });
  }

  void poll_connections() {
    epoll_event events[kEventsPerWait];
    int n = ::epoll_wait(ctx.epoll_fd, events, kEventsPerWait, 0);
    for (int i = 0; i < n; ++i) {
      static_cast<Connection*>(events[i].data.ptr)->on_event(events[i].events);  // never throws
    }
    // Connections whose turn ended with input left, or that were resumed: one more turn each.
    if (!ctx.backlog.empty()) {
      auto backlog = std::move(ctx.backlog);
      ctx.backlog.clear();
      for (auto* c : backlog) {
        if (!ctx.connections.count(c) || !c->queued()) continue;
        try {
          c->take_turn();
        } catch (const std::exception& e) {
          c->close(std::string("internal error while serving this client: ") + e.what());
        }
      }
    }
    flush_notified();
    if (!ctx.reaping.empty() && ctx.reaping.front()->reap(Connection::kDropsPerTurn)) {
      ctx.reaping.erase(ctx.reaping.begin());
    }
    ctx.closing.clear();
    if (ctx.trim_memory) {
      ctx.trim_memory = false;
      ::malloc_trim(0);
    }
    if (n == kEventsPerWait || !ctx.backlog.empty() || !ctx.flush_later.empty() || !ctx.reaping.empty()) {
      asio::post(io, [this] { poll_connections(); });  // more to do: yield, then continue
    } else {
      wait_for_events();
    }
  }

  // Sends the notifications queued, kFlushBytesPerTurn in all (a connection cut at the cap
  // goes to the back of the list): a turn never pushes more than that into sockets.
  void flush_notified() {
    std::size_t sent = 0, i = 0;
    auto& list = ctx.flush_later;
    for (; i < list.size() && sent < kFlushBytesPerTurn; ++i) {
      if (ctx.connections.count(list[i])) sent += list[i]->flush_later(kFlushBytesPerTurn - sent);
    }
    list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Closes connections that have not authenticated within auth_timeout.
  void sweep_unauthenticated() {
    auth_timer.expires_after(std::chrono::seconds(1));
    auth_timer.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      auto late = ctx.handshakes.older_than(SteadyClock::now() - ctx.options.auth_timeout);
      for (auto* c : late) c->close("it did not authenticate within the time allowed");
      ctx.closing.clear();
      sweep_unauthenticated();
    });
  }
};

StoreServer::StoreServer(StoreServerOptions options) {
  check_options(options);
  bool raise = options.raise_fd_limit;
  impl_ = std::make_unique<Impl>(std::move(options));
  impl_->fd_limit = raise_fd_limit(raise);
  if (impl_->ctx.options.reserved_fds + 16 >= impl_->fd_limit) {  // (a few for the listener, logs, the store's own)
    throw UsageError("store options: --reserved_fds " + std::to_string(impl_->ctx.options.reserved_fds) +
                     " leaves no descriptor for a client under this process's open-file limit (" +
                     std::to_string(impl_->fd_limit) + ": ulimit -n); give fewer, or raise the limit");
  }
  impl_->bind(impl_->ctx.options);
  impl_->wait_for_clients();
  impl_->wait_for_events();
  if (!impl_->ctx.options.secret.empty()) impl_->sweep_unauthenticated();
  spdlog::debug("store: listening on {}", format_address(impl_->host, impl_->port));
}

StoreServer::~StoreServer() {
  stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int StoreServer::listen_fd() const { return impl_->acceptor.native_handle(); }

void StoreServer::start() {
  std::lock_guard<std::mutex> lk(impl_->start_mu);
  if (impl_->thread.joinable()) return;
  impl_->thread = start_thread("the store's thread", [this] { run(); });
}

void StoreServer::run() {
  while (!impl_->io.stopped()) {
    try {
      impl_->io.run();
    } catch (const std::exception& e) {
      // Per-connection errors are handled in the connection; reaching here is a bug. Log it,
      // make sure the connections are watched again, and keep serving rather than terminate the
      // agent that hosts the store.
      spdlog::error("store: unexpected error in the I/O loop: {}", e.what());
      impl_->waiting_for_events = false;
      impl_->wait_for_events();
    }
  }
}

void StoreServer::stop() { impl_->io.stop(); }

void StoreServer::reset() {
  impl_->on_io_thread([this] {
    impl_->close_all();
    // Connections still waiting to be accepted are as stale as the open ones: a client that
    // connected, sent a SET and exited may not have been accepted yet.
    for (;;) {
      int fd = ::accept4(impl_->acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      ::close(fd);
    }
    impl_->ctx.core.clear();
    spdlog::debug("store: reset");
  });
}

void StoreServer::set_allow(std::optional<std::vector<std::string>> cidrs) {
  if (cidrs) {
    for (const auto& c : *cidrs) parse_cidr_list(c);  // a bad list throws here, on the caller's thread
  }
  impl_->on_io_thread([&] { impl_->admission.set_allow(cidrs); });
}

StoreServerStats StoreServer::stats() {
  StoreServerStats s;
  impl_->on_io_thread([&] {
    auto& ctx = impl_->ctx;
    s.connections = ctx.connections.size();
    for (const auto& [ptr, c] : ctx.connections) {
      s.paused_connections += c->paused() ? 1 : 0;
      s.pending_output_bytes += c->pending_output();
      s.max_pending_output_bytes = std::max(s.max_pending_output_bytes, c->pending_output());
    }
    s.refused_connections = ctx.refused;
    s.unauthenticated = ctx.handshakes.size();
    s.evicted_unauthenticated = ctx.evicted;
    auto core = ctx.core.stats();
    s.keys = core.keys;
    s.store_bytes = core.store_bytes;
    s.memory_bytes = core.memory_bytes;
    s.memory_limit = ctx.budget.limit();
    s.wait_lists = core.wait_lists;
    s.wait_entries = core.wait_entries;
    s.watch_entries = core.watch_entries;
    s.waits_woken = core.waits_woken;
  });
  return s;
}

std::uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::host() const { return impl_->host; }

}  // namespace ddprun::rendezvous
