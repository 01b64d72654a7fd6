#include "ddprun/agent/spawn.hpp"

#include <fcntl.h>
#include <linux/sched.h>  // clone_args, CLONE_INTO_CGROUP
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "ddprun/agent/agent_options.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/thread.hpp"

namespace ddprun::agent {
namespace {

void write_str(int fd, const char* s) {
  ssize_t ignored = ::write(fd, s, std::strlen(s));
  (void)ignored;
}

}  // namespace

std::string find_executable(const std::string& program, const std::string& path_env) {
  auto ok = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) return ok(program) ? program : "";
  std::size_t start = 0;
  while (start <= path_env.size()) {
    auto end = path_env.find(':', start);
    if (end == std::string::npos) end = path_env.size();
    std::string dir = path_env.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (ok(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

namespace {

// Everything the child needs, prepared before the clone: the child shares the agent's memory
// until it execs (CLONE_VM), so it only reads this, on its own stack, with async-signal-safe
// calls, and never allocates.
struct ChildPlan {
  std::vector<char*> argv, env;
  bool bind_cpus = false, bind_memory = false;
  cpu_set_t cpus;
  unsigned long nodes[16] = {};  // set_mempolicy's mask (no libc wrapper without libnuma)
  int out = -1, err = -1;        // the pipes' write ends
  int cgroup_procs = -1;         // the job's cgroup, joined by the child (when clone3 could not)
  int pass[2] = {-1, -1};        // become the child's 3 and 4 (both or neither)
  int state = -1;                // becomes the child's kStateFd (its rank's state area)
  pid_t parent = -1;
  int max_fd = 1024;
  // Set when the kernel has reset every handled signal (clone3's CLONE_CLEAR_SIGHAND): the
  // child then resets only the ignored ones, `ignored`, instead of all 64.
  bool handlers_cleared = false;
  sigset_t ignored;
};

// The signals the agent ignores (SIG_IGN), which a worker must not inherit: SIGPIPE and SIGXFSZ
// (main), and whatever ddprun's own parent ignored (nohup: SIGHUP). Read once, at the first
// spawn: the agent sets no disposition to SIG_IGN after start-up.
const sigset_t& ignored_signals() {
  static const sigset_t set = [] {
    sigset_t s;
    sigemptyset(&s);
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction now{};
      if (::sigaction(sig, nullptr, &now) == 0 && !(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_IGN) {
        sigaddset(&s, sig);
      }
    }
    return s;
  }();
  return set;
}

ChildPlan plan_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     const CpuBinding* binding) {
  ChildPlan c;
  for (const auto& a : argv) c.argv.push_back(const_cast<char*>(a.c_str()));
  c.argv.push_back(nullptr);
  for (const auto& e : env) c.env.push_back(const_cast<char*>(e.c_str()));
  c.env.push_back(nullptr);
  CPU_ZERO(&c.cpus);
  if (binding) {
    for (int cpu : binding->cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &c.cpus);
    }
    c.bind_cpus = !binding->cpus.empty();
    int n = binding->numa_node;
    c.bind_memory = n >= 0 && n < 1024;
    if (c.bind_memory) c.nodes[n / 64] |= 1UL << (n % 64);
  }
  c.parent = ::getpid();
  c.max_fd = static_cast<int>(std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 20));  // the limit now
  c.ignored = ignored_signals();
  return c;
}

// Closes [first, last] (close_range, else one by one below `max_fd`): async-signal-safe.
void close_from(unsigned first, unsigned last, int max_fd) {
  if (first > last) return;
  if (::syscall(SYS_close_range, first, last, 0U) != 0) {
    for (long fd = first; fd <= static_cast<long>(last) && fd < max_fd; ++fd) ::close(static_cast<int>(fd));
  }
}

// The child's steps, in order, from the clone to exec. Only system calls: no allocation, no
// locks, nothing that writes the agent's memory (it is shared until exec).
[[noreturn]] void run_child(const ChildPlan& c) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != c.parent) ::_exit(1);  // the agent died before the line above took effect
  // Where Yama restricts ptrace to ancestors, let the agent's children (eu-stack, gdb) read this
  // worker's stack when it hangs.
  ::prctl(PR_SET_PTRACER, c.parent, 0, 0, 0);
  // From here on, what goes wrong is said on the worker's own stderr (its log, its summary).
  ::dup2(c.out, STDOUT_FILENO);
  ::dup2(c.err, STDERR_FILENO);  // dup2 clears close-on-exec on the copies
  // The job's cgroup, before anything of the worker runs.
  if (c.cgroup_procs >= 0 && ::write(c.cgroup_procs, "0", 1) != 1) {
    write_str(STDERR_FILENO, "ddprun: this worker could not join the job's cgroup; it runs outside it\n");
  }
  if (c.bind_cpus && ::sched_setaffinity(0, sizeof(c.cpus), &c.cpus) != 0) {
    write_str(STDERR_FILENO, "ddprun: cannot bind the worker to its CPUs (sched_setaffinity failed)\n");
    ::_exit(127);
  }
  if (c.bind_memory) ::syscall(SYS_set_mempolicy, 1 /* MPOL_PREFERRED */, c.nodes, sizeof(c.nodes) * 8);  // advisory
  // The child has its own copy of the dispositions (no CLONE_SIGHAND): resetting them here
  // leaves the agent's handlers alone. Every one goes back to SIG_DFL before signals are
  // unblocked below; where clone3 has already reset the handled ones, only the ignored remain.
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (!c.handlers_cleared || sigismember(&c.ignored, s) == 1) ::sigaction(s, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // The worker starts with exactly 0, 1 and 2 (a spare: and its two pipes): nothing of the agent
  // (the store's sockets, other workers' pipes, log files) may leak into it, or into
  // grandchildren that outlive it.
  // (and its rank's state area, as kStateFd, which a spare keeps when it becomes the worker).
  unsigned first_closed = 3;
  const int state = c.state >= 0 ? ::fcntl(c.state, F_DUPFD, 10) : -1;  // out of 3, 4 and 5's way
  if (c.pass[0] >= 0) {
    int a = ::fcntl(c.pass[0], F_DUPFD, 10), b = ::fcntl(c.pass[1], F_DUPFD, 10);
    if (a < 0 || b < 0 || ::dup2(a, 3) != 3 || ::dup2(b, 4) != 4) ::_exit(127);
    first_closed = 5;
  }
  if (c.state >= 0) {
    if (state < 0 || ::dup2(state, kStateFd) != kStateFd) ::_exit(127);
    close_from(first_closed, kStateFd - 1, c.max_fd);
    first_closed = kStateFd + 1;
  }
  close_from(first_closed, ~0U, c.max_fd);
  ::execve(c.argv[0], c.argv.data(), c.env.data());
  const char* why = ::strerrordesc_np(errno);  // a constant string: no locale, no allocation
  write_str(STDERR_FILENO, "ddprun: cannot execute '");
  write_str(STDERR_FILENO, c.argv[0]);
  write_str(STDERR_FILENO, "': ");
  write_str(STDERR_FILENO, why ? why : "unknown error");
  write_str(STDERR_FILENO, "\n");
  ::_exit(127);
}

int child_entry(void* plan) { run_child(*static_cast<const ChildPlan*>(plan)); }

// clone3(CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP | CLONE_CLEAR_SIGHAND) on the stack
// [stack_top - size, stack_top) (both flags: Linux 5.7):
// the child calls fn(arg), which never returns. glibc (2.36) has no wrapper that runs a function
// on a new stack with clone3, so the child's first instructions are written here, as glibc's
// clone() does for clone. Returns -1 with errno (ENOSYS: no clone3, or a seccomp profile that
// refuses it) when no child was made; the caller then falls back to clone.
pid_t clone_into_cgroup(int (*fn)(void*), void* arg, void* stack_top, std::size_t size, int cgroup_dir) {
#if defined(__x86_64__) && defined(SYS_clone3) && defined(CLONE_INTO_CGROUP) && defined(CLONE_CLEAR_SIGHAND)
  static std::atomic<bool> unavailable{false};
  if (unavailable.load(std::memory_order_relaxed)) return errno = ENOSYS, -1;
  clone_args args{};
  args.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP | CLONE_CLEAR_SIGHAND;
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<std::uint64_t>(static_cast<char*>(stack_top) - size);
  args.stack_size = size;
  args.cgroup = static_cast<std::uint64_t>(cgroup_dir);
  long ret;
  // The child resumes after `syscall` with the same registers but rsp at the top of its stack
  // (16-byte aligned: a page-aligned mapping of a multiple of 16): it calls fn(arg) and never
  // comes back. rcx and r11 are the registers syscall itself overwrites.
  asm volatile(
      "syscall\n\t"
      "testq %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xorl %%ebp, %%ebp\n\t"
      "movq %[arg], %%rdi\n\t"
      "callq *%[fn]\n\t"
      "ud2\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "0"(static_cast<long>(SYS_clone3)), "D"(&args), "S"(sizeof(args)), [fn] "r"(fn), [arg] "r"(arg)
      : "rcx", "r11", "memory");
  if (ret >= 0) return static_cast<pid_t>(ret);
  if (ret == -ENOSYS || ret == -E2BIG || ret == -EPERM) unavailable.store(true, std::memory_order_relaxed);
  errno = static_cast<int>(-ret);
  return -1;
#else
  (void)fn, (void)arg, (void)stack_top, (void)size, (void)cgroup_dir;
  errno = ENOSYS;
  return -1;
#endif
}

// The child's stack until it execs: its own mapping (the agent's thread stays suspended on its
// own stack meanwhile, CLONE_VFORK), one per spawning thread, kept for its next child: a
// mapping per worker cost an mmap, a munmap (a TLB shoot-down once the agent has threads) and
// the faults of its first pages.
class ChildStack {
 public:
  static constexpr std::size_t kSize = 256 * 1024;
  ChildStack() : base_(::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0)) {
    if (base_ == MAP_FAILED) throw Error(std::string("cannot map a stack to start a worker: ") + std::strerror(errno));
  }
  ~ChildStack() { ::munmap(base_, kSize); }
  ChildStack(const ChildStack&) = delete;
  ChildStack& operator=(const ChildStack&) = delete;
  void* top() const { return static_cast<char*>(base_) + kSize; }  // stacks grow down on Linux' targets

