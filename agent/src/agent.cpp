// The agent: the composition root. It builds the parts (the run directory, the event log, the
// rendezvous, the worker group, the job controller), wires the loop's signals to them and runs
// the loop until the controller is done. Every decision is the controller's (job_controller.hpp).
#include "ddprun/agent/agent.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <boost/asio.hpp>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>

#include "ddprun/agent/gpus.hpp"
#include "containment/containment.hpp"
#include "ddprun/common/error.hpp"
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/system.hpp"
#include "observe/event_log.hpp"
#include "workers/fan_out.hpp"
#include "containment/guardian.hpp"
#include "control/job_controller.hpp"
#include "metrics/metrics.hpp"
#include "metrics/metrics_server.hpp"
#include "host/numa_binding.hpp"
#include "workers/output.hpp"
#include "workers/process_runner.hpp"
#include "workers/state_areas.hpp"
#include "workers/state_copies.hpp"
#include "workers/state_persister.hpp"
#include "containment/run_dir.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;

// Posts to the loop while it runs; after close(), a thread left behind posts into nothing.
class LoopGate {
 public:
  explicit LoopGate(asio::io_context& io) : state_(std::make_shared<State>(&io)) {}
  rounds::Post poster() const {
    return [s = state_](std::function<void()> f) {
      std::lock_guard<std::mutex> lk(s->mu);
      if (s->io) asio::post(*s->io, std::move(f));
    };
  }
  void close() {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->io = nullptr;
  }

 private:
  struct State {
    explicit State(asio::io_context* i) : io(i) {}
    std::mutex mu;
    asio::io_context* io;
  };
  std::shared_ptr<State> state_;
};

// The rendezvous' WhenReadable on this loop: a copy of the descriptor, watched once.
rounds::WhenReadable when_readable(asio::io_context& io) {
  return [&io](int fd, std::function<void()> f) {
    int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return f();  // (no descriptor left to copy: at once, as without the wait)
    auto d = std::make_shared<asio::posix::stream_descriptor>(io, copy);
    d->async_wait(asio::posix::stream_descriptor::wait_read, [d, f = std::move(f)](boost::system::error_code ec) {
      if (!ec) f();
    });
  };
}

// The descriptor table sized for the job at once, while the agent has one thread. The kernel
// grows it as descriptors are opened (64, 128, 256, ...), and in a process of several threads
// each growth waits for an RCU grace period (expand_fdtable): 20-30 ms each on a machine of 16
// CPUs, where 64 workers started from several threads took 52-57 ms instead of 17 (their pipes
// crossed 64 and 128), and where a store thread or a metrics thread also makes the agent
// several threads. Each worker takes two pipes, a store connection and its state area; the rest,
// 48 (about 20 at the start).
void reserve_descriptors(int workers) {
  rlimit lim{};
  if (workers <= 0 || ::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  long want = 4L * workers + 48;
  if (lim.rlim_cur != RLIM_INFINITY) want = std::min<long>(want, static_cast<long>(lim.rlim_cur) - 1);
  if (want < 64) return;  // within the table every process starts with
  for (int fd : {STDERR_FILENO, STDOUT_FILENO, STDIN_FILENO}) {
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(want));
    if (high >= 0) {
      ::close(high);
      return;
    }
  }
  // No standard descriptor open: the table grows as it must.
}

}  // namespace

struct Agent::Impl {
  AgentOptions opt;
  // First, while the process has one thread: the containment's names, the guardian told them,
  // and only then the cgroup made (establish() in the constructor), so that nothing is ever made
  // that the guardian does not know of.
  std::unique_ptr<Containment> containment = Containment::plan();
  Guardian guardian{containment.get()};
  GuardianFence fence{guardian};

  // The guardian outlives the whole teardown: the run directory (removed in run()) and the job's
  // cgroup (here) are gone before it is told to quit (~Guardian), so an agent killed at any
  // point leaves nothing behind.
  ~Impl() { containment.reset(); }

  explicit Impl(AgentOptions o) : opt(std::move(o)) {
    containment->establish();
    reserve_descriptors(opt.nproc_per_node);  // still one thread: the store's and others come in run()
    opt.rdzv.nproc = opt.nproc_per_node;
    auto& token = opt.base_env["DDPRUN_JOB_TOKEN"];  // what the guardian finds them by
    token = job_token_list(token, containment->token());
    spdlog::debug("ddprun: workers are contained by {}", containment->describe());
  }

