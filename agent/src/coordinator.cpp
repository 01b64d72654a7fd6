#include "coordinator.hpp"

#include <arpa/inet.h>
#include <csignal>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <set>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"

namespace ddprun::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string key(int round, const std::string& name) { return round_key(round, name); }

std::string secs(std::chrono::milliseconds d) { return duration_text(d); }

// The numeric addresses `host` resolves to.
std::set<std::string> resolve(const std::string& host) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (auto* ai = res; ai; ai = ai->ai_next) {
    char buf[NI_MAXHOST];
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) == 0) out.insert(buf);
  }
  ::freeaddrinfo(res);
  return out;
}

std::set<std::string> local_addresses() {
  std::set<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (auto* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    char buf[NI_MAXHOST];
    socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(i->ifa_addr, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) == 0) {
      std::string a = buf;
      out.insert(a.substr(0, a.find('%')));  // drop an IPv6 scope
    }
  }
  ::freeifaddrs(ifs);
  return out;
}

bool is_ip_literal(const std::string& a) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, a.c_str(), buf) == 1 || ::inet_pton(AF_INET6, a.c_str(), buf) == 1;
}

int to_int(const std::string& s, int def) {
  auto v = parse_int(s, INT32_MIN, INT32_MAX);
  return v ? static_cast<int>(*v) : def;
}

}  // namespace

Coordinator::Coordinator(const RendezvousOptions& opt, const std::string& run_id, int nproc, int node_rank)
    : opt_(opt), prefix_("ddprun/rdzv/" + run_id), node_id_(random_node_id()), nproc_(nproc), node_rank_(node_rank) {
  if (decide_host()) {
    rendezvous::StoreServerOptions so;
    so.host = "";  // every interface: the endpoint's address is one of them
    so.port = opt.endpoint_port;
    so.secret = opt.secret;      // agents prove they know the job's secret
    so.same_user = true;         // processes of other users on this host are refused
    so.reserved_fds = 64 + 8 * static_cast<std::size_t>(nproc);
    try {
      server_ = std::make_unique<rendezvous::StoreServer>(so);
      server_->start();
      opt_.endpoint_port = server_->port();  // the real one when port 0 asked for a free port
      // The workers' store speaks plain TCPStore (PyTorch connects to it): only this host's
      // processes of this user, and the nodes of the current round (set in join()).
      rendezvous::StoreServerOptions wo;
      wo.host = "";
      wo.port = 0;
      wo.same_user = true;
      wo.allow = std::vector<std::string>{};
      wo.reserved_fds = so.reserved_fds;
      worker_store_ = std::make_unique<rendezvous::StoreServer>(wo);
      worker_store_->start();
      spdlog::info("ddprun: hosting the rendezvous store on port {} (workers' store on port {})", server_->port(),
                   worker_store_->port());
      if (opt.secret.empty()) {
        spdlog::warn("ddprun: the rendezvous store on port {} accepts any client that can reach it; give every node "
                     "--rdzv_conf=secret_file=PATH (README: Security)",
                     server_->port());
      }
    } catch (const NetworkError& e) {
      server_.reset();
      if (opt.is_host == 1) {
        throw Error("is_host=1 but the rendezvous store cannot listen on port " + std::to_string(opt.endpoint_port) +
                    ": " + e.what());
      }
      // Another agent on this machine got the port first: it is the host.
      spdlog::debug("ddprun: port {} is taken; joining as a client ({})", opt.endpoint_port, e.what());
    }
  }
}

Coordinator::~Coordinator() = default;

void Coordinator::connect() { store_ = connect(opt_.join_timeout); }

std::string Coordinator::full_key(int round, const std::string& name) const { return prefix_ + "/" + key(round, name); }

std::string Coordinator::endpoint() const { return format_address(opt_.endpoint_host, opt_.endpoint_port); }

bool Coordinator::decide_host() const {
  if (opt_.is_host >= 0) return opt_.is_host == 1;
  auto mine = local_addresses();
  for (const auto& a : resolve(opt_.endpoint_host)) {
    if (mine.count(a) || a.rfind("127.", 0) == 0 || a == "::1") return true;
  }
  return false;
}

std::shared_ptr<rendezvous::Store> Coordinator::connect(std::chrono::milliseconds timeout) const {
  rendezvous::TcpStoreOptions o;
  o.host = opt_.endpoint_host;
  o.port = opt_.endpoint_port;
  o.timeout = timeout;
  o.secret = opt_.secret;
  std::shared_ptr<rendezvous::TcpStore> tcp;
  try {
    tcp = std::make_shared<rendezvous::TcpStore>(o);
  } catch (const AuthError& e) {
    throw AuthError("the rendezvous store at " + endpoint() + " refused this node: wrong or missing secret (" +
                    e.what() + "); give every node the same --rdzv_conf=secret_file=PATH or DDPRUN_SECRET_FILE");
  } catch (const TimeoutError& e) {
    throw TimeoutError("rendezvous: no store at " + endpoint() + " within the join timeout (" + secs(timeout) +
                       "): is the host node's ddprun running, and is --rdzv_endpoint right?");
  }
  tcp->set_timeout(opt_.read_timeout);
  return std::make_shared<rendezvous::PrefixStore>(prefix_, tcp);
}

