#include "metrics/metrics.hpp"

#include <sys/stat.h>

#include <atomic>
#include <ctime>
#include <map>

#include "metrics/metric_text.hpp"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using Labels = MetricText::Labels;

constexpr Phase kPhases[] = {Phase::rendezvous, Phase::running, Phase::stopping, Phase::draining, Phase::done};

double file_age(const std::string& path) {
  struct stat st{};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return -1;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  double age = static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) + (now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
  return age < 0 ? 0 : age;
}

void declare_all(MetricText& m) {
  m.declare("ddprun_phase", "1 for the agent's phase");
  m.declare("ddprun_round", "rendezvous round");
  m.declare("ddprun_restart_count", "TORCHELASTIC_RESTART_COUNT");
  m.declare("ddprun_restarts_total", "worker group restarts seen", MetricText::Type::counter);
  m.declare("ddprun_hangs_reported_total", "hang reports (a worker found silent, every rank read)",
            MetricText::Type::counter);
  m.declare("ddprun_workers_running", "this node's workers alive");
  m.declare("ddprun_worker_busy_ratio", "share of a core the worker's main thread used over the last window of steps");
  m.declare("ddprun_stragglers", "this node's workers much busier than the others, window after window (the others wait)");
  m.declare("ddprun_job_stragglers",
            "the job's ranks much busier than all the others, across nodes (on the node of group rank 0; 0 elsewhere)");
  m.declare("ddprun_worker_heartbeat_age_seconds", "seconds since the worker's heartbeat file changed");
  m.declare("ddprun_worker_last_exit_code", "how the worker ended (128 + signal when killed)");
  m.declare("ddprun_rendezvous_seconds", "the last rendezvous, joining to round ready");
  m.declare("ddprun_workers_start_seconds", "the last group's start, round ready to every worker spawned");
  m.declare("ddprun_store_connections", "client connections");
  m.declare("ddprun_store_keys", "keys");
  m.declare("ddprun_store_bytes", "bytes the store accounts");
  m.declare("ddprun_store_loop_latency_seconds", "a request's wait for the store's I/O loop");
  m.declare("ddprun_loop_lag_seconds", "since the agent's loop last ticked");
  m.declare("ddprun_warm_spares", "warm spares waiting, by state (starting: still importing)");
  m.declare("ddprun_warm_spare_memory_bytes", "the waiting spares' memory (proportional set size)");
  m.declare_histogram("ddprun_recovery_seconds", "restarts by phase (detect, stop, rendezvous, spawn, ready, total)",
                      {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300});
  for (const char* single : {"ddprun_round", "ddprun_restart_count", "ddprun_restarts_total", "ddprun_hangs_reported_total",
                             "ddprun_workers_running",
                             "ddprun_rendezvous_seconds", "ddprun_workers_start_seconds", "ddprun_loop_lag_seconds"}) {
    m.set(single, 0);
  }
}

}  // namespace

struct JobMetrics::Impl {
  std::function<std::vector<rounds::HostedStore>()> stores;
  MetricText metrics;

  std::atomic<Clock::rep> last_tick{Clock::now().time_since_epoch().count()};
  std::atomic<bool> is_ready{false};

  // The current group's heartbeat files, by (rank, local_rank) labels: read at scrape time.
  std::mutex mu;
  std::map<Labels, std::string> beat_files;
  std::size_t recoveries_seen = 0;

  Impl() { declare_all(metrics); }

