#pragma once
// No process outlives its job. A worker may start processes that leave its process group and
// session (`setsid sleep 120 &`, a daemonising data server); killing process groups misses them.
// Two modes, the first that works (README: Security):
//   cgroup     the workers join a cgroup v2 of the agent's own, created below the agent's cgroup
//              where this user may write (the hierarchy is delegated, or root): every process they
//              start stays in it, whatever it does, and `cgroup.kill` ends them all at once.
//   subreaper  else the agent is a child subreaper (PR_SET_CHILD_SUBREAPER): orphans of the
//              workers become its children, and it kills every descendant left at a group's end.
//              Every worker carries DDPRUN_JOB_TOKEN in its environment; after `kill -9` of the
//              agent, the guardian kills the processes that carry it (one that clears its
//              environment and is orphaned then escapes; while the agent lives, none does).

#include <sys/types.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ddprun/agent/spawn.hpp"

namespace ddprun::agent {

enum class ContainmentMode { cgroup, subreaper };

class Containment {
 public:
  // Plans the job's containment: a fresh token identifies this agent's workers, and the cgroup it
  // will make (where this user may) is named after it. Nothing is made yet: the guardian learns
  // the names first (guardian_args), so that a kill -9 at any moment leaves nothing.
  static std::unique_ptr<Containment> plan();
  // Makes what plan() named: the cgroup, else subreaper mode. Call while the process has one
  // thread.
  void establish();
  // plan(), then establish().
  static std::unique_ptr<Containment> set_up();
  ~Containment();
  Containment(const Containment&) = delete;
  Containment& operator=(const Containment&) = delete;

  // "cgroup /sys/fs/cgroup/…/ddprun-123" or "subreaper (no writable cgroup v2: why)".
  std::string describe() const;
  // The token (DDPRUN_JOB_TOKEN) every worker carries.
  const std::string& token() const { return token_; }
  // cgroup mode: where a worker starts (the cgroup's directory, for clone3's CLONE_INTO_CGROUP,
  // and its cgroup.procs, for a child that joins by itself before exec); nullptr in subreaper mode.
  const CgroupTarget* cgroup_target() const { return mode_ == ContainmentMode::cgroup ? &target_ : nullptr; }

  // Kills every process of the job still alive (none of them a worker of a running group:
  // called when all have ended), except `guardian` (a child of the agent) and `exempt`: the
  // agent's own processes that live beside the workers (warm spares, stack readers), with what
  // they started. Returns what it killed, "PID (name)" each.
  std::vector<std::string> sweep(pid_t guardian, const std::set<pid_t>& exempt) const;

  // For the guardian (a single-threaded process): kills every process of the job, by the cgroup
  // or by the token; when the agent is gone, also removes the cgroup.
  void kill_everything(bool agent_gone) const;

  // What the guardian is started with: the token, the planned cgroup ("" if none) and the
  // agent's pid; and the guardian's copy made of them. The copy acts (kill_everything) on the
  // cgroup if it exists and on the token in any case, and, destroyed, leaves all alone: the
  // agent's Containment removes the cgroup at a clean end.
  std::vector<std::string> guardian_args() const;
  static std::unique_ptr<Containment> for_guardian(const std::string& token, const std::string& cgroup, pid_t owner);

 private:
  Containment() = default;
  bool try_cgroup(std::string& why);
  void kill_by_token() const;
  // final: no worker starts in the cgroup afterwards (cgroup.kill may be used).
  // `spared`: processes left alone (not at the end: `final` spares nothing).
  std::vector<std::string> sweep_cgroup(bool final, const std::set<pid_t>& spared = {}) const;
  std::vector<std::string> sweep_descendants(pid_t guardian, const std::set<pid_t>& exempt) const;
  void remove_cgroup() const;

  ContainmentMode mode_ = ContainmentMode::subreaper;
  std::string token_;
  std::string cgroup_;   // the cgroup's directory (cgroup mode)
  std::string why_not_;  // why not cgroup mode
  CgroupTarget target_;  // the cgroup's directory and cgroup.procs
  int kill_fd_ = -1;     // cgroup.kill (kernel 5.14+; only at the end), else -1: each process is killed
  pid_t owner_ = -1;     // the agent
  bool restored_ = false;  // a guardian's copy: nothing to undo at its end
  std::string planned_;    // plan(): the cgroup to make, or "" (why_not_ says why)
};

// The cgroup v2 directory of this process: the unified hierarchy's mount point (from mountinfo,
// a mount of its root: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid machine) joined
// with the path in /proc/self/cgroup ("0::PATH"). "" and `why` when there is none.
std::string own_cgroup_dir(std::string& why);

// The DDPRUN_JOB_TOKEN value for the workers: the inherited list (a ddprun inside a worker of
// another) with this job's token appended.
std::string job_token_list(const std::string& inherited, const std::string& token);

}  // namespace ddprun::agent
