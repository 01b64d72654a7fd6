#include "ddprun/launcher/full_program.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "ddprun/agent/resources.hpp"

namespace ddprun::launcher {
namespace {

constexpr const char* kHandoffVar = "DDPRUN_HANDED_OFF";

}  // namespace

std::optional<std::string> openssl_use(const agent::AgentOptions& options) {
  if (options.rdzv.backend == rounds::BackendKind::etcd) return "the etcd rendezvous";
  if (!options.rdzv.secret.empty()) return "a store secret (--rdzv_conf secret_file, DDPRUN_SECRET_FILE)";
  return std::nullopt;
}

void exec_full_program(char** argv, const std::string& use) {
  const std::string full = agent::full_program();
  if (full.empty()) {
    std::fprintf(stderr,
                 "ddprun: error: this job uses %s, which needs ddprun-full (ddprun built with OpenSSL), and "
                 "ddprun-full is not beside this ddprun: install ddprun whole (its package, cmake --install, or "
                 "copy ddprun-full next to ddprun)\n",
                 use.c_str());
    return;
  }
  ::setenv(kHandoffVar, "1", 1);
  ::execv(full.c_str(), argv);
  const int e = errno;
  ::unsetenv(kHandoffVar);
  std::fprintf(stderr, "ddprun: error: cannot run %s (for %s): %s\n", full.c_str(), use.c_str(), std::strerror(e));
}

bool take_handoff_mark() {
  if (!::getenv(kHandoffVar)) return false;
  ::unsetenv(kHandoffVar);
  return true;
}

void keep_launcher_name(const char* argv0) {
  const char* base = argv0 ? std::strrchr(argv0, '/') : nullptr;
  base = base ? base + 1 : argv0;
  if (base && *base) ::prctl(PR_SET_NAME, base, 0, 0, 0);  // (the kernel keeps its first 15 bytes)
}

}  // namespace ddprun::launcher
