#pragma once
// store_bench: the servers under test (ddprun-store, PyTorch's TCPStore server) as child
// processes, pinned to CPU 1, and what /proc says about them.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace store_bench {

// On a machine with >= 2 CPUs the generator runs on CPU 0 and the server under test on CPU 1,
// for both servers alike: without it the scheduler sometimes stacks them on one core, and runs
// vary by 30 %.
void pin_to_cpu(int cpu);

struct Server {
  std::string name;
  std::string banner;  // the first line it printed
  pid_t pid = -1;
  int stdin_fd = -1;
  std::uint16_t port = 0;

  // Starts `argv` and reads its first line ("listening on HOST:PORT ..."). Throws
  // std::runtime_error when it does not print one within 60 s.
  static Server spawn(std::string name, std::vector<std::string> argv);
  // CPU seconds (user + system) the server has used so far.
  double cpu_seconds() const;
  // Waits (at most 10 s) until the server has used no CPU for 100 ms: after 10,000 clients
  // leave, a server may still be closing their connections, and both servers share CPU 1, so
  // the next measurement would otherwise pay for the previous server's clean-up.
  void wait_idle() const;
  // Peak resident memory so far (VmHWM), MiB.
  double peak_rss_mib() const;
  void stop();
};

}  // namespace store_bench
