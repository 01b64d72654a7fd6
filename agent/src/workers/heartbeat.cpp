#include "workers/heartbeat.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <vector>

namespace ddprun::agent {

void Heartbeat::reset(timespec created, Clock::time_point now) {
  *this = Heartbeat{};
  mtime_ = created;
  start_ = last_ = now;
}

bool Heartbeat::look(const std::string& file, Clock::time_point now) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st{};
  bool changed = ::fstat(fd, &st) == 0 &&
                 (st.st_mtim.tv_sec != mtime_.tv_sec || st.st_mtim.tv_nsec != mtime_.tv_nsec);
  long long count = -1;
  if (changed) {
    mtime_ = st.st_mtim;
    saving_ = false;
    char buf[32];
    ssize_t n = st.st_size > 0 ? ::pread(fd, buf, sizeof(buf) - 1, 0) : 0;
    if (n > 0) {
      buf[n] = 0;
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(buf, &end, 10);
      if (end != buf && errno == 0 && v >= 0) count = v;  // else garbled: a touch
      saving_ = count >= 0 && std::strncmp(end, " save", 5) == 0;
    }
  }
  ::close(fd);
  if (changed) beat(now, count);
  return changed;
}

void Heartbeat::beat(Clock::time_point now, long long count) {
  last_ = now;
  if (count >= 0 && !counted_) {  // the first count read replaces what touches had counted
    counted_ = true;
    if (count < steps_) {
      steps_ = count;
      gaps_.clear();
    }
  } else if (count > 0 && count < steps_) {
    // Counting again from lower (the trainer restarted inside the worker, or a garbled count
    // had jumped ahead): from here on, without a step's interval across the jump. ("0", a
    // Reducer made, is no step and changes nothing.)
    steps_ = count;
    last_step_ = now;
    return;
  }
  const long long steps = count < 0 ? steps_ + 1 : count;
  if (steps <= steps_) return;  // a touch between steps (a forward pass), or "0": no step yet
  if (steps_ > 0) {
    // Steps done between two looks share the interval.
    gaps_.push_back((now - last_step_) / (steps - steps_));
    if (gaps_.size() > kAutoSteps) gaps_.pop_front();
  }
  steps_ = steps;
  last_step_ = now;
}

Heartbeat::Clock::duration Heartbeat::longest_step() const {
  if (gaps_.empty()) return Clock::duration::zero();
  // The 90th percentile: one pause between two steps (a checkpoint save) does not stretch the
  // bound for the next 32 steps; steps that are slow often do.
  std::vector<Clock::duration> sorted(gaps_.begin(), gaps_.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted[(sorted.size() - 1) * 9 / 10];
}

Heartbeat::Clock::duration Heartbeat::silent(Clock::time_point now) const {
  return now - (steps_ > 0 ? last_ : start_);
}

std::chrono::milliseconds first_beat_look(std::chrono::steady_clock::duration waited) {
  using std::chrono::milliseconds;
  return std::clamp(std::chrono::duration_cast<milliseconds>(waited / 20), milliseconds(5), milliseconds(1000));
}

std::chrono::milliseconds Heartbeat::bound(const HangRule& rule) const {
  if (steps_ == 0) return rule.start;
  if (!rule.adaptive) return rule.fixed;
  auto scaled = std::chrono::duration_cast<std::chrono::milliseconds>(longest_step() * kAutoFactor);
  return std::max(rule.floor, scaled);
}

}  // namespace ddprun::agent
