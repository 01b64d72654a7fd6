// Stacks of a hung group (README: Hangs). A hang's report reads every running worker without
// changing it: its state in /proc first (a SIGSTOPped process stays stopped), then the Python
// stack through the progress hook's faulthandler (DDPRUN_STACK_SIGNAL, to HEARTBEAT.stack) and
// the native main thread through the ProcessRunner (ddprun-stack, eu-stack, gdb) on threads off
// the loop. When the group is stopped, a Python worker the report could not read (no hook) is
// dumped by SIGABRT and faulthandler (PYTHONFAULTHANDLER), which ends it.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"
#include "observe/hang_verdict.hpp"
#include "workers/process_runner.hpp"
#include "workers/worker_group_impl.hpp"

namespace ddprun::agent {

namespace {

off_t file_size(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

// How busy each worker's main thread is (on a CPU or waiting for one: a spinning process on a
// crowded machine is runnable all the time, whatever share it gets) is measured over this.
constexpr std::chrono::milliseconds kBusyWindow{500};

bool stopped_or_gone(char state) { return state == 'T' || state == 't' || state == 'Z' || state == 'X'; }

}  // namespace

// The process that trains, as the progress hook wrote it at its first step (HEARTBEAT.pid), when
// it still runs below `worker` (a Python wrapper, `python -m launcher`, mp.spawn: the outermost
// Python process is not the one that trains); -1 otherwise.
// The worker writes the file: a FIFO or a link there must not block or redirect the agent, so
// it is opened without following links and without blocking, and read only if a regular file.
pid_t training_process(const std::string& heartbeat, pid_t worker, const std::string& proc_root) {
  int fd = ::open((heartbeat + ".pid").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st{};
  char buf[24] = {};
  ssize_t n = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? ::pread(fd, buf, sizeof(buf) - 1, 0) : -1;
  ::close(fd);
  if (n <= 0) return -1;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(buf, &end, 10);
  if (end == buf || errno != 0 || v <= 1 || v > std::numeric_limits<pid_t>::max()) return -1;
  for (pid_t p = static_cast<pid_t>(v), depth = 0; p > 1 && depth < 64; ++depth) {
    if (p == worker) return static_cast<pid_t>(v);
    p = parent_pid(p, proc_root);
  }
  return -1;
}

void WorkerGroup::Impl::inspect() {
  dump_started = true;  // the stop after this report reads only what it could not
  inspection.emplace();
  auto& in = *inspection;
  in.started = SteadyClock::now();
  std::vector<Slot*> running;
  std::vector<pid_t> pids;
  for (auto& s : slots) {
    if (!s->w.running()) continue;
    running.push_back(s.get());
    pids.push_back(s->w.pid);
  }
  auto targets = runner.stack_targets(pids);
  bool measured = false;
  for (std::size_t i = 0; i < running.size(); ++i) {
    Inspection::Target t;
    t.slot = running[i];
    t.python = i < targets.size() && !targets[i].python.empty();
    t.pid = !t.python ? (i < targets.size() && targets[i].native > 0 ? targets[i].native : running[i]->w.pid)
                      : targets[i].python.front();
    if (t.python && !t.slot->w.spec.heartbeat_file.empty()) {
      if (pid_t trainer = training_process(t.slot->w.spec.heartbeat_file, t.slot->w.pid); trainer > 0) t.pid = trainer;
    }
    t.before = runner.sample(t.pid);  // before any signal
    measured = measured || t.before.busy_ns >= 0;
    in.targets.push_back(std::move(t));
  }
  // First how busy each main thread is, over kBusyWindow, before anything reads (and pauses) it.
  if (!measured) return read_stacks();
  inspect_timer.expires_after(kBusyWindow);
  inspect_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (!ec && gen == generation && inspection) read_stacks();
  });
}

void WorkerGroup::Impl::read_stacks() {
  auto& in = *inspection;
  const auto now = SteadyClock::now();
  in.window = std::chrono::duration<double>(now - in.started).count();
  in.deadline = now + std::max(opt.stack_dump_timeout, std::chrono::milliseconds(500));
  in.python_by = now + (in.deadline - now) / 2;
  const bool off = opt.stack_dump_timeout.count() <= 0;  // states only
  for (auto& t : in.targets) {
    t.after = runner.sample(t.pid);
    if (off) {
      t.python_note = "--stack_dump_timeout=0";
    } else if (t.python) {
      if (t.before.state == 'T' || t.before.state == 't') {
        t.python_note = "stopped: it reads no signal until it is continued";
      } else if (opt.stack_signal > 0 && t.before.catches(opt.stack_signal) && !t.slot->w.spec.heartbeat_file.empty()) {
        t.stack_file = t.slot->w.spec.heartbeat_file + ".stack";
        t.offset = file_size(t.stack_file);
        runner.signal_main_thread(t.pid, opt.stack_signal);
      } else {
        t.python_note = "no Python stack without the progress hook";
        unread_python.insert(t.slot->w.spec.local_rank);
      }
    }
    // A stopped process is not attached to (a debugger's detach could continue it), nor one in
    // uninterruptible sleep (the attach would wait on it).
    t.native_wanted = !off && !stopped_or_gone(t.before.state) && t.before.state != 'D';
  }
  poll_inspection();
}

void WorkerGroup::Impl::read_native(std::size_t i) {
  auto& t = inspection->targets[i];
  t.native_started = true;
  // The time left, not the whole stack_dump_timeout: the inspection ends at its deadline.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(inspection->deadline - SteadyClock::now());
  off_loop([this, i, pid = t.pid, gen = generation, limit = std::max(left, std::chrono::milliseconds(100))] {
    std::string text = runner.native_stack(pid, limit);
    asio::post(io, [this, i, gen, text = std::move(text)] {
      if (gen != generation || !inspection || i >= inspection->targets.size()) return;
      inspection->targets[i].native = text;
    });
  });
}

void WorkerGroup::Impl::poll_inspection() {
  if (!inspection) return;
  const auto now = SteadyClock::now();
  bool done = now >= inspection->deadline;
  if (!done) {
    done = true;
    for (std::size_t i = 0; i < inspection->targets.size(); ++i) {
      auto& t = inspection->targets[i];
      bool python_in = true;
      if (!t.stack_file.empty()) {
        // faulthandler's dump is in once the file grew and stopped growing for one poll.
        off_t size = file_size(t.stack_file);
        python_in = size > t.offset && size == t.seen;
        t.seen = size;
      }
      if (!python_in) done = false;
      if (t.native_wanted && !t.native_started && (python_in || now >= inspection->python_by)) read_native(i);
      if (t.native_wanted && !t.native) done = false;
    }
  }
  if (done) return finish_inspection();
  inspect_timer.expires_after(std::chrono::milliseconds(30));
  inspect_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (!ec && gen == generation) poll_inspection();
  });
}

