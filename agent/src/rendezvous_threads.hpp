#pragma once
// What the rendezvous backends that talk to a server (StoreRendezvous, EtcdRendezvous) share:
// the coordinator thread's queue of requests, run in order; the rule that each round's end
// reaches the loop once (a watch and a failed request may both report one); and the stop
// announcement, run on a thread of its own since the coordinator thread may be blocked in a wait.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>

#include "bounded_thread.hpp"
#include "ddprun/agent/exit_status.hpp"
#include "ddprun/common/error.hpp"
#include "rendezvous.hpp"

namespace ddprun::agent {

class TaskQueue {
 public:
  using Task = std::function<void()>;

  void submit(Task task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // The next task; an empty one when `wake` passes first; nullopt once stopped.
  std::optional<Task> next(std::chrono::steady_clock::time_point wake) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_until(lk, wake, [&] { return stopped_ || !tasks_.empty(); });
    if (stopped_) return std::nullopt;
    if (tasks_.empty()) return Task{};
    Task t = std::move(tasks_.front());
    tasks_.pop_front();
    return t;
  }
  // False when it was stopped already.
  bool stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopped_) return false;
      stopped_ = true;
    }
    cv_.notify_all();
    return true;
  }
  bool stopped() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopped_;
  }
  // Waits up to `limit`; true once stopped (a thread's pause that a stop cuts short).
  bool wait_stopped_for(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, limit, [&] { return stopped_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopped_ = false;
};

// The rounds whose end was posted to the loop: each one once.
class RoundEnds {
 public:
  // True for the first end of `round` (and of no later round posted yet).
  bool claim(int round) {
    std::lock_guard<std::mutex> lk(mu_);
    if (round <= last_) return false;
    last_ = round;
    return true;
  }
  bool over(int round) {
    std::lock_guard<std::mutex> lk(mu_);
    return round <= last_;
  }

 private:
  std::mutex mu_;
  int last_ = -1;
};

// Runs `tell` (telling the other nodes about `signal`) on `announcer`, then posts on_finished.
// `tell` must hold what it uses by shared_ptr: the thread may outlive the rendezvous.
inline void announce_stop(BoundedThread& announcer, Post post, Rendezvous::Listener* listener, int signal,
                          std::function<void()> tell) {
  announcer.join_within(std::chrono::milliseconds(0));
  announcer.start([post = std::move(post), listener, signal, tell = std::move(tell)] {
    try {
      tell();
    } catch (const Error& e) {
      spdlog::warn("ddprun: could not tell the other nodes about {}: {}", signal_name(signal), e.what());
    }
    post([listener] { listener->on_finished(); });
  });
}

}  // namespace ddprun::agent
