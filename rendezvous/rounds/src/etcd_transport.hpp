#pragma once
// How the etcd client reaches one member: plain TCP, or TLS through OpenSSL and Beast's
// ssl_stream. With TLS the member's certificate must chain to the job's CA (cacert) and name the
// endpoint as it was written (a DNS name or an IP address in its subjectAltName); a client
// certificate is presented when one is given. A failed check says what failed and what to check,
// with the certificate's own dates and names, instead of OpenSSL's "certificate verify failed".

#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "etcd_client.hpp"

namespace boost::asio::ssl {
class context;
}

namespace ddprun::rounds {

namespace etcd_detail {
// "host:port" of a member, as every etcd message names it ("[::1]:2379" for IPv6).
std::string where(const EtcdEndpoint& e);
}  // namespace etcd_detail

// The job's CA and client certificate, loaded once per client. Throws UsageError naming the
// file that cannot be read or is not PEM, or a key that does not match its certificate.
std::shared_ptr<boost::asio::ssl::context> make_tls_context(const EtcdTls& tls);

// What the certificate check found wrong, recorded as OpenSSL verifies the member's chain.
struct CertProblem {
  int code = 0;  // X509_V_ERR_*, 0: none
  std::string subject, issuer, not_before, not_after;
};

// One connection to one member, plain TCP or TLS. Movable; not shared between threads. Beast's
// stream types and their HTTP operations are in etcd_transport.cpp alone: instantiated in each
// file that uses them, they cost about a minute of compilation there.
class EtcdStream {
 public:
  using Clock = std::chrono::steady_clock;
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;
  using Parser = boost::beast::http::response_parser<boost::beast::http::buffer_body>;
  using Handler = std::function<void(boost::system::error_code, std::size_t)>;

  // Connects to `e` and, for a TLS endpoint (`tls` set), completes the handshake, all by
  // `deadline`. Throws TimeoutError or NetworkError naming the endpoint; a TLS failure says
  // what to check (the CA, the certificate's dates or names, the client certificate).
  static EtcdStream open(boost::asio::io_context& io, const EtcdEndpoint& e, boost::asio::ssl::context* tls,
                         Clock::time_point deadline);
  // The same in two steps, for a caller with other requests in flight on `io`: a stream to `e`,
  // its name resolved (throws NetworkError, or UsageError for TLS without a CA); then
  // async_connect(), whose `done` gets "" or what failed, in words. A time-out is the caller's:
  // close() ends the connecting (`done` then gets the error's text; cancel() would not stop a
  // connect that goes on to the name's next address), and connect_timeout_text() says what timed
  // out.
  static EtcdStream make(boost::asio::io_context& io, const EtcdEndpoint& e, boost::asio::ssl::context* tls);
  void async_connect(std::function<void(std::string)> done);
  std::string connect_timeout_text() const;
  // Whether a TLS handshake was begun (under way or done): the member took the connection. (A
  // plain stream: false; its caller sends the request as soon as it connects.)
  bool handshake_begun() const;
  EtcdStream(EtcdStream&&) noexcept;
  EtcdStream& operator=(EtcdStream&&) noexcept;
  ~EtcdStream();

  // Beast's HTTP operations on this stream; what they are given must outlive them.
  void async_write(const Request& req, Handler done);
  void async_read(boost::beast::flat_buffer& buf, Response& res, Handler done);
  void async_read_some(boost::beast::flat_buffer& buf, Parser& parser, Handler done);
  // Runs `io` until the operations started on this stream finish, or until `deadline`: then
  // they are cancelled (and complete with operation_aborted) and false is returned.
  bool run(boost::asio::io_context& io, Clock::time_point deadline);
  // Cancels the operations started on this stream (they complete with operation_aborted).
  void cancel();
  // Closes the connection (a reset): what is pending completes with an error, and so does any
  // operation started on it later.
  void close();
  // Whether a connection idle since its last answer is still open: the member has not closed or
  // reset it. A look at the socket; nothing is read. Bytes waiting on a plain connection (none
  // were asked for) count as broken; on a TLS one they may be a session ticket.
  bool open_while_idle();
  // An error of a request on this stream in words: a TLS alert from the member (TLS 1.3
  // refuses a missing client certificate after the handshake) says what to give.
  std::string explain(const boost::system::error_code& ec);

  struct State;  // the stream (etcd_transport.cpp)

 private:
  explicit EtcdStream(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace ddprun::rounds
