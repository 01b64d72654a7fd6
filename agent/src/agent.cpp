#include "ddprun/agent/agent.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <filesystem>
#include <future>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <spdlog/spdlog.h>

#include "ddprun/agent/exit_status.hpp"
#include "ddprun/rendezvous/error.hpp"
#include "ddprun/rendezvous/store_server.hpp"
#include "event_log.hpp"
#include "failure_report.hpp"
#include "round_records.hpp"
#include "coordinator.hpp"
#include "guardian.hpp"
#include "output.hpp"
#include "ddprun/agent/spawn.hpp"

namespace ddprun::agent {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A heartbeat time-out ends the job with this code (as timeout(1) does).
constexpr int kHeartbeatExitCode = 124;

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool stopped_by_agent = false;  // we signalled it: its death is a consequence, not a cause
  ExitStatus status;
  std::string dir, error_file, heartbeat_file;
  std::chrono::system_clock::time_point started_wall, ended_wall;
  // Heartbeats are timed on the monotonic clock: what counts is when the agent saw the file's
  // mtime change, not the mtime's value, so a wall-clock step cannot kill or hide a worker.
  timespec beat_mtime{};
  std::chrono::steady_clock::time_point last_beat;
  std::unique_ptr<StreamOutput> out, err;
  std::unique_ptr<asio::posix::stream_descriptor> out_pipe, err_pipe;
  int open_pipes = 0;
};

struct Agent::Impl {
  AgentOptions opt;
  Guardian guardian;  // first: forked while the process has one thread
  asio::io_context io{1};
  asio::signal_set signals{io};
  asio::steady_timer kill_timer{io};
  asio::steady_timer heartbeat_timer{io};
  asio::steady_timer drain_timer{io};
  std::unique_ptr<rendezvous::StoreServer> store;
  std::string run_dir;       // <log_dir>/<run_id>
  std::string temp_root;     // the temporary directory ddprun created (no --log_dir), removed at the end
  std::vector<Worker> workers;
  int attempt = 0;             // TORCHELASTIC_RESTART_COUNT
  int generation = 0;          // +1 per started worker group: stale handlers check it
  int restarts_left = 0;
  // Where this node's workers sit in the job (a single node: the whole job).
  int world_size = 1, rank_offset = 0, group_rank = 0, group_world = 1;
  std::string master_addr;
  std::uint16_t master_port = 0;
  std::string attempt_dir_name;  // attempt_<n>
  // Multi-node: the rendezvous.
  std::unique_ptr<Coordinator> coord;
  int round = 0;
  bool joining = false;                  // a rendezvous is in progress (on the joiner thread)
  std::future<void> joiner_finished;     // ready when the joiner thread has nothing left to do
  EventLog events;
  std::vector<std::string> round_hosts;  // by group rank, this round
  std::chrono::steady_clock::time_point job_start = std::chrono::steady_clock::now();
  std::optional<long long> oom_kills_at_start;  // cgroup OOM kills when the attempt started
  std::optional<std::string> round_end;  // why the current round ended (JSON), once known
  std::optional<RoundEnd> parsed_end;    // ... parsed (round_records.hpp)
  std::optional<std::string> protocol_error;  // ... or why it could not be
  bool store_lost = false;
  bool local_done = false;     // this node's workers are all gone for this round
  std::thread joiner;
  asio::steady_timer alive_timer{io};
  asio::steady_timer monitor_timer{io};
  long long neighbour_count = -2;
  Clock::time_point neighbour_changed;
  std::optional<FailureRecord> root_cause;
  std::vector<FailureRecord> failures;
  bool stopping = false;      // tearing the current attempt down
  bool attempt_over = false;  // finish_attempt ran for the current attempt
  int stop_signal = 0;        // ddprun was told to stop by this signal
  int exit_code = 0;
  bool done = false;
  Clock::time_point attempt_started;

  explicit Impl(AgentOptions o) : opt(std::move(o)), restarts_left(opt.max_restarts) {}
  ~Impl() {
    if (joiner.joinable()) joiner.detach();  // blocked in a store wait at exit: the process is ending
  }

  // ---- setting up -----------------------------------------------------------------------------

  // Without --log_dir, ddprun works in a fresh directory of its own under $TMPDIR (mkdtemp:
  // mode 0700), the only thing it ever removes. Directories it creates are 0700, files 0600: logs
  // may hold what workers print.
  void prepare_log_dir() {
    std::string base = opt.log_dir;
    if (base.empty()) {
      auto t = opt.base_env.find("TMPDIR");
      std::string tmpdir = t != opt.base_env.end() && !t->second.empty() ? t->second : "/tmp";
      std::string tmpl = tmpdir + "/ddprun-XXXXXX";
      if (!::mkdtemp(tmpl.data())) {
        throw Error("cannot create a temporary directory in '" + tmpdir + "': " + std::strerror(errno) +
                    " (set TMPDIR, or give --log_dir)");
      }
      base = temp_root = tmpl;
    }
    run_dir = base + "/" + opt.run_id;
    make_private_dirs(run_dir);
    if (!opt.log_dir.empty() || opt.redirects.any() || opt.tee.any()) {
      spdlog::info("ddprun: worker logs in {}", run_dir);
    }
  }

