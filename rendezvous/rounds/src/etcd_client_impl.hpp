#pragma once
// What the etcd client's request code (etcd_client.cpp) and its watches (etcd_watch.cpp) share:
// the connection state, one request to one member, and the JSON helpers. Private to the client.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "etcd_client.hpp"
#include "etcd_transport.hpp"

namespace ddprun::rounds {

namespace etcd_detail {

using json = nlohmann::json;

std::string b64(const std::string& s);
std::string unb64(const std::string& s);
// The end of the key range holding every key under `prefix` (etcd's convention).
std::string prefix_end(std::string p);
std::int64_t num(const json& j, const char* field);
EtcdKv kv_of(const json& j);

// An error etcd returned: worth another member (no leader, leader changed, unavailable, its own
// time-out) or not; an authentication problem.
struct Refused {
  std::string message;
  bool transient;
  bool auth;
};
Refused refused_of(const json& j, int http_status);

}  // namespace etcd_detail

struct EtcdClient::Impl {
  using Clock = std::chrono::steady_clock;
  using Request = EtcdStream::Request;

  EtcdOptions opt;
  std::shared_ptr<boost::asio::ssl::context> tls;  // set when an endpoint uses TLS
  std::size_t current = 0;                         // the member tried first
  std::string token;
  boost::asio::io_context io;
  Clock::time_point sent{};  // when the request that the last answer replied to was sent
  // The connection of the last request, kept for the next request to the same member (etcd's
  // gateway keeps HTTP/1.1 connections open): no TCP or TLS handshake per request, and no
  // socket left in TIME_WAIT for each (at hundreds of nodes, thousands a second).
  std::optional<EtcdStream> conn;
  const EtcdEndpoint* conn_to = nullptr;  // its member, one of opt.endpoints
  Clock::time_point conn_used{};           // when it last brought an answer
  static constexpr std::chrono::seconds kKeptIdle{30};
  // interrupt(): set once, from any thread; the watch stream being read, cancelled on `io`.
  std::atomic<bool> interrupted{false};
  EtcdStream* watching = nullptr;

  // The longest one member is given to answer (the first time round the members: attempt).
  std::chrono::milliseconds most() const;
  std::chrono::milliseconds first_share() const;
  void next_member() { current = (current + 1) % opt.endpoints.size(); }

  EtcdStream connect(const EtcdEndpoint& e, Clock::time_point deadline) {
    return EtcdStream::open(io, e, tls.get(), deadline);
  }
  Request request(const EtcdEndpoint& e, const std::string& path, const etcd_detail::json& body);
  // One request to one member. Throws NetworkError/TimeoutError (try another) or Refused.
  etcd_detail::json post(const EtcdEndpoint& e, const std::string& path, const etcd_detail::json& body,
                         Clock::time_point deadline);
  void authenticate(const EtcdEndpoint& e, Clock::time_point deadline);
  Clock::time_point auth_deadline() const;
  // The request on the current member, moving on to the next when one cannot serve it.
  // `patient` (over 0): the call's time, and the first member's whole (one attempt, not shares,
  // ended by a refusal or a broken connection: patience is for a slow member).
  etcd_detail::json call(const std::string& path, const etcd_detail::json& body,
                         std::chrono::milliseconds patient = std::chrono::milliseconds::zero());

  // Watches (etcd_watch.cpp).
  struct WatchRead;
  WatchRead read_watch(EtcdStream& s, const EtcdEndpoint& e, Request req, Clock::time_point answer_by,
                       Clock::time_point deadline);
};

}  // namespace ddprun::rounds
