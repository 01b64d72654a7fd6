#include "containment/process_tree.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "ddprun/common/system.hpp"

namespace ddprun::agent {
namespace {

std::string exe_base_name(std::string path) {
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() && path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0) {
    path.resize(path.size() - deleted.size());
  }
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The parent pid from /proc/PID/stat: "PID (COMM) STATE PPID ...", COMM may hold ") ".
pid_t parent_of(const std::string& stat_path) {
  const std::string text = read_file(stat_path);
  auto close = text.rfind(')');
  if (close == std::string::npos) return -1;
  char state = 0;
  long ppid = -1;
  if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) return -1;
  return static_cast<pid_t>(ppid);
}

// The name in /proc/PID/comm under `dir` (/proc/PID), "" when it cannot be read.
std::string comm_of(const std::string& dir) {
  std::string name = read_file(dir + "/comm");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

// /proc/PID/exe's target; without access to it (another user's process), /proc/PID/comm.
std::string exe_of(const std::string& dir) {
  char buf[4096];
  ssize_t n = ::readlink((dir + "/exe").c_str(), buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
  return comm_of(dir);
}

}  // namespace

bool is_python_executable(const std::string& exe) {
  std::string b = exe_base_name(exe);
  if (b.rfind("python", 0) != 0) return false;
  // python, python3, python3.11, python3.12d: a version, then ABI flags (not python-config).
  std::size_t i = 6;
  while (i < b.size() && (std::isdigit(static_cast<unsigned char>(b[i])) || b[i] == '.')) ++i;
  if (i > 6) {
    while (i < b.size() && std::islower(static_cast<unsigned char>(b[i]))) ++i;
  }
  return i == b.size();
}

bool is_wrapper_executable(const std::string& exe) {
  static const std::set<std::string> wrappers = {
      "sh",   "bash",   "dash",    "zsh",     "ksh",  "mksh",  "busybox", "env",   "nice",  "ionice", "nohup",
      "time", "timeout", "numactl", "taskset", "chrt", "setsid", "stdbuf", "flock", "srun", "prlimit"};
  return wrappers.count(exe_base_name(exe)) > 0;
}

std::string process_name(pid_t pid, const std::string& proc_root) {
  return comm_of(proc_root + "/" + std::to_string(pid));
}

std::vector<pid_t> process_ids(const std::string& proc_root) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(proc_root.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid > 0 && end && *end == '\0') out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

ProcessTree ProcessTree::read(const std::string& proc_root) {
  ProcessTree t;
  for (pid_t pid : process_ids(proc_root)) {
    std::string dir = proc_root + "/" + std::to_string(pid);
    pid_t parent = parent_of(dir + "/stat");
    if (parent < 0) continue;  // gone, or not a process
    t.procs_[pid] = Entry{parent, exe_of(dir), {}};
  }
  for (auto& [pid, entry] : t.procs_) {
    auto parent = t.procs_.find(entry.parent);
    if (parent != t.procs_.end()) parent->second.children.push_back(pid);
  }
  return t;
}

pid_t parent_pid(pid_t pid, const std::string& proc_root) {
  return parent_of(proc_root + "/" + std::to_string(pid) + "/stat");
}

std::vector<pid_t> ProcessTree::subtree(pid_t root) const {
  std::vector<pid_t> out;
  if (!procs_.count(root)) return out;
  out.push_back(root);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto& kids = procs_.at(out[i]).children;
    out.insert(out.end(), kids.begin(), kids.end());
  }
  return out;
}

std::string ProcessTree::exe(pid_t pid) const {
  auto it = procs_.find(pid);
  return it == procs_.end() ? std::string() : it->second.exe;
}

StackTargets ProcessTree::stack_targets(pid_t root) const {
  StackTargets t;
  // Breadth first, not below a Python process: its Python children are its own business.
  std::vector<pid_t> queue = {root};
  for (std::size_t i = 0; i < queue.size(); ++i) {
    auto it = procs_.find(queue[i]);
    if (it == procs_.end()) continue;
    if (is_python_executable(it->second.exe)) {
      t.python.push_back(queue[i]);
      continue;
    }
    queue.insert(queue.end(), it->second.children.begin(), it->second.children.end());
  }
  // The program behind the wrappers: follow a wrapper's only child.
  t.native = root;
  for (auto it = procs_.find(root); it != procs_.end() && is_wrapper_executable(it->second.exe) &&
                                    it->second.children.size() == 1;
       it = procs_.find(t.native)) {
    t.native = it->second.children.front();
  }
  return t;
}

}  // namespace ddprun::agent
