#include "metrics.hpp"

#include <sys/stat.h>

#include <atomic>
#include <ctime>
#include <map>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sstream>

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using prometheus::Gauge;

constexpr Phase kPhases[] = {Phase::rendezvous, Phase::running, Phase::stopping, Phase::draining, Phase::done};

double file_age(const std::string& path) {
  struct stat st{};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return -1;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  double age = static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) + (now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
  return age < 0 ? 0 : age;
}

}  // namespace

struct JobMetrics::Impl {
  std::function<std::vector<rounds::HostedStore>()> stores;
  prometheus::Registry registry;
  prometheus::Family<Gauge>& phase = prometheus::BuildGauge().Name("ddprun_phase").Help("1 for the agent's phase").Register(registry);
  Gauge& round = prometheus::BuildGauge().Name("ddprun_round").Help("rendezvous round").Register(registry).Add({});
  Gauge& restart_count =
      prometheus::BuildGauge().Name("ddprun_restart_count").Help("TORCHELASTIC_RESTART_COUNT").Register(registry).Add({});
  prometheus::Counter& restarts =
      prometheus::BuildCounter().Name("ddprun_restarts_total").Help("worker group restarts seen").Register(registry).Add({});
  Gauge& running =
      prometheus::BuildGauge().Name("ddprun_workers_running").Help("this node's workers alive").Register(registry).Add({});
  prometheus::Family<Gauge>& beat_age = prometheus::BuildGauge()
                                            .Name("ddprun_worker_heartbeat_age_seconds")
                                            .Help("seconds since the worker's heartbeat file changed")
                                            .Register(registry);
  prometheus::Family<Gauge>& exit_code = prometheus::BuildGauge()
                                             .Name("ddprun_worker_last_exit_code")
                                             .Help("how the worker ended (128 + signal when killed)")
                                             .Register(registry);
  Gauge& rendezvous_s = prometheus::BuildGauge()
                            .Name("ddprun_rendezvous_seconds")
                            .Help("the last rendezvous, joining to round ready")
                            .Register(registry)
                            .Add({});
  Gauge& start_s = prometheus::BuildGauge()
                       .Name("ddprun_workers_start_seconds")
                       .Help("the last group's start, round ready to every worker spawned")
                       .Register(registry)
                       .Add({});
  prometheus::Family<Gauge>& store_conns =
      prometheus::BuildGauge().Name("ddprun_store_connections").Help("client connections").Register(registry);
  prometheus::Family<Gauge>& store_keys = prometheus::BuildGauge().Name("ddprun_store_keys").Help("keys").Register(registry);
  prometheus::Family<Gauge>& store_bytes =
      prometheus::BuildGauge().Name("ddprun_store_bytes").Help("bytes the store accounts").Register(registry);
  prometheus::Family<Gauge>& store_latency = prometheus::BuildGauge()
                                                 .Name("ddprun_store_loop_latency_seconds")
                                                 .Help("a request's wait for the store's I/O loop")
                                                 .Register(registry);
  Gauge& loop_lag =
      prometheus::BuildGauge().Name("ddprun_loop_lag_seconds").Help("since the agent's loop last ticked").Register(registry).Add({});

  std::atomic<Clock::rep> last_tick{Clock::now().time_since_epoch().count()};
  std::atomic<bool> is_ready{false};

  // The current group's heartbeat files, by (rank, local_rank) labels: read at scrape time.
  std::mutex mu;
  std::map<prometheus::Labels, std::string> beat_files;

  void refresh_workers(const std::vector<Worker>& workers) {
    std::map<prometheus::Labels, std::string> files;
    int alive = 0;
    for (const auto& w : workers) {
      prometheus::Labels l{{"rank", std::to_string(w.spec.rank)}, {"local_rank", std::to_string(w.spec.local_rank)}};
      if (w.running()) ++alive;
      files[l] = w.running() ? w.spec.heartbeat_file : "";
    }
    running.Set(alive);
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [l, f] : beat_files) {
      if (!files.count(l) && beat_age.Has(l)) beat_age.Remove(&beat_age.Add(l));
    }
    beat_files = std::move(files);
  }

  void refresh_stores() {
    for (const auto& h : stores ? stores() : std::vector<rounds::HostedStore>{}) {
      prometheus::Labels l{{"store", h.role}};
      store_conns.Add(l).Set(static_cast<double>(h.connections));
      store_keys.Add(l).Set(static_cast<double>(h.keys));
      store_bytes.Add(l).Set(static_cast<double>(h.bytes));
      store_latency.Add(l).Set(h.loop_latency_s);
    }
  }
};

JobMetrics::JobMetrics(std::function<std::vector<rounds::HostedStore>()> stores) : impl_(std::make_unique<Impl>()) {
  impl_->stores = std::move(stores);
}
JobMetrics::~JobMetrics() = default;

void JobMetrics::refresh(const JobController& c, const WorkerGroup& group) {
  auto& m = *impl_;
  m.last_tick = Clock::now().time_since_epoch().count();
  for (Phase p : kPhases) m.phase.Add({{"phase", to_string(p)}}).Set(c.phase() == p ? 1 : 0);
  m.round.Set(c.round());
  m.restarts.Increment(c.restarts() - m.restarts.Value());
  m.restart_count.Set(c.restart_count());
  m.rendezvous_s.Set(c.last_rendezvous_seconds());
  m.start_s.Set(c.last_start_seconds());
  m.refresh_workers(group.workers());
  for (const auto& [local_rank, e] : group.last_exits()) {
    m.exit_code.Add({{"rank", std::to_string(e.first)}, {"local_rank", std::to_string(local_rank)}}).Set(e.second);
  }
  m.is_ready = c.phase() == Phase::running && m.running.Value() > 0;
}

std::string JobMetrics::scrape() {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    for (const auto& [l, f] : m.beat_files) {
      double age = file_age(f);
      if (age >= 0) {
        m.beat_age.Add(l).Set(age);
      } else if (m.beat_age.Has(l)) {
        m.beat_age.Remove(&m.beat_age.Add(l));
      }
    }
  }
  m.refresh_stores();
  m.loop_lag.Set(std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(m.last_tick.load())).count());
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, m.registry.Collect());
  return out.str();
}

bool JobMetrics::healthy(std::chrono::milliseconds limit) const {
  return Clock::now().time_since_epoch() - Clock::duration(impl_->last_tick.load()) <= limit;
}

bool JobMetrics::ready() const { return impl_->is_ready; }

}  // namespace ddprun::agent
