// The guardian and the agent's temporary directory: a guardian released (release(), the
// ordinary goodbye) leaves the directory to the agent and is gone when ~Guardian returns; one
// whose agent side closes without a goodbye (the agent died) removes it. Its two forms: the
// sentinel (in the agent's memory) kills the watched groups itself when the fence lapses, and
// hands what it knows to the guardian process it becomes (an exec of this test program, which the
// agent library recognises before main).
#include <fcntl.h>
#include <linux/kcmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "containment.hpp"
#include "guardian_protocol.hpp"
#include "guardian.hpp"
#include "private_files.hpp"
#include "skip.hpp"
#include "guardian_sentinel.hpp"
#include "ddprun/common/system.hpp"

using ddprun::agent::Guardian;

namespace {

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

// Waits (at most 5 s) until `f` holds; whether it does.
bool eventually(const std::function<bool()>& f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    ::usleep(10'000);
  }
  return f();
}

// Whether `pid` is the guardian process (the sentinel's exec: its command line names the hand-over).
bool guardian_process(pid_t pid) {
  return ddprun::read_file("/proc/" + std::to_string(pid) + "/cmdline").find("--ddprun-guardian-handover=") !=
         std::string::npos;
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

// Whether the processes `a` and `b` share their memory (kcmp(2)); nullopt where the kernel cannot say.
std::optional<bool> same_memory(pid_t a, pid_t b) {
  long r = ::syscall(SYS_kcmp, a, b, KCMP_VM, 0, 0);
  if (r < 0) return std::nullopt;
  return r == 0;
}

// DDPRUN_GUARDIAN_SENTINEL_MS for one test.
struct SentinelTime {
  explicit SentinelTime(const char* value) {
    ::signal(SIGPIPE, SIG_IGN);  // as ddprun's main: a guardian gone must fail a check, not kill the test
    ::setenv("DDPRUN_GUARDIAN_SENTINEL_MS", value, 1);
  }
  ~SentinelTime() { ::unsetenv("DDPRUN_GUARDIAN_SENTINEL_MS"); }
};

}  // namespace

TEST_CASE("guardian: release() leaves the directory to the agent, and the guardian is gone after ~Guardian") {
  const std::string dir = make_tree();
  pid_t pid = -1;
  {
    Guardian g;
    pid = g.pid();
    REQUIRE(pid > 0);
    g.own_directory(dir);
    g.release();
  }
  CHECK(gone(pid));
  CHECK(exists(dir + "/attempt_0/heartbeat"));
  ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: an agent gone without a goodbye - the guardian removes the directory") {
  const std::string dir = make_tree();
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    Guardian g;  // the guardian is this child's child
    g.own_directory(dir);
    _exit(g.pid() > 0 ? 0 : 1);  // no release(): the pipe's end of file
  }
  int status = 0;
  REQUIRE(::waitpid(agent, &status, 0) == agent);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  for (int i = 0; i < 500 && exists(dir); ++i) ::usleep(10'000);  // bounded: 5 s
  CHECK_FALSE(exists(dir));
}

TEST_CASE("guardian: the sentinel kills the watched group when the fence lapses, and the guardian process it becomes quits when released - neither dies of a stop signal") {
  SKIP_UNLESS_HARDWARE(ddprun::agent::sentinel_supported(), "no sentinel on this machine (Linux before 5.16, or not x86-64 or arm64)");
  SentinelTime never("never");  // (it becomes the guardian process only to act)
  const pid_t worker = start_group();
  pid_t pid = -1;
  {
    Guardian g;
    pid = g.pid();
    REQUIRE(pid > 0);
    CHECK_FALSE(guardian_process(pid));
    // A scheduler signals every process of a job: the signals are the agent's, not the guardian's.
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) ::kill(pid, sig);
    ::usleep(50'000);
    CHECK_FALSE(ended(pid));
    g.watch({worker});
    const auto now = std::chrono::steady_clock::now();
    g.arm(now + std::chrono::milliseconds(100), now);
    CHECK(eventually([&] { return killed(worker); }));
    CHECK(eventually([&] { return guardian_process(pid); }));
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) ::kill(pid, sig);
    ::usleep(50'000);
    CHECK_FALSE(ended(pid));
    g.release();
  }
  CHECK(gone(pid));
}

TEST_CASE("guardian: what the sentinel knew (the groups and the directory) is the guardian process's to act on when the agent dies") {
  SKIP_UNLESS_HARDWARE(ddprun::agent::sentinel_supported(), "no sentinel on this machine (Linux before 5.16, or not x86-64 or arm64)");
  SentinelTime soon("300");
  const std::string dir = make_tree();
  int report[2];
  REQUIRE(::pipe(report) == 0);
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    const pid_t worker = start_group();  // (this child's: the test reads its pid from the pipe)
    Guardian g;
    g.own_directory(dir);
    g.watch({worker});
    (void)!::write(report[1], &worker, sizeof(worker));
    // Until the sentinel has become the guardian process (at 300 ms), then gone without a goodbye.
    _exit(g.pid() > 0 && eventually([&] { return guardian_process(g.pid()); }) ? 0 : 1);
  }
  ::close(report[1]);
  pid_t worker = -1;
  REQUIRE(::read(report[0], &worker, sizeof(worker)) == static_cast<ssize_t>(sizeof(worker)));
  ::close(report[0]);
  int status = 0;
  REQUIRE(::waitpid(agent, &status, 0) == agent);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // it was the guardian process when the agent died
  CHECK(eventually([&] { return ended(worker); }));
  CHECK(eventually([&] { return !exists(dir); }));
  if (exists(dir)) ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: the guardian's flag without its state is refused (exit 2) and not taken for the program's own arguments") {
  for (const char* arg : {"--ddprun-guardian-handover=abc", "--ddprun-guardian-handover=0", "--ddprun-guardian-handover=999999"}) {
    INFO(arg);
    char* argv[] = {const_cast<char*>("guardian_test"), const_cast<char*>(arg), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    REQUIRE(::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
  }
}

namespace {

// A hand-over as the sentinel writes it (guardian_protocol.hpp): the header, the groups, the
// directory; no containment.
std::string handover_bytes(int pipe_fd, std::int32_t pending, const std::vector<pid_t>& groups, const std::string& dir,
                           const char* magic = ddprun::agent::guardian_protocol::kMagic) {
  ddprun::agent::guardian_protocol::Handover h{};
  std::memcpy(h.magic, magic, sizeof(h.magic));
  h.pipe_fd = pipe_fd;
  h.pending = pending;
  h.groups = static_cast<std::int32_t>(groups.size());
  h.directory_bytes = static_cast<std::uint32_t>(dir.size());
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(reinterpret_cast<const char*>(groups.data()), groups.size() * sizeof(pid_t));
  return out + dir;
}

// This test program started as the guardian process with `bytes` in a memfd (the pipe it names
// is inherited); its exit code (-1 if it ran 5 s).
int run_guardian_process(const std::string& bytes) {
  const int memfd = static_cast<int>(::syscall(SYS_memfd_create, "handover-test", 0));
  REQUIRE(memfd >= 0);
  REQUIRE(::write(memfd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  REQUIRE(::lseek(memfd, 0, SEEK_SET) == 0);
  const std::string arg = std::string(ddprun::agent::guardian_protocol::kGuardianFlag) + std::to_string(memfd);
  char* argv[] = {const_cast<char*>("guardian_test"), const_cast<char*>(arg.c_str()), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(memfd);
  int status = 0;
  const bool exited = eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; });
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("guardian: a hand-over that is not whole and sound is refused (exit 2) without a kill - a directory not named ddprun-* is left alone") {
  using namespace ddprun::agent::guardian_protocol;
  int p[2];
  REQUIRE(::pipe(p) == 0);  // (not close-on-exec: the guardian process's pipe)
  const pid_t worker = start_group();
  const std::string dir = make_tree();  // /tmp/ddprun-guardian-test-XXXXXX
  char other[] = "/tmp/guardian-victim-XXXXXX";
  REQUIRE(::mkdtemp(other) != nullptr);
  const auto good = handover_bytes(p[0], kAgentGone, {worker}, dir);
  SECTION("refused: nothing killed, nothing removed") {
    const char bad_magic[8] = {'n', 'o', 't', 'g', 'u', 'a', 'r', 'd'};
    const std::vector<std::pair<const char*, std::string>> bad = {
        {"a wrong magic", handover_bytes(p[0], kAgentGone, {worker}, dir, bad_magic)},
        {"group 1 (kill(-1) would reach every process)", handover_bytes(p[0], kAgentGone, {1}, dir)},
        {"group 0", handover_bytes(p[0], kAgentGone, {0}, dir)},
        {"a pipe that is not one (a regular descriptor: stdout's /dev/null)", handover_bytes(2, kAgentGone, {worker}, dir)},
        {"an act out of range", handover_bytes(p[0], 7, {worker}, dir)},
        {"cut short", good.substr(0, good.size() - 3)},
        {"too long", good + "xyz"},
        {"shorter than its header", good.substr(0, 10)},
    };
    for (const auto& [what, bytes] : bad) {
      INFO(what);
      CHECK(run_guardian_process(bytes) == 2);
      CHECK_FALSE(killed(worker));
      CHECK(exists(dir));
    }
  }
  SECTION("whole: the agent gone, the group killed and the directory removed") {
    CHECK(run_guardian_process(good) == 0);
    CHECK(eventually([&] { return killed(worker); }));
    CHECK_FALSE(exists(dir));
  }
  SECTION("a directory not named ddprun-*: the group killed, the directory left alone") {
    CHECK(run_guardian_process(handover_bytes(p[0], kAgentGone, {worker}, other)) == 0);
    CHECK(eventually([&] { return killed(worker); }));
    CHECK(exists(other));
  }
  ::kill(worker, SIGKILL);
  ::waitpid(worker, nullptr, 0);
  if (exists(dir)) ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
  ::rmdir(other);
  ::close(p[0]);
  ::close(p[1]);
}

TEST_CASE("containment: handover() is what restore() makes the same containment of - other text makes none") {
  auto c = ddprun::agent::Containment::set_up();
  auto copy = ddprun::agent::Containment::restore(c->handover());
  REQUIRE(copy);
  CHECK(copy->describe() == c->describe());
  CHECK(copy->token() == c->token());
  CHECK(copy->kill_fd() == c->kill_fd());
  copy.reset();  // a restored containment's end leaves the cgroup to the agent's
  const std::string d = c->describe();
  if (d.rfind("cgroup ", 0) == 0) CHECK(exists(d.substr(7)));
  for (const char* bad : {"", "cgroup", "cgroup\n/x\ntok\n12", "jail\n/x\ntok\n12\n-1",
                          "cgroup\n\ntok\n12\n-1", "subreaper\n\n\n12\n-1", "subreaper\n\ntok\n0\n-1",
                          "subreaper\n\ntok\n12\nx"}) {
    INFO(bad);
    CHECK_FALSE(ddprun::agent::Containment::restore(bad));
  }
  CHECK(ddprun::agent::Containment::restore("subreaper\n\ntok\n12\n-1"));
}

TEST_CASE("guardian: DDPRUN_GUARDIAN_SENTINEL_MS is milliseconds from 0 to a day or never or fork - anything else is refused") {
  using ddprun::agent::guardian_form;
  CHECK(guardian_form(nullptr)->promote_after_ns == 1'000'000'000);
  CHECK_FALSE(guardian_form(nullptr)->fork);
  CHECK(guardian_form("0")->promote_after_ns == 0);
  CHECK(guardian_form("250")->promote_after_ns == 250'000'000);
  CHECK(guardian_form("86400000")->promote_after_ns == 86'400'000'000'000);
  CHECK(guardian_form("never")->promote_after_ns == -1);
  CHECK(guardian_form("fork")->fork);
  for (const char* bad : {"", "-1", "86400001", "1s", "abc", " 5", "Never", "forked"}) {
    INFO(bad);
    CHECK_FALSE(guardian_form(bad));
  }
}

// The sentinel alone: a program to become the guardian process that cannot run, so whatever is
// done is the sentinel's own doing.
TEST_CASE("guardian: the sentinel itself kills the watched groups when the fence lapses (a renewal sent late counts) and forgets what it is told to") {
  SKIP_UNLESS_HARDWARE(ddprun::agent::sentinel_supported(), "no sentinel on this machine (Linux before 5.16, or not x86-64 or arm64)");
  SentinelTime never("never");
  const pid_t forgotten = start_group();
  const pid_t twice = start_group();
  const pid_t watched = start_group();
  pid_t pid = -1;
  {
    Guardian g(nullptr, "/nonexistent/ddprun");
    pid = g.pid();
    REQUIRE(pid > 0);
    if (auto shared = same_memory(::getpid(), pid)) CHECK(*shared);  // the sentinel: this memory
    g.watch({forgotten, twice});
    g.watch({twice});  // (watched twice: a set; one forget is enough)
    g.forget(forgotten);
    g.forget(twice);
    g.watch({watched});
    const auto now = std::chrono::steady_clock::now();
    g.arm(now + std::chrono::hours(1), now);
    g.arm(now + std::chrono::hours(2), now + std::chrono::hours(1));  // sent after the deadline
    CHECK(eventually([&] { return killed(watched); }));
    ::usleep(100'000);
    CHECK_FALSE(killed(forgotten));
    CHECK_FALSE(killed(twice));
    CHECK_FALSE(guardian_process(pid));  // (it could not become one)
    CHECK_FALSE(ended(pid));
    g.release();
  }
  CHECK(gone(pid));
  for (pid_t p : {forgotten, twice}) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

TEST_CASE("guardian: an agent gone while the sentinel cannot become the guardian process - the groups still die, and the sentinel ends") {
  SKIP_UNLESS_HARDWARE(ddprun::agent::sentinel_supported(), "no sentinel on this machine (Linux before 5.16, or not x86-64 or arm64)");
  SentinelTime never("never");
  int report[2];
  REQUIRE(::pipe(report) == 0);
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    const pid_t worker = start_group();
    Guardian g(nullptr, "/nonexistent/ddprun");
    g.watch({worker});
    const pid_t both[2] = {worker, g.pid()};
    (void)!::write(report[1], both, sizeof(both));
    _exit(0);  // no goodbye
  }
  ::close(report[1]);
  pid_t both[2] = {-1, -1};
  REQUIRE(::read(report[0], both, sizeof(both)) == static_cast<ssize_t>(sizeof(both)));
  ::close(report[0]);
  REQUIRE(::waitpid(agent, nullptr, 0) == agent);
  CHECK(eventually([&] { return ended(both[0]); }));
  CHECK(eventually([&] { return ended(both[1]); }));  // after a second of tries
}

TEST_CASE("guardian: DDPRUN_GUARDIAN_SENTINEL_MS=fork - a fork of the agent that kills the groups on a lapse and removes the directory when the agent dies") {
  SentinelTime fork_form("fork");
  const pid_t worker = start_group();
  const std::string dir = make_tree();
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    Guardian g;
    if (auto shared = same_memory(::getpid(), g.pid()); shared && *shared) _exit(3);
    g.own_directory(dir);
    _exit(g.pid() > 0 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(agent, &status, 0) == agent);
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(eventually([&] { return !exists(dir); }));
  {
    Guardian g;
    g.watch({worker});
    const auto now = std::chrono::steady_clock::now();
    g.arm(now + std::chrono::milliseconds(50), now);
    CHECK(eventually([&] { return killed(worker); }));
  }
}
