#pragma once
// The guardian: a small process of its own (the running program started again with a flag,
// guardian_main.hpp), started before the job makes anything. It kills the workers' process
// groups and everything else the job runs (containment.hpp) when the agent dies without saying
// goodbye (SIGKILL, a crash, an OOM kill: the pipe's end of file, which the kernel delivers
// however the agent dies), and when this node's liveness lapses (self-fencing): the agent tells
// it, at every renewal, until when the other nodes cannot count this node lost; if that time
// passes first, because the agent is stopped or cut off, the guardian kills the groups itself.
// It runs on while the agent is SIGSTOPped, which is the point. When the agent is gone it also
// removes the job's cgroup and temporary directory, whose names it learns before they exist.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ddprun/rounds/rendezvous.hpp"
#include "containment/fence_state.hpp"

namespace ddprun::agent {

class Containment;

class Guardian {
 public:
  // Starts the guardian process (posix_spawn: clone(CLONE_VM|CLONE_VFORK) and exec) for the job
  // `containment` plans (its token and cgroup), before it makes them. `program`: what to run
  // ("": /proc/self/exe). Without a guardian (no pipe, or the start failed) the workers still
  // get their parent-death signal; that is said once.
  explicit Guardian(const Containment* containment = nullptr, const std::string& program = "");
  // Tells the guardian to exit without killing anything (clean end); later messages go nowhere.
  void release();
  // release(), then waits for the guardian's exit.
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void watch(const std::vector<pid_t>& pgids);  // worker groups started (one write for all)
  void forget(pid_t pgid);                      // a worker group is gone
  // The agent's temporary directory, told before it is made: removed by the guardian when the
  // agent dies without saying goodbye (a kill -9 left it in /dev/shm).
  void own_directory(const std::string& path);
  // Kill the watched groups if `deadline` (steady clock) passes before the next arm or disarm.
  // `now`: when the caller decided (a message read late counts then).
  void arm(std::chrono::steady_clock::time_point deadline,
           std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  void disarm(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  // The pipe's write end (close-on-exec), -1 without a guardian.
  int fd() const { return fd_; }
  pid_t pid() const { return pid_; }

 private:
  void send(char op, pid_t pgid, std::int64_t when = 0, std::int64_t sent = 0);
  void write_all(const void* data, std::size_t size);
  static void write_locked(int fd, const void* data, std::size_t size);  // with write_mu_ held
  std::atomic<int> fd_{-1};
  std::mutex write_mu_;  // writes and release()
  pid_t pid_ = -1;
};

// The rendezvous' Fence, kept by the guardian; the controller asks it whether workers it sees
// SIGKILLed were fenced. Thread-safe: renewals come from the rendezvous' threads.
class GuardianFence : public rounds::Fence, public FenceState {
 public:
  explicit GuardianFence(Guardian& g) : guardian_(g) {}
  void renewed_until(std::chrono::steady_clock::time_point deadline) override;
  void release() override;
  bool lapsed() override;
  void reset() override;
  double silent_s() override;

 private:
  // A deadline passed before this renewal or release: the guardian killed the groups (it acts
  // on the same rule, on the same clock, by the time it reads the message).
  void note_lapse(std::chrono::steady_clock::time_point now);

  Guardian& guardian_;
  std::mutex mu_;
  bool armed_ = false;
  bool lapsed_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::steady_clock::time_point renewed_at_{};  // the last renewal (epoch: none yet)
};

}  // namespace ddprun::agent
