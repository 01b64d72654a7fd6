// The round rules with static node ranks (--node_rank): claims, a rank held by a live node, a
// stop reaching a node that waits for its rank, a duplicate's stop reaching nobody, a round
// abandoned by a dead holder's replacement.
#include <catch2/catch.hpp>
#include <csignal>

#include "round_state.hpp"
#include "rules_nodes.hpp"

using namespace ddprun::rounds;
using namespace ddprun::rounds::testing;
using Kind = RoundEnd::Kind;
using FK = RendezvousFailure::Kind;

TEST_CASE("rules: static ranks come from --node_rank, whatever the arrival order", "[rules]") {
  Nodes n(3, 3, BackendKind::static_ranks);
  for (int rank : {2, 0, 1}) n.add(rank);
  for (auto& node : n.nodes) node->join(0, 0);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(n.rec[i]->wait_ready());
    CHECK(n.rec[i]->ready.front().group_rank == std::vector<int>{2, 0, 1}[i]);
  }
}

TEST_CASE("rules: a node rank held by a live node is refused within the liveness TTL, naming it", "[rules]") {
  Nodes n(2, 2, BackendKind::static_ranks);
  n.add(0);
  n.add(1);
  n.join_all(0, 0);
  int late = n.add(1);
  auto t0 = std::chrono::steady_clock::now();
  n.nodes[late]->join(0, -1);
  REQUIRE(n.rec[late]->wait_failed());
  const auto& f = n.rec[late]->failed.front();
  CHECK(f.kind == FK::in_use);
  CHECK_THAT(f.message, Catch::Contains("node rank 1 is already held by") && Catch::Contains("--node_rank"));
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);  // TTL 1 s + 1 s
  SECTION("but a node whose round ended takes the rank in the next round") {
    int again = n.add(1);
    n.world->lose(0, 1);
    for (int i : {0, 1}) REQUIRE(n.rec[i]->wait_over());
    n.nodes[again]->join(0, -1);
    n.nodes[0]->join(1, 1);
    REQUIRE(n.rec[again]->wait_ready());
    CHECK(n.rec[again]->ready.front().round == 1);
    CHECK(n.rec[again]->ready.front().group_rank == 1);
    CHECK(n.rec[again]->ready.front().restart_count == 1);  // the job's count, not the new node's
  }
}

TEST_CASE("rules: a duplicate static rank whose holder's job finishes meanwhile is refused as a duplicate", "[rules]") {
  Nodes n(2, 2, BackendKind::static_ranks);
  n.add(0);
  n.add(1);
  n.join_all(0, 0);
  const int dup = n.add(1);
  n.nodes[dup]->join(0, -1);
  {
    // Its claim refused, it reads the holder's counters: the job ends while it looks.
    const std::string held = round_key(0, Name::held, 1).text();
    std::unique_lock<std::mutex> lk(n.world->mu);
    REQUIRE(n.world->cv.wait_for(lk, 10s, [&] { return n.world->looks[held] > 0; }));
  }
  n.nodes[0]->report_success(0);
  n.nodes[1]->report_success(0);
  REQUIRE(n.rec[dup]->wait_failed());
  const auto& f = n.rec[dup]->failed.front();
  CHECK(f.kind == FK::in_use);
  // (it met in the next round and waited there, for nodes of a job that was over)
  CHECK_THAT(f.message, Catch::Contains("node rank 1 was held by") && Catch::Contains("whose job finished while this node "
                                                                                       "waited; give each node its own --node_rank"));
}

// A second --node_rank=1 while the round is open (rank 2 not there yet): the holder's `held`
// counter moves every third of a TTL, so the duplicate is refused at its next look, a little over
// a third of a TTL after its claim, naming the holder's host (it waited silently until
// join_timeout, 10 s here).
TEST_CASE("rules: a duplicate static rank in an open round is refused within a third of a TTL, naming the holder",
          "[rules]") {
  Nodes n(3, 3, BackendKind::static_ranks);
  n.add(0);
  n.add(1);
  n.nodes[0]->join(0, 0);
  n.nodes[1]->join(0, 0);
  FakeConnection look(n.world);
  REQUIRE(look.wait({round_key(0, Name::node, 0), round_key(0, Name::node, 1)}, Clock::now() + 5s));
  const RankClaim holder = parse_claim("rank", *look.get(round_key(0, Name::rank, 1)));
  int dup = n.add(1);
  const auto t0 = std::chrono::steady_clock::now();
  n.nodes[dup]->join(0, -1);
  REQUIRE(n.rec[dup]->wait([&] { return !n.rec[dup]->failed.empty(); }, 5s));
  const auto took = std::chrono::steady_clock::now() - t0;
  const auto& f = n.rec[dup]->failed.front();
  CHECK(f.kind == FK::in_use);
  CHECK_THAT(f.message, Catch::Contains("node rank 1 is already held by " + holder.host + " (alive: its held counter moved") &&
                            Catch::Contains("give each node its own --node_rank (0..2)"));
  CHECK(took < 1s);  // TTL 1 s: a look 433 ms after the claim
  // The round it tried to join is untouched: rank 2 completes it.
  CHECK_FALSE(look.get(round_key(0, Name::closed)));
  n.add(2);
  n.nodes[3]->join(0, 0);
  for (int i : {0, 1, 3}) {
    REQUIRE(n.rec[i]->wait_ready());
    CHECK(n.rec[i]->ready.front().round == 0);
  }
}

