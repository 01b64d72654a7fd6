// The store-based rendezvous in-process: N agents (StoreRendezvous, each with its coordinator
// and watch threads) meet through the rendezvous store hosted by the first one, in this process.
#include <catch2/catch.hpp>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>

#include "ddprun/rendezvous/prefix_store.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "store_rendezvous.hpp"

using namespace ddprun::agent;
using namespace std::chrono_literals;
using Kind = RoundEnd::Kind;

namespace {

// Collects what a rendezvous tells its listener, from whatever thread.
struct Recorder : Rendezvous::Listener {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RoundInfo> ready;
  std::deque<RoundOutcome> over;
  std::deque<std::pair<std::string, int>> failed;
  int finished = 0;

  template <typename F>
  void note(F f) {
    {
      std::lock_guard<std::mutex> lk(mu);
      f();
    }
    cv.notify_all();
  }
  void on_round_ready(const RoundInfo& i) override { note([&] { ready.push_back(i); }); }
  void on_rendezvous_failed(const std::string& m, int c) override { note([&] { failed.emplace_back(m, c); }); }
  void on_round_over(const RoundOutcome& o) override { note([&] { over.push_back(o); }); }
  void on_finished() override { note([&] { ++finished; }); }

  template <typename Pred>
  bool wait(Pred p, std::chrono::milliseconds limit = 10s) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, limit, p);
  }
};

