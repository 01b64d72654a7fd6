#include "ddprun/rendezvous/store_server.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <climits>
#include <spdlog/spdlog.h>
#include <future>
#include <thread>
#include <unordered_map>

#include "ddprun/rendezvous/error.hpp"
#include "socket.hpp"
#include "store_core.hpp"

// Design. Asio owns the event loop: the listening socket, the stop signal, the accept retry
// timer. Client connections live in an inner edge-triggered epoll set whose descriptor Asio
// waits on. Per request that costs exactly one recv() and one send(): Asio's per-socket
// operations add a third system call to every request (a speculative recv() that returns
// EAGAIN, or an epoll_ctl() to re-arm), which on loopback is a third of the server's time.
// Everything runs on one thread; the StoreCore is not shared.

namespace ddprun::rendezvous {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr std::size_t kReadChunk = 256 * 1024;   // one recv() into the shared scratch buffer
constexpr int kReadsPerTurn = 16;                // then other connections get their turn
constexpr int kEventsPerWait = 512;
constexpr int kAcceptsPerTurn = 512;

void raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  auto before = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
    spdlog::debug("store: raised the open-file limit from {} to {}", before, lim.rlim_cur);
  }
}

std::string endpoint_string(const tcp::endpoint& ep) {
  return format_address(ep.address().to_string(), ep.port());
}

std::string peer_name(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return format_address(host, port);
}

class Connection;

}  // namespace

struct ServerState {
  StoreServerOptions options;
  StoreCore core;
  int epoll_fd = -1;
  // Every open connection. A closed one moves to `closing` until the current batch of events is
  // done, since a later event of the same batch may still point at it.
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections;
  std::vector<std::shared_ptr<Connection>> closing;
  std::vector<Connection*> backlog;  // connections with unread input left after their turn
  std::vector<char> scratch = std::vector<char>(kReadChunk);
  // Last member, so destroyed first: its handlers refer to the members above.
  asio::io_context io{1};
};

