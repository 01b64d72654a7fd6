#pragma once
// The coordinator thread's queue of requests, run in order, and the rule that each round's end
// reaches the loop once (a watch and a failed request may both report one).

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

namespace ddprun::rounds {

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

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopped_ = false;
};

// A stop that threads pausing between requests can be woken by.
class StopSignal {
 public:
  void stop() {
    std::function<void()> also;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopped_ = true;
      also = std::move(also_);
    }
    cv_.notify_all();
    if (also) also();
  }
  // `f` is run by stop() (at once if stopped already): it wakes a thread blocked elsewhere than
  // in wait_for (a watch), which must stay valid until then. Each one given is run, in order.
  void also_on_stop(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!stopped_) {
        if (also_) {
          also_ = [first = std::move(also_), then = std::move(f)] {
            first();
            then();
          };
        } else {
          also_ = std::move(f);
        }
        return;
      }
    }
    f();
  }
  bool stopped() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopped_;
  }
  // Waits up to `limit`; true once stopped.
  bool wait_for(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, limit, [&] { return stopped_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::function<void()> also_;
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

}  // namespace ddprun::rounds