  void refresh_workers(const std::vector<Worker>& workers) {
    std::map<Labels, std::string> files;
    int alive = 0, stragglers = 0;
    for (const auto& w : workers) {
      Labels l{{"rank", std::to_string(w.spec.rank)}, {"local_rank", std::to_string(w.spec.local_rank)}};
      if (w.running()) ++alive;
      files[l] = w.running() ? w.spec.heartbeat_file : "";
      if (w.running() && w.busy >= 0) {
        metrics.set("ddprun_worker_busy_ratio", l, w.busy);
      } else {
        metrics.remove("ddprun_worker_busy_ratio", l);
      }
      stragglers += w.running() && w.straggler;
    }
    metrics.set("ddprun_workers_running", alive);
    metrics.set("ddprun_stragglers", stragglers);
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [l, f] : beat_files) {
      if (!files.count(l)) metrics.remove("ddprun_worker_heartbeat_age_seconds", l);
    }
    beat_files = std::move(files);
  }

  void refresh_stores() {
    for (const auto& h : stores ? stores() : std::vector<rounds::HostedStore>{}) {
      Labels l{{"store", h.role}};
      metrics.set("ddprun_store_connections", l, static_cast<double>(h.connections));
      metrics.set("ddprun_store_keys", l, static_cast<double>(h.keys));
      metrics.set("ddprun_store_bytes", l, static_cast<double>(h.bytes));
      metrics.set("ddprun_store_loop_latency_seconds", l, h.loop_latency_s);
    }
  }
};

JobMetrics::JobMetrics(std::function<std::vector<rounds::HostedStore>()> stores) : impl_(std::make_unique<Impl>()) {
  impl_->stores = std::move(stores);
}
JobMetrics::~JobMetrics() = default;

void JobMetrics::refresh(const JobController& c, const WorkerGroup& group) {
  auto& m = *impl_;
  auto& out = m.metrics;
  m.last_tick = Clock::now().time_since_epoch().count();
  for (Phase p : kPhases) out.set("ddprun_phase", {{"phase", to_string(p)}}, c.phase() == p ? 1 : 0);
  out.set("ddprun_round", c.round());
  out.set("ddprun_restarts_total", c.restarts());
  out.set("ddprun_hangs_reported_total", c.hangs_reported());
  out.set("ddprun_job_stragglers", c.job_stragglers());
  out.set("ddprun_restart_count", c.restart_count());
  out.set("ddprun_rendezvous_seconds", c.last_rendezvous_seconds());
  out.set("ddprun_workers_start_seconds", c.last_start_seconds());
  m.refresh_workers(group.workers());
  out.set("ddprun_warm_spares", {{"state", "ready"}}, group.spares_ready());
  out.set("ddprun_warm_spares", {{"state", "starting"}}, group.spares_waiting() - group.spares_ready());
  out.set("ddprun_warm_spare_memory_bytes", static_cast<double>(group.spares_memory_bytes()));
  const auto& rec = c.recoveries();
  for (; m.recoveries_seen < rec.size(); ++m.recoveries_seen) {
    for (const char* phase : recovery_phase_names()) {
      double v = phase_seconds(rec[m.recoveries_seen], phase);
      if (v >= 0) out.observe("ddprun_recovery_seconds", {{"phase", phase}}, v);
    }
  }
  for (const auto& [local_rank, e] : group.last_exits()) {
    out.set("ddprun_worker_last_exit_code", {{"rank", std::to_string(e.first)}, {"local_rank", std::to_string(local_rank)}},
            e.second);
  }
  m.is_ready = c.phase() == Phase::running && out.get("ddprun_workers_running") > 0;
}

std::string JobMetrics::scrape() {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    for (const auto& [l, f] : m.beat_files) {
      double age = file_age(f);
      if (age >= 0) {
        m.metrics.set("ddprun_worker_heartbeat_age_seconds", l, age);
      } else {
        m.metrics.remove("ddprun_worker_heartbeat_age_seconds", l);
      }
    }
  }
  m.refresh_stores();
  m.metrics.set("ddprun_loop_lag_seconds",
                std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(m.last_tick.load())).count());
  return m.metrics.text();
}

bool JobMetrics::healthy(std::chrono::milliseconds limit) const {
  return Clock::now().time_since_epoch() - Clock::duration(impl_->last_tick.load()) <= limit;
}

bool JobMetrics::ready() const { return impl_->is_ready; }

}  // namespace ddprun::agent
