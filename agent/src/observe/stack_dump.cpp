#include "observe/stack_dump.hpp"

#include "observe/agent_helpers.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "ddprun/agent/resources.hpp"
#include "ddprun/agent/spawn.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/text.hpp"

extern char** environ;

namespace ddprun::agent {
namespace {

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Runs `argv` with stdout and stderr on a pipe; returns what it wrote within `limit` (then it is
// killed). Its exit is reaped by the agent's SIGCHLD handler, which ignores unknown children.
std::string run_capture(const std::vector<std::string>& argv, std::chrono::milliseconds limit) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::string("cannot run ") + argv[0] + ": pipe failed";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return "cannot run " + argv[0] + ": " + std::strerror(rc);
  }
  note_agent_helper(pid);  // not one of the job's leftovers
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[65536];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fds[0], POLLIN, 0};
    int n = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::kill(pid, SIGKILL);
      out += "\n(" + base_name(argv[0]) + " did not finish within " + duration_text(limit) + ")\n";
      break;
    }
    ssize_t got = ::read(fds[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (out.size() < (4u << 20)) out.append(buf, static_cast<std::size_t>(got));
  }
  ::close(fds[0]);
  forget_agent_helper(pid);
  return out;
}

bool in_c_library(const std::string& module) {
  auto b = base_name(module);
  for (const char* lib : {"libc.so", "libc-", "libpthread", "ld-linux", "linux-vdso", "[vdso]", "libstdc++"}) {
    if (b.rfind(lib, 0) == 0) return true;
  }
  return false;
}

// Whether `pid` is stopped (T) or traced (t) now.
bool stopped_already(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'T' || line[paren + 2] == 't');
}

}  // namespace

std::string native_stack_text(pid_t pid, std::chrono::milliseconds limit) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + limit;
  auto left = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()); };
  // ddprun's own reader, whatever it reads. eu-stack and gdb attach with a SIGSTOP, which a thread
  // in uninterruptible sleep takes only once it wakes, after they are gone: the whole process
  // then stays stopped for good (a rank reported while one long write to a slow FUSE mount went
  // on: its main thread, interrupted by the stack signal, waits in D). ddprun-stack seizes instead.
  if (std::string tool = stack_tool(); !tool.empty()) return run_capture({tool, std::to_string(pid)}, left());
  const std::string missing = "no native stack: ddprun-stack is not beside ddprun (built without libdw-dev), and ";
  if (waits_on_disk(pid)) {
    return missing + "eu-stack or gdb would leave it stopped: a thread is in uninterruptible sleep (D)\n";
  }
  // A thread may still enter D before their SIGSTOP reaches it (their own SIGSTOP interrupts a FUSE
  // wait into one): a SIGCONT after them discards a stop left pending, unless the process was
  // stopped before (that stop is kept).
  const bool stopped = stopped_already(pid);
  auto run = [&](const std::vector<std::string>& argv) {
    std::string text = run_capture(argv, left());
    if (!stopped) ::kill(pid, SIGCONT);
    return text;
  };
  std::string path = getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin";
  std::string eu = find_executable("eu-stack", path + ":/usr/bin");
  if (!eu.empty()) return run({eu, "-m", "-s", "-p", std::to_string(pid)});
  std::string gdb = find_executable("gdb", path + ":/usr/bin");
  if (!gdb.empty()) return run({gdb, "-batch", "-nx", "-p", std::to_string(pid), "-ex", "thread apply all bt"});
  return missing + "neither eu-stack nor gdb is installed (apt-get install elfutils, or gdb)\n";
}

bool waits_on_disk(pid_t pid, const std::string& proc_root) {
  std::error_code ec;
  const std::string tasks = proc_root + "/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'D') return true;
  }
  return false;
}

