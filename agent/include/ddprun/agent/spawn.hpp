#pragma once
// Starting a worker: clone(CLONE_VM|CLONE_VFORK) + exec, as posix_spawn does (its cost does not
// grow with the agent's size, as fork's does), with its own process group, a parent-death
// signal, and its stdout/stderr on pipes the agent reads.

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun::agent {

struct CpuBinding;  // agent.hpp

struct SpawnedProcess {
  pid_t pid = -1;  // also its process group id
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// Starts `argv` (argv[0] a path) with exactly `env` ("K=V" strings). The child leads a new
// process group, gets SIGKILL when the agent's thread that spawned it dies, and starts with
// default signal dispositions and an empty signal mask. If exec fails, the child writes why to
// its stderr and exits 127 (so does a CPU binding that cannot be applied). Throws ddprun::Error
// when clone or pipe fail. Returns once the child has exec'd (or exited).
// `binding`: CPUs and preferred NUMA node, applied in the child before exec.
// `cgroup_procs`: a cgroup's cgroup.procs open for writing, which the child joins first; -1: none.
SpawnedProcess spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const CpuBinding* binding = nullptr, int cgroup_procs = -1);

// Finds `program` the way execvp would (a name without '/' is looked up in PATH). Returns the
// path, or an empty string when there is no such executable.
std::string find_executable(const std::string& program, const std::string& path_env);

}  // namespace ddprun::agent
