#include "workers/spares.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "workers/worker_group.hpp"

namespace ddprun::agent {
namespace asio = boost::asio;

namespace {

// A file a spare's imports read (its "file" lines), as it was then.
struct ModuleFile {
  std::string path;
  long long mtime_ns = 0, size = 0;
};

}  // namespace

struct SparePool::Spare {
  int local_rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1, order = -1;  // its output pipes (the worker's, later); its order pipe
  std::unique_ptr<asio::posix::stream_descriptor> ready_pipe;
  std::string said;  // from the ready pipe, a line at a time
  SpareKey key;
  std::chrono::steady_clock::time_point started;
  bool ready = false, dead = false;
  pid_t import_tid = -1;          // its import thread, put at nice 19 by ddprun
  std::vector<ModuleFile> files;  // what its imports read
  std::string differs;            // its "differs" line: why it cannot stand in for its worker

  void close_all() {
    for (int* fd : {&out, &err, &order}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
    if (ready_pipe) {
      boost::system::error_code ignored;
      ready_pipe->close(ignored);
    }
  }
};

long long process_memory_bytes(pid_t pid) {
  for (const char* file : {"smaps_rollup", "status"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
    std::string line;
    const std::string want = file[0] == 's' && file[1] == 'm' ? "Pss:" : "VmRSS:";
    while (std::getline(in, line)) {
      if (line.rfind(want, 0) == 0) return std::atoll(line.c_str() + want.size()) * 1024;
    }
  }
  return -1;
}

namespace {

// The modules a spare imports by name, comma-separated: torch and --preload's.
std::string preload_list(const SpareOptions& opt) {
  std::string list;
  for (const auto& m : opt.preload) list += (list.empty() ? "" : ",") + m;
  return list;
}

std::size_t block_bytes(const std::vector<std::string>& strings) {
  std::size_t n = 0;
  for (const auto& a : strings) n += a.size() + 1;
  return n;
}

// Room for a warm worker to show its own argv and environment in /proc (_ddprun_spare.py writes
// them over the spare's): what the worker's need beyond the spare's own, and some slack for the
// next attempt's longer values (a restart count of more digits, another port).
constexpr std::size_t kProcSlack = 256;

// Every thread of `pid` that runs at a lower priority than its main thread (the spare's import
// thread at nice 19, and any thread its imports started, which inherits that) raised to the
// main thread's, which is the worker's: "" once none is lower, or why one cannot be raised
// (lowering a nice value needs CAP_SYS_NICE, or an RLIMIT_NICE that allows it). A thread started
// during a pass inherits its starter's priority: passes go on until one raises none.
std::string raise_threads(pid_t pid) {
  errno = 0;
  const int target = ::getpriority(PRIO_PROCESS, static_cast<id_t>(pid));
  if (errno != 0) return fmt::format("its priority cannot be read: {}", std::strerror(errno));
  for (int pass = 0; pass < 16; ++pass) {
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(fmt::format("/proc/{}/task", pid).c_str()), ::closedir);
    if (!dir) return fmt::format("its threads cannot be listed: {}", std::strerror(errno));
    bool raised = false;
    while (const dirent* e = ::readdir(dir.get())) {
      const auto tid = static_cast<id_t>(std::atoll(e->d_name));
      if (tid == 0) continue;
      errno = 0;
      const int nice = ::getpriority(PRIO_PROCESS, tid);
      if (errno != 0 || nice <= target) continue;  // ended, or not lower
      if (::setpriority(PRIO_PROCESS, tid, target) == 0) {
        raised = true;
      } else if (errno != ESRCH) {
        return fmt::format("a thread of it runs at nice {} and ddprun may not raise it to the worker's {} ({}: that "
                           "needs CAP_SYS_NICE or `ulimit -e` {} or more)",
                           nice, target, std::strerror(errno), 20 - target);
      }
    }
    if (!raised) return "";
  }
  return "";
}

// The first of a spare's module files that changed since it imported it, or "".
std::string edited_module(const std::vector<ModuleFile>& files) {
  for (const auto& f : files) {
    struct stat st{};
    if (::stat(f.path.c_str(), &st) != 0 || st.st_size != f.size ||
        st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != f.mtime_ns) {
      return f.path;
    }
  }
  return "";
}

// "file MTIME_NS SIZE PATH": false if it is not such a line.
bool parse_file_line(const std::string& line, ModuleFile& f) {
  char* end = nullptr;
  const char* p = line.c_str() + 5;
  f.mtime_ns = std::strtoll(p, &end, 10);
  if (end == p || *end != ' ') return false;
  p = end + 1;
  f.size = std::strtoll(p, &end, 10);
  if (end == p || *end != ' ' || end[1] == '\0') return false;
  f.path = end + 1;
  return true;
}

}  // namespace

SparePool::SparePool(asio::io_context& io, ProcessRunner& runner, SpareOptions opt)
    : io_(io), runner_(runner), opt_(std::move(opt)) {}

SparePool::~SparePool() { discard_all(); }

void SparePool::discard_all() {
  for (auto& [rank, s] : by_rank_) kill(*s);
  by_rank_.clear();
  for (auto& s : handed_) {  // workers now: only their ready pipes are the pool's
    boost::system::error_code ignored;
    if (s->ready_pipe) s->ready_pipe->close(ignored);
  }
  handed_.clear();
}

void SparePool::kill(Spare& s) {
  if (!s.dead && s.pid > 0) {
    runner_.signal_group(s.pid, SIGKILL);
    runner_.forget(s.pid);  // (a sweep no longer spares it)
  }
  s.dead = true;
  s.close_all();
}

void SparePool::make(const std::vector<WorkerSpec>& specs) {
  for (const auto& spec : specs) {
    auto key = SpareKey::of(spec);
    if (!key) continue;  // not a Python worker a spare can run
    auto it = by_rank_.find(spec.local_rank);
    if (it != by_rank_.end()) {
      if (!it->second->dead && it->second->key.differs(*key).empty()) continue;
      kill(*it->second);
      by_rank_.erase(it);
    }
    start_one(spec, std::move(*key));
  }
}

void SparePool::start_one(const WorkerSpec& spec, SpareKey key) {
  int order[2] = {-1, -1}, ready[2] = {-1, -1};
  if (::pipe2(order, O_CLOEXEC) != 0 || ::pipe2(ready, O_CLOEXEC) != 0) {
    spdlog::warn("ddprun: no warm spare for local rank {}: pipe failed: {}", spec.local_rank, std::strerror(errno));
    for (int fd : {order[0], order[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return;
  }
  // Where the script's own modules are found (sys.path[0]), as for the worker itself.
  std::string path0 = key.cwd;
  if (key.run.rfind("-m ", 0) != 0) {
    std::string script = key.run[0] == '/' ? key.run : key.cwd + "/" + key.run;
    char* real = ::realpath(script.c_str(), nullptr);
    if (real) script = real;
    std::free(real);
    path0 = script.substr(0, script.rfind('/'));
    if (path0.empty()) path0 = "/";
  }
  // --preload=auto: the record of what the last attempt's worker imported, read by the spare.
  std::string record = opt_.preload_auto ? spec.heartbeat_file + ".modules" : "";
  std::vector<std::string> argv = key.interpreter;
  argv.insert(argv.end(), {opt_.driver, path0, preload_list(opt_), record});
  const std::size_t want = block_bytes(spec.argv) + kProcSlack, have = block_bytes(argv) + 1;
  argv.push_back(std::string(want > have ? want - have : 0, ' '));  // cleared by the spare at once
  std::vector<std::string> env = spec.env;
  env.push_back("DDPRUN_SPARE_ROOM=" + std::string(kProcSlack * 4, ' '));
  auto s = std::make_shared<Spare>();
  s->local_rank = spec.local_rank;
  s->key = std::move(key);
  s->started = std::chrono::steady_clock::now();
  try {
    auto st = runner_.start_spare(argv, env, spec.binding ? &*spec.binding : nullptr, order[0], ready[1], spec.state_fd);
    s->pid = st.pid;
    s->out = st.stdout_fd;
    s->err = st.stderr_fd;
  } catch (const std::exception& e) {
    spdlog::warn("ddprun: no warm spare for local rank {}: {}", spec.local_rank, e.what());
    for (int fd : {order[0], order[1], ready[0], ready[1]}) ::close(fd);
    return;
  }
  ::close(order[0]);
  ::close(ready[1]);
  s->order = order[1];
  runner_.watch({s->pid});  // (a sweep spares it until it is forgotten or runs a worker)
  s->ready_pipe = std::make_unique<asio::posix::stream_descriptor>(io_, ready[0]);
  by_rank_[spec.local_rank] = s;
  spdlog::debug("ddprun: warm spare for local rank {} started (pid {})", spec.local_rank, s->pid);
  read_ready(s);
}

void SparePool::read_ready(const std::shared_ptr<Spare>& s) {
  auto buf = std::make_shared<std::array<char, 4096>>();
  s->ready_pipe->async_read_some(asio::buffer(*buf), [this, s, buf](boost::system::error_code ec, std::size_t n) {
    if (ec == asio::error::operation_aborted || !s->ready_pipe || !s->ready_pipe->is_open()) return;
    s->said.append(buf->data(), n);
    for (auto nl = s->said.find('\n'); nl != std::string::npos; nl = s->said.find('\n')) {
      std::string line = s->said.substr(0, nl);
      s->said.erase(0, nl + 1);
      ModuleFile f;
      if (line.rfind("importing ", 0) == 0) {
        // The spare's imports run at the lowest priority, beside the job's workers. Lowered here,
        // not by the spare itself: only ddprun changes it, and it raises it again at a hand-over
        // (raise_threads), after which it never lowers it.
        s->import_tid = static_cast<pid_t>(std::atoll(line.c_str() + 10));
        if (s->import_tid > 0 && !s->dead) ::setpriority(PRIO_PROCESS, static_cast<id_t>(s->import_tid), 19);
      } else if (line.rfind("file ", 0) == 0) {
        if (parse_file_line(line, f)) s->files.push_back(std::move(f));
      } else if (line.rfind("differs ", 0) == 0) {
        s->differs = line.substr(8);
      } else if (line.rfind("cold ", 0) == 0) {
        spdlog::info("ddprun: local rank {} starts cold: {} (found by its warm spare once handed the attempt: it runs "
                     "the worker's command as a new interpreter)", s->local_rank, line.substr(5));
      } else if (line.rfind("warn ", 0) == 0) {
        spdlog::warn("ddprun: --preload: the warm spare of local rank {} could not import {}; it goes on without it "
                     "(the script imports it itself)", s->local_rank, line.substr(5));
      } else if (line == "ready") {
        s->ready = true;
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - s->started).count();
        spdlog::info("ddprun: warm spare for local rank {} ready ({:.1f} s, {} MB)", s->local_rank, secs,
                     process_memory_bytes(s->pid) / 1000000);
      }
    }
    if (!ec) return read_ready(s);
    handed_.erase(std::remove(handed_.begin(), handed_.end(), s), handed_.end());
  });
}

// Writes `spec`'s attempt to the spare's order pipe: "" or why the rank starts cold. Before it,
// what could make the warm worker differ from a fresh one: a module the spare imported from
// another file than the last worker did, or edited since, or a thread left at nice 19.
//
// The order is bytes, as argv and the environment are (no encoding is assumed), NUL-separated:
//   ddprun-order-1 RUN CWD N_ARGS ARGS... N_ARGV ARGV... N_ENV ENV...
// RUN is "PATH" or "-m MODULE"; each field ends with a NUL (none may hold one).
std::string SparePool::send_order(Spare& s, const WorkerSpec& spec) {
  auto key = SpareKey::of(spec);
  if (s.dead) return "its warm spare died while it waited";
  if (!key) return "it is not a Python script a spare can run";
  if (auto why = s.key.differs(*key); !why.empty()) return why;
  if (!s.differs.empty()) return s.differs;
  if (auto path = edited_module(s.files); !path.empty()) return "the module file " + path + " changed after its warm spare imported it";
  if (s.ready && s.import_tid > 0) {
    // It said "ready" just before its import thread ends: give that thread a moment to end (at
    // nice 19 on a busy node it may wait for a CPU) rather than raise it, which an unprivileged
    // ddprun may not.
    const std::string task = fmt::format("/proc/{}/task/{}", s.pid, s.import_tid);
    const auto until = std::chrono::steady_clock::now() + kImportThreadEnd;
    while (::access(task.c_str(), F_OK) == 0 && std::chrono::steady_clock::now() < until) ::poll(nullptr, 0, 2);
  }
  if (auto why = raise_threads(s.pid); !why.empty()) {
    return (s.ready ? "its warm spare is ready but " : "its warm spare is still importing, and ") + why;
  }
  std::string text = "ddprun-order-1";
  text += '\0';
  auto field = [&text](const std::string& f) {
    text += f;
    text += '\0';
  };
  auto list = [&](const std::vector<std::string>& l) {
    field(std::to_string(l.size()));
    for (const auto& f : l) field(f);
  };
  field(key->run);
  field(key->cwd);
  list(key->args);
  list(spec.argv);
  list(spec.env);
  if (text.size() > 65536) ::fcntl(s.order, F_SETPIPE_SZ, static_cast<int>(text.size()));
  ::fcntl(s.order, F_SETFL, O_NONBLOCK);
  ssize_t n = ::write(s.order, text.data(), text.size());
  if (n == static_cast<ssize_t>(text.size())) return "";
  return n < 0 && errno == EPIPE ? "its warm spare died while it waited" : "its order did not fit its pipe";
}

// A spare's main thread waits in read() on its order pipe from its start (its imports run on
// another thread), so a live spare empties the pipe moments after the write, in the kernel,
// whatever its imports hold. A spare killed while it waited never reads it: once the dying
// process has closed its descriptors the pipe has no reader, and until then its order stays
// unread. So: "" once the order was read (the spare's, from then on), or why the rank starts
// cold: its reader gone, or the order still unread after kOrderReadLimit (the spare then killed,
// before it can run anything).
std::vector<std::string> SparePool::await_orders_read(const std::vector<std::shared_ptr<Spare>>& sent) {
  std::vector<std::string> why(sent.size(), "?");
  const auto deadline = std::chrono::steady_clock::now() + kOrderReadLimit;
  for (;;) {
    bool waiting = false;
    for (std::size_t i = 0; i < sent.size(); ++i) {
      if (why[i] != "?") continue;
      pollfd p{sent[i]->order, 0, 0};
      int unread = -1;
      if (::poll(&p, 1, 0) == 1 && (p.revents & POLLERR)) {
        why[i] = "its warm spare died while it waited";
      } else if (::ioctl(sent[i]->order, FIONREAD, &unread) == 0 && unread == 0) {
        why[i] = "";
      } else {
        waiting = true;
      }
    }
    if (!waiting) return why;
    if (std::chrono::steady_clock::now() >= deadline) break;
    ::poll(nullptr, 0, 1);
  }
  for (auto& w : why) {
    if (w == "?") w = fmt::format("its warm spare did not read its order within {} s", kOrderReadLimit.count() / 1000.0);
  }
  return why;
}

std::vector<std::optional<ProcessRunner::Started>> SparePool::hand_over(const std::vector<const WorkerSpec*>& specs) {
  std::vector<std::optional<ProcessRunner::Started>> out(specs.size());
  std::vector<std::size_t> index;
  std::vector<std::shared_ptr<Spare>> sent;
  auto cold = [this](Spare& s, const std::string& why) {
    spdlog::info("ddprun: local rank {} starts cold: {}", s.local_rank, why);
    kill(s);
  };
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto it = by_rank_.find(specs[i]->local_rank);
    if (it == by_rank_.end()) continue;
    auto s = it->second;
    by_rank_.erase(it);
    if (auto why = send_order(*s, *specs[i]); !why.empty()) {
      cold(*s, why);
      continue;
    }
    index.push_back(i);
    sent.push_back(s);
  }
  auto why = await_orders_read(sent);
  for (std::size_t j = 0; j < sent.size(); ++j) {
    Spare& s = *sent[j];
    if (!why[j].empty()) {
      cold(s, why[j]);
      continue;
    }
    ::close(std::exchange(s.order, -1));  // the end of its order
    handed_.push_back(sent[j]);           // its ready pipe read on, for a late "cold" (until it ends)
    runner_.spare_runs_worker(s.pid);  // swept like any worker from now on
    out[index[j]] = ProcessRunner::Started{s.pid, std::exchange(s.out, -1), std::exchange(s.err, -1)};
    s.dead = true;  // not the pool's any more
  }
  return out;
}

bool SparePool::on_exit(pid_t pid) {
  for (auto& [rank, s] : by_rank_) {
    if (s->pid != pid || s->dead) continue;
    spdlog::debug("ddprun: the warm spare of local rank {} (pid {}) ended", rank, pid);
    runner_.forget(pid);
    s->dead = true;
    s->close_all();
    return true;
  }
  return false;
}

int SparePool::count() const {
  int n = 0;
  for (const auto& [rank, s] : by_rank_) n += s->dead ? 0 : 1;
  return n;
}

int SparePool::ready_count() const {
  int n = 0;
  for (const auto& [rank, s] : by_rank_) n += !s->dead && s->ready ? 1 : 0;
  return n;
}

long long SparePool::memory_bytes() const {
  long long total = 0;
  for (const auto& [rank, s] : by_rank_) {
    if (!s->dead) total += std::max(0LL, process_memory_bytes(s->pid));
  }
  return total;
}

}  // namespace ddprun::agent