namespace {

// One client connection. Owned by ServerState::connections; the core holds only weak
// references (Session, Waiter), so a closed connection is freed after the current batch.
class Connection final : public Peer, public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerState& state, int fd, std::string peer)
      : state_(state), fd_(fd), peer_(std::move(peer)), parser_(state.options.limits) {}
  ~Connection() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // Registers with the epoll set. False (and logged) when that fails.
  bool start() {
    session_.peer = weak_from_this();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = this;
    if (::epoll_ctl(state_.epoll_fd, EPOLL_CTL_ADD, fd_, &ev) != 0) {
      spdlog::warn("store: cannot watch the connection from {}: {}", peer_, std::strerror(errno));
      return false;
    }
    spdlog::debug("store: connection from {}", peer_);
    return true;
  }

  void on_event(std::uint32_t events) {
    if (closed_) return;
    if (events & EPOLLOUT) flush();
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer_done_ = true;
    if (!closed_ && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) on_readable();
  }

  // Reads until the socket is drained or this connection's turn is over; in the latter case it
  // queues itself on the backlog, since edge-triggered epoll will not report that input again.
  void on_readable() {
    queued_ = false;
    for (int turn = 0; turn < kReadsPerTurn; ++turn) {
      auto& buf = state_.scratch;
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) {
          closed_by_peer();
        } else {
          close(std::string("read failed: ") + std::strerror(errno));
        }
        return;
      }
      if (n == 0) {
        closed_by_peer();
        return;
      }
      consume(std::string_view(buf.data(), static_cast<std::size_t>(n)));
      if (closed_) return;
      // A short read means the socket was empty at that moment; later input raises a new edge.
      // Not so for the end of the stream: once the peer has shut down, read on to see it.
      if (static_cast<std::size_t>(n) < buf.size() && !peer_done_) return;
    }
    queued_ = true;
    state_.backlog.push_back(this);
  }

  bool queued() const { return queued_; }

  // Out-of-band reply (woken WAIT, watch notification), called by the core.
  void deliver(std::string_view bytes) override {
    if (closed_) return;
    out_.append(bytes);
    flush();
  }

  // Closes without a log line (server shutdown).
  void abandon() { shutdown(); }

 private:
  // Parses and applies every complete request in `data` (after what is already buffered);
  // keeps an incomplete tail for the next read.
  void consume(std::string_view data) {
    std::string_view in = data;
    if (!pending_.empty()) {
      pending_.append(data);
      if (pending_.size() < need_) return;
      in = pending_;
    } else if (data.size() < need_) {
      pending_.assign(data);
      return;
    }
    std::size_t used = 0;
    while (!closed_ && in.size() - used >= need_) {
      auto r = parser_.parse(in.substr(used), request_);
      if (r.status == RequestParser::Status::kNeedMore) {
        need_ = r.need;
        break;
      }
      if (r.status == RequestParser::Status::kInvalid) {
        close(r.error);
        return;
      }
      used += r.consumed;
      need_ = 1;
      try {
        state_.core.handle(session_, request_, out_);
      } catch (const Error& e) {
        close(e.what());
        return;
      }
    }
    if (closed_) return;
    if (in.data() == pending_.data()) {
      pending_.erase(0, used);
    } else {
      pending_.assign(in.substr(used));
    }
    if (pending_.capacity() > 2 * need_ + kReadChunk && pending_.size() < kReadChunk) pending_.shrink_to_fit();
    if (need_ > 1 && pending_.capacity() < need_) pending_.reserve(need_);
    flush();
  }

  // Sends what is queued without blocking; the rest waits for the next EPOLLOUT edge. A client
  // that lets more than max_pending_output_bytes pile up is not reading: it is dropped.
  void flush() {
    while (!out_.empty() && !closed_) {
      ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL);
      if (n > 0) {
        out_.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (out_.size() > state_.options.max_pending_output_bytes) {
          close("client does not read its replies: " + std::to_string(out_.size()) +
                " bytes pending, over the limit of " + std::to_string(state_.options.max_pending_output_bytes));
        }
        return;
      }
      if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
        closed_by_peer();
      } else {
        close(std::string("write failed: ") + std::strerror(errno));
      }
      return;
    }
  }

  void closed_by_peer() {
    std::size_t waits = 0;
    for (const auto& w : session_.waits) waits += w->active ? 1 : 0;
    if (waits > 0) {
      spdlog::warn("store: {} disconnected with {} pending WAIT(s)", peer_, waits);
    } else if (!pending_.empty()) {
      spdlog::warn("store: {} disconnected in the middle of a request ({} bytes of it received)", peer_,
                   pending_.size());
    } else {
      spdlog::debug("store: {} disconnected", peer_);
    }
    shutdown();
  }

  void close(const std::string& reason) {
    spdlog::warn("store: closing connection from {}: {}", peer_, reason);
    shutdown();
  }

  void shutdown() {
    if (closed_) return;
    closed_ = true;
    state_.core.drop(session_);
    ::epoll_ctl(state_.epoll_fd, EPOLL_CTL_DEL, fd_, nullptr);
    ::close(fd_);
    fd_ = -1;
    std::string().swap(out_);
    std::string().swap(pending_);
    auto it = state_.connections.find(this);
    if (it != state_.connections.end()) {
      state_.closing.push_back(std::move(it->second));
      state_.connections.erase(it);
    }
  }

  ServerState& state_;
  int fd_;
  std::string peer_;
  RequestParser parser_;
  Request request_;
  Session session_;
  std::string pending_;   // bytes of an incomplete request
  std::size_t need_ = 1;  // do not parse before this many bytes are buffered
  std::string out_;       // replies the socket has not taken yet
  bool closed_ = false;
  bool queued_ = false;   // on the backlog
  bool peer_done_ = false;  // the peer shut down its side (EPOLLRDHUP) or the socket failed
};

}  // namespace

struct StoreServer::Impl {
  ServerState state;
  tcp::acceptor acceptor{state.io};
  asio::posix::stream_descriptor epoll_desc{state.io};
  asio::steady_timer retry_timer{state.io};
  std::string host;
  std::uint16_t port = 0;
  std::thread thread;
  bool waiting_for_events = false;
  bool fd_limit_logged = false;

  Impl() {
    state.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (state.epoll_fd < 0) throw NetworkError(std::string("store: epoll_create1 failed: ") + std::strerror(errno));
    epoll_desc.assign(state.epoll_fd);
  }

  ~Impl() { close_all(); }

  void close_all() {
    auto open = std::move(state.connections);
    state.connections.clear();
    for (auto& [ptr, conn] : open) conn->abandon();
    state.backlog.clear();
    state.closing.clear();
  }

