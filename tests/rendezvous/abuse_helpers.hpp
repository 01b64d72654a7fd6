#pragma once
// Helpers of the abuse tests (abuse_test.cpp, limits_test.cpp): clients, a pinger measuring how
// fast a well-behaved client is served meanwhile, a small server's limits.

#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/tcp_store.hpp"
#include "helpers.hpp"
#include "store_process.hpp"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::test;

namespace {

// Pings the server from its own connection every few milliseconds until stopped; records every
// round trip (the slowest, the 99th percentile).
class Pinger {
 public:
  explicit Pinger(std::uint16_t port) : raw_(Raw::speaking(Dialect::kV2, port)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        auto t0 = Clock::now();
        bool ok = false;
        try {
          ok = raw_.ping_is_next();
        } catch (const ddprun::Error&) {
          stop_ = true;
        }
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
        samples_us_.push_back(us);  // read only after finish() joins this thread
        worst_ms_ = std::max<long>(worst_ms_, us / 1000);
        failed_ = failed_ || !ok;
        ++count_;
        std::this_thread::sleep_for(5ms);  // pacing of the probe, not synchronisation
      }
    });
  }
  // After finish(): the 99th percentile of the round trips, in milliseconds.
  double p99_ms() {
    if (samples_us_.empty()) return 0;
    std::sort(samples_us_.begin(), samples_us_.end());
    return samples_us_[std::min(samples_us_.size() - 1, samples_us_.size() * 99 / 100)] / 1000.0;
  }
  ~Pinger() { finish(); }
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  long worst_ms() const { return worst_ms_; }
  int count() const { return count_; }
  bool failed() const { return failed_; }

 private:
  Raw raw_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<long> worst_ms_{0};
  std::atomic<int> count_{0};
  std::atomic<bool> failed_{false};
  std::vector<long> samples_us_;
};

const std::vector<std::string> kSmallServer = {
    "--max_value_bytes", "1M", "--max_reply_bytes", "4M", "--output_high_water_bytes", "1M",
    "--max_pending_output_bytes", "16M", "--log_level", "info"};
constexpr double kCapMiB = 16;

}  // namespace
