#pragma once
// Names that do not resolve yet. On Kubernetes a pod's DNS name (a JobSet's <job>-node-0-0.<job>,
// a PyTorchJob's <job>-worker-0) exists only once that pod has started and its headless service
// has caught up, so a node that starts first waits for the master's or the rendezvous's name
// instead of failing (no init container running nslookup in a loop). Bounded by the join
// time-out; said once.

#include <atomic>
#include <chrono>
#include <string>
#include <vector>


namespace ddprun::rounds {

class NameWait {
 public:
  using Clock = std::chrono::steady_clock;

  // `names`: where the backend is (any one resolving will do); `flag`: where the user set them,
  // for the message ("--master_addr"); `join_timeout`: the join's, which the message names.
  NameWait(std::vector<std::string> names, std::string flag, std::chrono::milliseconds join_timeout)
      : names_(std::move(names)), flag_(std::move(flag)), join_timeout_(join_timeout) {}

  // Returns once one of the names resolves (at once for an address, or a name that resolves).
  // Until then looks it up again with a growing pause (up to 1 s); the first wait is said at
  // info. Throws TimeoutError `timeout` from now, naming the names, that time, the setting it is
  // when it is the join's ("--rdzv_conf join_timeout"; the connections made after the join, whose
  // names have resolved, and a stop's announcement, which gets a second, name none) and what to check.
  void until(std::chrono::milliseconds timeout);

 private:
  const std::vector<std::string> names_;
  const std::string flag_;
  const std::chrono::milliseconds join_timeout_;
  std::atomic<bool> said_{false};  // the wait was logged (once per backend)
};

}  // namespace ddprun::rounds
