#include "store_backend.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "bounded_thread.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "keep_alive_ring.hpp"
#include "task_queue.hpp"
#include "workers_store.hpp"

namespace ddprun::rounds {
namespace {

using namespace std::chrono_literals;

class StoreConnection : public Connection {
 public:
  explicit StoreConnection(std::shared_ptr<rendezvous::PrefixStore> s) : s_(std::move(s)) {}

  // One MULTI_GET: a missing key reads as empty, and no value of the protocol is empty.
  std::optional<std::string> get(const Key& k) override { return get_many({k}).front(); }
  std::vector<std::optional<std::string>> get_many(const std::vector<Key>& keys) override {
    std::vector<std::string> texts;
    for (const auto& k : keys) texts.push_back(k.text());
    std::vector<std::optional<std::string>> out;
    for (auto& v : s_->multi_get(texts)) {
      if (v.empty()) {
        out.emplace_back();
      } else {
        out.emplace_back(std::move(v));
      }
    }
    return out;
  }
  void put(const Key& k, const std::string& value, Lifetime) override { s_->set(k.text(), value); }
  void put_many(const std::vector<Key>& keys, const std::vector<std::string>& values, Lifetime) override {
    std::vector<std::string> texts;
    for (const auto& k : keys) texts.push_back(k.text());
    s_->multi_set(texts, values);
  }
  std::string create(const Key& k, const std::string& value, Lifetime) override {
    return s_->compare_set(k.text(), "", value);
  }
  std::int64_t add(const Key& k, std::int64_t delta) override { return s_->add(k.text(), delta); }
  bool wait(const std::vector<Key>& keys, Clock::time_point deadline) override {
    std::vector<std::string> texts;
    for (const auto& k : keys) texts.push_back(k.text());
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) return s_->check(texts);
    try {
      s_->wait(texts, left);
      return true;
    } catch (const TimeoutError&) {
      return false;
    }
  }
  void clear_run() override {}  // the store goes with its host; an external one keeps the markers
  std::string name(const Key& k) const override { return s_->prefix() + "/" + k.text(); }

 private:
  std::shared_ptr<rendezvous::PrefixStore> s_;
};

// The keep-alive ring of one round on a thread of its own: this node's counter bumped, the next
// node's watched (keep_alive_ring.hpp).
struct Ring {
  std::unique_ptr<Connection> conn;
  std::unique_ptr<KeepAliveRing> ring;
  std::weak_ptr<LivenessEvents> events;
  std::weak_ptr<Renewals> renewals;
  std::string lost_message;
  StopSignal stop;

  void renewed(Clock::time_point sent) {
    if (auto r = renewals.lock()) r->renewed(sent);
  }

  void run() {
    const int round = ring->round();
    auto tell = [this](Clock::time_point sent) { renewed(sent); };
    while (!stop.wait_for(ring->every())) {
      try {
        if (auto idle = ring->check(*conn, tell)) {
          if (auto e = events.lock()) e->peer_lost(round, ring->next(), *idle);
        }
      } catch (const Error& e) {
        spdlog::debug("ddprun: keep-alive of round {} failed: {}", round, e.what());
        if (auto ev = events.lock()) ev->lost(round, lost_message);
        return;
      }
    }
  }
};

}  // namespace

StoreBackend::StoreBackend(const RendezvousOptions& opt, std::weak_ptr<Renewals> renewals)
    : opt_(opt), renewals_(std::move(renewals)),
      name_({opt.endpoint_host}, opt.endpoint_host_setting, opt.join_timeout),
      port_(opt.endpoint_port) {
  // A name that does not resolve yet cannot say whether it is this node's: decided on connect.
  if (opt.host_role != HostRole::automatic || !resolve_host(opt.endpoint_host).empty()) decide_hosting();
}

void StoreBackend::decide_hosting() {
  std::lock_guard<std::mutex> lk(decide_mu_);
  if (decided_) return;
  if (should_host()) {
    host();
  } else if (port_ == 0) {
    // Only the host may bind a free port: no other node could learn which one it got.
    const bool fixed = opt_.backend == BackendKind::static_ranks;
    throw UsageError(opt_.endpoint_port_setting + " gives port 0 (" + format_address(opt_.endpoint_host, 0) +
                     "), which names no port, and this node does not host the store (" +
                     (fixed                                  ? opt_.node_rank_setting + " is not 0"
                      : opt_.host_role == HostRole::never ? "--rdzv_conf is_host=0"
                                                          : opt_.endpoint_host + " is not one of its addresses") +
                     "): give the port the host listens on");
  }
  decided_ = true;
}

void StoreBackend::host() {
  rendezvous::StoreServerOptions so;
  so.host = "";  // every interface: the endpoint's address is one of them
  so.port = opt_.endpoint_port;
  so.secret = opt_.secret;  // agents prove they know the job's secret
  so.same_user = true;      // processes of other users on this host are refused
  so.reserved_fds = 64 + 8 * static_cast<std::size_t>(opt_.nproc);
  try {
    server_ = std::make_unique<rendezvous::StoreServer>(so);
  } catch (const NetworkError& e) {
    if (opt_.host_role == HostRole::always) {
      throw Error("is_host=1 but the rendezvous store cannot listen on port " + std::to_string(opt_.endpoint_port) + ": " +
                  e.what());
    }
    // Another agent on this machine got the port first: it is the host.
    spdlog::debug("ddprun: port {} is taken; joining as a client ({})", opt_.endpoint_port, e.what());
    return;
  }
  server_->start();
  port_ = server_->port();
  hosting_ = true;
  spdlog::info("ddprun: hosting the rendezvous store on port {}", port_.load());
  if (opt_.secret.empty()) {
    spdlog::warn("ddprun: the rendezvous store on port {} accepts any client that can reach it; give every node "
                 "--rdzv_conf=secret_file=PATH (README: Security)", port_.load());
  }
}

