// Connection: its socket. Reading in turns, sending queued output with writev(), closing (and
// letting go of what the client held). What its requests do is in connection_requests.cpp.

#include "connection.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <spdlog/spdlog.h>

namespace ddprun::rendezvous {
namespace {

// A connection's turn ends after this many reads (or about a millisecond of requests); then other
// connections get theirs.
constexpr int kReadsPerTurn = 16;

}  // namespace

Connection::Connection(ServerContext& ctx, int fd, std::string peer)
    : ctx_(ctx),
      fd_(fd),
      peer_(std::move(peer)),
      parser_(ctx.options.limits),
      charge_(ctx.budget),
      auth_(ctx.options.secret.empty() ? Auth::kOpen : Auth::kHello) {
  if (auth_ != Auth::kOpen) handshake_ = std::make_unique<ServerHandshake>(ctx.options.secret);
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

bool Connection::start() {
  session_.peer = weak_from_this();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = this;
  if (::epoll_ctl(ctx_.epoll_fd, EPOLL_CTL_ADD, fd_, &ev) != 0) {
    spdlog::warn("store: cannot watch the connection from {}: {}", peer_, std::strerror(errno));
    return false;
  }
  spdlog::debug("store: connection from {}", peer_);
  sync_charge();
  return true;
}

void Connection::on_event(std::uint32_t events) {
  if (closed_) return;
  try {
    if (events & EPOLLOUT) flush();
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) peer_done_ = true;
    if (!closed_ && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) on_readable();
  } catch (const std::bad_alloc&) {
    close("out of memory while serving this client");
  } catch (const std::exception& e) {
    close(std::string("internal error while serving this client: ") + e.what());
  }
}

void Connection::take_turn() {
  queued_ = false;
  on_readable();
}

void Connection::on_readable() {
  turn_requests_ = 0;
  turn_started_ = {};  // read on the 16th request: most turns are one request
  if (closed_ || paused_) return;  // a paused connection reads again when its replies drain
  if (!pending_.empty()) {
    std::string rest = std::move(pending_);
    pending_.clear();
    consume(rest);
    if (closed_ || paused_ || !pending_.empty()) return;
  }
  for (int turn = 0; turn < kReadsPerTurn; ++turn) {
    auto& buf = ctx_.scratch;
    if (buf.empty()) buf.resize(ServerContext::kScratchBytes);
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
    // Paused with input held back: that input goes first once resumed (from the backlog, even
    // when the flush at the end of consume() already resumed us), so read nothing now.
    if (closed_ || paused_ || !pending_.empty()) return;
    // A short read means the socket was empty at that moment; later input raises a new edge.
    // Not so for the end of the stream: once the peer has shut down, read on to see it.
    if (static_cast<std::size_t>(n) < buf.size() && !peer_done_) return;
  }
  queue_turn();
}

// Once on the backlog at most (an event while it is there does not add it again, or a client
// sending without pause would get one more turn every round).
void Connection::queue_turn() {
  if (queued_) return;
  queued_ = true;
  ctx_.backlog.push_back(this);
}

void Connection::deliver(const Message& m) {
  if (closed_) return;
  if (out_.size() + m.size() > ctx_.options.max_pending_output_bytes) {
    close("client does not read its replies: " + std::to_string(out_.size()) + " bytes pending and " +
          std::to_string(m.size()) + " more to send, over the limit of " +
          std::to_string(ctx_.options.max_pending_output_bytes) + " (--max_pending_output_bytes)");
    return;
  }
  if (!ctx_.budget.fits(out_.cost_of(m))) {
    close(over_budget("a notification of " + std::to_string(m.size()) + " bytes, with " +
                      std::to_string(out_.size()) + " bytes it was sent still unread,"));
    return;
  }
  out_.append(m);
  sync_charge();
  // Sent from the event loop, a few megabytes a turn: a SET watched by 200 clients must not fill
  // 200 socket buffers before anyone else is served.
  if (!flush_queued_) {
    flush_queued_ = true;
    ctx_.flush_later.push_back(this);
  }
}

std::size_t Connection::flush_later(std::size_t max_bytes) {
  flush_queued_ = false;
  if (closed_) return 0;
  auto before = out_.size();
  if (flush(max_bytes) && !closed_ && !out_.empty()) {
    flush_queued_ = true;
    ctx_.flush_later.push_back(this);
  }
  return before - out_.size();
}

// One sendmsg() of the front of the queue (up to 64 chunks, at most `max_bytes`); what it returned.
ssize_t Connection::send_queued(int flags, std::size_t max_bytes) {
  iovec iov[64];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(out_.gather(iov, 64));
  std::size_t total = 0;
  for (std::size_t i = 0; i < msg.msg_iovlen; ++i) {
    if (total + iov[i].iov_len >= max_bytes) {
      iov[i].iov_len = max_bytes - total;
      msg.msg_iovlen = i + 1;
      break;
    }
    total += iov[i].iov_len;
  }
  return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | flags);
}

