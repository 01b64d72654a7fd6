// The sentinel's own code (guardian_sentinel.hpp). It runs in the agent's memory with the agent's
// thread pointer, so it calls nothing outside this file: the kernel directly (sys()), no C
// library (whose wrappers write errno, the agent's), no allocation, no lock, and no object the
// agent may change or free (its state is its own mapping: sentinel_state.hpp). The build compiles
// this file without stack protector and sanitizers, and tests/sentinel_calls_test.sh checks that
// its object refers to no symbol outside it. No aggregate is zero-initialised with {}: a compiler
// may make that a call to memset.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include "guardian_protocol.hpp"
#include "sentinel_state.hpp"

namespace ddprun::agent::sentinel {
namespace {

using namespace guardian_protocol;

// The result, or a negative errno; nothing written anywhere else.
#if defined(__x86_64__)
inline long sys(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                   : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
inline long sys(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
  return x0;
}
#else
// Never started here (sentinel_supported() is false): the guardian is a fork.
inline long sys(long, long = 0, long = 0, long = 0, long = 0, long = 0) { return -ENOSYS; }
#endif

template <class T>
long arg(T* p) { return reinterpret_cast<long>(p); }

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kRetry = 10'000'000;  // a failed hand-over with an act pending: again in 10 ms

std::int64_t now_ns() {
  timespec t;
  t.tv_sec = 0;
  t.tv_nsec = 0;
  sys(SYS_clock_gettime, CLOCK_MONOTONIC, arg(&t));
  return static_cast<std::int64_t>(t.tv_sec) * kSecond + t.tv_nsec;
}

void pause_ns(std::int64_t ns) {
  timespec t;
  t.tv_sec = static_cast<time_t>(ns / kSecond);
  t.tv_nsec = static_cast<long>(ns % kSecond);
  sys(SYS_nanosleep, arg(&t), 0);
}

// All `n` bytes through read(2) or write(2) (`call`: SYS_read or SYS_write), short transfers and
// EINTR retried; false at end of file or on an error first.
bool whole(long call, int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    long r = sys(call, fd, arg(p), static_cast<long>(n));
    if (r == -EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}
bool read_all(int fd, char* p, std::size_t n) { return whole(SYS_read, fd, p, n); }
bool write_all(int fd, const void* data, std::size_t n) { return whole(SYS_write, fd, data, n); }

// "--ddprun-guardian-handover=FD".
void format_handover_arg(State& s, long fd) {
  char* out = s.handover_arg;
  for (const char* c = kGuardianFlag; *c; ++c) *out++ = *c;
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + fd % 10);
    fd /= 10;
  } while (fd > 0);
  while (n > 0) *out++ = digits[--n];
  *out = '\0';
}

bool write_handover(const State& s, int memfd) {
  Handover h;
  for (int i = 0; i < 8; ++i) h.magic[i] = kMagic[i];
  h.pipe_fd = s.fd;
  h.pending = s.pending;
  h.armed = s.armed ? 1 : 0;
  h.groups = s.ngroups + (s.extra > 0 ? 1 : 0);
  h.deadline = s.deadline;
  h.directory_bytes = s.directory_bytes;
  h.containment_bytes = s.containment_bytes;
  return write_all(memfd, &h, sizeof(h)) &&
         write_all(memfd, s.groups, static_cast<std::size_t>(s.ngroups) * sizeof(pid_t)) &&
         (s.extra <= 0 || write_all(memfd, &s.extra, sizeof(s.extra))) &&
         write_all(memfd, s.directory, s.directory_bytes) &&
         write_all(memfd, s.containment, s.containment_bytes);
}

// Becomes the guardian process (exec with the state in a memfd); returns only when it could not,
// and the sentinel goes on, its pending act and extra group kept for the next try.
void become_guardian(State& s) {
  long memfd = sys(SYS_memfd_create, arg("ddprun-guardian"), 0);  // (not close-on-exec)
  if (memfd < 0) return;
  if (write_handover(s, static_cast<int>(memfd)) && sys(SYS_lseek, memfd, 0, SEEK_SET) == 0) {
    // Open across the exec: the pipe and cgroup.kill (the memfd already is).
    sys(SYS_fcntl, s.fd, F_SETFD, 0);
    if (s.kill_fd >= 0) sys(SYS_fcntl, s.kill_fd, F_SETFD, 0);
    format_handover_arg(s, memfd);
    const char* argv[3];
    argv[0] = "ddprun-guard";
    argv[1] = s.handover_arg;
    argv[2] = nullptr;
    sys(SYS_execve, arg(s.program), arg(argv), arg(s.envp));
    sys(SYS_fcntl, s.fd, F_SETFD, FD_CLOEXEC);
    if (s.kill_fd >= 0) sys(SYS_fcntl, s.kill_fd, F_SETFD, FD_CLOEXEC);
  }
  sys(SYS_close, memfd);
}

void kill_groups(const State& s) {
  for (int i = 0; i < s.ngroups; ++i) sys(SYS_kill, -s.groups[i], SIGKILL);
  if (s.extra > 0) sys(SYS_kill, -s.extra, SIGKILL);
}

// The fence's deadline passed: the groups die at once; the guardian process sweeps the rest.
void lapse(State& s) {
  kill_groups(s);
  s.armed = false;
  if (s.pending < kLapsed) s.pending = kLapsed;
}

[[noreturn]] void agent_gone(State& s) {
  kill_groups(s);
  s.pending = kAgentGone;
  for (int i = 0; i < 100; ++i) {  // an exec may fail for want of memory: a second of tries
    become_guardian(s);
    pause_ns(kRetry);
  }
  // No guardian process: the groups are killed, and the cgroup's processes where cgroup.kill is;
  // the cgroup and the temporary directory are left.
  if (s.kill_fd >= 0) sys(SYS_pwrite64, s.kill_fd, arg("1"), 1, 0);
  sys(SYS_exit_group, 0);
  __builtin_unreachable();
}

void watch_group(State& s, pid_t pgid) {
  for (int i = 0; i < s.ngroups; ++i) {
    if (s.groups[i] == pgid) return;  // (a set, as the guardian process's)
  }
  if (s.ngroups < kMaxGroups) {
    s.groups[s.ngroups++] = pgid;
  } else if (s.extra <= 0 || s.extra == pgid) {
    s.extra = pgid;  // the guardian process takes it (become_guardian, now and until it starts)
  }
  // (else a second group beyond the array before the guardian process could start: the agent's
  // sweep and the cgroup still reach its processes)
}

void forget_group(State& s, pid_t pgid) {
  if (s.extra == pgid) s.extra = 0;
  for (int i = 0; i < s.ngroups; ++i) {
    if (s.groups[i] != pgid) continue;
    s.groups[i] = s.groups[--s.ngroups];
    return;
  }
}

// One message; false to stop reading (a path that did not come whole).
bool on_message(State& s, const Message& m) {
  // A renewal or release read late (the sentinel was slow to run) counts when it was sent: the
  // rule the agent's GuardianFence applies when it sends it.
  if ((m.op == 'a' || m.op == 'd') && s.armed && m.sent >= s.deadline) lapse(s);
  switch (m.op) {
    case 'w': watch_group(s, m.pgid); break;
    case 'f': forget_group(s, m.pgid); break;
    case 'a': s.armed = true, s.deadline = m.when; break;
    case 'd': s.armed = false; break;
    case 'q': sys(SYS_exit_group, 0); break;
    case 'p': {
      // The path's bytes follow in the same write. Whole or not at all: a part of the path must
      // never be what is removed.
      const bool fits = m.when > 0 && m.when <= static_cast<std::int64_t>(sizeof(s.directory));
      s.directory_bytes = fits ? static_cast<std::uint32_t>(m.when) : 0;
      if (!fits || !read_all(s.fd, s.directory, s.directory_bytes)) {
        s.directory_bytes = 0;
        return false;
      }
      break;
    }
    default: break;
  }
  if (s.pending != kNothing || s.extra > 0) become_guardian(s);
  return true;
}

void on_timeout(State& s) {
  const std::int64_t now = now_ns();
  if (s.armed && now >= s.deadline) lapse(s);
  if (s.pending != kNothing || s.extra > 0) {
    become_guardian(s);
  } else if (s.promote_at >= 0 && now >= s.promote_at) {
    become_guardian(s);
    s.promote_at = now + kSecond;  // (it could not: again in a second)
  }
}

// The poll's timeout: the fence's deadline, the time to become the guardian process, or soon
// when a hand-over with something to do failed.
timespec* timeout(const State& s, timespec& ts) {
  std::int64_t until = s.armed ? s.deadline : -1;
  if (s.promote_at >= 0 && (until < 0 || s.promote_at < until)) until = s.promote_at;
  const std::int64_t now = now_ns();
  if (s.pending != kNothing || s.extra > 0) until = now + kRetry;
  if (until < 0) return nullptr;
  const std::int64_t left = until > now ? until - now : 0;
  ts.tv_sec = static_cast<time_t>(left / kSecond);
  ts.tv_nsec = static_cast<long>(left % kSecond);
  return &ts;
}

void detach(const State& s) {
  sys(SYS_close, s.write_fd);  // the agent's end: its death is this end of file
  // A session of its own: a kill of ddprun's process group (`timeout -s KILL`, a job
  // scheduler's) must not take the guardian with it, as that is when it is needed.
  sys(SYS_setsid);
  // Nothing of the console: a caller reading ddprun's output must not wait for the guardian.
  long null = sys(SYS_openat, AT_FDCWD, arg("/dev/null"), O_RDWR | O_CLOEXEC);
  for (long fd = 0; fd <= 2 && null >= 0; ++fd) {
    if (fd != null) sys(SYS_dup3, null, fd, 0);
  }
  // Signals are for the agent, which forwards them or stops the job; the guardian, whom a
  // scheduler may signal along with every process of the job, waits for the pipe. The sentinel
  // keeps them all blocked, as it was born (Guardian's constructor); the guardian process ignores
  // them and unblocks.
  sys(SYS_prctl, PR_SET_NAME, arg("ddprun-guard"));
}

}  // namespace

int sentinel_main(void* state) {
  State& s = *static_cast<State*>(state);
  detach(s);
  Message m;
  for (;;) {
    timespec ts;
    pollfd p;
    p.fd = s.fd;
    p.events = POLLIN;
    p.revents = 0;
    long r = sys(SYS_ppoll, arg(&p), 1, arg(timeout(s, ts)), 0, 0);
    if (r == -EINTR) continue;
    if (r == 0) {
      on_timeout(s);
      continue;
    }
    long n = sys(SYS_read, s.fd, arg(&m), sizeof(m));
    if (n == static_cast<long>(sizeof(m))) {
      if (on_message(s, m)) continue;
      break;
    }
    if (n == -EINTR) continue;
    break;  // end of file: the agent died without saying goodbye
  }
  agent_gone(s);
}

}  // namespace ddprun::agent::sentinel
