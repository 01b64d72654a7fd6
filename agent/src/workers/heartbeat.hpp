#pragma once
// A worker's heartbeat, as the agent reads it, and the rule that finds it hung (README: Hangs).
//
// The worker's file (DDPRUN_HEARTBEAT_FILE): its mtime changes at every beat; its content, when
// there is one, is the number of optimizer steps done ("12\n"). The progress hook writes the count
// after each step and, after the first, touches the file on forward passes, and "12 save" while
// torch.save runs (touched every 2 s: the other ranks wait for it); the runtime writes
// "0\n" when a Reducer is made, the count after each gradient all-reduce, and touches the file
// after other collectives. A touch of a file without a count (a program that only touches it) is
// a step; the first count read replaces what such touches had counted.
//
// The rule: a worker is suspect once silent for longer than its bound. Before its first step
// the silence counts from its start and the bound is --worker_start_timeout (0: none; auto's
// default, however long the first step takes; S's default 1800 s). After it, the silence counts
// from its last beat of any kind and the bound is:
//   --worker_timeout=S     S;
//   --worker_timeout=auto  max(floor, kAutoFactor x its long steps: the 90th percentile of its
//                          last kAutoSteps steps, so that one pause does not stretch it).
// Beats are timed on the monotonic clock when the agent sees them, so a wall-clock step cannot
// kill or hide a worker; a beat counts at most one check interval late.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <string>
#include <time.h>

namespace ddprun::agent {

struct HangRule {
  bool adaptive = false;
  std::chrono::milliseconds fixed{0};  // --worker_timeout=S; 0 (and not adaptive): off
  std::chrono::milliseconds start{0};  // before the first beat (fixed) or step (adaptive); 0: none
  std::chrono::milliseconds floor{std::chrono::seconds(30)};
  bool on() const { return adaptive || fixed.count() > 0; }
};

// auto's factor and window: silence 5x longer than the longest of the last 32 steps is not a
// slow step (a CPU hog that halves the speed, a step that loads more data).
constexpr int kAutoFactor = 5;
constexpr std::size_t kAutoSteps = 32;

// How long to wait before the next look for a new group's first beats (a recovery's "ready"),
// `waited` after the group started: 5% of it, from 5 ms to 1 s, so that a first step of 0.1 s
// is seen within 5 ms of it and one of minutes (or a worker that never steps) costs a look a
// second, not 200.
std::chrono::milliseconds first_beat_look(std::chrono::steady_clock::duration waited);

class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;
  // The file was just created (its mtime `created`) at `now`: the start-up clock starts.
  void reset(timespec created, Clock::time_point now);
  // Reads the file: true when it beat since the last look (its mtime changed).
  bool look(const std::string& file, Clock::time_point now);
  // A beat recorded directly (tests); `steps` < 0: a beat without a count.
  void beat(Clock::time_point now, long long steps);

  // How long it may stay silent before it is suspect; zero: no bound now.
  std::chrono::milliseconds bound(const HangRule& rule) const;
  // Since its last beat, or its start before its first step.
  Clock::duration silent(Clock::time_point now) const;
  bool beaten() const { return steps_ > 0; }  // its first step is done
  long long steps() const { return steps_; }
  // The last read said "N save": torch.save under way (it beats every 2 s while it lasts).
  bool saving() const { return saving_; }
  Clock::time_point last() const { return last_; }
  // Its long steps (the 90th percentile of the recent ones), zero before two steps.
  Clock::duration longest_step() const;

 private:
  timespec mtime_{};
  Clock::time_point start_{}, last_{}, last_step_{};
  long long steps_ = 0;
  bool counted_ = false;  // a count was read: touches are progress, not steps
  bool saving_ = false;
  std::deque<Clock::duration> gaps_;  // the last kAutoSteps intervals between steps
};

}  // namespace ddprun::agent
