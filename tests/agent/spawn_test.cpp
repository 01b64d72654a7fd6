// spawn_process: the worker's start (clone with CLONE_VM|CLONE_VFORK, then exec) gives it exactly
// what the agent asked for, and nothing of the agent's.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "ddprun/agent/agent_options.hpp"
#include "ddprun/agent/spawn.hpp"
#include "containment/containment.hpp"
#include "skip.hpp"

using ddprun::agent::spawn_process;
using ddprun::agent::SpawnedProcess;

namespace {

// As under `nohup ddprun`: a signal ignored since before the first spawn, which no worker may
// inherit (spawn_process reads the ignored set at its first call, then resets only those where
// clone3 has reset the handled ones).
const bool hup_ignored_at_start = (::signal(SIGHUP, SIG_IGN), true);

struct Ran {
  std::string out, err;
  int status = 0;
};

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) s.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return s;
}

// Runs the child to its end; its stdout and stderr are read whole (small outputs: the pipe's
// buffer holds stderr while stdout is read).
Ran run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
        const ddprun::agent::CpuBinding* binding = nullptr) {
  SpawnedProcess p = spawn_process(argv, env, binding);
  Ran r;
  r.out = read_all(p.stdout_fd);
  r.err = read_all(p.stderr_fd);
  REQUIRE(::waitpid(p.pid, &r.status, 0) == p.pid);
  return r;
}

}  // namespace

TEST_CASE("spawn: exactly the given environment, the agent's directory, exit codes as given") {
  auto r = run({"/bin/sh", "-c", "env | grep -v '^PWD=\\|^SHLVL=\\|^_=' | sort; pwd; echo oops >&2; exit 3"},
               {"A=1", "B=two words"});
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof(cwd)));
  CHECK(r.out == "A=1\nB=two words\n" + std::string(cwd) + "\n");
  CHECK(r.err == "oops\n");
  REQUIRE(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 3);
}

