#include "connection.hpp"

#include <spdlog/spdlog.h>

namespace ddprun::rendezvous {
namespace {

constexpr std::size_t kMaxLogged = 4096;

}  // namespace

StoreLimits store_limits(const StoreServerOptions& o) {
  StoreLimits l;
  l.max_value_bytes = o.limits.max_value_bytes;
  l.max_reply_bytes = o.max_reply_bytes;
  l.max_store_bytes = o.max_store_bytes;
  l.max_waits_per_connection = o.max_waits_per_connection;
  l.max_watches_per_connection = o.max_watches_per_connection;
  l.max_queue_length = o.max_queue_length;
  return l;
}

void ServerContext::log_once(const std::string& key, const std::string& line) {
  if (logged.count(key)) return;
  if (logged.size() >= kMaxLogged) {
    if (logged.size() == kMaxLogged) {
      spdlog::warn("store: {} distinct refusals logged; further ones are not", kMaxLogged);
      logged.insert("");
    }
    return;
  }
  logged.insert(key);
  spdlog::warn("{}", line);
}

void ServerContext::CountedLog::note(const std::string& why) {
  ++unlogged;
  auto now = SteadyClock::now();
  if (now - last >= std::chrono::seconds(1)) {
    spdlog::warn("store: {} {} connection(s): {}", what, unlogged, why);
    unlogged = 0;
    last = now;
  }
}

void ServerContext::warn(const std::string& line) {
  auto now = SteadyClock::now();
  if (now - warn_window >= std::chrono::seconds(1)) {
    if (warn_suppressed > 0) {
      spdlog::warn("store: {} more warnings about client connections in the last second were not logged",
                   warn_suppressed);
    }
    warn_window = now;
    warn_count = 0;
    warn_suppressed = 0;
  }
  if (warn_count < kWarningsPerSecond) {
    ++warn_count;
    spdlog::warn("{}", line);
  } else {
    ++warn_suppressed;
  }
}

}  // namespace ddprun::rendezvous
