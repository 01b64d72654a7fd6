#pragma once
// The processes below a worker, as /proc shows them: what a hung worker's stack is read from.
// A worker is often not the trainer itself but a wrapper (`sh -c`, `bash train.sh`, `env`,
// an srun-style script) that starts Python or a native trainer as its child; argv[0] says
// nothing about that, the process tree and each process's executable do.

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

// Where a worker's stack is read from (README: Hangs).
struct StackTargets {
  // The outermost Python processes at or below the worker (a Python process's own Python
  // children, e.g. DataLoader workers, are not listed): each prints its threads' tracebacks
  // when sent SIGABRT (faulthandler).
  std::vector<pid_t> python;
  // Without Python: the process running the worker's program (the worker itself, or what a
  // wrapper started), read from outside.
  pid_t native = -1;
};

// Whether an executable (a path or a base name) is a Python interpreter: python, python3,
// python3.11, python3.12d, ... (" (deleted)", as /proc/PID/exe shows a replaced file, is ignored).
bool is_python_executable(const std::string& exe);

// Whether an executable only starts another program: a shell, env, nice, numactl, timeout, ...
bool is_wrapper_executable(const std::string& exe);

// The name (comm) of `pid`, "" if it is gone.
std::string process_name(pid_t pid, const std::string& proc_root = "/proc");

// The parent of `pid` from PROC_ROOT/PID/stat; -1 when it is gone or unreadable.
pid_t parent_pid(pid_t pid, const std::string& proc_root = "/proc");

// The pids under `proc_root` (/proc), in no order.
std::vector<pid_t> process_ids(const std::string& proc_root = "/proc");

class ProcessTree {
 public:
  // Every process under `proc_root` (/proc, or a fake tree of PID/stat files and PID/exe links
  // in tests). Processes that vanish while being read are left out. Never throws.
  static ProcessTree read(const std::string& proc_root = "/proc");

  // `root` and every process below it, parents before children; empty when `root` is unknown.
  std::vector<pid_t> subtree(pid_t root) const;
  // The executable of `pid` ("" when unknown).
  std::string exe(pid_t pid) const;
  // What to read for the worker process `root`.
  StackTargets stack_targets(pid_t root) const;

 private:
  struct Entry {
    pid_t parent = 0;
    std::string exe;
    std::vector<pid_t> children;
  };
  std::map<pid_t, Entry> procs_;
};

}  // namespace ddprun::agent
