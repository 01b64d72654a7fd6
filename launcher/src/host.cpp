// What the machine offers: CPUs this process may use, and CUDA devices, counted through the CUDA
// runtime if it can be loaded (dlopen: the launcher does not link CUDA). Without a GPU or a
// driver, cudaGetDeviceCount fails; that counts as zero GPUs.

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include "ddprun/launcher/cli.hpp"

namespace ddprun::launcher {
namespace {

int count_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int count_gpus() {
  for (const char* lib : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so"}) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    using Fn = int (*)(int*);
    auto fn = reinterpret_cast<Fn>(dlsym(h, "cudaGetDeviceCount"));
    int n = 0;
    int rc = fn ? fn(&n) : -1;
    dlclose(h);
    return rc == 0 ? n : 0;
  }
  return 0;
}

}  // namespace

HostInfo probe_host() {
  HostInfo h;
  h.cpus = count_cpus();
  h.count_gpus = count_gpus;
  return h;
}

}  // namespace ddprun::launcher
