#include "ddprun/agent/guardian_main.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "containment/containment.hpp"
#include "containment/guardian_protocol.hpp"
#include "containment/private_files.hpp"
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::agent {
namespace {

using namespace guardian_protocol;

struct Watch {
  const Containment* containment = nullptr;
  std::unique_ptr<Containment> restored;  // the guardian's copy, which `containment` points to
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

// The temporary directory the agent named: the one it made ($TMPDIR/ddprun-XXXXXX: run_dir.cpp,
// relative where TMPDIR is; the guardian has the agent's working directory), never anything
// else: whole (no NUL) and named ddprun-*.
bool plausible_directory(const std::string& d) {
  const auto last = d.rfind('/');
  const std::string name = last == std::string::npos ? d : d.substr(last + 1);
  return d.find('\0') == std::string::npos && name.rfind("ddprun-", 0) == 0;
}

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
        if (!plausible_directory(w.directory)) w.directory.clear();  // (guard on, remove nothing)
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // end of file: the agent died without saying goodbye
  }
  w.kill_all(true);
  ::_exit(0);
}

void ignore_signals() {
  // Born with all blocked and at their defaults (Guardian's start): signals are the agent's.
  for (int s : stop_signals()) ::signal(s, SIG_IGN);
  for (int s : {SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) ::signal(s, SIG_IGN);  // (nor stopped by a terminal's)
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);
}

// The start's words: TOKEN CGROUP OWNER (guardian_protocol.hpp), and the pipe as descriptor 3.
// False, and nothing set, for a start that is not whole and sound.
bool take_start(int argc, char** argv, Watch& w) {
  if (argc != 5) return false;
  struct stat st {};
  if (::fstat(kPipeFd, &st) != 0 || !S_ISFIFO(st.st_mode)) return false;
  const std::string token = argv[2], cgroup = argv[3];
  auto owner = parse_int(argv[4], 0, INT32_MAX);
  if (!owner || token.empty() || token.find_first_not_of("0123456789abcdef-") != std::string::npos) return false;
  if (token == "-") return true;  // no containment: the groups alone
  // Its cgroup is named after its token (containment.cpp): nothing else is ever removed.
  const std::string name = "/ddprun-" + token;
  if (!cgroup.empty() && (cgroup.size() <= name.size() || cgroup.compare(cgroup.size() - name.size(), name.size(), name) != 0)) {
    return false;
  }
  w.restored = Containment::for_guardian(token, cgroup, static_cast<pid_t>(*owner));
  w.containment = w.restored.get();
  return true;
}

}  // namespace

bool is_guardian_start(int argc, char** argv) {
  return argc >= 2 && argv[1] != nullptr && std::strcmp(argv[1], kGuardianFlag) == 0;
}

[[noreturn]] void guardian_main(int argc, char** argv) {
  ignore_signals();
  Watch w;
  if (!take_start(argc, argv, w)) {
    std::fprintf(stderr, "ddprun: %s is for the guardian ddprun starts itself\n", kGuardianFlag);
    ::_exit(2);
  }
  // Nothing else of the agent's: a descriptor it inherited without close-on-exec (its caller's
  // pipe, say) must not be held open by the guardian after the agent is gone.
  if (::syscall(SYS_close_range, kPipeFd + 1U, ~0U, 0U) != 0) {
    for (int fd = kPipeFd + 1; fd < 1024; ++fd) ::close(fd);
  }
  ::fcntl(kPipeFd, F_SETFD, FD_CLOEXEC);
  guard(kPipeFd, w);
}

}  // namespace ddprun::agent
