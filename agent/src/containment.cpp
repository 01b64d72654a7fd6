#include "containment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "process_tree.hpp"

namespace ddprun::agent {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The cgroup v2 directory of this process: the unified hierarchy's mount point (from
// mountinfo, a mount of its root) joined with the path in /proc/self/cgroup ("0::PATH").
std::string own_cgroup_dir(std::string& why) {
  std::istringstream cg(read_file("/proc/self/cgroup"));
  std::string line, rel;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  }
  if (rel.empty()) return why = "this process is in no cgroup v2", "";
  std::istringstream mi(read_file("/proc/self/mountinfo"));
  while (std::getline(mi, line)) {
    auto dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    std::istringstream f(line.substr(0, dash));
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    if (root != "/") continue;
    return point + (rel == "/" ? "" : rel);
  }
  return why = "no cgroup v2 hierarchy is mounted", "";
}

std::vector<pid_t> pids_in(const std::string& procs_file) {
  std::vector<pid_t> out;
  std::istringstream in(read_file(procs_file));
  for (long p; in >> p;) {
    if (p > 0) out.push_back(static_cast<pid_t>(p));
  }
  return out;
}

// Whether /proc/PID/environ holds exactly `entry` ("K=V").
bool has_entry(pid_t pid, const std::string& entry) {
  std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::size_t at = 0;
  while (at < env.size()) {
    auto end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, end - at, entry) == 0) return true;
    at = end + 1;
  }
  return false;
}

std::vector<pid_t> all_pids() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (auto* e = ::readdir(d)) {
    char* end = nullptr;
    long p = std::strtol(e->d_name, &end, 10);
    if (end && *end == '\0' && p > 0) out.push_back(static_cast<pid_t>(p));
  }
  ::closedir(d);
  return out;
}

void pause_ms(long ms) {
  timespec ts{0, ms * 1'000'000L};
  ::nanosleep(&ts, nullptr);
}

std::string new_token() {
  unsigned long long r = 0;
  if (::getrandom(&r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) r = static_cast<unsigned long long>(::time(nullptr));
  return fmt::format("{}-{:016x}", ::getpid(), r);
}

}  // namespace

std::string process_name(pid_t pid) {
  std::string name = read_file("/proc/" + std::to_string(pid) + "/comm");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

std::unique_ptr<Containment> Containment::set_up(const std::string& token) {
  std::unique_ptr<Containment> c(new Containment());
  c->token_ = token.empty() ? new_token() : token;
  c->owner_ = ::getpid();
  // Both modes: orphans of the workers become the agent's children, so they are reaped (no
  // zombies under an init that does not reap, as in many containers) and found.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  if (!c->try_cgroup(c->why_not_)) c->mode_ = ContainmentMode::subreaper;
  return c;
}

bool Containment::try_cgroup(std::string& why) {
  const std::string own = own_cgroup_dir(why);
  if (own.empty()) return false;
  // Moving a process needs write access to cgroup.procs of the cgroup it leaves (ours).
  if (::access((own + "/cgroup.procs").c_str(), W_OK) != 0) {
    why = own + "/cgroup.procs is not writable by this user (the hierarchy is not delegated)";
    return false;
  }
  std::string dir = own + "/ddprun-" + token_;  // the pid alone repeats across pid namespaces
  if (::mkdir(dir.c_str(), 0755) != 0 && !(errno == EEXIST && ::rmdir(dir.c_str()) == 0 && ::mkdir(dir.c_str(), 0755) == 0)) {
    why = "cannot create " + dir + ": " + std::strerror(errno);
    return false;
  }
  procs_fd_ = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (procs_fd_ < 0) {
    why = "cannot open " + dir + "/cgroup.procs: " + std::strerror(errno);
    ::rmdir(dir.c_str());
    return false;
  }
  kill_fd_ = ::open((dir + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);  // kernel 5.14+
  cgroup_ = dir;
  mode_ = ContainmentMode::cgroup;
  return true;
}

Containment::~Containment() {
  if (::getpid() != owner_) return;  // a forked copy (the guardian) owns nothing
  if (mode_ == ContainmentMode::cgroup) {
    sweep_cgroup();
    remove_cgroup();
  }
  for (int fd : {procs_fd_, kill_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

std::string Containment::describe() const {
  if (mode_ == ContainmentMode::cgroup) return "cgroup " + cgroup_;
  return "subreaper (no cgroup of its own: " + why_not_ + ")";
}

std::vector<std::string> Containment::sweep(pid_t spare) const {
  return mode_ == ContainmentMode::cgroup ? sweep_cgroup() : sweep_descendants(spare);
}

std::vector<std::string> Containment::sweep_cgroup() const {
  std::vector<std::string> killed;
  const std::string procs = cgroup_ + "/cgroup.procs";
  auto left = pids_in(procs);
  for (pid_t p : left) killed.push_back(fmt::format("{} ({})", p, process_name(p)));
  // Until it is empty: a process may fork while it is being killed (cgroup.kill is atomic).
  for (int pass = 0; pass < 50 && !left.empty(); ++pass) {
    if (kill_fd_ >= 0 && ::pwrite(kill_fd_, "1", 1, 0) == 1) {
    } else {
      for (pid_t p : left) ::kill(p, SIGKILL);
    }
    pause_ms(pass == 0 ? 1 : 10);
    left = pids_in(procs);
  }
  return killed;
}

std::vector<std::string> Containment::sweep_descendants(pid_t spare) const {
  // Everything below the agent is the job's, except the guardian and what the agent itself
  // runs (a stack reader): its direct children without the job's token.
  const std::string entry = "DDPRUN_JOB_TOKEN=" + token_;
  std::vector<std::string> killed;
  for (int pass = 0; pass < 50; ++pass) {
    auto tree = ProcessTree::read();
    auto spared = tree.subtree(spare);
    std::vector<pid_t> doomed;
    for (pid_t p : tree.subtree(owner_)) {
      if (p == owner_ || std::find(spared.begin(), spared.end(), p) != spared.end()) continue;
      if (tree.parent(p) == owner_ && !has_entry(p, entry)) continue;
      doomed.push_back(p);
    }
    if (doomed.empty()) break;
    for (pid_t p : doomed) {
      if (pass == 0) killed.push_back(fmt::format("{} ({})", p, process_name(p)));
      ::kill(p, SIGKILL);
    }
    pause_ms(1);
  }
  return killed;
}

void Containment::remove_cgroup() const {
  // A killed process leaves the cgroup when it has exited; the directory goes once it is empty.
  for (int i = 0; i < 200 && ::rmdir(cgroup_.c_str()) != 0 && errno == EBUSY; ++i) pause_ms(10);
}

void Containment::kill_everything(bool agent_gone) const {
  if (mode_ == ContainmentMode::cgroup) {
    sweep_cgroup();
    if (agent_gone) remove_cgroup();
    return;
  }
  const std::string entry = "DDPRUN_JOB_TOKEN=" + token_;
  for (int pass = 0; pass < 20; ++pass) {
    bool any = false;
    for (pid_t p : all_pids()) {
      if (p == ::getpid() || !has_entry(p, entry)) continue;
      ::kill(p, SIGKILL);
      any = true;
    }
    if (!any) break;
    pause_ms(5);
  }
}

}  // namespace ddprun::agent
