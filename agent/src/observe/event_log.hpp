#pragma once
// The machine-readable event log (--events_file, DDPRUN_EVENTS_FILE): JSON Lines, one object per
// event, each written with one write() as it happens, so a dashboard or scheduler tailing the
// file sees whole lines. Every event carries "event", "ts" (UTC, ISO 8601, milliseconds),
// "host" and "run_id". The schema is in the README.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ddprun::agent {

class EventLog {
 public:
  EventLog() = default;
  // Opens (appends to) `path`, 0600, not following a link. Throws ddprun::Error naming the path.
  void open(const std::string& path, std::string host, std::string run_id);
  ~EventLog();
  bool enabled() const { return fd_ >= 0; }
  // Adds the common fields and writes one line. A write error is reported once and ends the log
  // (the job goes on).
  void emit(const std::string& event, nlohmann::json fields = nlohmann::json::object());

 private:
  int fd_ = -1;
  std::string host_, run_id_;
};

// The kernel's OOM-kill count for this process's cgroup (cgroup v2 memory.events); nullopt where
// it cannot be read. A worker SIGKILLed while it grows counts as killed by the OOM killer.
std::optional<long long> cgroup_oom_kills();

}  // namespace ddprun::agent
