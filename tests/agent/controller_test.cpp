// The JobController driven in-process: a fake process runner (nothing is started), a fake
// rendezvous (the test plays the other nodes), the real WorkerGroup on a real loop.
#include "controller_job.hpp"

using namespace ddprun::agent;
using namespace ddprun::agent::testing;
using namespace std::chrono_literals;
using Kind = RoundEnd::Kind;

TEST_CASE("controller: a clean run goes rendezvous, running, stopping, draining, done and exits 0", "[controller]") {
  Job j(options(2, 0));
  j.ctl->start();
  CHECK(j.ctl->phase() == Phase::rendezvous);
  REQUIRE(j.rdzv.joins == std::vector<std::pair<int, int>>{{0, -1}});
  j.ready(0, 0);
  CHECK(j.ctl->phase() == Phase::running);
  auto pids = j.pids();
  REQUIRE(pids.size() == 2);
  CHECK(j.runner.started[pids[1]].env["RANK"] == "1");
  CHECK(j.runner.started[pids[1]].env["WORLD_SIZE"] == "2");
  CHECK(j.runner.started[pids[1]].env["MASTER_PORT"] == "4242");
  CHECK(j.runner.started[pids[1]].env["TORCHELASTIC_RESTART_COUNT"] == "0");
  j.runner.exit(pids[0], 0);
  j.reap();
  CHECK(j.ctl->phase() == Phase::running);  // one still runs
  j.runner.exit(pids[1], 0);
  j.reap();
  CHECK(j.ctl->phase() == Phase::stopping);  // waiting for every node's success
  CHECK(j.rdzv.successes == std::vector<int>{0});
  j.over(0, RoundEnd::of_success());
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.rdzv.finishes == std::vector<std::pair<int, Rendezvous::Ack>>{{0, Rendezvous::Ack::yes}});
  j.ctl->on_finished();
  CHECK(j.ctl->phase() == Phase::done);
  CHECK(j.ctl->exit_code() == 0);
  CHECK(j.runner.signals.empty() == false);  // reaped groups are SIGKILLed (grandchildren)
  for (auto [pid, sig] : j.runner.signals) CHECK(sig == SIGKILL);
}

TEST_CASE("controller: a failure ends the round, stops the rest, restarts with the next count, then gives up", "[controller]") {
  Job j(options(2, 1));
  j.ctl->start();
  j.ready(0, 0);
  auto pids = j.pids();
  j.runner.exit(pids[1], 3);
  j.reap();
  CHECK(j.ctl->phase() == Phase::stopping);
  auto end = j.written(0);
  REQUIRE(end.kind == Kind::failure);
  CHECK(end.failure->rank == 1);
  CHECK(end.failure->exit_code == 3);
  CHECK(end.failure->host == "node-a");
  CHECK(j.runner.signals_to(pids[0]) == std::vector<int>{SIGTERM});
  j.over(0, end);
  CHECK(j.ctl->phase() == Phase::stopping);  // rank 0 still runs
  j.runner.kill(pids[0], SIGTERM);
  j.reap();
  CHECK(j.ctl->phase() == Phase::rendezvous);
  REQUIRE(j.rdzv.joins.back() == std::pair<int, int>{1, 1});
  j.ready(1, 1);
  pids = j.pids();
  CHECK(j.runner.started[pids[0]].env["TORCHELASTIC_RESTART_COUNT"] == "1");
  j.runner.exit(pids[0], 7);
  j.runner.exit(pids[1], 0);
  j.reap();
  j.over(1, j.written(1));
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.ctl->exit_code() == 7);  // no restart left: the root cause's code
  CHECK(j.rdzv.finishes.back() == std::pair<int, Rendezvous::Ack>{1, Rendezvous::Ack::yes});
}

TEST_CASE("controller: a failure while stopping is not the root cause", "[controller]") {
  Job j(options(3, 0));
  j.ctl->start();
  j.ready(0, 0);
  auto pids = j.pids();
  j.runner.exit(pids[0], 3);  // the root cause
  j.reap();
  j.runner.exit(pids[1], 9);  // crashes while being stopped
  j.reap();
  CHECK(j.rdzv.ends.size() == 1);
  j.runner.kill(pids[2], SIGKILL);
  j.reap();
  j.over(0, j.written(0));
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.ctl->exit_code() == 3);
}

