#pragma once
// What an agent shows to Prometheus and to Kubernetes probes (README: Operating ddprun). The loop
// refreshes a snapshot of the job once a second (JobMetrics::refresh, on the loop thread); the
// HTTP server's thread serializes it (scrape) and answers the probes. Neither side waits for the
// other beyond a short lock: a slow scrape never delays supervision.
//
// Metrics (gauges unless said):
//   ddprun_phase{phase}                      1 for the controller's phase, 0 for the others
//   ddprun_round, ddprun_restart_count       the rendezvous round; TORCHELASTIC_RESTART_COUNT
//   ddprun_restarts_total (counter)          restarts of the worker group seen by this agent
//   ddprun_hangs_reported_total (counter)    hang reports: a worker found silent (README: Hangs)
//   ddprun_workers_running                   this node's workers alive
//   ddprun_worker_busy_ratio{rank,local_rank}  its main thread's share of a core over the last window
//   ddprun_stragglers                        this node's workers named stragglers (README: Hangs)
//   ddprun_job_stragglers                    the job's ranks named stragglers across nodes (group rank 0)
//   ddprun_worker_heartbeat_age_seconds{rank,local_rank}   since the heartbeat file last changed
//   ddprun_worker_last_exit_code{rank,local_rank}          how each worker of the last group ended
//   ddprun_rendezvous_seconds                the last rendezvous, from joining to the round ready
//   ddprun_workers_start_seconds             the last group's start, ready to every worker spawned
//   ddprun_store_connections{store}, ddprun_store_keys{store}, ddprun_store_bytes{store},
//   ddprun_store_loop_latency_seconds{store} the stores this agent hosts ("rendezvous", "workers")
//   ddprun_loop_lag_seconds                  since the agent's loop last ran its tick
//   ddprun_warm_spares{state}, ddprun_warm_spare_memory_bytes   warm spares waiting, their memory
//   ddprun_recovery_seconds{phase} (histogram)  each restart by phase, and its total (recovery_clock.hpp)

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddprun/rounds/rendezvous.hpp"
#include "control/job_controller.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent {

class JobMetrics {
 public:
  // `stores`: the stores this agent hosts, read at scrape time (from the server's thread).
  explicit JobMetrics(std::function<std::vector<rounds::HostedStore>()> stores);
  ~JobMetrics();

  // Loop thread: the controller's state and the group's workers, as they are now.
  void refresh(const JobController& c, const WorkerGroup& group);

  // Any thread.
  std::string scrape();
  // The loop ran its tick within `limit` (the agent is alive, not wedged).
  bool healthy(std::chrono::milliseconds limit = std::chrono::seconds(5)) const;
  // Workers are running (phase running, at least one alive).
  bool ready() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
