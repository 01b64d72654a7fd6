// Stacks of a hung group (README: Where every rank is stuck): Python workers by SIGABRT and
// faulthandler, native ones through the ProcessRunner (eu-stack, gdb) on threads off the loop.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "ddprun/common/text.hpp"
#include "process_runner.hpp"
#include "worker_group_impl.hpp"

namespace ddprun::agent {

bool WorkerGroup::Impl::start_dump(std::function<void()> then) {
  if (opt.stack_dump_timeout.count() <= 0 || dump_started) return false;
  dump_started = true;
  dump.emplace();
  dump->then = std::move(then);
  for (auto& s : slots) {
    Worker& w = s->w;
    if (!w.running()) continue;
    int lr = w.spec.local_rank;
    w.raise(Standing::stopped);
    if (is_python_command(w.spec.argv)) {
      dump->python.insert(lr);
      if (s->err) s->err->start_capture();
      runner.signal_group(w.pid, SIGABRT);  // faulthandler prints every thread, then Python dies
    } else {
      dump->native.insert(lr);
      dumpers.emplace_back([this, pid = w.pid, lr, gen = generation, limit = opt.stack_dump_timeout] {
        std::string text = runner.native_stack(pid, limit);
        asio::post(io, [this, lr, gen, text = std::move(text)] {
          if (gen != generation || !dump) return;
          dump->text[lr] = text;
          check_dump();
        });
      });
    }
  }
  dump_timer.expires_after(opt.stack_dump_timeout + std::chrono::milliseconds(200));
  dump_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (!ec && gen == generation) finish_dump();
  });
  check_dump();
  return true;
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
    std::string text = python ? (s->err ? s->err->captured() : std::string()) : dump->text[lr];
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
