#include "containment/guardian.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "containment/containment.hpp"
#include "containment/guardian_protocol.hpp"
#include "ddprun/agent/guardian_main.hpp"

namespace ddprun::agent {

using Clock = std::chrono::steady_clock;
using namespace guardian_protocol;

namespace {

// What starts the guardian: this program again. Run by hand through its loader (`ld.so ./ddprun`)
// /proc/self/exe is the loader, which then runs this program (argv[0]) again.
std::vector<std::string> guardian_command(const std::string& program) {
  if (!program.empty()) return {program};
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string exe(self, n > 0 ? static_cast<std::size_t>(n) : 0);
  const std::string base = exe.substr(exe.rfind('/') + 1);
  char real[PATH_MAX];
  if ((base.rfind("ld-", 0) == 0 || base.rfind("ld.so", 0) == 0) && ::realpath(program_invocation_name, real)) {
    return {"/proc/self/exe", real};
  }
  return {"/proc/self/exe"};
}

void say_no_guardian(const char* why) {
  spdlog::warn("ddprun: no guardian ({}): a kill -9 of ddprun would leave the workers' daemons, cgroup and temporary "
               "directory behind (the workers themselves still get their parent-death signal)", why);
}

}  // namespace

Guardian::Guardian(const Containment* containment, const std::string& program) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    say_no_guardian(std::strerror(errno));
    return;
  }
  // Its own session (a kill of ddprun's process group, `timeout -s KILL`, must not take it
  // along: that is when it is needed), /dev/null for the console (a caller reading ddprun's
  // output must not wait for it), the pipe as descriptor 3 and nothing else of the agent's.
  // Born with every signal blocked and at their defaults: a signal sent to all of a job's
  // processes at its birth must not end it before it ignores them (guardian_main).
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, p[0], kPipeFd);
  ::posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDWR, 0);
  ::posix_spawn_file_actions_adddup2(&fa, STDIN_FILENO, STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&fa, STDIN_FILENO, STDERR_FILENO);
  ::posix_spawnattr_init(&attr);
  sigset_t all;
  sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attr, &all);
  ::posix_spawnattr_setsigdefault(&attr, &all);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const auto args = containment ? containment->guardian_args() : std::vector<std::string>{"-", "", "0"};
  const auto command = guardian_command(program);
  std::vector<std::string> words = {"ddprun-guard"};
  words.insert(words.end(), command.begin() + 1, command.end());  // (the loader's program)
  words.push_back(kGuardianFlag);
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  pid_t pid = -1;
  const int e = ::posix_spawn(&pid, command[0].c_str(), &fa, &attr, argv.data(), envp);
  ::posix_spawn_file_actions_destroy(&fa);
  ::posix_spawnattr_destroy(&attr);
  ::close(p[0]);
  if (e != 0) {
    ::close(p[1]);
    say_no_guardian(std::strerror(e));
    return;
  }
  pid_ = pid;
  fd_ = p[1];
}

void Guardian::release() {
  // The goodbye, and the end of writes, in one locked step: a renewal from a rendezvous thread
  // comes before it or goes nowhere (never into a pipe whose reader has gone: SIGPIPE).
  std::lock_guard<std::mutex> lk(write_mu_);
  const int fd = fd_.exchange(-1);
  if (fd < 0) return;
  Message m{'q', 0, 0, steady_ns()};
  write_locked(fd, &m, sizeof(m));
  ::close(fd);
}

Guardian::~Guardian() {
  release();
  int status;
  while (pid_ > 0 && ::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void Guardian::send(char op, pid_t pgid, std::int64_t when, std::int64_t sent) {
  if (fd_ < 0) return;  // (a cheap early out: write_all checks again under the lock)
  Message m{op, pgid, when, sent ? sent : steady_ns()};
  write_all(&m, sizeof(m));
}

// Whole messages, at most PIPE_BUF bytes a write: each write is atomic, so messages the
// rendezvous' threads send at the same time never interleave with them; the guardian reads
// continuously.
void Guardian::write_all(const void* data, std::size_t size) {
  // Under the lock: a rendezvous thread renewing while the agent releases the guardian must not
  // write into a descriptor number that has been closed and reused.
  std::lock_guard<std::mutex> lk(write_mu_);
  const int fd = fd_;
  if (fd >= 0) write_locked(fd, data, size);
}

void Guardian::write_locked(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, std::min(size, kChunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) {
      // Gone before its goodbye (killed, or a guardian process that could not start): said once.
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        spdlog::warn("ddprun: the guardian is gone: a kill -9 of ddprun would now leave the workers' daemons, "
                     "cgroup and temporary directory behind (the workers themselves still get their parent-death signal)");
      }
    }
    if (n < 0) return;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Guardian::watch(const std::vector<pid_t>& pgids) {
  if (fd_ < 0 || pgids.empty()) return;
  std::vector<Message> ms;
  const auto now = steady_ns();
  for (pid_t g : pgids) ms.push_back(Message{'w', g, 0, now});
  write_all(ms.data(), ms.size() * sizeof(Message));
}
void Guardian::forget(pid_t pgid) { send('f', pgid); }

void Guardian::own_directory(const std::string& path) {
  if (fd_ < 0 || path.empty() || sizeof(Message) + path.size() > kChunk) return;
  Message m{'p', 0, static_cast<std::int64_t>(path.size()), steady_ns()};
  std::string buf(reinterpret_cast<const char*>(&m), sizeof(m));
  buf += path;
  write_all(buf.data(), buf.size());  // one write: atomic
}

void Guardian::arm(Clock::time_point deadline, Clock::time_point now) {
  send('a', 0, steady_ns(deadline), steady_ns(now));
}
void Guardian::disarm(Clock::time_point now) { send('d', 0, 0, steady_ns(now)); }

void GuardianFence::note_lapse(Clock::time_point now) {
  if (armed_ && now >= deadline_) lapsed_ = true;
}

// One reading of the clock decides both here and in the guardian (the message carries it).
void GuardianFence::renewed_until(Clock::time_point deadline) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto now = Clock::now();
  note_lapse(now);
  armed_ = true;
  deadline_ = deadline;
  renewed_at_ = now;
  guardian_.arm(deadline, now);
}

void GuardianFence::release() {
  std::lock_guard<std::mutex> lk(mu_);
  const auto now = Clock::now();
  note_lapse(now);
  armed_ = false;
  guardian_.disarm(now);
}

bool GuardianFence::lapsed() {
  std::lock_guard<std::mutex> lk(mu_);
  note_lapse(Clock::now());
  return lapsed_;
}

void GuardianFence::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  lapsed_ = false;
}

double GuardianFence::silent_s() {
  std::lock_guard<std::mutex> lk(mu_);
  if (renewed_at_.time_since_epoch().count() == 0) return 0;
  return std::chrono::duration<double>(Clock::now() - renewed_at_).count();
}

}  // namespace ddprun::agent