  // Creates `dir` and its missing parents, each new one 0700 (existing ones are left as they are).
  static void make_private_dirs(const std::string& dir) {
    std::vector<fs::path> created;
    fs::path p = dir;
    std::error_code ec;
    while (!p.empty() && !fs::exists(p, ec)) {
      created.push_back(p);
      p = p.parent_path();
    }
    for (auto it = created.rbegin(); it != created.rend(); ++it) {
      if (::mkdir(it->c_str(), 0700) != 0 && errno != EEXIST) {
        throw Error("cannot create log directory '" + it->string() + "': " + std::strerror(errno) +
                    " (choose another --log_dir)");
      }
    }
    if (!fs::is_directory(dir, ec)) throw Error("cannot use '" + dir + "' as a log directory: not a directory");
  }

  void start_store() {
    rendezvous::StoreServerOptions so;
    so.host = opt.store_host;
    so.port = opt.store_port;
    // One node: every worker is a process of this user on this host.
    so.same_user = true;
    so.allow = std::vector<std::string>{};
    so.reserved_fds = 64 + 8 * static_cast<std::size_t>(opt.nproc_per_node);
    try {
      store = std::make_unique<rendezvous::StoreServer>(so);
    } catch (const AddressInUseError&) {
      throw Error("cannot host the rendezvous store on " + opt.store_host + ":" + std::to_string(opt.store_port) +
                  ": the address is already in use (another job?). Use --standalone to pick a free port, "
                  "or another --master_port.");
    }
    store->start();
  }

  std::vector<std::string> worker_env(const Worker& w) const {
    std::map<std::string, std::string> env = opt.base_env;
    int world = world_size;
    auto set = [&](const std::string& k, const std::string& v) { env[k] = v; };
    set("RANK", std::to_string(w.rank));
    set("LOCAL_RANK", std::to_string(w.local_rank));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_WORLD_SIZE", std::to_string(opt.nproc_per_node));
    set("GROUP_RANK", std::to_string(group_rank));
    set("GROUP_WORLD_SIZE", std::to_string(group_world));
    set("ROLE_NAME", opt.role);
    set("ROLE_RANK", std::to_string(w.rank));
    set("ROLE_WORLD_SIZE", std::to_string(world));
    set("MASTER_ADDR", master_addr);
    set("MASTER_PORT", std::to_string(master_port));
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
    set("TORCHELASTIC_MAX_RESTARTS", std::to_string(opt.max_restarts));
    set("TORCHELASTIC_RUN_ID", opt.run_id);
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
    set("TORCHELASTIC_ERROR_FILE", w.error_file);
    set("DDPRUN_HEARTBEAT_FILE", w.heartbeat_file);
    env.try_emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    env.try_emplace("NCCL_ASYNC_ERROR_HANDLING", "1");  // the name PyTorch 1.13 reads
    if (opt.nproc_per_node > 1) env.try_emplace("OMP_NUM_THREADS", "1");
    std::vector<std::string> out;
    out.reserve(env.size());
    for (auto& [k, v] : env) out.push_back(k + "=" + v);
    return out;
  }

  StreamRoute route(const Worker& w, int which /*1 stdout, 2 stderr*/) const {
    StreamRoute r;
    bool redirect = opt.redirects.for_rank(w.local_rank) & which;
    bool tee = opt.tee.for_rank(w.local_rank) & which;
    bool shown = opt.local_ranks_filter.empty() || opt.local_ranks_filter.count(w.local_rank);
    if (!redirect && shown) r.console_fd = which == 1 ? STDOUT_FILENO : STDERR_FILENO;
    if (redirect || tee) r.file = w.dir + (which == 1 ? "/stdout.log" : "/stderr.log");
    r.keep_tail = which == 2;
    r.prefix = replace_all(replace_all(replace_all(opt.line_prefix_template, "${role_name}", opt.role),
                                       "${local_rank}", std::to_string(w.local_rank)),
                           "${rank}", std::to_string(w.rank));
    return r;
  }

  // ---- running an attempt -----------------------------------------------------------------------

