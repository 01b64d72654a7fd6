// The rule by which a round of lease renewals that got through nowhere still holds the lease:
// a majority of the cluster's voting members, each saying it has no leader at a raft term above
// the one the lease was last renewed in (leaderless_quorum; docs/multi-node.md, etcd outages).
#include <catch2/catch.hpp>

#include "etcd_lease_keeper.hpp"

using namespace ddprun::rounds;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {
const auto t0 = SteadyClock::time_point{} + 100s;
LeaderlessAnswer said(std::string id, std::int64_t term, SteadyClock::duration after, bool leaderless = true) {
  return {std::move(id), leaderless, term, t0 + after};
}
}  // namespace

TEST_CASE("lease rule: a majority leaderless past the lease's term holds it from the earliest question", "[rules]") {
  auto held = leaderless_quorum({said("a", 7, 30ms), said("b", 9, 10ms)}, 3, 7);
  REQUIRE(held);
  CHECK(*held == t0 + 10ms);
  CHECK(leaderless_quorum({said("a", 8, 0ms), said("b", 8, 0ms), said("c", 8, 0ms)}, 5, 7));
}

TEST_CASE("lease rule: fewer than a majority hold nothing (a node cut off from the majority, or a quorum lost)", "[rules]") {
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms)}, 3, 7));                     // one member left of three
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms), said("b", 8, 0ms)}, 4, 7));  // two of four is no majority
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms), said("b", 8, 0ms)}, 5, 7));
  CHECK_FALSE(leaderless_quorum({}, 0, 7));
}

TEST_CASE("lease rule: the same member twice counts once, a member with a leader not at all", "[rules]") {
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms), said("a", 8, 5ms)}, 3, 7));
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms), said("b", 8, 0ms, false)}, 3, 7));
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms), said("", 8, 0ms)}, 3, 7));
}

// A member behind the term the lease was last renewed in has not seen the leader that renewed it:
// what it says about leaders is out of date.
TEST_CASE("lease rule: members behind the term the lease was renewed in do not count", "[rules]") {
  CHECK_FALSE(leaderless_quorum({said("a", 6, 0ms), said("b", 6, 0ms), said("c", 6, 0ms)}, 3, 7));
  CHECK_FALSE(leaderless_quorum({said("a", 8, 0ms), said("b", 6, 0ms)}, 3, 7));
  CHECK(leaderless_quorum({said("a", 7, 0ms), said("b", 6, 0ms), said("c", 9, 0ms)}, 3, 7));
  CHECK(leaderless_quorum({said("a", 7, 0ms), said("b", 7, 0ms)}, 3, 7));  // the leader stepped down (check-quorum)
}
