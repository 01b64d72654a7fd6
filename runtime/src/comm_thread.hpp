#pragma once
// A FIFO of operations run by one thread: collectives must be issued in the same order on
// every rank, and a single queue keeps synchronous and asynchronous operations in issue order.

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "ddprun/runtime/process_group.hpp"

namespace ddprun::runtime {

class FutureWork final : public Work {
 public:
  explicit FutureWork(std::future<void> f) : f_(f.share()) {}
  // Rethrows the operation's exception, every time it is called.
  void wait() override { f_.get(); }

 private:
  std::shared_future<void> f_;
};

class CommThread {
 public:
  CommThread() : thread_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  // Runs `op` on the calling thread when nothing is queued or running (the common case of a
  // synchronous collective: no hand-off to the communication thread and back); otherwise
  // queues it behind the pending operations and waits. Either way, issue order is kept.
  void run(const std::function<void()>& op) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty() && !busy_) {
        busy_ = true;
        lock.unlock();
        struct Release {
          CommThread& t;
          ~Release() {
            {
              std::lock_guard<std::mutex> g(t.mu_);
              t.busy_ = false;
            }
            t.cv_.notify_all();
          }
        } release{*this};
        op();
        return;
      }
    }
    submit(op)->wait();
  }

  // Returns once everything submitted so far has run.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

  std::shared_ptr<Work> submit(std::function<void()> op) {
    auto task = std::make_shared<std::packaged_task<void()>>(std::move(op));
    auto work = std::make_shared<FutureWork>(task->get_future());
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return work;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return (stop_ && !busy_) || (!queue_.empty() && !busy_); });
        if (queue_.empty()) return;  // stopping, and everything submitted has run
        op = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      op();
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;  // an operation runs (on this thread or inline on a caller's)
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddprun::runtime
