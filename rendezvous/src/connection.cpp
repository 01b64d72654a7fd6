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

constexpr int kReadsPerTurn = 16;  // then other connections get their turn
constexpr std::size_t kMaxLogged = 4096;

}  // namespace

StoreLimits store_limits(const StoreServerOptions& o) {
  StoreLimits l;
  l.max_value_bytes = o.limits.max_value_bytes;
  l.max_reply_bytes = o.max_reply_bytes;
  l.max_store_bytes = o.max_store_bytes;
  l.max_waits_per_connection = o.max_waits_per_connection;
  l.max_watches_per_connection = o.max_watches_per_connection;
  l.max_queue_length = o.max_queue_length;
  return l;
}

void ServerContext::log_once(const std::string& key, const std::string& line) {
  if (logged.count(key)) return;
  if (logged.size() >= kMaxLogged) {
    if (logged.size() == kMaxLogged) {
      spdlog::warn("store: {} distinct refusals logged; further ones are not", kMaxLogged);
      logged.insert("");
    }
    return;
  }
  logged.insert(key);
  spdlog::warn("{}", line);
}

void ServerContext::CountedLog::note(const std::string& why) {
  ++unlogged;
  auto now = SteadyClock::now();
  if (now - last >= std::chrono::seconds(1)) {
    spdlog::warn("store: {} {} connection(s): {}", what, unlogged, why);
    unlogged = 0;
    last = now;
  }
}

void ServerContext::warn(const std::string& line) {
  auto now = SteadyClock::now();
  if (now - warn_window >= std::chrono::seconds(1)) {
    if (warn_suppressed > 0) {
      spdlog::warn("store: {} more warnings about client connections in the last second were not logged",
                   warn_suppressed);
    }
    warn_window = now;
    warn_count = 0;
    warn_suppressed = 0;
  }
  if (warn_count < kWarningsPerSecond) {
    ++warn_count;
    spdlog::warn("{}", line);
  } else {
    ++warn_suppressed;
  }
}

Connection::Connection(ServerContext& ctx, int fd, std::string peer)
    : ctx_(ctx),
      fd_(fd),
      peer_(std::move(peer)),
      parser_(ctx.options.limits),
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