// By now this node's own connections are closed (the rules, the watch and the ring go first):
// the store waits for the other nodes' to close; they do within milliseconds, having read the end.
StoreBackend::~StoreBackend() {
  if (!hosting_ || !linger_) return;
  const auto deadline = Clock::now() + kHostLingers;
  try {
    while (server_->stats().connections > 0 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  } catch (const std::exception& e) {  // a destructor: the store goes anyway
    spdlog::debug("ddprun: the rendezvous store's connections could not be counted at exit: {}", e.what());
  }
}

bool StoreBackend::should_host() const {
  if (opt_.host_role != HostRole::automatic) return opt_.host_role == HostRole::always;
  auto mine = local_addresses();
  for (const auto& a : resolve_host(opt_.endpoint_host)) {
    if (is_loopback(a) || std::find(mine.begin(), mine.end(), a) != mine.end()) return true;
  }
  return false;
}

std::vector<HostedStore> StoreBackend::hosted() const {
  if (!hosting_) return {};  // set once server_ is up; server_ never changes after
  return {observe_store("rendezvous", *server_)};
}

std::string StoreBackend::endpoint() const { return format_address(opt_.endpoint_host, port_); }
std::string StoreBackend::where() const { return "the rendezvous store at " + endpoint(); }
std::string StoreBackend::reach() const { return source_address_towards(opt_.endpoint_host); }
std::string StoreBackend::lost_hint() const {
  return "the node (or ddprun-store) hosting it at " + endpoint() +
         " left, crashed or cannot be reached, and the job cannot go on without it: with the c10d backend the "
         "rendezvous store is a single point of failure. For a job that outlives the loss of any node, use "
         "--rdzv_backend=etcd, or run an external ddprun-store on a machine that stays up and give every node "
         "--rdzv_conf=is_host=0";
}

std::chrono::milliseconds StoreBackend::liveness_ttl() const {
  return opt_.keep_alive_interval * opt_.keep_alive_max_attempt;
}

std::unique_ptr<Connection> StoreBackend::connect(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  name_.until(timeout);
  decide_hosting();
  rendezvous::TcpStoreOptions o;
  o.host = opt_.endpoint_host;
  o.port = port_;
  o.timeout = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                       std::chrono::milliseconds(1));
  o.secret = opt_.secret;
  // The settings that name the store's address: one (--rdzv_endpoint) or two (--master_addr, --master_port).
  const bool one_setting = opt_.endpoint_host_setting == opt_.endpoint_port_setting;
  const std::string settings =
      one_setting ? opt_.endpoint_host_setting : opt_.endpoint_host_setting + " and " + opt_.endpoint_port_setting;
  o.pointed_by = settings + ", --rdzv_backend";
  std::shared_ptr<rendezvous::TcpStore> tcp;
  try {
    tcp = std::make_shared<rendezvous::TcpStore>(o);
  } catch (const AuthError& e) {
    throw AuthError("the rendezvous store at " + endpoint() + " refused this node: wrong or missing secret (" + e.what() +
                    "); give every node the same --rdzv_conf=secret_file=PATH or DDPRUN_SECRET_FILE");
  } catch (const TimeoutError& e) {
    // A store that was there but full says so (its client's message names it); else, none came.
    if (std::string(e.what()).find("at capacity") != std::string::npos) throw TimeoutError("rendezvous: " + std::string(e.what()));
    const bool fixed = opt_.backend == BackendKind::static_ranks;
    throw TimeoutError("rendezvous: no store at " + endpoint() + " within " + duration_text(timeout) + ": is " +
                       (fixed ? "node 0's" : "the host node's") + " ddprun (or ddprun-store) running, and " +
                       (one_setting ? "is " : "are ") + settings + " right? (" + e.what() + ")");
  }
  tcp->set_timeout(std::min(timeout, opt_.read_timeout));
  return std::make_unique<StoreConnection>(std::make_shared<rendezvous::PrefixStore>("ddprun/rdzv/" + opt_.run_id, tcp));
}

std::unique_ptr<Liveness> StoreBackend::watch(const Members& m, std::weak_ptr<LivenessEvents> events) {
  auto ring = std::make_shared<Ring>();
  ring->conn = connect(opt_.read_timeout);
  ring->ring = std::make_unique<KeepAliveRing>(m, opt_.keep_alive_interval, liveness_ttl());
  ring->events = std::move(events);
  ring->renewals = renewals_;
  ring->lost_message = "lost " + where() + ": " + lost_hint();
  // The first keep-alive before the round's workers start: the fence is armed.
  ring->ring->beat(*ring->conn, [r = ring.get()](Clock::time_point sent) { r->renewed(sent); });
  return std::make_unique<LivenessThread<Ring>>(ring, 1s);
}

}  // namespace ddprun::rounds
