// Stacks of a hung group (README: Where every rank is stuck): the Python processes found below
// each worker (whatever started them) by SIGABRT and faulthandler, native ones through the
// ProcessRunner (ddprun-stack, eu-stack, gdb) on threads off the loop.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "ddprun/common/text.hpp"
#include "workers/process_runner.hpp"
#include "workers/worker_group_impl.hpp"

namespace ddprun::agent {

bool WorkerGroup::Impl::start_dump(std::function<void()> then) {
  if (opt.stack_dump_timeout.count() <= 0 || dump_started) return false;
  dump_started = true;
  dump.emplace();
  dump->then = std::move(then);
  std::vector<Slot*> running;
  std::vector<pid_t> pids;
  for (auto& s : slots) {
    if (!s->w.running()) continue;
    running.push_back(s.get());
    pids.push_back(s->w.pid);
  }
  auto targets = runner.stack_targets(pids);
  for (std::size_t i = 0; i < running.size() && i < targets.size(); ++i) {
    Slot& s = *running[i];
    if (!targets[i].python.empty()) {
      s.w.raise(Standing::stopped);  // faulthandler's SIGABRT ends it: ddprun stopped it
      dump_python(s, targets[i].python);
    } else {
      dump_native(s, targets[i].native);
    }
  }
  dump_timer.expires_after(opt.stack_dump_timeout + std::chrono::milliseconds(200));
  dump_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (!ec && gen == generation) finish_dump();
  });
  check_dump();
  return true;
}

void WorkerGroup::Impl::dump_python(Slot& s, const std::vector<pid_t>& pythons) {
  dump->python.insert(s.w.spec.local_rank);
  if (s.err) s.err->start_capture();
  for (pid_t p : pythons) {
    // faulthandler prints every thread, then Python dies (its wrapper, if any, ends after it).
    // SIGCONT: a stopped process handles the SIGABRT too, instead of holding the dump up.
    runner.signal_process(p, SIGABRT);
    runner.signal_process(p, SIGCONT);
  }
}

void WorkerGroup::Impl::dump_native(Slot& s, pid_t program) {
  int lr = s.w.spec.local_rank;
  dump->native.insert(lr);
  pid_t worker = s.w.pid;
  dumpers.emplace_back([this, worker, program, lr, gen = generation, limit = opt.stack_dump_timeout] {
    std::string text = runner.native_stack(program, limit);
    if (program != worker) {
      text = "(pid " + std::to_string(program) + ", started by worker pid " + std::to_string(worker) + ")\n" + text;
    }
    asio::post(io, [this, lr, gen, text = std::move(text)] {
      if (gen != generation || !dump) return;
      dump->text[lr] = text;
      check_dump();
    });
  });
}

void WorkerGroup::Impl::check_dump() {
  if (!dump || dump->done) return;
  if (dump->text.size() < dump->native.size()) return;
  for (auto& s : slots) {
    if (dump->python.count(s->w.spec.local_rank) && (s->w.running() || s->open_pipes > 0)) return;
  }
  asio::post(io, [this, gen = generation] {
    if (gen == generation) finish_dump();
  });
}

void WorkerGroup::Impl::finish_dump() {
  if (!dump || dump->done) return;
  dump->done = true;
  dump_timer.cancel();
  std::map<int, std::vector<StackFrame>> by_rank;
  std::vector<std::string> files;
  for (auto& s : slots) {
    int lr = s->w.spec.local_rank;
    bool python = dump->python.count(lr) > 0;
    if (!python && !dump->native.count(lr)) continue;
    std::string text = python ? without_spare_driver(s->err ? s->err->captured() : std::string()) : dump->text[lr];
    if (!python && text.empty()) text = "(no stack within " + duration_text(opt.stack_dump_timeout) + ")\n";
    by_rank[s->w.spec.rank] = python ? parse_python_stack(text) : parse_native_stack(text);
    if (!s->w.spec.dir.empty() && write_stack_file(s->w.spec.dir + "/stack.txt", text)) {
      files.push_back(s->w.spec.dir + "/stack.txt");
    }
  }
  listener->on_stacks_dumped(by_rank, files);
  auto then = std::move(dump->then);
  if (then) then();
}

bool WorkerGroup::Impl::write_stack_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  write_fully(fd, text);
  ::close(fd);
  return true;
}

}  // namespace ddprun::agent
