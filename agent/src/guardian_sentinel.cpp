#include "guardian_sentinel.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

#include "guardian_protocol.hpp"
#include "sentinel_state.hpp"
#include "ddprun/common/text.hpp"

extern char** environ;

namespace ddprun::agent {
namespace {

constexpr std::size_t kStackBytes = 64 * 1024;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Linux 5.16 or later: before, a core dump of the agent killed every process sharing its memory
// (the sentinel with it); since, only the agent's own threads.
bool kernel_spares_sentinel() {
  utsname u{};
  if (::uname(&u) != 0) return false;
  const auto parts = split(u.release, '.');
  if (parts.size() < 2) return false;
  const auto major = parse_int(parts[0]);
  std::string minor_digits;
  for (char c : parts[1]) {
    if (c < '0' || c > '9') break;
    minor_digits += c;
  }
  const auto minor = parse_int(minor_digits);
  return major && minor && (*major > 5 || (*major == 5 && *minor >= 16));
}

}  // namespace

extern "C" __attribute__((weak)) void _start();

bool sentinel_supported() {
#if defined(__x86_64__) || defined(__aarch64__)
  // /proc/self/exe must be this program, which links this library (its constructor takes the
  // hand-over): not the dynamic loader run by hand (`ld.so ./ddprun`: no interpreter, AT_BASE 0,
  // and /proc/self/exe is the loader), nor a program that loaded this library as a plug-in (the
  // entry, AT_ENTRY, is not this program's _start).
  static const bool supported = kernel_spares_sentinel() && ::getauxval(AT_BASE) != 0 && _start != nullptr &&
                                ::getauxval(AT_ENTRY) == reinterpret_cast<unsigned long>(&_start) &&
                                ::access("/proc/self/exe", X_OK) == 0;
  return supported;
#else
  return false;
#endif
}

std::optional<GuardianForm> guardian_form(const char* setting) {
  GuardianForm form;
  if (setting == nullptr) return form;
  if (std::strcmp(setting, "fork") == 0) {
    form.fork = true;
    return form;
  }
  if (std::strcmp(setting, "never") == 0) {
    form.promote_after_ns = -1;
    return form;
  }
  auto ms = parse_int(setting, 0, 86'400'000);
  if (!ms) return std::nullopt;
  form.promote_after_ns = *ms * 1'000'000;
  return form;
}

pid_t Sentinel::start(const SentinelPlan& plan) {
  std::size_t env_count = 0;
  std::size_t env_bytes = 0;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e, ++env_count) env_bytes += std::strlen(*e) + 1;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t stack = round_up(kStackBytes, page);
  const std::size_t data = sizeof(sentinel::State) + (env_count + 1) * sizeof(char*) + env_bytes +
                           plan.program.size() + 1 + plan.containment.size();
  size_ = page + stack + round_up(data, page);
  void* region = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return -1;
  region_ = region;
  ::mprotect(region_, page, PROT_NONE);  // below the stack: an overflow faults
  char* stack_top = static_cast<char*>(region_) + page + stack;
  auto* s = reinterpret_cast<sentinel::State*>(stack_top);  // (zeros: see State)
  s->fd = plan.read_fd;
  s->write_fd = plan.write_fd;
  s->kill_fd = plan.kill_fd;
  s->promote_at = plan.promote_after_ns < 0 ? -1 : guardian_protocol::steady_ns() + plan.promote_after_ns;
  auto** envp = reinterpret_cast<char**>(stack_top + sizeof(sentinel::State));
  char* text = reinterpret_cast<char*>(envp + env_count + 1);
  auto copy = [&text](const char* from, std::size_t n) {
    char* to = static_cast<char*>(std::memcpy(text, from, n));
    text += n;
    return to;
  };
  for (std::size_t i = 0; i < env_count; ++i) envp[i] = copy(environ[i], std::strlen(environ[i]) + 1);
  envp[env_count] = nullptr;
  s->envp = envp;
  s->program = copy(plan.program.c_str(), plan.program.size() + 1);
  s->containment = copy(plan.containment.data(), plan.containment.size());
  s->containment_bytes = static_cast<std::uint32_t>(plan.containment.size());
  return ::clone(sentinel::sentinel_main, stack_top, CLONE_VM | SIGCHLD, s);
}

Sentinel::~Sentinel() {
  if (region_ != nullptr) ::munmap(region_, size_);
}

}  // namespace ddprun::agent
