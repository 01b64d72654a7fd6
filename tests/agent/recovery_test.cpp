// Recoveries timed by phase: the clock's phases, the console line, the histogram's text.

#include <catch2/catch.hpp>

#include "control/recovery_clock.hpp"
#include "metrics/metric_text.hpp"
#include "observe/event_log.hpp"

using namespace ddprun::agent;
using namespace std::chrono_literals;

TEST_CASE("a recovery is timed phase by phase, from the fault to every worker's first beat", "[recovery]") {
  EventLog events;  // not opened: nothing written
  RecoveryClock clock(events);
  auto t = RecoveryClock::Clock::now();
  clock.fault(0.001, "rank 1: exit code 3", t);
  clock.stopped(t + 12ms);
  clock.joining(t + 13ms);
  clock.round_ready(t + 16ms);
  clock.started(1, 2, 0, t + 17ms);
  CHECK(clock.timing());
  REQUIRE(clock.ready(t + 207ms));
  REQUIRE(clock.completed().size() == 1);
  const auto& r = clock.completed()[0];
  CHECK(r.detect == Approx(0.001));
  CHECK(r.stop == Approx(0.013));
  CHECK(r.rendezvous == Approx(0.003));
  CHECK(r.spawn == Approx(0.001));
  CHECK(r.ready == Approx(0.190));
  CHECK(r.total() == Approx(0.208));
  CHECK(describe_recovery(r) ==
        "restarted in 0.21 s: detect 1 ms, stop 13 ms, rendezvous 3 ms, hand-over 1 ms (2 warm), ready 190 ms");
  CHECK_FALSE(clock.ready(t + 300ms));  // shown once
}

TEST_CASE("an attempt that ends before its first beats is shown without 'ready', and the job's end forgets a fault",
          "[recovery]") {
  EventLog events;
  RecoveryClock clock(events);
  auto t = RecoveryClock::Clock::now();
  clock.fault(0, "rank 0: exit code 1", t);
  clock.stopped(t);
  clock.joining(t);
  clock.round_ready(t);
  clock.started(1, 0, 2, t + 5ms);
  clock.abandoned();
  REQUIRE(clock.completed().size() == 1);
  CHECK(clock.completed()[0].ready < 0);
  CHECK(describe_recovery(clock.completed()[0]).find("spawn 5 ms, ready: no heartbeat") != std::string::npos);
  clock.fault(0, "rank 0: exit code 1", t);
  clock.stopped(t);
  clock.cancel();
  clock.joining(t);
  CHECK_FALSE(clock.timing());
  CHECK(clock.completed().size() == 1);
}

TEST_CASE("the recovery histogram is written as Prometheus reads it", "[recovery]") {
  MetricText m;
  m.declare_histogram("ddprun_recovery_seconds", "restarts", {0.1, 1});
  m.observe("ddprun_recovery_seconds", {{"phase", "total"}}, 0.05);
  m.observe("ddprun_recovery_seconds", {{"phase", "total"}}, 0.5);
  auto text = m.text();
  CHECK(text.find("# TYPE ddprun_recovery_seconds histogram\n") != std::string::npos);
  CHECK(text.find("ddprun_recovery_seconds_bucket{phase=\"total\",le=\"0.1\"} 1\n") != std::string::npos);
  CHECK(text.find("ddprun_recovery_seconds_bucket{phase=\"total\",le=\"1\"} 2\n") != std::string::npos);
  CHECK(text.find("ddprun_recovery_seconds_bucket{phase=\"total\",le=\"+Inf\"} 2\n") != std::string::npos);
  CHECK(text.find("ddprun_recovery_seconds_sum{phase=\"total\"} 0.55\n") != std::string::npos);
  CHECK(text.find("ddprun_recovery_seconds_count{phase=\"total\"} 2\n") != std::string::npos);
}

TEST_CASE("detection is timed from the fault's last sign of life, the writer's own measure its floor", "[recovery]") {
  using Wall = std::chrono::system_clock;
  const Wall::time_point now{std::chrono::seconds(1'800'000'000)};
  CHECK(seconds_since_wall(now - 2500ms, 0.6, now) == Approx(2.5));  // a lost node: its last keep-alive
  CHECK(seconds_since_wall(Wall::time_point{}, 0.6, now) == Approx(0.6));  // no date: the watcher's silence
  CHECK(seconds_since_wall(now + 60s, 0.6, now) == Approx(0.6));       // a writer's clock ahead
  CHECK(seconds_since_wall(now - 200ms, 0.6, now) == Approx(0.6));     // behind: never under its own measure
  CHECK(seconds_since_wall(now - 2h, 0, now) == 0);                    // over an hour: a wrong clock
  CHECK(seconds_since_wall(now - 1s, -1, now) == Approx(1.0));
  // The silence is part of the recovery: the line, the event and the histogram's detect phase.
  EventLog events;
  RecoveryClock clock(events);
  auto t = RecoveryClock::Clock::now();
  clock.fault(seconds_since_wall(now - 2100ms, 2.0, now), "node n2 lost", t);
  clock.stopped(t + 10ms);
  clock.joining(t + 10ms);
  clock.round_ready(t + 20ms);
  clock.started(0, 2, 0, t + 22ms);
  REQUIRE(clock.ready(t + 100ms));
  const auto& r = clock.completed().back();
  CHECK(phase_seconds(r, "detect") == Approx(2.1));
  CHECK(r.total() == Approx(2.2));
  CHECK(describe_recovery(r) ==
        "restarted in 2.20 s: detect 2100 ms, stop 10 ms, rendezvous 10 ms, hand-over 2 ms (2 warm), ready 78 ms");
}
