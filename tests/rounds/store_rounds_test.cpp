// The round rules over a real c10d store, in-process: N nodes (ThreadedRendezvous over
// StoreBackend) meet through the rendezvous store hosted by the first one, or by a store none of
// them hosts (an external ddprun-store).
#include <catch2/catch.hpp>
#include <csignal>
#include <set>

#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "etcd_cluster.hpp"
#include "recorder.hpp"
#include "round_state.hpp"
#include "store_backend.hpp"
#include "threaded_rendezvous.hpp"

using namespace ddprun::rounds;
using namespace ddprun::rounds::testing;
using Kind = RoundEnd::Kind;

namespace {

RendezvousOptions store_options(int min_nodes, int max_nodes) {
  RendezvousOptions o;
  o.backend = BackendKind::c10d;
  o.run_id = "job";
  o.nproc = 2;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.endpoint_host = "127.0.0.1";
  o.endpoint_port = 0;
  o.join_timeout = 10s;
  o.last_call_timeout = 200ms;
  o.keep_alive_interval = 100ms;
  o.keep_alive_max_attempt = 3;
  o.read_timeout = 5s;
  return o;
}

std::unique_ptr<ThreadedRendezvous> node(const RendezvousOptions& o, Recorder& r) {
  auto n = std::make_unique<ThreadedRendezvous>(
      o, [&](std::weak_ptr<Renewals> rn) { return std::make_unique<StoreBackend>(o, std::move(rn)); }, inline_post(), &r);
  n->set_listener(r);
  return n;
}

// Node 0 hosts the store (is_host=1, a free port), or an external store serves them all.
struct Cluster {
  std::unique_ptr<ddprun::rendezvous::StoreServer> external;
  std::vector<std::unique_ptr<Recorder>> rec;
  std::vector<std::unique_ptr<ThreadedRendezvous>> nodes;
  RendezvousOptions opt;
  std::uint16_t port = 0;

  Cluster(int n, int min_nodes, int max_nodes, bool external_store = false) : opt(store_options(min_nodes, max_nodes)) {
    if (external_store) {
      external = std::make_unique<ddprun::rendezvous::StoreServer>(ddprun::rendezvous::StoreServerOptions{});
      external->start();
      port = external->port();
    }
    for (int i = 0; i < n; ++i) {
      auto o = opt;
      o.host_role = i == 0 && !external_store ? HostRole::always : HostRole::never;
      o.endpoint_port = port;
      rec.push_back(std::make_unique<Recorder>());
      nodes.push_back(node(o, *rec.back()));
      if (i == 0 && !external_store) port = static_cast<StoreBackend&>(nodes[0]->backend()).port();
    }
  }
  std::shared_ptr<ddprun::rendezvous::Store> client() const {
    ddprun::rendezvous::TcpStoreOptions o;
    o.port = port;
    o.timeout = 5s;
    return std::make_shared<ddprun::rendezvous::PrefixStore>("ddprun/rdzv/job",
                                                             std::make_shared<ddprun::rendezvous::TcpStore>(o));
  }
  void join_all(int round, int rc) {
    for (auto& a : nodes) a->join(round, rc);
    for (auto& r : rec) REQUIRE(r->wait_ready());
  }
};

void check_one_world(Cluster& c, int n) {
  std::set<int> group_ranks, offsets;
  std::set<std::uint16_t> ports;
  for (auto& r : c.rec) {
    const auto& i = r->ready.front();
    CHECK(i.group_world == n);
    CHECK(i.world_size == 2 * n);
    CHECK(i.nodes.size() == static_cast<std::size_t>(i.group_rank == 0 ? n : 0));  // the records: group rank 0's alone
    ports.insert(i.store_port);
    group_ranks.insert(i.group_rank);
    offsets.insert(i.rank_offset);
  }
  CHECK(ports.size() == 1);
  CHECK(group_ranks.size() == static_cast<std::size_t>(n));
  CHECK(*offsets.rbegin() == 2 * (n - 1));
}

}  // namespace

TEST_CASE("store rounds: three nodes form one world with distinct ranks and one workers' store", "[store_rounds]") {
  Cluster c(3, 3, 3);
  c.join_all(0, 0);
  check_one_world(c, 3);
  // The workers' store is group rank 0's, whoever hosts the rendezvous store.
  ddprun::rendezvous::TcpStoreOptions w;
  w.host = c.rec[0]->ready.front().store_host;
  w.port = c.rec[0]->ready.front().store_port;
  w.timeout = 2s;
  ddprun::rendezvous::TcpStore workers(w);
  workers.set("k", "v");
  CHECK(workers.get("k") == "v");
}

TEST_CASE("store rounds: an external store that no node hosts - group rank 0 hosts the workers' store", "[store_rounds]") {
  Cluster c(2, 2, 2, /*external_store=*/true);
  c.join_all(0, 0);
  check_one_world(c, 2);
  CHECK(c.rec[0]->ready.front().store_port != c.port);
}

