#include "ddprun/agent/spawn.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddprun/agent/agent.hpp"
#include "ddprun/common/error.hpp"

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

SpawnedProcess spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                             const CpuBinding* binding) {
  // Everything the child touches is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  // The binding, as the system calls take it (set_mempolicy has no libc wrapper without libnuma).
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  unsigned long nodes[16] = {};
  if (binding) {
    for (int c : binding->cpus) {
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
    }
    if (binding->numa_node >= 0 && binding->numa_node < 1024) nodes[binding->numa_node / 64] |= 1UL << (binding->numa_node % 64);
  }

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("pipe failed: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw Error(std::string("pipe failed: ") + std::strerror(errno));
  }
  pid_t parent = ::getpid();
  const int max_fd = static_cast<int>(std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 20));
  // Block every signal across fork: until the child has reset its handlers, a signal would run
  // the agent's handler in the child (Asio's, which writes to the agent's own signal pipe and
  // makes the agent believe it received that signal).
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    throw Error(std::string("fork failed: ") + std::strerror(e));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the agent died before the line above took effect
    // Where Yama restricts ptrace to ancestors, let the agent's children (eu-stack, gdb) read
    // this worker's stack when it hangs.
    ::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    if (binding && !binding->cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      write_str(STDERR_FILENO, "ddprun: cannot bind the worker to its CPUs (sched_setaffinity failed)\n");
      ::_exit(127);
    }
    if (binding && binding->numa_node >= 0) {
      ::syscall(SYS_set_mempolicy, 1 /* MPOL_PREFERRED */, nodes, sizeof(nodes) * 8);  // advisory: not fatal
    }
    for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);  // dup2 clears close-on-exec on the copies
    // The worker starts with exactly 0, 1 and 2: nothing of the agent (the store's sockets, other
    // workers' pipes, log files) may leak into it, or into grandchildren that outlive it.
    if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
      for (int fd = 3; fd < max_fd; ++fd) ::close(fd);
    }
    ::execve(cargv[0], cargv.data(), cenv.data());
    int e = errno;
    write_str(STDERR_FILENO, "ddprun: cannot execute '");
    write_str(STDERR_FILENO, cargv[0]);
    write_str(STDERR_FILENO, "': ");
    write_str(STDERR_FILENO, std::strerror(e));
    write_str(STDERR_FILENO, "\n");
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before the agent signals it
  ::close(out[1]);
  ::close(err[1]);
  return {pid, out[0], err[0]};
}

}  // namespace ddprun::agent