  void bind(const StoreServerOptions& o) {
    std::vector<tcp::endpoint> candidates;
    boost::system::error_code ec;
    if (o.host.empty()) {
      candidates.emplace_back(asio::ip::address_v6::any(), o.port);
      candidates.emplace_back(asio::ip::address_v4::any(), o.port);
    } else {
      tcp::resolver resolver(state.io);
      auto results = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive, ec);
      if (ec) throw NetworkError("store: cannot resolve host '" + o.host + "': " + ec.message());
      for (const auto& r : results) candidates.push_back(r.endpoint());
    }
    std::string errors;
    for (const auto& ep : candidates) {
      acceptor.close(ec);
      acceptor.open(ep.protocol(), ec);
      if (ec) {
        errors += "; " + endpoint_string(ep) + ": " + ec.message();
        continue;
      }
      acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
      if (ep.protocol() == tcp::v6()) acceptor.set_option(asio::ip::v6_only(!o.host.empty()), ec);
      acceptor.bind(ep, ec);
      // Linux caps the backlog at net.core.somaxconn: asking for INT_MAX gets the system maximum.
      if (!ec) acceptor.listen(INT_MAX, ec);
      if (!ec) acceptor.non_blocking(true, ec);
      if (!ec) {
        auto local = acceptor.local_endpoint();
        host = local.address().to_string();
        port = local.port();
        return;
      }
      errors += "; " + endpoint_string(ep) + ": " + ec.message();
    }
    std::string hint;
    if (errors.find("in use") != std::string::npos) {
      hint = " (another process holds that port: choose another port, or 0 for a free one)";
    }
    throw NetworkError("store: cannot listen on " + format_address(o.host.empty() ? "*" : o.host, o.port) + errors +
                       hint);
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
                         std::strerror(errno), state.connections.size());
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
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto conn = std::make_shared<Connection>(state, fd, peer_name(addr));
      if (conn->start()) {
        state.connections.emplace(conn.get(), std::move(conn));
        // Data may have arrived before the socket joined the epoll set; EPOLL_CTL_ADD reports
        // current readiness, so the first event covers it.
      }
    }
    wait_for_clients();
    poll_connections();  // new connections' first requests are often already there
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
    int n = ::epoll_wait(state.epoll_fd, events, kEventsPerWait, 0);
    for (int i = 0; i < n; ++i) {
      static_cast<Connection*>(events[i].data.ptr)->on_event(events[i].events);
    }
    // Connections whose turn ended with input left: one more turn each, after the others.
    if (!state.backlog.empty()) {
      auto backlog = std::move(state.backlog);
      state.backlog.clear();
      for (auto* c : backlog) {
        if (state.connections.count(c) && c->queued()) c->on_readable();
      }
    }
    state.closing.clear();
    if (n == kEventsPerWait || !state.backlog.empty()) {
      asio::post(state.io, [this] { poll_connections(); });  // more to do: yield, then continue
    } else {
      wait_for_events();
    }
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.raise_fd_limit) raise_fd_limit();
  impl_->state.options = options;
  impl_->bind(options);
  impl_->wait_for_clients();
  impl_->wait_for_events();
  spdlog::debug("store: listening on {}", format_address(impl_->host, impl_->port));
}

StoreServer::~StoreServer() {
  stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void StoreServer::start() {
  if (impl_->thread.joinable()) return;
  impl_->thread = std::thread([this] { run(); });
}

void StoreServer::run() {
  while (!impl_->state.io.stopped()) {
    try {
      impl_->state.io.run();
    } catch (const std::exception& e) {
      // Per-connection errors are handled in the connection; reaching here is a bug. Log it and
      // keep serving rather than terminate the agent that hosts the store.
      spdlog::error("store: unexpected error in the I/O loop: {}", e.what());
    }
  }
}

void StoreServer::stop() { impl_->state.io.stop(); }

void StoreServer::reset() {
  auto reset_now = [this] {
    impl_->close_all();
    // Connections still waiting to be accepted are as stale as the open ones: a client that
    // connected, sent a SET and exited may not have been accepted yet.
    for (;;) {
      int fd = ::accept4(impl_->acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      ::close(fd);
    }
    impl_->state.core = StoreCore();
    spdlog::debug("store: reset");
  };
  if (!impl_->thread.joinable() || impl_->state.io.stopped()) {
    reset_now();
    return;
  }
  std::promise<void> done;
  asio::post(impl_->state.io, [&] {
    reset_now();
    done.set_value();
  });
  done.get_future().wait();
}

std::uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::host() const { return impl_->host; }

}  // namespace ddprun::rendezvous
