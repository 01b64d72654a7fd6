#include "metrics/metrics_server.hpp"

#include <atomic>
#include <boost/asio.hpp>
#include <list>
#include <optional>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"
#include "metrics/metrics.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr std::chrono::seconds kDeadline{5};

}  // namespace

// Handlers hold a plain pointer: the server stops and joins its thread before the loop (and the
// handlers with it) is destroyed, and the counters are declared first so that they outlive it.
// Everything but the counters is touched on the server's thread only.
struct MetricsServer::Impl {
  struct Client;
  JobMetrics& metrics;
  std::atomic<int> clients{0};
  std::atomic<std::size_t> refused{0};
  std::list<Client*> waiting;  // clients that have not sent their request yet, oldest first
  std::thread thread;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::optional<tcp::acceptor> acceptor_v4;  // only where the kernel refused a dual-stack socket

  explicit Impl(JobMetrics& m) : metrics(m) {}

  // One client: read one request (bounded), answer it, close.
  struct Client : std::enable_shared_from_this<Client> {
    Impl* server;
    beast::tcp_stream stream;
    beast::flat_buffer buf;
    http::request_parser<http::empty_body> parser;
    http::response<http::string_body> res;
    bool head = false;  // HEAD: the headers of the GET answer only

    std::list<Client*>::iterator place;  // in server->waiting, or its end()
    bool counted = true;                 // holds one of the kMaxClients places

    Client(Impl* s, tcp::socket sock) : server(s), stream(std::move(sock)) {
      parser.header_limit(static_cast<std::uint32_t>(kMaxHeader));
      parser.body_limit(0);
      place = server->waiting.insert(server->waiting.end(), this);
    }
    ~Client() {
      leave_waiting();
      if (counted) --server->clients;
    }

    void leave_waiting() {
      if (place == server->waiting.end()) return;
      server->waiting.erase(place);
      place = server->waiting.end();
    }

    // Makes room for a newer client: this one has sent nothing usable yet. Its read ends with
    // operation_aborted and it goes without an answer.
    void evict() {
      leave_waiting();
      counted = false;
      --server->clients;
      beast::error_code ignored;
      stream.socket().close(ignored);
    }

    void start() {
      stream.expires_after(kDeadline);  // the whole exchange: a slow client is cut off
      http::async_read(stream, buf, parser, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        self->leave_waiting();
        if (!self->counted) return;  // evicted: its socket is closed, whatever the read got
        if (ec) return self->answer(ec == http::error::header_limit ? http::status::request_header_fields_too_large
                                                                    : http::status::bad_request, "");
        self->route(self->parser.get());
      });
    }

    void route(const http::request<http::empty_body>& req) {
      const auto target = req.target();
      head = req.method() == http::verb::head;
      if (req.method() != http::verb::get && req.method() != http::verb::head) {
        return answer(http::status::method_not_allowed, "only GET\n");
      }
      if (target == "/metrics") return answer(http::status::ok, server->metrics.scrape(), true);
      if (target == "/healthz") {
        bool ok = server->metrics.healthy();
        return answer(ok ? http::status::ok : http::status::service_unavailable, ok ? "ok\n" : "agent loop stalled\n");
      }
      if (target == "/readyz") {
        bool ok = server->metrics.ready();
        return answer(ok ? http::status::ok : http::status::service_unavailable, ok ? "ready\n" : "no workers running\n");
      }
      answer(http::status::not_found, "paths: /metrics /healthz /readyz\n");
    }

    void answer(http::status status, std::string body, bool prometheus = false) {
      res.result(status);
      res.version(11);
      res.set(http::field::server, "ddprun");
      res.set(http::field::content_type, prometheus ? "text/plain; version=0.0.4" : "text/plain");
      res.keep_alive(false);
      res.body() = std::move(body);
      res.prepare_payload();
      if (head) res.body().clear();  // the length of what GET would send, and no body
      http::async_write(stream, res, [self = shared_from_this()](beast::error_code, std::size_t) {
        beast::error_code ignored;
        self->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      });
    }
  };

  void accept(tcp::acceptor& on) {
    on.async_accept([self = this, &on](beast::error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) self->admit(std::move(sock));
      self->accept(on);
    });
  }

  // At kMaxClients, the client waiting longest for its request gives its place to the newcomer:
  // idle connections cannot lock a prober out (a Kubernetes probe sends its request at once), they
  // only push each other out. Only when every place is answering a request is the newcomer closed.
  void admit(tcp::socket sock) {
    if (clients >= kMaxClients && !waiting.empty()) {
      waiting.front()->evict();
    }
    if (clients >= kMaxClients) {
      ++refused;
      return;  // closed at once
    }
    ++clients;
    std::make_shared<Client>(this, std::move(sock))->start();
  }
};

namespace {

// Opens, binds and listens `a` on `ep`; `dual` clears IPV6_V6ONLY first (an error if the kernel
// refuses). Returns the first error.
beast::error_code listen_on(tcp::acceptor& a, const tcp::endpoint& ep, bool dual) {
  beast::error_code ec;
  a.open(ep.protocol(), ec);
  if (!ec && ep.address().is_v6()) a.set_option(asio::ip::v6_only(!dual), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    a.close(ignored);
  }
  return ec;
}

}  // namespace

// Every interface (no --metrics_addr): one socket on [::] with IPV6_V6ONLY cleared, so IPv4
// clients (a Kubernetes probe of 127.0.0.1) reach it whatever net.ipv6.bindv6only says; where the
// kernel refuses dual-stack, [::] for IPv6 and 0.0.0.0 on the same port for IPv4; without IPv6,
// 0.0.0.0 alone.
MetricsServer::MetricsServer(MetricsServerOptions o, JobMetrics& metrics) : impl_(std::make_unique<Impl>(metrics)) {
  auto& a = impl_->acceptor;
  beast::error_code ec;
  if (o.addr.empty()) {
    ec = listen_on(a, tcp::endpoint(asio::ip::address_v6::any(), o.port), true);
    if (ec) {
      ec = listen_on(a, tcp::endpoint(asio::ip::address_v6::any(), o.port), false);
      const std::uint16_t bound = ec ? o.port : a.local_endpoint().port();
      auto& v4 = ec ? a : impl_->acceptor_v4.emplace(impl_->io);
      ec = listen_on(v4, tcp::endpoint(asio::ip::address_v4::any(), bound), false);  // IPv4 is required
    }
  } else {
    auto addr = asio::ip::make_address(o.addr, ec);
    if (ec) throw UsageError("--metrics_addr '" + o.addr + "' is not an IP address");
    ec = listen_on(a, tcp::endpoint(addr, o.port), false);
  }
  if (ec) {
    throw Error("cannot serve metrics on " + format_address(o.addr.empty() ? "*" : o.addr, o.port) + ": " + ec.message() +
                " (choose another --metrics_port, or 0 for a free one)");
  }
  impl_->accept(a);
  if (impl_->acceptor_v4) impl_->accept(*impl_->acceptor_v4);
  impl_->thread = start_thread("the metrics server's thread", [im = impl_.get()] { im->io.run(); });
  spdlog::info("ddprun: metrics on port {} (/metrics, /healthz, /readyz)", port());
}

MetricsServer::~MetricsServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint16_t MetricsServer::port() const { return impl_->acceptor.local_endpoint().port(); }
std::size_t MetricsServer::refused() const { return impl_->refused; }

}  // namespace ddprun::agent
