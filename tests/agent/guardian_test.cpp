// The guardian: a process of its own (this project's ddprun started again with a flag). Released
// (the ordinary goodbye), it leaves the directory to the agent and is gone when ~Guardian returns;
// when the agent's side closes without a goodbye (the agent died), it kills the watched groups and
// removes the directory; when the fence lapses it kills the groups; a start that is not whole and
// sound is refused and touches nothing.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "containment/containment.hpp"
#include "containment/guardian.hpp"
#include "containment/guardian_protocol.hpp"
#include "containment/private_files.hpp"
#include "ddprun/common/system.hpp"

using ddprun::agent::Guardian;

namespace {

const std::string kProgram = DDPRUN_PROGRAM;  // the guardian is this program started again

// A directory with a file and a subdirectory in it, as the agent's temporary one.
std::string make_tree() {
  char tmpl[] = "/tmp/ddprun-guardian-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  REQUIRE(::mkdir((dir + "/attempt_0").c_str(), 0700) == 0);
  int fd = ::open((dir + "/attempt_0/heartbeat").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  return dir;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Whether the process `pid` is gone (not even a zombie of ours).
bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Waits (at most `tenths_of_s` / 10 s, 5 s by default) until `f` holds; whether it does. A
// process started on a loaded machine (ctest -j2 beside builds) can wait seconds for a CPU.
bool eventually(const std::function<bool()>& f, int tenths_of_s = 50) {
  for (int i = 0; i < tenths_of_s * 10; ++i) {
    if (f()) return true;
    ::usleep(10'000);
  }
  return f();
}

// A worker's stand-in: a child in a process group of its own, waiting for a signal.
pid_t start_group() {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::alarm(60);  // (a test gone wrong leaves it a minute at most)
    for (;;) ::pause();
  }
  ::setpgid(pid, pid);
  return pid;
}

// Whether the child `pid` was SIGKILLed (reaped here).
bool killed(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// Whether `pid` has ended (gone, or a zombie not ours to reap).
bool ended(pid_t pid) {
  const std::string stat = ddprun::read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return stat.empty() || (close != std::string::npos && stat.compare(close + 2, 1, "Z") == 0);
}


// This project's ddprun started as a guardian with `args` after the flag and `pipe_fd` as its
// descriptor 3 (-1: none); its exit code (-1 if it ran 5 s).
int run_guardian(const std::vector<std::string>& args, int pipe_fd) {
  std::vector<std::string> words = {"ddprun-guard", ddprun::agent::guardian_protocol::kGuardianFlag};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  if (pipe_fd >= 0) posix_spawn_file_actions_adddup2(&fa, pipe_fd, 3);
  else posix_spawn_file_actions_addopen(&fa, 3, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, kProgram.c_str(), &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  const bool exited = eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 300);
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// In a child playing the agent: a guardian watching a new group and owning `dir`, then the child
// exits without a goodbye. Returns the group's pid.
pid_t agent_dies(const std::string& dir) {
  int report[2];
  REQUIRE(::pipe(report) == 0);
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    const pid_t worker = start_group();  // (this child's: the test reads its pid from the pipe)
    Guardian g{nullptr, kProgram};
    g.own_directory(dir);
    g.watch({worker});
    (void)!::write(report[1], &worker, sizeof(worker));
    _exit(g.pid() > 0 ? 0 : 1);  // no release(): the pipe's end of file
  }
  ::close(report[1]);
  pid_t worker = -1;
  REQUIRE(::read(report[0], &worker, sizeof(worker)) == static_cast<ssize_t>(sizeof(worker)));
  ::close(report[0]);
  int status = 0;
  REQUIRE(::waitpid(agent, &status, 0) == agent);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return worker;
}

}  // namespace

TEST_CASE("guardian: release() leaves the directory to the agent, and the guardian is gone after ~Guardian") {
  ::signal(SIGPIPE, SIG_IGN);  // as ddprun's main: a guardian gone must fail a check, not kill the test
  const std::string dir = make_tree();
  pid_t pid = -1;
  {
    Guardian g{nullptr, kProgram};
    pid = g.pid();
    REQUIRE(pid > 0);
    CHECK(eventually([&] {
      std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
      const std::string words((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
      return words.find("--ddprun-guardian") != std::string::npos;
    }));
    g.own_directory(dir);
    g.release();
  }
  CHECK(gone(pid));
  CHECK(exists(dir + "/attempt_0/heartbeat"));
  ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: an agent gone without a goodbye - the watched group killed, the directory removed") {
  const std::string dir = make_tree();
  const pid_t worker = agent_dies(dir);
  CHECK(eventually([&] { return ended(worker); }));
  CHECK(eventually([&] { return !exists(dir); }));
  if (exists(dir)) ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: an agent gone - a directory not named ddprun-* is left alone") {
  char other[] = "/tmp/guardian-victim-XXXXXX";
  REQUIRE(::mkdtemp(other) != nullptr);
  const pid_t worker = agent_dies(other);
  CHECK(eventually([&] { return ended(worker); }));
  CHECK(exists(other));
  ::rmdir(other);
}

TEST_CASE("guardian: the fence's lapse kills the watched group, a renewal sent late too, but not a forgotten group, and stop signals do not end it") {
  ::signal(SIGPIPE, SIG_IGN);
  const pid_t worker = start_group();
  const pid_t spared = start_group();
  pid_t pid = -1;
  {
    Guardian g{nullptr, kProgram};
    pid = g.pid();
    REQUIRE(pid > 0);
    // A scheduler signals every process of a job: the signals are the agent's, not the guardian's.
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGTSTP}) ::kill(pid, sig);
    g.watch({worker, spared});
    g.forget(spared);
    const auto now = std::chrono::steady_clock::now();
    g.arm(now + std::chrono::milliseconds(100), now);
    CHECK(eventually([&] { return killed(worker); }));
    CHECK_FALSE(ended(pid));
    // A renewal sent after the deadline it renews had passed (read in time or not): the groups die.
    const pid_t late = start_group();
    g.watch({late});
    const auto then = std::chrono::steady_clock::now();
    g.arm(then + std::chrono::milliseconds(50), then);
    g.arm(then + std::chrono::seconds(60), then + std::chrono::milliseconds(100));
    CHECK(eventually([&] { return killed(late); }));
    g.release();
  }
  CHECK(gone(pid));
  CHECK_FALSE(killed(spared));
  ::kill(spared, SIGKILL);
  ::waitpid(spared, nullptr, 0);
}

TEST_CASE("guardian: a start that is not whole and sound is refused (exit 2) and touches nothing") {
  const pid_t worker = start_group();  // (first: a fork after the pipe would hold its write end)
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);  // (only the guardian's descriptor 3 is a copy)
  const std::string dir = make_tree();
  const std::vector<std::pair<const char*, std::vector<std::string>>> bad = {
      {"no words", {}},
      {"a word short", {"-", ""}},
      {"a word too many", {"-", "", "0", "x"}},
      {"a token that is not one", {"../../etc", "", "0"}},
      {"a cgroup not named after the token", {"12-ab", "/sys/fs/cgroup/user.slice", "0"}},
      {"an owner that is not a pid", {"12-ab", "", "abc"}},
  };
  for (const auto& [what, args] : bad) {
    INFO(what);
    CHECK(run_guardian(args, p[0]) == 2);
  }
  INFO("descriptor 3 not a pipe");
  CHECK(run_guardian({"-", "", "0"}, -1) == 2);
  CHECK_FALSE(killed(worker));
  CHECK(exists(dir));
  ::close(p[1]);  // a sound start whose agent is gone at once: it exits 0, and had nothing to kill
  CHECK(run_guardian({"-", "", "0"}, p[0]) == 0);
  ::close(p[0]);
  CHECK_FALSE(killed(worker));
  ::kill(worker, SIGKILL);
  ::waitpid(worker, nullptr, 0);
  ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: a program that cannot run - no guardian, said, and the agent's side works on") {
  Guardian g{nullptr, "/nonexistent/ddprun"};
  CHECK(g.pid() < 0);
  CHECK(g.fd() < 0);
  g.watch({12345});
  g.release();
}

TEST_CASE("containment: the guardian's copy kills by token and leaves a cgroup that was never made alone") {
  auto c = ddprun::agent::Containment::plan();
  const auto args = c->guardian_args();
  REQUIRE(args.size() == 3);
  CHECK(args[0] == c->token());
  CHECK(args[2] == std::to_string(::getpid()));
  // A process carrying the token, in a session of its own: found and killed by the copy.
  const std::string env = "DDPRUN_JOB_TOKEN=other:" + c->token();
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::setsid();
    char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("60"), nullptr};
    char* envp[] = {const_cast<char*>(env.c_str()), nullptr};
    ::execve("/bin/sleep", argv, envp);
    _exit(127);
  }
  REQUIRE(eventually([&] { return ddprun::read_file("/proc/" + std::to_string(child) + "/environ").find(c->token()) != std::string::npos; }));
  auto copy = ddprun::agent::Containment::for_guardian(c->token(), "/nonexistent/ddprun-" + c->token(), ::getpid());
  copy->kill_everything(true);
  CHECK(eventually([&] { return killed(child); }));
}
