#pragma once
// Fibers for the simulator: a function on a stack of its own, run on the caller's thread until
// it yields (ucontext). The simulator's scheduler resumes one fiber at a time, which makes the
// blocking round rules run as steps of one thread. Stacks are reused (per thread).

#include <cxxabi.h>
#include <ucontext.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace ddprun::rounds::sim {

class Fiber {
 public:
  explicit Fiber(std::function<void()> body) : body_(std::move(body)), stack_(take_stack()) {
    getcontext(&ctx_);
    ctx_.uc_stack.ss_sp = stack_.get();
    ctx_.uc_stack.ss_size = kStack;
    ctx_.uc_link = nullptr;
    makecontext(&ctx_, reinterpret_cast<void (*)()>(&Fiber::entry), 0);
  }
  ~Fiber() { give_stack(std::move(stack_)); }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Runs the fiber until it yields or returns. Not from inside a fiber. The C++ runtime's
  // per-thread exception state (the exceptions being handled) is the fiber's while it runs: a
  // fiber may yield inside a catch block while another one throws.
  void resume() {
    Fiber* outer = current();
    current() = this;
    auto* g = reinterpret_cast<EhGlobals*>(abi::__cxa_get_globals());
    const EhGlobals theirs = *g;
    *g = eh_;
    swapcontext(&caller_, &ctx_);
    eh_ = *g;
    *g = theirs;
    current() = outer;
  }
  // Back to whoever resumed the running fiber.
  static void yield() {
    Fiber* f = current();
    swapcontext(&f->ctx_, &f->caller_);
  }
  bool done() const { return done_; }
  static Fiber*& current() {
    static thread_local Fiber* f = nullptr;
    return f;
  }

 private:
  // libstdc++'s __cxa_eh_globals.
  struct EhGlobals {
    void* caught = nullptr;
    unsigned int uncaught = 0;
  };
  static constexpr std::size_t kStack = 256 * 1024;
  using Stack = std::unique_ptr<char[]>;
  static std::vector<Stack>& pool() {
    static thread_local std::vector<Stack> p;
    return p;
  }
  static Stack take_stack() {
    auto& p = pool();
    if (p.empty()) return Stack(new char[kStack]);
    Stack s = std::move(p.back());
    p.pop_back();
    return s;
  }
  static void give_stack(Stack s) {
    if (s) pool().push_back(std::move(s));
  }
  static void entry() {
    Fiber* f = current();
    f->body_();  // must not throw: the body catches everything
    f->done_ = true;
    swapcontext(&f->ctx_, &f->caller_);
  }

  std::function<void()> body_;
  Stack stack_;
  ucontext_t ctx_{}, caller_{};
  bool done_ = false;
  EhGlobals eh_;
};

}  // namespace ddprun::rounds::sim