TEST_CASE("store rounds: a node whose keep-alives stop is lost for the others within the TTL", "[store_rounds]") {
  Cluster c(3, 2, 3);
  c.join_all(0, 0);
  // Group rank g is watched by g - 1: shut down one that does not host the store.
  int victim = c.rec[1]->ready.front().group_rank == 0 ? 2 : 1;
  int lost_rank = c.rec[victim]->ready.front().group_rank;
  auto t0 = std::chrono::steady_clock::now();
  c.nodes[victim]->shutdown();
  for (int i : {0, 1, 2}) {
    if (i == victim) continue;
    REQUIRE(c.rec[i]->wait_over());
    REQUIRE(c.rec[i]->over.front().end);
    CHECK(c.rec[i]->over.front().end->kind == Kind::node_lost);
    CHECK(c.rec[i]->over.front().end->group_rank == lost_rank);
  }
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 300ms);  // not before the TTL (3 x 100 ms)
  CHECK(took < 3s);
  // Its fence was last told a deadline before the others counted it lost.
  REQUIRE_FALSE(c.rec[victim]->renewals.empty());
  CHECK(c.rec[victim]->renewals.back() < std::chrono::steady_clock::now());
}

TEST_CASE("store rounds: static: a rank whose holder died in a round that never closed is taken in the next round",
          "[store_rounds]") {
  // An external store (no node's death takes it along), three static ranks. Rank 0 waits in
  // round 0; rank 1's holder arrived there and died (the keys a crashed agent leaves); its
  // replacement must not be refused "node rank in use" (it was, at join_timeout, and every later
  // one too: the store has no liveness for a node before its round runs).
  Cluster c(0, 3, 3, true);
  auto o = c.opt;
  o.backend = BackendKind::static_ranks;
  o.host_role = HostRole::never;
  o.endpoint_port = c.port;
  o.read_timeout = 1s;  // the holder is given up after TTL + 2 x read_timeout of silence
  auto add = [&](int rank) {
    auto mine = o;
    mine.node_rank = rank;
    c.rec.push_back(std::make_unique<Recorder>());
    c.nodes.push_back(node(mine, *c.rec.back()));
    c.nodes.back()->join(0, -1);
  };
  add(0);
  auto store = c.client();
  store->wait({"r0/node/0"}, 5s);
  store->compare_set("r0/rank/1", "", claim_json({"dead-holder", "crashed-host"}));
  NodeInfo dead;
  dead.host = "crashed-host";
  dead.nproc = 2;
  dead.node_rank = 1;
  store->set("r0/node/" + std::to_string(store->add("r0/join", 1) - 1), node_json(dead));

  const auto t0 = std::chrono::steady_clock::now();
  add(1);
  store->wait({"r0/closed"}, 8s);  // before join_timeout (10 s)
  CHECK(parse_closed("r0/closed", store->get("r0/closed")).kind == Closed::Kind::abandoned);
  CHECK(std::chrono::steady_clock::now() - t0 >= 2s);  // not before the holder's silence was long enough
  add(2);
  for (int i = 0; i < 3; ++i) {
    INFO("rank " << i);
    REQUIRE(c.rec[i]->wait_ready());
    CHECK(c.rec[i]->ready.front().round == 1);
    CHECK(c.rec[i]->ready.front().group_rank == i);
    CHECK(c.rec[i]->ready.front().group_world == 3);
  }
}

// A second --node_rank=1 while rank 1's round runs: the holder's keep-alive counter (its group
// rank is its node rank) moves every interval, so the duplicate is refused at its next look, a
// little over a third of a TTL after its claim, with the message of an open round (it took two
// TTLs, members_gone's included).
TEST_CASE("store rounds: static: a duplicate rank of a running round's member is refused within a third of a TTL",
          "[store_rounds]") {
  Cluster c(0, 2, 2, true);
  auto o = c.opt;
  o.backend = BackendKind::static_ranks;
  o.host_role = HostRole::never;
  o.endpoint_port = c.port;
  o.keep_alive_interval = 300ms;  // TTL 900 ms: a look 390 ms after the claim
  auto add = [&](int rank, int rc) {
    auto mine = o;
    mine.node_rank = rank;
    c.rec.push_back(std::make_unique<Recorder>());
    c.nodes.push_back(node(mine, *c.rec.back()));
    c.nodes.back()->join(0, rc);
  };
  add(0, 0);
  add(1, 0);
  for (auto& r : c.rec) REQUIRE(r->wait_ready());
  const std::string holder = c.rec[0]->ready.front().nodes[1].host;  // group rank 0 holds the records
  const auto t0 = std::chrono::steady_clock::now();
  add(1, -1);
  auto& dup = *c.rec[2];
  REQUIRE(dup.wait([&] { return !dup.failed.empty(); }, 5s));
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(dup.failed.front().kind == RendezvousFailure::Kind::in_use);
  CHECK_THAT(dup.failed.front().message, Catch::Contains("node rank 1 is already held by " + holder +
                                                         " (alive: its keep-alive counter moved") &&
                                             Catch::Contains("give each node its own --node_rank (0..1)"));
  CHECK(took < 1200ms);
  // The round runs on.
  CHECK(c.rec[0]->over.empty());
  CHECK(c.rec[1]->over.empty());
}