void WorkerGroup::Impl::finish_inspection() {
  auto in = std::move(*inspection);
  inspection.reset();
  HangReport report;
  for (auto& t : in.targets) {
    RankView v;
    v.rank = t.slot->w.spec.rank;
    v.local_rank = t.slot->w.spec.local_rank;
    v.pid = t.pid;
    v.state = t.before.state;
    if (t.before.busy_ns >= 0 && t.after.busy_ns >= 0 && in.window > 0) {
      v.cpu = std::min(1.0, static_cast<double>(t.after.busy_ns - t.before.busy_ns) / 1e9 / in.window);
    }
    v.silent = hang && hang->local_rank == t.slot->w.spec.local_rank;
    std::string text;
    if (!t.stack_file.empty()) {
      std::string py = without_spare_driver(read_worker_file(t.stack_file, 16u << 20, static_cast<std::uint64_t>(std::max<off_t>(t.offset, 0))));
      v.python = parse_python_stack(py);
      if (v.python.empty()) v.python_note = kStackSignalUnanswered + duration_text(opt.stack_dump_timeout);
      text += py;
    } else {
      v.python_note = t.python_note;
    }
    if (t.native) {
      v.native = parse_native_stack(*t.native);
      text += (text.empty() ? "" : "\nNative (ddprun-stack):\n");
      if (t.pid != t.slot->w.pid) {
        text += "(pid " + std::to_string(t.pid) + ", started by worker pid " + std::to_string(t.slot->w.pid) + ")\n";
      }
      text += *t.native;
    }
    // (a rank without a stack has no dump to name, nor to keep)
    if (!text.empty() && !t.slot->w.spec.dir.empty() && write_stack_file(t.slot->w.spec.dir + "/stack.txt", text)) {
      report.files.push_back(t.slot->w.spec.dir + "/stack.txt");
    }
    report.ranks.push_back(std::move(v));
  }
  if (!hang) return;
  for (auto& s : slots) {
    if (s->w.spec.local_rank == hang->local_rank) report.rank = s->w.spec.rank;
  }
  // Timed from when the silence was found (on the clock check_heartbeats was given).
  const auto found = hang->found;
  report.reason = hang->reason;
  report.silent_s = std::chrono::duration<double>(found - hang->last_beat).count();
  const bool at_once = !opt.hang.adaptive || opt.hang_stop.count() <= 0;
  report.stop_in = at_once ? std::chrono::milliseconds(0) : opt.hang_stop;
  hang->reported = true;
  if (!at_once) hang->stop_at = found + opt.hang_stop;
  listener->on_hang_report(report);
  if (!at_once || !hang) return;
  for (auto& s : slots) {
    if (s->w.spec.local_rank == hang->local_rank && s->w.running() && s->w.standing == Standing::own) {
      return fail_hung(*s, found, hang->reason);
    }
  }
}

bool WorkerGroup::Impl::start_dump(std::function<void()> then) {
  if (opt.stack_dump_timeout.count() <= 0) return false;
  // After a hang's report: only the Python workers it could not read (no hook), by SIGABRT.
  const bool reported = dump_started && !dump;
  if (dump_started && (!reported || unread_python.empty())) return false;
  dump_started = true;
  dump.emplace();
  dump->then = std::move(then);
  std::vector<Slot*> running;
  std::vector<pid_t> pids;
  for (auto& s : slots) {
    if (!s->w.running()) continue;
    if (reported && !unread_python.count(s->w.spec.local_rank)) continue;
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
  off_loop([this, worker, program, lr, gen = generation, limit = opt.stack_dump_timeout] {
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
  unread_python.clear();
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
  // In the worker's directory: a FIFO it left there is not waited on for a reader.
  int fd = open_regular(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW);
  if (fd < 0) return false;
  write_fully(fd, text);
  ::close(fd);
  return true;
}

}  // namespace ddprun::agent
