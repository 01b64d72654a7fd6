#include "worker_group.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "event_log.hpp"
#include "process_runner.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A heartbeat time-out ends the job with this code (as timeout(1) does).
constexpr int kHeartbeatExitCode = 124;

bool stops(int sig) { return sig == SIGTERM || sig == SIGKILL || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT; }

}  // namespace

const char* to_string(FailureKind k) {
  switch (k) {
    case FailureKind::exit: return "exit";
    case FailureKind::signal: return "signal";
    case FailureKind::hang: return "hang";
    case FailureKind::oom: return "oom";
  }
  return "?";
}

// A worker with what the loop needs to run it: its pipes, its output, its heartbeat.
struct Slot {
  Worker w;
  std::unique_ptr<StreamOutput> out, err;
  std::unique_ptr<asio::posix::stream_descriptor> out_pipe, err_pipe;
  int open_pipes = 0;
  // Heartbeats are timed on the monotonic clock: what counts is when the agent saw the file's
  // mtime change, not the mtime's value, so a wall-clock step cannot kill or hide a worker.
  timespec beat_mtime{};
  SteadyClock::time_point last_beat;
};

struct WorkerGroup::Impl {
  asio::io_context& io;
  ProcessRunner& runner;
  Listener* listener = nullptr;
  Options opt;
  asio::steady_timer kill_timer{io}, heartbeat_timer{io}, drain_timer{io}, dump_timer{io};
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<Worker> view;  // what workers() returns, refreshed on every change
  int generation = 0;        // +1 per group: handlers of an earlier group check it
  bool is_stopping = false;
  bool kill_armed = false;
  bool is_ended = true;
  // Stacks of the running workers, collected once per group before it is stopped or killed.
  struct Dump {
    std::set<int> python, native;       // local ranks: stopped with SIGABRT / read by eu-stack or gdb
    std::map<int, std::string> text;    // native stacks as they arrive
    std::function<void()> then;         // what follows (stop, SIGKILL)
    bool done = false;
  };
  std::optional<Dump> dump;
  bool dump_started = false;
  std::vector<std::thread> dumpers;
  std::optional<long long> oom_kills_at_start;

  Impl(asio::io_context& i, ProcessRunner& r, Options o) : io(i), runner(r), opt(o) {}
  ~Impl() {
    for (auto& t : dumpers) t.join();  // each bounded by stack_dump_timeout
  }

  void refresh() {
    view.clear();
    for (const auto& s : slots) view.push_back(s->w);
  }

