#include "guardian.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstring>
#include <set>
#include <string>

#include "containment.hpp"
#include "private_files.hpp"
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/system.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;

struct Message {
  char op;  // 'w' watch, 'f' forget, 'a' arm, 'd' disarm, 'q' quit quietly, 'p' the agent's
            // temporary directory (its path's `when` bytes follow)
  pid_t pgid;
  std::int64_t when;  // 'a': the deadline, steady clock nanoseconds
  std::int64_t sent;  // when the agent sent it (same clock)
};

// The most one write sends: whole messages, at most PIPE_BUF bytes (atomic).
constexpr std::size_t kChunk = PIPE_BUF / sizeof(Message) * sizeof(Message);

std::int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
std::int64_t now_ns() { return ns(Clock::now()); }

struct Watch {
  const Containment* containment = nullptr;
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
    auto left = (deadline - now_ns()) / 1'000'000 + 1;
    return static_cast<int>(std::clamp<std::int64_t>(left, 0, 60'000));
  }
};

[[noreturn]] void guardian_main(int fd, const Containment* containment) {
  // Signals are for the agent, which forwards them or stops the job; the guardian, whom a
  // scheduler may signal along with every process of the job, waits for the pipe.
  for (int s : stop_signals()) ::signal(s, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_NAME, "ddprun-guard", 0, 0, 0);
  Watch w;
  w.containment = containment;
  Message m;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, w.poll_timeout_ms());
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      w.check_deadline(now_ns());  // nothing pending: no renewal is on its way
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

}  // namespace

Guardian::Guardian(const Containment* containment) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return;  // no guardian: parent-death signals still apply
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[1]);
    // A session of its own: a kill of ddprun's process group (`timeout -s KILL`, a job
    // scheduler's) must not take the guardian with it, as that is when it is needed.
    ::setsid();
    // Nothing of the console: a caller reading ddprun's output must not wait for the guardian.
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd <= 2 && null >= 0; ++fd) ::dup2(null, fd);
    guardian_main(p[0], containment);
  }
  ::close(p[0]);
  if (pid < 0) {
    ::close(p[1]);
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
  Message m{'q', 0, 0, now_ns()};
  write_locked(fd, &m, sizeof(m));
  ::close(fd);
}

Guardian::~Guardian() {
  release();
  int status;
  if (pid_ > 0) ::waitpid(pid_, &status, 0);
}

void Guardian::send(char op, pid_t pgid, std::int64_t when, std::int64_t sent) {
  if (fd_ < 0) return;  // (a cheap early out: write_all checks again under the lock)
  Message m{op, pgid, when, sent ? sent : now_ns()};
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
    if (n < 0) return;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Guardian::watch(const std::vector<pid_t>& pgids) {
  if (fd_ < 0 || pgids.empty()) return;
  std::vector<Message> ms;
  const auto now = now_ns();
  for (pid_t g : pgids) ms.push_back(Message{'w', g, 0, now});
  write_all(ms.data(), ms.size() * sizeof(Message));
}
void Guardian::forget(pid_t pgid) { send('f', pgid); }

void Guardian::own_directory(const std::string& path) {
  if (fd_ < 0 || path.empty() || sizeof(Message) + path.size() > kChunk) return;
  Message m{'p', 0, static_cast<std::int64_t>(path.size()), now_ns()};
  std::string buf(reinterpret_cast<const char*>(&m), sizeof(m));
  buf += path;
  write_all(buf.data(), buf.size());  // one write: atomic
}

void Guardian::arm(Clock::time_point deadline, Clock::time_point now) { send('a', 0, ns(deadline), ns(now)); }
void Guardian::disarm(Clock::time_point now) { send('d', 0, 0, ns(now)); }

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

}  // namespace ddprun::agent