  void start_attempt() {
    stopping = false;
    attempt_over = false;
    root_cause.reset();
    failures.clear();
    workers.clear();
    workers.resize(opt.nproc_per_node);
    attempt_started = Clock::now();
    ++generation;
    local_done = false;
    std::string attempt_dir = run_dir + "/" + attempt_dir_name;
    for (int i = 0; i < opt.nproc_per_node; ++i) {
      auto& w = workers[i];
      w.local_rank = i;
      w.rank = rank_offset + i;
      w.dir = attempt_dir + "/" + std::to_string(i);
      make_private_dirs(w.dir);
      w.error_file = w.dir + "/error.json";
      w.heartbeat_file = w.dir + "/heartbeat";
      std::error_code ec;
      fs::remove(w.error_file, ec);
      // The clock starts at spawn. O_NOFOLLOW: a link planted there is not followed.
      int hb = ::open(w.heartbeat_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (hb < 0) throw Error("cannot create '" + w.heartbeat_file + "': " + std::strerror(errno));
      struct stat st{};
      if (::fstat(hb, &st) == 0) w.beat_mtime = st.st_mtim;
      w.last_beat = std::chrono::steady_clock::now();
      ::close(hb);
      w.out = std::make_unique<StreamOutput>(route(w, 1));
      w.err = std::make_unique<StreamOutput>(route(w, 2));
    }
    for (auto& w : workers) spawn(w);
    oom_kills_at_start = cgroup_oom_kills();
    if (events.enabled()) {
      nlohmann::json ranks = nlohmann::json::array(), pids = nlohmann::json::array();
      for (const auto& w : workers) {
        ranks.push_back(w.rank);
        pids.push_back(w.pid);
      }
      events.emit("workers_started", {{"attempt", attempt}, {"round", round}, {"ranks", ranks}, {"pids", pids}});
    }
    if (coord) {
      spdlog::info("ddprun: round {}: node {} of {}, started ranks {}..{} of {} (restart count {}, store {}:{})", round,
                   group_rank, group_world, rank_offset, rank_offset + opt.nproc_per_node - 1, world_size, attempt,
                   master_addr, master_port);
    } else {
      spdlog::info("ddprun: started {} worker{} (attempt {}, store {}:{})", workers.size(),
                   workers.size() == 1 ? "" : "s", attempt, master_addr, master_port);
    }
    arm_heartbeat_check();
  }

  void spawn(Worker& w) {
    std::vector<std::string> argv;
    for (const auto& a : opt.command) argv.push_back(replace_all(a, "${local_rank}", std::to_string(w.local_rank)));
    auto p = spawn_process(argv, worker_env(w));
    w.pid = p.pid;
    w.running = true;
    w.started_wall = std::chrono::system_clock::now();
    guardian.watch(p.pid);
    w.out_pipe = std::make_unique<asio::posix::stream_descriptor>(io, p.stdout_fd);
    w.err_pipe = std::make_unique<asio::posix::stream_descriptor>(io, p.stderr_fd);
    w.open_pipes = 2;
    read_pipe(w, *w.out_pipe, *w.out);
    read_pipe(w, *w.err_pipe, *w.err);
  }

  void read_pipe(Worker& w, asio::posix::stream_descriptor& pipe, StreamOutput& out) {
    auto buf = std::make_shared<std::array<char, 65536>>();
    int gen = generation;
    pipe.async_read_some(asio::buffer(*buf), [this, &w, &pipe, &out, buf, gen](boost::system::error_code ec, std::size_t n) {
      if (ec == asio::error::operation_aborted || gen != generation) return;
      if (n > 0) out.write(std::string_view(buf->data(), n));
      if (ec) {  // end of file (every holder of the pipe closed it) or an error
        out.finish();
        boost::system::error_code ignored;
        pipe.close(ignored);
        --w.open_pipes;
        maybe_finish_attempt();
        return;
      }
      read_pipe(w, pipe, out);
    });
  }

  Worker* find(pid_t pid) {
    for (auto& w : workers) {
      if (w.pid == pid) return &w;
    }
    return nullptr;
  }

  void reap() {
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      Worker* w = find(pid);
      if (!w || !w->running) continue;  // the guardian, or a worker of an earlier attempt
      w->running = false;
      w->status = ExitStatus::from_wait_status(status);
      w->ended_wall = std::chrono::system_clock::now();
      // Grandchildren die with their worker: the group goes, whatever is left of it.
      ::kill(-w->pid, SIGKILL);
      guardian.forget(w->pid);
      spdlog::debug("ddprun: worker {} (pid {}) ended: {}", w->rank, w->pid, w->status.describe());
      if (root_cause && root_cause->pid == w->pid) continue;  // a hung worker we killed: already the cause
      if (!w->status.success()) on_failure(*w, w->stopped_by_agent ? "" : w->status.describe(), w->status.shell_code());
    }
    maybe_finish_attempt();
  }