  void prepare(Slot& s) {
    const auto& spec = s.w.spec;
    std::error_code ec;
    if (!spec.error_file.empty()) ::unlink(spec.error_file.c_str());
    s.last_beat = SteadyClock::now();
    if (!spec.heartbeat_file.empty()) {
      // The clock starts at spawn. O_NOFOLLOW: a link planted there is not followed.
      int hb = ::open(spec.heartbeat_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (hb < 0) throw Error("cannot create '" + spec.heartbeat_file + "': " + std::strerror(errno));
      struct stat st{};
      if (::fstat(hb, &st) == 0) s.beat_mtime = st.st_mtim;
      ::close(hb);
    }
    s.out = std::make_unique<StreamOutput>(spec.out);
    s.err = std::make_unique<StreamOutput>(spec.err);
  }

  void start(std::vector<WorkerSpec> specs) {
    kill_timer.cancel();
    heartbeat_timer.cancel();
    drain_timer.cancel();
    dump_timer.cancel();
    ++generation;
    slots.clear();
    is_stopping = false;
    kill_armed = false;
    is_ended = false;
    dump.reset();
    dump_started = false;
    for (auto& spec : specs) {
      auto s = std::make_unique<Slot>();
      s->w.spec = std::move(spec);
      slots.push_back(std::move(s));
    }
    try {
      for (auto& s : slots) prepare(*s);
      for (auto& s : slots) spawn(*s);
    } catch (...) {
      bool any = false;
      for (auto& s : slots) {
        if (s->w.running) runner.signal_group(s->w.pid, SIGKILL);
        any = any || s->w.running;
      }
      is_stopping = true;
      is_ended = !any;  // else the killed ones end it when reaped
      refresh();
      throw;
    }
    oom_kills_at_start = cgroup_oom_kills();
    refresh();
    arm_heartbeat_check();
  }

  void spawn(Slot& s) {
    auto p = runner.start(s.w.spec.argv, s.w.spec.env, s.w.spec.binding ? &*s.w.spec.binding : nullptr);
    s.w.pid = p.pid;
    s.w.running = true;
    s.w.started_wall = std::chrono::system_clock::now();
    open_pipe(s, s.out_pipe, p.stdout_fd, *s.out);
    open_pipe(s, s.err_pipe, p.stderr_fd, *s.err);
  }

  void open_pipe(Slot& s, std::unique_ptr<asio::posix::stream_descriptor>& pipe, int fd, StreamOutput& out) {
    if (fd < 0) return;
    pipe = std::make_unique<asio::posix::stream_descriptor>(io, fd);
    ++s.open_pipes;
    read_pipe(s, *pipe, out);
  }

  void read_pipe(Slot& s, asio::posix::stream_descriptor& pipe, StreamOutput& out) {
    auto buf = std::make_shared<std::array<char, 65536>>();
    pipe.async_read_some(asio::buffer(*buf), [this, &s, &pipe, &out, buf, gen = generation](boost::system::error_code ec,
                                                                                           std::size_t n) {
      if (ec == asio::error::operation_aborted || gen != generation) return;
      if (n > 0) out.write(std::string_view(buf->data(), n));
      if (ec) {  // end of file (every holder of the pipe closed it) or an error
        out.finish();
        boost::system::error_code ignored;
        pipe.close(ignored);
        --s.open_pipes;
        check_dump();
        maybe_ended();
        return;
      }
      read_pipe(s, pipe, out);
    });
  }

  Slot* find(pid_t pid) {
    for (auto& s : slots) {
      if (s->w.pid == pid) return s.get();
    }
    return nullptr;
  }

  void reap() {
    for (const auto& e : runner.reap()) {
      Slot* s = find(e.pid);
      if (!s || !s->w.running) continue;  // the guardian, or a worker of an earlier group
      Worker& w = s->w;
      w.running = false;
      w.status = e.status;
      w.ended_wall = std::chrono::system_clock::now();
      // Grandchildren die with their worker: the group goes, whatever is left of it.
      runner.signal_group(w.pid, SIGKILL);
      runner.forget(w.pid);
      spdlog::debug("ddprun: worker {} (pid {}) ended: {}", w.spec.rank, w.pid, w.status.describe());
      refresh();
      check_dump();
      if (w.status.success() || w.reported) continue;
      w.reported = true;
      std::string reason = w.stopped_by_agent ? w.status.describe() + " (stopped by ddprun)" : w.status.describe();
      listener->on_worker_failed(w, reason, w.status.shell_code(), kind_of(w));
    }
    maybe_ended();
  }

  FailureKind kind_of(const Worker& w) const {
    if (w.status.signal == 0) return FailureKind::exit;
    auto now = cgroup_oom_kills();
    if (w.status.signal == SIGKILL && now && oom_kills_at_start && *now > *oom_kills_at_start) return FailureKind::oom;
    return FailureKind::signal;
  }

  void signal_running(int sig) {
    for (auto& s : slots) {
      if (!s->w.running) continue;
      s->w.stopped_by_agent = s->w.stopped_by_agent || stops(sig);
      runner.signal_group(s->w.pid, sig);
    }
    refresh();
  }

  bool any_running() const {
    for (const auto& s : slots) {
      if (s->w.running) return true;
    }
    return false;
  }

  void stop(int sig, bool stacks_first) {
    bool any = any_running();
    is_stopping = true;
    heartbeat_timer.cancel();
    if (stacks_first && any && start_dump([this, sig] { stop(sig, false); })) return;
    signal_running(sig);
    if (!any || kill_armed) return;
    kill_armed = true;
    kill_timer.expires_after(opt.stop_timeout);
    kill_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (ec || gen != generation) return;
      for (auto& s : slots) {
        if (!s->w.running) continue;
        spdlog::warn("ddprun: worker {} (pid {}) did not stop within {} of SIGTERM; {}sending SIGKILL", s->w.spec.rank,
                     s->w.pid, duration_text(opt.stop_timeout), dump_started ? "" : "collecting its stack, then ");
      }
      if (!start_dump([this] { signal_running(SIGKILL); })) signal_running(SIGKILL);
    });
  }

  // ---- stacks -----------------------------------------------------------------------------------

  // Starts collecting the stacks of the running workers, all at once; `then` runs when they are
  // in, or after stack_dump_timeout. False when there is nothing to do (off, done already).
  bool start_dump(std::function<void()> then) {
    if (opt.stack_dump_timeout.count() <= 0 || dump_started) return false;
    dump_started = true;
    dump.emplace();
    dump->then = std::move(then);
    for (auto& s : slots) {
      Worker& w = s->w;
      if (!w.running) continue;
      int lr = w.spec.local_rank;
      w.stopped_by_agent = true;
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
    refresh();
    dump_timer.expires_after(opt.stack_dump_timeout + std::chrono::milliseconds(200));
    dump_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (!ec && gen == generation) finish_dump();
    });
    check_dump();
    return true;
  }

  // Done when every native stack is in and every Python worker is gone with its output drained.
  void check_dump() {
    if (!dump || dump->done) return;
    if (dump->text.size() < dump->native.size()) return;
    for (auto& s : slots) {
      if (dump->python.count(s->w.spec.local_rank) && (s->w.running || s->open_pipes > 0)) return;
    }
    asio::post(io, [this, gen = generation] {
      if (gen == generation) finish_dump();
    });
  }

  void finish_dump() {
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

  static bool write_stack_file(const std::string& path, const std::string& text) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return false;
    write_fully(fd, text);
    ::close(fd);
    return true;
  }

  void arm_heartbeat_check() {
    if (opt.worker_timeout.count() <= 0) return;
    auto interval = std::clamp(opt.worker_timeout / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
    heartbeat_timer.expires_after(interval);
    heartbeat_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (ec || gen != generation || is_stopping) return;
      check_heartbeats(SteadyClock::now());
      if (!is_stopping) arm_heartbeat_check();
    });
  }

  // A worker beats by touching its file; the agent notices the mtime change at its next check
  // (every worker_timeout/10, 20 ms to 1 s), so a beat counts at most one interval late.
  void check_heartbeats(SteadyClock::time_point now) {
    if (opt.worker_timeout.count() <= 0 || is_stopping) return;
    for (auto& s : slots) {
      Worker& w = s->w;
      if (!w.running || w.stopped_by_agent || w.reported || w.spec.heartbeat_file.empty()) continue;
      struct stat st{};
      if (::stat(w.spec.heartbeat_file.c_str(), &st) == 0 &&
          (st.st_mtim.tv_sec != s->beat_mtime.tv_sec || st.st_mtim.tv_nsec != s->beat_mtime.tv_nsec)) {
        s->beat_mtime = st.st_mtim;
        s->last_beat = now;
      }
      if (now - s->last_beat > opt.worker_timeout) {
        char reason[128];
        std::snprintf(reason, sizeof(reason), "no heartbeat for %.1f s (--worker_timeout=%.1f)",
                      std::chrono::duration<double>(now - s->last_beat).count(),
                      std::chrono::duration<double>(opt.worker_timeout).count());
        w.reported = true;
        refresh();
        listener->on_worker_failed(w, reason, kHeartbeatExitCode, FailureKind::hang);
        return;  // the listener stops the group
      }
    }
  }

  void maybe_ended() {
    if (is_ended) return;
    for (const auto& s : slots) {
      if (s->w.running) return;
    }
    bool drained = true;
    for (const auto& s : slots) drained = drained && s->open_pipes == 0;
    if (drained) return end();
    // Output still in the pipes: wait for it briefly (a grandchild that escaped the process
    // group could hold a pipe open forever).
    drain_timer.expires_after(2s);
    drain_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (!ec && gen == generation) end();
    });
  }

  // Once per group: a drain timer that fired just as the last pipe closed ends nothing twice.
  void end() {
    if (is_ended) return;
    finish_dump();  // a dump in progress completes first: its Python workers' output is all in
    is_ended = true;
    drain_timer.cancel();
    kill_timer.cancel();
    heartbeat_timer.cancel();
    for (auto& s : slots) {
      boost::system::error_code ignored;
      if (s->out_pipe && s->out_pipe->is_open()) {
        s->out->finish();
        s->out_pipe->close(ignored);
      }
      if (s->err_pipe && s->err_pipe->is_open()) {
        s->err->finish();
        s->err_pipe->close(ignored);
      }
    }
    listener->on_group_ended();
  }
};

