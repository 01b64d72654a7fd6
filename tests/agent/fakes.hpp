#pragma once
// Test doubles for the agent's seams: a process runner that starts nothing, and a rendezvous
// that records what the controller asks and lets the test decide what happens.

#include <csignal>
#include <filesystem>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ddprun/common/error.hpp"
#include "workers/process_runner.hpp"
#include "ddprun/rounds/rendezvous.hpp"
#include "control/job_controller.hpp"

namespace ddprun::agent::testing {

class FakeRunner : public ProcessRunner {
 public:
  struct Process {
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
    std::optional<CpuBinding> binding;
    std::size_t env_entries = 0;  // as given ("K=V" entries): more than env.size() means a key twice
  };
  std::map<pid_t, Process> started;
  std::vector<std::pair<pid_t, int>> signals;  // (process group, signal), in order
  std::vector<std::pair<pid_t, int>> process_signals;  // (process, signal), in order
  // Where each worker's stack is read; by default its own pid, as Python when argv[0] is python.
  std::map<pid_t, StackTargets> targets;
  std::vector<pid_t> stacks_of;  // the processes whose native stack was read
  int fail_start_at = -1;                      // the n-th start throws
  pid_t next_pid = 1000;

  Started start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                const CpuBinding* binding, int /*state_fd*/) override {
    if (static_cast<int>(started.size()) == fail_start_at) throw Error("fork failed: Resource temporarily unavailable");
    Process p{argv, {}, binding ? std::optional<CpuBinding>(*binding) : std::nullopt};
    for (const auto& kv : env) p.env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    p.env_entries = env.size();
    pid_t pid = next_pid++;
    started[pid] = p;
    return Started{pid, -1, -1};
  }
  void signal_group(pid_t pgid, int sig) override { signals.emplace_back(pgid, sig); }
  std::vector<Ended> reap() override { return std::exchange(ended_, {}); }
  void forget(pid_t) override {}
  // A hung native worker's stack as eu-stack prints it.
  std::string native_stack(pid_t pid, std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lk(mu_);
    stacks_of.push_back(pid);
    ++stacks_read;  // after: a test that waits for the count reads a complete list
    return "PID " + std::to_string(pid) + " - process\nTID " + std::to_string(pid) +
           ":\n#0  0x00007f0000000001 __GI___clock_nanosleep - /usr/lib/x86_64-linux-gnu/libc.so.6\n"
           "#1  0x0000550000000002 wait_for_peer - /opt/train\n    /src/comm.cpp:42\n"
           "#2  0x0000550000000003 all_reduce - /opt/train\n    /src/comm.cpp:80\n"
           "#3  0x0000550000000004 main - /opt/train\n    /src/train.cpp:12\n";
  }
  std::atomic<int> stacks_read{0};
  std::vector<StackTargets> stack_targets(const std::vector<pid_t>& workers) override {
    std::vector<StackTargets> out;
    for (pid_t w : workers) {
      if (targets.count(w)) {
        out.push_back(targets[w]);
      } else if (is_python_executable(started[w].argv.at(0))) {
        out.push_back(StackTargets{{w}, -1});
      } else {
        out.push_back(StackTargets{{}, w});
      }
    }
    return out;
  }
  void signal_process(pid_t pid, int sig) override { process_signals.emplace_back(pid, sig); }

  // What the kernel would report: the process exited with `code` / was killed by `sig`.
  void exit(pid_t pid, int code) { ended_.push_back({pid, ExitStatus{code, 0}}); }
  void kill(pid_t pid, int sig) { ended_.push_back({pid, ExitStatus{0, sig}}); }
  // The signals sent to `pid`, in order.
  std::vector<int> signals_to(pid_t pid) const {
    std::vector<int> out;
    for (auto [p, s] : signals) {
      if (p == pid) out.push_back(s);
    }
    return out;
  }

 private:
  std::vector<Ended> ended_;
  std::mutex mu_;
};

class FakeRendezvous : public Rendezvous {
 public:
  struct Ended {
    int round;
    RoundEnd why;
    int expect_next;
  };
  Listener* listener = nullptr;
  std::vector<std::pair<int, int>> joins;  // (round, restart count)
  std::vector<ddprun::rounds::Streak> streaks;  // the streak each join brought
  std::vector<Ended> ends;
  std::vector<int> successes;
  std::vector<std::pair<int, Ack>> finishes;  // (round, acknowledge)
  std::vector<std::pair<int, int>> leaves;     // (round, signal)
  std::vector<ddprun::rounds::StateOffer> offers;

  void set_listener(Listener& l) override { listener = &l; }
  std::string describe() const override { return ""; }
  void join(int round, int rc, const ddprun::rounds::Streak& s, const ddprun::rounds::StateOffer& offer) override {
    joins.emplace_back(round, rc);
    streaks.push_back(s);
    offers.push_back(offer);
  }
  void end_round(int round, const RoundEnd& why, int expect_next) override { ends.push_back({round, why, expect_next}); }
  void report_success(int round) override { successes.push_back(round); }
  void finish(int round, Ack ack) override { finishes.emplace_back(round, ack); }
  void leave(int round, int sig) override { leaves.emplace_back(round, sig); }
  void shutdown() override {}
  std::vector<ddprun::rounds::HostedStore> hosted_stores() const override { return {}; }
};

// A fence whose lapse the test decides.
struct FakeFence : FenceState {
  bool lapse = false;
  bool lapsed() override { return lapse; }
  void reset() override { lapse = false; }
  double silent = 0;
  double silent_s() override { return silent; }
};

}  // namespace ddprun::agent::testing
