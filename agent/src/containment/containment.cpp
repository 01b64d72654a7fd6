#include "containment/containment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>  // CGROUP2_SUPER_MAGIC
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include "ddprun/common/text.hpp"

#include <fmt/format.h>

#include "ddprun/common/system.hpp"
#include "containment/process_tree.hpp"

namespace ddprun::agent {

namespace {

std::vector<pid_t> pids_in(const std::string& procs_file) {
  std::vector<pid_t> out;
  for (const auto& line : split(read_file(procs_file), '\n')) {
    if (auto p = parse_int(trim(line), 1, 1 << 30)) out.push_back(static_cast<pid_t>(*p));
  }
  return out;
}

// (Parsed by hand, as the other files read at start-up: a C++ stream here made the agent set
// up the C++ locales at every start.)
std::string find_own_cgroup_dir(std::string& why) {
  std::string rel;
  for (const auto& line : split(read_file("/proc/self/cgroup"), '\n')) {
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  }
  if (rel.empty()) return why = "this process is in no cgroup v2", "";
  if (rel == "/") rel.clear();  // joined to a mount point below
  // Where systemd and container runtimes mount the hierarchy (a cgroup v2 file system there, and
  // this process listed in that cgroup's cgroup.procs): no mountinfo to read, which the kernel
  // writes out mount by mount (a tenth of a millisecond here, more on a node with many mounts).
  // The listing is the proof: a host's hierarchy mounted into a container with a cgroup
  // namespace of its own has the same path ("/") for another cgroup, the host's root.
  for (const char* point : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    struct statfs fs{};
    if (::statfs(point, &fs) != 0 || fs.f_type != CGROUP2_SUPER_MAGIC) continue;
    const std::string dir = point + rel;
    const auto pids = pids_in(dir + "/cgroup.procs");
    if (std::find(pids.begin(), pids.end(), ::getpid()) != pids.end()) return dir;
  }
  for (const auto& line : split(read_file("/proc/self/mountinfo"), '\n')) {
    auto dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    // ID PARENT MAJOR:MINOR ROOT MOUNT_POINT ...
    auto f = split(line.substr(0, dash), ' ');
    if (f.size() < 5 || f[3] != "/") continue;
    return f[4] + rel;
  }
  return why = "no cgroup v2 hierarchy is mounted", "";
}

}  // namespace

std::string own_cgroup_dir(std::string& why) {
  // Found once (containment at start-up, OOM accounting at each group's start): the agent does
  // not move itself, and mountinfo is long on a busy node.
  static const auto found = [] {
    std::string w;
    std::string dir = find_own_cgroup_dir(w);
    return std::make_pair(dir, w);
  }();
  why = found.second;
  return found.first;
}

namespace {

constexpr const char* kTokenVar = "DDPRUN_JOB_TOKEN=";

// Whether /proc/PID/environ's DDPRUN_JOB_TOKEN lists `token` (a ddprun inside a worker appends
// its own to the list: "outer:inner").
bool carries_token(pid_t pid, const std::string& token) {
  std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
  const std::string var = kTokenVar;
  std::size_t at = 0;
  while (at < env.size()) {
    auto end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, var.size(), var) == 0) {
      std::string list = ":" + env.substr(at + var.size(), end - at - var.size()) + ":";
      return list.find(":" + token + ":") != std::string::npos;
    }
    at = end + 1;
  }
  return false;
}