TEST_CASE("controller: another node's failure stops this node's workers and restarts with it", "[controller]") {
  Job j(options(2, 2));
  j.ctl->start();
  j.ready(0, 0, 2);
  auto pids = j.pids();
  j.over(0, RoundEnd::of_failure(Job::failure_on("node-b", 3, 1)));
  CHECK(j.ctl->phase() == Phase::stopping);
  CHECK(j.runner.signals_to(pids[0]) == std::vector<int>{SIGTERM});
  CHECK(j.rdzv.ends.empty());  // the round already ended: nothing to write
  j.runner.kill(pids[0], SIGTERM);
  j.runner.kill(pids[1], SIGTERM);
  j.reap();
  CHECK(j.rdzv.ends.empty());  // deaths of workers ddprun stopped are consequences
  CHECK(j.rdzv.joins.back() == std::pair<int, int>{1, 1});
  CHECK(j.rdzv.streaks.back() == ddprun::rounds::Streak{}.after(Job::failure_on("node-b", 3, 1)));  // brought along
}

TEST_CASE("controller: the crash-loop verdict follows the round's streak, not this node's own history", "[controller]") {
  auto opt = options(1, 5);
  opt.max_same_failures = 2;
  const auto f = Job::failure_on("node-b", 3, 1);
  const auto once = ddprun::rounds::Streak{}.after(f);
  // This node saw none of the job's failures (it is new), but the round's streak has rank 3's
  // first one: its second ends the job on this node too, as on every member of the round.
  Job j(opt);
  j.ctl->start();
  j.ready(0, 1, 2, once);
  j.over(0, RoundEnd::of_failure(f));
  j.runner.kill(j.pids()[0], SIGTERM);
  j.reap();
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.ctl->exit_code() == ddprun::agent::kCrashLoopExitCode);
  CHECK(j.rdzv.joins.size() == 1);  // no next round
  // And the other way round: a streak of its own that the round does not carry is not a loop.
  Job k(opt);
  k.ctl->start();
  k.ready(0, 0, 2, once);
  k.over(0, RoundEnd::of_failure(Job::failure_on("node-b", 2, 1)));
  k.runner.kill(k.pids()[0], SIGTERM);
  k.reap();
  REQUIRE(k.rdzv.joins.size() == 2);
  k.ready(1, 1, 2);  // the round's first writer brought no streak
  k.over(1, RoundEnd::of_failure(Job::failure_on("node-b", 2, 1)));
  k.runner.kill(k.pids()[0], SIGTERM);
  k.reap();
  CHECK(k.ctl->phase() == Phase::rendezvous);
  CHECK(k.rdzv.streaks.back().same == 1);
}

TEST_CASE("controller: a lost node or a node joining restarts with the same restart count", "[controller]") {
  auto end = GENERATE(RoundEnd::of_node_lost(1, "node-b", 3.0), RoundEnd::of_membership("node-c"));
  Job j(options(1, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  j.over(0, end);
  j.runner.kill(j.pids()[0], SIGTERM);
  j.reap();
  CHECK(j.rdzv.joins.back() == std::pair<int, int>{1, 0});
  CHECK(j.ctl->phase() == Phase::rendezvous);
}

TEST_CASE("controller: a lost rendezvous or a malformed end stops this node and exits 1 without acknowledging", "[controller]") {
  Job j(options(1, 3));
  j.ctl->start();
  j.ready(0, 0, 2);
  j.over(0, std::nullopt, "lost the rendezvous store at h:1 (its node left or crashed)");
  CHECK(j.runner.signals_to(j.pids()[0]) == std::vector<int>{SIGTERM});
  j.runner.kill(j.pids()[0], SIGTERM);
  j.reap();
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.ctl->exit_code() == 1);
  CHECK(j.rdzv.finishes.back() == std::pair<int, Rendezvous::Ack>{0, Rendezvous::Ack::no});
}

TEST_CASE("controller: a signal during the rendezvous tells the others and exits 128+sig", "[controller]") {
  Job j(options(2, 3));
  j.ctl->start();
  j.ctl->on_signal(SIGINT);
  CHECK(j.rdzv.leaves == std::vector<std::pair<int, int>>{{0, SIGINT}});
  CHECK(j.ctl->phase() == Phase::draining);
  SECTION("the others told, done") {
    j.ctl->on_finished();
  }
  SECTION("a second Ctrl-C does not wait for the others") {
    j.ctl->on_signal(SIGINT);
  }
  CHECK(j.ctl->phase() == Phase::done);
  CHECK(j.ctl->exit_code() == 130);
  j.ready(0, 0);  // a round completing late starts nothing
  CHECK(j.runner.started.empty());
}

TEST_CASE("controller: SIGINT while running stops the workers with it, a second one kills them", "[controller]") {
  Job j(options(2, 3));
  j.ctl->start();
  j.ready(0, 0, 2);
  auto pids = j.pids();
  j.ctl->on_signal(SIGINT);
  CHECK(j.ctl->phase() == Phase::stopping);
  auto end = j.written(0);
  CHECK(end.kind == Kind::stopped);
  CHECK(end.signal == SIGINT);
  CHECK(j.runner.signals_to(pids[0]) == std::vector<int>{SIGINT});
  j.ctl->on_signal(SIGINT);
  CHECK(j.runner.signals_to(pids[0]) == std::vector<int>{SIGINT, SIGKILL});
  CHECK(j.runner.signals_to(pids[1]) == std::vector<int>{SIGINT, SIGKILL});
  j.runner.kill(pids[0], SIGKILL);
  j.runner.exit(pids[1], 1);  // a failure while stopping: not a cause
  j.reap();
  j.over(0, end);
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.ctl->exit_code() == 130);
  CHECK(j.rdzv.ends.size() == 1);
}