  void open_events(EventLog& events, const std::string& node_name) {
    events.open(opt.events_file, node_name, opt.rdzv.run_id);
    events.emit("job_started", {{"nproc_per_node", opt.nproc_per_node},
                                {"min_nodes", opt.rdzv.min_nodes},
                                {"max_nodes", opt.rdzv.max_nodes},
                                {"max_restarts", opt.max_restarts},
                                {"containment", containment->describe()},
                                {"command", opt.command}});
  }

  // --numa_binding: each local rank's CPUs and NUMA node, from the machine's topology.
  void plan_binding() {
    if (opt.numa_binding.empty()) return;
    auto mode = parse_numa_mode(opt.numa_binding);
    if (!mode) throw UsageError("--numa_binding must be node, socket, exclusive or core-complex");
    auto topo = Topology::load();
    auto gpus = topo.gpu_numa_nodes();
    opt.bindings = plan_bindings(topo, opt.nproc_per_node, *mode, gpus);
    for (std::size_t i = 0; i < opt.bindings.size(); ++i) {
      auto line = fmt::format("ddprun: local rank {}: {}{}", i, describe_binding(opt.bindings[i]),
                              gpus.size() >= opt.bindings.size() ? " (nearest its GPU)" : "");
      if (opt.report_bindings) {
        spdlog::info("{}", line);
      } else {
        spdlog::debug("{}", line);
      }
    }
  }