RendezvousOptions rdzv_options(int min_nodes, int max_nodes) {
  RendezvousOptions o;
  o.enabled = true;
  o.dynamic = true;
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

// Agent 0 hosts the store (is_host=1, a free port); the others join it.
struct Cluster {
  std::vector<std::unique_ptr<Recorder>> rec;
  std::vector<std::unique_ptr<StoreRendezvous>> agents;
  RendezvousOptions opt;

  Cluster(int n, int min_nodes, int max_nodes, int nproc = 2) : opt(rdzv_options(min_nodes, max_nodes)) {
    for (int i = 0; i < n; ++i) {
      auto o = opt;
      o.is_host = i == 0 ? 1 : 0;
      if (i > 0) o.endpoint_port = agents[0]->endpoint_port();
      rec.push_back(std::make_unique<Recorder>());
      auto* r = rec.back().get();
      // Post runs on the calling thread: the recorder is thread-safe.
      agents.push_back(std::make_unique<StoreRendezvous>(o, "job", nproc, 0, [](std::function<void()> f) { f(); }));
      agents.back()->set_listener(*r);
    }
  }
  std::shared_ptr<ddprun::rendezvous::Store> client() const {
    ddprun::rendezvous::TcpStoreOptions o;
    o.port = agents[0]->endpoint_port();
    o.timeout = 5s;
    return std::make_shared<ddprun::rendezvous::PrefixStore>("ddprun/rdzv/job",
                                                             std::make_shared<ddprun::rendezvous::TcpStore>(o));
  }
  void join_all(int round, int rc) {
    for (auto& a : agents) a->join(round, rc);
    for (auto& r : rec) REQUIRE(r->wait([&] { return !r->ready.empty(); }));
  }
  // Every agent saw round `round` end; returns the outcomes.
  std::vector<RoundOutcome> outcomes(int round, std::size_t skip = 0) {
    std::vector<RoundOutcome> out;
    for (auto& r : rec) {
      REQUIRE(r->wait([&] { return r->over.size() > skip; }));
      out.push_back(r->over[skip]);
      CHECK(out.back().round == round);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("coordinator: three agents form one world with distinct ranks and one workers' store", "[coordinator]") {
  Cluster c(3, 3, 3);
  c.join_all(0, 0);
  std::set<int> group_ranks, offsets;
  for (auto& r : c.rec) {
    const auto& i = r->ready.front();
    CHECK(i.group_world == 3);
    CHECK(i.world_size == 6);
    CHECK(i.store_port == c.rec[0]->ready.front().store_port);
    CHECK(i.nodes.size() == 3);
    group_ranks.insert(i.group_rank);
    offsets.insert(i.rank_offset);
  }
  CHECK(group_ranks == std::set<int>{0, 1, 2});
  CHECK(offsets == std::set<int>{0, 2, 4});
  SECTION("a failure ends the round with the same root cause everywhere") {
    FailureRecord f;
    f.rank = 3;
    f.host = "node-1";
    f.exit_code = 7;
    f.reason = "exit code 7";
    c.agents[1]->end_round(0, RoundEnd::of_failure(f), 3);
    REQUIRE(c.rec[1]->wait([&] { return !c.rec[1]->over.empty(); }));
    c.agents[2]->end_round(0, RoundEnd::of_stop(SIGTERM, "node-2", ""), 0);  // too late: the first end wins
    for (const auto& o : c.outcomes(0)) {
      REQUIRE(o.end);
      REQUIRE(o.end->kind == Kind::failure);
      CHECK(o.end->failure->rank == 3);
      CHECK(o.end->failure->exit_code == 7);
    }
    for (auto& a : c.agents) a->finish(0, true);
    for (auto& r : c.rec) CHECK(r->wait([&] { return r->finished == 1; }));
    SECTION("and the next round restarts with the count every node was given") {
      for (auto& r : c.rec) r->ready.clear();
      c.join_all(1, 1);
      for (auto& r : c.rec) CHECK(r->ready.front().restart_count == 1);
    }
  }
  SECTION("the round succeeds once every node reports success") {
    c.agents[0]->report_success(0);
    c.agents[1]->report_success(0);
    CHECK_FALSE(c.rec[2]->wait([&] { return !c.rec[2]->over.empty(); }, 300ms));
    c.agents[2]->report_success(0);
    for (const auto& o : c.outcomes(0)) CHECK(o.end->kind == Kind::success);
  }
}

TEST_CASE("coordinator: a node that stops sending keep-alives is lost for the others", "[coordinator]") {
  Cluster c(3, 2, 3);
  c.join_all(0, 0);
  // Group rank g is watched by g - 1: shut down one that is not the host.
  int victim = c.rec[1]->ready.front().group_rank == 0 ? 2 : 1;
  int lost_rank = c.rec[victim]->ready.front().group_rank;
  auto t0 = std::chrono::steady_clock::now();
  c.agents[victim]->shutdown();
  for (int i : {0, 1, 2}) {
    if (i == victim) continue;
    auto& r = *c.rec[i];
    REQUIRE(r.wait([&] { return !r.over.empty(); }));
    REQUIRE(r.over.front().end);
    CHECK(r.over.front().end->kind == Kind::node_lost);
    CHECK(r.over.front().end->group_rank == lost_rank);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

TEST_CASE("coordinator: a malformed end record is a protocol error naming the key, on every node", "[coordinator]") {
  Cluster c(2, 2, 2);
  c.join_all(0, 0);
  auto value = GENERATE(std::string("not json"), std::string("{\"kind\": 5}"), std::string("{\"kind\":\"failure\",\"rank\":\"x\"}"));
  c.client()->set("r0/end", value);
  for (const auto& o : c.outcomes(0)) {
    CHECK_FALSE(o.end);
    CHECK_THAT(o.error, Catch::Contains("malformed value at key 'ddprun/rdzv/job/r0/end'"));
  }
}

TEST_CASE("coordinator: a node stopped during the rendezvous stops the ones waiting in it", "[coordinator]") {
  Cluster c(2, 3, 3);
  for (auto& a : c.agents) a->join(0, 0);
  // Both wait for a third node; the second is told to stop.
  auto t0 = std::chrono::steady_clock::now();
  c.agents[1]->leave(0, SIGINT);
  auto& host = *c.rec[0];
  REQUIRE(host.wait([&] { return !host.failed.empty(); }, 5s));
  CHECK(host.failed.front().second == 128 + SIGINT);
  CHECK_THAT(host.failed.front().first, Catch::Contains("stopped by SIGINT"));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(c.rec[1]->wait([&] { return c.rec[1]->finished == 1; }, 5s));
  CHECK(host.ready.empty());
}

TEST_CASE("coordinator: too few nodes within join_timeout is a time-out with what to do", "[coordinator]") {
  auto o = rdzv_options(2, 2);
  o.is_host = 1;
  o.join_timeout = 300ms;
  Recorder r;
  StoreRendezvous a(o, "job", 1, 0, [](std::function<void()> f) { f(); });
  a.set_listener(r);
  a.join(0, 0);
  REQUIRE(r.wait([&] { return !r.failed.empty(); }, 5s));
  CHECK(r.failed.front().second == 1);
  CHECK_THAT(r.failed.front().first, Catch::Contains("only 1 of the 2 nodes"));
}
