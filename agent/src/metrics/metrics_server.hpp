#pragma once
// The agent's HTTP endpoint (--metrics_port): GET /metrics (Prometheus text format), /healthz
// (200 while the agent's loop runs its tick), /readyz (200 while workers run); anything else is
// refused (404 for another path, 405 for another method). It runs on a thread of its own with its
// own I/O loop, so clients never touch the agent's loop, and every client is bounded: one request
// per connection, headers up to kMaxHeader bytes, kDeadline to send it and read the answer, at
// most kMaxClients at once. A newcomer beyond that takes the place of the connection that has
// waited longest without sending its request (so a flood of idle connections cannot lock a probe
// out); it is closed at once only when every place is busy answering.

#include <cstdint>
#include <memory>
#include <string>

namespace ddprun::agent {

class JobMetrics;

struct MetricsServerOptions {
  std::string addr;            // empty: every interface
  std::uint16_t port = 0;      // 0: a free port (read it back with port())
};

class MetricsServer {
 public:
  static constexpr std::size_t kMaxHeader = 8 * 1024;
  static constexpr int kMaxClients = 32;

  // Binds at once; throws ddprun::Error naming the address when it cannot. `metrics` must
  // outlive the server.
  MetricsServer(MetricsServerOptions options, JobMetrics& metrics);
  ~MetricsServer();  // stops and joins its thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  std::uint16_t port() const;
  std::size_t refused() const;  // newcomers closed at once: kMaxClients were being answered

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