TEST_CASE("controller: a signal while a failed round ends means no next round", "[controller]") {
  Job j(options(1, 5));
  j.ctl->start();
  j.ready(0, 0);
  j.runner.exit(j.pids()[0], 2);
  j.reap();
  j.ctl->on_signal(SIGTERM);
  j.over(0, j.written(0));
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.rdzv.leaves == std::vector<std::pair<int, int>>{{1, SIGTERM}});
  CHECK(j.rdzv.joins.size() == 1);
  CHECK(j.ctl->exit_code() == 128 + SIGTERM);
}

TEST_CASE("controller: workers that cannot be started end the job with 1", "[controller]") {
  Job j(options(3, 2));
  j.runner.fail_start_at = 1;
  j.ctl->start();
  j.ready(0, 0);
  CHECK(j.ctl->phase() == Phase::draining);
  CHECK(j.ctl->exit_code() == 1);
  CHECK(j.runner.signals_to(1000) == std::vector<int>{SIGKILL});  // the one that started
}

TEST_CASE("controller: a rendezvous that fails ends the job with the code its kind gives", "[controller]") {
  using FK = RendezvousFailure::Kind;
  auto [kind, signal, code] = GENERATE(std::make_tuple(FK::timeout, 0, 1), std::make_tuple(FK::in_use, 0, 1),
                                       std::make_tuple(FK::usage, 0, 2), std::make_tuple(FK::stopped, SIGINT, 130),
                                       std::make_tuple(FK::refused, 0, 1));
  Job j(options(1, 0));
  j.ctl->start();
  j.ctl->on_rendezvous_failed(RendezvousFailure{kind, "rendezvous: it failed", signal});
  CHECK(j.ctl->phase() == Phase::done);
  CHECK(j.ctl->exit_code() == code);
}

TEST_CASE("controller: workers SIGKILLed after this node's liveness lapsed are fenced, not failed", "[controller]") {
  FakeFence fence;
  auto o = options(2, 0);
  Job j(o, nullptr, &fence);
  j.ctl->start();
  j.ready(0, 0, 2);
  auto pids = j.pids();
  fence.lapse = true;
  j.runner.kill(pids[0], SIGKILL);
  j.reap();
  // The round ends "node lost" (this node), expecting every node back; no restart is used.
  auto end = j.written(0);
  CHECK(end.kind == Kind::node_lost);
  CHECK(j.rdzv.ends.back().expect_next == 2);
  CHECK(j.ctl->phase() == Phase::stopping);
  j.runner.kill(pids[1], SIGKILL);
  j.reap();
  j.over(0, RoundEnd::of_node_lost(0, "node-a", 3));
  CHECK(j.rdzv.joins.back() == std::pair<int, int>{1, 0});
  CHECK(fence.lapse);
  j.ready(1, 0, 2);
  CHECK(j.ctl->phase() == Phase::running);
  CHECK_FALSE(fence.lapse);  // reset when the next group starts
}

