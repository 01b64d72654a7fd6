// The etcd client while a member of a real 3-member cluster is paused (SIGSTOP: it accepts
// connections but answers nothing) or killed: each request, lease renewal and watch moves to
// another member within its attempt time, and a watch resumes there from the same revision.
// Skipped where etcd is not installed (scripts/setup.sh installs etcd-server).
#include <catch2/catch.hpp>
#include <atomic>
#include <memory>
#include <thread>

#include "etcd_backend.hpp"
#include "etcd_cluster.hpp"
#include "etcd_lease_keeper.hpp"
#include "loopback.hpp"
#include "skip.hpp"
#include "threaded_rendezvous.hpp"

using namespace ddprun::rounds;
using namespace ddprun::rounds::testing;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

#define SKIP_WITHOUT_ETCD() SKIP_UNLESS(EtcdCluster::available(), "etcd is not installed (scripts/setup.sh installs etcd-server)")

namespace {

// The cluster's endpoints, member `first` first (the client tries it first).
std::vector<EtcdEndpoint> starting_at(const EtcdCluster& cluster, int first) {
  auto e = cluster.endpoints();
  std::rotate(e.begin(), e.begin() + first, e.end());
  return e;
}

EtcdOptions options(std::vector<EtcdEndpoint> e, std::chrono::milliseconds timeout, std::chrono::milliseconds attempt) {
  EtcdOptions o(std::move(e), timeout);
  o.attempt = attempt;
  return o;
}

double millis(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A keeper that renewed the lease through its first member, which it then asks alone first. A new
// one is made where that member, just resumed on a loaded machine, answered with an error (every
// member was then asked, and another is asked first from then on).
std::unique_ptr<EtcdLeaseKeeper> renewed_through_first(const std::vector<EtcdEndpoint>& members, std::chrono::milliseconds attempt,
                                                       std::int64_t term, std::int64_t lease) {
  for (int i = 0; i < 20; ++i) {
    auto keeper = std::make_unique<EtcdLeaseKeeper>(EtcdOptions(members, attempt), term);
    if (keeper->renew(lease, 3s).sent && keeper->preferred() == 0) return keeper;
    std::this_thread::sleep_for(100ms);
  }
  FAIL("the keeper's first member did not renew the lease in 20 tries");
  return nullptr;
}

}  // namespace

TEST_CASE("etcd failover: a paused member costs a request one attempt, not the call's time", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  const int follower = (cluster.leader() + 1) % 3;
  EtcdClient(options(cluster.endpoints(), 5s, 300ms)).put("/f/k", "v");
  // A client of its own, which asks the follower first (a client that wrote through another
  // member, the follower being slow on a loaded machine, would ask that one first).
  EtcdClient c(options(starting_at(cluster, follower), 5s, 300ms));
  cluster.pause(follower);
  auto t0 = SteadyClock::now();
  auto got = c.get("/f/k");
  auto took = SteadyClock::now() - t0;
  auto second_sent = c.last_sent() - t0;
  cluster.resume(follower);
  REQUIRE(got);
  CHECK(got->value == "v");
  INFO("the read took " << millis(took) << " ms; the request answered was sent after " << millis(second_sent) << " ms");
  CHECK(took < 1s);              // 300 ms on the paused member, then another member at once
  CHECK(second_sent >= 300ms);   // the renewal time of a lease counts from the attempt answered
}

TEST_CASE("etcd failover: with the leader paused longer than the lease, renewals through every member at once keep it, each within the fence", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;  // election timeout 500 ms
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  const auto ttl = 3s;  // the settings of the lease keeper for this TTL
  EtcdClient c(options(cluster.endpoints(), ttl, etcd_attempt(ttl)));
  const auto lease = c.grant_lease(std::chrono::duration_cast<std::chrono::seconds>(ttl));
  EtcdLeaseKeeper keeper(EtcdOptions(cluster.endpoints(), etcd_keepalive_attempt(ttl)), c.lease_term());
  c.put("/f/alive", "x", lease);
  auto last = c.last_sent();
  SteadyClock::duration worst{};
  cluster.pause(leader);
  const auto t0 = SteadyClock::now();
  int renewals = 0, held = 0, rounds = 0;
  while (SteadyClock::now() - t0 < 5s) {  // longer than the TTL
    auto r = keeper.renew(lease);
    ++rounds;
    CHECK_FALSE(r.expired);
    held += r.held ? 1 : 0;
    if (!r.sent && !r.held) continue;  // no answer that counts: the next round at once, as the keeper does
    worst = std::max(worst, r.sent.value_or(*r.held) - last);
    last = r.sent.value_or(*r.held);
    if (!r.sent) continue;
    ++renewals;
    std::this_thread::sleep_for(etcd_renewal_interval(ttl));  // the keeper's schedule
  }
  // Read before the old leader resumes: etcd 3.4 without etcd-io/etcd#12528 revokes, as it
  // resumes, the leases that expired in its own view (docs/multi-node.md, etcd failover); what
  // this case asserts is that the renewals kept the lease, so the live majority is asked.
  const bool alive = c.get("/f/alive").has_value();
  cluster.resume(leader);
  INFO(renewals << " renewals and " << held << " leaderless majorities in " << rounds << " rounds; the longest time between two: " << millis(worst) << " ms");
  CHECK(worst < ttl - fence_margin(ttl));  // the fence never lapsed
  CHECK(alive);                             // nor did the lease (while ddprun held it)
}

TEST_CASE("etcd lease: the member that renewed last is given half of what is left before the fence, at least one attempt", "[etcd][units]") {
  // TTL 5 s: one attempt 312 ms; 1.5 s left before the fence: (1500 - 2 x 312) / 2.
  CHECK(etcd_renewal_patience(5s, 1500ms) == 438ms);
  CHECK(etcd_renewal_patience(5s, 3250ms) == 1313ms);                     // just renewed: (3250 - 2 x 312) / 2
  CHECK(etcd_renewal_patience(5s, 500ms) == etcd_keepalive_attempt(5s));  // little left: one attempt
  CHECK(etcd_renewal_patience(5s, -1s) == etcd_keepalive_attempt(5s));    // the fence passed already
  CHECK(etcd_renewal_patience(60s, 52s) == 25500ms);                       // a long lease: no cap (a stop interrupts it)
  CHECK(etcd_renewal_patience(1s, 650ms) == 225ms);                        // rdzv_bench's 1 s lease
}

TEST_CASE("etcd failover: a renewal waits out a member that pauses less than its patience, alone - a longer pause costs the patience, then every member renews it", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;  // election timeout 500 ms: a follower is paused, so that no election runs
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  const int follower = (leader + 1) % 3;
  const auto ttl = 5s;
  EtcdClient c(options(cluster.endpoints(), ttl, etcd_attempt(ttl)));
  const auto lease = c.grant_lease(5s);
  EtcdLeaseKeeper keeper(EtcdOptions(starting_at(cluster, follower), etcd_keepalive_attempt(ttl)), c.lease_term());
  REQUIRE(keeper.renew(lease, 3s).sent);  // through the follower: the one asked first from now on
  // Paused 700 ms, under a patience of 3 s: waited for (every member asked would have renewed it
  // within one attempt, 312 ms).
  cluster.pause(follower);
  auto t0 = SteadyClock::now();
  std::thread resume([&] {
    std::this_thread::sleep_for(700ms);
    cluster.resume(follower);
  });
  auto r = keeper.renew(lease, 3s);
  auto took = SteadyClock::now() - t0;
  resume.join();
  INFO("took " << millis(took) << " ms: " << r.why);
  CHECK(r.sent);
  CHECK(took >= 700ms);
  CHECK(took < 3s);
  // Paused for good: the patience, then the others. (A keeper of its own that renewed through the
  // follower: the one above may not have, where the follower, resumed on a loaded machine,
  // answered with an error, which ends the patience and asks every member.)
  auto paused = renewed_through_first(starting_at(cluster, follower), etcd_keepalive_attempt(ttl), c.lease_term(), lease);
  cluster.pause(follower);
  t0 = SteadyClock::now();
  r = paused->renew(lease, 1500ms);
  took = SteadyClock::now() - t0;
  cluster.resume(follower);
  INFO("took " << millis(took) << " ms: " << r.why);
  CHECK(r.sent);
  CHECK(took >= 1500ms);
  CHECK(took < 4s);
  // Killed: a refused connection ends the patience at once (it is for a slow member). (A keeper
  // of its own, so that the follower is asked first again.)
  auto again = renewed_through_first(starting_at(cluster, follower), etcd_keepalive_attempt(ttl), c.lease_term(), lease);
  cluster.kill(follower);
  t0 = SteadyClock::now();
  r = again->renew(lease, 3s);
  took = SteadyClock::now() - t0;
  INFO("took " << millis(took) << " ms: " << r.why);
  CHECK(r.sent);
  CHECK(took < 1500ms);
}

TEST_CASE("etcd failover: a renewal keeps its first request waiting while it asks the others - the late answer counts, from when it was sent", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;  // election timeout 500 ms: a follower is paused, so that no election runs
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  const int follower = (leader + 1) % 3;
  const auto ttl = 5s;
  EtcdClient c(options(cluster.endpoints(), ttl, etcd_attempt(ttl)));
  const auto lease = c.grant_lease(5s);
  // The follower, then two members that take the request and never answer (listeners that
  // accept nothing): only the follower can renew it.
  std::uint16_t p1 = 0, p2 = 0;
  const int silent1 = ddprun::test::listen_loopback(p1, 64), silent2 = ddprun::test::listen_loopback(p2, 64);
  REQUIRE(silent1 >= 0);
  REQUIRE(silent2 >= 0);
  auto members = starting_at(cluster, follower);
  members.resize(1);
  members.push_back({"127.0.0.1", p1});
  members.push_back({"127.0.0.1", p2});
  EtcdLeaseKeeper keeper(EtcdOptions(members, 1s), c.lease_term());
  // Paused past its patience (600 ms), resumed within one attempt (1 s: a member just resumed
  // on a loaded machine takes a while) after: the request it had from the start renews the
  // lease. (Given up at the patience and sent again, the answer would be to a request sent at
  // 600 ms.)
  cluster.pause(follower);
  const auto t0 = SteadyClock::now();
  std::thread resume([&] {
    std::this_thread::sleep_for(750ms);
    cluster.resume(follower);
  });
  auto r = keeper.renew(lease, 600ms);
  const auto took = SteadyClock::now() - t0;
  resume.join();
  ::close(silent1);
  ::close(silent2);
  INFO("took " << millis(took) << " ms; " << r.why);
  REQUIRE(r.sent);
  INFO("the renewal that counts was sent " << millis(*r.sent - t0) << " ms after the start");
  CHECK(*r.sent - t0 < 300ms);
  CHECK(took >= 750ms);
  CHECK(keeper.preferred() == 0);
}

TEST_CASE("etcd failover: a stop ends a patient renewal under way at once, unrenewed", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  const int follower = (std::max(cluster.leader(), 0) + 1) % 3;
  EtcdClient c(options(cluster.endpoints(), 5s, etcd_attempt(5s)));
  const auto lease = c.grant_lease(5s);
  EtcdLeaseKeeper keeper(EtcdOptions(starting_at(cluster, follower), etcd_keepalive_attempt(5s)), c.lease_term());
  cluster.pause(follower);
  std::thread stop([&] {
    std::this_thread::sleep_for(300ms);
    keeper.interrupt();
  });
  const auto t0 = SteadyClock::now();
  auto r = keeper.renew(lease, 20s);  // a long lease's patience: waited for unless stopped
  const auto took = SteadyClock::now() - t0;
  stop.join();
  cluster.resume(follower);
  INFO("took " << millis(took) << " ms; " << r.why);
  CHECK_FALSE(r.sent);
  CHECK_FALSE(r.held);
  CHECK_FALSE(r.expired);
  CHECK(took < 1s);
  // Every later renewal ends at once too.
  const auto t1 = SteadyClock::now();
  CHECK_FALSE(keeper.renew(lease, 20s).sent);
  CHECK(SteadyClock::now() - t1 < 200ms);
}

TEST_CASE("etcd backend: a stop ends the lease keeper's patient renewal under way at once", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  RendezvousOptions opt;
  opt.run_id = "stop";
  opt.etcd_endpoints = cluster.endpoint_list();
  opt.lease_ttl = std::chrono::seconds(30);  // renewed every 3 s, the first member given ~10 s
  EtcdBackend backend(opt, {});
  auto c = backend.connect(5s);  // the lease granted, its keeper started
  // The keeper renews through the first member listed; paused, its next renewal waits on it.
  cluster.pause(0);
  // Past the renewal interval (3 s), with room for a keeper thread that runs late on a loaded
  // machine: a renewal under way, waiting on the paused member for its ~12 s patience.
  std::this_thread::sleep_for(5s);
  const auto t0 = SteadyClock::now();
  backend.stop_renewals();
  const auto took = SteadyClock::now() - t0;
  cluster.resume(0);
  INFO("the stop took " << millis(took) << " ms");
  CHECK(took < 700ms);  // not the 1 s a stop waits before it gives the thread up
}

// The agent's shutdown gives up, after 2 s, a rendezvous thread stuck connecting to an etcd that
// does not answer, then stops the renewals: the grant under way ends at once, and no keeper or
// lease is left to run behind the stop (before, the grant went on to its call's time and a keeper
// could start after the stop had joined none).
TEST_CASE("etcd backend: a stop during the first connect's lease grant ends it at once, with no keeper started", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  RendezvousOptions opt;
  opt.run_id = "stop-grant";
  opt.etcd_endpoints = cluster.endpoint_list();
  EtcdBackend backend(opt, {});
  for (int i = 0; i < 3; ++i) cluster.pause(i);
  std::string why;
  SteadyClock::time_point ended;
  std::thread connecting([&] {
    try {
      backend.connect(20s);
      why = "connected";
    } catch (const ddprun::Error& e) {
      why = e.what();
    }
    ended = SteadyClock::now();
  });
  std::this_thread::sleep_for(500ms);  // the grant waits on the paused members
  const auto t0 = SteadyClock::now();
  backend.stop_renewals();
  const auto stop_took = SteadyClock::now() - t0;
  connecting.join();
  for (int i = 0; i < 3; ++i) cluster.resume(i);
  INFO("the connect ended " << millis(ended - t0) << " ms after the stop, which took " << millis(stop_took)
                            << " ms; it said: " << why);
  CHECK(ended - t0 < 700ms);
  CHECK(stop_took < 700ms);
  CHECK(why.find("ddprun is stopping") != std::string::npos);
  // A connect after the stop grants nothing either.
  const auto t1 = SteadyClock::now();
  CHECK_THROWS_WITH(backend.connect(5s), Catch::Contains("ddprun is stopping"));
  CHECK(SteadyClock::now() - t1 < 500ms);
}

TEST_CASE("etcd failover: with two members of three paused, the one left saying it has no leader holds nothing: the fence lapses", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;  // election timeout 500 ms
  const int leader = cluster.leader();
  REQUIRE(leader >= 0);
  const auto ttl = 3s;
  EtcdClient c(options(cluster.endpoints(), ttl, etcd_attempt(ttl)));
  const auto lease = c.grant_lease(std::chrono::duration_cast<std::chrono::seconds>(ttl));
  EtcdLeaseKeeper keeper(EtcdOptions(cluster.endpoints(), etcd_keepalive_attempt(ttl)), c.lease_term());
  cluster.pause(leader);
  cluster.pause((leader + 1) % 3);
  const auto t0 = SteadyClock::now();
  // On a loaded machine the leader can change between leader() and the pauses: the member left
  // may then be a leader elected just before them, which renews leases until it misses its
  // quorum (an election timeout, 500 ms). Past three of them nothing may renew.
  int rounds = 0, counted = 0, late = 0;
  while (SteadyClock::now() - t0 < 3s) {  // the one left campaigns on its own, term after term
    auto r = keeper.renew(lease);
    ++rounds;
    if (r.sent || r.held) {
      ++counted;
      if ((r.sent ? *r.sent : *r.held) - t0 > 1500ms) ++late;
    }
    CHECK_FALSE(r.expired);
  }
  cluster.resume(leader);
  cluster.resume((leader + 1) % 3);
  INFO(rounds << " rounds, " << counted << " renewed");
  CHECK(rounds > 2);
  CHECK(late == 0);
}

TEST_CASE("etcd failover: a watch on a paused member moves to another and starts from the same revision", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  const int follower = (cluster.leader() + 1) % 3;
  EtcdClient w(options(starting_at(cluster, follower), 5s, 300ms));
  EtcdClient writer(options(starting_at(cluster, (follower + 1) % 3), 5s, 300ms));
  const auto rev = writer.put("/f/w", "1");
  cluster.pause(follower);
  writer.put("/f/w", "2");  // before the watch starts: found from the revision, not live
  auto t0 = SteadyClock::now();
  auto events = w.watch("/f/w", false, rev + 1, 5s);
  auto took = SteadyClock::now() - t0;
  cluster.resume(follower);
  INFO("the watch answered after " << millis(took) << " ms");
  REQUIRE(events.size() == 1);
  CHECK(events[0].kv.value == "2");
  CHECK(took < 2s);
}

TEST_CASE("etcd failover: a watch whose member is killed under it goes on on another, losing no event", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  const int follower = (cluster.leader() + 1) % 3;
  EtcdClient w(options(starting_at(cluster, follower), 5s, 300ms));
  EtcdClient writer(options(starting_at(cluster, (follower + 1) % 3), 5s, 300ms));
  const auto rev = writer.put("/f/k", "0");
  std::vector<EtcdEvent> events;
  std::thread watching([&] { events = w.watch("/f/k", false, rev + 1, 8s); });
  const auto until = SteadyClock::now() + 5s;
  while (!connected_to(cluster.client_port(follower)) && SteadyClock::now() < until) std::this_thread::sleep_for(10ms);
  REQUIRE(connected_to(cluster.client_port(follower)));  // the watch is on the follower
  cluster.kill(follower);
  writer.put("/f/k", "1");
  auto t0 = SteadyClock::now();
  watching.join();
  INFO("the watch answered " << millis(SteadyClock::now() - t0) << " ms after the write");
  REQUIRE(events.size() == 1);
  CHECK(events[0].kv.value == "1");
}

namespace {

struct SeenLost : LivenessEvents {
  std::atomic<int> lost_g{-1};
  std::atomic<bool> unreachable{false};
  void peer_lost(int, int g, double) override { lost_g = g; }
  void lost(int, const std::string&) override { unreachable = true; }
};

}  // namespace

TEST_CASE("etcd liveness: the next member's record watched a TTL at a time - its loss seen at once, a stop ends the watch at once", "[etcd]") {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster;
  RendezvousOptions opt;
  opt.run_id = "ring";
  opt.etcd_endpoints = cluster.endpoint_list();
  opt.lease_ttl = std::chrono::seconds(30);  // the watch is held 30 s at a time
  EtcdBackend backend(opt, {});
  auto c = backend.connect(5s);
  Members m;
  m.group_world = 2;
  m.next_record = round_key(0, Name::node, 1);
  m.next_host = "h1";
  auto events = std::make_shared<SeenLost>();
  c->put(m.next_record, "{}", Lifetime::run);
  {
    // A stop while the watch is held: the liveness is gone within moments, not after its
    // bounded join (1.5 s) gives the thread up.
    auto live = backend.watch(m, events);
    std::this_thread::sleep_for(500ms);  // the record read, the watch confirmed (not a wait for a state)
    const auto t0 = SteadyClock::now();
    live.reset();
    CHECK(millis(SteadyClock::now() - t0) < 500);
  }
  CHECK(events->lost_g == -1);
  {
    auto live = backend.watch(m, events);
    std::this_thread::sleep_for(500ms);
    EtcdClient other({cluster.endpoints(), 5s});
    const auto t0 = SteadyClock::now();
    other.delete_prefix(c->name(m.next_record));  // as its lease expiring would
    while (events->lost_g == -1 && SteadyClock::now() - t0 < 10s) std::this_thread::sleep_for(10ms);
    CHECK(events->lost_g == 1);
    CHECK(millis(SteadyClock::now() - t0) < 1000);  // the held watch woke: no second read needed
  }
  // Gone after the round's end: the member left with the job done (its lease revoked) before
  // this node read the end. Not a loss, and not said to be one.
  auto after_end = std::make_shared<SeenLost>();
  c->put(m.next_record, "{}", Lifetime::run);
  {
    auto live = backend.watch(m, after_end);
    std::this_thread::sleep_for(500ms);
    EtcdClient other({cluster.endpoints(), 5s});
    other.put(c->name(round_key(0, Name::end)), "{}");
    other.delete_prefix(c->name(m.next_record));
    std::this_thread::sleep_for(1s);  // what the watch would report, it has by now (above: within 1 s)
  }
  CHECK(after_end->lost_g == -1);
  CHECK_FALSE(events->unreachable);
  backend.close();
}
