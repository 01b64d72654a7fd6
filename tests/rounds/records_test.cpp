// The records nodes exchange: each one round-trips; anything malformed names the key.
#include <catch2/catch.hpp>

#include "ddprun/common/error.hpp"
#include "ddprun/rounds/records.hpp"
#include "keys.hpp"
#include "round_state.hpp"

using namespace ddprun::rounds;

TEST_CASE("round records: each kind round-trips, anything malformed names the key", "[units]") {
  FailureRecord f;
  f.rank = 5;
  f.host = "n1";
  f.exit_code = 3;
  f.reason = "exit code 3";
  f.stderr_tail = {"a", "b"};
  for (const auto& e : {RoundEnd::of_failure(f), RoundEnd::of_stop(2, "n2", "id"), RoundEnd::of_node_lost(1, "n3", 2.5),
                        RoundEnd::of_membership("n4"), RoundEnd::of_success()}) {
    auto back = parse_round_end("k", round_end_json(e));
    CHECK(back.kind == e.kind);
    CHECK(back.host == e.host);
    CHECK(back.signal == e.signal);
    CHECK(back.group_rank == e.group_rank);
  }
  auto back = parse_round_end("k", round_end_json(RoundEnd::of_failure(f)));
  CHECK(back.failure->stderr_tail == std::deque<std::string>{"a", "b"});
  // When the cause began (ms on the writer's wall clock) and a hang's silence: what every node
  // times its detection from.
  const std::chrono::system_clock::time_point at{std::chrono::milliseconds(1'700'000'000'123)};
  CHECK(parse_round_end("k", round_end_json(RoundEnd::of_node_lost(1, "n3", 2.5, at))).since == at);
  CHECK(parse_round_end("k", round_end_json(RoundEnd::of_node_lost(1, "n3", 2.5))).since.time_since_epoch().count() == 0);
  CHECK(parse_round_end("k", round_end_json(RoundEnd::of_membership("n4", at))).since == at);
  f.hang = true;
  f.silent_s = 31.5;
  CHECK(parse_round_end("k", round_end_json(RoundEnd::of_failure(f))).failure->silent_s == 31.5);
  for (const char* bad : {"", "nul", "[1]", "{\"kind\":\"nope\"}", "{\"kind\":\"stopped\",\"signal\":\"9\"}",
                          "{\"kind\":\"failure\",\"exit_code\":999}", "{\"kind\":\"failure\",\"stderr_tail\":[1]}"}) {
    CHECK_THROWS_WITH(parse_round_end("ddprun/rdzv/x/r0/end", bad), Catch::Contains("malformed value at key 'ddprun/rdzv/x/r0/end'"));
  }
  NodeInfo n;
  n.host = "h";
  n.nproc = 4;
  n.addrs = {"10.0.0.1"};
  auto nb = parse_node("k", node_json(n));
  CHECK(nb.nproc == 4);
  CHECK(nb.addrs == n.addrs);
  CHECK(nb.last_round == -1);  // a node that has run no round, or a record without the fields
  CHECK(parse_node("k", R"({"host": "h"})").last_rank == -1);
  n.last_round = 7;
  n.last_rank = 2;
  nb = parse_node("k", node_json(n));
  CHECK(nb.last_round == 7);
  CHECK(nb.last_rank == 2);
  // The workers' state: absent from a node without it (its record as before), else round-tripped.
  CHECK(node_json(n).find("state") == std::string::npos);
  CHECK((nb.state.link.empty() && !nb.state.holds));
  n.state = {"h:4242", true};
  nb = parse_node("k", node_json(n));
  CHECK((nb.state.link == "h:4242" && nb.state.holds));
  CHECK_THROWS_WITH(parse_node("r1/node/0", R"({"holds_state": 1})"), Catch::Contains("'holds_state'"));
  CHECK_THROWS_WITH(parse_node("r1/node/0", R"({"state_link": 7})"), Catch::Contains("'state_link'"));
  CHECK_THROWS_AS(parse_node("k", "{\"nproc\": 0}"), ddprun::ProtocolError);
  for (const char* bad : {R"({"last_rank": -2})", R"({"last_round": "1"})", R"({"last_rank": 1.5})"}) {
    CHECK_THROWS_WITH(parse_node("r1/node/0", bad), Catch::Contains("malformed value at key 'r1/node/0'"));
  }
  // Beyond an int, and beyond a long long (a JSON unsigned that a cast would wrap to -1: no place).
  for (const char* huge : {R"({"last_rank": 1099511627776})", R"({"last_rank": 18446744073709551615})",
                           R"({"last_round": 9223372036854775808})"}) {
    CHECK_THROWS_WITH(parse_node("r1/node/0", huge), Catch::Contains("'last_r") && Catch::Contains("out of range"));
  }
  CHECK(parse_node("k", R"({"last_rank": 2147483647})").last_rank == 2147483647);  // an int: beyond any round, no place
  // A long long field (the finished marker's time): a JSON unsigned beyond it would have wrapped
  // to a time long past, which a node takes for a relaunch's old marker.
  CHECK(parse_finished("finished", R"({"round": 1, "at_ms": 9223372036854775807})", 0).at_ms == 9223372036854775807LL);
  CHECK_THROWS_WITH(parse_finished("finished", R"({"round": 1, "at_ms": 9223372036854775808})", 0),
                    Catch::Contains("'at_ms' is out of range"));
  CHECK_THROWS_WITH(parse_finished("finished", R"({"round": 1, "at_ms": 18446744073709551615})", 0),
                    Catch::Contains("'at_ms' is out of range"));
  // A stop's signal becomes the late node's exit status (128 + signal): a signal number or none.
  CHECK(parse_finished("finished", R"({"round": 1, "at_ms": 5, "signal": 15, "host": "h1"})", 0).signal == 15);
  for (const char* bad : {R"({"round": 1, "at_ms": 5, "signal": 200})", R"({"round": 1, "at_ms": 5, "signal": -1})"}) {
    CHECK_THROWS_WITH(parse_finished("finished", bad, 0), Catch::Contains("'signal' is not a signal number"));
  }
}

