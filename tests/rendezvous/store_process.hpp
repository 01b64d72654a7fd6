#pragma once
// ddprun-store as a child process, for tests that measure the server's own memory (VmRSS,
// VmHWM) while clients abuse it. Its stderr (the log) goes to a file the test can read.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace ddprun::rendezvous::test {

class StoreProcess {
 public:
  explicit StoreProcess(std::vector<std::string> args, std::vector<std::string> wrapper = {}) {
    char tmpl[] = "/tmp/ddprun-store-log-XXXXXX";
    int log_fd = ::mkstemp(tmpl);
    log_path_ = tmpl;
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    std::vector<std::string> argv = wrapper;
    // DDPRUN_TEST_STORE_BIN runs the tests against another build (an earlier one, to measure
    // what a change fixed).
    const char* other = std::getenv("DDPRUN_TEST_STORE_BIN");
    argv.push_back(other && *other ? other : DDPRUN_STORE_BIN);
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    if (::posix_spawnp(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ) != 0) {
      throw std::runtime_error("cannot start " + argv[0]);
    }
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(log_fd);
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(out[0]);
    auto colon = line.rfind(':');
    if (line.rfind("listening on ", 0) != 0 || colon == std::string::npos) {
      throw std::runtime_error("ddprun-store did not start: '" + line + "'; log: " + log());
    }
    port_ = static_cast<std::uint16_t>(std::stoi(line.substr(colon + 1)));
  }
  ~StoreProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::remove(log_path_.c_str());
  }
  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // A field of /proc/PID/status in KiB (VmRSS: now; VmHWM: the peak so far).
  long status_kib(const std::string& field) const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
    }
    return -1;
  }
  double rss_mib() const { return status_kib("VmRSS") / 1024.0; }
  double peak_mib() const { return status_kib("VmHWM") / 1024.0; }
  std::string log() const {
    std::ifstream f(log_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  int count_in_log(const std::string& needle) const {
    auto text = log();
    int n = 0;
    for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
    return n;
  }

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
  std::string log_path_;
};

}  // namespace ddprun::rendezvous::test
