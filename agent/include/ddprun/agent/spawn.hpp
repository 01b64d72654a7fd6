#pragma once
// Starting a worker: clone(CLONE_VM|CLONE_VFORK) + exec, as posix_spawn does (its cost does not
// grow with the agent's size, as fork's does), with its own process group, a parent-death
// signal, and its stdout/stderr on pipes the agent reads.

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun::agent {

struct CpuBinding;  // agent.hpp

// The descriptor a worker finds its local rank's state area on (DDPRUN_STATE_FD): the same for
// a warm spare, which has it from its start beside its order and ready pipes (3 and 4).
constexpr int kStateFd = 5;

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
// The cgroup a worker starts in: `dir` open (O_DIRECTORY), for clone3's CLONE_INTO_CGROUP;
// `procs`, its cgroup.procs open for writing, which the child writes itself into where clone3
// cannot be used (before Linux 5.7, seccomp profiles that refuse it, other targets than x86-64).
struct CgroupTarget {
  int dir = -1;
  int procs = -1;
};

// `cgroup`: the cgroup the child runs in; nullptr: the agent's.
// `fd3`, `fd4`: descriptors of the agent the child gets as 3 and 4 (a warm spare's order and
// ready pipes); -1: the child has only 0, 1 and 2.
// `state_fd`: a descriptor the child gets as kStateFd (its local rank's state area,
// DDPRUN_STATE_FD); -1: none.
SpawnedProcess spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const CpuBinding* binding = nullptr, const CgroupTarget* cgroup = nullptr, int fd3 = -1,
                             int fd4 = -1, int state_fd = -1);

// Finds `program` the way execvp would (a name without '/' is looked up in PATH). Returns the
// path, or an empty string when there is no such executable.
std::string find_executable(const std::string& program, const std::string& path_env);

}  // namespace ddprun::agent
