#pragma once
// A thread that can be waited for with a time limit, then left behind (one stuck on an
// unreachable server at exit): it must only touch state it shares by shared_ptr.

#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <thread>

#include "ddprun/common/thread.hpp"

namespace ddprun::rounds {

struct BoundedThread {
  std::thread thread;
  std::shared_future<void> done;

  template <typename F>
  void start(F f) {
    auto p = std::make_shared<std::promise<void>>();
    done = p->get_future().share();
    thread = start_thread("a rendezvous thread", [p, f = std::move(f)]() mutable {
      try {
        f();
      } catch (const std::exception& e) {
        // A thread's own errors are its to report; what escapes is a bug, said rather than fatal.
        std::fprintf(stderr, "ddprun: internal error on a rendezvous thread: %s\n", e.what());
      }
      p->set_value();
    });
  }
  void join_within(std::chrono::milliseconds limit) {
    if (!thread.joinable()) return;
    if (done.wait_for(limit) == std::future_status::ready) {
      thread.join();
    } else {
      thread.detach();
    }
  }
};

}  // namespace ddprun::rounds
