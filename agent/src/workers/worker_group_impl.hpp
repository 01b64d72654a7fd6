#pragma once
// WorkerGroup's state, shared by worker_group.cpp (workers, pipes, reaping, stopping, heartbeats),
// worker_group_spares.cpp (handing attempts to warm spares) and worker_group_stacks.cpp
// (collecting stacks). Why one state in three files: each is a different use of the same live
// workers (their pids, pipes and exit states), and a
// spare's hand-over and a stack read each need the group's view of a worker at that instant; a
// class of their own would have to copy or lock that view. Private to the agent: Asio is here.

#include "workers/worker_group.hpp"
#include "workers/write_watch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/text.hpp"
#include "ddprun/common/thread.hpp"
#include "observe/event_log.hpp"
#include "observe/pace_judge.hpp"
#include "workers/process_runner.hpp"

namespace ddprun::agent {

namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;

// A worker with what the loop needs to run it: its pipes, its output, its heartbeat.
struct Slot {
  Worker w;
  std::unique_ptr<StreamOutput> out, err;
  std::unique_ptr<asio::posix::stream_descriptor> out_pipe, err_pipe;
  int open_pipes = 0;
  Heartbeat hb;  // watched when spec.heartbeat_file is set (heartbeat.hpp)
  // Its pace at the last window: the process read, its CPU time, its steps.
  pid_t pace_pid = -1;
  long long pace_cpu = -1, pace_steps = 0;
  SteadyClock::time_point pace_at;
  WriteWatch writes;  // its training process's writes to storage: a save of any kind (write_watch.hpp)
};


// The process that trains below `worker`, as the progress hook wrote it at its first step
// (HEARTBEAT.pid); -1 when there is none, or it is no longer below the worker.
pid_t training_process(const std::string& heartbeat, pid_t worker, const std::string& proc_root = "/proc");

struct WorkerGroup::Impl {
  asio::io_context& io;
  ProcessRunner& runner;
  Listener* listener = nullptr;
  Options opt;
  asio::steady_timer kill_timer{io}, heartbeat_timer{io}, drain_timer{io}, dump_timer{io}, gpu_timer{io}, first_beat_timer{io},
      inspect_timer{io};
  std::function<void()> first_beats;
  SteadyClock::time_point first_beats_since;  // watch_first_beats' call
  int warm = 0;  // workers of this group handed to warm spares
  std::unique_ptr<SparePool> spares;  // null: no spares
  asio::steady_timer spare_timer{io};
  SteadyClock::time_point spares_due;
  void arm_spares();  // watch_first_beats' callback, until called
  std::vector<std::unique_ptr<Slot>> slots;
  bool swept = false;        // what the workers left behind was killed (once per group)
  int generation = 0;        // +1 per group: handlers of an earlier group check it
  // The group's life: ended before the first start; stopping once told to stop; killing once
  // SIGKILL is scheduled for the workers still running after stop_timeout.
  enum class State { running, stopping, killing, ended };
  State state = State::ended;
  bool stopping() const { return state == State::stopping || state == State::killing; }
  // Stacks of the running workers, collected once per group before it is stopped or killed.
  struct Dump {
    std::set<int> python, native;       // local ranks: stopped with SIGABRT / read from outside
    std::map<int, std::string> text;    // native stacks as they arrive
    std::function<void()> then;         // what follows (stop, SIGKILL)
    bool done = false;
  };
  std::optional<Dump> dump;
  bool dump_started = false;
  // A hang found: the silent worker (local rank), since when, why; the report, then the stop.
  struct Hang {
    int local_rank = -1;
    SteadyClock::time_point last_beat, found;
    std::string reason;
    bool reported = false;                         // the report is out (the stacks are read)
    std::optional<SteadyClock::time_point> stop_at;
  };
  std::optional<Hang> hang;
  // Reading every running worker for a hang's report, without stopping any (worker_group_stacks.cpp).
  struct Inspection {
    struct Target {
      Slot* slot = nullptr;
      pid_t pid = -1;
      bool python = false;
      ProcSample before, after;  // the busy window's ends
      std::string stack_file;   // HEARTBEAT.stack, signalled: its size before, and when it last grew
      off_t offset = 0, seen = -1;
      std::string python_note;
      bool native_wanted = false, native_started = false;
      std::optional<std::string> native;
    };
    std::vector<Target> targets;
    // The native stacks are read once the Python dump is in (read during it, they show
    // faulthandler's own frames), or from python_by on, whichever comes first.
    SteadyClock::time_point started, python_by, deadline;
    double window = 0;  // seconds between the samples
  };
  std::optional<Inspection> inspection;
  std::set<int> unread_python;  // local ranks whose Python stack the report could not read
  // Stack readers, off the loop (each bounded by stack_dump_timeout).
  ThreadSet dumpers;
  void off_loop(std::function<void()> work) { dumpers.run("a stack reader", std::move(work)); }
  std::optional<long long> oom_kills_at_start;
  std::map<int, std::pair<int, int>> last_exits;  // local rank -> (rank, shell code), across groups
  std::vector<StreamOutput::FileLoss> log_losses;  // from ended groups, until taken

