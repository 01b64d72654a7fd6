#pragma once
// Fibers for the simulator: a function on a stack of its own, run on the caller's thread until
// it yields (Boost.Context). The simulator's scheduler resumes one fiber at a time, which makes
// the blocking round rules run as steps of one thread. Stacks are reused (per thread).
//
// The C++ runtime keeps the exceptions being thrown or handled per thread, not per fiber. A
// switch is therefore allowed only where none is: not inside a catch block, not while a stack
// unwinds. Every switch checks it (with the standard's std::uncaught_exceptions and
// std::current_exception) and aborts the test with the reason where a rule would break it; a
// node's simulated crash is thrown after the switch, on the fiber's own stack.

#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

namespace ddprun::rounds::sim {

class Fiber {
 public:
  explicit Fiber(std::function<void()> body)
      : body_(std::move(body)),
        fiber_(std::allocator_arg, PooledStack{}, [this](boost::context::fiber&& caller) {
          caller_ = std::move(caller);
          body_();  // must not throw: the body catches everything
          done_ = true;
          return std::move(caller_);
        }) {}
  // A fiber is destroyed done (the simulator crashes the parked ones first); one destroyed parked
  // is unwound by Boost.Context (its forced_unwind: nothing in the rules catches everything).
  ~Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Runs the fiber until it yields or returns. Not from inside a fiber.
  void resume() {
    check_no_exception("resume");
    Fiber* outer = current();
    current() = this;
    fiber_ = std::move(fiber_).resume();
    current() = outer;
  }
  // Back to whoever resumed the running fiber.
  static void yield() {
    check_no_exception("yield");
    Fiber* f = current();
    f->caller_ = std::move(f->caller_).resume();
  }
  bool done() const { return done_; }
  static Fiber*& current() {
    static thread_local Fiber* f = nullptr;
    return f;
  }

 private:
  // Stacks of a fixed size, kept for the next fiber of this thread (a sweep starts millions).
  struct PooledStack {
    static constexpr std::size_t kSize = 256 * 1024;
    boost::context::stack_context allocate() {
      auto& p = pool();
      std::unique_ptr<char[]> s;
      if (p.empty()) {
        s.reset(new char[kSize]);
      } else {
        s = std::move(p.back());
        p.pop_back();
      }
      boost::context::stack_context sc;
      sc.size = kSize;
      sc.sp = s.release() + kSize;  // the top: stacks grow down
      return sc;
    }
    void deallocate(boost::context::stack_context& sc) {
      pool().emplace_back(static_cast<char*>(sc.sp) - sc.size);
    }
    static std::vector<std::unique_ptr<char[]>>& pool() {
      static thread_local std::vector<std::unique_ptr<char[]>> p;
      return p;
    }
  };

  static void check_no_exception(const char* where) {
    if (std::uncaught_exceptions() == 0 && !std::current_exception()) return;
    std::fprintf(stderr,
                 "simulator: a fiber switch (%s) inside a catch block or while a stack unwinds; the "
                 "C++ runtime's exception state is per thread, so a node must not call the backend "
                 "there\n",
                 where);
    std::abort();
  }

  std::function<void()> body_;
  boost::context::fiber caller_;
  boost::context::fiber fiber_;
  bool done_ = false;
};

}  // namespace ddprun::rounds::sim
