#pragma once
// How the etcd client reaches one member: plain TCP, or TLS through OpenSSL and Beast's
// ssl_stream. With TLS the member's certificate must chain to the job's CA (cacert) and name the
// endpoint as it was written (a DNS name or an IP address in its subjectAltName); a client
// certificate is presented when one is given. A failed check says what failed and what to check,
// with the certificate's own dates and names, instead of OpenSSL's "certificate verify failed".

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <variant>

#include "etcd_client.hpp"

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

// One connection to one member. Movable; not shared between threads.
class EtcdStream {
 public:
  using Plain = boost::beast::tcp_stream;
  using Tls = boost::beast::ssl_stream<Plain>;
  using Clock = std::chrono::steady_clock;

  // Connects to `e` and, for a TLS endpoint (`tls` set), completes the handshake, all by
  // `deadline`. Throws TimeoutError or NetworkError naming the endpoint; a TLS failure says
  // what to check (the CA, the certificate's dates or names, the client certificate).
  static EtcdStream open(boost::asio::io_context& io, const EtcdEndpoint& e, boost::asio::ssl::context* tls,
                         Clock::time_point deadline);

  // Runs `f` on the stream, whichever it is (Beast's HTTP operations take either).
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), s_);
  }
  // Runs `io` until the operations started on this stream finish, or until `deadline`: then
  // they are cancelled (and complete with operation_aborted) and false is returned.
  bool run(boost::asio::io_context& io, Clock::time_point deadline);
  // Cancels the operations started on this stream (they complete with operation_aborted).
  void cancel();
  // An error of a request on this stream in words: a TLS alert from the member (TLS 1.3
  // refuses a missing client certificate after the handshake) says what to give.
  std::string explain(const boost::system::error_code& ec);

 private:
  EtcdStream(std::variant<Plain, Tls> s, EtcdEndpoint e, std::shared_ptr<CertProblem> p)
      : s_(std::move(s)), endpoint_(std::move(e)), problem_(std::move(p)) {}

  std::variant<Plain, Tls> s_;
  EtcdEndpoint endpoint_;
  std::shared_ptr<CertProblem> problem_;  // written by the verify callback
};

}  // namespace ddprun::rounds
