#pragma once
// Runs the built ddprun (or any program) as a child and collects its output, for end-to-end
// tests. Every wait has a deadline; a test that would hang fails instead.

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/agent/spawn.hpp"

extern char** environ;

namespace ddprun::test {

// A new directory under the temporary directory, for a test to fill and remove.
inline std::string temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "ddprun-e2e-XXXXXX").string();
  if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp " + t + ": " + std::strerror(errno));
  return t;
}

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Result {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;
  // The stack dumps ddprun kept in /tmp after a hang without --log_dir (it says where): removed
  // with the last copy of this result, so that a test reads them and no run leaves them behind.
  std::shared_ptr<const std::string> kept_dumps;
};

// The dumps directory a run's stderr names as kept, when it is one ddprun made in /tmp; else null.
inline std::shared_ptr<const std::string> own_kept_dumps(const std::string& err) {
  const std::string mark = "the workers' stack dumps are kept in ", own = "/tmp/ddprun-stacks-";
  const auto at = err.find(mark + own);
  if (at == std::string::npos) return nullptr;
  const auto from = at + mark.size();
  return std::shared_ptr<const std::string>(new std::string(err.substr(from, err.find(' ', from) - from)),
                                            [](const std::string* dir) {
                                              std::error_code ec;
                                              std::filesystem::remove_all(*dir, ec);
                                              delete dir;
                                            });
}

class Launch {
 public:
  explicit Launch(std::vector<std::string> argv, const std::map<std::string, std::string>& extra_env = {}) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : extra_env) env[k] = v;
    std::vector<std::string> envv;
    for (const auto& [k, v] : env) envv.push_back(k + "=" + v);
    if (argv[0].find('/') == std::string::npos) argv[0] = agent::find_executable(argv[0], env["PATH"]);
    started_ = Clock::now();
    auto p = agent::spawn_process(argv, envv);
    pid_ = p.pid;
    out_fd_ = p.stdout_fd;
    err_fd_ = p.stderr_fd;
  }
  ~Launch() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }
  const std::string& out() const { return r_.out; }
  const std::string& err() const { return r_.err; }

  // Reads output until stdout contains `text` at least `count` times; false at the deadline.
  bool wait_for(const std::string& text, int count = 1, std::chrono::milliseconds timeout = 20s) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (occurrences(r_.out, text) >= count) return true;
      if (!pump(deadline)) return occurrences(r_.out, text) >= count;
    }
  }

  // Waits for the exit (and the end of its output). At the deadline the process is killed and
  // the result's code is -1.
  Result finish(std::chrono::milliseconds timeout = 60s) {
    auto deadline = Clock::now() + timeout;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (!pump(deadline)) break;
    }
    int st = 0;
    if (out_fd_ >= 0 || err_fd_ >= 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
      r_.code = -1;
      r_.err += "\n[test: killed at the deadline]";
    } else {
      ::waitpid(pid_, &st, 0);
      r_.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    pid_ = -1;
    r_.seconds = std::chrono::duration<double>(Clock::now() - started_).count();
    r_.kept_dumps = own_kept_dumps(r_.err);
    return r_;
  }

  static int occurrences(const std::string& s, const std::string& what) {
    int n = 0;
    for (auto pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + what.size())) ++n;
    return n;
  }

 private:
  // Reads what is available (or waits for it until the deadline). False when nothing more can
  // come before the deadline or both streams ended.
  bool pump(Clock::time_point deadline) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    if (n == 0) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    int rc = ::poll(fds, n, static_cast<int>(left));
    if (rc <= 0) return rc < 0 && errno == EINTR;
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      char buf[65536];
      ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      bool is_out = fds[i].fd == out_fd_;
      if (got > 0) {
        (is_out ? r_.out : r_.err).append(buf, static_cast<std::size_t>(got));
      } else {
        ::close(fds[i].fd);
        (is_out ? out_fd_ : err_fd_) = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  Result r_;
  Clock::time_point started_;
};

// Waits until process `pid` (not necessarily our child) is gone; false at the deadline.
inline bool process_gone(pid_t pid, std::chrono::milliseconds timeout) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  ::close(fd);
  return rc > 0;
}

inline std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < s.size()) {
    auto nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

}  // namespace ddprun::test