  int run() {
    const auto job_start = std::chrono::steady_clock::now();
    plan_binding();
    const std::string node_name = opt.rdzv.local_addr.empty() ? host_name() : opt.rdzv.local_addr;
    RunDir dir(opt, [this](const std::string& temp) { guardian.own_directory(temp); });
    EventLog events;
    open_events(events, node_name);
    asio::io_context io{1};
    LoopGate gate(io);
    asio::signal_set signals(io);
    signals.add(SIGCHLD);
    for (int s : stop_signals()) signals.add(s);
    RealProcessRunner runner(guardian, *containment);
    auto rdzv = rounds::make_rendezvous(opt.rdzv, gate.poster(), &fence, when_readable(io));
    std::unique_ptr<JobMetrics> metrics;
    std::unique_ptr<MetricsServer> server;
    if (opt.metrics.port >= 0) {
      metrics = std::make_unique<JobMetrics>([r = rdzv.get()] { return r->hosted_stores(); });
      server = std::make_unique<MetricsServer>(
          MetricsServerOptions{opt.metrics.addr, static_cast<std::uint16_t>(opt.metrics.port)}, *metrics);
    }
    int code = run_loop(io, signals, runner, *rdzv, events, dir, node_name, metrics.get());
    server.reset();  // before the rendezvous whose stores it reads
    rdzv->shutdown();
    gate.close();
    flush_console(opt.redirects.any() || opt.tee.any());
    events.emit("job_finished", {{"exit_code", code},
                                 {"duration_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count()}});
    return code;
  }

  // Each local rank's state area, made now to outlive every attempt (docs/usage.md: In-memory
  // state); none with --no_state, or where memfd is refused (then the job runs without).
  std::unique_ptr<StateAreas> make_state_areas() const {
    if (opt.state_memory == 0) return nullptr;
    const auto usable = usable_memory_bytes();
    const auto budget = opt.state_memory > 0 ? static_cast<std::uint64_t>(opt.state_memory)
                                              : static_cast<std::uint64_t>(static_cast<double>(usable) * kDefaultStateShare);
    try {
      if (opt.state_memory > 0 && usable > 0 && budget > usable) {
        spdlog::warn("ddprun: --state_memory ({} MB) is more than this node's memory ({} MB{}): saves that fill it "
                     "would push the job out of memory; give less, or leave the flag out (a quarter of it)",
                     budget >> 20, usable >> 20, " or ddprun's cgroup memory limit");
      }
      auto areas = std::make_unique<StateAreas>(opt.nproc_per_node, budget);
      if (areas->ranks() == 0) return nullptr;
      spdlog::debug("ddprun: in-memory state: {} MB per local rank ({} MB for the node{}; a save holds at most half)",
                   areas->bytes_per_rank() >> 20, budget >> 20,
                   opt.state_memory > 0 ? "" : fmt::format(", a quarter of {} MB", usable >> 20));
      return areas;
    } catch (const Error& e) {
      spdlog::warn("ddprun: no in-memory state for the workers: {}", e.what());
      return nullptr;
    }
  }

  int run_loop(asio::io_context& io, asio::signal_set& signals, ProcessRunner& runner, Rendezvous& rdzv,
               EventLog& events, RunDir& dir, const std::string& node_name, JobMetrics* metrics) {
    WorkerGroup::Options wo = WorkerGroup::Options::from(opt);
    // Only where the NVIDIA driver runs: NVML is loaded then, at the first failed group, and
    // kept to the job's end.
    if (::access("/proc/driver/nvidia", F_OK) == 0) {
      wo.gpu_holders = [holders = std::make_shared<GpuMemoryHolders>()](const std::vector<pid_t>& pids) {
        return (*holders)(pids);
      };
    }
    WorkerGroup group(io, runner, wo);
    auto state = make_state_areas();
    // Ends after the workers, so that their last persist requests land before the agent exits.
    // Its threads start at the first request, which the loop looks for until then.
    std::optional<StatePersister> persister;
    if (state) persister.emplace(*state);
    asio::steady_timer persist_poll(io);
    std::function<void()> watch_persist = [&] {
      try {
        if (persister->asked()) return;
      } catch (const Error& e) {
        spdlog::warn("ddprun: the workers' persist requests are not served: {}", e.what());
        return;
      }
      // (Once a second: a thousand agents of workers that never persist, sharing a machine, once
      // spent a core looking five times a second.)
      persist_poll.expires_after(std::chrono::seconds(1));
      persist_poll.async_wait([&](boost::system::error_code ec) {
        if (!ec) watch_persist();
      });
    };
    if (persister) watch_persist();
    JobController controller(opt, group, rdzv, events, dir, node_name, &fence, state.get());
    // In a job of several nodes, each rank's saved state follows the rank between nodes, and each
    // node's is copied to a buddy node; its threads start with the first round. Ends before the
    // controller, which its thread's last word would reach.
    std::unique_ptr<StateCopies> copies;
    if (state && opt.rdzv.multi_node()) {
      copies = std::make_unique<StateCopies>(*state, node_name, static_cast<std::uint64_t>(opt.state_copy_rate),
                                             2 * state->bytes_per_rank() * static_cast<std::uint64_t>(state->ranks()),
                                             opt.rdzv.secret, opt.rdzv.run_id);
      controller.use_state_copies(copies.get(), [&io](std::function<void()> f) { asio::post(io, std::move(f)); });
    }
    // Once a second the loop shows the job to the metrics: /healthz also proves the loop turns.
    asio::steady_timer tick(io);
    std::function<void()> refresh = [&] {
      metrics->refresh(controller, group);
      tick.expires_after(std::chrono::seconds(1));
      tick.async_wait([&](boost::system::error_code ec) {
        if (!ec) refresh();
      });
    };
    std::function<void()> wait_signals = [&] {
      signals.async_wait([&](boost::system::error_code ec, int sig) {
        if (ec) return;
        if (sig == SIGCHLD) {
          group.reap();
        } else {
          controller.on_signal(sig);
        }
        wait_signals();
      });
    };
    wait_signals();
    if (opt.nproc_per_node > 1 && !opt.base_env.count("OMP_NUM_THREADS")) {
      spdlog::info("ddprun: OMP_NUM_THREADS=1 for each worker (set it to override)");
    }
    controller.start();
    if (metrics) refresh();
    while (controller.phase() != Phase::done) io.run_one();
    if (metrics) metrics->refresh(controller, group);
    return controller.exit_code();
  }
};

namespace {

// Before Impl, whose guardian is the first process forked.
AgentOptions checked(AgentOptions options) {
  check_fan_out(options.nproc_per_node, agent_tasks(options.nproc_per_node, options.metrics.port >= 0,
                                                    options.rdzv.backend != rounds::BackendKind::single_node));
  return options;
}

}  // namespace

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(checked(std::move(options)))) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }

}  // namespace ddprun::agent
