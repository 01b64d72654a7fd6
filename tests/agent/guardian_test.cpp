// The guardian (a forked process) and the job's end: after finish() it removes the directory it
// was given and exits 0, and wait() (or ~Guardian) returns only when it has; one killed before
// it did says so (wait() is false: the agent ends the job itself); a guardian released
// (release(), the ordinary goodbye) leaves the directory to the agent; one whose agent side
// closes without a goodbye (the agent died) removes the directory too.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "guardian.hpp"
#include "private_files.hpp"

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

}  // namespace

TEST_CASE("guardian: finish() hands the job's end over - the directory is removed when ~Guardian returns") {
  const std::string dir = make_tree();
  pid_t pid = -1;
  {
    Guardian g;
    pid = g.pid();
    REQUIRE(pid > 0);
    REQUIRE(g.own_directory(dir));
    REQUIRE(g.finish());
    CHECK_FALSE(g.finish());  // once: the pipe is closed after the last message
  }
  CHECK_FALSE(exists(dir));
  CHECK(gone(pid));
}

TEST_CASE("guardian: finish() then wait() - true once the guardian has ended the job") {
  const std::string dir = make_tree();
  Guardian g;
  REQUIRE(g.own_directory(dir));
  REQUIRE(g.finish());
  CHECK(g.wait());
  CHECK_FALSE(exists(dir));
  CHECK_FALSE(g.wait());  // once
}

TEST_CASE("guardian: one killed before it ended the job - wait() is false, the directory is there") {
  const std::string dir = make_tree();
  {
    Guardian g;
    REQUIRE(g.own_directory(dir));
    REQUIRE(::kill(g.pid(), SIGSTOP) == 0);  // it reads nothing more
    REQUIRE(g.finish());                     // the message waits in the pipe
    REQUIRE(::kill(g.pid(), SIGKILL) == 0);
    CHECK_FALSE(g.wait());
  }
  CHECK(exists(dir + "/attempt_0/heartbeat"));
  ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: release() leaves the directory to the agent") {
  const std::string dir = make_tree();
  {
    Guardian g;
    REQUIRE(g.own_directory(dir));
    g.release();
    CHECK_FALSE(g.finish());  // nothing to tell any more: the caller ends the job itself
  }
  CHECK(exists(dir + "/attempt_0/heartbeat"));
  ddprun::agent::remove_tree(AT_FDCWD, dir.c_str());
}

TEST_CASE("guardian: an agent gone without a goodbye - the guardian removes the directory") {
  const std::string dir = make_tree();
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    Guardian g;  // the guardian is this child's child
    _exit(g.own_directory(dir) ? 0 : 1);  // no finish(), no release(): the pipe's end of file
  }
  int status = 0;
  REQUIRE(::waitpid(agent, &status, 0) == agent);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  for (int i = 0; i < 500 && exists(dir); ++i) ::usleep(10'000);  // bounded: 5 s
  CHECK_FALSE(exists(dir));
}

TEST_CASE("guardian: a path longer than one atomic write is not handed over") {
  Guardian g;
  CHECK_FALSE(g.own_directory(std::string(5000, 'x')));
  CHECK_FALSE(g.own_directory(""));
}
