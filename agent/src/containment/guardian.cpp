#include "guardian.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

#include "containment.hpp"
#include "guardian_process.hpp"
#include "guardian_protocol.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;

using namespace guardian_protocol;


}  // namespace

Guardian::Guardian(const Containment* containment, const std::string& program) {
  link_guardian_process();
  const char* setting = ::getenv("DDPRUN_GUARDIAN_SENTINEL_MS");
  auto form = guardian_form(setting);
  if (!form) {
    spdlog::warn("ddprun: DDPRUN_GUARDIAN_SENTINEL_MS='{}' is not a number of milliseconds from 0 to 86400000, "
                 "'never' or 'fork': ignored (the guardian is a sentinel for the job's first second)", setting);
    form = GuardianForm{};
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return;  // no guardian: parent-death signals still apply
  // Born with every signal blocked: a signal sent to all of a job's processes at its birth must
  // not end it before it ignores them. The agent's own mask is back at once.
  sigset_t all;
  sigset_t before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  pid_t pid = -1;
  if (!form->fork && sentinel_supported()) {
    SentinelPlan plan;
    plan.read_fd = p[0];
    plan.write_fd = p[1];
    if (containment) {
      plan.kill_fd = containment->kill_fd();
      plan.containment = containment->handover();
    }
    plan.promote_after_ns = form->promote_after_ns;
    if (!program.empty()) plan.program = program;
    pid = sentinel_.start(plan);
  } else if ((pid = ::fork()) == 0) {
    ::close(p[1]);
    guardian_forked(p[0], containment);
  }
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
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
  Message m{'q', 0, 0, steady_ns()};
  write_locked(fd, &m, sizeof(m));
  ::close(fd);
}

Guardian::~Guardian() {
  release();
  int status;
  // Until it is gone: the sentinel runs in this process's memory, which ~Sentinel returns.
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
