// Heartbeats through the JobController and the real WorkerGroup, on the test's own clock:
// --worker_timeout counts from a worker's first beat; before it, --worker_start_timeout bounds
// the start-up (imports, model loading, NCCL set-up), so a slow start is not a hang.
#include "controller_job.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "workers/heartbeat.hpp"
#include "workers/worker_group_impl.hpp"

using namespace ddprun::agent;
using namespace ddprun::agent::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

AgentOptions watched(int nproc, std::chrono::milliseconds timeout, std::chrono::milliseconds start_timeout) {
  auto o = options(nproc, 0);
  o.worker_timeout_auto = false;
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
  j.run_until([&] { return j.rdzv.ends.size() == 1; });  // after the report (every stack read)
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
  j.run_until([&] { return j.rdzv.ends.size() == 1; });  // after the report (every stack read)
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
  o.worker_timeout_auto = false;
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
  j.run_until([&] { return j.rdzv.ends.size() == 2; });  // after the report (every stack read)
  REQUIRE(j.rdzv.ends.size() == 2);
  auto hang = j.rdzv.ends.back().why;
  CHECK(hang.failure->exit_code == 124);
  CHECK(hang.failure->hang);
  CHECK_THAT(hang.failure->reason, Catch::Contains("no heartbeat for"));
  // Every worker's stack was read for the report (the fake runner answers as eu-stack would),
  // before the failure; then SIGTERM, with no second reading.
  CHECK(j.runner.stacks_read == 2);
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

namespace {

AgentOptions automatic(int nproc) {
  auto o = options(nproc, 0);
  o.worker_timeout_auto = true;
  o.worker_start_timeout = 0s;
  o.hang_floor = 30s;
  o.hang_stop = 120s;
  return o;
}

// A step as the progress hook writes it: the count, which also sets the mtime.
void step(Job& j, int local_rank, int count) {
  std::string file = j.group->workers().at(static_cast<std::size_t>(local_rank)).spec.heartbeat_file;
  std::ofstream(file) << count << "\n";
  j.beat(local_rank);  // a distinct mtime, whatever the file system's tick
}

}  // namespace

TEST_CASE("heartbeats, auto: no bound before the first optimizer step, however long it takes", "[heartbeat][hang]") {
  Job j(automatic(2));
  j.ctl->start();
  j.ready(0, 0);
  auto t0 = Clock::now();
  step(j, 0, 0);  // the hook attached ("0"), then forward passes before the first step
  step(j, 1, 0);
  j.beat(0);
  j.beat(1);
  j.group->check_heartbeats(t0 + 1s);
  j.group->check_heartbeats(t0 + 24h);
  CHECK(j.rdzv.ends.empty());
  CHECK(j.ctl->hangs_reported() == 0);
}

TEST_CASE("heartbeats, auto: silent past the floor is reported first, stopped --hang_stop later", "[heartbeat][hang]") {
  Job j(automatic(2));
  j.ctl->start();
  j.ready(0, 0);
  auto t0 = Clock::now();
  for (int i = 1; i <= 3; ++i) {
    step(j, 0, i);
    step(j, 1, i);
    j.group->check_heartbeats(t0 + i * 100ms);
  }
  j.group->check_heartbeats(t0 + 29s);  // the floor is 30 s: quiet, not hung
  CHECK(j.ctl->hangs_reported() == 0);
  j.group->check_heartbeats(t0 + 31s);
  j.run_until([&] { return j.ctl->hangs_reported() == 1; });
  CHECK(j.ctl->hangs_reported() == 1);
  CHECK(j.rdzv.ends.empty());  // reported, not stopped: the workers still run
  CHECK(j.runner.signals.empty());
  j.group->check_heartbeats(t0 + 31s + 119s);
  CHECK(j.rdzv.ends.empty());
  j.group->check_heartbeats(t0 + 31s + 121s);
  j.run_until([&] { return j.rdzv.ends.size() == 1; });  // after the report (every stack read)
  REQUIRE(j.rdzv.ends.size() == 1);
  CHECK(j.rdzv.ends.back().why.failure->exit_code == 124);
  CHECK_THAT(j.rdzv.ends.back().why.failure->reason, Catch::Contains("--hang_stop=120"));
}

TEST_CASE("heartbeats, auto: the bound scales with the worker's own steps", "[heartbeat][hang]") {
  Job j(automatic(1));
  j.ctl->start();
  j.ready(0, 0);
  auto t0 = Clock::now();
  for (int i = 1; i <= 4; ++i) {  // a step every 20 s: the bound is 5 x 20 s = 100 s
    step(j, 0, i);
    j.group->check_heartbeats(t0 + i * 20s);
  }
  j.group->check_heartbeats(t0 + 80s + 99s);
  CHECK(j.ctl->hangs_reported() == 0);
  j.group->check_heartbeats(t0 + 80s + 101s);
  j.run_until([&] { return j.ctl->hangs_reported() == 1; });
  CHECK(j.ctl->hangs_reported() == 1);
}

TEST_CASE("heartbeats, auto: a forward pass between steps is progress, and progress clears a report",
          "[heartbeat][hang]") {
  Job j(automatic(1));
  j.ctl->start();
  j.ready(0, 0);
  auto t0 = Clock::now();
  step(j, 0, 1);
  j.group->check_heartbeats(t0);
  step(j, 0, 2);
  j.group->check_heartbeats(t0 + 100ms);
  for (int s = 20; s <= 100; s += 20) {  // an evaluation loop: forward passes, no step, for 100 s
    j.beat(0);
    j.group->check_heartbeats(t0 + std::chrono::seconds(s));
  }
  CHECK(j.ctl->hangs_reported() == 0);
  j.group->check_heartbeats(t0 + 100s + 31s);
  j.run_until([&] { return j.ctl->hangs_reported() == 1; });
  REQUIRE(j.ctl->hangs_reported() == 1);
  step(j, 0, 3);  // it was only slow
  j.group->check_heartbeats(t0 + 100s + 40s);
  j.group->check_heartbeats(t0 + 100s + 31s + 200s);
  CHECK(j.rdzv.ends.empty());
}

TEST_CASE("heartbeats: a count in the file is a step, a touch without one is not", "[heartbeat][hang]") {
  Heartbeat hb;
  auto t0 = Clock::now();
  hb.reset({}, t0);
  HangRule rule{true, 0s, 0s, 30s};
  CHECK(hb.bound(rule) == 0s);
  hb.beat(t0 + 500ms, 0);  // the hook attached: no step
  CHECK_FALSE(hb.beaten());
  CHECK(hb.silent(t0 + 800ms) == 800ms);  // before the first step: since the start
  hb.beat(t0 + 1s, 1);
  hb.beat(t0 + 3s, 2);
  hb.beat(t0 + 4s, 2);  // a forward pass
  CHECK(hb.steps() == 2);
  CHECK(hb.longest_step() == 2s);
  CHECK(hb.bound(rule) == 30s);
  hb.beat(t0 + 23s, 12);  // 10 steps between two looks: 2 s each
  CHECK(hb.longest_step() == 2s);
  hb.beat(t0 + 43s, 13);  // one 20 s pause between two steps (a save) does not stretch the bound
  CHECK(hb.bound(rule) == 30s);
  for (int i = 1; i <= 3; ++i) hb.beat(t0 + 43s + i * 20s, 13 + i);  // slow steps do: 5 x 20 s
  INFO("long step " << std::chrono::duration<double>(hb.longest_step()).count() << " steps " << hb.steps());
  CHECK(hb.bound(rule) == 100s);
  hb.beat(t0 + 104s, -1);  // a touch without a count (a program that only touches): a step
  CHECK(hb.steps() == 17);
}

namespace {

// A file written by the worker, with an mtime of its own for each write (look() goes by mtime).
void write_beat(const std::string& path, const std::string& text, int second) {
  std::ofstream(path, std::ios::trunc) << text;
  timespec times[2] = {{second, 0}, {second, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ddprun-heartbeat-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("heartbeats: a garbled count is a touch, and a count that goes back counts on from there", "[heartbeat][hang]") {
  TempDir dir;
  const std::string file = dir.path + "/HEARTBEAT";
  Heartbeat hb;
  auto t0 = Clock::now();
  hb.reset({}, t0);
  write_beat(file, "1\n", 1);
  REQUIRE(hb.look(file, t0 + 1s));
  write_beat(file, "2\n", 2);
  hb.look(file, t0 + 2s);
  CHECK(hb.steps() == 2);
  write_beat(file, "99999999999999999999999\n", 3);  // past long long: garbled, not a jump
  CHECK(hb.look(file, t0 + 3s));
  CHECK(hb.steps() == 3);
  write_beat(file, "x7\n", 4);  // no number at all: a touch too
  hb.look(file, t0 + 4s);
  CHECK(hb.steps() == 4);
  write_beat(file, "900\n", 5);  // a jump ahead (a bad write), then the trainer counts on
  hb.look(file, t0 + 5s);
  CHECK(hb.steps() == 900);
  write_beat(file, "5\n", 6);
  CHECK(hb.look(file, t0 + 6s));  // still a beat: progress
  CHECK(hb.steps() == 5);
  write_beat(file, "6\n", 8);
  hb.look(file, t0 + 8s);
  CHECK(hb.steps() == 6);
  CHECK(hb.longest_step() == 1s);  // no interval across the jump; the step 5 -> 6 took 2 s
  write_beat(file, "0\n", 9);       // "0" (a Reducer made) is no step and moves nothing back
  hb.look(file, t0 + 9s);
  CHECK(hb.steps() == 6);
  write_beat(file, "6 save\n", 10);  // torch.save under way: a beat, no step
  CHECK(hb.look(file, t0 + 10s));
  CHECK((hb.saving() && hb.steps() == 6));
  write_beat(file, "6\n", 11);
  hb.look(file, t0 + 11s);
  CHECK_FALSE(hb.saving());
}

TEST_CASE("heartbeats: HEARTBEAT.pid is believed only for a process below the worker, and never blocks",
          "[heartbeat][hang]") {
  TempDir dir;
  const std::string proc = dir.path + "/proc", hb = dir.path + "/HEARTBEAT";
  // worker 100 -> wrapper 200 -> trainer 300; 400 is elsewhere (its parent is 1).
  for (auto [pid, parent] : {std::pair{100, 1}, {200, 100}, {300, 200}, {400, 1}}) {
    std::filesystem::create_directories(proc + "/" + std::to_string(pid));
    std::ofstream(proc + "/" + std::to_string(pid) + "/stat") << pid << " (a) b) S " << parent << " 0 0\n";
  }
  auto named = [&](const std::string& text) {
    std::filesystem::remove(hb + ".pid");
    std::ofstream(hb + ".pid") << text;
    return training_process(hb, 100, proc);
  };
  CHECK(named("300\n") == 300);
  CHECK(named("100") == 100);
  CHECK(named("400\n") == -1);  // not below the worker
  CHECK(named("1\n") == -1);
  CHECK(named("-300\n") == -1);
  CHECK(named("trainer\n") == -1);
  CHECK(named("99999999999999999999\n") == -1);
  CHECK(named("") == -1);
  std::filesystem::remove(hb + ".pid");
  std::ofstream(dir.path + "/elsewhere") << "300\n";
  std::filesystem::create_symlink(dir.path + "/elsewhere", hb + ".pid");
  CHECK(training_process(hb, 100, proc) == -1);  // a link is not followed
  std::filesystem::remove(hb + ".pid");
  REQUIRE(::mkfifo((hb + ".pid").c_str(), 0600) == 0);
  CHECK(training_process(hb, 100, proc) == -1);  // a FIFO with no writer: not read, not waited on
}

TEST_CASE("heartbeats: a new group's first beats are looked for every 5% of the wait, from 5 ms to a second",
          "[heartbeat]") {
  // A recovery's "ready" is seen at most 5% late; a worker that takes minutes to step (or never
  // does) is looked at once a second, not 200 times (every 5 ms, 256 agents restarting on two
  // cores spent 63 ms of CPU each instead of 11-19).
  CHECK(first_beat_look(0ms) == 5ms);
  CHECK(first_beat_look(100ms) == 5ms);
  CHECK(first_beat_look(1s) == 50ms);
  CHECK(first_beat_look(10s) == 500ms);
  CHECK(first_beat_look(20s) == 1s);
  CHECK(first_beat_look(std::chrono::hours(2)) == 1s);
}