 private:
  void* base_;
};

// Starts the child: clone(CLONE_VM | CLONE_VFORK) as posix_spawn does, so starting a worker
// costs the same whatever the agent's size (fork copied its page tables: 3 ms a worker). Into
// a cgroup, clone3 with CLONE_INTO_CGROUP where it can: a process that moves itself waits for an
// RCU grace period (1-9 ms measured here for the first worker of a cgroup), one born there does
// not.
pid_t start_child(ChildPlan& plan, int cgroup_dir) {
  thread_local ChildStack stack;
  // Block every signal across the clone: until the child has reset its dispositions, a signal
  // would run the agent's handler in the child (Asio's, which writes to the agent's own signal
  // pipe and makes the agent believe it received that signal).
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  pid_t pid = -1;
  const int procs = plan.cgroup_procs;
  if (cgroup_dir >= 0) {
    plan.cgroup_procs = -1;  // born in the cgroup: nothing to join
    plan.handlers_cleared = true;
    pid = clone_into_cgroup(child_entry, &plan, stack.top(), ChildStack::kSize, cgroup_dir);
    if (pid < 0) {  // no child was made: the fallback below joins, and resets every signal
      plan.cgroup_procs = procs;
      plan.handlers_cleared = false;
    }
  }
  if (pid < 0) pid = ::clone(child_entry, stack.top(), CLONE_VM | CLONE_VFORK | SIGCHLD, &plan);
  int e = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  errno = e;
  return pid;
}

}  // namespace

SpawnedProcess spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const CpuBinding* binding, const CgroupTarget* cgroup, int fd3, int fd4,
                             int state_fd) {
  ChildPlan child = plan_child(argv, env, binding);
  child.state = state_fd;
  child.cgroup_procs = cgroup ? cgroup->procs : -1;
  if (fd3 >= 0 && fd4 >= 0) {
    child.pass[0] = fd3;
    child.pass[1] = fd4;
  }
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("pipe failed: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw Error(std::string("pipe failed: ") + std::strerror(errno));
  }
  child.out = out[1];
  child.err = err[1];
  pid_t pid = -1;
  try {
    pid = start_child(child, cgroup ? cgroup->dir : -1);
  } catch (...) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw;
  }
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw Error(task_refused("a worker (clone failed)", e));
  }
  // No setpgid(pid, pid) here as after fork: with CLONE_VFORK the agent resumes only once the
  // child has made its group (its first step) and exec'd (or exited).
  ::close(out[1]);
  ::close(err[1]);
  return {pid, out[0], err[0]};
}

}  // namespace ddprun::agent