WorkerGroup::WorkerGroup(boost::asio::io_context& io, ProcessRunner& runner, Options options)
    : impl_(std::make_unique<Impl>(io, runner, options)) {}
void WorkerGroup::set_listener(Listener& listener) { impl_->listener = &listener; }
WorkerGroup::~WorkerGroup() = default;
void WorkerGroup::start(std::vector<WorkerSpec> specs) { impl_->start(std::move(specs)); }
void WorkerGroup::reap() { impl_->reap(); }
void WorkerGroup::stop(int sig, bool stacks_first) { impl_->stop(sig, stacks_first); }
void WorkerGroup::kill_now() { impl_->signal_running(SIGKILL); }
void WorkerGroup::forward(int sig) {
  for (auto& s : impl_->slots) {
    if (s->w.running) impl_->runner.signal_group(s->w.pid, sig);
  }
}
void WorkerGroup::check_heartbeats(std::chrono::steady_clock::time_point now) { impl_->check_heartbeats(now); }
bool WorkerGroup::stopping() const { return impl_->is_stopping; }
bool WorkerGroup::ended() const { return impl_->is_ended; }
const std::vector<Worker>& WorkerGroup::workers() const { return impl_->view; }
std::deque<std::string> WorkerGroup::stderr_tail(int local_rank) const {
  for (const auto& s : impl_->slots) {
    if (s->w.spec.local_rank == local_rank && s->err) return s->err->tail();
  }
  return {};
}

}  // namespace ddprun::agent
