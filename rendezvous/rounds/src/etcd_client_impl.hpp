#pragma once
// What the etcd client's request code (etcd_client.cpp) and its watches (etcd_watch.cpp) share:
// the connection state, one request to one member, and the JSON helpers. Private to the client.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <list>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
  // Each member's connection, kept for the next request to it (etcd's gateway keeps HTTP/1.1
  // connections open): no TCP or TLS handshake per request, and no socket left in TIME_WAIT for
  // each (at hundreds of nodes, thousands a second). Empty while a request uses it.
  struct Kept {
    std::optional<EtcdStream> s;
    Clock::time_point used{};  // when it last brought an answer
  };
  std::vector<Kept> kept;  // one per member of opt.endpoints
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

  // One request to one member, in flight on `io`: the member's kept connection or a new one,
  // the request written, its answer read. Handlers hold its address: kept in a std::list.
  struct Attempt {
    std::size_t member = 0;
    Clock::time_point sent{};
    std::optional<EtcdStream> s;
    Request req;
    boost::beast::flat_buffer buf;
    EtcdStream::Response res;
    bool done = false;       // answered, or failed (`failed` says how), or cancelled
    bool connected = false;  // the request is being written or its answer read
    bool cancelled = false;  // given up on: no answer in time
    std::string failed;      // the connection failed or broke, in words
  };
  void start(Attempt& a, const std::string& path, const etcd_detail::json& body);
  void exchange(Attempt& a);
  // Runs `io` until one of `live` is done, or `until`; what has arrived by then counts (a thread
  // kept off the CPU past `until` finds its answer waiting: a bounded look at what is ready).
  void wait_any(std::list<Attempt>& live, Clock::time_point until);
  // Cancels those of `live` not done and runs `io` until they are (their connections reset).
  void cancel(std::list<Attempt>& live);
  // A done attempt's answer; throws NetworkError/TimeoutError (try another member) or Refused.
  etcd_detail::json outcome(Attempt& a);
  // One request to one member, by `deadline`: throws as outcome().
  etcd_detail::json post(const EtcdEndpoint& e, const std::string& path, const etcd_detail::json& body,
                         Clock::time_point deadline);
  void authenticate(const EtcdEndpoint& e, Clock::time_point deadline);
  Clock::time_point auth_deadline() const;
  // The request on the current member; the next is asked too when one refuses, breaks the
  // connection or has not answered within its share, and the first answer counts.
  // `patient` (over 0): the call's time, and the first member's whole (one attempt, not shares,
  // ended by a refusal or a broken connection: patience is for a slow member).
  etcd_detail::json call(const std::string& path, const etcd_detail::json& body,
                         std::chrono::milliseconds patient = std::chrono::milliseconds::zero());
  struct Call;  // one call's members (etcd_client.cpp)

  // Watches (etcd_watch.cpp).
  struct WatchRead;
  WatchRead read_watch(EtcdStream& s, const EtcdEndpoint& e, Request req, Clock::time_point answer_by,
                       Clock::time_point deadline);
};

}  // namespace ddprun::rounds
