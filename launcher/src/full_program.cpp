#include "ddprun/launcher/full_program.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ddprun/agent/resources.hpp"

namespace ddprun::launcher {

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
  ::execv(full.c_str(), argv);
  std::fprintf(stderr, "ddprun: error: cannot run %s (for %s): %s\n", full.c_str(), use.c_str(), std::strerror(errno));
}

}  // namespace ddprun::launcher