// A duplicate --node_rank stopped (Ctrl-C, SIGTERM) is a member of no round, whether its claim
// was refused or is still on its way: its stop must not end the round the rank's holder waits in
// (it closed that round as stopped, and the healthy nodes exited).
TEST_CASE("rules: a stop of a duplicate static rank does not end the round its holder waits in", "[rules]") {
  const bool refused = GENERATE(true, false);
  INFO((refused ? "its claim refused" : "its claim on its way"));
  Nodes n(3, 3, BackendKind::static_ranks);
  n.add(0);
  n.add(1);
  n.nodes[0]->join(0, 0);
  n.nodes[1]->join(0, 0);
  FakeConnection look(n.world);
  REQUIRE(look.wait({round_key(0, Name::node, 0), round_key(0, Name::node, 1)}, Clock::now() + 5s));
  int dup = n.add(1);
  n.nodes[dup]->join(0, -1);
  // Refused: it looks at the holder's counters (the keep-alive one is read, hence made, only by a
  // claimer while the round is open).
  if (refused) look.wait({round_key(0, Name::alive, 1)}, Clock::now() + 1s);
  n.nodes[dup]->leave(0, SIGINT);
  REQUIRE(n.rec[dup]->wait([&] { return n.rec[dup]->finished == 1; }, 5s));
  CHECK_FALSE(look.get(round_key(0, Name::closed)));
  CHECK_FALSE(look.get(round_key(0, Name::end)));
  n.add(2);
  n.nodes[3]->join(0, 0);
  for (int i : {0, 1, 3}) {
    REQUIRE(n.rec[i]->wait_ready());
    CHECK(n.rec[i]->ready.front().round == 0);
    CHECK(n.rec[i]->failed.empty());
  }
}

// A node waiting for a static rank held by a live node is a node of the job too: a stop of the
// round reaches it (it went on to the next round and waited there until join_timeout).
TEST_CASE("rules: a stop reaches a node waiting for its static rank's holder", "[rules]") {
  Nodes n(3, 3, BackendKind::static_ranks);
  n.add(0);
  n.add(1);
  int second = n.add(1);  // rank 1 again: it waits while the holder shows it is alive
  n.nodes[0]->join(0, 0);
  n.nodes[1]->join(0, 0);
  FakeConnection look(n.world);
  REQUIRE(look.wait({round_key(0, Name::node, 1)}, Clock::now() + 5s));  // both arrived
  n.nodes[second]->join(0, -1);
  n.nodes[0]->leave(0, SIGINT);
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(n.rec[second]->wait_failed());
  CHECK(n.rec[second]->failed.front().kind == FK::stopped);
  CHECK(n.rec[second]->failed.front().signal == SIGINT);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);  // a TTL (1 s) at most, not join_timeout
  REQUIRE(n.rec[1]->wait_failed());
  CHECK(n.rec[1]->failed.front().kind == FK::stopped);
}

// A stop announced to a round abandoned before it closed (a static rank's holder died in it) is
// announced to the next one, where its nodes went.
TEST_CASE("rules: a stop for an abandoned round goes to the next round", "[rules]") {
  NoStore workers;
  auto world = std::make_shared<FakeWorld>();
  Nodes n(2, 2, BackendKind::static_ranks);
  FakeBackend backend(world, {});
  RoundRules rules(n.opt, backend, workers, Self{"n1", {}});
  FakeConnection c(world);
  c.put(round_key(0, Name::closed), closed_json(Closed::abandoned(1)), Lifetime::run);
  rules.announce_stop(c, 0, SIGINT);
  CHECK_FALSE(c.get(round_key(0, Name::end)));
  REQUIRE(c.get(round_key(1, Name::closed)));
  CHECK(parse_closed("closed", *c.get(round_key(1, Name::closed))).kind == Closed::Kind::stopped);
  REQUIRE(c.get(round_key(1, Name::end)));
  const RoundEnd e = parse_round_end("end", *c.get(round_key(1, Name::end)));
  CHECK(e.kind == Kind::stopped);
  CHECK(e.signal == SIGINT);
}