// Sends what is queued without blocking, at most `max_bytes`; the rest waits for the next
// EPOLLOUT edge, or (at the cap) for the caller to come back.
bool Connection::flush(std::size_t max_bytes) {
  std::size_t sent = 0;
  bool capped = false;
  while (!out_.empty() && !closed_) {
    if (sent >= max_bytes) {
      capped = true;
      break;
    }
    ssize_t n = send_queued(0, max_bytes - sent);
    if (n > 0) {
      out_.consume(static_cast<std::size_t>(n));
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      closed_by_peer();
    } else {
      close(std::string("write failed: ") + std::strerror(errno));
    }
    return false;
  }
  if (closed_) return false;
  sync_charge();  // what is left unsent
  if (out_.size() > ctx_.options.max_pending_output_bytes) {
    close("client does not read its replies: " + std::to_string(out_.size()) +
          " bytes pending, over the limit of " + std::to_string(ctx_.options.max_pending_output_bytes) +
          " (--max_pending_output_bytes)");
    return false;
  }
  if (paused_ && out_.size() <= ctx_.options.output_high_water_bytes / 2) resume();
  return capped;
}

// Reading resumes from the event loop (the backlog), never from inside another client's
// request: deliver() may run while the core is applying someone else's SET.
void Connection::resume() {
  paused_ = false;
  queue_turn();
}

void Connection::closed_by_peer() {
  if (!session_.waits.empty()) {
    ctx_.warn(fmt::format("store: {} disconnected with {} pending WAIT(s)", peer_, session_.waits.size()));
  } else if (parser_.partial_bytes() > 0) {
    ctx_.warn(fmt::format("store: {} disconnected in the middle of a request ({} bytes of it received)", peer_,
                          parser_.partial_bytes()));
  } else {
    spdlog::debug("store: {} disconnected", peer_);
  }
  shutdown();
}

void Connection::close(const std::string& reason) {
  if (closed_) return;
  ctx_.warn(fmt::format("store: closing connection from {}: {}", peer_, reason));
  // Replies to the requests before the one that failed still go out when the socket takes them
  // now (no waiting): the client sees their answers, then the close.
  if (!out_.empty() && out_.size() <= ctx_.options.max_pending_output_bytes) send_queued(MSG_DONTWAIT);
  shutdown();
}

void Connection::shutdown() {
  if (closed_) return;
  closed_ = true;
  // A connection that held much (thousands of waits, megabytes of buffers) leaves free memory
  // behind in malloc's arenas; the server hands it back to the system after the batch in which
  // its socket closes.
  trim_after_ = session_.wait_keys + session_.watches.size() >= 4096 || out_.size() + pending_.size() >= (1u << 20) ||
                parser_.partial_bytes() >= (1u << 20);
  ctx_.handshakes.remove(this);
  ::epoll_ctl(ctx_.epoll_fd, EPOLL_CTL_DEL, fd_, nullptr);
  out_.clear();
  std::string().swap(pending_);
  handshake_.reset();
  // (request_ stays: this may run while it is being applied, from a notification to this same
  // client that did not fit; it holds at most one request until the connection is destroyed.)
  parser_ = RequestParser(ctx_.options.limits);
  charge_.set(0);
  auto it = ctx_.connections.find(this);
  if (it != ctx_.connections.end()) {
    ctx_.closing.push_back(std::move(it->second));
    ctx_.connections.erase(it);
  }
  // Its waits go a few thousand a turn of the loop (a client can hold a hundred thousand), and
  // the socket closes after them: the client sees the close once the store has let go of all.
  if (!reap(kDropsPerTurn)) ctx_.reaping.push_back(shared_from_this());
}

bool Connection::reap(std::size_t max_waits) {
  if (fd_ < 0) return true;
  if (ctx_.core.drop_some(session_, max_waits) > 0) return false;
  ::close(fd_);
  fd_ = -1;
  ctx_.trim_memory = ctx_.trim_memory || trim_after_;
  return true;
}

void Connection::abandon() {
  shutdown();
  reap(~std::size_t{0});
}

}  // namespace ddprun::rendezvous