  Impl(asio::io_context& i, ProcessRunner& r, Options o) : io(i), runner(r), opt(o) {
    if (opt.spares.on) spares = std::make_unique<SparePool>(io, runner, opt.spares);
  }
  ~Impl() {
    dumpers.join_all();  // each bounded by stack_dump_timeout
  }


  void prepare(Slot& s);

  void start(std::vector<WorkerSpec> specs);

  void spawn_all();

  void open_pipe(Slot& s, std::unique_ptr<asio::posix::stream_descriptor>& pipe, int fd, StreamOutput& out);

  void read_pipe(Slot& s, asio::posix::stream_descriptor& pipe, StreamOutput& out);

  Slot* find(pid_t pid);

  void reap();

  FailureKind kind_of(const Worker& w) const;

  void signal_running(int sig);

  bool any_running() const;

  void stop(int sig, Stacks stacks);


  // Starts collecting the stacks of the running workers, all at once; `then` runs when they are
  // in, or after stack_dump_timeout. False when there is nothing to do (off, done already).
  bool start_dump(std::function<void()> then);

  // A worker with Python below it: SIGABRT to each of those processes, its stderr captured.
  void dump_python(Slot& s, const std::vector<pid_t>& pythons);
  // A native worker: `program`'s stack read on a thread of its own.
  void dump_native(Slot& s, pid_t program);

  // Done when every native stack is in and every Python worker is gone with its output drained.
  void check_dump();

  void finish_dump();
  void sweep_leftovers();

  static bool write_stack_file(const std::string& path, const std::string& text);

  void arm_heartbeat_check();

  // Looks at every watched worker's heartbeat; finds a silent one (then reads every worker for
  // the report: inspect), stops the group at the report's bound, or clears the report when the
  // silent worker beats again.
  void check_heartbeats(SteadyClock::time_point now);
  void follow_hang(SteadyClock::time_point now);
  bool excused_by_save(SteadyClock::time_point now);
  void find_hang(SteadyClock::time_point now);
  bool look_at_beat(Slot& s, SteadyClock::time_point now);
  // The rank in torch.save now (heartbeat.hpp), if one is; nobody is taken for hung meanwhile.
  const Slot* saving(SteadyClock::time_point now) const;
  void watch_writes(Slot& s, SteadyClock::time_point now);
  int logged_saver = -1;  // the local rank whose save was announced
  SteadyClock::time_point saved_until;  // the last check that found a rank saving (here or on another node)
  bool logged_remote = false;  // "a rank of another node is saving" was said
  int nodes = 1;          // the round's (set_nodes)
  bool spares_wanted = true;  // set_spares_wanted
  // Once a window (--hang_floor): each worker's busy share; a straggler is named once.
  void watch_pace(SteadyClock::time_point now);
  SteadyClock::time_point pace_due{};
  PaceJudge pace;  // the node's stragglers
  std::string silence_reason(const Slot& s, SteadyClock::time_point now) const;
  void fail_hung(Slot& s, SteadyClock::time_point now, const std::string& reason);

  // The report: each running worker's state (/proc) first, then its stacks (the stack signal for
  // Python, ddprun-stack for the native main thread), bounded by stack_dump_timeout.
  void inspect();
  void read_stacks();
  void poll_inspection();
  void read_native(std::size_t target);  // off the loop, bounded by the inspection's deadline
  void finish_inspection();
  void poll_first_beats();

  void maybe_ended();

  // Once per group: a drain timer that fired just as the last pipe closed ends nothing twice.
  void end();
  // Tells the listener the group ended, once the GPU memory of its workers that did not exit 0
  // is released (bounded by gpu_release_timeout).
  void announce_end(SteadyClock::time_point deadline, bool said);
};

}  // namespace ddprun::agent
