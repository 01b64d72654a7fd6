#include "observe/agent_helpers.hpp"

#include <mutex>

namespace ddprun::agent {
namespace {

std::mutex helpers_mu;
std::set<pid_t> helpers;

}  // namespace

void note_agent_helper(pid_t pid) {
  std::lock_guard<std::mutex> lk(helpers_mu);
  helpers.insert(pid);
}

void forget_agent_helper(pid_t pid) {
  std::lock_guard<std::mutex> lk(helpers_mu);
  helpers.erase(pid);
}

std::set<pid_t> agent_helpers() {
  std::lock_guard<std::mutex> lk(helpers_mu);
  return helpers;
}

}  // namespace ddprun::agent
