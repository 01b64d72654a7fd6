#pragma once
// The guardian: a small process forked before anything else, which outlives a SIGKILLed or
// OOM-killed agent just long enough to kill the workers' process groups (grandchildren
// included). The agent tells it each group it starts and stops through a pipe; the pipe's end
// of file, which the kernel delivers however the agent dies, is its signal to act.

#include <sys/types.h>

namespace ddprun::agent {

class Guardian {
 public:
  // Forks the guardian. Call while the process has a single thread.
  Guardian();
  // Tells the guardian to exit without killing anything (clean end).
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  void watch(pid_t pgid);    // a worker group started
  void forget(pid_t pgid);   // a worker group is gone
  // The descriptor children must not inherit (the agent marks it close-on-exec already).
  int fd() const { return fd_; }

 private:
  void send(char op, pid_t pgid);
  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace ddprun::agent
