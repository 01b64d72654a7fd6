#include "etcd_transport.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <cerrno>
#include <cstring>
#include <type_traits>
#include <variant>

#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::rounds {

struct EtcdStream::State {
  using Plain = boost::beast::tcp_stream;
  using Tls = boost::beast::ssl_stream<Plain>;
  std::variant<Plain, Tls> s;
  EtcdEndpoint endpoint;
  std::shared_ptr<CertProblem> problem;  // written by the verify callback
  boost::asio::ip::tcp::resolver::results_type addrs;
  bool handshaking = false;  // connected; the TLS handshake under way
};

namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

[[noreturn]] void usage_error(const std::string& key, const std::string& path, const std::string& why) {
  throw UsageError("--rdzv_conf " + key + "=" + path + ": " + why);
}

void readable(const std::string& key, const std::string& path) {
  // A FIFO would block the open (and OpenSSL's read): refused.
  const int fd = open_regular(path, O_RDONLY | O_NOCTTY);
  if (fd < 0 && errno == EINVAL) usage_error(key, path, "is not a regular file (a FIFO, or <(...), is not read: write it to a file of mode 600)");
  if (fd < 0) usage_error(key, path, std::string("cannot be read: ") + std::strerror(errno));
  ::close(fd);
}

std::string openssl_error() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "not PEM";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

std::string text_of(const ASN1_TIME* t) {
  BIO* b = BIO_new(BIO_s_mem());
  ASN1_TIME_print(b, t);
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  std::string out(data, static_cast<std::size_t>(n));
  BIO_free(b);
  return out;
}

std::string name_of(const X509_NAME* n) {
  char buf[512];
  X509_NAME_oneline(n, buf, sizeof(buf));
  return buf;
}

// Runs `io` until the pending operations finish or `deadline`; then they are cancelled and
// false is returned. What has arrived by the deadline counts: a thread kept off the CPU past it
// (a node's cores busy) finds its answer waiting in the socket, and run_until() handles nothing
// once the deadline has passed; a bounded look at what is ready (a member that floods a watch
// with messages does not keep it going), then the rest is cancelled.
bool run_until(asio::io_context& io, std::chrono::steady_clock::time_point deadline, beast::tcp_stream& lowest) {
  io.restart();
  io.run_until(deadline);
  if (io.stopped()) return true;
  io.restart();
  for (int i = 0; i < 64 && io.poll_one() > 0;) ++i;
  if (io.stopped()) return true;
  lowest.cancel();
  io.restart();
  io.run();
  return false;
}

// A connection is kept for the client's next request to the same member, and closed by this side
// when the client moves to another member or gives up on an answer: an orderly close would leave
// it in TIME-WAIT here for 60 s, holding its local port (K nodes' requests once used up the ~28k
// ports towards a member within a minute at K = 256, a connection a request). Closing with a
// reset leaves nothing behind. Kept for the next requests: not inherited by a program the agent
// starts meanwhile (Asio opens sockets without SOCK_CLOEXEC), which would hold it open past its
// close.
void prepare_connected(beast::tcp_stream& s) {
  error_code ec;
  s.socket().set_option(tcp::socket::linger(true, 0), ec);
  ::fcntl(s.socket().native_handle(), F_SETFD, FD_CLOEXEC);
}

// The member's name is checked the way it was written: a DNS name against the certificate's
// DNS names (and sent as SNI), an address against its IP addresses.
void expect_name(EtcdStream::State::Tls& s, const std::string& host, std::shared_ptr<CertProblem> problem) {
  SSL* native = s.native_handle();
  if (is_ip_literal(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(native), host.c_str());
  } else {
    SSL_set_tlsext_host_name(native, host.c_str());
    SSL_set1_host(native, host.c_str());
  }
  s.set_verify_callback([problem](bool preverified, ssl::verify_context& ctx) {
    if (!preverified && problem->code == 0) {
      X509_STORE_CTX* c = ctx.native_handle();
      problem->code = X509_STORE_CTX_get_error(c);
      if (X509* cert = X509_STORE_CTX_get_current_cert(c)) {
        problem->subject = name_of(X509_get_subject_name(cert));
        problem->issuer = name_of(X509_get_issuer_name(cert));
        problem->not_before = text_of(X509_get0_notBefore(cert));
        problem->not_after = text_of(X509_get0_notAfter(cert));
      }
    }
    return preverified;
  });
}

