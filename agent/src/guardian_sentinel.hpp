#pragma once
// The guardian's first form, the sentinel. A fork of the agent cost a launch of one worker about
// a tenth of its time on two cores: the copy of the page tables, a copy-on-write fault for each
// page the agent wrote afterwards, and the guardian's exit (its copy unmapped), which the agent
// waits for at the end. The sentinel is started with clone(CLONE_VM): it runs in the agent's
// memory, but on a stack and with state of its own (one mapping the agent does not touch once it
// has started), and calls the kernel directly, not the C library (sentinel_main.cpp).
//
// It keeps what a guardian knows (the worker groups, the fence's deadline, the temporary
// directory) and kills the groups itself, at once, when the fence lapses or the agent is gone.
// Anything more (the cgroup's sweep, the scan for the job's token, the directory's removal) is
// the guardian process's: the sentinel becomes it by exec of the running program
// (/proc/self/exe), which the agent library recognises before main (guardian_process.cpp), and
// hands it its state in a memfd. It does the same unasked once it has watched for
// DDPRUN_GUARDIAN_SENTINEL_MS (1 s by default): past a job's first second its guardian is a
// process of its own, out of reach of the agent's memory and of an OOM kill of the agent (the
// OOM killer kills every process that shares the victim's memory).
//
// Where the sentinel cannot work (sentinel_supported()), or with DDPRUN_GUARDIAN_SENTINEL_MS=fork,
// the guardian is a fork of the agent running the guardian process's loop, as before.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::agent {

struct SentinelPlan {
  int read_fd = -1;         // the pipe's read end: the sentinel's
  int write_fd = -1;        // its write end: the agent's, closed in the sentinel
  int kill_fd = -1;         // cgroup.kill, or -1: kept open across the exec
  std::string containment;  // Containment::handover(), handed on unread
  std::int64_t promote_after_ns = 1'000'000'000;  // < 0: never unasked
  std::string program = "/proc/self/exe";         // what it execs to become the guardian process
};

class Sentinel {
 public:
  Sentinel() = default;
  ~Sentinel();  // after the process was reaped (or never started): its memory is returned
  Sentinel(const Sentinel&) = delete;
  Sentinel& operator=(const Sentinel&) = delete;

  // Starts it; its pid, or -1. Call while the process has one thread (as a fork).
  pid_t start(const SentinelPlan& plan);

 private:
  void* region_ = nullptr;
  std::size_t size_ = 0;
};

// Whether a sentinel can run and become the guardian process here: x86-64 or arm64; Linux 5.16
// or later (before, a core dump of the agent killed every process sharing its memory); and
// /proc/self/exe is this program, which links the agent library (not `ld.so ./ddprun`).
bool sentinel_supported();

// DDPRUN_GUARDIAN_SENTINEL_MS (nullptr: unset): milliseconds from 0 (the guardian process at
// once) to a day, "never" (only when it must act), or "fork" (no sentinel); unset, 1 s; nullopt
// for any other value.
struct GuardianForm {
  bool fork = false;
  std::int64_t promote_after_ns = 1'000'000'000;  // < 0: never unasked
};
std::optional<GuardianForm> guardian_form(const char* setting);

}  // namespace ddprun::agent
