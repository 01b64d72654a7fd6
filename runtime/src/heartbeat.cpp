#include "ddprun/runtime/heartbeat.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <string>

namespace ddprun::runtime {

void heartbeat() {
  static const std::string path = [] {
    const char* p = std::getenv("DDPRUN_HEARTBEAT_FILE");
    return std::string(p ? p : "");
  }();
  if (path.empty()) return;
  static std::atomic<std::int64_t> last_ms{0};
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch()).count();
  auto prev = last_ms.load(std::memory_order_relaxed);
  if (prev != 0 && now - prev < 1000) return;
  if (!last_ms.compare_exchange_strong(prev, now)) return;  // another thread just did it
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
}

}  // namespace ddprun::runtime