std::string describe_cert_problem(const EtcdEndpoint& e, const CertProblem& p) {
  const std::string cert = "its TLS certificate (" + p.subject + ")";
  switch (p.code) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return cert + " expired on " + p.not_after + ": renew etcd's server certificate (or check this machine's clock)";
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return cert + " is not valid before " + p.not_before + ": check this machine's clock";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return cert + " is not issued for '" + e.host + "': reach etcd by a name or address in the certificate's "
             "subjectAltName, or reissue it with '" + e.host + "' in it";
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return cert + " is not signed by the CA in --rdzv_conf cacert (it names its issuer " + p.issuer +
             "): give the CA that signed etcd's server certificates (etcdctl's --cacert)";
    default:
      return cert + " was refused: " + X509_verify_cert_error_string(p.code) + " (check --rdzv_conf cacert)";
  }
}

const char* const kNoTls = "etcd without TLS does that: write http://";
const char* const kServeTls = " without cacert, or give etcd --cert-file, --key-file and an https:// --listen-client-urls";

std::string client_cert_refused(const std::string& why, bool with_cert) {
  if (!with_cert) {
    return "it requires a client certificate (etcd --client-cert-auth; " + why +
           "): give --rdzv_conf cert=PATH,key=PATH signed by the CA etcd trusts (its --trusted-ca-file)";
  }
  return "it refused this node's client certificate (" + why + "): check that --rdzv_conf cert and key are signed by "
         "the CA etcd trusts (its --trusted-ca-file) and have not expired";
}

// A TLS failure the member caused or reported (an alert), in words. `handshake`: it happened
// before the handshake completed; `with_cert`: this node presented a client certificate.
std::string describe_tls_error(const EtcdEndpoint& e, const error_code& ec, bool handshake, bool with_cert) {
  if (ec.category() == asio::error::get_ssl_category()) {
    switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
        return "it does not speak TLS there (it answered the handshake in plain text): " + std::string(kNoTls) + etcd_detail::where(e) +
               kServeTls;
      case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
      case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
      case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
      case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
      case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
        return client_cert_refused("it said: " + ec.message(), with_cert);
      default:
        break;
    }
  }
  bool closed = ec == ssl::error::stream_truncated || ec == asio::error::eof || ec == asio::error::connection_reset;
  if (closed && handshake) {
    return "it closed the connection during the TLS handshake (" + ec.message() + "); " + kNoTls + etcd_detail::where(e) + kServeTls;
  }
  // TLS 1.3: the member checks the client certificate after the handshake; its alert may be
  // lost to the reset that follows it.
  if (closed) return client_cert_refused("it closed the connection after the TLS handshake: " + ec.message(), with_cert);
  return "TLS failed: " + ec.message();
}

}  // namespace

std::shared_ptr<ssl::context> make_tls_context(const EtcdTls& tls) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_verify_mode(ssl::verify_peer);
  ERR_clear_error();
  readable("cacert", tls.cacert);
  if (SSL_CTX_load_verify_locations(ctx->native_handle(), tls.cacert.c_str(), nullptr) != 1) {
    usage_error("cacert", tls.cacert, "not PEM CA certificates (" + openssl_error() + ")");
  }
  if (tls.cert.empty()) return ctx;
  readable("cert", tls.cert);
  readable("key", tls.key);
  if (SSL_CTX_use_certificate_chain_file(ctx->native_handle(), tls.cert.c_str()) != 1) {
    usage_error("cert", tls.cert, "not a PEM certificate (" + openssl_error() + ")");
  }
  if (SSL_CTX_use_PrivateKey_file(ctx->native_handle(), tls.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    if (ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH || ERR_peek_error() == 0) {
      ERR_clear_error();
      usage_error("key", tls.key, "does not belong to the certificate in " + tls.cert);
    }
    usage_error("key", tls.key, "not a PEM private key (" + openssl_error() + ")");
  }
  return ctx;
}

EtcdStream EtcdStream::make(asio::io_context& io, const EtcdEndpoint& e, ssl::context* tls) {
  tcp::resolver resolver(io);
  error_code ec;
  auto addrs = resolver.resolve(e.host, std::to_string(e.port), ec);
  if (ec) throw NetworkError("cannot resolve " + e.host + ": " + ec.message());
  auto problem = std::make_shared<CertProblem>();
  if (!e.tls) return EtcdStream(std::make_unique<State>(State{State::Plain(io), e, problem, addrs}));
  if (tls == nullptr) throw UsageError("etcd endpoint https://" + etcd_detail::where(e) + " needs --rdzv_conf cacert=PATH");
  auto st = std::make_unique<State>(State{State::Tls(io, *tls), e, problem, addrs});
  expect_name(std::get<State::Tls>(st->s), e.host, problem);
  return EtcdStream(std::move(st));
}