TEST_CASE("spawn: default signals, an empty mask and only fds 0-2, whatever the agent has") {
  // What the child must not inherit: an ignored signal, a blocked one, an open descriptor.
  auto old_usr1 = ::signal(SIGUSR1, SIG_IGN);
  sigset_t usr2, saved;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  ::pthread_sigmask(SIG_BLOCK, &usr2, &saved);
  int leak = ::open("/dev/null", O_RDONLY);  // not close-on-exec
  // spawn_process returns once the child has exec'd (CLONE_VFORK): /proc shows the program's state.
  SpawnedProcess p = spawn_process({"/bin/sleep", "30"}, {});
  ::close(leak);
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  ::signal(SIGUSR1, old_usr1);
  std::string status = read_all(::open(("/proc/" + std::to_string(p.pid) + "/status").c_str(), O_RDONLY));
  CHECK(status.find("SigBlk:\t0000000000000000") != std::string::npos);
  CHECK(status.find("SigIgn:\t0000000000000000") != std::string::npos);
  // The program's own start may hold a descriptor for a moment (the loader opening libc: fd 3,
  // seen under load), so the list is read until it settles (bounded: 2 s); an inherited
  // descriptor stays.
  std::string fds;
  for (int attempt = 0; attempt < 200; ++attempt) {
    fds = read_all(::open("/dev/null", O_RDONLY));
    for (int fd = 0; fd < 64; ++fd) {
      if (::access(("/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(fd)).c_str(), F_OK) == 0) {
        fds += std::to_string(fd) + " ";
      }
    }
    if (fds == "0 1 2 ") break;
    ::usleep(10'000);
  }
  CHECK(fds == "0 1 2 ");
  ::kill(p.pid, SIGKILL);
  int st = 0;
  REQUIRE(::waitpid(p.pid, &st, 0) == p.pid);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
}

TEST_CASE("spawn: the child leads its own process group, known at once to the agent") {
  SpawnedProcess p = spawn_process({"/bin/sleep", "30"}, {});
  CHECK(::getpgid(p.pid) == p.pid);
  CHECK(::kill(-p.pid, SIGTERM) == 0);  // the group exists as spawn_process returns
  int status = 0;
  REQUIRE(::waitpid(p.pid, &status, 0) == p.pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  ::close(p.stdout_fd);
  ::close(p.stderr_fd);
}

TEST_CASE("spawn: an exec failure is the child's exit 127 with the reason on its stderr") {
  auto r = run({"/nonexistent/program"}, {});
  REQUIRE(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 127);
  CHECK(r.err == "ddprun: cannot execute '/nonexistent/program': No such file or directory\n");
  auto denied = run({"/dev/null"}, {});  // not an executable file
  CHECK(WEXITSTATUS(denied.status) == 127);
  CHECK(denied.err == "ddprun: cannot execute '/dev/null': Permission denied\n");
}

TEST_CASE("spawn: the CPU binding is applied before exec") {
  cpu_set_t mine;
  REQUIRE(::sched_getaffinity(0, sizeof(mine), &mine) == 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mine)) last = c;
  }
  REQUIRE(last >= 0);
  ddprun::agent::CpuBinding b;
  b.cpus = {last};
  auto r = run({"/bin/grep", "Cpus_allowed_list", "/proc/self/status"}, {}, &b);
  CHECK(r.out == "Cpus_allowed_list:\t" + std::to_string(last) + "\n");
  b.cpus = {CPU_SETSIZE - 1};  // a CPU this process may not use: refused, said, exit 127
  if (!CPU_ISSET(CPU_SETSIZE - 1, &mine)) {
    auto refused = run({"/bin/true"}, {}, &b);
    CHECK(WEXITSTATUS(refused.status) == 127);
    CHECK(refused.err.find("cannot bind the worker to its CPUs") != std::string::npos);
  }
}

TEST_CASE("spawn: many workers in a row, each one reaped with its own code") {
  std::vector<SpawnedProcess> ps;
  for (int i = 0; i < 50; ++i) ps.push_back(spawn_process({"/bin/sh", "-c", "exit " + std::to_string(i)}, {}));
  for (int i = 0; i < 50; ++i) {
    int status = 0;
    REQUIRE(::waitpid(ps[i].pid, &status, 0) == ps[i].pid);
    CHECK(WEXITSTATUS(status) == i);
    ::close(ps[i].stdout_fd);
    ::close(ps[i].stderr_fd);
  }
}

TEST_CASE("spawn: into a cgroup, born there (clone3) or joining it itself (the fallback)") {
  // A cgroup of this test's own below its cgroup, where it may write one (root); else skipped.
  std::string rel, line;
  std::ifstream cg("/proc/self/cgroup");
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  }
  std::string mount;
  std::ifstream mounts("/proc/mounts");
  for (std::string dev, point, type; mounts >> dev >> point >> type && std::getline(mounts, line);) {
    if (type == "cgroup2") mount = point;
  }
  const std::string dir = mount + (rel == "/" ? "" : rel) + "/ddprun-spawn-test-" + std::to_string(::getpid());
  // How the machine's cgroups are set up, like its hardware: skipped under CI too.
  SKIP_UNLESS_HARDWARE(!rel.empty() && !mount.empty() && ::mkdir(dir.c_str(), 0755) == 0,
                       "no cgroup v2 this user may write here (root, or a delegated hierarchy)");
  ddprun::agent::CgroupTarget target;
  target.dir = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  target.procs = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(target.dir >= 0);
  REQUIRE(target.procs >= 0);
  const std::string want = "0::" + (rel == "/" ? "" : rel) + dir.substr(dir.rfind('/')) + "\n";
  auto in_cgroup = [&](const ddprun::agent::CgroupTarget& t) {
    SpawnedProcess p = spawn_process({"/bin/cat", "/proc/self/cgroup"}, {}, nullptr, &t);
    Ran r{read_all(p.stdout_fd), read_all(p.stderr_fd), 0};
    REQUIRE(::waitpid(p.pid, &r.status, 0) == p.pid);
    CHECK(r.err.empty());
    return r.out.substr(r.out.rfind("0::"));
  };
  // The ignored signals of the agent, as default in the worker, on both paths.
  auto ignored_in_child = [&](const ddprun::agent::CgroupTarget& t) {
    SpawnedProcess p = spawn_process({"/bin/grep", "SigIgn", "/proc/self/status"}, {}, nullptr, &t);
    Ran r{read_all(p.stdout_fd), read_all(p.stderr_fd), 0};
    REQUIRE(::waitpid(p.pid, &r.status, 0) == p.pid);
    return r.out;
  };
  REQUIRE(hup_ignored_at_start);
  CHECK(in_cgroup(target) == want);  // clone3 with CLONE_INTO_CGROUP (and CLONE_CLEAR_SIGHAND)
  CHECK(ignored_in_child(target) == "SigIgn:\t0000000000000000\n");
  ddprun::agent::CgroupTarget joins = target;
  joins.dir = -1;
  CHECK(in_cgroup(joins) == want);  // the child writes itself into cgroup.procs
  CHECK(ignored_in_child(joins) == "SigIgn:\t0000000000000000\n");
  ::close(target.dir);
  ::close(target.procs);
  CHECK(::rmdir(dir.c_str()) == 0);
}

// own_cgroup_dir takes the usual mount points first (statfs says cgroup2, and this process's
// cgroup is there) instead of reading mountinfo: the same directory as the mountinfo reading it
// replaced, done here in the test (a cgroup2 mount of the hierarchy's root, joined with
// /proc/self/cgroup's path).
TEST_CASE("containment: the agent's cgroup directory is the one mountinfo gives") {
  std::string rel, line, point;
  std::ifstream cg("/proc/self/cgroup");
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  }
  std::ifstream mi("/proc/self/mountinfo");
  while (point.empty() && std::getline(mi, line)) {
    auto dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    std::istringstream f(line.substr(0, dash));
    std::string id, parent, dev, root, mount;
    f >> id >> parent >> dev >> root >> mount;
    if (root == "/") point = mount;
  }
  std::string why;
  const std::string dir = ddprun::agent::own_cgroup_dir(why);
  SKIP_UNLESS_HARDWARE(!rel.empty() && !point.empty(), "no cgroup v2 hierarchy here");
  CHECK(dir == point + (rel == "/" ? "" : rel));
  CHECK(why.empty());
}
