#include "workers/process_runner.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <mutex>

#include "ddprun/agent/spawn.hpp"
#include "ddprun/common/error.hpp"
#include "containment/containment.hpp"
#include "containment/guardian.hpp"
#include "workers/spawn_pool.hpp"
#include "observe/agent_helpers.hpp"
#include "observe/stack_dump.hpp"

namespace ddprun::agent {

std::string ProcessRunner::start_all(const std::vector<Request>& requests, std::vector<Started>& started) {
  return start_each(requests, started, [](std::size_t n, const std::function<void(std::size_t)>& one) {
    for (std::size_t i = 0; i < n; ++i) one(i);
  });
}

std::string ProcessRunner::start_each(const std::vector<Request>& requests, std::vector<Started>& started,
                                      const std::function<void(std::size_t, const std::function<void(std::size_t)>&)>& run) {
  started.assign(requests.size(), Started{});
  std::mutex mu;
  std::string failure;
  std::atomic<bool> failed{false};
  run(requests.size(), [&](std::size_t i) {
    if (failed.load(std::memory_order_relaxed)) return;  // after a failure, nothing more starts
    try {
      started[i] = start(*requests[i].argv, *requests[i].env, requests[i].binding, requests[i].state_fd);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(mu);
      if (failure.empty()) failure = e.what();
      failed = true;
    }
  });
  return failure;
}

ProcessRunner::Started ProcessRunner::start_spare(const std::vector<std::string>&, const std::vector<std::string>&,
                                                  const CpuBinding*, int, int, int) {
  throw Error("this process runner cannot start warm spares");
}

RealProcessRunner::RealProcessRunner(Guardian& guardian, const Containment& containment)
    : guardian_(guardian), containment_(containment) {}
RealProcessRunner::~RealProcessRunner() = default;

std::string RealProcessRunner::start_all(const std::vector<Request>& requests, std::vector<Started>& started) {
  const unsigned threads = spawn_threads(requests.size());
  if (threads <= 1) return ProcessRunner::start_all(requests, started);
  if (!pool_) pool_ = std::make_unique<SpawnPool>();
  pool_->ensure(threads - 1);
  return start_each(requests, started, [&](std::size_t n, const std::function<void(std::size_t)>& one) {
    pool_->run(n, one);
  });
}

ProcessRunner::Started RealProcessRunner::start(const std::vector<std::string>& argv,
                                                const std::vector<std::string>& env, const CpuBinding* binding,
                                                int state_fd) {
  auto p = spawn_process(argv, env, binding, containment_.cgroup_target(), -1, -1, state_fd);
  return Started{p.pid, p.stdout_fd, p.stderr_fd};
}

ProcessRunner::Started RealProcessRunner::start_spare(const std::vector<std::string>& argv,
                                                      const std::vector<std::string>& env, const CpuBinding* binding,
                                                      int order_fd, int ready_fd, int state_fd) {
  auto p = spawn_process(argv, env, binding, containment_.cgroup_target(), order_fd, ready_fd, state_fd);
  {
    std::lock_guard<std::mutex> lk(spares_mu_);
    spares_.insert(p.pid);  // not swept between attempts
  }
  return Started{p.pid, p.stdout_fd, p.stderr_fd};
}

void RealProcessRunner::signal_group(pid_t pgid, int sig) { ::kill(-pgid, sig); }

std::vector<ProcessRunner::Ended> RealProcessRunner::reap() {
  std::vector<Ended> out;
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) out.push_back(Ended{pid, ExitStatus::from_wait_status(status)});
  return out;
}

void RealProcessRunner::watch(const std::vector<pid_t>& pgids) { guardian_.watch(pgids); }
void RealProcessRunner::forget(pid_t pgid) {
  guardian_.forget(pgid);
  std::lock_guard<std::mutex> lk(spares_mu_);
  spares_.erase(pgid);
}

void RealProcessRunner::spare_runs_worker(pid_t pid) {
  std::lock_guard<std::mutex> lk(spares_mu_);
  spares_.erase(pid);
}

std::string RealProcessRunner::native_stack(pid_t pid, std::chrono::milliseconds limit) {
  return native_stack_text(pid, limit);
}

std::vector<StackTargets> RealProcessRunner::stack_targets(const std::vector<pid_t>& workers) {
  auto tree = ProcessTree::read();
  std::vector<StackTargets> out;
  for (pid_t w : workers) out.push_back(tree.stack_targets(w));
  return out;
}

void RealProcessRunner::signal_process(pid_t pid, int sig) { ::kill(pid, sig); }

void RealProcessRunner::signal_main_thread(pid_t pid, int sig) { ::syscall(SYS_tgkill, pid, pid, sig); }

ProcSample RealProcessRunner::sample(pid_t pid) {
  ProcSample p;
  const std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream stat(dir + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return p;
  // "PID (comm) S ppid ...": the name may hold spaces and parentheses; the state follows the last ')'.
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return p;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::vector<std::string> fields;
  while (rest >> field) fields.push_back(field);
  if (fields.size() < 13) return p;
  p.state = fields[0][0];
  std::ifstream sched(dir + "/schedstat");  // "ON_CPU_NS WAIT_NS SLICES": the main thread's
  long long on = -1, waiting = -1;
  if (sched >> on >> waiting) {
    p.cpu_ns = on;
    p.busy_ns = on + waiting;
  }
  std::ifstream status(dir + "/status");
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) == 0) p.caught = std::stoull(line.substr(7), nullptr, 16);
  }
  return p;
}

std::vector<std::string> RealProcessRunner::sweep() {
  std::set<pid_t> exempt = agent_helpers();
  {
    std::lock_guard<std::mutex> lk(spares_mu_);
    exempt.insert(spares_.begin(), spares_.end());
  }
  return containment_.sweep(guardian_.pid(), exempt);
}

}  // namespace ddprun::agent