TEST_CASE("controller: one node through LocalRendezvous restarts on an emptied store", "[controller]") {
  auto o = options(1, 1);
  o.rdzv.store_port = 0;
  boost::asio::io_context loop;
  auto local = ddprun::rounds::make_rendezvous(o.rdzv, [&](std::function<void()> f) { boost::asio::post(loop, std::move(f)); },
                                               nullptr);
  Job j(o, local.get());
  auto run = [&] {
    loop.poll();
    loop.restart();
  };
  j.ctl->start();
  run();
  REQUIRE(j.ctl->phase() == Phase::running);
  j.runner.exit(j.pids()[0], 4);
  j.reap();
  run();  // the end of round 0, then round 1 ready
  REQUIRE(j.ctl->phase() == Phase::running);
  CHECK(j.ctl->round() == 1);
  CHECK(j.runner.started[j.pids()[0]].env["TORCHELASTIC_RESTART_COUNT"] == "1");
  j.runner.exit(j.pids()[0], 0);
  j.reap();
  run();
  run();
  CHECK(j.ctl->phase() == Phase::done);
  CHECK(j.ctl->exit_code() == 0);
}

TEST_CASE("controller: a hang on another node makes this node dump its workers' stacks before stopping them", "[controller]") {
  Job j(options(2, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  auto pids = j.pids();
  j.over(0, RoundEnd::of_failure(Job::failure_on("node-b", 2, 124, true)));
  CHECK(j.runner.signals_to(pids[0]).empty());  // stacks first
  j.run_until([&] { return !j.runner.signals_to(pids[0]).empty(); });
  CHECK(j.runner.stacks_read == 2);
  CHECK(j.runner.signals_to(pids[0]) == std::vector<int>{SIGTERM});
  CHECK(std::filesystem::exists(j.root + "/ctl/attempt_0/0/stack.txt"));
}

TEST_CASE("controller: a restart waits until the failed workers' GPU memory is released - bounded", "[controller]") {
  std::vector<std::vector<pid_t>> asked;
  int held_for = GENERATE(0, 3, 1000);  // probes answering "still held" (1000: never released)
  auto probe = [&](const std::vector<pid_t>& pids) {
    asked.push_back(pids);
    return static_cast<int>(asked.size()) <= held_for ? pids : std::vector<pid_t>{};
  };
  Job j(options(1, 1), nullptr, nullptr, [&](WorkerGroup::Options& o) {
    o.gpu_holders = probe;
    o.gpu_release_timeout = 1s;
  });
  j.ctl->start();
  j.ready(0, 0);
  auto pid = j.pids()[0];
  auto t0 = std::chrono::steady_clock::now();
  j.runner.exit(pid, 1);
  j.reap();
  j.over(0, j.written(0));  // the round's end comes back
  j.run_until([&] { return j.rdzv.joins.size() == 2; });
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(j.rdzv.joins.size() == 2);  // the restart came, after the probes
  CHECK(asked.front() == std::vector<pid_t>{pid});
  if (held_for == 0) CHECK(asked.size() == 1);
  if (held_for == 3) CHECK(asked.size() == 4);
  if (held_for == 1000) CHECK(waited >= 1.0);  // bounded by gpu_release_timeout
  CHECK(waited < 3.0);
}

TEST_CASE("controller: a clean end does not ask about GPU memory", "[controller]") {
  int asked = 0;
  Job j(options(1, 0), nullptr, nullptr, [&](WorkerGroup::Options& o) {
    o.gpu_holders = [&](const std::vector<pid_t>& pids) {
      ++asked;
      return pids;
    };
  });
  j.ctl->start();
  j.ready(0, 0);
  j.runner.exit(j.pids()[0], 0);
  j.reap();
  j.over(0, RoundEnd::of_success());
  j.run_until([&] { return j.ctl->phase() == Phase::draining; });
  CHECK(asked == 0);
  CHECK(j.ctl->phase() == Phase::draining);
}

// ---- recovery: detection counts the fault's silence ---------------------------------------------

namespace {

// Ends the current round's group (every worker killed), starts round `round` with restart count
// `rc`, and ends that group too before its first beats: the recovery is complete (without "ready").
const RecoveryTimes& recovered(Job& j, int round, int rc) {
  auto kill_running = [&](int sig) {
    for (const auto& w : j.group->workers()) {
      if (w.running()) j.runner.kill(w.pid, sig);
    }
    j.reap();
  };
  kill_running(SIGTERM);
  REQUIRE(j.rdzv.joins.back() == std::pair<int, int>{round, rc});
  j.ready(round, rc, 2);
  kill_running(SIGKILL);
  REQUIRE(j.ctl->recoveries().size() == 1);
  return j.ctl->recoveries().back();
}

// A round end as another node writes it, with its wall-clock times `ago` seconds before now.
RoundEnd end_from(const std::string& json_before_since, double ago) {
  const auto since = std::chrono::system_clock::now() -
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(ago));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(since.time_since_epoch()).count();
  return ddprun::rounds::parse_round_end("end", json_before_since + std::to_string(ms) + "}");
}

}  // namespace

TEST_CASE("controller: a lost node's detection counts its silence from its last keep-alive", "[controller][recovery]") {
  Job j(options(2, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  // node-b's watcher found it silent for 0.6 s, 2.5 s ago.
  j.over(0, end_from(R"({"kind":"node_lost","group_rank":1,"host":"node-b","idle_s":0.6,"since_ms":)", 2.5));
  const auto& r = recovered(j, 1, 0);
  CHECK(r.detect >= 2.5);
  CHECK(r.detect < 3.5);
  CHECK(r.cause == "node node-b lost");
}

TEST_CASE("controller: a lost node's detection is never less than the silence its watcher measured", "[controller][recovery]") {
  // No time written (an older writer), or a writer's wall clock a minute ahead of this node's.
  const auto ahead = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch() + 60s).count();
  auto lost = GENERATE_COPY(std::string(R"({"kind":"node_lost","group_rank":1,"host":"node-b","idle_s":3})"),
                            R"({"kind":"node_lost","group_rank":1,"host":"node-b","idle_s":3,"since_ms":)" +
                                std::to_string(ahead) + "}");
  Job j(options(2, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  j.over(0, ddprun::rounds::parse_round_end("end", lost));
  CHECK(recovered(j, 1, 0).detect == Approx(3.0));
}

TEST_CASE("controller: another node's hang is detected from its worker's last heartbeat", "[controller][recovery]") {
  Job j(options(2, 1));
  j.ctl->start();
  j.ready(0, 0, 2);
  // Rank 2 on node-b, silent 4 s when found hung 1 s ago.
  j.over(0, end_from(R"({"kind":"failure","rank":2,"host":"node-b","reason":"no heartbeat for 4.0 s","exit_code":124,)"
                     R"("hang":true,"silent_s":4.0,"time_ms":)", 1.0));
  const pid_t first = j.pids()[0];
  j.run_until([&] { return !j.runner.signals_to(first).empty(); });  // stacks first, then SIGTERM
  const auto& r = recovered(j, 1, 1);
  CHECK(r.detect >= 5.0);
  CHECK(r.detect < 6.0);
}

TEST_CASE("controller: a node asking to join is timed from its request", "[controller][recovery]") {
  Job j(options(2, 0));
  j.ctl->start();
  j.ready(0, 0, 2);
  j.over(0, end_from(R"({"kind":"membership","host":"node-c","since_ms":)", 1.5));
  const auto& r = recovered(j, 1, 0);
  CHECK(r.detect >= 1.5);
  CHECK(r.detect < 2.5);
  CHECK(r.cause == "node node-c joining");
}

TEST_CASE("controller: a hang's detection is the worker's silence, --worker_start_timeout's before its first beat",
          "[controller][recovery]") {
  auto o = options(2, 1);
  o.worker_timeout_auto = false;
  o.worker_timeout = 1s;
  o.worker_start_timeout = 30s;
  Job j(o);
  j.ctl->start();
  j.ready(0, 0, 2);
  // Never beat: hung at start-up. Across nodes the silence is first held against the workers'
  // store's count of saves (a read; none here answers: nobody saves), so a later check reports it.
  const auto later = std::chrono::steady_clock::now() + 31s;
  j.run_until([&] {
    j.group->check_heartbeats(later);
    return j.rdzv.ends.size() == 1;  // after the report (every stack read)
  });
  REQUIRE(j.rdzv.ends.size() == 1);
  CHECK(ddprun::rounds::round_end_json(j.written(0)).find("\"silent_s\":31") != std::string::npos);
  j.over(0, j.written(0));
  const pid_t first = j.pids()[0];
  j.run_until([&] { return !j.runner.signals_to(first).empty(); });  // stacks first, then SIGTERM
  const auto& r = recovered(j, 1, 1);
  CHECK(r.detect >= 31.0);
  CHECK(r.detect < 32.0);
}

TEST_CASE("controller: a fenced node's detection is the time since its last liveness renewal", "[controller][recovery]") {
  FakeFence fence;
  Job j(options(2, 0), nullptr, &fence);
  j.ctl->start();
  j.ready(0, 0, 2);
  fence.lapse = true;
  fence.silent = 2.25;
  j.runner.kill(j.pids()[0], SIGKILL);
  j.reap();
  j.over(0, j.written(0));
  const auto& r = recovered(j, 1, 0);
  CHECK(r.detect == Approx(2.25));
  CHECK(r.cause == "this node was fenced");
}