  // A worker failed: the first failure is the root cause, the group is stopped.
  void on_failure(Worker& w, const std::string& reason, int code) {
    auto when = w.running ? std::chrono::system_clock::now() : w.ended_wall;
    FailureRecord f = make_failure_record(w.rank, w.local_rank, w.pid, w.status, when, w.error_file, {});
    f.reason = reason.empty() ? w.status.describe() + " (stopped by ddprun)" : reason;
    f.exit_code = code;
    if (!w.stopped_by_agent) emit_worker_failed(w, f.reason);
    if (!root_cause && !w.stopped_by_agent && stop_signal == 0 && !round_end) {
      root_cause = f;
      spdlog::debug("ddprun: root cause: rank {}: {}", w.rank, f.reason);
      if (coord) {
        if (!opt.rdzv.local_addr.empty()) f.host = opt.rdzv.local_addr;  // as the other nodes know this one
        f.stderr_tail = w.err ? w.err->tail() : std::deque<std::string>{};
        end_round_with(failure_json(f), group_world);
      }
      stop_workers(SIGTERM);
    } else {
      failures.push_back(f);
    }
  }

  // reason: "hang" (missed heartbeats), "oom" (SIGKILL while the cgroup's OOM-kill count rose),
  // "signal" or "exit".
  void emit_worker_failed(const Worker& w, const std::string& detail) {
    if (!events.enabled()) return;
    std::string kind = "exit";
    if (w.running) {
      kind = "hang";
    } else if (w.status.signal != 0) {
      kind = "signal";
      auto now = cgroup_oom_kills();
      if (w.status.signal == SIGKILL && now && oom_kills_at_start && *now > *oom_kills_at_start) kind = "oom";
    }
    nlohmann::json f = {{"rank", w.rank}, {"local_rank", w.local_rank}, {"pid", w.pid}, {"reason", kind},
                        {"detail", detail}, {"attempt", attempt}};
    f["exit_code"] = w.running || w.status.signal != 0 ? nlohmann::json() : nlohmann::json(w.status.code);
    f["signal"] = w.running || w.status.signal == 0 ? nlohmann::json() : nlohmann::json(w.status.signal);
    events.emit("worker_failed", f);
  }

