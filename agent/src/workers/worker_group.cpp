#include "workers/worker_group_impl.hpp"

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
#include "ddprun/common/exit_status.hpp"
#include "ddprun/common/text.hpp"
#include "observe/event_log.hpp"
#include "workers/process_runner.hpp"

namespace ddprun::agent {
namespace {

using namespace std::chrono_literals;

// A heartbeat time-out ends the job with this code (as timeout(1) does).
constexpr int kHeartbeatExitCode = 124;

// Across nodes, a rank of this node silent this long while another beat within it works alone
// (find_hang). Ranks of a DDP job beat together, each step; a forward pass beats once a second.
constexpr auto kWorkingAlone = 3s;

bool stops(int sig) { return sig == SIGTERM || sig == SIGKILL || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT; }

}  // namespace

int stack_signal() { return SIGRTMIN + 6; }

const char* to_string(FailureKind k) {
  switch (k) {
    case FailureKind::exit: return "exit";
    case FailureKind::signal: return "signal";
    case FailureKind::hang: return "hang";
    case FailureKind::oom: return "oom";
  }
  return "?";
}

void WorkerGroup::Impl::prepare(Slot& s) {
  const auto& spec = s.w.spec;
  if (!spec.error_file.empty()) ::unlink(spec.error_file.c_str());
  s.hb.reset({}, SteadyClock::now());
  if (!spec.heartbeat_file.empty()) {
    // The start-up clock starts at spawn. O_NOFOLLOW: a link planted there is not followed.
    int hb = ::open(spec.heartbeat_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (hb < 0) throw Error("cannot create '" + spec.heartbeat_file + "': " + std::strerror(errno));
    // Its mtime set far in the past: a beat is an mtime that differs from this one, and a worker
    // that beats within the file system's timestamp tick of this creation (a few ms) would
    // otherwise leave the mtime as it was, and its first beat unseen.
    const timespec long_ago[2] = {{0, UTIME_OMIT}, {1, 0}};
    ::futimens(hb, long_ago);
    struct stat st{};
    if (::fstat(hb, &st) == 0) s.hb.reset(st.st_mtim, SteadyClock::now());
    ::close(hb);
    ::unlink((spec.heartbeat_file + ".stack").c_str());  // the last attempt's stacks and trainer
    ::unlink((spec.heartbeat_file + ".pid").c_str());
  }
  s.out = std::make_unique<StreamOutput>(spec.out);
  s.err = std::make_unique<StreamOutput>(spec.err);
}

void WorkerGroup::Impl::start(std::vector<WorkerSpec> specs) {
  kill_timer.cancel();
  heartbeat_timer.cancel();
  drain_timer.cancel();
  dump_timer.cancel();
  gpu_timer.cancel();
  first_beat_timer.cancel();
  first_beats = nullptr;
  first_beats_since = {};
  spare_timer.cancel();
  ++generation;
  slots.clear();
  state = State::running;
  dump.reset();
  dump_started = false;
  hang.reset();
  inspection.reset();
  inspect_timer.cancel();
  pace_due = SteadyClock::now() + std::max(opt.hang.floor, std::chrono::milliseconds(1000));
  pace = PaceJudge();  // a new group's ranks start their runs afresh
  unread_python.clear();
  swept = false;
  for (auto& spec : specs) {
    auto s = std::make_unique<Slot>();
    s->w.spec = std::move(spec);
    slots.push_back(std::move(s));
  }
  try {
    for (auto& s : slots) prepare(*s);
    spawn_all();
  } catch (...) {
    bool any = false;
    for (auto& s : slots) {
      if (s->w.running()) runner.signal_group(s->w.pid, SIGKILL);
      any = any || s->w.running();
    }
    state = any ? State::stopping : State::ended;  // the killed ones end it when reaped
    throw;
  }
  std::vector<pid_t> pgids;
  for (auto& s : slots) pgids.push_back(s->w.pid);
  runner.watch(pgids);
  oom_kills_at_start = cgroup_oom_kills();
  arm_heartbeat_check();
  if (spares && spares_wanted) {
    // --preload=auto reads what the workers report at their first step: waited for longer.
    spares_due = SteadyClock::now() + (opt.spares.preload_auto ? std::max<std::chrono::milliseconds>(opt.spares.delay, 30s)
                                                                 : opt.spares.delay);
    arm_spares();
  }
}

void WorkerGroup::Impl::open_pipe(Slot& s, std::unique_ptr<asio::posix::stream_descriptor>& pipe, int fd, StreamOutput& out) {
  if (fd < 0) return;
  try {
    pipe = std::make_unique<asio::posix::stream_descriptor>(io, fd);
  } catch (...) {
    ::close(fd);  // not the descriptor's yet
    throw;
  }
  ++s.open_pipes;
  read_pipe(s, *pipe, out);
}

void WorkerGroup::Impl::read_pipe(Slot& s, asio::posix::stream_descriptor& pipe, StreamOutput& out) {
  // Default-initialised, not zeroed: with many workers, zeroing 64 KiB a pipe cost more than
  // starting them (every page touched at once).
  auto buf = std::shared_ptr<std::array<char, 65536>>(new std::array<char, 65536>);
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

Slot* WorkerGroup::Impl::find(pid_t pid) {
  for (auto& s : slots) {
    if (s->w.pid == pid) return s.get();
  }
  return nullptr;
}

void WorkerGroup::Impl::reap() {
  for (const auto& e : runner.reap()) {
    Slot* s = find(e.pid);
    if (!s && spares && spares->on_exit(e.pid)) continue;  // a warm spare died while it waited
    if (!s || !s->w.running()) continue;  // the guardian, or a worker of an earlier group
    Worker& w = s->w;
    w.life = Life::ended;
    w.status = e.status;
    last_exits[w.spec.local_rank] = {w.spec.rank, w.status.shell_code()};
    w.ended_wall = std::chrono::system_clock::now();
    // Grandchildren die with their worker: the group goes, whatever is left of it.
    runner.signal_group(w.pid, SIGKILL);
    runner.forget(w.pid);
    spdlog::debug("ddprun: worker {} (pid {}) ended: {}", w.spec.rank, w.pid, w.status.describe());
    check_dump();
    if (w.status.success() || w.standing == Standing::reported) continue;
    // Only a death by ddprun's signal is ddprun's doing: an exit code is the worker's own.
    bool stopped = w.stopped_by_agent() && w.status.signal != 0;
    std::string reason = stopped ? w.status.describe() + " (stopped by ddprun)" : w.status.describe();
    listener->on_worker_failed(w, reason, w.status.shell_code(), kind_of(w));
    w.raise(Standing::reported);
  }
  maybe_ended();
}

FailureKind WorkerGroup::Impl::kind_of(const Worker& w) const {
  if (w.status.signal == 0) return FailureKind::exit;
  if (w.status.signal != SIGKILL) return FailureKind::signal;  // the OOM killer sends SIGKILL only
  auto now = cgroup_oom_kills();
  if (now && oom_kills_at_start && *now > *oom_kills_at_start) return FailureKind::oom;
  return FailureKind::signal;
}

void WorkerGroup::Impl::signal_running(int sig) {
  for (auto& s : slots) {
    if (!s->w.running()) continue;
    if (stops(sig)) s->w.raise(Standing::stopped);
    runner.signal_group(s->w.pid, sig);
  }
}

bool WorkerGroup::Impl::any_running() const {
  for (const auto& s : slots) {
    if (s->w.running()) return true;
  }
  return false;
}

void WorkerGroup::Impl::stop(int sig, Stacks stacks) {
  bool any = any_running();
  if (state == State::running) state = State::stopping;
  heartbeat_timer.cancel();
  inspect_timer.cancel();
  if (inspection) {  // a report cut short: this stop reads the stacks itself
    inspection.reset();
    dump_started = false;
  }
  if (stacks == Stacks::first && any && start_dump([this, sig] { stop(sig, Stacks::after_timeout); })) return;
  signal_running(sig);
  if (!any || state != State::stopping) return;
  state = State::killing;
  kill_timer.expires_after(opt.stop_timeout);
  kill_timer.async_wait([this, sig, gen = generation](boost::system::error_code ec) {
    if (ec || gen != generation) return;
    for (auto& s : slots) {
      if (!s->w.running()) continue;
      spdlog::warn("ddprun: worker {} (pid {}) did not stop within {} of {}; {}sending SIGKILL", s->w.spec.rank,
                   s->w.pid, duration_text(opt.stop_timeout), signal_name(sig),
                   dump_started || opt.stack_dump_timeout.count() == 0 ? "" : "collecting its stack, then ");
    }
    if (!start_dump([this] { signal_running(SIGKILL); })) signal_running(SIGKILL);
  });
}

void WorkerGroup::Impl::arm_heartbeat_check() {
  if (!opt.hang.on()) return;
  auto basis = opt.hang.adaptive ? opt.hang.floor : opt.hang.fixed;
  auto interval = std::clamp(basis / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
  heartbeat_timer.expires_after(interval);
  heartbeat_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
    if (ec || gen != generation || stopping()) return;
    check_heartbeats(SteadyClock::now());
    if (!stopping()) arm_heartbeat_check();
  });
}

namespace {
double secs(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

std::string WorkerGroup::Impl::silence_reason(const Slot& s, SteadyClock::time_point now) const {
  const auto silent = secs(s.hb.silent(now));
  const auto bound = secs(s.hb.bound(opt.hang));
  if (!opt.hang.adaptive && s.hb.beaten()) {
    return fmt::format("no heartbeat for {:.1f} s (--worker_timeout={:.1f})", silent, secs(opt.hang.fixed));
  }
  if (!opt.hang.adaptive || s.hb.steps() == 0) {
    return fmt::format("no first {} within {:.1f} s of its start (--worker_start_timeout={:.1f}; raise it if start-up "
                       "takes longer)",
                       opt.hang.adaptive ? "optimizer step" : "heartbeat", silent, bound);
  }
  return fmt::format("no progress for {:.1f} s (--worker_timeout=auto: its bound is {:.1f} s, the larger of "
                     "--hang_floor={:.0f} and {}x its recent long step, {:.2f} s)",
                     silent, bound, secs(opt.hang.floor), kAutoFactor, secs(s.hb.longest_step()));
}

// Each window, the share of a core each rank's main thread used while it made steps: judged
// over the node's ranks (observe/pace_judge.hpp), and told to the listener (across nodes).
void WorkerGroup::Impl::watch_pace(SteadyClock::time_point now) {
  if (now < pace_due) return;
  const auto every = std::max(opt.hang.floor, std::chrono::milliseconds(1000));
  pace_due = now + every;
  std::vector<Slot*> running;
  std::vector<pid_t> pids;
  for (auto& s : slots) {
    if (s->w.running() && s->w.standing == Standing::own && !s->w.spec.heartbeat_file.empty()) {
      running.push_back(s.get());
      pids.push_back(s->w.pid);
    }
  }
  if (running.empty()) return;
  auto targets = runner.stack_targets(pids);
  for (std::size_t i = 0; i < running.size(); ++i) {
    Slot& s = *running[i];
    pid_t pid = i < targets.size() && !targets[i].python.empty() ? targets[i].python.front()
                : i < targets.size() && targets[i].native > 0 ? targets[i].native : s.w.pid;
    if (pid_t trainer = training_process(s.w.spec.heartbeat_file, s.w.pid); trainer > 0) pid = trainer;
    long long cpu = runner.sample(pid).busy_ns;
    const bool stepped = s.hb.steps() > s.pace_steps && s.pace_steps > 0;
    s.w.busy = pid == s.pace_pid && cpu >= 0 && s.pace_cpu >= 0 && stepped && now > s.pace_at
                   ? static_cast<double>(cpu - s.pace_cpu) / 1e9 / secs(now - s.pace_at)
                   : -1;
    s.pace_pid = pid;
    s.pace_cpu = cpu;
    s.pace_at = now;
    s.pace_steps = s.hb.steps();
  }
  std::map<int, double> busy;
  for (auto* s : running) {
    if (s->w.busy >= 0) busy[s->w.spec.rank] = s->w.busy;
  }
  for (const auto& n : pace.window(busy)) {
    for (auto* s : running) {
      if (s->w.spec.rank != n.rank) continue;
      spdlog::warn("ddprun: rank {} (pid {}) is a straggler: its main thread was busy {:.0f}% of the time over the last "
                   "{} windows of {:.0f} s, the node's other ranks {:.0f}%: they wait for it in every collective",
                   n.rank, s->w.pid, n.busy * 100, PaceJudge::kSlowWindows, secs(every),
                   n.others * 100);
      listener->on_straggler(s->w, n.busy, n.others);
    }
  }
  for (auto* s : running) s->w.straggler = pace.straggler(s->w.spec.rank);
  if (!busy.empty()) listener->on_pace(busy);
}

void WorkerGroup::Impl::fail_hung(Slot& s, SteadyClock::time_point now, const std::string& reason) {
  s.w.raise(Standing::reported);
  s.w.silent_s = secs(s.hb.silent(now));
  listener->on_worker_failed(s.w, reason, kHeartbeatExitCode, FailureKind::hang);
}

void WorkerGroup::Impl::watch_writes(Slot& s, SteadyClock::time_point now) {
  pid_t pid = training_process(s.w.spec.heartbeat_file, s.w.pid);
  if (pid <= 0) pid = s.w.pid;
  // Its main thread holds still (in a save, or hung): longer than a second and twice its long step.
  const auto silent = s.hb.silent(now);
  const bool still = silent > std::max<SteadyClock::duration>(std::chrono::seconds(1), 2 * s.hb.longest_step());
  s.writes.look(pid, now - silent, still, s.hb.saving(), now);
}

// A rank saving now: in torch.save (its file says so and it beat within the last 10 s: it beats
// every 2 s while saving), or writing to storage at a save's pace within the last kWritingWindow
// (or waiting on the disk, for kFlushGrace after). A save whose process hangs stops all of these
// and is a hang like any other.
const Slot* WorkerGroup::Impl::saving(SteadyClock::time_point now) const {
  for (const auto& s : slots) {
    if (!s->w.running()) continue;
    if (s->hb.saving() && s->hb.silent(now) < std::chrono::seconds(10)) return s.get();
    if (s->writes.saving(now)) return s.get();
  }
  return nullptr;
}

void WorkerGroup::Impl::check_heartbeats(SteadyClock::time_point now) {
  if (!opt.hang.on() || stopping()) return;
  for (auto& s : slots) {
    if (s->w.running() && !s->w.spec.heartbeat_file.empty()) {
      look_at_beat(*s, now);
      watch_writes(*s, now);
    }
  }
  if (!hang && opt.hang.adaptive) watch_pace(now);
  if (hang) {
    follow_hang(now);
  } else if (!excused_by_save(now)) {
    find_hang(now);
  }
}

// The rank reported hung: cleared when it beats again (or ended), stopped at --hang_stop.
void WorkerGroup::Impl::follow_hang(SteadyClock::time_point now) {
  Slot* s = nullptr;
  for (auto& x : slots) {
    if (x->w.spec.local_rank == hang->local_rank) s = x.get();
  }
  if (!s || !s->w.running() || s->w.standing != Standing::own) {
    // It ended (its end is reported on its own): the others are watched again.
    if (hang->reported) hang.reset(), dump_started = false;
    return;
  }
  if (s->hb.last() > hang->last_beat) {
    if (!hang->reported) return;  // the report is being read: cleared once it is out
    const double after = secs(now - hang->found);
    spdlog::warn("ddprun: rank {} made progress again {:.1f} s after it was reported hung; the job goes on",
                 s->w.spec.rank, after);
    listener->on_hang_cleared(s->w.spec.rank, after);
    hang.reset();
    dump_started = false;  // a later stop reads the stacks again
    unread_python.clear();
    return;
  }
  if (hang->stop_at && now >= *hang->stop_at) {
    fail_hung(*s, now, fmt::format("no progress for {:.1f} s (reported hung {:.1f} s earlier; --hang_stop={:.0f})",
                                   secs(s->hb.silent(now)), secs(now - hang->found), secs(opt.hang_stop)));
  }
}

// A rank in torch.save (here, or writing a checkpoint): the others' silence is no hang meanwhile.
bool WorkerGroup::Impl::excused_by_save(SteadyClock::time_point now) {
  const Slot* saver = saving(now);
  if (saver && nodes > 1) listener->on_saving();
  if (saver) {
    // The others wait for it in a collective: their silence is not a hang while it saves, and
    // counts again from its end (they leave the collective only once it has made its next step).
    saved_until = now;
    if (saver->w.spec.local_rank != logged_saver) {
      spdlog::info("ddprun: rank {} is {}; the other ranks' silence is not taken for a hang until it ends",
                   saver->w.spec.rank,
                   !saver->writes.wrote_lately(now)
                       ? "saving a checkpoint (torch.save)"
                                      : fmt::format("writing to storage (over {} MB within {} s: a checkpoint save)",
                                                    kWritingBytes >> 20, kWritingWindow.count()));
    }
    logged_saver = saver->w.spec.local_rank;
    return true;
  }
  logged_saver = -1;
  return false;
}

// The first silent rank past its bound (unless a rank of another node saves): reported hung.
// Under auto, a rank that still makes progress is waited for by the others in a collective (rank
// 0 evaluating alone while the rest sit in a barrier): a rank's silence counts from the newest
// beat of any rank here, so a hang is this node's ranks silent together. (Where no collective
// ties the ranks, a rank stuck beside others that work on is found once they end.)
void WorkerGroup::Impl::find_hang(SteadyClock::time_point now) {
  SteadyClock::time_point beat{};  // the newest beat of a running rank here
  for (auto& s : slots) {
    if (s->w.running() && !s->w.spec.heartbeat_file.empty()) beat = std::max(beat, s->hb.last());
  }
  if (nodes > 1 && opt.hang.adaptive && now - beat <= kWorkingAlone) {
    // A rank silent while another works (rank 0 evaluating alone, the rest in a barrier): said to
    // the other nodes, whose ranks wait too, as a save is, from now on, not only once this node's
    // silent rank is past its bound (a save that ends into such an evaluation left the others a
    // gap as long as that bound, and they reported a hang in it).
    for (auto& s : slots) {
      if (s->w.running() && !s->w.spec.heartbeat_file.empty() && now - s->hb.last() > kWorkingAlone) {
        listener->on_saving();
        break;
      }
    }
  }
  bool waiting = false;  // a rank past its bound waits for another that beats
  for (auto& s : slots) {
    Worker& w = s->w;
    if (!w.running() || w.standing != Standing::own || w.spec.heartbeat_file.empty()) continue;
    auto bound = s->hb.bound(opt.hang);
    if (bound.count() <= 0 || std::min(s->hb.silent(now), now - saved_until) <= bound) continue;
    if (opt.hang.adaptive && now - beat <= bound) {  // (a fixed --worker_timeout=S judges each worker alone)
      waiting = true;
      continue;
    }
    if (nodes > 1) {
      // A rank of another node in torch.save: this node's ranks wait for it (asked only now, at
      // a silence: one request a check while it lasts).
      const auto remote = listener->others_saving();
      if (!remote) return;
      if (*remote) {
        if (!logged_remote) {
          spdlog::info("ddprun: a rank of another node is saving a checkpoint, or making progress while its "
                       "node's other ranks wait; this node's ranks' silence is not taken for a hang until it ends");
        }
        logged_remote = true;
        saved_until = now;
        return;
      }
    }
    hang = Hang{w.spec.local_rank, s->hb.last(), now, silence_reason(*s, now), false, std::nullopt};
    w.silent_s = secs(s->hb.silent(now));
    spdlog::warn("ddprun: rank {} (pid {}) looks hung: {}; reading every rank's {}", w.spec.rank, w.pid, hang->reason,
                 opt.stack_dump_timeout.count() > 0 ? "stack" : "state (no stacks: --stack_dump_timeout=0)");
    inspect();
    return;
  }
  // Said to the other nodes as a save is: their ranks wait for this node's working one.
  if (waiting && nodes > 1) listener->on_saving();
  logged_remote = false;  // nobody silent: a later save is said again
}

void WorkerGroup::Impl::maybe_ended() {
  if (state == State::ended) return;
  for (const auto& s : slots) {
    if (s->w.running()) return;
  }
  sweep_leftovers();
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

// Every worker ended: whatever they started and left running (a daemon, `setsid cmd &`) ends
// with them, before the pipes they may hold are drained (README: Security).
void WorkerGroup::Impl::sweep_leftovers() {
  if (swept) return;
  swept = true;
  auto left = runner.sweep();
  if (left.empty()) return;
  std::string names;
  for (std::size_t i = 0; i < left.size() && i < 20; ++i) names += (i ? ", " : "") + left[i];
  if (left.size() > 20) names += fmt::format(" and {} more", left.size() - 20);
  spdlog::warn("ddprun: killed {} process(es) the workers left behind: {}", left.size(), names);
}

void WorkerGroup::Impl::end() {
  if (state == State::ended) return;
  finish_dump();  // a dump in progress completes first: its Python workers' output is all in
  state = State::ended;
  drain_timer.cancel();
  kill_timer.cancel();
  heartbeat_timer.cancel();
  first_beat_timer.cancel();
  inspect_timer.cancel();
  for (auto& s : slots) {
    for (auto* o : {s->out.get(), s->err.get()}) {
      if (o && o->file_loss()) log_losses.push_back(*o->file_loss());
    }
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
  announce_end(SteadyClock::now() + opt.gpu_release_timeout, false);
}

void WorkerGroup::Impl::announce_end(SteadyClock::time_point deadline, bool said) {
  std::vector<pid_t> unclean;
  for (const auto& s : slots) {
    if (!s->w.status.success()) unclean.push_back(s->w.pid);
  }
  auto held = opt.gpu_holders && !unclean.empty() ? opt.gpu_holders(unclean) : std::vector<pid_t>{};
  if (held.empty() || SteadyClock::now() >= deadline) {
    if (!held.empty()) {
      spdlog::warn("ddprun: GPU memory of {} ended worker(s) is still held after {}; going on", held.size(),
                   duration_text(opt.gpu_release_timeout));
    } else if (said) {
      spdlog::info("ddprun: the ended workers' GPU memory is free");
    }
    return listener->on_group_ended();
  }
  if (!said) {
    spdlog::info("ddprun: waiting for the GPU memory of {} ended worker(s) to be released before going on (at most {})",
                 held.size(), duration_text(opt.gpu_release_timeout));
  }
  gpu_timer.expires_after(std::chrono::milliseconds(200));
  gpu_timer.async_wait([this, deadline, gen = generation](boost::system::error_code ec) {
    if (!ec && gen == generation) announce_end(deadline, true);
  });
}

boost::asio::io_context& WorkerGroup::loop() const { return impl_->io; }

WorkerGroup::Options WorkerGroup::Options::from(const AgentOptions& a) {
  Options o;
  o.hang.adaptive = a.worker_timeout_auto;
  o.hang.fixed = a.worker_timeout_auto ? std::chrono::milliseconds(0) : a.worker_timeout;
  o.hang.start = a.worker_start_timeout;
  o.hang.floor = a.hang_floor;
  o.hang_stop = a.hang_stop;
  o.stop_timeout = a.stop_timeout;
  o.stack_dump_timeout = a.stack_dump_timeout;
  o.stack_signal = a.python_site_dir.empty() ? 0 : agent::stack_signal();
  o.spares = a.spares;
  return o;
}

WorkerGroup::WorkerGroup(boost::asio::io_context& io, ProcessRunner& runner, Options options)
    : impl_(std::make_unique<Impl>(io, runner, options)) {}
void WorkerGroup::set_listener(Listener& listener) { impl_->listener = &listener; }
WorkerGroup::~WorkerGroup() = default;
void WorkerGroup::start(std::vector<WorkerSpec> specs) { impl_->start(std::move(specs)); }
void WorkerGroup::reap() { impl_->reap(); }
void WorkerGroup::stop(int sig, Stacks stacks) { impl_->stop(sig, stacks); }
void WorkerGroup::kill_now() { impl_->signal_running(SIGKILL); }
void WorkerGroup::forward(int sig) {
  for (auto& s : impl_->slots) {
    if (s->w.running()) impl_->runner.signal_group(s->w.pid, sig);
  }
}
void WorkerGroup::check_heartbeats(std::chrono::steady_clock::time_point now) { impl_->check_heartbeats(now); }
void WorkerGroup::set_nodes(int nodes) { impl_->nodes = nodes; }
void WorkerGroup::set_spares_wanted(bool wanted) { impl_->spares_wanted = wanted; }
int WorkerGroup::warm_started() const { return impl_->warm; }
bool WorkerGroup::stopping() const { return impl_->stopping(); }
bool WorkerGroup::ended() const { return impl_->state == Impl::State::ended; }
std::vector<Worker> WorkerGroup::workers() const {
  std::vector<Worker> out;
  for (const auto& s : impl_->slots) out.push_back(s->w);
  return out;
}
const std::map<int, std::pair<int, int>>& WorkerGroup::last_exits() const { return impl_->last_exits; }
std::vector<StreamOutput::FileLoss> WorkerGroup::take_log_losses() { return std::exchange(impl_->log_losses, {}); }
std::deque<std::string> WorkerGroup::stderr_tail(int local_rank) const {
  for (const auto& s : impl_->slots) {
    // A warm worker's faulthandler dump: without the spare driver's frames, as its stack.txt.
    if (s->w.spec.local_rank == local_rank && s->err) return without_spare_driver(s->err->tail());
  }
  return {};
}

}  // namespace ddprun::agent
