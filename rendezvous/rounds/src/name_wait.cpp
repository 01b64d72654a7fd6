#include "name_wait.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/text.hpp"

namespace ddprun::rounds {
namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void NameWait::until(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto pause = std::chrono::milliseconds(50);
  for (bool waited = false;; waited = true) {
    for (const auto& n : names_) {
      auto addrs = resolve_host(n);
      if (addrs.empty()) continue;
      if (waited) {
        spdlog::info("ddprun: {} resolves to {} after {:.1f} s", n, addrs.front(),
                     std::chrono::duration<double>(Clock::now() - start).count());
      }
      return;
    }
    if (!said_.exchange(true)) {
      spdlog::info("ddprun: waiting for {} to resolve (Kubernetes creates it when the pod starts)", listed(names_));
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      // The bound the user set, not the time measured: a lookup that outlasts it on a loaded
      // machine (1.6 s for a 1.5 s join time-out in a CI run) does not change what to fix.
      throw TimeoutError("rendezvous: " + std::string(names_.size() > 1 ? "none of " : "") + listed(names_) +
                         (names_.size() > 1 ? " resolved" : " did not resolve") + " within " + duration_text(timeout) +
                         (timeout == join_timeout_ ? " (--rdzv_conf join_timeout)" : "") + ": check " + flag_ +
                         ", and on Kubernetes that the pod or service it names exists and is running (kubectl get pods,svc)");
    }
    // A lookup again after a pause: nothing tells this process when DNS learns the name.
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace ddprun::rounds