TEST_CASE("round state: closed, store, config, assignment and members records round-trip - numbers are read strictly", "[records]") {
  CHECK(parse_closed("k", closed_json(Closed::of_nodes(3))).nodes == 3);
  CHECK(parse_closed("k", closed_json(Closed::stopped())).kind == Closed::Kind::stopped);
  CHECK(parse_closed("k", closed_json(Closed::abandoned(2))).kind == Closed::Kind::abandoned);
  CHECK(parse_closed("k", closed_json(Closed::abandoned(0))).rank == 0);
  CHECK_THROWS_AS(parse_closed("k", "{\"nodes\": 0}"), ddprun::ProtocolError);
  CHECK_THROWS_AS(parse_closed("k", R"({"abandoned": "x"})"), ddprun::ProtocolError);  // a hostile or broken writer
  CHECK_THROWS_AS(parse_config("k", R"({"backend": "c10d", "min_nodes": 1, "max_nodes": 2, "protocol": "2"})"),
                  ddprun::ProtocolError);
  StoreAddress a{"10.0.0.1", 29500, false};
  auto b = parse_store("k", store_json(a));
  CHECK(b.host == "10.0.0.1");
  CHECK(b.port == 29500);
  CHECK_THROWS_AS(parse_store("k", "{\"host\": \"h\", \"port\": 70000}"), ddprun::ProtocolError);
  RunConfig c{BackendKind::static_ranks, 2, 2};
  CHECK(parse_config("k", config_json(c)) == c);
  CHECK(parse_config("k", R"({"backend": "static", "min_nodes": 2, "max_nodes": 2})").protocol == 1);  // an older ddprun
  CHECK(c.describe() == "static, 2 nodes");
  Assignment as;
  as.group_rank = 1;
  as.offset = 4;
  as.world = 8;
  as.next = 2;
  as.next_host = "h2";
  as.rc = "3";
  as.streak = streak_json(Streak{});
  auto ab = parse_assignment("k", assignment_json(as));
  CHECK((ab.group_rank == 1 && ab.offset == 4 && ab.world == 8 && ab.rc == "3" && ab.refused.empty()));
  CHECK((ab.next == 2 && ab.next_host == "h2"));
  CHECK((ab.next_link.empty() && ab.holders == 0));
  CHECK(assignment_json(as).find("next_link") == std::string::npos);  // none: not written
  as.next_link = "h2:4242";
  as.holders = 3;
  ab = parse_assignment("k", assignment_json(as));
  CHECK((ab.next_link == "h2:4242" && ab.holders == 3));
  CHECK_THROWS_AS(
      parse_assignment("k", R"({"group_rank": 0, "offset": 0, "world": 1, "next": 0, "rc": "0", "streak": {}, "holders": -1})"),
      ddprun::ProtocolError);
  // Version 3's assignment names no ring neighbour: malformed here (the config's version says so first).
  CHECK_THROWS_AS(parse_assignment("k", R"({"group_rank": 0, "offset": 0, "world": 1, "rc": "0", "streak": {}})"),
                  ddprun::ProtocolError);
  CHECK(parse_streak("k", ab.streak).same == 0);
  as.refused = "node_rank 5 is out of range";
  CHECK(parse_assignment("k", assignment_json(as)).refused == as.refused);
  CHECK_THROWS_AS(parse_assignment("k", R"({"group_rank": 2, "offset": 8, "world": 8, "next": 0, "rc": "0", "streak": {}})"),
                  ddprun::ProtocolError);  // an offset at or past the world size
  CHECK_THROWS_AS(parse_assignment("k", R"({"group_rank": 0, "offset": 0, "world": 1, "next": 0, "rc": "0"})"),
                  ddprun::ProtocolError);  // no streak
  Lineup l{{"a", "b"}, {1, 0}};
  auto lb = parse_lineup("k", lineup_json(l), 2);
  CHECK((lb.hosts == l.hosts && lb.arrivals == l.arrivals));
  CHECK_THROWS_WITH(parse_lineup("ddprun/rdzv/x/r0/members", lineup_json(l), 3),
                    Catch::Contains("malformed value at key 'ddprun/rdzv/x/r0/members'"));
  CHECK_THROWS_AS(parse_lineup("k", R"({"hosts": ["a"], "arrivals": [1]})", 1), ddprun::ProtocolError);
  CHECK(parse_number("k", "12", 0, 20) == 12);
  for (const char* bad : {"", "12x", "0x10", " 1", "-1", "99"}) {
    CHECK_THROWS_WITH(parse_number("ddprun/rdzv/x/r0/expect", bad, 0, 20),
                      Catch::Contains("malformed value at key 'ddprun/rdzv/x/r0/expect'"));
  }
}

