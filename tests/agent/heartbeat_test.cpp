// Heartbeats through the JobController and the real WorkerGroup, on the test's own clock:
// --worker_timeout counts from a worker's first beat; before it, --worker_start_timeout bounds
// the start-up (imports, model loading, NCCL set-up), so a slow start is not a hang.
#include "controller_job.hpp"

using namespace ddprun::agent;
using namespace ddprun::agent::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

AgentOptions watched(int nproc, std::chrono::milliseconds timeout, std::chrono::milliseconds start_timeout) {
  auto o = options(nproc, 0);
  o.worker_timeout = timeout;
  o.worker_start_timeout = start_timeout;
  return o;
}

}  // namespace

TEST_CASE("heartbeats: before its first beat a worker is bound by --worker_start_timeout, not --worker_timeout",
          "[heartbeat]") {
  Job j(watched(2, 1s, 30s));
  j.ctl->start();
  j.ready(0, 0);
  auto t0 = Clock::now();
  j.group->check_heartbeats(t0 + 10s);  // 10x the time-out, still starting: no hang
  j.group->check_heartbeats(t0 + 29s);
  CHECK(j.rdzv.ends.empty());
  CHECK(j.ctl->phase() == Phase::running);
  j.group->check_heartbeats(t0 + 31s);
  REQUIRE(j.rdzv.ends.size() == 1);
  auto hang = j.rdzv.ends.back().why;
  CHECK(hang.failure->exit_code == 124);
  CHECK(hang.failure->hang);
  CHECK_THAT(hang.failure->reason, Catch::Contains("no first heartbeat within 3"));
  CHECK_THAT(hang.failure->reason, Catch::Contains("--worker_start_timeout=30.0"));
}

TEST_CASE("heartbeats: after its first beat a worker is bound by --worker_timeout", "[heartbeat]") {
  Job j(watched(2, 1s, 30s));
  j.ctl->start();
  j.ready(0, 0);
  auto t0 = Clock::now();
  j.beat(0);
  j.beat(1);
  j.group->check_heartbeats(t0 + 20s);  // both seen beating at t0 + 20 s
  j.beat(0);
  j.group->check_heartbeats(t0 + 20500ms);
  CHECK(j.rdzv.ends.empty());
  j.beat(0);
  j.group->check_heartbeats(t0 + 21500ms);  // rank 1: 1.5 s since its beat
  REQUIRE(j.rdzv.ends.size() == 1);
  auto hang = j.rdzv.ends.back().why;
  CHECK(hang.failure->rank == 1);
  CHECK_THAT(hang.failure->reason, Catch::Contains("no heartbeat for 1.5 s (--worker_timeout=1.0)"));
}

TEST_CASE("heartbeats: --worker_start_timeout=0 leaves the start-up unbounded", "[heartbeat]") {
  Job j(watched(1, 1s, 0s));
  j.ctl->start();
  j.ready(0, 0);
  j.group->check_heartbeats(Clock::now() + 24h);
  CHECK(j.rdzv.ends.empty());
  CHECK(j.ctl->phase() == Phase::running);
}

TEST_CASE("heartbeats: without --worker_timeout nothing is watched, start-up included", "[heartbeat]") {
  Job j(watched(1, 0s, 1s));
  j.ctl->start();
  j.ready(0, 0);
  j.group->check_heartbeats(Clock::now() + 1h);
  CHECK(j.rdzv.ends.empty());
}

TEST_CASE("heartbeats: a beat expiring during a restart is ignored, one in the next attempt is a hang",
          "[heartbeat]") {
  auto o = options(2, 1);
  o.worker_timeout = 1s;
  Job j(o);
  j.ctl->start();
  j.ready(0, 0);
  auto pids = j.pids();
  j.beat(1);
  j.group->check_heartbeats(Clock::now());
  j.runner.exit(pids[0], 3);
  j.reap();
  REQUIRE(j.ctl->phase() == Phase::stopping);
  // Rank 1 ignores SIGTERM and stops beating: it is being stopped, it is no new cause.
  j.group->check_heartbeats(Clock::now() + 10s);
  CHECK(j.rdzv.ends.size() == 1);
  j.runner.kill(pids[1], SIGKILL);
  j.reap();
  j.over(0, j.written(0));
  REQUIRE(j.rdzv.joins.back() == std::pair<int, int>{1, 1});
  j.ready(1, 1);
  pids = j.pids();
  j.beat(0);
  j.beat(1);  // the new attempt's files: its workers started
  j.group->check_heartbeats(Clock::now());
  j.group->check_heartbeats(Clock::now() + 10s);
  REQUIRE(j.rdzv.ends.size() == 2);
  auto hang = j.rdzv.ends.back().why;
  CHECK(hang.failure->exit_code == 124);
  CHECK(hang.failure->hang);
  CHECK_THAT(hang.failure->reason, Catch::Contains("no heartbeat for"));
  // Every worker's stack first (the fake runner answers as eu-stack would), then SIGTERM.
  CHECK(j.runner.signals_to(pids[0]).empty());
  j.run_until([&] { return !j.runner.signals_to(pids[0]).empty(); });
  CHECK(j.runner.stacks_read == 2);
  CHECK(j.runner.signals_to(pids[0]) == std::vector<int>{SIGTERM});
  std::ifstream stack(j.root + "/ctl/attempt_1/1/stack.txt");
  std::string text((std::istreambuf_iterator<char>(stack)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("wait_for_peer"));
  // Killed after its hang was reported: its death is not a second failure.
  j.runner.kill(pids[0], SIGTERM);
  j.runner.kill(pids[1], SIGTERM);
  j.reap();
  j.over(1, hang);
  CHECK(j.ctl->exit_code() == 124);
}