RoundInfo Coordinator::join(int round, int restart_count) {
  auto& s = *store_;
  const auto deadline = Clock::now() + opt_.join_timeout;
  for (;;) {
    if (restart_count < 0 && s.check({"round"})) round = std::max(round, to_int(s.get("round"), 0));
    s.set("round", std::to_string(round));
    if (restart_count >= 0) s.set(key(round, "rc"), std::to_string(restart_count));
    int idx = static_cast<int>(s.add(key(round, "join"), 1)) - 1;
    NodeInfo me;
    me.host = opt_.local_addr.empty() ? host_name() : opt_.local_addr;
    me.addr = opt_.local_addr;
    me.nproc = nproc_;
    me.node_rank = node_rank_;
    auto mine = local_addresses();
    me.addrs.assign(mine.begin(), mine.end());
    s.set(key(round, "node/" + std::to_string(idx)), node_json(me));
    int closed = wait_closed(s, round, idx, deadline);
    if (idx < closed) return read_round(s, round, idx, closed, restart_count);
    // The round is running without us. If it has room, ask it to restart with us in.
    if (closed < opt_.max_nodes) {
      s.set(key(round + 1, "expect"), std::to_string(closed + 1));
      s.compare_set(key(round, "end"), "", round_end_json(RoundEnd::of_membership(host_name())));
    }
    spdlog::info("ddprun: round {} is full or closed ({} nodes); waiting for the next one", round, closed);
    restart_count = -1;
    ++round;
  }
}

// Closes round `round` when this arrival (`idx`) fills it, waits until it is closed, and returns
// how many nodes it holds.
int Coordinator::wait_closed(rendezvous::Store& s, int round, int idx, Clock::time_point deadline) {
  int expect = opt_.max_nodes;
  if (s.check({key(round, "expect")})) expect = std::clamp(to_int(s.get(key(round, "expect")), expect), 1, opt_.max_nodes);
  const std::string closed = key(round, "closed");
  if (idx + 1 >= opt_.max_nodes || (idx + 1 >= opt_.min_nodes && idx + 1 >= expect)) {
    // Full, or every survivor of the last round is back: close now, no last call.
    s.compare_set(closed, "", std::to_string(idx + 1));
  }
  if (idx + 1 >= opt_.min_nodes) {
    try {
      s.wait({closed}, opt_.last_call_timeout);
    } catch (const TimeoutError&) {
      // Last call over: close with whoever has arrived.
      s.compare_set(closed, "", std::to_string(s.add(key(round, "join"), 0)));
    }
  } else {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      s.wait({closed}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      throw_if_stopped(s, round);
      long long joined = s.add(key(round, "join"), 0);
      throw TimeoutError("rendezvous: only " + std::to_string(joined) + " of the " + std::to_string(opt_.min_nodes) +
                         " nodes needed joined round " + std::to_string(round) + " on " + endpoint() + " within " +
                         secs(opt_.join_timeout) + " (join_timeout); start the other nodes, or lower --nnodes");
    }
  }
  throw_if_stopped(s, round);
  return to_int(s.get(closed), 0);
}

// In round `round` as its idx-th arrival: every member's description, this node's place.
RoundInfo Coordinator::read_round(rendezvous::Store& s, int round, int idx, int closed, int restart_count) {
  std::vector<std::string> node_keys;
  for (int i = 0; i < closed; ++i) node_keys.push_back(key(round, "node/" + std::to_string(i)));
  s.wait(node_keys, opt_.read_timeout);
  auto raw = s.multi_get(node_keys);
  RoundInfo info;
  info.round = round;
  info.group_world = closed;
  std::vector<NodeInfo> by_arrival;
  for (const auto& r : raw) {
    by_arrival.push_back(parse_node(full_key(round, "node/" + std::to_string(by_arrival.size())), r));
  }
  if (opt_.dynamic) {
    info.group_rank = idx;
    info.nodes = by_arrival;
  } else {
    // Static: group rank = --node_rank, which must be unique and below --nnodes.
    info.nodes.resize(closed);
    std::vector<bool> seen(closed, false);
    for (const auto& n : by_arrival) {
      if (n.node_rank < 0 || n.node_rank >= closed || seen[n.node_rank]) {
        throw UsageError("rendezvous: node_rank " + std::to_string(n.node_rank) + " (host " + n.host +
                         ") is out of range or used twice; give each node a distinct --node_rank in 0.." +
                         std::to_string(closed - 1));
      }
      seen[n.node_rank] = true;
      info.nodes[n.node_rank] = n;
    }
    info.group_rank = node_rank_;
  }
  info.world_size = 0;
  for (int g = 0; g < closed; ++g) {
    if (g < info.group_rank) info.rank_offset += info.nodes[g].nproc;
    info.world_size += info.nodes[g].nproc;
  }
  info.restart_count = restart_count >= 0 ? restart_count
                       : s.check({key(round, "rc")}) ? to_int(s.get(key(round, "rc")), 0)
                                                      : 0;
  publish_workers_store(s, info);
  return info;
}

