#include "store_bench_server.hpp"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/core.h>
#include <stdexcept>
#include <thread>

namespace store_bench {
namespace {

// The first line a server prints, within 60 s.
std::string first_line(int fd, const std::string& name) {
  std::string line;
  char c;
  pollfd p{fd, POLLIN, 0};
  while (line.find('\n') == std::string::npos) {
    if (poll(&p, 1, 60000) <= 0 || read(fd, &c, 1) != 1) {
      throw std::runtime_error(name + " did not print its port: " + line);
    }
    line += c;
  }
  return line;
}

}  // namespace

void pin_to_cpu(int cpu) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

Server Server::spawn(std::string name, std::vector<std::string> argv) {
  int out[2], in[2];
  if (pipe(out) != 0 || pipe(in) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    pin_to_cpu(1);
    dup2(out[1], 1);
    dup2(in[0], 0);
    close(out[0]);
    close(in[1]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(in[0]);
  Server s;
  s.name = std::move(name);
  s.pid = pid;
  s.stdin_fd = in[1];
  std::string line = first_line(out[0], s.name);
  close(out[0]);
  s.banner = line;
  auto at = line.find("127.0.0.1:");
  auto colon = at != std::string::npos ? at + 9 : line.rfind(':');
  s.port = static_cast<std::uint16_t>(std::stoi(line.substr(colon + 1)));
  return s;
}

double Server::cpu_seconds() const {
  FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (!f) return 0;
  char buf[4096];
  std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may contain spaces
  unsigned long utime = 0, stime = 0;
  if (!p || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

void Server::wait_idle() const {
  double last = cpu_seconds();
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // sampling /proc, not synchronising
    double now = cpu_seconds();
    if (now - last < 0.002) return;
    last = now;
  }
}

double Server::peak_rss_mib() const {
  FILE* f = std::fopen(fmt::format("/proc/{}/status", pid).c_str(), "r");
  if (!f) return 0;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::atol(line + 6);
  }
  std::fclose(f);
  return kib / 1024.0;
}

void Server::stop() {
  if (pid < 0) return;
  close(stdin_fd);
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

}  // namespace store_bench
