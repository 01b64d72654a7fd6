// Bounded fan-out: how many workers the process's limits allow, decided before anything starts.
#include <catch2/catch.hpp>

#include "workers/fan_out.hpp"

using ddprun::agent::descriptors_needed;
using ddprun::agent::fan_out_refusal;
using ddprun::agent::FanOutLimits;

TEST_CASE("fan-out: descriptors are counted as the store reserves them, plus a connection a worker") {
  CHECK(descriptors_needed(1) == 73);
  CHECK(descriptors_needed(1000) == 9064);
  CHECK(descriptors_needed(100000) == 900064);
}

TEST_CASE("fan-out: within the limits, nothing to say") {
  CHECK_FALSE(fan_out_refusal(8, FanOutLimits{1024, 0}));
  CHECK_FALSE(fan_out_refusal(106, FanOutLimits{1024, 0}));  // 64 + 9 * 106 = 1018
  CHECK_FALSE(fan_out_refusal(1000, FanOutLimits{9064, 1002}));
}

TEST_CASE("fan-out: too many workers for RLIMIT_NOFILE is refused, naming the limit and the fix") {
  auto why = fan_out_refusal(100000, FanOutLimits{4000, 0});
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("--nproc_per_node=100000 needs 900064 open files"));
  CHECK_THAT(*why, Catch::Contains("RLIMIT_NOFILE (ulimit -n) is 4000"));
  CHECK_THAT(*why, Catch::Contains("ulimit -n 900064"));
  CHECK(fan_out_refusal(107, FanOutLimits{1024, 0}));
}

TEST_CASE("fan-out: too many workers for RLIMIT_NPROC is refused, 0 means not enforced") {
  auto why = fan_out_refusal(1000, FanOutLimits{1 << 20, 500});
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("needs 1002 processes"));
  CHECK_THAT(*why, Catch::Contains("RLIMIT_NPROC (ulimit -u), which counts threads, is 500"));
  CHECK(fan_out_refusal(999, FanOutLimits{1 << 20, 1000}));  // the agent and its guardian count
  CHECK_FALSE(fan_out_refusal(998, FanOutLimits{1 << 20, 1000}));
  CHECK_FALSE(fan_out_refusal(100000, FanOutLimits{~0ULL, 0}));
}

// Issue 33: RLIMIT_NPROC counts threads. 4 workers passed a limit of 8, then a clone failed.
TEST_CASE("fan-out: the agent's threads count against RLIMIT_NPROC - spawn, metrics, rendezvous") {
  using ddprun::agent::agent_tasks;
  const auto base = agent_tasks(4, false, false);
  CHECK(base >= 5);  // main thread, guardian, the workers' store, two console writers
  CHECK(agent_tasks(4, true, false) == base + 1);
  CHECK(agent_tasks(4, true, true) == base + 5);
  auto why = fan_out_refusal(4, FanOutLimits{1024, 8}, agent_tasks(4, true, false));
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("needs " + std::to_string(4 + base + 1) + " processes and threads"));
  CHECK_FALSE(fan_out_refusal(4, FanOutLimits{1024, 4 + base + 1}, agent_tasks(4, true, false)));
}