  void stop_workers(int sig) {
    bool any = false;
    for (auto& w : workers) {
      if (!w.running) continue;
      w.stopped_by_agent = w.stopped_by_agent || sig == SIGTERM || sig == SIGKILL || sig == SIGINT ||
                           sig == SIGHUP || sig == SIGQUIT;
      ::kill(-w.pid, sig);
      any = true;
    }
    if (stopping || !any) {
      stopping = true;
      return;
    }
    stopping = true;
    kill_timer.expires_after(opt.stop_timeout);
    kill_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (ec || gen != generation) return;
      for (auto& w : workers) {
        if (w.running) {
          spdlog::warn("ddprun: worker {} (pid {}) did not stop within {:.1f} s of SIGTERM; sending SIGKILL", w.rank,
                       w.pid, seconds(opt.stop_timeout));
          w.stopped_by_agent = true;
          ::kill(-w.pid, SIGKILL);
        }
      }
    });
  }

  bool all_reaped() const {
    for (const auto& w : workers) {
      if (w.running) return false;
    }
    return true;
  }

  void maybe_finish_attempt() {
    if (done || attempt_over || !all_reaped()) return;
    bool drained = true;
    for (const auto& w : workers) drained = drained && w.open_pipes == 0;
    if (!drained) {
      // Output still in the pipes: wait for it briefly (a grandchild that escaped the process
      // group could hold a pipe open forever).
      drain_timer.expires_after(2s);
      drain_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
        if (!ec && gen == generation) finish_attempt();
      });
      return;
    }
    finish_attempt();
  }

  void finish_attempt() {
    // Once per attempt: a drain timer that fired just as the last pipe closed must not finish
    // the attempt a second time.
    if (done || attempt_over) return;
    attempt_over = true;
    drain_timer.cancel();
    kill_timer.cancel();
    heartbeat_timer.cancel();
    for (auto& w : workers) {
      boost::system::error_code ignored;
      if (w.out_pipe && w.out_pipe->is_open()) {
        w.out->finish();
        w.out_pipe->close(ignored);
      }
      if (w.err_pipe && w.err_pipe->is_open()) {
        w.err->finish();
        w.err_pipe->close(ignored);
      }
    }
    double took = seconds(Clock::now() - attempt_started);
    if (coord) {
      local_done = true;
      if (!root_cause && !stop_signal && !round_end) {
        spdlog::info("ddprun: round {}: this node's {} workers exited 0 ({:.2f} s); waiting for the other nodes", round,
                     workers.size(), took);
        try {
          coord->report_success(round, group_world);
        } catch (const Error& e) {
          on_round_end(std::nullopt);
          return;
        }
      }
      maybe_finish_round();
      return;
    }
    if (stop_signal) {
      spdlog::warn("ddprun: stopped by {}; workers ended after {:.2f} s", signal_name(stop_signal), took);
      exit_code = 128 + stop_signal;
      done = true;
      return;
    }
    if (!root_cause) {
      spdlog::info("ddprun: all {} worker{} exited 0 ({:.2f} s)", workers.size(), workers.size() == 1 ? "" : "s", took);
      exit_code = 0;
      done = true;
      return;
    }
    // Complete the records now that every stream is drained: the last stderr lines.
    root_cause->stderr_tail = tail_of(root_cause->local_rank);
    for (auto& f : failures) f.stderr_tail = tail_of(f.local_rank);
    if (restarts_left > 0) {
      --restarts_left;
      spdlog::warn("ddprun: rank {} failed ({}); restarting the worker group (restart {} of {})", root_cause->rank,
                   root_cause->reason, opt.max_restarts - restarts_left, opt.max_restarts);
      events.emit("restart", {{"count", opt.max_restarts - restarts_left},
                              {"reason", "rank " + std::to_string(root_cause->rank) + ": " + root_cause->reason}});
      ++attempt;
      attempt_dir_name = "attempt_" + std::to_string(attempt);
      store->reset();
      asio::post(io, [this] { start_attempt_or_fail(); });
      return;
    }
    std::string report = format_failure_report(*root_cause, failures, opt.role, attempt, opt.max_restarts);
    to_console(report);
    exit_code = root_cause->exit_code;
    done = true;
  }

  void start_attempt_or_fail() {
    try {
      start_attempt();
    } catch (const Error& e) {
      spdlog::error("ddprun: {}", e.what());
      exit_code = 1;
      done = true;
    }
  }

  std::deque<std::string> tail_of(int local_rank) const {
    for (const auto& w : workers) {
      if (w.local_rank == local_rank && w.err) return w.err->tail();
    }
    return {};
  }


  // ---- several nodes ---------------------------------------------------------------------------

  // Ends the round for every node (first writer wins) and stops this node's workers.
  void end_round_with(const std::string& record, int expect_next) {
    try {
      coord->end_round(round, record, expect_next);
    } catch (const Error& e) {
      spdlog::error("ddprun: cannot reach the rendezvous store to end round {}: {}", round, e.what());
      on_round_end(std::nullopt);
    }
  }

  // The watcher saw the round end (or lost the store): stop what runs here.
  void on_round_end(std::optional<std::string> record) {
    if (done) return;
    if (!record) {
      if (!store_lost) {
        store_lost = true;
        spdlog::error("ddprun: lost the rendezvous store at {} (its node left or crashed); stopping this node",
                      coord->endpoint());
      }
    } else if (!round_end) {
      round_end = record;
      try {
        parsed_end = parse_round_end(coord->full_key(round, "end"), *record);
      } catch (const ProtocolError& e) {
        // Whatever wrote it, the round cannot go on: stop this node's workers and exit 1.
        protocol_error = e.what();
        spdlog::error("ddprun: {}; stopping this node", e.what());
      }
      if (parsed_end) {
        const auto& e = *parsed_end;
        if (e.kind == "failure" && !root_cause) {
          spdlog::warn("ddprun: round {} failed on host {} (rank {}: {}); stopping this node's workers", round,
                       e.failure->host, e.failure->rank, e.failure->reason);
        } else if (e.kind == "node_lost") {
          spdlog::warn("ddprun: round {}: node {} ({}) stopped answering; stopping this node's workers", round,
                       e.group_rank, e.host);
          events.emit("node_lost", {{"round", round}, {"group_rank", e.group_rank}, {"lost_host", e.host}});
        } else if (e.kind == "membership") {
          spdlog::info("ddprun: round {}: node {} wants to join; restarting with it", round, e.host);
        } else if (e.kind == "stopped") {
          spdlog::warn("ddprun: the job was stopped by {} on host {}", signal_name(e.signal), e.host);
        }
      }
    }
    alive_timer.cancel();
    monitor_timer.cancel();
    bool success = parsed_end && parsed_end->kind == "success";
    if (!success) stop_workers(SIGTERM);
    maybe_finish_attempt();
    maybe_finish_round();
  }

  void maybe_finish_round() {
    if (done || !local_done || !all_reaped()) return;
    if (store_lost) {
      exit_code = 1;
      done = true;
      return;
    }
    if (!round_end) return;  // this node is finished; the watcher reports the round's end
    coord->stop_watch();
    if (protocol_error) {
      exit_code = 1;
      done = true;
      return;
    }
    const std::string kind = parsed_end->kind;
    auto acknowledge = [&] {
      try {
        coord->acknowledge_end(round, group_world);
      } catch (const Error&) {
      }
    };
    if (kind == "success") {
      spdlog::info("ddprun: all {} nodes finished; job done", group_world);
      acknowledge();
      exit_code = 0;
      done = true;
      return;
    }
    if (kind == "stopped") {
      acknowledge();
      exit_code = 128 + (parsed_end->signal > 0 ? parsed_end->signal : SIGTERM);
      done = true;
      return;
    }
    int next_rc = attempt;
    if (kind == "failure") {
      FailureRecord root = *parsed_end->failure;
      if (attempt + 1 > opt.max_restarts) {
        std::vector<FailureRecord> others;
        for (auto& f : failures) {
          f.stderr_tail = tail_of(f.local_rank);
          others.push_back(f);
        }
        if (root_cause && root_cause->pid == root.pid && root_cause->host == root.host) {
          root.stderr_tail = tail_of(root_cause->local_rank);
        } else if (root_cause) {
          others.push_back(*root_cause);  // this node failed too, but after the root cause
        }
        to_console(format_failure_report(root, others, opt.role, attempt, opt.max_restarts));
        acknowledge();
        exit_code = root.exit_code;
        done = true;
        return;
      }
      next_rc = attempt + 1;
      spdlog::warn("ddprun: restarting the job on every node (restart {} of {})", next_rc, opt.max_restarts);
      events.emit("restart", {{"count", next_rc},
                              {"reason", "rank " + std::to_string(root.rank) + " on " + root.host + ": " + root.reason}});
    }
    if (stop_signal != 0) {  // signalled while this round was ending: no next round
      leave_rendezvous(round + 1, stop_signal);
      return;
    }
    next_round(round + 1, next_rc);
  }

  void next_round(int r, int rc) {
    round = r;
    attempt = rc;
    round_end.reset();
    parsed_end.reset();
    protocol_error.reset();
    root_cause.reset();
    failures.clear();
    if (joiner.joinable()) joiner.join();
    joining = true;
    auto finished = std::make_shared<std::promise<void>>();
    joiner_finished = finished->get_future();
    joiner = std::thread([this, r, rc, finished] {
      struct Done {
        std::shared_ptr<std::promise<void>> p;
        ~Done() { p->set_value(); }
      } done_guard{finished};
      try {
        auto info = coord->join(r, rc);
        asio::post(io, [this, info] {
          joining = false;
          start_round(info);
        });
      } catch (const JobStopped& e) {
        int sig = e.signal;
        std::string host = e.host;
        asio::post(io, [this, sig, host] {
          spdlog::warn("ddprun: the job was stopped by {} on host {} during the rendezvous", signal_name(sig), host);
          exit_code = 128 + sig;
          done = true;
        });
      } catch (const std::exception& e) {
        std::string msg = e.what();
        bool usage = dynamic_cast<const UsageError*>(&e) != nullptr;
        asio::post(io, [this, msg, usage] {
          spdlog::error("ddprun: {}", msg);
          exit_code = usage ? 2 : 1;
          done = true;
        });
      }
    });
  }

  void start_round(const RoundInfo& info) {
    if (done) return;
    round = info.round;
    attempt = info.restart_count;
    world_size = info.world_size;
    rank_offset = info.rank_offset;
    group_rank = info.group_rank;
    group_world = info.group_world;
    master_addr = info.store_host;
    master_port = info.store_port;
    attempt_dir_name = "attempt_" + std::to_string(info.round);
    spdlog::info("ddprun: rendezvous round {} complete: {} nodes, {} workers", round, group_world, world_size);
    round_hosts.clear();
    for (const auto& n : info.nodes) round_hosts.push_back(n.host);
    if (events.enabled()) {
      nlohmann::json members = nlohmann::json::array();
      for (const auto& n : info.nodes) members.push_back(n.host);
      events.emit("rendezvous_complete", {{"round", round}, {"world_size", world_size}, {"nodes", group_world},
                                          {"members", members}});
    }
    coord->watch(round, [this, gen = generation + 1](std::optional<std::string> rec) {
      asio::post(io, [this, rec, gen] {
        if (gen == generation) on_round_end(rec);
      });
    });
    start_attempt_or_fail();
    neighbour_count = -2;
    neighbour_changed = Clock::now();
    arm_keep_alive();
    if (group_world > 1) arm_monitor();
  }

  void arm_keep_alive() {
    try {
      coord->keep_alive(round, group_rank);
    } catch (const Error&) {
      on_round_end(std::nullopt);
      return;
    }
    alive_timer.expires_after(opt.rdzv.keep_alive_interval);
    alive_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (!ec && gen == generation && !round_end) arm_keep_alive();
    });
  }

  // Each node watches the next one's keep-alive (a ring: O(1) store requests per node).
  void arm_monitor() {
    monitor_timer.expires_after(std::max(opt.rdzv.keep_alive_interval / 4, std::chrono::milliseconds(50)));
    monitor_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (ec || gen != generation || round_end || done) return;
      int next = (group_rank + 1) % group_world;
      long long count;
      try {
        count = coord->alive_count(round, next);
      } catch (const Error&) {
        on_round_end(std::nullopt);
        return;
      }
      auto now = Clock::now();
      if (count != neighbour_count) {
        neighbour_count = count;
        neighbour_changed = now;
      } else if (now - neighbour_changed > opt.rdzv.keep_alive_interval * opt.rdzv.keep_alive_max_attempt) {
        double idle = seconds(now - neighbour_changed);
        spdlog::warn("ddprun: round {}: no keep-alive from node {} for {:.1f} s", round, next, idle);
        std::string lost = next >= 0 && next < static_cast<int>(round_hosts.size()) ? round_hosts[next] : "?";
        nlohmann::json rec = {{"kind", "node_lost"}, {"group_rank", next}, {"host", lost}, {"idle_s", idle}};
        end_round_with(rec.dump(), group_world - 1);
        return;
      }
      arm_monitor();
    });
  }

  // ---- hangs ------------------------------------------------------------------------------------

  void arm_heartbeat_check() {
    if (opt.worker_timeout.count() <= 0) return;
    auto interval = std::clamp(opt.worker_timeout / 10, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
    heartbeat_timer.expires_after(interval);
    heartbeat_timer.async_wait([this, gen = generation](boost::system::error_code ec) {
      if (ec || done || gen != generation) return;
      check_heartbeats();
      if (!stopping) arm_heartbeat_check();
    });
  }

  // A worker beats by touching its file; the agent notices the mtime change at its next check
  // (every worker_timeout/10, 20 ms to 1 s), so a beat counts at most one interval late.
  void check_heartbeats() {
    auto now = std::chrono::steady_clock::now();
    for (auto& w : workers) {
      if (!w.running || w.stopped_by_agent) continue;
      struct stat st{};
      if (::stat(w.heartbeat_file.c_str(), &st) == 0 &&
          (st.st_mtim.tv_sec != w.beat_mtime.tv_sec || st.st_mtim.tv_nsec != w.beat_mtime.tv_nsec)) {
        w.beat_mtime = st.st_mtim;
        w.last_beat = now;
      }
      if (now - w.last_beat > opt.worker_timeout) {
        double idle = std::chrono::duration<double>(now - w.last_beat).count();
        char reason[128];
        std::snprintf(reason, sizeof(reason), "no heartbeat for %.1f s (--worker_timeout=%.1f)", idle,
                      std::chrono::duration<double>(opt.worker_timeout).count());
        on_failure(w, reason, kHeartbeatExitCode);
        return;  // the group is being stopped
      }
    }
  }

  // ---- signals ----------------------------------------------------------------------------------

  void wait_signals() {
    signals.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGCHLD) {
        reap();
      } else {
        on_stop_signal(sig);
      }
      if (!done) wait_signals();
    });
  }

  std::string stopped_record(int sig) const { return stopped_json(sig, host_name(), coord->node_id()); }

  // A stop signal while no round runs here: the other nodes, in (or on their way to) the
  // rendezvous of round `r`, are told so, and this agent exits 128 + sig.
  void leave_rendezvous(int r, int sig) {
    try {
      coord->announce_stop(r, stopped_record(sig));
    } catch (const Error& e) {
      spdlog::warn("ddprun: could not tell the other nodes about {}: {}", signal_name(sig), e.what());
    }
    exit_code = 128 + sig;
    done = true;
  }

  void on_stop_signal(int sig) {
    if (stop_signal != 0 && (sig == SIGINT || sig == SIGTERM)) {
      spdlog::warn("ddprun: {} again: killing the workers now", signal_name(sig));
      for (auto& w : workers) {
        if (w.running) ::kill(-w.pid, SIGKILL);
      }
      return;
    }
    spdlog::warn("ddprun: received {}; forwarding it to the workers", signal_name(sig));
    if (stop_signal == 0) stop_signal = sig;
    restarts_left = 0;
    if (coord && joining) {
      // In a rendezvous, no worker runs here: tell the other nodes (they may be waiting for
      // this one), then leave.
      leave_rendezvous(round, sig);
      return;
    }
    if (coord && !round_end) end_round_with(stopped_record(sig), 0);
    bool terminating = sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
    if (terminating) {
      stop_workers(sig);
    } else {
      for (auto& w : workers) {
        if (w.running) ::kill(-w.pid, sig);  // e.g. SIGUSR1, a preemption notice: the workers decide
      }
    }
    maybe_finish_attempt();
  }

  void open_events() {
    events.open(opt.events_file, opt.rdzv.local_addr.empty() ? host_name() : opt.rdzv.local_addr, opt.run_id);
    events.emit("job_started", {{"nproc_per_node", opt.nproc_per_node},
                                {"min_nodes", opt.rdzv.enabled ? opt.rdzv.min_nodes : 1},
                                {"max_nodes", opt.rdzv.enabled ? opt.rdzv.max_nodes : 1},
                                {"max_restarts", opt.max_restarts},
                                {"command", opt.command}});
  }

  int finish_job() {
    cleanup();
    events.emit("job_finished", {{"exit_code", exit_code},
                                 {"duration_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count()}});
    return exit_code;
  }

  int run() {
    prepare_log_dir();
    open_events();
    if (opt.rdzv.enabled) return run_multi_node();
    start_store();
    master_addr = opt.store_host;
    master_port = store->port();
    world_size = opt.nproc_per_node;
    attempt_dir_name = "attempt_0";
    signals.add(SIGCHLD);
    for (int s : opt.forward_signals) signals.add(s);
    wait_signals();
    if (opt.nproc_per_node > 1 && !opt.base_env.count("OMP_NUM_THREADS")) {
      spdlog::info("ddprun: OMP_NUM_THREADS=1 for each worker (set it to override)");
    }
    events.emit("rendezvous_complete", {{"round", 0}, {"world_size", world_size}, {"nodes", 1},
                                        {"members", nlohmann::json::array({host_name()})}});
    start_attempt_or_fail();
    while (!done) {
      io.run_one();
    }
    store->stop();
    return finish_job();
  }

  int run_multi_node() {
    signals.add(SIGCHLD);
    for (int s : opt.forward_signals) signals.add(s);
    wait_signals();
    coord = std::make_unique<Coordinator>(opt.rdzv, opt.run_id, opt.nproc_per_node, opt.node_rank);
    spdlog::info("ddprun: joining the rendezvous at {} ({} {} to {} nodes)", coord->endpoint(),
                 opt.rdzv.dynamic ? "c10d," : "static,", opt.rdzv.min_nodes, opt.rdzv.max_nodes);
    next_round(0, 0);
    while (!done) io.run_one();
    // A joiner still running uses this object: wait for it (a stop announced to the other nodes
    // wakes its WAIT at once); only one stuck on an unreachable store is left behind.
    if (joiner.joinable()) {
      if (joiner_finished.valid() && joiner_finished.wait_for(std::chrono::seconds(2)) == std::future_status::ready) {
        joiner.join();
      } else {
        joiner.detach();
      }
    }
    return finish_job();
  }

  // Removes the temporary directory ddprun created, and nothing else: never --log_dir, never
  // a parent. Kept when logs were asked for (--redirects, --tee) so they can be read.
  // ddprun's own block of text (the failure summary) after the workers' last lines, through the
  // console queue: a console that does not read must not block the agent.
  static void to_console(const std::string& text) {
    Console::for_fd(STDOUT_FILENO).drain(std::chrono::milliseconds(500));
    Console::for_fd(STDERR_FILENO).drain(std::chrono::milliseconds(500));
    Console::for_fd(STDERR_FILENO).write(text);
  }

  // At the end: what is queued for the console gets a bounded chance to go out; lines the
  // console did not take are reported.
  void flush_console() {
    Console::for_fd(STDOUT_FILENO).drain(std::chrono::seconds(2));
    Console::for_fd(STDERR_FILENO).drain(std::chrono::seconds(1));
    std::size_t dropped = console_dropped_lines();
    if (dropped > 0) {
      bool logs = opt.redirects.any() || opt.tee.any();
      to_console("ddprun: " + std::to_string(dropped) + " line(s) dropped from the console, which did not keep up" +
                 (logs ? "; the log files are complete\n" : "; --tee 3 keeps complete per-rank log files\n"));
      Console::for_fd(STDERR_FILENO).drain(std::chrono::seconds(1));
    }
  }

  void cleanup() {
    flush_console();
    if (temp_root.empty()) return;
    bool logs = opt.redirects.any() || opt.tee.any();
    if (!logs) {
      std::error_code ec;
      fs::remove_all(temp_root, ec);
    }
  }
};

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }

}  // namespace ddprun::agent
