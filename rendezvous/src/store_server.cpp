#include "ddprun/rendezvous/store_server.hpp"

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <climits>
#include <spdlog/spdlog.h>
#include <thread>

#include "ddprun/rendezvous/error.hpp"
#include "socket.hpp"
#include "store_core.hpp"

namespace ddprun::rendezvous {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// Reads are at least this large; buffers grow only for requests that need more.
constexpr std::size_t kMinReadBytes = 16 * 1024;

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

}  // namespace

struct ServerState {
  StoreServerOptions options;
  StoreCore core;
  std::size_t connections = 0;
  // Last member, so destroyed first: its pending handlers own the connections, whose
  // destructors still touch the members above.
  asio::io_context io{1};
};

// One client connection. Owned by the handlers in flight (shared_ptr); the core holds only
// weak references through Session/Waiter, so a closed connection is freed at once.
class Connection final : public Peer, public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerState& state, tcp::socket socket, std::string peer)
      : state_(state), socket_(std::move(socket)), peer_(std::move(peer)), parser_(state.options.limits) {
    ++state_.connections;
  }
  ~Connection() override { --state_.connections; }

  void start() {
    session_.peer = weak_from_this();
    spdlog::debug("store: connection from {}", peer_);
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    wait_readable();
  }

  // Out-of-band reply (woken WAIT, watch notification), called by the core.
  void deliver(std::string_view bytes) override {
    if (closed_) return;
    out_.append(bytes);
    flush();
  }

 private:
  // Reading: wait for readiness, then read without blocking until the socket is drained. Unlike
  // async_read_some, this costs no failed recv() per request: a request/reply client has sent
  // nothing more when we finish its reply, so a speculative read would only return EAGAIN.
  void wait_readable() {
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      self->on_readable(ec);
    });
  }

  void on_readable(boost::system::error_code ec) {
    if (closed_) return;
    if (ec) {
      close("wait failed: " + ec.message());
      return;
    }
    // A bounded number of full reads per turn, so one flooding client cannot starve others.
    for (int turn = 0; turn < 16; ++turn) {
      make_room();
      std::size_t space = in_.size() - end_;
      std::size_t n = socket_.read_some(asio::buffer(in_.data() + end_, space), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) break;
      if (ec) {
        if (ec == asio::error::eof || ec == asio::error::connection_reset) {
          closed_by_peer();
        } else {
          close("read failed: " + ec.message());
        }
        return;
      }
      end_ += n;
      process();
      if (closed_) return;
      // Fewer bytes than asked: the socket was empty at that moment, and any byte arriving
      // later raises a new readiness event for the wait below.
      if (n < space) {
        wait_readable();
        return;
      }
    }
    // Still data to read: continue after the other connections had their turn.
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->on_readable({}); });
  }

  void make_room() {
    if (in_.size() - end_ >= kMinReadBytes) return;
    if (begin_ > 0) {  // compact
      std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (in_.size() - end_ < kMinReadBytes) in_.resize(std::max(in_.size() * 2, end_ + kMinReadBytes));
  }

  void process() {
    while (!closed_ && end_ - begin_ >= need_) {
      auto r = parser_.parse(std::string_view(in_.data() + begin_, end_ - begin_), request_);
      if (r.status == RequestParser::Status::kNeedMore) {
        need_ = r.need;
        // Make room for the whole request at once rather than growing step by step.
        if (begin_ + need_ > in_.size() && need_ > in_.size() / 2) in_.resize(need_ + kMinReadBytes);
        break;
      }
      if (r.status == RequestParser::Status::kInvalid) {
        close(r.error);
        return;
      }
      begin_ += r.consumed;
      need_ = 1;
      try {
        state_.core.handle(session_, request_, out_);
      } catch (const Error& e) {
        close(e.what());
        return;
      }
      if (closed_) return;
    }
    if (begin_ == end_) begin_ = end_ = 0;
    flush();
  }

  // Writing: try a non-blocking send at once (the common case: the whole reply fits in the
  // socket buffer); hand only a remainder to async_write. Replies produced while a write is in
  // flight accumulate in out_, bounded by max_pending_output_bytes.

  void flush() {
    if (closed_ || out_.empty()) return;
    if (writing_) {
      if (out_.size() > state_.options.max_pending_output_bytes) {
        close("client does not read its replies: " + std::to_string(out_.size() + wbuf_.size()) +
              " bytes pending, over the limit of " + std::to_string(state_.options.max_pending_output_bytes));
      }
      return;
    }
    boost::system::error_code ec;
    std::size_t n = socket_.write_some(asio::buffer(out_), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      close("write failed: " + ec.message());
      return;
    }
    if (!ec && n == out_.size()) {
      out_.clear();
      return;
    }
    out_.erase(0, ec ? 0 : n);
    writing_ = true;
    std::swap(out_, wbuf_);
    asio::async_write(socket_, asio::buffer(wbuf_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        self->writing_ = false;
                        self->wbuf_.clear();
                        if (self->closed_) return;
                        if (ec) {
                          self->close("write failed: " + ec.message());
                          return;
                        }
                        self->flush();
                      });
  }

  void closed_by_peer() {
    std::size_t waits = 0;
    for (const auto& w : session_.waits) waits += w->active ? 1 : 0;
    if (waits > 0) {
      spdlog::warn("store: {} disconnected with {} pending WAIT(s)", peer_, waits);
    } else if (end_ > begin_) {
      spdlog::warn("store: {} disconnected in the middle of a request ({} bytes of it received)", peer_,
                   end_ - begin_);
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
    boost::system::error_code ignored;
    socket_.close(ignored);
    // Free the buffers now: handlers still in flight keep this object alive a little longer.
    std::string().swap(out_);
    std::vector<char>().swap(in_);
  }

  ServerState& state_;
  tcp::socket socket_;
  std::string peer_;
  RequestParser parser_;
  Request request_;
  Session session_;
  std::vector<char> in_;
  std::size_t begin_ = 0, end_ = 0;
  std::size_t need_ = 1;  // do not parse before this many bytes are buffered
  std::string out_;       // replies not yet handed to the socket
  std::string wbuf_;      // replies being written
  bool writing_ = false;
  bool closed_ = false;
};

struct StoreServer::Impl {
  ServerState state;
  tcp::acceptor acceptor{state.io};
  asio::steady_timer retry_timer{state.io};
  std::string host;
  std::uint16_t port = 0;
  std::thread thread;
  bool fd_limit_logged = false;

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
      if (ep.protocol() == tcp::v6()) acceptor.set_option(asio::ip::v6_only(o.host.empty() ? false : true), ec);
      acceptor.bind(ep, ec);
      if (!ec) {
        // Linux caps the backlog at net.core.somaxconn: asking for INT_MAX gets the system maximum.
        acceptor.listen(INT_MAX, ec);
      }
      if (!ec) {
        auto local = acceptor.local_endpoint();
        host = local.address().to_string();
        port = local.port();
        return;
      }
      errors += "; " + endpoint_string(ep) + ": " + ec.message();
    }
    std::string hint;
    if (errors.find("in use") != std::string::npos) hint = " (another process holds that port: choose another port, or 0 for a free one)";
    throw NetworkError("store: cannot listen on " + format_address(o.host.empty() ? "*" : o.host, o.port) + errors +
                       hint);
  }

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
          // Out of file descriptors: retry shortly instead of spinning; existing clients go on.
          if (!fd_limit_logged) {
            spdlog::warn("store: cannot accept more clients: {} ({} connected); raise the open-file limit (ulimit -n)",
                         ec.message(), state.connections);
            fd_limit_logged = true;
          }
          retry_timer.expires_after(std::chrono::milliseconds(50));
          retry_timer.async_wait([this](boost::system::error_code e) {
            if (!e) accept();
          });
          return;
        }
        spdlog::debug("store: accept failed: {}", ec.message());
        accept();
        return;
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto remote = socket.remote_endpoint(ignored);
      std::string peer = ignored ? std::string("unknown peer") : endpoint_string(remote);
      std::make_shared<Connection>(state, std::move(socket), std::move(peer))->start();
      accept();
    });
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.raise_fd_limit) raise_fd_limit();
  impl_->state.options = options;
  impl_->bind(options);
  impl_->accept();
  spdlog::info("store: listening on {}", format_address(impl_->host, impl_->port));
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

std::uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::host() const { return impl_->host; }

}  // namespace ddprun::rendezvous