TEST_CASE("store rounds: a malformed end record is a protocol error naming the key, on every node", "[store_rounds]") {
  Cluster c(2, 2, 2);
  c.join_all(0, 0);
  auto value = GENERATE(std::string("not json"), std::string("{\"kind\": 5}"), std::string("{\"kind\":\"failure\",\"rank\":\"x\"}"));
  c.client()->set("r0/end", value);
  for (auto& r : c.rec) {
    REQUIRE(r->wait_over());
    CHECK_FALSE(r->over.front().end);
    CHECK_THAT(r->over.front().lost.message, Catch::Contains("malformed value at key 'ddprun/rdzv/job/r0/end'"));
  }
}

TEST_CASE("store rounds: a node stopped during the rendezvous stops the ones waiting in it within 2 s", "[store_rounds]") {
  Cluster c(2, 3, 3);
  for (auto& a : c.nodes) a->join(0, 0);
  auto t0 = std::chrono::steady_clock::now();
  c.nodes[1]->leave(0, SIGINT);
  auto& host = *c.rec[0];
  REQUIRE(host.wait_failed());
  CHECK(host.failed.front().kind == RendezvousFailure::Kind::stopped);
  CHECK(host.failed.front().signal == SIGINT);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(c.rec[1]->wait([&] { return c.rec[1]->finished == 1; }));
}

TEST_CASE("store rounds: no store at the endpoint within the join time-out says what to check", "[store_rounds]") {
  auto o = store_options(2, 2);
  o.host_role = HostRole::never;
  o.endpoint_port = 1;  // nothing listens there
  o.join_timeout = 300ms;
  Recorder r;
  auto a = node(o, r);
  a->join(0, 0);
  REQUIRE(r.wait_failed());
  CHECK(r.failed.front().kind == RendezvousFailure::Kind::timeout);
  CHECK_THAT(r.failed.front().message, Catch::Contains("no store at 127.0.0.1:1") && Catch::Contains("--rdzv_endpoint"));
}

TEST_CASE("store backend: a static node's messages name the settings its store came from", "[store]") {
  auto o = store_options(2, 2);
  o.backend = BackendKind::static_ranks;
  o.host_role = HostRole::never;
  o.endpoint_port = free_port();  // nothing listens there
  StoreBackend at_endpoint(o, {});  // static with --rdzv_endpoint
  CHECK_THROWS_WITH(at_endpoint.connect(200ms), Catch::Contains("node 0's") && Catch::Contains("is --rdzv_endpoint right"));
  o.endpoint_host_setting = "--master_addr";
  o.endpoint_port_setting = "--master_port";
  StoreBackend at_master(o, {});
  CHECK_THROWS_WITH(at_master.connect(200ms), Catch::Contains("are --master_addr and --master_port right"));
  // Read from Kubeflow's variables: those are named, they are what the user can change.
  o.endpoint_host_setting = "PET_MASTER_ADDR (read as --master_addr)";
  o.endpoint_port_setting = "PET_MASTER_PORT (read as --master_port)";
  StoreBackend from_pet(o, {});
  CHECK_THROWS_WITH(from_pet.connect(200ms), Catch::Contains("are PET_MASTER_ADDR (read as --master_addr) and "
                                                             "PET_MASTER_PORT (read as --master_port) right"));
}

TEST_CASE("store backend: an endpoint name that does not resolve is waited for until the join time-out, then named",
          "[store][names]") {
  auto o = store_options(1, 2);
  o.endpoint_host = "pod-0.never.invalid";  // .invalid never resolves (RFC 6761)
  o.endpoint_port = 29400;
  o.join_timeout = 1500ms;
  StoreBackend b(o, {});
  CHECK_FALSE(b.holds_records());  // undecided: the name cannot say whether it is this node's
  auto t0 = Clock::now();
  CHECK_THROWS_WITH(b.connect(1500ms), Catch::Contains("rendezvous: pod-0.never.invalid did not resolve within 1.5 s "
                                                       "(--rdzv_conf join_timeout): check --rdzv_endpoint"));
  auto took = Clock::now() - t0;
  CHECK(took >= 1500ms);
  CHECK(took < 3500ms);
  // A stop's announcement (a second of its own) names no setting of the user's.
  CHECK_THROWS_WITH(b.connect(200ms), Catch::Contains("within 200 ms: check") && !Catch::Contains("join_timeout"));
  // An address, or a name that resolves, is not waited for.
  o.endpoint_host = "localhost";
  o.endpoint_port = free_port();  // nothing listens there
  o.host_role = HostRole::never;
  StoreBackend local(o, {});
  t0 = Clock::now();
  CHECK_THROWS_WITH(local.connect(300ms), Catch::Contains("no store at localhost:" + std::to_string(o.endpoint_port)));
  CHECK(Clock::now() - t0 < 2s);
}