// Every cgroup at or below `dir`, parents before children.
std::vector<std::string> cgroup_subtree(const std::string& dir) {
  std::vector<std::string> out = {dir};
  for (std::size_t i = 0; i < out.size(); ++i) {
    DIR* d = ::opendir(out[i].c_str());
    if (!d) continue;
    while (auto* e = ::readdir(d)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') out.push_back(out[i] + "/" + e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

// Whether the cgroup `dir` or one below it holds a process ("populated 1" in cgroup.events).
bool populated(const std::string& dir) {
  return read_file(dir + "/cgroup.events").find("populated 1") != std::string::npos;
}

void pause_ms(long ms) {
  timespec ts{0, ms * 1'000'000L};
  ::nanosleep(&ts, nullptr);
}

std::string new_token() { return fmt::format("{}-{}", ::getpid(), random_hex(16)); }

}  // namespace

std::string job_token_list(const std::string& inherited, const std::string& token) {
  return inherited.empty() ? token : inherited + ":" + token;
}

std::unique_ptr<Containment> Containment::plan() {
  std::unique_ptr<Containment> c(new Containment());
  c->token_ = new_token();
  c->owner_ = ::getpid();
  const std::string own = own_cgroup_dir(c->why_not_);
  if (own.empty()) return c;
  // Moving a process needs write access to cgroup.procs of the cgroup it leaves (ours).
  if (::access((own + "/cgroup.procs").c_str(), W_OK) != 0) {
    c->why_not_ = errno == EROFS ? own + " is on a read-only mount"
                                 : own + "/cgroup.procs is not writable by this user (the hierarchy is not delegated)";
    return c;
  }
  c->planned_ = own + "/ddprun-" + c->token_;  // the pid alone repeats across pid namespaces
  return c;
}

std::unique_ptr<Containment> Containment::set_up() {
  auto c = plan();
  c->establish();
  return c;
}

void Containment::establish() {
  // Both modes: orphans of the workers become the agent's children, so they are reaped (no
  // zombies under an init that does not reap, as in many containers) and found.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  mode_ = !planned_.empty() && try_cgroup(why_not_) ? ContainmentMode::cgroup : ContainmentMode::subreaper;
}

bool Containment::try_cgroup(std::string& why) {
  const std::string& dir = planned_;
  if (::mkdir(dir.c_str(), 0755) != 0 && !(errno == EEXIST && ::rmdir(dir.c_str()) == 0 && ::mkdir(dir.c_str(), 0755) == 0)) {
    why = "cannot create " + dir + ": " + std::strerror(errno);
    return false;
  }
  target_.procs = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  target_.dir = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (target_.procs < 0 || target_.dir < 0) {
    why = "cannot open " + dir + ": " + std::strerror(errno);
    for (int fd : {target_.procs, target_.dir}) {
      if (fd >= 0) ::close(fd);
    }
    target_ = {};
    ::rmdir(dir.c_str());
    return false;
  }
  kill_fd_ = ::open((dir + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);  // kernel 5.14+
  cgroup_ = dir;
  return true;
}

Containment::~Containment() {
  if (restored_) return;  // (a guardian's copy: the cgroup is the agent's)
  if (mode_ == ContainmentMode::cgroup) {
    sweep_cgroup(true);
    remove_cgroup();
  }
  for (int fd : {target_.procs, target_.dir, kill_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

std::vector<std::string> Containment::guardian_args() const {
  return {token_, planned_, std::to_string(owner_)};
}

std::unique_ptr<Containment> Containment::for_guardian(const std::string& token, const std::string& cgroup, pid_t owner) {
  std::unique_ptr<Containment> c(new Containment());
  c->token_ = token;
  c->cgroup_ = cgroup;
  c->owner_ = owner;
  c->restored_ = true;
  return c;
}

std::string Containment::describe() const {
  if (mode_ == ContainmentMode::cgroup) return "cgroup " + cgroup_;
  return "subreaper (no cgroup of its own: " + why_not_ + ")";
}

std::vector<std::string> Containment::sweep(pid_t guardian, const std::set<pid_t>& exempt) const {
  return mode_ == ContainmentMode::cgroup ? sweep_cgroup(false, exempt) : sweep_descendants(guardian, exempt);
}

std::vector<std::string> Containment::sweep_cgroup(bool final, const std::set<pid_t>& spared) const {
  // The whole subtree: a ddprun inside a worker made a cgroup of its own below this one.
  // Between attempts, the agent's helpers in it (warm spares) are left alone; at the end, nothing.
  auto in_subtree = [&] {
    std::vector<pid_t> all;
    for (const auto& dir : cgroup_subtree(cgroup_)) {
      for (pid_t p : pids_in(dir + "/cgroup.procs")) {
        if (!spared.count(p)) all.push_back(p);
      }
    }
    return all;
  };
  std::vector<std::string> killed;
  if (!populated(cgroup_)) return killed;
  auto left = in_subtree();
  if (left.empty()) return killed;
  for (pid_t p : left) killed.push_back(fmt::format("{} ({})", p, process_name(p)));
  // Until it is empty: a process may fork while it is being killed. cgroup.kill (kernel 5.14+)
  // kills the subtree at once, but only where no worker is started in this cgroup afterwards:
  // on Linux 6.18 (seen here; the kill_seq counter of the kernel's fix for forks racing
  // cgroup.kill), a child that clone3 starts with CLONE_INTO_CGROUP in a cgroup that was ever
  // killed is killed at birth, so every worker of the next attempt died. Between attempts,
  // each process found is killed instead.
  const bool whole = final && kill_fd_ >= 0;
  for (int pass = 0; pass < 200 && (spared.empty() ? populated(cgroup_) : !left.empty()); ++pass) {
    if (!whole || ::pwrite(kill_fd_, "1", 1, 0) != 1) {
      for (pid_t p : left) ::kill(p, SIGKILL);
    }
    pause_ms(pass == 0 ? 1 : 10);
    left = in_subtree();
  }
  return killed;
}

std::vector<std::string> Containment::sweep_descendants(pid_t guardian, const std::set<pid_t>& exempt) const {
  // Everything below the agent is the job's (orphans become the agent's children), except the
  // guardian and the agent's own processes the caller names (`exempt`: warm spares, stack readers).
  std::vector<std::string> killed;
  for (int pass = 0; pass < 50; ++pass) {
    auto tree = ProcessTree::read();
    std::set<pid_t> spared = {owner_};
    std::vector<pid_t> roots = {guardian};
    roots.insert(roots.end(), exempt.begin(), exempt.end());
    for (pid_t r : roots) {
      for (pid_t p : tree.subtree(r)) spared.insert(p);
    }
    std::vector<pid_t> doomed;
    for (pid_t p : tree.subtree(owner_)) {
      if (!spared.count(p)) doomed.push_back(p);
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
  // The common case first: empty, and no cgroup below it (rmdir refuses anything else: EBUSY).
  if (::rmdir(cgroup_.c_str()) == 0) return;
  // A killed process leaves the cgroup when it has exited; the directories go once the subtree
  // is empty, the deepest first (a ddprun inside a worker left its own if it was killed).
  for (int i = 0; i < 200 && populated(cgroup_); ++i) pause_ms(10);
  auto dirs = cgroup_subtree(cgroup_);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());
}

void Containment::kill_everything(bool agent_gone) const {
  // The guardian's copy does not know which mode the agent chose: the cgroup if it was made,
  // and the token in any case (in cgroup mode it then finds nothing left).
  struct stat st {};
  const bool cgroup = !restored_ ? mode_ == ContainmentMode::cgroup : !cgroup_.empty() && ::stat(cgroup_.c_str(), &st) == 0;
  if (cgroup) {
    sweep_cgroup(agent_gone);  // a fence (the agent alive) may be followed by a next attempt
    if (agent_gone) remove_cgroup();
    if (!restored_) return;
  }
  kill_by_token();
}

void Containment::kill_by_token() const {
  for (int pass = 0; pass < 20; ++pass) {
    bool any = false;
    for (pid_t p : process_ids()) {
      if (p == ::getpid() || !carries_token(p, token_)) continue;
      ::kill(p, SIGKILL);
      any = true;
    }
    if (!any) break;
    pause_ms(5);
  }
}

}  // namespace ddprun::agent
