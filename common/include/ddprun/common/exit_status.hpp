#pragma once
// How a worker ended, and the exit code that ends ddprun for it (srun's convention: the
// worker's own code, or 128 + signal number when a signal killed it).

#include <string>
#include <vector>

namespace ddprun {

struct ExitStatus {
  int code = 0;    // exit code when the process exited
  int signal = 0;  // signal number when a signal killed it (then code is unused)

  // From a waitpid() status.
  static ExitStatus from_wait_status(int status);

  bool success() const { return signal == 0 && code == 0; }
  // The exit code for a shell: code, or 128 + signal.
  int shell_code() const { return signal ? 128 + signal : code; }
  // "exit code 3" or "signal SIGSEGV (11)".
  std::string describe() const;
};

// "SIGTERM" for 15; "signal 77" for numbers without a name.
std::string signal_name(int signal);
// Parses "SIGUSR1", "USR1" or "10"; returns 0 when unknown.
int parse_signal(const std::string& name);

// The signals a supervisor handles as a request to stop (or forwards): those whose default
// action ends a process and that come from outside it (README: Signals).
std::vector<int> stop_signals();

}  // namespace ddprun
