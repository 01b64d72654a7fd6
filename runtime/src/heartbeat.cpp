#include "ddprun/runtime/heartbeat.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <string>

namespace ddprun::runtime {
namespace {

const std::string& heartbeat_path() {
  static const std::string path = [] {
    const char* p = std::getenv("DDPRUN_HEARTBEAT_FILE");
    return std::string(p ? p : "");
  }();
  return path;
}

// True at most once a second (across threads): the beat to write now.
bool due(std::atomic<std::int64_t>& last_ms) {
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch()).count();
  auto prev = last_ms.load(std::memory_order_relaxed);
  if (prev != 0 && now - prev < 1000) return false;
  return last_ms.compare_exchange_strong(prev, now);  // false: another thread just did it
}

std::atomic<std::int64_t> g_last_touch{0}, g_last_step{0};
std::atomic<long long> g_steps{0};

void write_count(long long n) {
  int fd = ::open(heartbeat_path().c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  std::string text = std::to_string(n) + "\n";
  (void)!::pwrite(fd, text.data(), text.size(), 0);
  ::close(fd);
}

}  // namespace

void heartbeat() {
  if (heartbeat_path().empty() || !due(g_last_touch)) return;
  ::utimensat(AT_FDCWD, heartbeat_path().c_str(), nullptr, 0);
}

void heartbeat_steps_follow() {
  if (heartbeat_path().empty() || g_steps.load() != 0) return;
  write_count(0);
}

void heartbeat_step() {
  long long n = ++g_steps;
  if (heartbeat_path().empty() || !due(g_last_step)) return;
  write_count(n);
}

}  // namespace ddprun::runtime
