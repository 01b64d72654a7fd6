#include "guardian.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace ddprun::agent {
namespace {

struct Message {
  char op;  // 'w' watch, 'f' forget, 'q' quit quietly
  pid_t pgid;
};

[[noreturn]] void guardian_main(int fd) {
  // Terminal signals are for the agent, which forwards them; the guardian waits for the pipe.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);
  std::set<pid_t> groups;
  Message m;
  for (;;) {
    ssize_t n = ::read(fd, &m, sizeof(m));
    if (n == sizeof(m)) {
      if (m.op == 'w') groups.insert(m.pgid);
      if (m.op == 'f') groups.erase(m.pgid);
      if (m.op == 'q') ::_exit(0);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // end of file: the agent died without saying goodbye
  }
  for (pid_t g : groups) ::kill(-g, SIGKILL);
  ::_exit(0);
}

}  // namespace

Guardian::Guardian() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return;  // no guardian: parent-death signals still apply
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[1]);
    guardian_main(p[0]);
  }
  ::close(p[0]);
  if (pid < 0) {
    ::close(p[1]);
    return;
  }
  pid_ = pid;
  fd_ = p[1];
}

Guardian::~Guardian() {
  if (fd_ < 0) return;
  send('q', 0);
  ::close(fd_);
  int status;
  ::waitpid(pid_, &status, 0);
}

void Guardian::send(char op, pid_t pgid) {
  if (fd_ < 0) return;
  Message m{op, pgid};
  // A few bytes to a pipe: atomic, and the guardian reads continuously.
  while (::write(fd_, &m, sizeof(m)) < 0 && errno == EINTR) {
  }
}

void Guardian::watch(pid_t pgid) { send('w', pgid); }
void Guardian::forget(pid_t pgid) { send('f', pgid); }

}  // namespace ddprun::agent