namespace {

// faulthandler's frame line: '  File "/tmp/x.py", line 5 in stuck'.
const std::regex& python_frame_line() {
  static const std::regex frame(R"re(^\s+File "([^"]*)", line (\d+) in (.+)$)re");
  return frame;
}

constexpr const char* kSpareDriver = "_ddprun_spare.py";

}  // namespace

bool is_spare_driver_frame(const StackFrame& f) { return f.file == kSpareDriver; }

std::deque<std::string> without_spare_driver(std::deque<std::string> lines) {
  bool script_seen = false;  // a frame not the driver's above, in this thread's block
  std::deque<std::string> out;
  for (auto& l : lines) {
    std::smatch m;
    if (l.find("(most recent call first)") != std::string::npos) {
      script_seen = false;
    } else if (std::regex_match(l, m, python_frame_line())) {
      const bool driver = base_name(m[1].str()) == kSpareDriver;
      if (driver && script_seen) continue;
      script_seen = script_seen || !driver;
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::string without_spare_driver(const std::string& python_text) {
  if (python_text.find(kSpareDriver) == std::string::npos) return python_text;
  std::deque<std::string> lines;
  std::istringstream in(python_text);
  for (std::string l; std::getline(in, l);) lines.push_back(std::move(l));
  std::string out;
  for (const auto& l : without_spare_driver(std::move(lines))) out += l + "\n";
  if (python_text.back() != '\n' && !out.empty()) out.pop_back();
  return out;
}

std::vector<StackFrame> parse_python_stack(const std::string& text) {
  // Fatal Python error: Aborted
  //
  // Current thread 0x00007f... (most recent call first):
  //   File "/tmp/x.py", line 5 in stuck
  const std::regex& frame = python_frame_line();
  std::vector<StackFrame> first, current, *into = nullptr;
  bool seen_current = false;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.find("(most recent call first)") != std::string::npos) {
      // Several Python processes below one worker each print a "Current thread": the first counts.
      bool is_current = l.rfind("Current thread", 0) == 0 && !seen_current;
      if (is_current) seen_current = true;
      into = is_current ? &current : (first.empty() ? &first : nullptr);
      continue;
    }
    std::smatch m;
    if (into && std::regex_match(l, m, frame)) {
      StackFrame f{m[3].str(), base_name(m[1].str()), static_cast<int>(parse_int(m[2].str()).value_or(0))};
      // The driver's frames below the script's (the outermost): not those of a spare stuck in
      // the driver itself, before the script ran.
      const bool below_script = is_spare_driver_frame(f) &&
                                !std::all_of(into->begin(), into->end(), is_spare_driver_frame);
      if (!below_script) into->push_back(std::move(f));
    } else if (into && trim(l) == "Garbage-collecting") {  // a (long) collection, below any frames
      into->push_back({"(garbage collection)", "", 0});
    }
  }
  return seen_current ? current : first;
}

std::vector<StackFrame> parse_native_stack(const std::string& text) {
  // eu-stack -m -s:  "#1  0x000055d4 stuck_in_all_reduce - /path/test_worker"
  //                  "    /src/test_worker.cpp:42"
  // gdb:             "#1  0x000055d4 in stuck_in_all_reduce () at test_worker.cpp:42"
  static const std::regex eu(R"re(^#(\d+)\s+0x[0-9a-f]+(?:\s+(.*?))?\s+-\s+(\S+)\s*$)re");
  static const std::regex eu_source(R"re(^\s+(\S+?):(\d+)(?::\d+)?\s*$)re");
  static const std::regex gdb(R"re(^#(\d+)\s+(?:0x[0-9a-f]+\s+in\s+)?(\S+)\s*\(.*?\)(?:\s+(?:at|from)\s+(\S+?)(?::(\d+))?)?\s*$)re");
  std::vector<StackFrame> frames;
  std::vector<std::string> modules;
  int threads = 0;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("TID ", 0) == 0 || l.rfind("Thread ", 0) == 0) {
      if (++threads > 1) break;  // the first thread listed (eu-stack: the main one)
      continue;
    }
    std::smatch m;
    if (std::regex_match(l, m, eu)) {
      bool named = m[2].matched && !m[2].str().empty();
      // No symbol (a stripped binary): the module says at least where.
      frames.push_back({named ? m[2].str() : "??", named ? "" : base_name(m[3].str()), 0});
      modules.push_back(m[3].str());
    } else if (!frames.empty() && frames.back().file.empty() && std::regex_match(l, m, eu_source)) {
      frames.back().file = base_name(m[1].str());
      frames.back().line = static_cast<int>(parse_int(m[2].str()).value_or(0));
    } else if (std::regex_match(l, m, gdb)) {
      std::string where = m[3].matched ? m[3].str() : "";
      frames.push_back({m[2].str(), m[4].matched ? base_name(where) : "", static_cast<int>(parse_int(m[4].str()).value_or(0))});
      modules.push_back(m[4].matched ? "" : where);
    }
  }
  // The C library's frames on top (nanosleep, poll, futex waits) say little: start below them.
  std::size_t skip = 0;
  while (skip + 1 < frames.size() && (in_c_library(modules[skip]) || frames[skip].function.rfind("__", 0) == 0)) ++skip;
  return std::vector<StackFrame>(frames.begin() + static_cast<long>(skip), frames.end());
}

std::string describe_frames(const std::vector<StackFrame>& frames, std::size_t depth) {
  if (frames.empty()) return "(no stack)";
  std::string out;
  for (std::size_t i = 0; i < frames.size() && i < depth; ++i) {
    const auto& f = frames[i];
    if (i) out += " <- ";
    out += f.function;
    if (!f.file.empty()) out += " (" + f.file + (f.line ? ":" + std::to_string(f.line) : "") + ")";
  }
  if (frames.size() > depth) out += " <- ...";
  return out;
}

std::string summarize_stacks(const std::map<int, std::vector<StackFrame>>& by_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in the order of the lowest rank
  for (const auto& [rank, frames] : by_rank) {
    std::string text = describe_frames(frames);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == text; });
    if (it == groups.end()) {
      groups.push_back({text, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  std::string out;
  for (const auto& [text, ranks] : groups) {
    std::string list;
    for (int r : ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
    out += std::string("  ") + (ranks.size() == 1 ? "rank " : "ranks ") + list + ": " + text + "\n";
  }
  return out;
}

bool in_collective(const std::vector<StackFrame>& frames) {
  static const char* const kMarks[] = {"all_reduce", "allreduce", "broadcast", "all_gather", "allgather",
                                       "reduce_scatter", "reducescatter", "barrier", "Work::wait", "Work::synchronize",
                                       "Reducer::finalize", "wait_all", "gloo::", "nccl"};
  for (const auto& f : frames) {
    if (f.file == "distributed_c10d.py") return true;
    std::string lower = f.function;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* m : kMarks) {
      std::string mark = m;
      std::transform(mark.begin(), mark.end(), mark.begin(), [](unsigned char c) { return std::tolower(c); });
      if (lower.find(mark) != std::string::npos) return true;
    }
  }
  return false;
}

std::optional<StuckRank> rank_outside_collectives(const std::map<int, std::vector<StackFrame>>& by_rank) {
  std::vector<int> outside, inside;
  std::string where;
  for (const auto& [rank, frames] : by_rank) {
    bool unread = frames.empty() || (frames.size() == 1 && frames[0].function == "?");
    if (unread) continue;  // no stack: it says nothing either way
    if (in_collective(frames)) {
      inside.push_back(rank);
    } else if (outside.push_back(rank), outside.size() == 1) {
      where = describe_frames(frames);
    }
  }
  if (outside.empty() || inside.empty()) return std::nullopt;
  return StuckRank{outside.front(), where, inside};
}

}  // namespace ddprun::agent