// The workers' store: emptied by its host for this round, then published.
void Coordinator::publish_workers_store(rendezvous::Store& s, RoundInfo& info) {
  const std::string store_key = key(info.round, "store");
  if (worker_store_) {
    // Workers of this round's nodes may connect from any of their nodes' addresses.
    std::vector<std::string> allowed;
    for (const auto& n : info.nodes) {
      for (const auto& a : n.addrs) {
        if (is_ip_literal(a)) allowed.push_back(a);
      }
    }
    worker_store_->set_allow(allowed);
    worker_store_->reset();
    s.set(store_key, std::to_string(worker_store_->port()));
  }
  s.wait({store_key}, opt_.read_timeout);
  throw_if_stopped(s, info.round);
  info.store_host = opt_.endpoint_host;
  info.store_port = static_cast<std::uint16_t>(to_int(s.get(store_key), 0));
}

void Coordinator::announce_stop(int round, int signal) {
  auto s = connect(std::chrono::milliseconds(1000));
  s->set_timeout(std::chrono::milliseconds(1000));
  s->compare_set(key(round, "end"), "", round_end_json(RoundEnd::of_stop(signal, host_name(), node_id_)));
  // Wake whoever waits for the round to close, or for its workers' store.
  s->compare_set(key(round, "closed"), "", "stopped");
  s->compare_set(key(round, "store"), "", "stopped");
  // The store lives in this process when this node hosts it: keep it until the other nodes
  // that joined have read why the round ended (each acknowledges), at most 1.5 s; when none had
  // joined yet, 0.3 s for one that was just arriving.
  if (is_host()) {
    bool others = s->add(key(round, "join"), 0) > 1;
    try {
      s->wait({key(round, "stop_seen")}, std::chrono::milliseconds(others ? 1500 : 300));
    } catch (const TimeoutError&) {
      spdlog::debug("ddprun: not every node acknowledged the stop of round {}", round);
    }
  }
}

void Coordinator::throw_if_stopped(rendezvous::Store& s, int round) const {
  const std::string end = key(round, "end");
  if (!s.check({end})) return;
  auto e = parse_round_end(full_key(round, "end"), s.get(end));
  if (e.kind != RoundEnd::Kind::stopped) return;
  // Acknowledge: the last of the joined nodes (all but the one that stopped) releases the host.
  // The node that stopped the round does not acknowledge its own stop.
  if (e.by == node_id_) throw JobStopped(e.signal > 0 ? e.signal : SIGTERM, e.host);
  try {
    long long joined = s.add(key(round, "join"), 0);
    if (s.add(key(round, "stop_acks"), 1) >= joined - 1) s.set(key(round, "stop_seen"), "1");
  } catch (const Error&) {
    // The host is gone already: the stop is known, which is all that matters here.
  }
  throw JobStopped(e.signal > 0 ? e.signal : SIGTERM, e.host);
}

void Coordinator::end_round(int round, RoundEnd why, int expect_next) {
  if (why.kind == RoundEnd::Kind::stopped) why.by = node_id_;
  if (expect_next > 0) store_->set(key(round + 1, "expect"), std::to_string(expect_next));
  store_->compare_set(key(round, "end"), "", round_end_json(why));
}

void Coordinator::report_success(int round, int group_world) {
  if (store_->add(key(round, "succeeded"), 1) == group_world) {
    store_->compare_set(key(round, "end"), "", round_end_json(RoundEnd::of_success()));
  }
}

void Coordinator::acknowledge_end(int round, int group_world) {
  if (store_->add(key(round, "acked"), 1) >= group_world) store_->set(key(round, "all_acked"), "1");
  if (!server_) return;
  // The host's store must outlive the others' last reads; bounded (close_timeout), it is no
  // exit barrier: normally every node acknowledges within milliseconds.
  try {
    store_->wait({key(round, "all_acked")}, opt_.close_timeout);
  } catch (const TimeoutError&) {
    spdlog::debug("ddprun: not every node acknowledged the end of round {}", round);
  }
}

void Coordinator::keep_alive(int round, int group_rank) {
  store_->add(key(round, "alive/" + std::to_string(group_rank)), 1);
}

long long Coordinator::alive_count(int round, int group_rank) {
  auto k = key(round, "alive/" + std::to_string(group_rank));
  auto v = store_->multi_get({k});
  if (v[0].empty()) return -1;
  auto n = parse_int(v[0]);
  if (!n) throw ProtocolError("rendezvous: malformed value at key '" + full_key(round, "alive/" + std::to_string(group_rank)) + "': not a counter");
  return *n;
}

std::shared_ptr<rendezvous::Store> Coordinator::connect_watch() const { return connect(opt_.read_timeout); }

std::string Coordinator::wait_end(rendezvous::Store& s, int round) const {
  const std::string k = key(round, "end");
  for (;;) {
    try {
      s.wait({k}, std::chrono::hours(24));
      return s.get(k);
    } catch (const TimeoutError&) {
    }
  }
}

}  // namespace ddprun::agent
