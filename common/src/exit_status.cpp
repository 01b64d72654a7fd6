#include "ddprun/common/exit_status.hpp"

#include <sys/wait.h>

#include <csignal>
#include <algorithm>
#include <cstring>

namespace ddprun {
namespace {

struct Named {
  int number;
  const char* name;
};
constexpr Named kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGXCPU, "SIGXCPU"},
    {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
};

}  // namespace

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) {
    s.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  }
  return s;
}

std::string ExitStatus::describe() const {
  if (signal) return "signal " + signal_name(signal) + " (" + std::to_string(signal) + ")";
  return "exit code " + std::to_string(code);
}

std::string signal_name(int signal) {
  for (const auto& s : kSignals) {
    if (s.number == signal) return s.name;
  }
  return "signal " + std::to_string(signal);
}

int parse_signal(const std::string& name) {
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    int n = std::stoi(name.substr(0, 3));
    return n > 0 && n < 65 ? n : 0;
  }
  std::string full = name.rfind("SIG", 0) == 0 ? name : "SIG" + name;
  for (const auto& s : kSignals) {
    if (full == s.name) return s.number;
  }
  return 0;
}

}  // namespace ddprun
