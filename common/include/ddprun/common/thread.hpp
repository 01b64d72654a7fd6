#pragma once
// Starting a thread where the kernel may refuse one. std::thread's own error, "Resource
// temporarily unavailable", says neither what was being started nor which limit to raise; the
// kernel counts every thread of the user against RLIMIT_NPROC (ulimit -u), not only processes.

#include <string>
#include <system_error>
#include <thread>
#include <utility>

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

}  // namespace ddprun