void EtcdStream::async_connect(std::function<void(std::string)> done) {
  State& st = *s_;
  auto& lowest = std::visit([](auto& s) -> beast::tcp_stream& { return beast::get_lowest_layer(s); }, st.s);
  lowest.async_connect(st.addrs, [&st, &lowest, done = std::move(done)](error_code c, const tcp::endpoint&) {
    if (c) return done("cannot connect to " + etcd_detail::where(st.endpoint) + ": " + c.message());
    prepare_connected(lowest);
    auto* tls = std::get_if<State::Tls>(&st.s);
    if (tls == nullptr) return done("");
    st.handshaking = true;
    tls->async_handshake(ssl::stream_base::client, [&st, tls, done](error_code h) {
      if (!h) return done("");
      const auto& e = st.endpoint;
      done("TLS to " + etcd_detail::where(e) + ": " +
           (st.problem->code != 0 ? describe_cert_problem(e, *st.problem)
                                  : describe_tls_error(e, h, true, SSL_get_certificate(tls->native_handle()) != nullptr)));
    });
  });
}

std::string EtcdStream::connect_timeout_text() const {
  const auto where = etcd_detail::where(s_->endpoint);
  return s_->handshaking ? "the TLS handshake with " + where +
                               " timed out: the member took the connection and did not answer (overloaded, or not a "
                               "TLS endpoint)"
                         : "connecting to " + where + " timed out";
}

bool EtcdStream::handshake_begun() const { return s_->handshaking; }

EtcdStream EtcdStream::open(asio::io_context& io, const EtcdEndpoint& e, ssl::context* tls, Clock::time_point deadline) {
  auto s = make(io, e, tls);
  std::string why;
  s.async_connect([&why](std::string w) { why = std::move(w); });
  if (!s.run(io, deadline)) throw TimeoutError(s.connect_timeout_text());
  if (!why.empty()) throw NetworkError(why);
  return s;
}

EtcdStream::EtcdStream(std::unique_ptr<State> s) : s_(std::move(s)) {}
EtcdStream::EtcdStream(EtcdStream&&) noexcept = default;
EtcdStream& EtcdStream::operator=(EtcdStream&&) noexcept = default;
EtcdStream::~EtcdStream() = default;

void EtcdStream::async_write(const Request& req, Handler done) {
  std::visit([&](auto& s) { beast::http::async_write(s, req, std::move(done)); }, s_->s);
}

void EtcdStream::async_read(beast::flat_buffer& buf, Response& res, Handler done) {
  std::visit([&](auto& s) { beast::http::async_read(s, buf, res, std::move(done)); }, s_->s);
}

void EtcdStream::async_read_some(beast::flat_buffer& buf, Parser& parser, Handler done) {
  std::visit([&](auto& s) { beast::http::async_read_some(s, buf, parser, std::move(done)); }, s_->s);
}

bool EtcdStream::run(asio::io_context& io, Clock::time_point deadline) {
  return std::visit([&](auto& s) { return run_until(io, deadline, beast::get_lowest_layer(s)); }, s_->s);
}

void EtcdStream::cancel() {
  std::visit([](auto& s) { beast::get_lowest_layer(s).cancel(); }, s_->s);
}

void EtcdStream::close() {
  std::visit(
      [](auto& s) {
        error_code ec;
        beast::get_lowest_layer(s).socket().close(ec);
      },
      s_->s);
}

bool EtcdStream::open_while_idle() {
  return std::visit(
      [](auto& s) {
        char c;
        const ssize_t n = ::recv(beast::get_lowest_layer(s).socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) return std::is_same_v<std::decay_t<decltype(s)>, State::Tls>;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      },
      s_->s);
}

std::string EtcdStream::explain(const error_code& ec) {
  if (auto* tls = std::get_if<State::Tls>(&s_->s)) {
    return describe_tls_error(s_->endpoint, ec, false, SSL_get_certificate(tls->native_handle()) != nullptr);
  }
  // A TLS-only member closes a plain-HTTP connection without an answer.
  if (ec == beast::http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset) {
    return "it closed the connection without an answer (" + ec.message() + "); etcd with TLS does that: write https://" +
           etcd_detail::where(s_->endpoint) + " and give --rdzv_conf cacert=PATH (etcdctl's --cacert); so does a server that is "
           "not etcd (a c10d store there: --rdzv_backend=c10d)";
  }
  return ec.message();
}

std::string etcd_detail::where(const EtcdEndpoint& e) { return format_address(e.host, e.port); }

}  // namespace ddprun::rounds
