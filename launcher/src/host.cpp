// What the machine offers: CPUs this process may use, and the GPUs CUDA_VISIBLE_DEVICES leaves
// it, counted without CUDA (the driver's /proc entries, else NVML: ddprun/agent/gpus.hpp).
// Without a driver that is zero GPUs.

#include <sched.h>
#include <unistd.h>

#include "ddprun/agent/gpus.hpp"
#include "ddprun/launcher/cli.hpp"

namespace ddprun::launcher {
namespace {

int count_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int count_gpus() { return static_cast<int>(agent::find_visible_gpus().size()); }

}  // namespace

HostInfo probe_host() {
  HostInfo h;
  h.cpus = count_cpus();
  h.count_gpus = count_gpus;
  return h;
}

}  // namespace ddprun::launcher
