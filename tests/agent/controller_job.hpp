#pragma once
// A JobController driven in-process (controller and heartbeat tests): a fake process runner
// (nothing is started), a fake rendezvous (the test plays the other nodes), the real WorkerGroup
// on a real loop, a run directory of its own.
#include <fcntl.h>
#include <sys/stat.h>

#include <boost/asio.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "observe/event_log.hpp"
#include "fakes.hpp"
#include "control/job_controller.hpp"
#include "containment/run_dir.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent::testing {

using namespace std::chrono_literals;
using Kind = RoundEnd::Kind;

inline std::string temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "ddprun-ctl-XXXXXX").string();
  REQUIRE(::mkdtemp(t.data()) != nullptr);
  return t;
}

inline AgentOptions options(int nproc, int max_restarts) {
  AgentOptions o;
  o.command = {"/bin/true"};
  o.nproc_per_node = nproc;
  o.max_restarts = max_restarts;
  o.rdzv.run_id = "ctl";
  o.stop_timeout = 1s;
  return o;
}

struct Job {
  std::string root = temp_dir();
  AgentOptions opt;
  boost::asio::io_context io;
  FakeRunner runner;
  FakeRendezvous rdzv;
  EventLog events;
  std::unique_ptr<RunDir> dir;
  std::unique_ptr<WorkerGroup> group;
  std::unique_ptr<JobController> ctl;

  explicit Job(AgentOptions o, Rendezvous* r = nullptr, FenceState* fence = nullptr,
               const std::function<void(WorkerGroup::Options&)>& tweak = {})
      : opt(std::move(o)) {
    opt.log_dir = root;
    dir = std::make_unique<RunDir>(opt);
    WorkerGroup::Options wo = WorkerGroup::Options::from(opt);
    if (tweak) tweak(wo);
    group = std::make_unique<WorkerGroup>(io, runner, wo);
    ctl = std::make_unique<JobController>(opt, *group, r ? *r : rdzv, events, *dir, "node-a", fence);
  }
  ~Job() { std::filesystem::remove_all(root); }

  // Round `round` is ready with this node alone (or `world` nodes, this one first).
  void ready(int round, int rc, int world = 1, const ddprun::rounds::Streak& streak = {}) {
    RoundInfo info;
    info.round = round;
    info.restart_count = rc;
    info.streak = streak;
    info.group_world = world;
    info.world_size = world * opt.nproc_per_node;
    info.store_host = "127.0.0.1";
    info.store_port = 4242;
    ctl->on_round_ready(info);
  }
  // Local rank `local_rank` touches its heartbeat file, with an mtime of its own (every beat
  // differs, however close together).
  void beat(int local_rank) {
    static long n = 0;
    std::string file = group->workers().at(static_cast<std::size_t>(local_rank)).spec.heartbeat_file;
    timespec times[2] = {{0, UTIME_OMIT}, {1'000'000'000L + ++n, 0}};
    REQUIRE(::utimensat(AT_FDCWD, file.c_str(), times, 0) == 0);
  }
  // The pids of the current group, by local rank.
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& w : group->workers()) out.push_back(w.pid);
    return out;
  }
  void reap() {
    group->reap();
    io.poll();
  }
  // Runs the loop (results of the stack readers' threads arrive there) until `done`, at most 5 s.
  template <typename F>
  void run_until(F done) {
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_one_for(50ms);
      io.restart();
    }
  }
  void over(int round, std::optional<RoundEnd> end, std::string error = "") {
    ctl->on_round_over(RoundOutcome{round, std::move(end), {RendezvousFailure::Kind::unreachable, std::move(error), 0}});
  }
  // A failure record as another node writes it.
  static ddprun::agent::FailureRecord failure_on(const std::string& host, int rank, int code, bool hang = false) {
    ddprun::agent::FailureRecord f;
    f.rank = rank;
    f.host = host;
    f.exit_code = code;
    f.hang = hang;
    return f;
  }
  // The first end this node wrote for `round` (what the fake store's first writer would keep).
  RoundEnd written(int round) const {
    for (const auto& e : rdzv.ends) {
      if (e.round == round) return e.why;
    }
    FAIL("no end written for round " << round);
    return {};
  }
};


}  // namespace ddprun::agent::testing