void Connection::on_readable() {
  queued_ = false;
  if (closed_ || paused_) return;  // a paused connection reads again when its replies drain
  if (!pending_.empty()) {
    std::string rest = std::move(pending_);
    pending_.clear();
    consume(rest);
    if (closed_ || paused_ || !pending_.empty()) return;
  }
  for (int turn = 0; turn < kReadsPerTurn; ++turn) {
    auto& buf = ctx_.scratch;
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
  queued_ = true;
  ctx_.backlog.push_back(this);
}

void Connection::deliver(std::string_view bytes) {
  if (closed_) return;
  out_.append(bytes);
  flush();
}

// Parses and applies the requests in `data`, one at a time, until the data is used up or the
// replies queued reach the high-water mark; then the rest waits in pending_ (at most one read).
void Connection::consume(std::string_view data) {
  while (!data.empty() && !closed_) {
    if (auth_ != Auth::kOpen) {
      if (!authenticate(data)) return;
      continue;
    }
    if (out_.size() >= ctx_.options.output_high_water_bytes) {
      paused_ = true;
      pending_.assign(data);
      spdlog::debug("store: {} has {} bytes of replies unread; not reading from it until they drain", peer_,
                    out_.size());
      break;
    }
    auto r = parser_.parse(data, request_);
    if (r.status == RequestParser::Status::kInvalid) {
      close(r.error);
      return;
    }
    data.remove_prefix(r.consumed);
    if (r.status == RequestParser::Status::kNeedMore) break;
    apply();
  }
  if (!closed_) flush();
}

void Connection::apply() {
  auto& reply = ctx_.reply;
  reply.clear();
  try {
    if (ctx_.options.on_request) {
      ctx_.options.on_request(wire::op_name(request_.op),
                              request_.keys.empty() ? std::string_view() : std::string_view(request_.keys[0]));
    }
    ctx_.core.handle(session_, request_, reply);
  } catch (const Error& e) {
    close(e.what());
    return;
  } catch (const std::bad_alloc&) {
    close(std::string("out of memory while applying its ") + wire::op_name(request_.op) + " request");
    return;
  } catch (const std::exception& e) {
    close(std::string("internal error while applying its ") + wire::op_name(request_.op) + " request: " + e.what());
    return;
  }
  if (reply.size() >= OutputQueue::kChunkBytes) {
    out_.append(std::move(reply));
    reply = std::string();
  } else {
    out_.append(std::string_view(reply));
  }
}

bool Connection::authenticate(std::string_view& data) {
  std::string answer;
  auto state = handshake_->feed(data, answer);
  if (state == ServerHandshake::State::kRefused) {
    refuse(answer, handshake_->why());
    return false;
  }
  out_.append(std::string_view(answer));
  if (state == ServerHandshake::State::kAccepted) {
    auth_ = Auth::kOpen;
    handshake_.reset();
    ctx_.handshakes.remove(this);
    spdlog::debug("store: {} authenticated", peer_);
  }
  return true;
}

// Tells a client it was refused (a byte or a 4-byte marker it can recognise), logs one line,
// and closes.
void Connection::refuse(const std::string& answer, const std::string& why) {
  send_refusal(answer);
  if (closed_) return;
  ++ctx_.refused;
  auto host = peer_.substr(0, peer_.rfind(':'));
  ctx_.log_once(host + "|" + why, "store: refused " + peer_ + ": " + why);
  shutdown();
}

void Connection::evict() {
  if (closed_ || !handshake_) return;
  std::string answer;
  handshake_->busy(answer);
  send_refusal(answer);
  ++ctx_.evicted;
  shutdown();
}

// Sends `answer` and our FIN after it. Unread input is drained first, so that the close is not
// a reset that could overtake the answer.
void Connection::send_refusal(const std::string& answer) {
  out_.append(std::string_view(answer));
  flush();
  char sink[4096];
  for (int i = 0; i < 64 && fd_ >= 0 && ::recv(fd_, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  if (!closed_) ::shutdown(fd_, SHUT_WR);
}

// One sendmsg() of the front of the queue (up to 64 chunks); what it returned.
ssize_t Connection::send_queued(int flags) {
  iovec iov[64];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(out_.gather(iov, 64));
  return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | flags);
}

// Sends what is queued without blocking; the rest waits for the next EPOLLOUT edge.
void Connection::flush() {
  while (!out_.empty() && !closed_) {
    ssize_t n = send_queued(0);
    if (n > 0) {
      out_.consume(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      closed_by_peer();
    } else {
      close(std::string("write failed: ") + std::strerror(errno));
    }
    return;
  }
  if (closed_) return;
  if (out_.size() > ctx_.options.max_pending_output_bytes) {
    close("client does not read its replies: " + std::to_string(out_.size()) +
          " bytes pending, over the limit of " + std::to_string(ctx_.options.max_pending_output_bytes) +
          " (--max_pending_output_bytes)");
    return;
  }
  if (paused_ && out_.size() <= ctx_.options.output_high_water_bytes / 2) resume();
}

// Reading resumes from the event loop (the backlog), never from inside another client's
// request: deliver() may run while the core is applying someone else's SET.
void Connection::resume() {
  paused_ = false;
  if (!queued_) {
    queued_ = true;
    ctx_.backlog.push_back(this);
  }
}

void Connection::closed_by_peer() {
  if (session_.active_waits > 0) {
    ctx_.warn(fmt::format("store: {} disconnected with {} pending WAIT(s)", peer_, session_.active_waits));
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
  // behind in malloc's arenas; the server hands it back to the system after this batch.
  if (session_.wait_keys + session_.watches.size() >= 4096 || out_.size() + pending_.size() >= (1u << 20) ||
      parser_.partial_bytes() >= (1u << 20)) {
    ctx_.trim_memory = true;
  }
  ctx_.core.drop(session_);
  ctx_.handshakes.remove(this);
  ::epoll_ctl(ctx_.epoll_fd, EPOLL_CTL_DEL, fd_, nullptr);
  ::close(fd_);
  fd_ = -1;
  out_.clear();
  std::string().swap(pending_);
  handshake_.reset();
  auto it = ctx_.connections.find(this);
  if (it != ctx_.connections.end()) {
    ctx_.closing.push_back(std::move(it->second));
    ctx_.connections.erase(it);
  }
}

}  // namespace ddprun::rendezvous
