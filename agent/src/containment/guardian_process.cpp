#include "guardian_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "containment.hpp"
#include "guardian_protocol.hpp"
#include "private_files.hpp"
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::agent {
namespace {

using namespace guardian_protocol;

struct Watch {
  const Containment* containment = nullptr;
  std::unique_ptr<Containment> restored;  // the exec'd guardian's, which `containment` points to
  std::set<pid_t> groups;
  std::string directory;  // the agent's temporary directory, removed when the agent is gone
  bool armed = false;
  std::int64_t deadline = 0;

  // The workers' groups, then whatever else the job runs (escaped to sessions of their own).
  void kill_all(bool agent_gone) {
    for (pid_t g : groups) ::kill(-g, SIGKILL);
    if (containment) containment->kill_everything(agent_gone);
    if (agent_gone && !directory.empty()) remove_tree(AT_FDCWD, directory.c_str());
  }
  // The fence: a deadline that passed (by `at`) kills the groups (once).
  void check_deadline(std::int64_t at) {
    if (armed && at >= deadline) {
      kill_all(false);
      armed = false;
    }
  }
  int poll_timeout_ms() const {
    if (!armed) return -1;
    auto left = (deadline - steady_ns()) / 1'000'000 + 1;
    return static_cast<int>(std::clamp<std::int64_t>(left, 0, 60'000));
  }
};

// Reads the pipe until the goodbye ('q') or its end of file (the agent died: everything killed).
[[noreturn]] void guard(int fd, Watch& w) {
  Message m;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, w.poll_timeout_ms());
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      w.check_deadline(steady_ns());  // nothing pending: no renewal is on its way
      continue;
    }
    ssize_t n = ::read(fd, &m, sizeof(m));
    if (n == sizeof(m)) {
      // A renewal or release read late (the guardian was slow to run) counts when it was sent:
      // the same rule the agent's GuardianFence applies when it sends it.
      if (m.op == 'a' || m.op == 'd') w.check_deadline(m.sent);
      if (m.op == 'w') w.groups.insert(m.pgid);
      if (m.op == 'f') w.groups.erase(m.pgid);
      if (m.op == 'a') w.armed = true, w.deadline = m.when;
      if (m.op == 'd') w.armed = false;
      if (m.op == 'q') ::_exit(0);
      if (m.op == 'p') {
        // The path's bytes follow the message (written with it, in one write). Whole or not at
        // all: a part of the path must never be what is removed.
        const bool fits = m.when > 0 && m.when <= static_cast<std::int64_t>(PIPE_BUF);
        if (fits) w.directory.assign(static_cast<std::size_t>(m.when), '\0');
        if (!fits || !read_exactly(fd, w.directory.data(), w.directory.size())) {
          w.directory.clear();
          break;
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // end of file: the agent died without saying goodbye
  }
  w.kill_all(true);
  ::_exit(0);
}

// The temporary directory the agent named: the one it made ($TMPDIR/ddprun-XXXXXX: run_dir.cpp,
// relative where TMPDIR is; the guardian has the agent's working directory), never anything
// else: whole (no NUL) and named ddprun-*.
bool plausible_directory(const std::string& d) {
  const auto last = d.rfind('/');
  const std::string name = last == std::string::npos ? d : d.substr(last + 1);
  return d.find('\0') == std::string::npos && name.rfind("ddprun-", 0) == 0;
}

// The sentinel's state, from the memfd (closed here); false if it is not whole and sound.
bool take_over(int memfd, int& pipe_fd, Pending& pending, Watch& w) {
  struct stat st {};
  if (::fstat(memfd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Handover)) || st.st_size > (64 << 20)) return false;
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  const bool read = ::pread(memfd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size());
  ::close(memfd);
  Handover h{};
  if (!read) return false;
  std::memcpy(&h, bytes.data(), sizeof(h));
  const std::size_t groups_bytes = static_cast<std::size_t>(std::max(h.groups, 0)) * sizeof(pid_t);
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.groups < 0 || h.pending < kNothing ||
      h.pending > kAgentGone || sizeof(h) + groups_bytes + h.directory_bytes + h.containment_bytes != bytes.size()) {
    return false;
  }
  struct stat pipe_st {};
  if (::fstat(h.pipe_fd, &pipe_st) != 0 || !S_ISFIFO(pipe_st.st_mode)) return false;
  const char* at = bytes.data() + sizeof(h);
  for (std::int32_t i = 0; i < h.groups; ++i, at += sizeof(pid_t)) {
    pid_t g;
    std::memcpy(&g, at, sizeof(g));
    if (g <= 1) return false;  // (kill(-1) or kill(0) would reach far more than a group)
    w.groups.insert(g);
  }
  w.directory.assign(at, h.directory_bytes);
  at += h.directory_bytes;
  if (!w.directory.empty() && !plausible_directory(w.directory)) w.directory.clear();  // (guard on, remove nothing)
  if (h.containment_bytes > 0) {
    w.restored = Containment::restore(std::string(at, h.containment_bytes));
    if (!w.restored) return false;
    w.containment = w.restored.get();
  }
  w.armed = h.armed != 0;
  w.deadline = h.deadline;
  pipe_fd = h.pipe_fd;
  pending = static_cast<Pending>(h.pending);
  return true;
}

void ignore_signals() {
  // Born with all blocked (the mask survives the sentinel's exec): signals are the agent's.
  for (int s : stop_signals()) ::signal(s, SIG_IGN);
  for (int s : {SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) ::signal(s, SIG_IGN);  // (nor stopped by a terminal's)
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);
}

[[noreturn]] void guardian_process(const char* memfd_text) {
  ignore_signals();
  int pipe_fd = -1;
  Pending pending = kNothing;
  Watch w;
  auto memfd = parse_int(memfd_text, 0, INT32_MAX);
  if (!memfd || !take_over(static_cast<int>(*memfd), pipe_fd, pending, w)) {
    std::fprintf(stderr, "ddprun: %s is for the guardian ddprun starts itself, with its state\n", kGuardianFlag);
    ::_exit(2);
  }
  for (int fd : {pipe_fd, w.containment != nullptr ? w.containment->kill_fd() : -1}) {
    if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  if (pending == kAgentGone) {
    w.kill_all(true);
    ::_exit(0);
  }
  if (pending == kLapsed) w.kill_all(false);
  guard(pipe_fd, w);
}

// Before main. Whether the program's other constructors ran before it or not (the link order
// decides) does not matter: it needs nothing they set up.
__attribute__((constructor)) void guardian_entry(int argc, char** argv, char** /*envp*/) {
  const std::size_t n = sizeof(kGuardianFlag) - 1;
  if (argc >= 2 && argv[1] != nullptr && std::strncmp(argv[1], kGuardianFlag, n) == 0) guardian_process(argv[1] + n);
}

}  // namespace

void link_guardian_process() {}

[[noreturn]] void guardian_forked(int fd, const Containment* containment) {
  // A session of its own: a kill of ddprun's process group (`timeout -s KILL`, a job
  // scheduler's) must not take the guardian with it, as that is when it is needed.
  ::setsid();
  // Nothing of the console: a caller reading ddprun's output must not wait for the guardian.
  int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int f = 0; f <= 2 && null >= 0; ++f) ::dup2(null, f);
  ignore_signals();
  Watch w;
  w.containment = containment;
  guard(fd, w);
}

}  // namespace ddprun::agent
