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
    {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},     {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"},
    {SIGIO, "SIGIO"},     {SIGPWR, "SIGPWR"},     {SIGSTKFLT, "SIGSTKFLT"}, {SIGURG, "SIGURG"},
    {SIGWINCH, "SIGWINCH"}, {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"},
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
  // As `kill -l` names them: the lower half from SIGRTMIN, the upper from SIGRTMAX.
  const int mid = SIGRTMIN + (SIGRTMAX - SIGRTMIN) / 2;
  if (signal == SIGRTMIN) return "SIGRTMIN";
  if (signal > SIGRTMIN && signal <= mid) return "SIGRTMIN+" + std::to_string(signal - SIGRTMIN);
  if (signal == SIGRTMAX) return "SIGRTMAX";
  if (signal > mid && signal < SIGRTMAX) return "SIGRTMAX-" + std::to_string(SIGRTMAX - signal);
  return "signal " + std::to_string(signal);
}

std::vector<int> stop_signals() {
  // Default action "terminate" or "core", sent from outside: not the faults a process raises on
  // itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT), nor SIGPIPE and SIGXFSZ,
  // which a failed write reports as well (EPIPE, EFBIG), nor SIGKILL.
  std::vector<int> out = {SIGHUP,  SIGINT,    SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM,
                          SIGSTKFLT, SIGXCPU, SIGVTALRM, SIGPROF, SIGIO,   SIGPWR};
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) out.push_back(s);
  return out;
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
  if (full == "SIGRTMIN") return SIGRTMIN;
  if (full == "SIGRTMAX") return SIGRTMAX;
  auto offset = [&](const char* prefix) {
    const std::size_t n = std::strlen(prefix);
    bool digits = full.size() > n && full.size() <= n + 2 && full.rfind(prefix, 0) == 0 &&
                  std::all_of(full.begin() + n, full.end(), [](char c) { return c >= '0' && c <= '9'; });
    return digits ? std::stoi(full.substr(n)) : -1;
  };
  if (int k = offset("SIGRTMIN+"); k >= 0) return SIGRTMIN + k <= SIGRTMAX ? SIGRTMIN + k : 0;
  if (int k = offset("SIGRTMAX-"); k >= 0) return SIGRTMAX - k >= SIGRTMIN ? SIGRTMAX - k : 0;
  return 0;
}

}  // namespace ddprun
