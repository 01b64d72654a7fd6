#include "workers/fan_out.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include "ddprun/common/error.hpp"
#include "spawn_pool.hpp"

namespace ddprun::agent {
namespace {

constexpr std::uint64_t kAgentDescriptors = 64;   // the store's reserve for its host, fixed part
constexpr std::uint64_t kDescriptorsPerWorker = 9;  // 8 reserved (pipes, logs) + 1 store connection
constexpr std::uint64_t kUnlimited = ~std::uint64_t{0};

std::uint64_t value(rlim_t r) { return r == RLIM_INFINITY ? kUnlimited : static_cast<std::uint64_t>(r); }

}  // namespace

std::uint64_t descriptors_needed(int nproc) {
  return kAgentDescriptors + kDescriptorsPerWorker * static_cast<std::uint64_t>(nproc < 0 ? 0 : nproc);
}

std::uint64_t agent_tasks(int nproc, bool metrics, bool rendezvous) {
  std::uint64_t n = 5 + (spawn_threads(static_cast<std::size_t>(nproc < 0 ? 0 : nproc)) - 1);
  if (metrics) n += 1;
  if (rendezvous) n += 4;
  return n;
}

std::optional<std::string> fan_out_refusal(int nproc, const FanOutLimits& limits, std::uint64_t agent_tasks) {
  const std::string n = "--nproc_per_node=" + std::to_string(nproc);
  const std::uint64_t fds = descriptors_needed(nproc);
  if (fds > limits.open_files) {
    return n + " needs " + std::to_string(fds) + " open files (64 + 9 a worker) but RLIMIT_NOFILE (ulimit -n) is " +
           std::to_string(limits.open_files) + ": raise it (ulimit -n " + std::to_string(fds) +
           ", or LimitNOFILE= in a systemd unit) or start fewer workers";
  }
  // The kernel counts every thread of the user against RLIMIT_NPROC: the agent's threads and its
  // guardian count too; the user's other processes, and the workers' own threads, are not known here.
  const std::uint64_t procs = static_cast<std::uint64_t>(nproc) + agent_tasks;
  if (limits.processes != 0 && procs > limits.processes) {
    return n + " needs " + std::to_string(procs) + " processes and threads (the workers, then " +
           std::to_string(agent_tasks) + " of the agent: its threads and its guardian) but RLIMIT_NPROC (ulimit -u), " +
           "which counts threads, is " + std::to_string(limits.processes) +
           ": raise it (ulimit -u, LimitNPROC= in a systemd unit) well above that, since the workers' own threads count " +
           "too, or start fewer workers";
  }
  return std::nullopt;
}

void check_fan_out(int nproc, std::uint64_t agent_tasks) {
  FanOutLimits limits;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    // Raised only when the soft limit is short (workers inherit it; a hosted store raises it anyway).
    if (value(lim.rlim_cur) < descriptors_needed(nproc) && lim.rlim_cur < lim.rlim_max) {
      rlimit raised = lim;
      raised.rlim_cur = lim.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
    }
    limits.open_files = value(lim.rlim_cur);
  } else {
    limits.open_files = kUnlimited;
  }
  // RLIMIT_NPROC does not apply to root (nor to CAP_SYS_RESOURCE, which root has).
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    limits.processes = value(lim.rlim_cur);
  }
  if (auto why = fan_out_refusal(nproc, limits, agent_tasks)) throw UsageError(*why);
}

}  // namespace ddprun::agent
