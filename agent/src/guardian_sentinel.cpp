#include "guardian_sentinel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "guardian_protocol.hpp"
#include "ddprun/common/text.hpp"

extern char** environ;

namespace ddprun::agent {
namespace {

using namespace guardian_protocol;

// The kernel, called directly: the result, or a negative errno; nothing written anywhere else
// (the C library's wrappers write errno, which is the agent's: the sentinel runs with the agent's
// thread pointer). Every call the sentinel makes goes through sys().
#if defined(__x86_64__)
constexpr bool kSharesMemory = true;
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
constexpr bool kSharesMemory = true;
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
constexpr bool kSharesMemory = false;  // elsewhere the sentinel is a fork: its errno is its own
inline long sys(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
  long r = ::syscall(n, a, b, c, d, e);
  return r < 0 ? -errno : r;
}
#endif

template <class T>
long arg(T* p) { return reinterpret_cast<long>(p); }

constexpr std::size_t kStackBytes = 64 * 1024;
constexpr int kMaxGroups = 4096;  // more: it becomes the guardian process
constexpr int kMaxSignals = 64;
constexpr std::int64_t kSecond = 1'000'000'000;

// The sentinel's memory, above its stack in the one mapping. Plain data, left as mmap gave it
// (zeros) but for what the agent sets before the start: no constructor touches its pages.
struct State {
  // Set by the agent before the start.
  int fd;
  int write_fd;
  int kill_fd;
  int signals[kMaxSignals];
  int nsignals;
  std::int64_t promote_at;  // CLOCK_MONOTONIC ns (steady_clock's); < 0: never unasked
  char** envp;              // a copy of the agent's environment, in this mapping
  const char* containment;  // Containment::handover(), in this mapping
  std::uint32_t containment_bytes;
  // What it knows.
  pid_t groups[kMaxGroups];
  int ngroups;
  bool armed;
  std::int64_t deadline;
  std::uint32_t directory_bytes;
  char directory[PIPE_BUF];
  char handover_arg[64];
};

std::int64_t now_ns() {
  timespec t{};
  sys(SYS_clock_gettime, CLOCK_MONOTONIC, arg(&t));
  return static_cast<std::int64_t>(t.tv_sec) * kSecond + t.tv_nsec;
}

void pause_10ms() {
  timespec t{0, 10'000'000};
  sys(SYS_nanosleep, arg(&t), 0);
}

bool read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    long r = sys(SYS_read, fd, arg(p), static_cast<long>(n));
    if (r == -EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    long r = sys(SYS_write, fd, arg(p), static_cast<long>(n));
    if (r == -EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

void ignore_signal(int sig) {
#if defined(__x86_64__) || defined(__aarch64__)
  struct {
    void* handler;
    unsigned long flags;
    void* restorer;
    unsigned long mask;
  } ignore{reinterpret_cast<void*>(SIG_IGN), 0, nullptr, 0};
  sys(SYS_rt_sigaction, sig, arg(&ignore), 0, sizeof(unsigned long));
#else
  ::signal(sig, SIG_IGN);
#endif
}

// "--ddprun-guardian-handover=FD", written without the C library.
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

// Becomes the guardian process (exec of the running program with the state in a memfd); returns
// only when it could not, and the sentinel goes on. `extra`: a group to watch that did not fit.
void become_guardian(State& s, Pending pending, pid_t extra = 0) {
  long memfd = sys(SYS_memfd_create, arg("ddprun-guardian"), 0);  // (not close-on-exec)
  if (memfd < 0) return;
  Handover h;
  for (int i = 0; i < 8; ++i) h.magic[i] = kMagic[i];
  h.pipe_fd = s.fd;
  h.pending = pending;
  h.armed = s.armed ? 1 : 0;
  h.groups = s.ngroups + (extra > 0 ? 1 : 0);
  h.deadline = s.deadline;
  h.directory_bytes = s.directory_bytes;
  h.containment_bytes = s.containment_bytes;
  const bool written = write_all(memfd, &h, sizeof(h)) &&
                       write_all(memfd, s.groups, static_cast<std::size_t>(s.ngroups) * sizeof(pid_t)) &&
                       (extra <= 0 || write_all(memfd, &extra, sizeof(extra))) &&
                       write_all(memfd, s.directory, s.directory_bytes) &&
                       write_all(memfd, s.containment, s.containment_bytes);
  if (written && sys(SYS_lseek, memfd, 0, SEEK_SET) == 0) {
    // Open across the exec: the pipe and cgroup.kill (the memfd already is).
    sys(SYS_fcntl, s.fd, F_SETFD, 0);
    if (s.kill_fd >= 0) sys(SYS_fcntl, s.kill_fd, F_SETFD, 0);
    format_handover_arg(s, memfd);
    const char* argv[] = {"ddprun-guard", s.handover_arg, nullptr};
    sys(SYS_execve, arg("/proc/self/exe"), arg(argv), arg(s.envp));
  }
  sys(SYS_close, memfd);
}

void kill_groups(const State& s) {
  for (int i = 0; i < s.ngroups; ++i) sys(SYS_kill, -s.groups[i], SIGKILL);
}

// The fence's deadline passed: the groups die at once, and the guardian process sweeps the rest.
// If it cannot start, what the groups left is the agent's to sweep at the group's end.
void lapse(State& s) {
  kill_groups(s);
  s.armed = false;
}

[[noreturn]] void agent_gone(State& s) {
  kill_groups(s);
  for (int i = 0; i < 100; ++i) {  // an exec may fail for want of memory: a second of tries
    become_guardian(s, kAgentGone);
    pause_10ms();
  }
  // No guardian process: the groups are killed, and the cgroup's processes where cgroup.kill is;
  // the cgroup and the temporary directory are left.
  if (s.kill_fd >= 0) sys(SYS_pwrite64, s.kill_fd, arg("1"), 1, 0);
  sys(SYS_exit_group, 0);
  __builtin_unreachable();
}

void watch_group(State& s, pid_t pgid) {
  if (s.ngroups < kMaxGroups) {
    s.groups[s.ngroups++] = pgid;
    return;
  }
  become_guardian(s, kNothing, pgid);
  // (Could not: that group is not watched; its processes die with the agent's sweep or cgroup.)
}

void forget_group(State& s, pid_t pgid) {
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
  const bool lapsed = (m.op == 'a' || m.op == 'd') && s.armed && m.sent >= s.deadline;
  if (lapsed) lapse(s);
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
  if (lapsed) become_guardian(s, kLapsed);
  return true;
}

void on_timeout(State& s) {
  const std::int64_t now = now_ns();
  if (s.armed && now >= s.deadline) {
    lapse(s);
    become_guardian(s, kLapsed);
  } else if (s.promote_at >= 0 && now >= s.promote_at) {
    become_guardian(s, kNothing);
    s.promote_at = now + kSecond;  // (it could not: again in a second)
  }
}

// The poll's timeout: the fence's deadline or the time to become the guardian process.
timespec* timeout(const State& s, timespec& ts) {
  std::int64_t until = s.armed ? s.deadline : -1;
  if (s.promote_at >= 0 && (until < 0 || s.promote_at < until)) until = s.promote_at;
  if (until < 0) return nullptr;
  const std::int64_t now = now_ns();
  const std::int64_t left = until > now ? until - now : 0;
  ts.tv_sec = static_cast<time_t>(left / kSecond);
  ts.tv_nsec = static_cast<long>(left % kSecond);
  return &ts;
}

int sentinel_main(void* state) {
  State& s = *static_cast<State*>(state);
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
  // scheduler may signal along with every process of the job, waits for the pipe.
  for (int i = 0; i < s.nsignals; ++i) ignore_signal(s.signals[i]);
  sys(SYS_prctl, PR_SET_NAME, arg("ddprun-guard"));
  Message m;
  for (;;) {
    timespec ts{};
    pollfd p{s.fd, POLLIN, 0};
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

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::optional<std::int64_t> sentinel_time_ns(const char* setting) {
  if (setting == nullptr) return kSecond;
  if (std::strcmp(setting, "never") == 0) return -1;
  auto ms = parse_int(setting, 0, 86'400'000);
  if (!ms) return std::nullopt;
  return *ms * 1'000'000;
}

pid_t Sentinel::start(const SentinelPlan& plan) {
  if (plan.ignored_signals.size() > static_cast<std::size_t>(kMaxSignals)) return -1;
  std::size_t env_count = 0;
  std::size_t env_bytes = 0;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e, ++env_count) env_bytes += std::strlen(*e) + 1;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t stack = round_up(kStackBytes, page);
  const std::size_t data = sizeof(State) + (env_count + 1) * sizeof(char*) + env_bytes + plan.containment.size();
  size_ = page + stack + round_up(data, page);
  void* region = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return -1;
  region_ = region;
  ::mprotect(region_, page, PROT_NONE);  // below the stack: an overflow faults
  char* stack_top = static_cast<char*>(region_) + page + stack;
  auto* s = reinterpret_cast<State*>(stack_top);  // (zeros: see State)
  s->fd = plan.read_fd;
  s->write_fd = plan.write_fd;
  s->kill_fd = plan.kill_fd;
  for (int sig : plan.ignored_signals) s->signals[s->nsignals++] = sig;
  s->promote_at = plan.promote_after_ns < 0 ? -1 : now_ns() + plan.promote_after_ns;
  auto** envp = reinterpret_cast<char**>(stack_top + sizeof(State));
  char* text = reinterpret_cast<char*>(envp + env_count + 1);
  for (std::size_t i = 0; i < env_count; ++i) {
    const std::size_t n = std::strlen(environ[i]) + 1;
    envp[i] = static_cast<char*>(std::memcpy(text, environ[i], n));
    text += n;
  }
  envp[env_count] = nullptr;
  s->envp = envp;
  s->containment = static_cast<const char*>(std::memcpy(text, plan.containment.data(), plan.containment.size()));
  s->containment_bytes = static_cast<std::uint32_t>(plan.containment.size());
  pid_t pid = -1;
  if (kSharesMemory) {
    pid = ::clone(sentinel_main, stack_top, CLONE_VM | SIGCHLD, s);
  } else if ((pid = ::fork()) == 0) {
    ::_exit(sentinel_main(s));
  }
  return pid;
}

Sentinel::~Sentinel() {
  if (region_ != nullptr) ::munmap(region_, size_);
}

}  // namespace ddprun::agent