TEST_CASE("keys: typed, each kind with its text", "[records]") {
  CHECK(round_key(3, Name::end).text() == "r3/end");
  CHECK(round_key(0, Name::node, 2).text() == "r0/node/2");
  CHECK(round_key(0, Name::node, 2).family() == "r0/node/");
  CHECK(round_key(1, Name::assign, 3).text() == "r1/assign/3");
  CHECK(round_key(1, Name::members).text() == "r1/members");
  CHECK(run_key(Name::config).text() == "config");
}

TEST_CASE("round records: the crash-loop streak counts the same root cause and host in a row, and round-trips", "[records]") {
  FailureRecord f;
  f.rank = 1;
  f.host = "n1";
  f.status.code = 3;
  const Streak one = Streak{}.after(f), two = one.after(f);
  CHECK((one.same == 1 && one.host_same == 1));
  CHECK((two.same == 2 && two.host_same == 2 && two.host == "n1"));
  FailureRecord other = f;
  other.hang = true;  // the same rank, hung: another cause, on the same host
  const Streak three = two.after(other);
  CHECK((three.same == 1 && three.host_same == 3));
  CHECK(parse_streak("k", streak_json(three)) == three);
  CHECK(parse_streak("k", "{}") == Streak{});
  CHECK_THROWS_WITH(parse_streak("ddprun/rdzv/x/r1/streak", "{\"same\": -1}"),
                    Catch::Contains("malformed value at key 'ddprun/rdzv/x/r1/streak'"));
  CHECK(round_key(1, Name::streak).text() == "r1/streak");
}

TEST_CASE("round records: the restart policy - a crash loop first, then no restart left, else a restart", "[records]") {
  FailureRecord f;
  f.rank = 0;
  f.host = "n0";
  f.status.code = 1;
  using V = AfterFailure::Verdict;
  const Streak once = Streak{}.after(f);
  // --max_same_failures=2: the second same failure in a row is a crash loop, restarts left or not.
  CHECK(after_failure(Streak{}, f, 0, 5, 2).verdict == V::restart);
  auto loop = after_failure(once, f, 1, 5, 2);
  CHECK(loop.verdict == V::crash_loop);
  CHECK(loop.streak.same == 2);
  CHECK(after_failure(once, f, 9, 1, 2).verdict == V::crash_loop);
  // --max_restarts=1: restart 0 failing may restart once; restart 1 failing may not.
  CHECK(after_failure(Streak{}, f, 0, 1, 0).verdict == V::restart);
  CHECK(after_failure(once, f, 1, 1, 0).verdict == V::no_restart_left);
  CHECK(after_failure(once, f, 1, 0, 0).verdict == V::no_restart_left);
  // Below 0: unlimited; a max_same_failures of 0: no crash-loop limit.
  CHECK(after_failure(once.after(f).after(f), f, 1000, -1, 0).verdict == V::restart);
}
