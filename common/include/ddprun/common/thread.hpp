#pragma once
// Starting a thread where the kernel may refuse one. std::thread's own error, "Resource
// temporarily unavailable", says neither what was being started nor which limit to raise; the
// kernel counts every thread of the user against RLIMIT_NPROC (ulimit -u), not only processes.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace ddprun {

// "cannot start WHAT: REASON", and for EAGAIN the limits that refuse threads and how to raise them.
std::string task_refused(const std::string& what, int err);

[[noreturn]] void throw_task_refused(const std::string& what, int err);

// std::thread(f), or ddprun::Error(task_refused(what, ...)) when the thread cannot be made.
template <typename F>
std::thread start_thread(const std::string& what, F&& f) {
  try {
    return std::thread(std::forward<F>(f));
  } catch (const std::system_error& e) {
    throw_task_refused(what, e.code().value());
  }
}

// Threads that do blocking work off an event loop (stack readers, a store exchange): finished
// ones are joined when the next starts, the rest when the set goes.
class ThreadSet {
 public:
  ThreadSet() = default;
  ThreadSet(const ThreadSet&) = delete;
  ThreadSet& operator=(const ThreadSet&) = delete;
  ~ThreadSet() { join_all(); }

  // Runs `work` on a thread of its own (start_thread: `what` names it if the kernel refuses one).
  void run(const std::string& what, std::function<void()> work) {
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({start_thread(what, [work = std::move(work), done] {
                          work();
                          done->store(true);
                        }),
                        done});
  }
  void join_all() {
    for (auto& t : threads_) t.thread.join();
    threads_.clear();
  }

 private:
  struct Running {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Running> threads_;
};

}  // namespace ddprun
